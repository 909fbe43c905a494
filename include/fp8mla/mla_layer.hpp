// One MLA attention layer's prefill (DESIGN section 5): q_a -> RMSNorm -> q_b (or q_proj),
// kv_a_proj_with_mqa -> RMSNorm on kv_c, kv_b_proj, RoPE, latent cache write, attention over
// each sequence's cached prefix and new tokens (one-shot, or chunked prefix with LSE merge),
// o_proj. The attention backend (fp8mla/attention_backend.hpp) decides the path, both
// first-class: with its prepare_prefill_qkv hook the FP8 path (fused RoPE + e4m3 Q/K/V, FP8
// attention), without it the BF16 path (bf16 RoPE, bf16 attention); the cache is FP8 in both.
//
// This version runs on the CPU (the reference backend, every step through fp8mla's CPU ops and
// f32 GEMMs with bf16 outputs). A CUDA layer is not in this build: CUDA tensors are an
// ErrorCategory::kUnsupported error.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "fp8mla/attention_backend.hpp"
#include "fp8mla/mla_config.hpp"
#include "fp8mla/mla_weights.hpp"
#include "fp8mla/tensor_view.hpp"

namespace fp8mla {

// A batch: per sequence, the tokens already in the latent cache (prefix) and the new ones
// (extend), and the cache slots of all of them, prefix first.
struct MlaSequence {
  std::int64_t prefix = 0;
  std::int64_t extend = 0;
  std::vector<std::int64_t> slots;  // prefix + extend slots
};

struct MlaBatch {
  std::vector<MlaSequence> sequences;
  std::int64_t extend_tokens() const;
};

struct MlaPrefillOptions {
  // Up to this many prefix keys in the batch, prefix and extend keys are attended together
  // (one-shot). Above it the extend tokens attend causally among themselves, then each chunk of
  // at most chunk_capacity prefix keys non-causally, merged by LSE; the chunks bound the
  // memory the prefix keys take.
  std::int64_t one_shot_max_prefix = 8192;
  std::int64_t chunk_capacity = 8192;
  float cache_scale_inv = 1.0f;  // the latent cache holds e4m3(x * cache_scale_inv)
};

// Wall time of each stage of the last prefill, in milliseconds.
struct MlaStageTimes {
  double projections = 0;  // q, kv_a, RMSNorm, kv_b of the extend tokens
  double prep = 0;         // RoPE, FP8 conversion, cache write
  double prefix = 0;       // gather, kv_b and packing of the prefix keys
  double attention = 0;
  double merge = 0;
  double output = 0;  // o_proj
};

class MlaLayer {
 public:
  // Keeps `weights` (and what they point into) for the layer's lifetime; e4m3 weights are
  // dequantized with their block scales once, here.
  MlaLayer(MlaConfig config, const MlaWeights& weights);
  ~MlaLayer();
  MlaLayer(MlaLayer&&) noexcept;
  MlaLayer& operator=(MlaLayer&&) noexcept;

  const MlaConfig& config() const { return config_; }

  // hidden: bf16 [T, config.hidden] with T = batch.extend_tokens(), rows in sequence order;
  // cache: e4m3 [pages, page_size, 576] (the prefix rows are read, the extend rows written);
  // out: bf16 [T, config.hidden], written in full.
  // A backend lacking what the path needs is an error (check_backend).
  void prefill(const TensorView& hidden, const MlaBatch& batch, const TensorView& cache,
               const AttentionBackend& backend, const MlaPrefillOptions& options,
               const TensorView& out, MlaStageTimes* times = nullptr) const;

 private:
  struct Impl;
  MlaConfig config_;
  std::unique_ptr<Impl> impl_;
};

// The float64 reference of MlaLayer::prefill on the same inputs: dequantized weights, no
// intermediate rounding, exact softmax over every prefix key (from the cache, dequantized) and
// the sequence's extend keys up to the query's position. out: f64 [T, hidden], contiguous.
void mla_prefill_reference(const MlaConfig& config, const MlaWeights& weights,
                           const TensorView& hidden, const MlaBatch& batch, const TensorView& cache,
                           float cache_scale_inv, double* out);

}  // namespace fp8mla
