// CUDA events around the stages of a run (a layer's prefill), read once it is done. Only when
// times are asked for: reading them waits for the GPU, and the events between stages stop
// programmatic dependent launch from overlapping them. Events are created on first use and kept.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "cuda/common/runtime.hpp"

namespace fp8mla::cuda {

class StageTimer {
 public:
  ~StageTimer() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  void start(cudaStream_t stream, double* stage) {
    if (!enabled_) return;
    record(stream);
    stages_.push_back(stage);
  }
  void stop(cudaStream_t stream) {
    if (enabled_) record(stream);
  }
  void begin(bool enabled) {
    enabled_ = enabled;
    used_ = 0;
    stages_.clear();
  }
  void finish() {
    if (!enabled_ || used_ == 0) return;
    check(cudaEventSynchronize(events_[used_ - 1]), "cudaEventSynchronize(stage timer)");
    for (std::size_t i = 0; i < stages_.size(); ++i) {
      float ms = 0;
      check(cudaEventElapsedTime(&ms, events_[2 * i], events_[2 * i + 1]), "cudaEventElapsedTime");
      *stages_[i] += ms;
    }
  }

 private:
  void record(cudaStream_t stream) {
    if (used_ == events_.size()) {
      cudaEvent_t e;
      check(cudaEventCreate(&e), "cudaEventCreate(stage timer)");
      events_.push_back(e);
    }
    check(cudaEventRecord(events_[used_++], stream), "cudaEventRecord(stage timer)");
  }
  bool enabled_ = false;
  std::vector<cudaEvent_t> events_;
  std::size_t used_ = 0;
  std::vector<double*> stages_;
};

}  // namespace fp8mla::cuda
