// Where an op runs: every tensor of a call on one device, then the CPU or the CUDA implementation.
#pragma once

#include <initializer_list>
#include <string_view>

#include "core/check.hpp"
#include "fp8mla/tensor_view.hpp"

namespace fp8mla {

struct NamedTensor {
  const TensorView* tensor;
  std::string_view name;
};

// Every tensor in `others` is on `device`; a CUDA device must be the calling thread's current one
// (kernels launch there) and the build must have CUDA.
void check_devices(const ArgChecker& check, Device device,
                   std::initializer_list<NamedTensor> others);

// Runs cpu_impl() or cuda_impl(tag). The CUDA branch is a generic lambda so that a CPU-only build
// never instantiates it and needs no CUDA symbols; check_devices() has already rejected CUDA
// tensors there.
template <typename CpuImpl, typename CudaImpl>
void dispatch(Device device, CpuImpl cpu_impl, CudaImpl cuda_impl) {
  if (!device.is_cuda()) {
    cpu_impl();
    return;
  }
#if defined(FP8MLA_WITH_CUDA)
  cuda_impl(0);
#else
  (void)cuda_impl;
#endif
}

}  // namespace fp8mla
