// Helpers for the CUDA benchmarks of the fp8mla tool (`fp8mla bench quant`, `fp8mla bench prep`):
// device buffers, rotating buffer sets that keep the working set out of the L2, random fill, a
// CUDA-event timer (median of N launches), the device-copy reference, host copies for the checks
// against the CPU, and the small JSON writers both benchmarks share.
// CUDA builds only; every CUDA call is checked and a failure throws fp8mla::Error.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/common/device_buffer.hpp"
#include "cuda/common/runtime.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/numerics.hpp"

namespace fp8mla::cli {

using cuda::DeviceBuffer;

inline std::int64_t round_up(std::int64_t x, std::int64_t to) {
  return (x + to - 1) / to * to;
}

// `sets` copies of each of several buffers ("roles": input, out, scales, ...), each role one
// allocation with its copies `stride(role)` bytes apart (256-byte aligned). Set s of role r
// starts at at(r, s). The number of sets is the fewest whose total exceeds `min_total_bytes`
// (2x the L2), at least one: a launch that rotates through them never finds its data in the L2.
class RotatingSets {
 public:
  RotatingSets(const std::vector<std::int64_t>& role_bytes, std::int64_t min_total_bytes) {
    std::int64_t set_bytes = 0;
    for (std::int64_t b : role_bytes) {
      strides_.push_back(round_up(std::max<std::int64_t>(b, 1), 256));
      set_bytes += strides_.back();
    }
    sets_ = int(std::max<std::int64_t>(1, min_total_bytes / set_bytes + 1));
    for (std::int64_t stride : strides_) buffers_.emplace_back(stride * sets_);
  }
  int sets() const { return sets_; }
  int roles() const { return int(strides_.size()); }
  std::int64_t stride(int role) const { return strides_[std::size_t(role)]; }
  std::byte* region(int role) const { return buffers_[std::size_t(role)].data(); }
  std::int64_t region_bytes(int role) const { return buffers_[std::size_t(role)].bytes(); }
  std::byte* at(int role, int set) const { return region(role) + stride(role) * set; }
  std::int64_t total_bytes() const {
    std::int64_t total = 0;
    for (const DeviceBuffer& b : buffers_) total += b.bytes();
    return total;
  }

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

  RandomBf16Pool() : pool_(kElements * 2) {
    std::vector<std::uint16_t> host(static_cast<std::size_t>(kElements));
    std::uint64_t state = 0x9E3779B97F4A7C15ull;
    auto next = [&state] {
      state ^= state >> 12;
      state ^= state << 25;
      state ^= state >> 27;
      return state * 0x2545F4914F6CDD1Dull;
    };
    float block_scale = 1.0f;
    for (std::int64_t i = 0; i < kElements; ++i) {
      const std::uint64_t r = next();
      if (i % 64 == 0) block_scale = float(1 << (r >> 62)) / 2.0f;  // 0.5, 1, 2, 4
      const float u = float((r >> 8) & 0xFFFFFF) / float(1 << 24);  // [0, 1)
      const float magnitude = (0.03125f + u * 3.96875f) * block_scale;
      host[std::size_t(i)] = encode_bf16((r & 1) ? -magnitude : magnitude);
    }
    cuda::check(
        cudaMemcpy(pool_.data(), host.data(), std::size_t(pool_.bytes()), cudaMemcpyHostToDevice),
        "cudaMemcpy(random pool)");
  }

  void fill(std::byte* dst, std::int64_t bytes, std::uint64_t salt) const {
    std::int64_t offset = std::int64_t((salt * 7919 * 2) % std::uint64_t(pool_.bytes()));
    while (bytes > 0) {
      const std::int64_t n = std::min(bytes, pool_.bytes() - offset);
      cuda::check(cudaMemcpyAsync(dst, pool_.data() + offset, std::size_t(n),
                                  cudaMemcpyDeviceToDevice, nullptr),
                  "cudaMemcpyAsync(random fill)");
      dst += n;
      bytes -= n;
      offset = 0;
    }
  }

 private:
  DeviceBuffer pool_;
};

// Holds back a stream: hold() enqueues a host function that waits until release() (or, against
// a deadlock, at most kMaxWait), so launches queued behind it run back to back on the device,
// however long the host takes to issue them.
class StreamGate {
 public:
  static constexpr std::chrono::seconds kMaxWait{10};

  void hold(cudaStream_t stream) {
    cuda::check(cudaLaunchHostFunc(stream, &wait, this), "cudaLaunchHostFunc(gate)");
  }
  void release() { open_.store(true, std::memory_order_release); }
  // Whether the host function gave up waiting (the launches were not all queued behind it).
  bool timed_out() const { return timed_out_.load(std::memory_order_acquire); }

