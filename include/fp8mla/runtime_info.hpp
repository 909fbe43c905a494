// What this build of fp8mla is and which CUDA devices it can use (what `fp8mla info` prints).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fp8mla {

struct BuildInfo {
  std::string version;       // "0.1.0"
  bool cuda = false;         // built with CUDA kernels
  std::string cuda_arch;     // device code targets, e.g. "sm_90a"; empty without CUDA
  std::string cuda_version;  // toolkit the kernels were built with, e.g. "13.0"
  std::string compiler;      // host compiler and version
  std::string build_type;    // CMake build type
};

BuildInfo build_info();

struct CudaDeviceInfo {
  int ordinal = 0;
  std::string name;
  int arch = 0;  // compute capability as major * 10 + minor: 90 for Hopper
  int sm_count = 0;
  std::int64_t l2_bytes = 0;
  std::int64_t global_memory_bytes = 0;
};

struct CudaDevices {
  std::vector<CudaDeviceInfo> devices;
  std::string
      unavailable_reason;  // why `devices` is empty ("built without CUDA", driver error, ...)
};

// Never throws for a missing driver or device: that is reported in `unavailable_reason`.
CudaDevices cuda_devices();

}  // namespace fp8mla
