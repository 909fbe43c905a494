#include "ops/device_dispatch.hpp"

#if defined(FP8MLA_WITH_CUDA)
#include "cuda/common/runtime.hpp"
#endif

namespace fp8mla {

void check_devices(const ArgChecker& check, Device device,
                   std::initializer_list<NamedTensor> others) {
  for (const NamedTensor& other : others) {
    check.require(other.tensor->device() == device, ErrorCategory::kInvalidArgument, [&] {
      return concat("`", other.name, "`: expected a tensor on ", to_string(device),
                    ", the device of the other tensors, got ", other.tensor->describe());
    });
  }
  if (!device.is_cuda()) return;
#if defined(FP8MLA_WITH_CUDA)
  const int current = cuda::current_device();
  check.require(device.index == current, ErrorCategory::kInvalidArgument, [&] {
    return concat("expected tensors on the current CUDA device cuda:", current, ", got ",
                  to_string(device), " (set the device before calling)");
  });
#else
  check.require(false, ErrorCategory::kUnsupported, [&] {
    return concat("tensors are on ", to_string(device), " but this fp8mla was built without CUDA");
  });
#endif
}

}  // namespace fp8mla
