// The weights of one MLA attention layer (docs/design.md section 5), named and shaped as DeepSeek
// ships them under model.layers.<N>.self_attn.: q_a_proj, q_a_layernorm, q_b_proj (or q_proj
// without a query LoRA), kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj. Projections are
// [out, in], bf16, or e4m3 with f32 weight_scale_inv [ceil(out / 128), ceil(in / 128)] (one scale
// per 128 x 128 block: w = e4m3 * scale_inv); the RMSNorm weights are bf16.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fp8mla/mla_config.hpp"
#include "fp8mla/safetensors.hpp"
#include "fp8mla/tensor_view.hpp"

namespace fp8mla {

inline constexpr std::int64_t kWeightBlock = 128;  // FP8 block-scale granularity

enum class WeightFormat { kBf16, kFp8Block };

struct MlaProjection {
  TensorView weight;     // [out, in] bf16 or e4m3
  TensorView scale_inv;  // f32 [ceil(out/128), ceil(in/128)] for e4m3; empty for bf16
};

struct MlaWeights {
  WeightFormat format = WeightFormat::kBf16;
  MlaProjection q_a_proj;            // [q_lora_rank, hidden]            (q_lora_rank > 0)
  TensorView q_a_layernorm;          // [q_lora_rank]
  MlaProjection q_b_proj;            // [heads * 192, q_lora_rank]
  MlaProjection q_proj;              // [heads * 192, hidden]            (q_lora_rank == 0)
  MlaProjection kv_a_proj_with_mqa;  // [kv_lora_rank + 64, hidden]
  TensorView kv_a_layernorm;         // [kv_lora_rank]
  MlaProjection kv_b_proj;           // [heads * 256, kv_lora_rank]
  MlaProjection o_proj;              // [hidden, heads * 128]
  // Owns the memory of generated weights; loaded ones point into their SafetensorsFile.
  std::shared_ptr<std::vector<std::byte>> storage;
};

// The safetensors name of weight `leaf` (e.g. "q_a_proj.weight") of layer `layer`.
std::string mla_tensor_name(int layer, const std::string& leaf);

// Views of layer `layer`'s weights in `file` (which must outlive them), checked against `config`:
// a missing tensor, a wrong shape or dtype, or a mix of bf16 and e4m3 projections is an error
// naming the tensor, what was expected and what the file holds. In fp8mla::model, with the
// safetensors reader (fp8mla/safetensors.hpp); the rest of this header is in fp8mla::fp8mla.
// With a tensor-parallel `tp` (fp8mla/mla_parallel.hpp) of size > 1, the file holds the full
// checkpoint and the result is rank tp.rank's shard of it (shard_mla_weights), for an MlaLayer
// built with the same `config` and `tp`.
MlaWeights load_mla_weights(const SafetensorsFile& file, const MlaConfig& config, int layer,
                            MlaTensorParallel tp = {});

// The open file holding the tensor of a given name (a checkpoint's shard); it must outlive the
// weights loaded from it, and may throw ErrorCategory::kIo for a name it cannot place.
using TensorFileLookup = std::function<const SafetensorsFile&(const std::string& name)>;

// load_mla_weights over several files: each tensor is read from file_of(its name).
MlaWeights load_mla_weights(const TensorFileLookup& file_of, const MlaConfig& config, int layer,
                            MlaTensorParallel tp = {});

// Random weights from `seed` (entries ~ U(-1, 1) / sqrt(in), norms ~ 1 +- 0.1); e4m3 weights are
// those values quantized with one scale per 128 x 128 block.
MlaWeights generate_mla_weights(const MlaConfig& config, WeightFormat format, std::uint64_t seed);

// (name, view) of every tensor of `w` under layer `layer`'s names, as write_safetensors takes.
std::vector<std::pair<std::string, TensorView>> mla_weight_tensors(const MlaWeights& w,
                                                                   const MlaConfig& config,
                                                                   int layer);

}  // namespace fp8mla
