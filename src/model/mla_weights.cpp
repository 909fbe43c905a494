// Generated MLA layer weights and their DeepSeek names (fp8mla/mla_weights.hpp); loading them from
// a safetensors file is mla_weights_load.cpp.
#include "fp8mla/mla_weights.hpp"

#include <algorithm>
#include <cmath>
#include <random>

#include "fp8mla/error.hpp"
#include "fp8mla/numerics.hpp"
#include "model/mla_weight_specs.hpp"

namespace fp8mla {
namespace model {

std::vector<ProjectionSpec> projections(const MlaConfig& c) {
  std::vector<ProjectionSpec> specs;
  if (c.q_lora_rank > 0) {
    specs.push_back({"q_a_proj", &MlaWeights::q_a_proj, c.q_lora_rank, c.hidden});
    specs.push_back({"q_b_proj", &MlaWeights::q_b_proj, c.q_width(), c.q_lora_rank});
  } else {
    specs.push_back({"q_proj", &MlaWeights::q_proj, c.q_width(), c.hidden});
  }
  specs.push_back({"kv_a_proj_with_mqa", &MlaWeights::kv_a_proj_with_mqa,
                   c.kv_lora_rank + kMlaRopeDim, c.hidden});
  specs.push_back({"kv_b_proj", &MlaWeights::kv_b_proj, c.kv_b_width(), c.kv_lora_rank});
  specs.push_back({"o_proj", &MlaWeights::o_proj, c.hidden, c.o_width()});
  return specs;
}

std::vector<NormSpec> norms(const MlaConfig& c) {
  std::vector<NormSpec> specs;
  if (c.q_lora_rank > 0)
    specs.push_back({"q_a_layernorm", &MlaWeights::q_a_layernorm, c.q_lora_rank});
  specs.push_back({"kv_a_layernorm", &MlaWeights::kv_a_layernorm, c.kv_lora_rank});
  return specs;
}

}  // namespace model

using model::norms;
using model::NormSpec;
using model::projections;
using model::ProjectionSpec;
using model::weight_blocks;

std::string mla_tensor_name(int layer, const std::string& leaf) {
  return concat("model.layers.", layer, ".self_attn.", leaf);
}

MlaWeights generate_mla_weights(const MlaConfig& config, WeightFormat format, std::uint64_t seed) {
  const std::vector<ProjectionSpec> projs = projections(config);
  const std::vector<NormSpec> ns = norms(config);
  // One allocation: every tensor at an offset rounded to 16 bytes.
  auto round16 = [](std::int64_t b) { return (b + 15) / 16 * 16; };
  const int weight_bytes = format == WeightFormat::kFp8Block ? 1 : 2;
  std::int64_t total = 0;
  for (const ProjectionSpec& p : projs) {
    total += round16(p.out * p.in * weight_bytes);
    if (format == WeightFormat::kFp8Block)
      total += round16(weight_blocks(p.out) * weight_blocks(p.in) * 4);
  }
  for (const NormSpec& n : ns) total += round16(n.size * 2);

  MlaWeights w;
  w.format = format;
  w.storage = std::make_shared<std::vector<std::byte>>(std::size_t(total));
  std::byte* cursor = w.storage->data();
  auto take = [&](std::int64_t bytes) {
    std::byte* at = cursor;
    cursor += round16(bytes);
    return at;
  };
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values;
  for (const ProjectionSpec& p : projs) {
    const float scale = 1.0f / std::sqrt(float(p.in));
    values.resize(std::size_t(p.out * p.in));
    for (float& v : values) v = uniform(rng) * scale;
    MlaProjection& proj = w.*(p.member);
    std::byte* data = take(p.out * p.in * weight_bytes);
    if (format == WeightFormat::kBf16) {
      auto* out = reinterpret_cast<std::uint16_t*>(data);
      for (std::size_t i = 0; i < values.size(); ++i) out[i] = encode_bf16(values[i]);
      proj.weight = TensorView(data, DType::kBF16, {p.out, p.in});
      continue;
    }
    const std::int64_t bo = weight_blocks(p.out), bi = weight_blocks(p.in);
    auto* scales = reinterpret_cast<float*>(take(bo * bi * 4));
    auto* out = reinterpret_cast<std::uint8_t*>(data);
    for (std::int64_t r0 = 0; r0 < bo; ++r0) {
      for (std::int64_t c0 = 0; c0 < bi; ++c0) {
        const std::int64_t r_end = std::min(p.out, (r0 + 1) * kWeightBlock);
        const std::int64_t c_end = std::min(p.in, (c0 + 1) * kWeightBlock);
        float amax = 0.0f;
        for (std::int64_t r = r0 * kWeightBlock; r < r_end; ++r)
          for (std::int64_t c = c0 * kWeightBlock; c < c_end; ++c)
            amax = std::max(amax, std::fabs(values[std::size_t(r * p.in + c)]));
        const float scale_inv = amax > 0.0f ? amax / 448.0f : 1.0f;
        scales[r0 * bi + c0] = scale_inv;
        for (std::int64_t r = r0 * kWeightBlock; r < r_end; ++r)
          for (std::int64_t c = c0 * kWeightBlock; c < c_end; ++c)
            out[r * p.in + c] = encode_e4m3(values[std::size_t(r * p.in + c)] / scale_inv);
      }
    }
    proj.weight = TensorView(data, DType::kE4M3, {p.out, p.in});
    proj.scale_inv = TensorView(scales, DType::kF32, {bo, bi});
  }
  for (const NormSpec& n : ns) {
    auto* out = reinterpret_cast<std::uint16_t*>(take(n.size * 2));
    for (std::int64_t i = 0; i < n.size; ++i) out[i] = encode_bf16(1.0f + 0.1f * uniform(rng));
    w.*(n.member) = TensorView(out, DType::kBF16, {n.size});
  }
  return w;
}

std::vector<std::pair<std::string, TensorView>> mla_weight_tensors(const MlaWeights& w,
                                                                   const MlaConfig& config,
                                                                   int layer) {
  std::vector<std::pair<std::string, TensorView>> out;
  for (const ProjectionSpec& p : projections(config)) {
    const MlaProjection& proj = w.*(p.member);
    out.emplace_back(mla_tensor_name(layer, concat(p.name, ".weight")), proj.weight);
    if (proj.scale_inv.data() != nullptr) {
      out.emplace_back(mla_tensor_name(layer, concat(p.name, ".weight_scale_inv")), proj.scale_inv);
    }
  }
  for (const NormSpec& n : norms(config)) {
    out.emplace_back(mla_tensor_name(layer, concat(n.name, ".weight")), w.*(n.member));
  }
  return out;
}

}  // namespace fp8mla
