// write_test_model DIR: a small DeepSeek-V3-like Hugging Face model directory for the CLI tests
// (`fp8mla run --model DIR`): config.json (4 heads, hidden 512, V3's YaRN), two layers of random
// bf16 weights in two shards, and model.safetensors.index.json.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "fp8mla/error.hpp"
#include "fp8mla/hf_model.hpp"
#include "fp8mla/mla_weights.hpp"
#include "fp8mla/safetensors.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_test_model DIR\n");
    return 2;
  }
  namespace fs = std::filesystem;
  using nlohmann::json;
  try {
    const fs::path dir(argv[1]);
    fs::create_directories(dir);
    const json config = {{"model_type", "deepseek_v3"},
                         {"hidden_size", 512},
                         {"num_attention_heads", 4},
                         {"num_hidden_layers", 2},
                         {"q_lora_rank", 512},
                         {"kv_lora_rank", 512},
                         {"qk_nope_head_dim", 128},
                         {"qk_rope_head_dim", 64},
                         {"v_head_dim", 128},
                         {"max_position_embeddings", 163840},
                         {"rms_norm_eps", 1e-6},
                         {"rope_theta", 10000},
                         {"rope_scaling",
                          {{"type", "yarn"},
                           {"factor", 40},
                           {"original_max_position_embeddings", 4096},
                           {"beta_fast", 32},
                           {"beta_slow", 1},
                           {"mscale", 1.0},
                           {"mscale_all_dim", 1.0}}}};
    std::ofstream(dir / "config.json") << config.dump(2);
    const fp8mla::MlaConfig mla = fp8mla::load_mla_config((dir / "config.json").string());
    json map = json::object();
    for (int layer = 0; layer < 2; ++layer) {
      const std::string shard = "model-0000" + std::to_string(layer + 1) + "-of-00002.safetensors";
      const fp8mla::MlaWeights w =
          fp8mla::generate_mla_weights(mla, fp8mla::WeightFormat::kBf16, 7 + layer);
      const auto tensors = fp8mla::mla_weight_tensors(w, mla, layer);
      fp8mla::write_safetensors((dir / shard).string(), tensors);
      for (const auto& [name, view] : tensors) map[name] = shard;
    }
    std::ofstream(dir / "model.safetensors.index.json") << json{{"weight_map", map}}.dump(2);
  } catch (const fp8mla::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
