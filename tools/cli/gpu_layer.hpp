// An MlaLayer on cuda:0 with device copies of one batch's inputs, for `fp8mla run` and
// `fp8mla bench layer`: hidden, the latent cache (reset from the host before a checked run), the
// output and a workspace sized for the batch under every backend it will be given. With a
// tensor-parallel `tp`, `weights` is that rank's shard and `out` its partial sum (no
// communicator).
// CUDA builds only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "bench/device.hpp"
#include "fp8mla/attention_backend.hpp"
#include "fp8mla/mla_layer.hpp"

namespace fp8mla::cli {

class GpuLayerHarness {
 public:
  GpuLayerHarness(const MlaConfig& config, const MlaWeights& weights, const MlaBatch& batch,
                  const std::vector<std::uint16_t>& hidden, std::int64_t cache_pages,
                  std::int64_t page_size, const MlaPrefillOptions& options,
                  const std::vector<const AttentionBackend*>& backends, MlaTensorParallel tp = {})
      : layer_(config, weights, Device::cuda(0), tp),
        batch_(batch),
        options_(options),
        tokens_(batch.extend_tokens()),
        pages_(cache_pages),
        page_size_(page_size),
        hidden_(std::int64_t(hidden.size()) * 2),
        cache_(cache_pages * page_size * kMlaLatentDim),
        out_(std::int64_t(hidden.size()) * 2) {
    MlaWorkspaceLimits limits{tokens_, std::int64_t(batch.sequences.size()), 0};
    for (const MlaSequence& s : batch.sequences) limits.max_prefix_tokens += s.prefix;
    std::size_t bytes = 0;
    for (const AttentionBackend* b : backends)
      bytes = std::max(bytes, layer_.workspace_bytes(limits, options, *b));
    workspace_ = DeviceBuffer(std::int64_t(bytes));
    cuda::check(
        cudaMemcpy(hidden_.data(), hidden.data(), hidden.size() * 2, cudaMemcpyHostToDevice),
        "cudaMemcpy(hidden)");
  }

  MlaLayer& layer() { return layer_; }
  // The options of the following prefills (the workspace was sized with the constructor's; the
  // scales do not change its size).
  void set_options(const MlaPrefillOptions& options) { options_ = options; }

  // MlaLayer::calibrate on the batch (its own workspace, and a wait for the default stream).
  MlaCalibration calibrate(const MlaCalibrationOptions& options) {
    return layer_.calibrate(TensorView(hidden_.data(), DType::kBF16,
                                       {tokens_, layer_.config().hidden}, Device::cuda(0)),
                            batch_, options);
  }

  // Copies `cache` (host bytes) to the device cache.
  void set_cache(const std::vector<std::uint8_t>& cache) {
    cuda::check(cudaMemcpy(cache_.data(), cache.data(), cache.size(), cudaMemcpyHostToDevice),
                "cudaMemcpy(cache)");
  }

  // One prefill on the default stream; times (CUDA events) when asked for.
  void prefill(const AttentionBackend& backend, MlaStageTimes* times = nullptr) {
    const Device d = Device::cuda(0);
    layer_.prefill(
        TensorView(hidden_.data(), DType::kBF16, {tokens_, layer_.config().hidden}, d), batch_,
        TensorView(cache_.data(), DType::kE4M3, {pages_, page_size_, kMlaLatentDim}, d), backend,
        options_, TensorView(out_.data(), DType::kBF16, {tokens_, layer_.config().hidden}, d),
        TensorView(workspace_.data(), DType::kE4M3, {workspace_.bytes()}, d), times);
  }

  std::vector<std::uint16_t> out() const {
    return to_host<std::uint16_t>(out_.data(), out_.bytes() / 2);
  }
  std::vector<std::uint8_t> cache() const {
    return to_host<std::uint8_t>(cache_.data(), cache_.bytes());
  }
  std::int64_t workspace_bytes() const { return workspace_.bytes(); }

 private:
  MlaLayer layer_;
  MlaBatch batch_;
  MlaPrefillOptions options_;
  std::int64_t tokens_, pages_, page_size_;
  DeviceBuffer hidden_, cache_, out_, workspace_;
};

}  // namespace fp8mla::cli