 private:
  static void CUDART_CB wait(void* self) {
    auto* gate = static_cast<StreamGate*>(self);
    const auto start = std::chrono::steady_clock::now();
    while (!gate->open_.load(std::memory_order_acquire)) {
      if (std::chrono::steady_clock::now() - start > kMaxWait) {
        gate->timed_out_.store(true, std::memory_order_release);
        return;
      }
      std::this_thread::yield();
    }
  }

  std::atomic<bool> open_{false};
  std::atomic<bool> timed_out_{false};
};

// Median time of one launch, in microseconds, from CUDA events on the default stream:
// `warmup` untimed launches, then `iters` launches each between two events, all queued before
// one synchronization. launch(k) is the k-th launch overall (so it can rotate buffer sets).
// With `queued`, the timed launches are all issued behind a StreamGate and released together, so
// the device runs them back to back and each interval is device time only, without the host's
// time to issue the launch (which otherwise shows when a launch is shorter than issuing it).
class EventTimer {
 public:
  explicit EventTimer(int iters) : events_(std::size_t(2 * iters)) {
    for (cudaEvent_t& e : events_) cuda::check(cudaEventCreate(&e), "cudaEventCreate");
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  ~EventTimer() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }

  template <typename Launch>
  double median_us(Launch&& launch, int warmup, bool queued = false) {
    const int iters = int(events_.size() / 2);
    int k = 0;
    for (int i = 0; i < warmup; ++i) launch(k++);
    cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (after warm-up)");
    StreamGate gate;
    if (queued) gate.hold(nullptr);
    for (int i = 0; i < iters; ++i) {
      cuda::check(cudaEventRecord(events_[std::size_t(2 * i)], nullptr), "cudaEventRecord");
      launch(k++);
      cuda::check(cudaEventRecord(events_[std::size_t(2 * i + 1)], nullptr), "cudaEventRecord");
    }
    if (queued) gate.release();
    cuda::check(cudaEventSynchronize(events_.back()), "cudaEventSynchronize");
    cuda::check(cudaGetLastError(), "timed launches");
    if (queued && gate.timed_out()) {
      throw Error(ErrorCategory::kInternal,
                  "timer: the timed launches were not all queued behind the gate within 10 s "
                  "(does the op synchronize?); rerun with the host-paced timer");
    }
    std::vector<float> ms(static_cast<std::size_t>(iters));
    for (int i = 0; i < iters; ++i) {
      cuda::check(cudaEventElapsedTime(&ms[std::size_t(i)], events_[std::size_t(2 * i)],
                                       events_[std::size_t(2 * i + 1)]),
                  "cudaEventElapsedTime");
    }
    std::sort(ms.begin(), ms.end());
    const std::size_t mid = ms.size() / 2;
    const double median = ms.size() % 2 ? ms[mid] : 0.5 * (double(ms[mid - 1]) + ms[mid]);
    return median * 1e3;
  }

 private:
  std::vector<cudaEvent_t> events_;
};

// Median microseconds of a device-to-device copy of `bytes` bytes (so 2 * bytes moved: read +
// write), timed like the ops: `timer`, `warmup` untimed copies, source and destination rotated
// through sets whose total exceeds `rotation_bytes`, the source filled from `pool`; `queued` as
// for EventTimer::median_us.
inline double time_device_copy_us(EventTimer& timer, const RandomBf16Pool& pool, std::int64_t bytes,
                                  std::int64_t rotation_bytes, int warmup, bool queued = false) {
  const RotatingSets sets({bytes, bytes}, rotation_bytes);
  pool.fill(sets.region(0), sets.region_bytes(0), std::uint64_t(bytes));
  return timer.median_us(
      [&](int k) {
        const int s = k % sets.sets();
        cuda::check(cudaMemcpyAsync(sets.at(1, s), sets.at(0, s), std::size_t(bytes),
                                    cudaMemcpyDeviceToDevice, nullptr),
                    "cudaMemcpyAsync(copy)");
      },
      warmup, queued);
}

// TB/s of `bytes` moved in `us` microseconds (0 when not measured).
inline double tbps(std::int64_t bytes, double us) {
  return us > 0 ? double(bytes) / us / 1e6 : 0.0;
}

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

// ---- JSON output -------------------------------------------------------------------------------

inline std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

inline std::string json_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

inline std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace fp8mla::cli
