#include "cuda/common/stage_timer.hpp"

#include <algorithm>
#include <string>

#include "cuda/common/launch.cuh"
#include "cuda/common/runtime.hpp"
#include "fp8mla/error.hpp"

namespace fp8mla::cuda {
namespace {

__global__ void stage_stamp_kernel(std::uint64_t* slot) {
  pdl_launch_dependents();  // the next stage's launch need not wait for this stamp
  pdl_wait();               // the stage before has completed
  std::uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  *slot = now;
}

}  // namespace

void launch_stage_stamp(cudaStream_t stream, std::uint64_t* slot) {
  launch("stage_stamp_kernel", stage_stamp_kernel,
         LaunchConfig{dim3(1), dim3(1), 0, stream, /*pdl=*/true}, slot);
}

StageTimer::~StageTimer() {
  for (std::uint64_t* block : blocks_) cudaFree(block);
}

void StageTimer::add_block() {
  std::uint64_t* block = nullptr;
  check(cudaMalloc(&block, kBlockStamps * sizeof(std::uint64_t)), "cudaMalloc(stage timer)");
  blocks_.push_back(block);
}

void StageTimer::begin(bool enabled) {
  enabled_ = enabled;
  used_ = 0;
  stages_.clear();
  if (enabled_ && blocks_.empty()) add_block();
}

void StageTimer::start(cudaStream_t stream, double* stage) {
  if (!enabled_) return;
  stamp(stream);
  stages_.push_back(stage);
}

void StageTimer::stop(cudaStream_t stream) {
  if (enabled_) stamp(stream);
}

void StageTimer::stamp(cudaStream_t stream) {
  if (used_ == blocks_.size() * kBlockStamps) add_block();
  stream_ = stream;
  launch_stage_stamp(stream, blocks_[used_ / kBlockStamps] + used_ % kBlockStamps);
  ++used_;
}

void StageTimer::finish() {
  if (!enabled_ || used_ == 0) return;
  if (used_ != 2 * stages_.size()) {
    throw Error(ErrorCategory::kInternal, "StageTimer: " + std::to_string(stages_.size()) +
                                              " stages started but " + std::to_string(used_) +
                                              " stamps written (expected one start and one stop "
                                              "a stage)");
  }
  host_.resize(used_);
  for (std::size_t first = 0; first < used_; first += kBlockStamps) {
    const std::size_t n = std::min(kBlockStamps, used_ - first);
    check(cudaMemcpyAsync(host_.data() + first, blocks_[first / kBlockStamps],
                          n * sizeof(std::uint64_t), cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync(stage timer)");
  }
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(stage timer)");
  for (std::size_t i = 0; i < stages_.size(); ++i) {
    *stages_[i] += double(host_[2 * i + 1] - host_[2 * i]) * 1e-6;
  }
}

}  // namespace fp8mla::cuda
