// The parts of MlaLayer its CPU and CUDA implementations share: the plan of a batch (host
// metadata both upload or use as is), the path the backend decides, and the interface each
// implementation fills.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fp8mla/mla_layer.hpp"
#include "model/prefix_chunks.hpp"

namespace fp8mla {

// A batch as the layer's steps see it.
struct MlaBatchPlan {
  std::int64_t tokens = 0;                     // T: extend tokens
  std::int64_t sequences = 0;                  // B
  std::vector<std::int64_t> positions, slots;  // [T]: position and cache slot of each extend token
  std::vector<std::int32_t> cu_q;              // [B + 1]: query offsets, also the extend keys'
  std::int32_t max_q = 0;
  std::vector<std::int64_t> prefix_lens;  // [B]
  std::vector<std::int64_t> prefix_rows;  // cache slots of every prefix token, in sequence order
  bool chunked = false;                   // more prefix keys than one_shot_max_prefix
  // One-shot: each sequence's keys are its prefix, then its extend tokens.
  std::vector<std::int32_t> cu_k_one_shot;  // [B + 1]
  std::int32_t max_k_one_shot = 0;
  // Chunked: chunk c holds prefix_rows[chunk_first_row[c], + chunks[c].keys()).
  std::vector<PrefixChunk> chunks;
  std::vector<std::int64_t> chunk_first_row;
};

// Checks the batch against `config` (lengths, slot counts, positions) and plans it into `plan`,
// whose vectors keep their capacity from one batch to the next.
void plan_mla_batch(const MlaConfig& config, const MlaBatch& batch,
                    const MlaPrefillOptions& options, MlaBatchPlan& plan);

// The path `backend` runs (its hook decides) and the check that it serves it on `device` with
// the cache's page size.
struct MlaPath {
  bool fp8 = false;
  DType attention_dtype = DType::kBF16;
};
MlaPath choose_mla_path(const AttentionBackend& backend, const TensorView& cache, Device device);

// Everything prefill gets, checked by MlaLayer::prefill before an implementation sees it.
struct MlaPrefillCall {
  const TensorView& hidden;
  const MlaBatchPlan& plan;
  const TensorView& cache;
  const AttentionBackend& backend;
  const MlaPrefillOptions& options;
  const TensorView& out;
  const TensorView& workspace;
  MlaPath path;
  MlaStageTimes* times;
  CudaStream stream;
};

class MlaLayer::Impl {
 public:
  virtual ~Impl() = default;
  MlaBatchPlan plan;  // of the current prefill, reused so that planning allocates nothing
  virtual const std::vector<std::string>& projection_notes() const = 0;
  virtual std::size_t workspace_bytes(const MlaWorkspaceLimits& limits,
                                      const MlaPrefillOptions& options, MlaPath path) const = 0;
  virtual void prefill(const MlaPrefillCall& call) = 0;
};

std::unique_ptr<MlaLayer::Impl> make_cpu_mla_layer(const MlaConfig& config,
                                                   const MlaWeights& weights);
#ifdef FP8MLA_WITH_CUDA
std::unique_ptr<MlaLayer::Impl> make_cuda_mla_layer(const MlaConfig& config,
                                                    const MlaWeights& weights, Device device);
#endif

}  // namespace fp8mla
