// Torch's CUDA context of an op call, resolved in C++: torch's current stream on the device of the
// call's CUDA tensors, and that device made current for the call where it is not. torch_ops.py
// did this in Python (`tensor.get_device()`, torch.cuda's current stream and device, a device
// guard): four Python calls into torch on every op call, now shim calls
// (aoti_torch_get_current_cuda_stream, aoti_torch_get_current_device_index, the CUDA guard of
// libtorch_cuda) from def_op (params.hpp).
#pragma once

#include <cstdint>
#include <string>

namespace fp8mla_python {

// Finds the functions in the libtorch_cpu and libtorch_cuda under `dir` (the torch package's
// folder), already loaded by torch (use_torch calls this once). Where one is missing (a torch
// built without CUDA) nothing is resolved here and torch_ops.py keeps doing it in Python.
void load_torch_cuda_context(const std::string& dir);

// Whether load_torch_cuda_context found them: the Python side then leaves stream and device to
// TorchCudaCall.
bool torch_cuda_context();

// For the life of one call: `stream` 0 becomes torch's current stream on CUDA device `device`,
// and `device` is torch's current device (restored afterwards). Throws fp8mla::Error where torch
// reports a failure. Only where torch_cuda_context().
class TorchCudaCall {
 public:
  TorchCudaCall(int device, std::uintptr_t& stream);
  ~TorchCudaCall();
  TorchCudaCall(const TorchCudaCall&) = delete;
  TorchCudaCall& operator=(const TorchCudaCall&) = delete;

 private:
  void* guard_ = nullptr;  // torch's CUDA guard where `device` was not current
};

}  // namespace fp8mla_python
