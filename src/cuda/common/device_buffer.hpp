// An owning cudaMalloc allocation (on the current device). Every CUDA call is checked; a failure
// throws fp8mla::Error. For set-up work (weights, benchmark buffers), not for hot paths.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "cuda/common/runtime.hpp"

namespace fp8mla::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::int64_t bytes) : bytes_(bytes) {
    if (bytes > 0) check(cudaMalloc(&data_, std::size_t(bytes)), "cudaMalloc");
  }
  // A copy of `bytes` bytes of host memory (a blocking copy).
  DeviceBuffer(const void* host, std::int64_t bytes) : DeviceBuffer(bytes) {
    if (bytes > 0) {
      check(cudaMemcpy(data_, host, std::size_t(bytes), cudaMemcpyHostToDevice),
            "cudaMemcpy(host to device buffer)");
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept { swap(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    DeviceBuffer(std::move(other)).swap(*this);
    return *this;
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }
  void swap(DeviceBuffer& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
  }
  std::byte* data() const { return static_cast<std::byte*>(data_); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  std::int64_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  std::int64_t bytes_ = 0;
};

}  // namespace fp8mla::cuda
