// Pinned host memory for a small host-to-device copy made on every call (a batch's metadata).
// From pageable memory, cudaMemcpyAsync may wait for the stream before it returns (the driver
// stages such copies itself, and past ~64 KiB it does so in step with the stream): the host then
// stops running ahead of the GPU. From pinned memory the copy is queued and the call returns.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace fp8mla::cuda {

class HostStaging {
 public:
  HostStaging() = default;
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;
  ~HostStaging();

  // Host memory of at least `bytes` for the next copy on `stream`. Waits for this buffer's
  // previous copy to have read it (with one buffer per layer, that copy belongs to an earlier
  // forward step and is long done); grows the buffer (cudaMallocHost, to at least twice its
  // size) only when `bytes` exceeds it. Refuses a stream under capture: a graph would keep reading
  // this buffer, which the next call overwrites. `what` names the caller in errors.
  std::byte* acquire(std::size_t bytes, cudaStream_t stream, const char* what);
  // Queues the copy of the first `bytes` of the buffer to `device` on `stream` and marks the
  // buffer busy until the copy has run.
  void copy_to(void* device, std::size_t bytes, cudaStream_t stream, const char* what);

  std::size_t capacity() const { return capacity_; }

 private:
  std::byte* host_ = nullptr;
  std::size_t capacity_ = 0;
  cudaEvent_t copied_ = nullptr;  // recorded after the last copy_to; null before the first
  bool pending_ = false;
};

}  // namespace fp8mla::cuda
