#include "fp8mla/mla_config.hpp"

#include <cmath>

#include "fp8mla/error.hpp"

namespace fp8mla {
namespace {

// DeepSeek-V2/V3 config.json: rope_theta 10000, rope_scaling {yarn, factor 40, original 4096,
// beta_fast 32, beta_slow 1, mscale and mscale_all_dim 0.707 (V2) or 1.0 (V3)},
// max_position_embeddings 163840, rms_norm_eps 1e-6.
MlaConfig deepseek(std::string name, std::int64_t hidden, std::int64_t heads,
                   std::int64_t q_lora_rank, double mscale) {
  MlaConfig c;
  c.name = std::move(name);
  c.hidden = hidden;
  c.heads = heads;
  c.q_lora_rank = q_lora_rank;
  c.max_position = 163840;
  YarnScaling yarn;
  yarn.mscale = mscale;
  yarn.mscale_all_dim = mscale;
  c.rope.yarn = yarn;
  return c;
}

std::vector<MlaConfig> presets() {
  MlaConfig tiny;
  tiny.name = "tiny";
  tiny.hidden = 512;
  tiny.heads = 4;
  tiny.q_lora_rank = 512;
  tiny.max_position = 4096;
  return {deepseek("deepseek-v2-lite", 2048, 16, 0, 0.707),
          deepseek("deepseek-v2", 5120, 128, 1536, 0.707),
          deepseek("deepseek-v3", 7168, 128, 1536, 1.0), tiny};
}

}  // namespace

double MlaConfig::softmax_scale() const {
  const double mscale = softmax_mscale(rope);
  return mscale * mscale / std::sqrt(double(kMlaQkDim));
}

MlaConfig mla_preset(std::string_view name) {
  for (MlaConfig& c : presets()) {
    if (c.name == name) return c;
  }
  std::string known;
  for (const std::string& n : mla_preset_names()) known += concat(known.empty() ? "" : ", ", n);
  throw Error(ErrorCategory::kInvalidArgument,
              concat("unknown MLA preset '", name, "'; known: ", known));
}

std::vector<std::string> mla_preset_names() {
  std::vector<std::string> names;
  for (const MlaConfig& c : presets()) names.push_back(c.name);
  return names;
}

}  // namespace fp8mla
