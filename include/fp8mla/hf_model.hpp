// Hugging Face model directories (docs/design.md section 5): the MLA config from config.json
// (model_type deepseek_v2, deepseek_v3 or kimi_k2) and a layer's weights from the directory's
// safetensors files, sharded through model.safetensors.index.json or in one model.safetensors.
// In fp8mla::model, with the safetensors reader (fp8mla/safetensors.hpp).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fp8mla/mla_config.hpp"
#include "fp8mla/mla_weights.hpp"
#include "fp8mla/safetensors.hpp"

namespace fp8mla {

// The MlaConfig of a config.json's text; `source` names it in errors. Reads heads, hidden size,
// q_lora_rank (null: none), kv_lora_rank, the head dims, max_position_embeddings, rms_norm_eps,
// rope_theta and rope_scaling (YaRN or none), or transformers 5's rope_parameters holding both.
// Errors: malformed JSON or a missing or mistyped key is kInvalidArgument naming the key; an
// unknown model_type, a RoPE scaling other than YaRN, or head dims other than the ones the ops
// take (qk_nope 128, qk_rope 64, v 128, kv_lora_rank 512) is kUnsupported.
MlaConfig mla_config_from_json(std::string_view json, const std::string& source);

// mla_config_from_json of the file `path`; a file that cannot be read is kIo.
MlaConfig load_mla_config(const std::string& path);

// A model directory: its config.json and its safetensors weights. Construction reads the config
// and the index (not the shards); a shard is opened, and stays open, the first time one of its
// tensors is asked for, so loading one layer opens only the shards holding that layer.
class SafetensorsModel {
 public:
  // kIo when the directory has no config.json, or neither model.safetensors.index.json nor
  // model.safetensors, or a malformed index.
  explicit SafetensorsModel(const std::string& dir);
  ~SafetensorsModel();
  SafetensorsModel(SafetensorsModel&&) noexcept;
  SafetensorsModel& operator=(SafetensorsModel&&) noexcept;

  const std::string& dir() const { return dir_; }
  const MlaConfig& config() const { return config_; }
  std::optional<std::int64_t> num_layers() const { return num_layers_; }  // num_hidden_layers

  // The open shard holding tensor `name`. kIo for a tensor the index does not list, a shard file
  // that is missing, or a shard that lacks the tensor the index puts in it.
  const SafetensorsFile& file_of(const std::string& name) const;
  // The shard files opened so far, by file name.
  std::vector<std::string> open_shards() const;

 private:
  std::string dir_;
  MlaConfig config_;
  std::optional<std::int64_t> num_layers_;
  std::map<std::string, std::string, std::less<>> weight_map_;  // tensor -> shard; empty: one file
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>, std::less<>> shards_;
};

// Layer `layer`'s weights from `model` (which must outlive them), checked against its config as
// load_mla_weights(file, ...) checks them; a layer past num_hidden_layers is kOutOfRange. With a
// tensor-parallel `tp` of size > 1: rank tp.rank's shard of them (shard_mla_weights).
MlaWeights load_mla_weights(const SafetensorsModel& model, int layer, MlaTensorParallel tp = {});

}  // namespace fp8mla
