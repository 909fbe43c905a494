// Hugging Face model directories (fp8mla/hf_model.hpp): config.json read into an MlaConfig (YaRN in
// rope_scaling or transformers 5's rope_parameters, no query LoRA), a layer loaded byte for byte
// from a sharded directory opening only its shards, and clear errors for unsupported or
// incomplete configs, missing shards and indexes that disagree with their shards.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "error_test_util.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/hf_model.hpp"
#include "fp8mla/mla_parallel.hpp"
#include "fp8mla/mla_prep.hpp"
#include "fp8mla/mla_weights.hpp"
#include "fp8mla/safetensors.hpp"

namespace fp8mla {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::expect_error;

// A DeepSeek-V3-like config.json, small: 2 heads, hidden 256, V3's YaRN.
json v3_config() {
  return json::parse(R"({
    "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 256, "num_attention_heads": 2, "num_hidden_layers": 2,
    "q_lora_rank": 128, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "max_position_embeddings": 8192, "rms_norm_eps": 1e-06,
    "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
  })");
}

std::vector<std::uint8_t> bytes_of(const TensorView& v) {
  const auto* p = static_cast<const std::uint8_t*>(v.data());
  return {p, p + v.numel() * dtype_size(v.dtype())};
}

// A model directory in the temporary folder, removed with it: layer 0 in shard 1, layer 1 in
// shard 2, and an index listing both.
class ModelDir {
 public:
  explicit ModelDir(WeightFormat format, const json& config = v3_config())
      : path_(fs::temp_directory_path() / ("fp8mla_hf_model_test_" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
    write("config.json", config.dump(2));
    config_ = mla_config_from_json(v3_config().dump(), "config.json");
    json map = json::object();
    for (int layer = 0; layer < 2; ++layer) {
      weights_.push_back(generate_mla_weights(config_, format, 100 + layer));
      const std::string shard = shard_name(layer);
      const auto tensors = mla_weight_tensors(weights_.back(), config_, layer);
      write_safetensors(file(shard), tensors);
      for (const auto& [name, view] : tensors) map[name] = shard;
    }
    index_ = {{"metadata", {{"total_size", 0}}}, {"weight_map", map}};
    write_index();
  }
  ~ModelDir() { fs::remove_all(path_); }

  static std::string shard_name(int layer) {
    return "model-0000" + std::to_string(layer + 1) + "-of-00002.safetensors";
  }
  std::string dir() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(file(name), std::ios::binary) << text;
  }
  json& index() { return index_; }
  void write_index() const { write("model.safetensors.index.json", index_.dump()); }
  const MlaWeights& weights(int layer) const { return weights_[std::size_t(layer)]; }
  const MlaConfig& config() const { return config_; }

 private:
  fs::path path_;
  MlaConfig config_;
  std::vector<MlaWeights> weights_;
  json index_;
};

MlaConfig parse(const json& j) {
  return mla_config_from_json(j.dump(), "config.json");
}

TEST(HfConfig, ReadsDeepSeekV3Fields) {
  const MlaConfig c = parse(v3_config());
  EXPECT_EQ(c.name, "deepseek_v3");
  EXPECT_EQ(c.hidden, 256);
  EXPECT_EQ(c.heads, 2);
  EXPECT_EQ(c.q_lora_rank, 128);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.max_position, 8192);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope.theta, 10000.0);
  ASSERT_TRUE(c.rope.yarn.has_value());
  EXPECT_EQ(c.rope.yarn->factor, 40.0);
  EXPECT_EQ(c.rope.yarn->original_max_position, 4096);
  EXPECT_EQ(c.rope.yarn->beta_fast, 32.0);
  EXPECT_EQ(c.rope.yarn->beta_slow, 1.0);
  EXPECT_EQ(c.rope.yarn->mscale, 1.0);
  EXPECT_EQ(c.rope.yarn->mscale_all_dim, 1.0);
  const double mscale = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c.softmax_scale(), mscale * mscale / std::sqrt(192.0), 1e-12);
}

