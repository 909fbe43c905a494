// What the CUDA tests share: visible skipping on machines without a usable Hopper GPU, the one
// device buffer of the tests (guarded and poisoned, on the library's cuda::DeviceBuffer), and the
// process-wide PDL switch for a scope.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "buffer_test_util.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda/common/runtime.hpp"
#include "fp8mla/runtime_info.hpp"

// Skips the calling test (GTEST_SKIP returns from it) unless device 0 is sm_90 or newer.
#define FP8MLA_REQUIRE_HOPPER()                                                \
  do {                                                                         \
    const ::fp8mla::CudaDevices found = ::fp8mla::cuda_devices();              \
    if (found.devices.empty()) {                                               \
      GTEST_SKIP() << "no CUDA device (" << found.unavailable_reason << ")";   \
    }                                                                          \
    if (found.devices[0].arch < 90) {                                          \
      GTEST_SKIP() << "needs sm_90; device 0 is sm_" << found.devices[0].arch; \
    }                                                                          \
  } while (0)

namespace fp8mla::test {

// A device allocation whose payload lies between guard bands (cudaMalloc aligns to 256 bytes, so
// the payload does too) and starts poisoned: a stray store shows in guards_intact(), a byte left
// unwritten in the payload.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes, std::uint8_t poison = kPoison)
      : bytes_(bytes), storage_(std::int64_t(bytes + 2 * kGuardBytes)) {
    copy_in(0, expected_guard(0));
    copy_in(kGuardBytes + bytes_, expected_guard(1));
    fill(poison);
  }

  void* data() const { return storage_.data() + kGuardBytes; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data());
  }
  std::size_t bytes() const { return bytes_; }
  // fill and upload are done when they return: cudaMemset and a pageable cudaMemcpy to the device
  // may return before their writes land, on the legacy default stream, which does not order
  // itself with the tests' non-blocking streams (a graph replay on one raced a poison fill and
  // lost its LSE under initcheck's timing).
  void fill(std::uint8_t value) {
    cuda::check(cudaMemset(data(), value, bytes_), "cudaMemset");
    settle();
  }
  void upload(const void* host) {
    cuda::check(cudaMemcpy(data(), host, bytes_, cudaMemcpyHostToDevice), "cudaMemcpy");
    settle();
  }
  // `n` bytes from payload offset `offset`.
  std::vector<std::uint8_t> download(std::size_t offset, std::size_t n) const {
    return copy_out(kGuardBytes + offset, n);
  }
  std::vector<std::uint8_t> download() const { return download(0, bytes_); }
  // The payload as elements of T.
  template <typename T>
  std::vector<T> download_as() const {
    std::vector<T> host(bytes_ / sizeof(T));
    cuda::check(cudaMemcpy(host.data(), data(), host.size() * sizeof(T), cudaMemcpyDeviceToHost),
                "cudaMemcpy");
    return host;
  }

  ::testing::AssertionResult guards_intact() const {
    for (int band = 0; band < 2; ++band) {
      const ::testing::AssertionResult same = same_bytes(
          copy_out(band == 0 ? 0 : kGuardBytes + bytes_, kGuardBytes), expected_guard(band),
          band == 0 ? "device guard before the payload" : "device guard after the payload");
      if (!same) return same;
    }
    return ::testing::AssertionSuccess();
  }

 private:
  std::vector<std::uint8_t> expected_guard(int band) const {
    std::vector<std::uint8_t> guard(kGuardBytes);
    const std::size_t start = band == 0 ? 0 : kGuardBytes + bytes_;
    for (std::size_t i = 0; i < kGuardBytes; ++i) guard[i] = guard_byte(start + i);
    return guard;
  }
  void copy_in(std::size_t at, const std::vector<std::uint8_t>& bytes) {
    cuda::check(
        cudaMemcpy(storage_.data() + at, bytes.data(), bytes.size(), cudaMemcpyHostToDevice),
        "cudaMemcpy");
    settle();
  }
  static void settle() { cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
  std::vector<std::uint8_t> copy_out(std::size_t at, std::size_t n) const {
    std::vector<std::uint8_t> host(n);
    cuda::check(cudaMemcpy(host.data(), storage_.data() + at, n, cudaMemcpyDeviceToHost),
                "cudaMemcpy");
    return host;
  }

  std::size_t bytes_;
  cuda::DeviceBuffer storage_;
};

// A device copy of `host`.
template <typename T>
DeviceBuffer to_device(const std::vector<T>& host) {
  DeviceBuffer device(host.size() * sizeof(T));
  device.upload(host.data());
  return device;
}

// Every host buffer copied into a fresh guarded device buffer.
inline std::vector<DeviceBuffer> upload(const std::vector<HostBuffer>& host) {
  std::vector<DeviceBuffer> device;
  for (const HostBuffer& h : host) {
    device.emplace_back(h.bytes());
    device.back().upload(h.data());
  }
  return device;
}

inline std::vector<void*> device_bases(const std::vector<DeviceBuffer>& device) {
  std::vector<void*> bases;
  for (const DeviceBuffer& d : device) bases.push_back(d.data());
  return bases;
}

// Sets the process-wide PDL switch for a scope and restores it after.
class PdlScope {
 public:
  explicit PdlScope(bool enabled) : saved_(cuda::pdl_enabled()) { cuda::set_pdl_enabled(enabled); }
  ~PdlScope() { cuda::set_pdl_enabled(saved_); }
  PdlScope(const PdlScope&) = delete;
  PdlScope& operator=(const PdlScope&) = delete;

 private:
  bool saved_;
};

}  // namespace fp8mla::test
