// The driver-level half of cuda::launch (launch.cu), for callers that hold a kernel handle
// already: the host-cost bench's bare-launch baseline times exactly this.
#pragma once

#include <cuda.h>

#include "cuda/common/launch.cuh"

namespace fp8mla::cuda {

// cuLaunchKernelEx of `function` with config's grid, block, shared memory and stream, and the PDL
// attribute where `pdl` (the caller has resolved config.pdl against pdl_enabled() and the arch).
CUresult driver_launch(CUfunction function, const LaunchConfig& config, bool pdl, void** params);

// Throws Error{kCuda}: "`name` failed: <the driver's error name>".
[[noreturn]] void throw_launch_error(const char* name, CUresult status);

}  // namespace fp8mla::cuda
