// cuda::StageTimer: stage times from GPU clock stamps. Kernels that spin for a known time give
// stages of known length; a kernel that notes when it started (before its PDL wait) shows that a
// stamp between two kernels keeps PDL's early launch, which a CUDA event there would end.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/common/launch.cuh"
#include "cuda/common/stage_timer.hpp"
#include "cuda_test_util.hpp"
#include "fp8mla/error.hpp"

namespace fp8mla::test {
namespace {

__device__ std::uint64_t global_ns() {
  std::uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

// Waits for the kernel before it, lets the next one launch, then spins for `ns` nanoseconds.
__global__ void spin_kernel(std::uint64_t ns) {
  cuda::pdl_wait();
  cuda::pdl_launch_dependents();
  const std::uint64_t start = global_ns();
  while (global_ns() - start < ns) {
  }
}

// Notes the clock when it starts, before it waits for the kernel before it.
__global__ void note_start_kernel(std::uint64_t* started) {
  *started = global_ns();
  cuda::pdl_wait();
}

void spin(cudaStream_t stream, std::uint64_t ns) {
  cuda::launch("spin_kernel", spin_kernel, cuda::LaunchConfig{dim3(1), dim3(32), 0, stream, true},
               ns);
}

class StageTimerCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    FP8MLA_REQUIRE_HOPPER();
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    // Each kernel once, untimed: a kernel's first launch loads its module (lazy loading), which
    // would fall inside a stage or hold back a launch.
    DeviceBuffer scratch(sizeof(std::uint64_t));
    auto* slot = static_cast<std::uint64_t*>(scratch.data());
    spin(stream_, 0);
    cuda::launch_stage_stamp(stream_, slot);
    cuda::launch("note_start_kernel", note_start_kernel,
                 cuda::LaunchConfig{dim3(1), dim3(32), 0, stream_, true}, slot);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

TEST_F(StageTimerCuda, StagesMeasureTheirKernels) {
  for (bool pdl : {true, false}) {
    SCOPED_TRACE(pdl ? "PDL on" : "PDL off");
    PdlScope scope(pdl);
    cuda::StageTimer timer;
    for (int run = 0; run < 2; ++run) {  // the second run reuses the stamp block
      double a = 0, b = 0, empty = 0;
      timer.begin(true);
      timer.start(stream_, &a);
      spin(stream_, 200'000);
      timer.stop(stream_);
      timer.start(stream_, &b);
      spin(stream_, 300'000);
      spin(stream_, 200'000);
      timer.stop(stream_);
      timer.start(stream_, &empty);
      timer.stop(stream_);
      timer.finish();
      // The spins' own time, plus a launch and the clock's granularity at most.
      EXPECT_GE(a, 0.2);
      EXPECT_LT(a, 0.25);
      EXPECT_GE(b, 0.5);
      EXPECT_LT(b, 0.56);
      EXPECT_GE(empty, 0.0);
      EXPECT_LT(empty, 0.03);
    }
  }
}

TEST_F(StageTimerCuda, StampsKeepTheNextKernelsEarlyLaunch) {
  DeviceBuffer slots(3 * sizeof(std::uint64_t));
  auto* at = static_cast<std::uint64_t*>(slots.data());
  for (bool pdl : {true, false}) {
    SCOPED_TRACE(pdl ? "PDL on" : "PDL off");
    PdlScope scope(pdl);
    // A stage of 300 us between two stamps, then a kernel that notes when it started.
    cuda::launch_stage_stamp(stream_, at);
    spin(stream_, 300'000);
    cuda::launch_stage_stamp(stream_, at + 1);
    cuda::launch("note_start_kernel", note_start_kernel,
                 cuda::LaunchConfig{dim3(1), dim3(32), 0, stream_, true}, at + 2);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    std::uint64_t t[3];
    ASSERT_EQ(cudaMemcpy(t, at, sizeof t, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_GE(t[1] - t[0], 300'000u);
    if (pdl) {
      // Launched while the stage ran: the stamps let it through as the stage's kernel would.
      EXPECT_LT(t[2], t[1] - 200'000) << "started " << (t[2] - t[0]) << " ns after the first stamp";
    } else {
      EXPECT_GE(t[2], t[1]);
    }
  }
}

TEST_F(StageTimerCuda, DisabledRunsTouchNothing) {
  cuda::StageTimer timer;
  double stage = 1.5;
  timer.begin(false);
  timer.start(stream_, &stage);
  spin(stream_, 10'000);
  timer.stop(stream_);
  timer.finish();
  EXPECT_EQ(stage, 1.5);
}

TEST_F(StageTimerCuda, RunsWithManyStagesAddStampBlocks) {
  cuda::StageTimer timer;
  std::vector<double> stages(700, 0.0);  // 1400 stamps: three blocks
  for (int run = 0; run < 2; ++run) {
    timer.begin(true);
    for (double& s : stages) {
      timer.start(stream_, &s);
      timer.stop(stream_);
    }
    timer.finish();
  }
  for (double s : stages) {
    EXPECT_GE(s, 0.0);
    EXPECT_LT(s, 0.1);
  }
}

TEST_F(StageTimerCuda, AStageLeftOpenIsAnInternalError) {
  cuda::StageTimer timer;
  double stage = 0;
  timer.begin(true);
  timer.start(stream_, &stage);
  try {
    timer.finish();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInternal);
    EXPECT_NE(std::string(e.what()).find("1 stages started but 1 stamps"), std::string::npos)
        << e.what();
  }
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

}  // namespace
}  // namespace fp8mla::test
