// Kernel launch with optional programmatic dependent launch (PDL), and the device-side PDL calls.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "cuda/common/runtime.hpp"

namespace fp8mla::cuda {

struct LaunchConfig {
  dim3 grid;
  dim3 block;
  std::size_t shared_bytes = 0;
  cudaStream_t stream = nullptr;
  // Let the kernel start while the previous one on the stream drains. Set it only for kernels that
  // call pdl_wait() before their first dependent load; it is dropped below sm_90 and when
  // set_pdl_enabled(false) was called.
  bool pdl = false;
};

template <typename... KernelArgs, typename... Args>
void launch(const char* name, void (*kernel)(KernelArgs...), const LaunchConfig& config,
            Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = config.grid;
  cfg.blockDim = config.block;
  cfg.dynamicSmemBytes = config.shared_bytes;
  cfg.stream = config.stream;
  cudaLaunchAttribute attribute{};
  if (config.pdl && pdl_enabled() && current_device_props().arch >= 90) {
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attribute;
    cfg.numAttrs = 1;
  }
  check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), name);
}

// Blocks until the grids this one depends on have completed (or triggered); a no-op without PDL.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next PDL kernel on the stream start; call after this block's last store.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace fp8mla::cuda
