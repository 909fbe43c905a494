// The floor under `fp8mla bench host`'s CUDA rows: the host time of launching a kernel that does
// nothing, with a small and with an attention-sized parameter block, through a plain
// triple-chevron launch and through the library's launch path (cudaLaunchKernelEx with the PDL
// attribute, src/cuda/common/launch.cuh). An op's row minus this floor is what fp8mla adds.
#include <cstring>

#include "bench/launch_floor.hpp"
#include "cuda/common/launch.cuh"

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

}  // namespace

std::vector<LaunchFloorCase> launch_floor_cases() {
  return {
      {"empty kernel <<<>>>, 16 B", [] { launch_empty<16>(false); }},
      {"empty kernel <<<>>>, 1 KiB", [] { launch_empty<1024>(false); }},
      {"empty kernel, fp8mla launch, 16 B", [] { launch_empty<16>(true); }},
      {"empty kernel, fp8mla launch, 1 KiB", [] { launch_empty<1024>(true); }},
  };
}

}  // namespace fp8mla::cli
