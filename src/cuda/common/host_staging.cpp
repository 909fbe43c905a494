#include "cuda/common/host_staging.hpp"

#include <algorithm>

#include "cuda/common/runtime.hpp"
#include "fp8mla/error.hpp"

namespace fp8mla::cuda {

HostStaging::~HostStaging() {
  // A destructor cannot throw: a copy still queued finishes before the memory is released.
  if (copied_ != nullptr) {
    if (pending_) cudaEventSynchronize(copied_);
    cudaEventDestroy(copied_);
  }
  if (host_ != nullptr) cudaFreeHost(host_);
}

std::byte* HostStaging::acquire(std::size_t bytes, cudaStream_t stream, const char* what) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat(what,
                       ": expected a stream that is not capturing a CUDA graph for a batch "
                       "given on the host (a graph would replay this batch's metadata from "
                       "memory the next call overwrites); got a capturing stream; pass the "
                       "batch on the device instead"));
  }
  if (pending_) {
    check(cudaEventSynchronize(copied_), "cudaEventSynchronize(host staging)");
    pending_ = false;
  }
  if (bytes > capacity_) {
    // At least doubling: freeing pinned memory may synchronize, so a batch size that keeps
    // rising regrows the buffer a logarithmic number of times, not once per new maximum.
    const std::size_t grown = std::max(bytes, 2 * capacity_);
    if (host_ != nullptr) check(cudaFreeHost(host_), "cudaFreeHost(host staging)");
    host_ = nullptr;
    capacity_ = 0;
    void* p = nullptr;
    check(cudaMallocHost(&p, grown), "cudaMallocHost(host staging)");
    host_ = static_cast<std::byte*>(p);
    capacity_ = grown;
  }
  return host_;
}

void HostStaging::copy_to(void* device, std::size_t bytes, cudaStream_t stream, const char* what) {
  if (bytes > capacity_) {
    throw Error(ErrorCategory::kInternal,
                concat(what, ": copy of ", bytes, " bytes from a staging buffer of ", capacity_));
  }
  if (bytes == 0) return;
  if (copied_ == nullptr) {
    check(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming), "cudaEventCreate(staging)");
  }
  check(cudaMemcpyAsync(device, host_, bytes, cudaMemcpyHostToDevice, stream), what);
  check(cudaEventRecord(copied_, stream), "cudaEventRecord(host staging)");
  pending_ = true;
}

}  // namespace fp8mla::cuda
