// CUDA runtime helpers: device properties, errors as fp8mla::Error, the PDL launch helper.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/common/launch.cuh"
#include "cuda/common/runtime.hpp"
#include "cuda_test_util.hpp"
#include "fp8mla/error.hpp"

namespace fp8mla {
namespace {

__global__ void fill_kernel(std::uint32_t* out, std::uint32_t n, std::uint32_t seed) {
  cuda::pdl_wait();
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += gridDim.x * blockDim.x) {
    out[i] = i * 2654435761u + seed;
  }
  cuda::pdl_launch_dependents();
}

// Reads what the previous kernel wrote: correct only if pdl_wait() orders it after that kernel.
__global__ void add_kernel(const std::uint32_t* in, std::uint32_t* out, std::uint32_t n) {
  cuda::pdl_wait();
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += gridDim.x * blockDim.x) {
    out[i] = in[i] + 7u;
  }
  cuda::pdl_launch_dependents();
}

std::vector<std::uint32_t> run_chain(bool pdl) {
  constexpr std::uint32_t kN = 1u << 24;
  std::uint32_t *a = nullptr, *b = nullptr;
  cuda::check(cudaMalloc(&a, kN * 4), "cudaMalloc");
  cuda::check(cudaMalloc(&b, kN * 4), "cudaMalloc");
  cuda::check(cudaMemset(b, 0xFF, kN * 4), "cudaMemset");  // poison
  const cuda::LaunchConfig config{dim3(264), dim3(256), 0, nullptr, pdl};
  for (std::uint32_t round = 0; round < 4; ++round) {
    cuda::launch("fill_kernel", fill_kernel, config, a, kN, round);
    cuda::launch("add_kernel", add_kernel, config, static_cast<const std::uint32_t*>(a), b, kN);
  }
  std::vector<std::uint32_t> out(kN);
  cuda::check(cudaMemcpy(out.data(), b, kN * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  cuda::check(cudaFree(a), "cudaFree");
  cuda::check(cudaFree(b), "cudaFree");
  return out;
}

TEST(CudaRuntime, DevicePropertiesAreCached) {
  FP8MLA_REQUIRE_HOPPER();
  const cuda::DeviceProps& props = cuda::device_props(0);
  EXPECT_GE(props.arch, 90);
  EXPECT_GT(props.sm_count, 0);
  EXPECT_GT(props.l2_bytes, 0);
  EXPECT_GE(props.max_shared_memory_per_block_optin, 227 * 1024);
  EXPECT_EQ(&props, &cuda::device_props(0));
  EXPECT_EQ(&props, &cuda::current_device_props());
}

TEST(CudaRuntime, BadOrdinalIsAnError) {
  FP8MLA_REQUIRE_HOPPER();
  try {
    cuda::device_props(1000);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kOutOfRange);
    EXPECT_NE(e.message().find("got 1000"), std::string::npos) << e.message();
  }
}

TEST(CudaRuntime, LaunchErrorBecomesFp8mlaError) {
  FP8MLA_REQUIRE_HOPPER();
  std::uint32_t* a = nullptr;
  cuda::check(cudaMalloc(&a, 4), "cudaMalloc");
  const cuda::LaunchConfig too_many_threads{dim3(1), dim3(4096), 0, nullptr, false};
  try {
    cuda::launch("fill_kernel", fill_kernel, too_many_threads, a, 1u, 0u);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kCuda);
    EXPECT_NE(e.message().find("fill_kernel"), std::string::npos) << e.message();
  }
  cudaGetLastError();
  cuda::check(cudaFree(a), "cudaFree");
}

TEST(CudaRuntime, PdlLaunchIsBitIdenticalToPlainLaunch) {
  FP8MLA_REQUIRE_HOPPER();
  const std::vector<std::uint32_t> plain = run_chain(false);
  const std::vector<std::uint32_t> pdl = run_chain(true);
  ASSERT_EQ(plain.size(), pdl.size());
  for (std::uint32_t i = 0; i < plain.size(); ++i) {
    ASSERT_EQ(plain[i], i * 2654435761u + 3u + 7u) << i;
    ASSERT_EQ(pdl[i], plain[i]) << i;
  }
}

}  // namespace
}  // namespace fp8mla
