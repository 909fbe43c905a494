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
// (torch_ops.py calls this once at import). `output_dtypes` maps the fp8mla dtype names of
// allocated outputs ("e4m3", "bf16", ...) to torch dtypes, for torch_empty_group.
void use_torch(nb::handle torch, nb::dict output_dtypes);

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

// The outputs of one call in one allocation: `specs` a tuple of at most 4 tuples (like, dtype,
// shape, view_shape, view_strides), each what torch_empty takes, with `dtype` an fp8mla name of
// use_torch's output_dtypes, or None for like's own dtype and shape (torch.empty_like of a
// row-major `like`). All `like`s on one device. One libtorch allocation holds the outputs, each
// at a 256-byte-aligned offset, in the order given; each is its own tensor of that storage (a
// dtype view of it where its dtype is not the first output's), so the memory lives until the
// last of them is freed. One allocation instead of one per output: each costs a caching-
// allocator call and a free. None where it does not apply (as torch_empty, or mixed devices):
// the caller allocates each output.
nb::object torch_empty_group(nb::handle specs);

// "grouped" where use_torch found the functions torch_empty and torch_empty_group call and their
// probe tensors equal torch.empty's (dtype, shape, strides, device, writable, the group's apart);
// "shim" where only torch_empty passed, or the environment says FP8MLA_TORCH_ALLOCATOR=shim when
// fp8mla is imported; "torch" where neither, or FP8MLA_TORCH_ALLOCATOR=torch.
std::string torch_allocator();

// A torch tensor on the CPU or a CUDA device with a dtype fp8mla knows, read by the chosen
// reader (or by `reader` when given: "shim" or "attributes"); nullopt for anything else (DLPack
// then converts it or says what is wrong).
std::optional<RawTensor> read_torch(const char* op, const char* name, nb::handle tensor,
                                    const char* reader = nullptr);

}  // namespace fp8mla_python
