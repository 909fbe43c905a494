// The library's one kernel launch: the driver's cuLaunchKernelEx on the handle the runtime holds
// for the kernel in the calling thread's context, looked up once per (context, kernel).
#include <cuda.h>
#include <cudaTypedefs.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "cuda/common/driver_launch.hpp"
#include "fp8mla/error.hpp"

namespace fp8mla::cuda {
namespace {

struct Driver {
  PFN_cuLaunchKernelEx_v11060 launch;
  PFN_cuCtxGetCurrent_v4000 current_context;
  PFN_cuGetErrorName_v6000 error_name;
};

const Driver& driver() {
  static const Driver d{
      reinterpret_cast<PFN_cuLaunchKernelEx_v11060>(driver_entry_point("cuLaunchKernelEx", 11060)),
      reinterpret_cast<PFN_cuCtxGetCurrent_v4000>(driver_entry_point("cuCtxGetCurrent", 4000)),
      reinterpret_cast<PFN_cuGetErrorName_v6000>(driver_entry_point("cuGetErrorName", 6000))};
  return d;
}

// Bumped when a cached handle was refused (its context destroyed and another made at the same
// address): every thread's slots of older generations are then stale.
std::atomic<std::uint64_t> handle_generation{0};

struct HandleSlot {
  const void* kernel = nullptr;
  CUcontext context = nullptr;
  std::uint64_t generation = 0;
  CUfunction function = nullptr;
};

CUfunction function_handle(const void* kernel, CUcontext context) {
  const std::uint64_t generation = handle_generation.load(std::memory_order_acquire);
  // Direct-mapped per thread (no lock on the hot path); the map behind it is shared.
  thread_local std::array<HandleSlot, 64> recent{};
  HandleSlot& slot = recent[(reinterpret_cast<std::uintptr_t>(kernel) >> 4) % recent.size()];
  if (slot.kernel == kernel && slot.context == context && slot.generation == generation) {
    return slot.function;
  }
  static std::mutex mutex;
  static std::map<std::pair<CUcontext, const void*>, std::pair<std::uint64_t, CUfunction>> known;
  CUfunction function = nullptr;
  {
    std::lock_guard lock(mutex);
    auto it = known.find({context, kernel});
    if (it == known.end() || it->second.first != generation) {
      cudaFunction_t f = nullptr;
      check(cudaGetFuncBySymbol(&f, kernel), "cudaGetFuncBySymbol");
      it = known.insert_or_assign({context, kernel}, std::pair{generation, CUfunction(f)}).first;
    }
    function = it->second.second;
  }
  slot = {kernel, context, generation, function};
  return function;
}

}  // namespace

CUresult driver_launch(CUfunction function, const LaunchConfig& config, bool pdl, void** params) {
  CUlaunchAttribute attribute{};
  CUlaunchConfig cfg{};
  cfg.gridDimX = config.grid.x;
  cfg.gridDimY = config.grid.y;
  cfg.gridDimZ = config.grid.z;
  cfg.blockDimX = config.block.x;
  cfg.blockDimY = config.block.y;
  cfg.blockDimZ = config.block.z;
  cfg.sharedMemBytes = unsigned(config.shared_bytes);
  cfg.hStream = config.stream;
  if (pdl) {
    attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attribute.value.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attribute;
    cfg.numAttrs = 1;
  }
  return driver().launch(&cfg, function, params, nullptr);
}

void throw_launch_error(const char* name, CUresult status) {
  const char* error = nullptr;
  if (driver().error_name(status, &error) != CUDA_SUCCESS || error == nullptr) error = "unknown";
  throw Error(ErrorCategory::kCuda,
              concat(name, " failed: ", error, " (cuLaunchKernelEx, CUresult ", int(status), ")"));
}

void launch_kernel(const char* name, const void* kernel, const LaunchConfig& config,
                   void** params) {
  const DeviceProps& device = current_device_props();
  const bool pdl = config.pdl && pdl_enabled() && device.arch >= 90;
  CUcontext context = nullptr;
  if (driver().current_context(&context) != CUDA_SUCCESS || context == nullptr) {
    // A thread the runtime has not used yet: cudaSetDevice makes the device's primary context
    // current (CUDA >= 12), as the runtime's own launch would.
    check(cudaSetDevice(device.ordinal), "cudaSetDevice");
    if (driver().current_context(&context) != CUDA_SUCCESS || context == nullptr) {
      throw Error(
          ErrorCategory::kCuda,
          concat(name, ": no CUDA context current after cudaSetDevice(", device.ordinal, ")"));
    }
  }
  CUresult status = driver_launch(function_handle(kernel, context), config, pdl, params);
  if (status == CUDA_ERROR_INVALID_HANDLE) {
    // A handle of a context that no longer exists: look the kernel up again, once.
    handle_generation.fetch_add(1, std::memory_order_acq_rel);
    status = driver_launch(function_handle(kernel, context), config, pdl, params);
  }
  if (status != CUDA_SUCCESS) throw_launch_error(name, status);
}

}  // namespace fp8mla::cuda
