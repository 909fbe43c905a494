// cuda::HostStaging: the pinned image of a per-call host-to-device copy. It must never be
// overwritten while a queued copy still has to read it, must grow on demand, and must refuse a
// stream under capture.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/common/host_staging.hpp"
#include "cuda_test_util.hpp"
#include "device_case_util.cuh"
#include "fp8mla/error.hpp"

namespace fp8mla {
namespace {

// Keeps the stream busy for about `ns` nanoseconds, so a copy queued behind it runs late.
__global__ void spin_kernel(std::uint64_t ns) {
  const std::uint64_t start = clock64();
  const std::uint64_t cycles = ns * 2;  // >= 1 cycle per ns at any Hopper clock
  while (clock64() - start < cycles) {
  }
}

std::vector<std::uint8_t> pattern(std::size_t n, std::uint8_t seed) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::uint8_t(i * 31 + seed);
  return v;
}

TEST(HostStagingCuda, CopiesAndGrows) {
  FP8MLA_REQUIRE_HOPPER();
  const test::TestStream stream;
  cuda::HostStaging staging;
  for (std::size_t bytes :
       {std::size_t(100), std::size_t(40), std::size_t(150), std::size_t(300000)}) {
    const test::DeviceBuffer device(bytes);
    const std::vector<std::uint8_t> want = pattern(bytes, std::uint8_t(bytes));
    std::byte* image = staging.acquire(bytes, stream.get(), "test");
    ASSERT_GE(staging.capacity(), bytes);
    if (bytes == 150) EXPECT_EQ(staging.capacity(), 200u);
    std::memcpy(image, want.data(), bytes);
    staging.copy_to(device.data(), bytes, stream.get(), "test copy");
    stream.sync();
    EXPECT_EQ(device.download(), want) << bytes << " bytes";
    EXPECT_TRUE(device.guards_intact());
  }
  // 100, then at least doubled for 150 (200), then 300000; never shrunk.
  EXPECT_EQ(staging.capacity(), 300000u);
}

// The second acquire must wait until the first copy, queued behind ~50 ms of work, has read the
// buffer; without the wait the first destination would receive the second image.
TEST(HostStagingCuda, NextAcquireWaitsForTheQueuedCopy) {
  FP8MLA_REQUIRE_HOPPER();
  const test::TestStream stream;
  cuda::HostStaging staging;
  constexpr std::size_t kBytes = 1 << 20;
  const test::DeviceBuffer first(kBytes), second(kBytes);
  const std::vector<std::uint8_t> a = pattern(kBytes, 1), b = pattern(kBytes, 2);
  spin_kernel<<<1, 1, 0, stream.get()>>>(50'000'000);
  cuda::check_launch("spin_kernel");
  std::memcpy(staging.acquire(kBytes, stream.get(), "test"), a.data(), kBytes);
  staging.copy_to(first.data(), kBytes, stream.get(), "first copy");
  std::memcpy(staging.acquire(kBytes, stream.get(), "test"), b.data(), kBytes);
  staging.copy_to(second.data(), kBytes, stream.get(), "second copy");
  stream.sync();
  EXPECT_EQ(first.download(), a);
  EXPECT_EQ(second.download(), b);
}

TEST(HostStagingCuda, RefusesACapturingStream) {
  FP8MLA_REQUIRE_HOPPER();
  const test::TestStream stream;
  cuda::HostStaging staging;
  cuda::check(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal), "capture");
  try {
    staging.acquire(64, stream.get(), "MlaLayer::prefill");
    ADD_FAILURE() << "acquire on a capturing stream did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("capturing"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("MlaLayer::prefill"), std::string::npos) << e.what();
  }
  cudaGraph_t graph = nullptr;
  cuda::check(cudaStreamEndCapture(stream.get(), &graph), "end capture");
  if (graph != nullptr) cudaGraphDestroy(graph);
  EXPECT_EQ(staging.capacity(), 0u);  // nothing allocated for a refused call
}

TEST(HostStagingCuda, CopyPastTheBufferIsAnInternalError) {
  FP8MLA_REQUIRE_HOPPER();
  const test::TestStream stream;
  cuda::HostStaging staging;
  staging.acquire(16, stream.get(), "test");
  const test::DeviceBuffer device(64);
  try {
    staging.copy_to(device.data(), 64, stream.get(), "test copy");
    ADD_FAILURE() << "copy past the buffer did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInternal);
  }
  EXPECT_TRUE(device.guards_intact());
}

}  // namespace
}  // namespace fp8mla
