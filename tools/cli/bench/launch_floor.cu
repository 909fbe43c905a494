// The floor under `fp8mla bench host`'s CUDA rows: the host time of launching a kernel that does
// nothing, with a small and with an attention-sized parameter block, through a plain
// triple-chevron launch, through the library's launch path (src/cuda/common/launch.cu: the
// driver's cuLaunchKernelEx with the PDL attribute, after the context and handle lookups) and
// through the bare cuLaunchKernelEx with the same attribute and a handle looked up once (what the
// library's lookups cost on top). An op's row minus the library's floor is what fp8mla adds.
#include <cstring>

#include "bench/launch_floor.hpp"
#include "cuda/common/driver_launch.hpp"

namespace fp8mla::cli {
namespace {

template <int kBytes>
struct Payload {
  unsigned char bytes[kBytes];
};

template <int kBytes>
__global__ void empty_kernel(Payload<kBytes>) {}

template <int kBytes>
void launch_empty(bool library_path) {
  Payload<kBytes> payload;
  std::memset(payload.bytes, 0, kBytes);
  if (library_path) {
    cuda::launch("empty_kernel", empty_kernel<kBytes>, {dim3(1), dim3(32), 0, nullptr, true},
                 payload);
  } else {
    empty_kernel<kBytes><<<1, 32>>>(payload);
  }
}

// The driver's launch of the same kernel on the same (legacy default) stream with the PDL
// attribute, its handle looked up once: the library's launch without its context query, handle
// cache and PDL switch.
template <int kBytes>
void launch_empty_driver() {
  static const CUfunction function = [] {
    cudaFunction_t f = nullptr;
    cuda::check(cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(&empty_kernel<kBytes>)),
                "cudaGetFuncBySymbol(empty_kernel)");
    return reinterpret_cast<CUfunction>(f);
  }();
  Payload<kBytes> payload;
  std::memset(payload.bytes, 0, kBytes);
  void* params[] = {&payload};
  const CUresult status =
      cuda::driver_launch(function, {dim3(1), dim3(32), 0, nullptr, true}, true, params);
  if (status != CUDA_SUCCESS) cuda::throw_launch_error("empty_kernel", status);
}

}  // namespace

std::vector<LaunchFloorCase> launch_floor_cases() {
  return {
      {"empty kernel <<<>>>, 16 B", [] { launch_empty<16>(false); }},
      {"empty kernel <<<>>>, 1 KiB", [] { launch_empty<1024>(false); }},
      {"empty kernel, fp8mla launch, 16 B", [] { launch_empty<16>(true); }},
      {"empty kernel, fp8mla launch, 1 KiB", [] { launch_empty<1024>(true); }},
      {"empty kernel, driver launch, 16 B", [] { launch_empty_driver<16>(); }},
      {"empty kernel, driver launch, 1 KiB", [] { launch_empty_driver<1024>(); }},
  };
}

}  // namespace fp8mla::cli
