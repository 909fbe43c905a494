// mla_config_from_json (fp8mla/hf_model.hpp): a Hugging Face config.json of a DeepSeek-V2/V3 or
// Kimi-K2 model as an MlaConfig.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "fp8mla/error.hpp"
#include "fp8mla/hf_model.hpp"
#include "fp8mla/mla_prep.hpp"

namespace fp8mla {
namespace {

using nlohmann::json;

constexpr const char* kModelTypes[] = {"deepseek_v2", "deepseek_v3", "kimi_k2"};

// Typed reads of one JSON object's keys, each error naming the file and the key.
class Keys {
 public:
  Keys(const json& object, const std::string& source, std::string prefix = "")
      : object_(object), source_(source), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return object_.contains(key) && !object_[key].is_null(); }

  const json& at(const char* key) const {
    if (!object_.contains(key)) throw error(key, "is missing");
    return object_[key];
  }
  std::int64_t integer(const char* key) const {
    const json& v = at(key);
    if (!v.is_number_integer()) throw error(key, concat("must be an integer, got ", v.dump()));
    return v.get<std::int64_t>();
  }
  double number(const char* key) const {
    const json& v = at(key);
    if (!v.is_number()) throw error(key, concat("must be a number, got ", v.dump()));
    return v.get<double>();
  }
  double number_or(const char* key, double fallback) const {
    return has(key) ? number(key) : fallback;
  }
  bool boolean(const char* key) const {
    const json& v = at(key);
    if (!v.is_boolean()) throw error(key, concat("must be true or false, got ", v.dump()));
    return v.get<bool>();
  }
  std::string string(const char* key) const {
    const json& v = at(key);
    if (!v.is_string()) throw error(key, concat("must be a string, got ", v.dump()));
    return v.get<std::string>();
  }

 private:
  Error error(const char* key, const std::string& what) const {
    return Error(ErrorCategory::kInvalidArgument,
                 concat("'", source_, "': key '", prefix_, key, "' ", what));
  }
  const json& object_;
  const std::string& source_;
  std::string prefix_;
};

// Head dims and ranks the ops take as constants (fp8mla/mla_prep.hpp).
void check_fixed_dims(const Keys& keys, const std::string& source) {
  const std::pair<const char*, std::int64_t> fixed[] = {{"qk_nope_head_dim", kMlaNopeDim},
                                                        {"qk_rope_head_dim", kMlaRopeDim},
                                                        {"v_head_dim", kMlaVDim},
                                                        {"kv_lora_rank", kMlaKvLoraRank}};
  for (const auto& [key, value] : fixed) {
    const std::int64_t got = keys.integer(key);
    if (got != value) {
      throw Error(ErrorCategory::kUnsupported,
                  concat("'", source, "': ", key, " ", got, " is not supported: fp8mla's MLA ops ",
                         "take qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128 and ",
                         "kv_lora_rank 512"));
    }
  }
}

// rope_scaling (or rope_parameters): none, "default", or YaRN with DeepSeek's keys. The YaRN
// defaults are transformers': beta_fast 32, beta_slow 1, mscale and mscale_all_dim absent (0). An
// attention_factor, which transformers applies in place of the mscale rule, must be the one
// the table applies (yarn_attention_factor).
std::optional<YarnScaling> rope_scaling(const json& scaling, const std::string& source,
                                        const std::string& prefix) {
  if (scaling.is_null()) return std::nullopt;
  if (!scaling.is_object()) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("'", source, "': key '", prefix, "' must be an object or null"));
  }
  const Keys keys(scaling, source, prefix + ".");
  const std::string type = keys.has("rope_type") ? keys.string("rope_type")
                           : keys.has("type")    ? keys.string("type")
                                                 : "default";
  if (type == "default") return std::nullopt;
  if (type != "yarn") {
    throw Error(ErrorCategory::kUnsupported,
                concat("'", source, "': RoPE scaling '", type,
                       "' is not supported (supported: yarn or none)"));
  }
  YarnScaling y;
  y.factor = keys.number("factor");
  y.original_max_position = keys.integer("original_max_position_embeddings");
  y.beta_fast = keys.number_or("beta_fast", 32.0);
  y.beta_slow = keys.number_or("beta_slow", 1.0);
  // What transformers reads from these keys and fp8mla's table fixes: a differing one is an
  // error, never ignored.
  if (keys.has("truncate") && !keys.boolean("truncate")) {
    throw Error(ErrorCategory::kUnsupported,
                concat("'", source, "': ", prefix,
                       ".truncate false is not supported: fp8mla's YaRN rounds the correction "
                       "range to whole dims, as DeepSeek does"));
  }
  if (keys.has("partial_rotary_factor") && keys.number("partial_rotary_factor") != 1.0) {
    throw Error(ErrorCategory::kUnsupported,
                concat("'", source, "': ", prefix, ".partial_rotary_factor ",
                       keys.number("partial_rotary_factor"),
                       " is not supported: fp8mla rotates all 64 RoPE dims"));
  }
  y.mscale = keys.number_or("mscale", 0.0);
  y.mscale_all_dim = keys.number_or("mscale_all_dim", 0.0);
  if (keys.has("attention_factor")) {
    const double given = keys.number("attention_factor"), applied = yarn_attention_factor(y);
    if (std::abs(given - applied) > 1e-12 * std::abs(applied)) {
      throw Error(ErrorCategory::kInvalidArgument,
                  concat("'", source, "': key '", prefix, ".attention_factor' is ", given,
                         " but fp8mla's YaRN applies ", applied,
                         " (from factor, mscale and mscale_all_dim)"));
    }
  }
  return y;
}