TEST(HfConfig, ReadsV2LiteKimiAndTransformers5Styles) {
  json lite = v3_config();
  lite["model_type"] = "deepseek_v2";
  lite["q_lora_rank"] = nullptr;
  lite["rope_scaling"] = {{"rope_type", "yarn"},
                          {"factor", 40},
                          {"original_max_position_embeddings", 4096},
                          {"mscale", 0.707},
                          {"mscale_all_dim", 0.707}};
  const MlaConfig c = parse(lite);
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_EQ(c.rope.yarn->mscale_all_dim, 0.707);
  EXPECT_EQ(c.rope.yarn->beta_fast, 32.0);  // transformers' default

  json kimi = v3_config();
  kimi["model_type"] = "kimi_k2";
  kimi["rope_theta"] = 50000.0;
  kimi["rope_scaling"] = nullptr;
  EXPECT_FALSE(parse(kimi).rope.yarn.has_value());
  EXPECT_EQ(parse(kimi).rope.theta, 50000.0);

  json t5 = v3_config();
  t5.erase("rope_theta");
  t5.erase("rope_scaling");
  t5["rope_parameters"] = {{"rope_theta", 10000.0}, {"rope_type", "yarn"},
                           {"factor", 40.0},        {"original_max_position_embeddings", 4096},
                           {"beta_fast", 32.0},     {"beta_slow", 1.0},
                           {"mscale", 1.0},         {"mscale_all_dim", 1.0}};
  const MlaConfig p = parse(t5);
  EXPECT_EQ(p.rope.theta, 10000.0);
  ASSERT_TRUE(p.rope.yarn.has_value());
  EXPECT_EQ(p.rope.yarn->factor, 40.0);
  EXPECT_EQ(p.softmax_scale(), parse(v3_config()).softmax_scale());
  t5["rope_parameters"] = {{"rope_theta", 10000.0}, {"rope_type", "default"}};
  EXPECT_FALSE(parse(t5).rope.yarn.has_value());
}

// transformers' YaRN rule: cos and sin are scaled by mscale(f, mscale) / mscale(f, mscale_all_dim)
// only when the config gives both non-zero, else by mscale(f, 1); the softmax by
// mscale(f, mscale_all_dim)^2, or not at all without mscale_all_dim. An attention_factor must be
// the one the table applies.
TEST(HfConfig, YarnKeysAConfigLeavesOutFollowTransformers) {
  const auto mscale = [](double m) { return 0.1 * m * std::log(40.0) + 1.0; };
  struct Case {
    json keys;
    double table, softmax;  // expected attention factor and softmax mscale
  };
  const Case cases[] = {
      {json::object(), mscale(1.0), 1.0},
      {{{"mscale", 0.707}}, mscale(1.0), 1.0},
      {{{"mscale_all_dim", 0.707}}, mscale(1.0), mscale(0.707)},
      {{{"mscale", 0.0}, {"mscale_all_dim", 1.0}}, mscale(1.0), mscale(1.0)},
      {{{"mscale", 1.0}, {"mscale_all_dim", 0.707}}, mscale(1.0) / mscale(0.707), mscale(0.707)},
      {{{"mscale", 0.707}, {"mscale_all_dim", 0.707}}, 1.0, mscale(0.707)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.keys.dump());
    json j = v3_config();
    j["rope_scaling"].erase("mscale");
    j["rope_scaling"].erase("mscale_all_dim");
    j["rope_scaling"].update(c.keys);
    const MlaConfig config = parse(j);
    EXPECT_NEAR(yarn_attention_factor(*config.rope.yarn), c.table, 1e-15);
    EXPECT_NEAR(softmax_mscale(config.rope), c.softmax, 1e-15);
    // The table's first row holds cos(0) = the attention factor.
    std::vector<float> table(2 * kMlaRopeDim);
    make_cos_sin_cache(TensorView(table.data(), DType::kF32, {2, kMlaRopeDim}), config.rope);
    EXPECT_EQ(table[0], float(c.table));
    j["rope_scaling"]["attention_factor"] = c.table;
    EXPECT_NO_THROW(parse(j));
    j["rope_scaling"]["attention_factor"] = c.table * 1.01;
    expect_error([&] { parse(j); }, ErrorCategory::kInvalidArgument,
                 {"'rope_scaling.attention_factor' is", "fp8mla's YaRN applies"});
  }
}

