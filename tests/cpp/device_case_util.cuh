// What the rerun, graph and PDL tests share: a case (a type with init/run and specs() or
// buffers(), as the op tests define them) held in device buffers that keep their addresses while
// their contents change; a device fingerprint of buffers, so that 1000 runs are compared without
// copying every run back; an owned stream and a captured graph.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "buffer_test_util.hpp"
#include "cuda/common/launch.cuh"
#include "cuda/common/runtime.hpp"
#include "cuda_test_util.hpp"

namespace fp8mla::test {

// A non-blocking stream of the test's own (graphs are not captured on the legacy stream).
class TestStream {
 public:
  TestStream() { cuda::check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "stream"); }
  ~TestStream() { cudaStreamDestroy(s_); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  cudaStream_t get() const { return s_; }
  void sync() const { cuda::check(cudaStreamSynchronize(s_), "cudaStreamSynchronize"); }

 private:
  cudaStream_t s_ = nullptr;
};

// What `call` enqueues on `stream`, captured once into an executable graph.
class CapturedGraph {
 public:
  CapturedGraph(cudaStream_t stream, const std::function<void()>& call) {
    cuda::check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
    try {
      call();
    } catch (...) {
      cudaGraph_t discarded = nullptr;
      cudaStreamEndCapture(stream, &discarded);
      if (discarded != nullptr) cudaGraphDestroy(discarded);
      throw;
    }
    cuda::check(cudaStreamEndCapture(stream, &graph_), "cudaStreamEndCapture");
    cuda::check(cudaGraphInstantiate(&exec_, graph_, 0), "cudaGraphInstantiate");
  }
  ~CapturedGraph() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  void launch(cudaStream_t stream) const {
    cuda::check(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch");
  }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// How many times the rerun tests run an op: 1000, or FP8MLA_RERUNS (at least 2) when set, so that
// the sanitizer runs (scripts/sanitize.sh) check the same code paths in a few runs.
inline std::size_t rerun_count() {
  const char* env = std::getenv("FP8MLA_RERUNS");
  const long n = env == nullptr ? 1000 : std::strtol(env, nullptr, 10);
  return std::size_t(std::max(n, 2L));
}

// ---- Device fingerprints ------------------------------------------------------------------------

__host__ __device__ inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Adds sum over 8-byte words w at byte offset i of mix64(w ^ mix64(i)) to *sum: integer addition
// in any order gives one value, and a changed or moved word changes its term. Waits for the
// previous kernel first, so it may be launched with PDL behind the op it checks.
__global__ void fingerprint_kernel(const std::uint8_t* data, std::size_t bytes,
                                   unsigned long long* sum) {
  cuda::pdl_wait();
  std::uint64_t acc = 0;
  const std::size_t words = bytes / 8;
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t w = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; w < words; w += stride) {
    const std::uint64_t word = reinterpret_cast<const std::uint64_t*>(data)[w];
    acc += mix64(word ^ mix64(w * 8 + 0x9E3779B97F4A7C15ull));
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    for (std::size_t i = words * 8; i < bytes; ++i) acc += mix64(data[i] ^ mix64(i + 17));
  }
  atomicAdd(sum, static_cast<unsigned long long>(acc));
  cuda::pdl_launch_dependents();
}

// Enqueues the fingerprint of `bytes` bytes at `data` into *sum (which must start at 0).
inline void enqueue_fingerprint(const void* data, std::size_t bytes, unsigned long long* sum,
                                cudaStream_t stream) {
  const unsigned blocks = unsigned(std::clamp<std::size_t>(bytes / 8 / 256 / 8, 1, 264));
  cuda::launch("fingerprint", fingerprint_kernel, {dim3(blocks), dim3(256), 0, stream, true},
               static_cast<const std::uint8_t*>(data), bytes, sum);
}

// Device slots for `rows` x `cols` fingerprints, zeroed.
class Fingerprints {
 public:
  Fingerprints(std::size_t rows, std::size_t cols)
      : cols_(cols), storage_(std::int64_t(std::max<std::size_t>(rows * cols, 1) * 8)) {
    cuda::check(cudaMemset(storage_.data(), 0, rows * cols * 8), "cudaMemset");
    rows_ = rows;
  }
  unsigned long long* slot(std::size_t row, std::size_t col) const {
    return reinterpret_cast<unsigned long long*>(storage_.data()) + row * cols_ + col;
  }
  std::vector<std::uint64_t> download() const {
    std::vector<std::uint64_t> host(rows_ * cols_);
    cuda::check(cudaMemcpy(host.data(), storage_.data(), host.size() * 8, cudaMemcpyDeviceToHost),
                "cudaMemcpy");
    return host;
  }
  std::size_t cols() const { return cols_; }

