// cuda_devices() of a build without CUDA.
#include "fp8mla/runtime_info.hpp"

namespace fp8mla {

CudaDevices cuda_devices() {
  return {{}, "fp8mla was built without CUDA"};
}

}  // namespace fp8mla
