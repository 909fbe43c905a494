// Device memory and timing for the CUDA benchmarks of the fp8mla tool (`fp8mla bench ...`) and
// the layer harness of `fp8mla run`: device buffers, rotating buffer sets that keep the working
// set out of the L2, a pool of random bf16 values, the CUDA-event timer (warm-up, then the median
// of N launches, optionally all queued behind a host gate) and host copies for the checks.
// CUDA builds only; every CUDA call is checked and a failure throws fp8mla::Error.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/common/runtime.hpp"

namespace fp8mla::cli {

using cuda::DeviceBuffer;

inline std::int64_t round_up(std::int64_t x, std::int64_t to) {
  return (x + to - 1) / to * to;
}

// TB/s of `bytes` moved in `us` microseconds (0 when not measured).
inline double tbps(std::int64_t bytes, double us) {
  return us > 0 ? double(bytes) / us / 1e6 : 0.0;
}

// `sets` copies of each of several buffers ("roles": input, out, scales, ...), each role one
// allocation with its copies `stride(role)` bytes apart (256-byte aligned). Set s of role r
// starts at at(r, s). The number of sets is the fewest whose total exceeds `min_total_bytes`
// (2x the L2), at least one: a launch that rotates through them never finds its data in the L2.
class RotatingSets {
 public:
  RotatingSets(const std::vector<std::int64_t>& role_bytes, std::int64_t min_total_bytes);
  int sets() const { return sets_; }
  int roles() const { return int(strides_.size()); }
  std::int64_t stride(int role) const { return strides_[std::size_t(role)]; }
  std::byte* region(int role) const { return buffers_[std::size_t(role)].data(); }
  std::int64_t region_bytes(int role) const { return buffers_[std::size_t(role)].bytes(); }
  std::byte* at(int role, int set) const { return region(role) + stride(role) * set; }
  // The data pointer of every role in set `set`, in role order.
  void pointers(int set, std::vector<std::byte*>& out) const;

 private:
  std::vector<std::int64_t> strides_;
  std::vector<DeviceBuffer> buffers_;
  int sets_ = 1;
};

// A device pool of random, non-zero bf16 values (|x| in [1/64, 16), magnitudes varying per block
// of 64 so that group and block scales differ), made once on the host; fill() tiles it into
// device memory with device-to-device copies, starting at an offset chosen by `salt`.
class RandomBf16Pool {
 public:
  static constexpr std::int64_t kElements = std::int64_t(1) << 24;  // 32 MiB
  // E[x^2] of the values below: E[(1/32 + 3.97 u)^2] * E[block_scale^2] = 5.375 * 5.3125.
  static constexpr float kMeanSquare = 28.56f;

  RandomBf16Pool();
  void fill(std::byte* dst, std::int64_t bytes, std::uint64_t salt) const;

 private:
  DeviceBuffer pool_;
};

// Holds back a stream: hold() enqueues a host function that waits until release() (or, against
// a deadlock, at most kMaxWait), so launches queued behind it run back to back on the device,
// however long the host takes to issue them.
class StreamGate {
 public:
  static constexpr int kMaxWaitSeconds = 10;

  void hold(cudaStream_t stream);
  void release() { open_.store(true, std::memory_order_release); }
  // Whether the host function gave up waiting (the launches were not all queued behind it).
  bool timed_out() const { return timed_out_.load(std::memory_order_acquire); }

 private:
  static void CUDART_CB wait(void* self);

  std::atomic<bool> open_{false};
  std::atomic<bool> timed_out_{false};
};

// `count` FP8 e4m3 values into `dst`: pool values quantized by fp8mla's own quantize_fp8 (times
// `scale_inv`) in chunks of the pool's size, chunk i filled with salt `salt + i * salt_step`.
void fill_random_e4m3(const RandomBf16Pool& pool, std::byte* dst, std::int64_t count,
                      float scale_inv, std::uint64_t salt, std::uint64_t salt_step);

// Median time of one launch, in microseconds, from CUDA events on the default stream:
// `warmup` untimed launches (then more for the settle time, if set), then `iters` launches each
// between two events, all queued before one synchronization. launch(k) is the k-th launch overall
// (so it can rotate buffer sets).
// With `queued`, the timed launches are all issued behind a StreamGate and released together, so
// the device runs them back to back and each interval is device time only, without the host's
// time to issue the launch (which otherwise shows when a launch is shorter than issuing it).
class EventTimer {
 public:
  explicit EventTimer(int iters);
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  ~EventTimer();

  // Untimed launches for about `ms` after the warm-up ones: a launch timed straight after other
  // work runs for 100-200 ms at the clock that work left the card at under its power cap, so
  // comparisons of launches that draw different power need each one settled first
  // (bench/analysis/attention-power-order-2026-12-03.md). 0 (the default): none.
  void set_settle_ms(double ms) { settle_ms_ = ms; }

  template <typename Launch>
  double median_us(Launch&& launch, int warmup, bool queued = false) {
    int k = 0;
    for (int i = 0; i < warmup; ++i) launch(k++);
    // Batches of launches, waiting on the batch before the last: the device never runs dry.
    for (int batch = 0; settle_ms_ > 0 && !settled(batch); ++batch) {
      for (int i = 0; i < kSettleBatch; ++i) launch(k++);
      mark_settle_batch(batch);
    }
    StreamGate gate;
    start(gate, queued);
    for (std::size_t i = 0; i < events_.size(); i += 2) {
      record(events_[i]);
      launch(k++);
      record(events_[i + 1]);
    }
    return finish(gate, queued);
  }

 private:
  static constexpr int kSettleBatch = 4;
  // Whether the settle time has passed since batch 0 began (batch 0: starts the clock).
  bool settled(int batch);
  // Records batch `batch`'s end and waits for the one before it.
  void mark_settle_batch(int batch);
  // After the warm-up: waits for the device, then holds the stream if `queued`.
  static void start(StreamGate& gate, bool queued);
  static void record(cudaEvent_t event);
  // Releases the gate, waits for the last event, returns the median interval.
  double finish(StreamGate& gate, bool queued);

  std::vector<cudaEvent_t> events_;
  double settle_ms_ = 0;
  std::chrono::steady_clock::time_point settle_start_;
  cudaEvent_t settle_marks_[2] = {};
};

// Median microseconds of a device-to-device copy of `bytes` bytes (so 2 * bytes moved: read +
// write), timed like the ops: `timer`, `warmup` untimed copies, source and destination rotated
// through sets whose total exceeds `rotation_bytes`, the source filled from `pool`; `queued` as
// for EventTimer::median_us.
double time_device_copy_us(EventTimer& timer, const RandomBf16Pool& pool, std::int64_t bytes,
                           std::int64_t rotation_bytes, int warmup, bool queued);

// ---- Host copies for the checks against the CPU implementation ---------------------------------

template <typename T>
std::vector<T> to_host(const std::byte* src, std::int64_t count) {
  std::vector<T> host(static_cast<std::size_t>(count));
  cuda::check(cudaMemcpy(host.data(), src, std::size_t(count) * sizeof(T), cudaMemcpyDeviceToHost),
              "cudaMemcpy(check)");
  return host;
}

template <typename T>
std::int64_t count_diff(const std::vector<T>& a, const std::vector<T>& b) {
  std::int64_t diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff += a[i] != b[i];
  return diff;
}

}  // namespace fp8mla::cli