 private:
  std::size_t rows_ = 0, cols_;
  cuda::DeviceBuffer storage_;
};

// ---- A case in device memory ------------------------------------------------------------------

// The host buffers of a case with its inputs written (cases list specs() or buffers()).
template <typename Case>
std::vector<HostBuffer> case_buffers(const Case& c) {
  if constexpr (requires { c.buffers(); }) {
    std::vector<HostBuffer> b = c.buffers();
    c.init(b);
    return b;
  } else {
    return host_buffers(c);
  }
}

template <typename Case>
Case reseeded(Case c, std::uint64_t seed) {
  c.seed = seed;
  return c;
}

// A case's buffers on the device, with a pristine copy of their contents to restore before each
// run (outputs back to their poison, in-place inputs back to their values).
template <typename Case>
class DeviceCase {
 public:
  explicit DeviceCase(Case c) : case_(std::move(c)) {
    for (const HostBuffer& h : case_buffers(case_)) {
      buffers_.emplace_back(h.bytes());
      pristine_.emplace_back(h.bytes());
    }
    load(case_);
  }
  const Case& get() const { return case_; }
  std::size_t size() const { return buffers_.size(); }
  const DeviceBuffer& buffer(std::size_t i) const { return buffers_[i]; }
  std::vector<void*> bases() const { return device_bases(buffers_); }

  // The contents `contents` writes (same sizes as this case's) into the same device memory, as
  // the state restore() returns to.
  void load(const Case& contents) {
    const std::vector<HostBuffer> host = case_buffers(contents);
    ASSERT_EQ(host.size(), buffers_.size());
    for (std::size_t i = 0; i < host.size(); ++i) {
      ASSERT_EQ(host[i].bytes(), buffers_[i].bytes()) << "buffer " << i;
      buffers_[i].upload(host[i].data());
      pristine_[i].upload(host[i].data());
    }
  }
  void restore(cudaStream_t stream) const {
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      cuda::check(cudaMemcpyAsync(buffers_[i].data(), pristine_[i].data(), buffers_[i].bytes(),
                                  cudaMemcpyDeviceToDevice, stream),
                  "cudaMemcpyAsync");
    }
  }
  void run(cudaStream_t stream) const { case_.run(bases(), Device::cuda(0), stream); }
  // Every buffer's fingerprint into row `row` of `out`.
  void fingerprint(const Fingerprints& out, std::size_t row, cudaStream_t stream) const {
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      enqueue_fingerprint(buffers_[i].data(), buffers_[i].bytes(), out.slot(row, i), stream);
    }
  }
  std::vector<std::vector<std::uint8_t>> download() const {
    std::vector<std::vector<std::uint8_t>> bytes;
    for (const DeviceBuffer& b : buffers_) bytes.push_back(b.download());
    return bytes;
  }
  ::testing::AssertionResult guards_intact() const {
    for (const DeviceBuffer& b : buffers_) {
      if (::testing::AssertionResult ok = b.guards_intact(); !ok) return ok;
    }
    return ::testing::AssertionSuccess();
  }

 private:
  Case case_;
  std::vector<DeviceBuffer> buffers_, pristine_;
};

// Row 0 of `f` is the fingerprint of the buffers before any run; rows 1..runs those after each run.
// Every run must equal run 1, and run 1 must differ from row 0 in some buffer (the op wrote
// something, so equal runs are not a no-op's).
inline ::testing::AssertionResult same_every_run(const Fingerprints& f, std::size_t runs,
                                                 const std::string& what) {
  const std::vector<std::uint64_t> h = f.download();
  const std::size_t n = f.cols();
  bool wrote = false;
  for (std::size_t i = 0; i < n; ++i) wrote |= h[n + i] != h[i];
  if (!wrote) return ::testing::AssertionFailure() << what << ": no run changed any buffer";
  std::size_t bad_runs = 0;
  std::string first;
  for (std::size_t r = 2; r <= runs; ++r) {
    for (std::size_t i = 0; i < n; ++i) {
      if (h[r * n + i] == h[n + i]) continue;
      if (bad_runs++ < 8) first += concat("\n  run ", r, ": buffer ", i, " differs from run 1");
      break;
    }
  }
  if (bad_runs == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << bad_runs << " of " << runs - 1 << " reruns differ" << first;
}

}  // namespace fp8mla::test
