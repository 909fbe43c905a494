// The library's one kernel launch: the driver's cuLaunchKernelEx on the handle the runtime holds
// for the kernel in the calling thread's context, looked up (and allowed its dynamic shared
// memory) once per (context, kernel).
#include <cuda.h>
#include <cudaTypedefs.h>

#include <array>
#include <cstddef>
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
  PFN_cuCtxGetId_v12000 context_id;
  PFN_cuFuncSetAttribute_v9000 set_attribute;
  PFN_cuGetErrorName_v6000 error_name;
};

const Driver& driver() {
  static const Driver d{
      reinterpret_cast<PFN_cuLaunchKernelEx_v11060>(driver_entry_point("cuLaunchKernelEx", 11060)),
      reinterpret_cast<PFN_cuCtxGetCurrent_v4000>(driver_entry_point("cuCtxGetCurrent", 4000)),
      reinterpret_cast<PFN_cuCtxGetId_v12000>(driver_entry_point("cuCtxGetId", 12000)),
      reinterpret_cast<PFN_cuFuncSetAttribute_v9000>(
          driver_entry_point("cuFuncSetAttribute", 9000)),
      reinterpret_cast<PFN_cuGetErrorName_v6000>(driver_entry_point("cuGetErrorName", 6000))};
  return d;
}

const char* error_name(CUresult status) {
  const char* error = nullptr;
  if (driver().error_name(status, &error) != CUDA_SUCCESS || error == nullptr) error = "unknown";
  return error;
}

// Dynamic shared memory every kernel may use without opting in.
constexpr std::size_t kDefaultSharedBytes = std::size_t(48) << 10;

// A kernel's handle in one context, and the dynamic shared memory its launches may use there.
// Contexts are named by their driver id, unique for the life of the process: a context destroyed
// (cudaDeviceReset) and made again, even at the same address, is a new one, whose handles and
// opt-in sizes start afresh.
struct HandleSlot {
  const void* kernel = nullptr;
  unsigned long long context = 0;
  CUfunction function = nullptr;
  std::size_t shared_bytes = kDefaultSharedBytes;
};

// The id of the calling thread's current context. A thread the runtime has not used yet has none:
// cudaSetDevice makes the device's primary context current (CUDA >= 12), as the runtime's own
// launch would. (cuCtxGetCurrent first: it answers "none" without failing, where cuCtxGetId
// would fail, a failed API call that compute-sanitizer reports.)
unsigned long long current_context(const char* name, int device) {
  CUcontext context = nullptr;
  if (driver().current_context(&context) != CUDA_SUCCESS || context == nullptr) {
    check(cudaSetDevice(device), "cudaSetDevice");
    if (driver().current_context(&context) != CUDA_SUCCESS || context == nullptr) {
      throw Error(ErrorCategory::kCuda,
                  concat(name, ": no CUDA context current after cudaSetDevice(", device, ")"));
    }
  }
  unsigned long long id = 0;
  const CUresult status = driver().context_id(context, &id);
  if (status != CUDA_SUCCESS) {
    throw Error(
        ErrorCategory::kCuda,
        concat(name, ": the current context has no id: ", error_name(status), " (cuCtxGetId)"));
  }
  return id;
}

std::mutex known_mutex;
// Every (context, kernel) handle looked up, shared by the threads; guarded by known_mutex.
std::map<std::pair<unsigned long long, const void*>, HandleSlot>& known_handles() {
  static std::map<std::pair<unsigned long long, const void*>, HandleSlot> known;
  return known;
}

// The handle of `kernel` in the current context, allowed `shared_bytes` of dynamic shared memory.
CUfunction kernel_handle(const char* name, const void* kernel, std::size_t shared_bytes,
                         int device) {
  const unsigned long long context = current_context(name, device);
  // Direct-mapped per thread (no lock on the hot path); the map behind it is shared.
  thread_local std::array<HandleSlot, 64> recent{};
  HandleSlot& slot = recent[(reinterpret_cast<std::uintptr_t>(kernel) >> 4) % recent.size()];
  if (slot.kernel == kernel && slot.context == context && shared_bytes <= slot.shared_bytes) {
    return slot.function;
  }
  std::lock_guard lock(known_mutex);
  HandleSlot& known = known_handles()[{context, kernel}];
  if (known.function == nullptr) {
    cudaFunction_t f = nullptr;
    check(cudaGetFuncBySymbol(&f, kernel), "cudaGetFuncBySymbol");
    known = {kernel, context, CUfunction(f), kDefaultSharedBytes};
  }
  if (shared_bytes > known.shared_bytes) {
    // Set on the kernel in this context, for every thread: the one place the opt-in happens.
    const CUresult status = driver().set_attribute(
        known.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(shared_bytes));
    if (status != CUDA_SUCCESS) {
      throw Error(ErrorCategory::kCuda,
                  concat(name, ": allowing ", shared_bytes,
                         " bytes of dynamic shared memory failed: ", error_name(status),
                         " (cuFuncSetAttribute, CUresult ", int(status), ")"));
    }
    known.shared_bytes = shared_bytes;
  }
  slot = known;
  return slot.function;
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
  throw Error(ErrorCategory::kCuda, concat(name, " failed: ", error_name(status),
                                           " (cuLaunchKernelEx, CUresult ", int(status), ")"));
}

void prepare_kernel(const char* name, const void* kernel, std::size_t shared_bytes) {
  kernel_handle(name, kernel, shared_bytes, current_device());
}

void launch_kernel(const char* name, const void* kernel, const LaunchConfig& config,
                   void** params) {
  const DeviceProps& device = current_device_props();
  const bool pdl = config.pdl && pdl_enabled() && device.arch >= 90;
  const CUfunction function = kernel_handle(name, kernel, config.shared_bytes, device.ordinal);
  const CUresult status = driver_launch(function, config, pdl, params);
  if (status != CUDA_SUCCESS) throw_launch_error(name, status);
}

}  // namespace fp8mla::cuda
