#include "cuda/common/runtime.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "fp8mla/error.hpp"
#include "fp8mla/runtime_info.hpp"

namespace fp8mla::cuda {

void check(cudaError_t status, const char* what, std::source_location where) {
  if (status == cudaSuccess) return;
  throw Error(
      ErrorCategory::kCuda,
      concat(what, " failed: ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ")"),
      where);
}

void check_launch(const char* kernel, std::source_location where) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) check(status, concat("launch of ", kernel).c_str(), where);
}

void* driver_entry_point(const char* name, int cuda_version) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult found{};
  check(cudaGetDriverEntryPointByVersion(name, &ptr, unsigned(cuda_version), cudaEnableDefault,
                                         &found),
        concat("cudaGetDriverEntryPointByVersion(", name, ")").c_str());
  if (found != cudaDriverEntryPointSuccess || ptr == nullptr) {
    throw Error(ErrorCategory::kCuda, concat("the CUDA driver has no ", name));
  }
  return ptr;
}

namespace {

DeviceProps query_props(int ordinal) {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
  int smem_optin = 0;
  check(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ordinal),
        "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  DeviceProps props;
  props.ordinal = ordinal;
  props.name = prop.name;
  props.arch = prop.major * 10 + prop.minor;
  props.sm_count = prop.multiProcessorCount;
  props.l2_bytes = prop.l2CacheSize;
  props.global_memory_bytes = std::int64_t(prop.totalGlobalMem);
  props.max_shared_memory_per_block_optin = smem_optin;
  return props;
}

int device_count() {
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  return count;
}

}  // namespace

const DeviceProps& device_props(int ordinal) {
  // One slot per device, filled on first use; entries never move once created. A filled slot of
  // the first 64 devices is read without the lock (every launch asks).
  static std::array<std::atomic<const DeviceProps*>, 64> filled{};
  if (ordinal >= 0 && std::size_t(ordinal) < filled.size()) {
    if (const DeviceProps* p = filled[std::size_t(ordinal)].load(std::memory_order_acquire))
      return *p;
  }
  static std::mutex mutex;
  static std::vector<std::unique_ptr<DeviceProps>> cache;
  std::lock_guard lock(mutex);
  if (cache.empty()) cache.resize(std::size_t(device_count()));
  if (ordinal < 0 || std::size_t(ordinal) >= cache.size()) {
    throw Error(ErrorCategory::kOutOfRange,
                concat("expected a CUDA device ordinal in [0, ", cache.size(), "), got ", ordinal));
  }
  auto& slot = cache[std::size_t(ordinal)];
  if (!slot) slot = std::make_unique<DeviceProps>(query_props(ordinal));
  if (std::size_t(ordinal) < filled.size()) {
    filled[std::size_t(ordinal)].store(slot.get(), std::memory_order_release);
  }
  return *slot;
}

int current_device() {
  int ordinal = 0;
  check(cudaGetDevice(&ordinal), "cudaGetDevice");
  return ordinal;
}

const DeviceProps& current_device_props() {
  return device_props(current_device());
}

int resident_blocks(const void* kernel, int threads, std::size_t shared_bytes) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, std::size_t, int>, int> cache;
  const int device = current_device();
  const auto key = std::make_tuple(kernel, threads, shared_bytes, device);
  std::lock_guard lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end()) {
    int per_sm = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, shared_bytes),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    it = cache.emplace(key, std::max(per_sm, 1) * device_props(device).sm_count).first;
  }
  return it->second;
}

namespace {
std::atomic<bool> pdl_switch{true};
}  // namespace

void set_pdl_enabled(bool enabled) {
  pdl_switch.store(enabled, std::memory_order_relaxed);
}
bool pdl_enabled() {
  return pdl_switch.load(std::memory_order_relaxed);
}

}  // namespace fp8mla::cuda

namespace fp8mla {

CudaDevices cuda_devices() {
  CudaDevices result;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the error so later calls are not poisoned by it
    result.unavailable_reason = concat(cudaGetErrorName(status), ": ", cudaGetErrorString(status));
    return result;
  }
  if (count == 0) {
    result.unavailable_reason = "the CUDA runtime reports no device";
    return result;
  }
  for (int i = 0; i < count; ++i) {
    const cuda::DeviceProps& p = cuda::device_props(i);
    result.devices.push_back(
        {p.ordinal, p.name, p.arch, p.sm_count, p.l2_bytes, p.global_memory_bytes});
  }
  return result;
}

}  // namespace fp8mla
