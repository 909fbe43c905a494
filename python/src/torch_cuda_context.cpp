#include "torch_cuda_context.hpp"

#include <dlfcn.h>
#include <string>

#include "fp8mla/error.hpp"

namespace fp8mla_python {
namespace {

using Result = std::int32_t;  // the shim's AOTITorchError: 0 on success

// torch/csrc/inductor/aoti_torch/c/shim.h; set once by load_torch_cuda_context.
struct Functions {
  Result (*current_stream)(std::int32_t, void**) = nullptr;
  Result (*current_device)(std::int32_t*) = nullptr;
  Result (*create_guard)(std::int32_t, void**) = nullptr;
  Result (*delete_guard)(void*) = nullptr;
} g_functions;
bool g_loaded = false;

template <typename Fn>
bool find(void* lib, Fn& fn, const char* symbol) {
  fn = lib ? reinterpret_cast<Fn>(dlsym(lib, symbol)) : nullptr;
  return fn != nullptr;
}

void require(Result result, const char* what) {
  if (result != 0) {
    throw fp8mla::Error(fp8mla::ErrorCategory::kCuda,
                        fp8mla::concat("torch's ", what, " failed (shim error ", result, ")"));
  }
}

}  // namespace

void load_torch_cuda_context(const std::string& dir) {
  // RTLD_NOLOAD: the copies torch loaded, never second ones; a CPU-only torch has no libtorch_cuda.
  void* cpu = dlopen((dir + "/lib/libtorch_cpu.so").c_str(), RTLD_LAZY | RTLD_NOLOAD);
  void* cuda = dlopen((dir + "/lib/libtorch_cuda.so").c_str(), RTLD_LAZY | RTLD_NOLOAD);
  Functions& f = g_functions;
  g_loaded = find(cuda, f.current_stream, "aoti_torch_get_current_cuda_stream") &&
             find(cpu, f.current_device, "aoti_torch_get_current_device_index") &&
             find(cuda, f.create_guard, "aoti_torch_create_cuda_guard") &&
             find(cuda, f.delete_guard, "aoti_torch_delete_cuda_guard");
  if (!g_loaded) g_functions = Functions{};
}

bool torch_cuda_context() {
  return g_loaded;
}

TorchCudaCall::TorchCudaCall(int device, std::uintptr_t& stream) {
  const Functions& f = g_functions;
  std::int32_t current = -1;
  require(f.current_device(&current), "current device query");
  if (stream == 0) {
    void* s = nullptr;
    require(f.current_stream(device, &s), "current CUDA stream query");
    stream = reinterpret_cast<std::uintptr_t>(s);
  }
  // Last: nothing throws once the guard exists.
  if (current != device) require(f.create_guard(device, &guard_), "CUDA device guard");
}

TorchCudaCall::~TorchCudaCall() {
  if (guard_) g_functions.delete_guard(guard_);  // restores the device; nothing to report
}

}  // namespace fp8mla_python
