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

// Launches `kernel` with the arguments whose addresses `params` holds (one per kernel parameter),
// through the driver's cuLaunchKernelEx (driver_launch.hpp) on the kernel's handle in the current
// context, cached per thread: the runtime's cudaLaunchKernelEx cost 0.1-0.7 us more a call
// (bench/RESULTS_host.md, 2026-12-05). A config.shared_bytes over the default 48 KiB is allowed
// on the kernel in that context on its first such launch. Throws Error{kCuda} naming `name`.
void launch_kernel(const char* name, const void* kernel, const LaunchConfig& config, void** params);

// What launch_kernel does before its first launch of `kernel` in the current context (the module
// loaded, `shared_bytes` of dynamic shared memory allowed), done ahead: before a CUDA graph
// capture.
void prepare_kernel(const char* name, const void* kernel, std::size_t shared_bytes);

template <typename... KernelArgs, typename... Args>
void launch(const char* name, void (*kernel)(KernelArgs...), const LaunchConfig& config,
            Args&&... args) {
  static_assert(sizeof...(KernelArgs) == sizeof...(Args), "one argument per kernel parameter");
  // The arguments converted to the kernel's parameter types, as a call would convert them.
  [&](KernelArgs... converted) {
    void* params[] = {const_cast<void*>(static_cast<const void*>(&converted))..., nullptr};
    launch_kernel(name, reinterpret_cast<const void*>(kernel), config, params);
  }(std::forward<Args>(args)...);
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
