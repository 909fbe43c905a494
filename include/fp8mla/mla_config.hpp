// Shapes of one MLA attention layer (docs/design.md section 5) and the presets of the models it
// comes from. The head dims are the ops' fixed MLA dims (fp8mla/mla_prep.hpp); a preset differs in
// the hidden size, the head count, the query LoRA rank and the RoPE scaling.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fp8mla/mla_prep.hpp"

namespace fp8mla {

struct MlaConfig {
  std::string name;
  std::int64_t hidden = 0;       // model width
  std::int64_t heads = 0;        // attention heads
  std::int64_t q_lora_rank = 0;  // 0: q = q_proj(hidden) directly (DeepSeek-V2-Lite)
  std::int64_t kv_lora_rank = kMlaKvLoraRank;
  std::int64_t max_position = 0;  // max_position_embeddings
  double rms_norm_eps = 1e-6;
  RopeConfig rope;  // theta and YaRN scaling (DeepSeek's rope_scaling)

  std::int64_t q_width() const { return heads * kMlaQkDim; }                    // q_b / q_proj out
  std::int64_t kv_b_width() const { return heads * (kMlaNopeDim + kMlaVDim); }  // kv_b_proj out
  std::int64_t o_width() const { return heads * kMlaVDim; }                     // o_proj in
  // softmax_scale = mscale^2 / sqrt(192), as DeepSeek's attention computes it under YaRN.
  double softmax_scale() const;
};

// This process's place in a tensor-parallel group over the heads (fp8mla/mla_parallel.hpp);
// {0, 1}: no parallelism.
struct MlaTensorParallel {
  int rank = 0;
  int size = 1;
};

// This process's place in a context-parallel group over the tokens (docs/parallelism.md): each
// sequence's new tokens split over the ranks, the latent cache rows all-gathered
// (MlaContextParallelBatch, fp8mla/mla_layer.hpp); {0, 1}: no parallelism.
struct MlaContextParallel {
  int rank = 0;
  int size = 1;
};

// "deepseek-v2-lite", "deepseek-v2", "deepseek-v3" (DeepSeek's config.json values) and "tiny"
// (MLA dims with a small hidden size and 4 heads, for the CPU). Unknown names are an
// ErrorCategory::kInvalidArgument error listing the known ones.
MlaConfig mla_preset(std::string_view name);
std::vector<std::string> mla_preset_names();

}  // namespace fp8mla
