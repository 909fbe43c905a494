// Kernel launch with optional programmatic dependent launch (PDL), the device-side PDL calls, and
// the grid sizing the memory-bound kernels share.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
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

// A 1-D grid of ceil(work / per_block) blocks, at least one and at most max_blocks.
inline dim3 grid_for(std::int64_t work, std::int64_t per_block,
                     std::int64_t max_blocks = std::int64_t(1) << 30) {
  const std::int64_t blocks = (work + per_block - 1) / per_block;
  return dim3(unsigned(std::clamp<std::int64_t>(blocks, 1, max_blocks)));
}

// Splits `rows` rows of `per_row` work items into launches of fewer than 2^31 items, so that the
// kernels index in 32 bits (their offsets stay 64-bit): calls fn(first_row, rows_in_launch).
template <typename Fn>
void for_each_32bit_launch(std::int64_t rows, std::int64_t per_row, Fn&& fn) {
  const std::int64_t max_rows = std::max<std::int64_t>(1, (std::int64_t(1) << 31) / per_row);
  for (std::int64_t first = 0; first < rows; first += max_rows) {
    fn(first, std::min(max_rows, rows - first));
  }
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