// Keys of DeepSeek's attention in transformers that the layer does not model: a value other than
// the one it implements is kUnsupported, never ignored.
void check_attention_keys(const Keys& keys, const std::string& source) {
  if (keys.has("rope_interleave") && !keys.boolean("rope_interleave")) {
    throw Error(ErrorCategory::kUnsupported,
                concat("'", source,
                       "': rope_interleave false (RoPE on rotate_half pairs) is not supported: "
                       "the MLA layer rotates DeepSeek's interleaved pairs"));
  }
  if (keys.has("attention_bias") && keys.boolean("attention_bias")) {
    throw Error(ErrorCategory::kUnsupported,
                concat("'", source,
                       "': attention_bias true is not supported: the MLA layer's projections "
                       "have no bias"));
  }
}

void check_positive(std::int64_t value, const char* key, const std::string& source) {
  if (value <= 0) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("'", source, "': ", key, " must be positive, got ", value));
  }
}

}  // namespace

MlaConfig mla_config_from_json(std::string_view text, const std::string& source) {
  json root;
  try {
    root = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("'", source, "' is not valid JSON (", e.what(), ")"));
  }
  if (!root.is_object()) {
    throw Error(ErrorCategory::kInvalidArgument, concat("'", source, "' is not a JSON object"));
  }
  const Keys keys(root, source);
  const std::string type = keys.string("model_type");
  if (std::find(std::begin(kModelTypes), std::end(kModelTypes), type) == std::end(kModelTypes)) {
    throw Error(ErrorCategory::kUnsupported,
                concat("'", source, "': model_type '", type,
                       "' is not supported (supported: deepseek_v2, deepseek_v3, kimi_k2)"));
  }
  check_fixed_dims(keys, source);
  check_attention_keys(keys, source);
  MlaConfig c;
  c.name = type;
  c.hidden = keys.integer("hidden_size");
  c.heads = keys.integer("num_attention_heads");
  keys.at("q_lora_rank");  // null (no query LoRA) must be said, not left out
  c.q_lora_rank = keys.has("q_lora_rank") ? keys.integer("q_lora_rank") : 0;
  c.kv_lora_rank = kMlaKvLoraRank;
  c.max_position = keys.integer("max_position_embeddings");
  c.rms_norm_eps = keys.number("rms_norm_eps");
  check_positive(c.hidden, "hidden_size", source);
  check_positive(c.heads, "num_attention_heads", source);
  check_positive(c.max_position, "max_position_embeddings", source);
  if (c.q_lora_rank < 0) {
    throw Error(
        ErrorCategory::kInvalidArgument,
        concat("'", source, "': q_lora_rank must be null or positive, got ", c.q_lora_rank));
  }
  // transformers 5 keeps rope_theta and the scaling together in rope_parameters.
  if (keys.has("rope_parameters")) {
    const json& params = keys.at("rope_parameters");
    c.rope.yarn = rope_scaling(params, source, "rope_parameters");
    c.rope.theta = Keys(params, source, "rope_parameters.").number("rope_theta");
  } else {
    c.rope.theta = keys.number("rope_theta");
    c.rope.yarn = keys.has("rope_scaling")
                      ? rope_scaling(keys.at("rope_scaling"), source, "rope_scaling")
                      : std::nullopt;
  }
  return c;
}

MlaConfig load_mla_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCategory::kIo, concat("cannot open '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error(ErrorCategory::kIo, concat("cannot read '", path, "'"));
  return mla_config_from_json(text.str(), path);
}

}  // namespace fp8mla
