// CUDA runtime helpers: errors become fp8mla::Error, and device properties are queried once.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <source_location>
#include <string>

namespace fp8mla::cuda {

// Throws Error{kCuda} naming `what` and the CUDA error when `status` is not cudaSuccess.
void check(cudaError_t status, const char* what,
           std::source_location where = std::source_location::current());

// Checks the status of the last launch on this thread (a bad configuration shows up here).
void check_launch(const char* kernel, std::source_location where = std::source_location::current());

// The CUDA driver's function `name` in the ABI of `cuda_version` (e.g. 12000), looked up through
// the runtime (no link against libcuda); throws Error{kCuda} where the driver lacks it.
void* driver_entry_point(const char* name, int cuda_version);

struct DeviceProps {
  int ordinal = 0;
  std::string name;
  int arch = 0;  // major * 10 + minor
  int sm_count = 0;
  std::int64_t l2_bytes = 0;
  std::int64_t global_memory_bytes = 0;
  std::int64_t max_shared_memory_per_block_optin = 0;
};

// Properties of device `ordinal`, queried on first use and cached (thread-safe).
const DeviceProps& device_props(int ordinal);
// The calling thread's current device.
int current_device();
// Properties of the current device of the calling thread.
const DeviceProps& current_device_props();

// Blocks of `kernel` (with `threads` threads and `shared_bytes` of dynamic shared memory) that the
// current device runs at once: a grid-stride kernel launched with this many has no tail wave.
// Queried once per kernel and device.
int resident_blocks(const void* kernel, int threads, std::size_t shared_bytes = 0);

// Process-wide switch for programmatic dependent launch (on by default). Results are bit-identical
// either way; tests and benchmarks turn it off to prove that or to measure it.
void set_pdl_enabled(bool enabled);
bool pdl_enabled();

}  // namespace fp8mla::cuda