TEST(HfConfig, UnsupportedOrIncompleteConfigsAreClearErrors) {
  json j = v3_config();
  j["model_type"] = "llama";
  expect_error([&] { parse(j); }, ErrorCategory::kUnsupported,
               {"model_type 'llama'", "deepseek_v3", "kimi_k2"});
  for (const char* key : {"kv_lora_rank", "hidden_size", "q_lora_rank", "rope_theta"}) {
    j = v3_config();
    j.erase(key);
    expect_error([&] { parse(j); }, ErrorCategory::kInvalidArgument,
                 {"config.json", concat("key '", key, "' is missing")});
  }
  j = v3_config();
  j["rope_scaling"].erase("factor");
  expect_error([&] { parse(j); }, ErrorCategory::kInvalidArgument,
               {"key 'rope_scaling.factor' is missing"});
  j = v3_config();
  j["num_attention_heads"] = "two";
  expect_error([&] { parse(j); }, ErrorCategory::kInvalidArgument,
               {"num_attention_heads", "must be an integer"});
  j = v3_config();
  j["qk_nope_head_dim"] = 64;
  expect_error([&] { parse(j); }, ErrorCategory::kUnsupported,
               {"qk_nope_head_dim 64 is not supported", "qk_rope_head_dim 64"});
  j = v3_config();
  j["v_head_dim"] = 192;
  expect_error([&] { parse(j); }, ErrorCategory::kUnsupported, {"v_head_dim 192"});
  j = v3_config();
  j["rope_scaling"]["type"] = "linear";
  expect_error([&] { parse(j); }, ErrorCategory::kUnsupported, {"RoPE scaling 'linear'"});
  // What transformers' attention reads and the layer does not model is refused, not ignored.
  j = v3_config();
  j["rope_interleave"] = false;
  expect_error([&] { parse(j); }, ErrorCategory::kUnsupported,
               {"rope_interleave false", "interleaved pairs"});
  j["rope_interleave"] = true;
  j["attention_bias"] = true;
  expect_error([&] { parse(j); }, ErrorCategory::kUnsupported,
               {"attention_bias true is not supported"});
  j["attention_bias"] = false;
  EXPECT_NO_THROW(parse(j));
  j["rope_scaling"]["truncate"] = false;
  expect_error([&] { parse(j); }, ErrorCategory::kUnsupported,
               {"rope_scaling.truncate false is not supported"});
  j["rope_scaling"]["truncate"] = true;
  j["rope_scaling"]["partial_rotary_factor"] = 0.5;
  expect_error([&] { parse(j); }, ErrorCategory::kUnsupported,
               {"rope_scaling.partial_rotary_factor 0.5 is not supported"});
  j["rope_scaling"]["partial_rotary_factor"] = 1.0;
  EXPECT_NO_THROW(parse(j));
  expect_error([] { mla_config_from_json("{oops", "config.json"); },
               ErrorCategory::kInvalidArgument, {"not valid JSON"});
  expect_error([] { load_mla_config("/nonexistent/config.json"); }, ErrorCategory::kIo,
               {"cannot open", "/nonexistent/config.json"});
}

TEST(HfModel, LoadsALayerFromItsShardOnly) {
  for (WeightFormat format : {WeightFormat::kBf16, WeightFormat::kFp8Block}) {
    const ModelDir dir(format);
    const SafetensorsModel model(dir.dir());
    EXPECT_EQ(model.config().hidden, 256);
    EXPECT_EQ(model.num_layers(), 2);
    const MlaWeights w = load_mla_weights(model, 1);
    EXPECT_EQ(model.open_shards(), std::vector<std::string>{ModelDir::shard_name(1)});
    EXPECT_EQ(w.format, format);
    const auto loaded = mla_weight_tensors(w, model.config(), 1);
    const auto written = mla_weight_tensors(dir.weights(1), dir.config(), 1);
    ASSERT_EQ(loaded.size(), written.size());
    for (std::size_t i = 0; i < loaded.size(); ++i) {
      EXPECT_EQ(loaded[i].first, written[i].first);
      EXPECT_EQ(loaded[i].second.dtype(), written[i].second.dtype()) << loaded[i].first;
      EXPECT_EQ(bytes_of(loaded[i].second), bytes_of(written[i].second)) << loaded[i].first;
    }
    load_mla_weights(model, 0);
    EXPECT_EQ(model.open_shards().size(), 2u);
  }
}

