// Times of the stages of a run (a layer's prefill), read once it is done; only when times are
// asked for (reading them waits for the GPU). Each stage boundary is a one-thread kernel that
// writes the GPU's nanosecond clock (%globaltimer) once the work before it has completed. It is
// launched with programmatic dependent launch and lets the next kernel launch at once, so the
// stages keep the overlap of their launches that PDL gives them untimed; a CUDA event between
// two kernels would end it (the stream waits for the event's work before the next launch).
// The stamps go into device blocks of kBlockStamps, allocated on first use and kept: the first
// at begin(), more only when a run has more stages than any before (without waiting for the GPU).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fp8mla::cuda {

class StageTimer {
 public:
  StageTimer() = default;
  ~StageTimer();
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;

  // A new run: timed when `enabled`, else every call below does nothing.
  void begin(bool enabled);
  // The stage that starts here on `stream` adds its milliseconds to *stage at finish().
  void start(cudaStream_t stream, double* stage);
  // The stage started last ends here.
  void stop(cudaStream_t stream);
  // Waits for the run's stamps and adds each stage's time.
  void finish();

 private:
  static constexpr std::size_t kBlockStamps = 512;
  void stamp(cudaStream_t stream);
  void add_block();
  bool enabled_ = false;
  cudaStream_t stream_ = nullptr;
  std::vector<std::uint64_t*> blocks_;  // device, kBlockStamps each
  std::size_t used_ = 0;
  std::vector<double*> stages_;
  std::vector<std::uint64_t> host_;
};

// Launches the stamp kernel: slot = %globaltimer once the work before it on `stream` is done.
void launch_stage_stamp(cudaStream_t stream, std::uint64_t* slot);

}  // namespace fp8mla::cuda
