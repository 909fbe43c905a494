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
  const test::DeviceBuffer a(kN * 4), b(kN * 4, 0xFF);  // b poisoned
  const cuda::LaunchConfig config{dim3(264), dim3(256), 0, nullptr, pdl};
  for (std::uint32_t round = 0; round < 4; ++round) {
    cuda::launch("fill_kernel", fill_kernel, config, a.as<std::uint32_t>(), kN, round);
    cuda::launch("add_kernel", add_kernel, config, a.as<const std::uint32_t>(),
                 b.as<std::uint32_t>(), kN);
  }
  std::vector<std::uint32_t> out = b.download_as<std::uint32_t>();
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
  const test::DeviceBuffer a(4);
  const cuda::LaunchConfig too_many_threads{dim3(1), dim3(4096), 0, nullptr, false};
  try {
    cuda::launch("fill_kernel", fill_kernel, too_many_threads, a.as<std::uint32_t>(), 1u, 0u);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kCuda);
    EXPECT_NE(e.message().find("fill_kernel"), std::string::npos) << e.message();
  }
  cudaGetLastError();
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