// With a tensor-parallel spec the directory's full checkpoint is sharded: 2 heads over 2 ranks
// give each rank one head, bf16 only (a 192-row q_b_proj shard is off the FP8 128-row blocks,
// an error that does not blame the config).
TEST(HfModel, LoadsARanksShardOfTheFullCheckpoint) {
  {  // one ModelDir at a time: they share the directory's name
    const ModelDir dir(WeightFormat::kBf16);
    const SafetensorsModel model(dir.dir());
    for (int rank = 0; rank < 2; ++rank) {
      const MlaWeights w = load_mla_weights(model, 1, {rank, 2});
      const MlaWeights expected = shard_mla_weights(dir.weights(1), dir.config(), {rank, 2});
      const MlaConfig local = mla_rank_config(model.config(), {rank, 2}, w.format);
      const auto loaded = mla_weight_tensors(w, local, 1);
      const auto sharded = mla_weight_tensors(expected, local, 1);
      ASSERT_EQ(loaded.size(), sharded.size());
      for (std::size_t i = 0; i < loaded.size(); ++i)
        EXPECT_EQ(bytes_of(loaded[i].second), bytes_of(sharded[i].second)) << loaded[i].first;
      EXPECT_EQ(w.q_b_proj.weight.size(0), 192);
      EXPECT_EQ(w.o_proj.weight.size(1), 128);
    }
  }
  const ModelDir fp8(WeightFormat::kFp8Block);
  try {
    load_mla_weights(SafetensorsModel(fp8.dir()), 0, {1, 2});
    ADD_FAILURE() << "expected an fp8mla::Error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("128-row blocks"), std::string::npos) << e.message();
    EXPECT_EQ(e.message().find("belong together"), std::string::npos) << e.message();
  }
}

TEST(HfModel, LoadsASingleModelSafetensors) {
  ModelDir dir(WeightFormat::kBf16);
  fs::remove(dir.file("model.safetensors.index.json"));
  fs::rename(dir.file(ModelDir::shard_name(0)), dir.file("model.safetensors"));
  const SafetensorsModel model(dir.dir());
  const MlaWeights w = load_mla_weights(model, 0);
  EXPECT_EQ(bytes_of(w.kv_b_proj.weight), bytes_of(dir.weights(0).kv_b_proj.weight));
  expect_error([&] { load_mla_weights(model, 1); }, ErrorCategory::kIo,
               {"model.safetensors", "has no tensor 'model.layers.1.self_attn."});
}

TEST(HfModel, MissingOrInconsistentFilesAreClearErrors) {
  ModelDir dir(WeightFormat::kBf16);
  const std::string q_b = mla_tensor_name(1, "q_b_proj.weight");
  {
    const SafetensorsModel model(dir.dir());
    expect_error([&] { load_mla_weights(model, 2); }, ErrorCategory::kOutOfRange,
                 {"layer 2 is out of range", "2 layers"});
  }
  dir.index()["weight_map"].erase(q_b);
  dir.write_index();
  expect_error([&] { load_mla_weights(SafetensorsModel(dir.dir()), 1); }, ErrorCategory::kIo,
               {"model.safetensors.index.json has no tensor '" + q_b + "'"});
  dir.index()["weight_map"][q_b] = ModelDir::shard_name(0);
  dir.write_index();
  expect_error(
      [&] { load_mla_weights(SafetensorsModel(dir.dir()), 1); }, ErrorCategory::kIo,
      {"puts tensor '" + q_b + "' in shard '" + ModelDir::shard_name(0), "does not hold it"});
  fs::remove(dir.file(ModelDir::shard_name(0)));
  expect_error([&] { load_mla_weights(SafetensorsModel(dir.dir()), 0); }, ErrorCategory::kIo,
               {"shard '" + ModelDir::shard_name(0) + "'", "is missing"});
  fs::remove(dir.file("model.safetensors.index.json"));
  expect_error([&] { SafetensorsModel m(dir.dir()); }, ErrorCategory::kIo,
               {"has neither model.safetensors.index.json nor model.safetensors"});
  fs::remove(dir.file("config.json"));
  expect_error([&] { SafetensorsModel m(dir.dir()); }, ErrorCategory::kIo, {"has no config.json"});
  expect_error([] { SafetensorsModel m("/nonexistent/model"); }, ErrorCategory::kIo,
               {"'/nonexistent/model' does not exist"});
}

TEST(HfModel, ConfigThatDoesNotMatchTheWeightsIsAClearError) {
  json config = v3_config();
  config["num_attention_heads"] = 4;  // the weights have 2 heads
  const ModelDir dir(WeightFormat::kBf16, config);
  const SafetensorsModel model(dir.dir());
  expect_error([&] { load_mla_weights(model, 0); }, ErrorCategory::kInvalidArgument,
               {"q_b_proj.weight", "[768, 128], got bf16 [384, 128]", "config.json"});
}

}  // namespace
}  // namespace fp8mla
