// How fp8mla._C reads a torch tensor's data pointer, dtype, shape, strides and device without
// DLPack. Two readers, chosen once by use_torch:
//   - "shim": torch's stable C functions for tensor metadata (the AOTInductor shim,
//   aoti_torch_get_*,
//     exported by libtorch), called on the tensor's TensorImpl (`Tensor._cdata`): one attribute
//     read a tensor, no Python objects made for the shape or strides;
//   - "attributes": data_ptr(), shape, stride(), dtype, is_cuda / is_cpu, get_device(), seven
//     attribute reads; used where this torch lacks the shim or the shim's answers did not match
//     the attributes' on use_torch's probe tensors (that check is what licenses the shim), or
//     where the environment says FP8MLA_TORCH_READER=attributes when fp8mla is imported.
// Both read exact torch.Tensor objects; a subclass is read through its attributes by name, as
// the subclass may override them.
#pragma once

#include <optional>
#include <string>

#include "tensor_args.hpp"

namespace fp8mla_python {

// Reads torch's Tensor type and dtypes from module `torch`, looks up the shim and checks it
// (torch_ops.py calls this once at import).
void use_torch(nb::handle torch);

// "shim", "attributes", or "none" before use_torch.
std::string torch_tensor_reader();

// A new row-major tensor (an exact torch.Tensor) of `shape` (a tuple of ints; None: `like`'s
// shape) with the torch dtype `dtype` on `like`'s device: allocated by libtorch through the shim
// (aoti_torch_empty_strided: torch's allocator for the device, its current stream) and made a
// Python object by torch's own wrapper (THPVariable_Wrap, from libtorch_python), with none of
// torch.empty's Python argument parsing. With `view_shape` and `view_strides` (tuples), the view
// of that allocation torch's as_strided(view_shape, view_strides) gives. None where it does not
// apply (`like` not an exact torch.Tensor, a dtype, shape or view it does not take, libtorch
// declined, or torch_allocator() is "torch"): the caller allocates through torch, which also says
// what was wrong.
nb::object torch_empty(nb::handle like, nb::handle dtype, nb::handle shape, nb::handle view_shape,
                       nb::handle view_strides);

// "shim" where use_torch found the functions torch_empty calls and its probe tensors equal
// torch.empty's (dtype, shape, strides, device, writable), unless the environment says
// FP8MLA_TORCH_ALLOCATOR=torch when fp8mla is imported; else "torch".
std::string torch_allocator();

// A torch tensor on the CPU or a CUDA device with a dtype fp8mla knows, read by the chosen
// reader (or by `reader` when given: "shim" or "attributes"); nullopt for anything else (DLPack
// then converts it or says what is wrong).
std::optional<RawTensor> read_torch(const char* op, const char* name, nb::handle tensor,
                                    const char* reader = nullptr);

}  // namespace fp8mla_python
