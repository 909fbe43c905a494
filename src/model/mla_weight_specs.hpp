// The tensors of one MLA layer's weights (fp8mla/mla_weights.hpp) as a config shapes them: each
// projection's and norm's DeepSeek name, its member of MlaWeights and its shape. Generating
// weights (mla_weights.cpp) and loading them from safetensors (mla_weights_load.cpp) walk the same
// lists.
#pragma once

#include <cstdint>
#include <vector>

#include "fp8mla/mla_config.hpp"
#include "fp8mla/mla_weights.hpp"

namespace fp8mla::model {

// 128-element blocks covering n (the block scales of one dim).
inline std::int64_t weight_blocks(std::int64_t n) {
  return (n + kWeightBlock - 1) / kWeightBlock;
}

// One projection's expected shape, and whether the layer has it.
struct ProjectionSpec {
  const char* name;
  MlaProjection MlaWeights::*member;
  std::int64_t out, in;
};
struct NormSpec {
  const char* name;
  TensorView MlaWeights::*member;
  std::int64_t size;
};

// The layer's projections and RMSNorm weights under `config` (q_proj or q_a/q_b by q_lora_rank).
std::vector<ProjectionSpec> projections(const MlaConfig& config);
std::vector<NormSpec> norms(const MlaConfig& config);

}  // namespace fp8mla::model
