// SafetensorsModel (fp8mla/hf_model.hpp): a Hugging Face model directory, its config and its
// safetensors shards, opened as their tensors are asked for.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fp8mla/error.hpp"
#include "fp8mla/hf_model.hpp"
#include "fp8mla/mla_parallel.hpp"

namespace fp8mla {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kSingleFile = "model.safetensors";

// The index's weight_map: tensor name -> shard file name (a plain name inside the directory).
std::map<std::string, std::string, std::less<>> read_weight_map(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCategory::kIo, concat("cannot open '", path, "'"));
  json index;
  try {
    index = json::parse(in);
  } catch (const json::exception& e) {
    throw Error(ErrorCategory::kIo, concat("'", path, "' is not valid JSON (", e.what(), ")"));
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    throw Error(ErrorCategory::kIo, concat("'", path, "' has no weight_map object"));
  }
  std::map<std::string, std::string, std::less<>> map;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    // A shard outside the directory is not a checkpoint's.
    if (!shard.is_string() || shard.get<std::string>().find('/') != std::string::npos) {
      throw Error(ErrorCategory::kIo,
                  concat("'", path, "': weight_map entry '", name,
                         "' is not a file name in the directory: ", shard.dump()));
    }
    map.emplace(name, shard.get<std::string>());
  }
  return map;
}

}  // namespace

SafetensorsModel::SafetensorsModel(const std::string& dir) : dir_(dir) {
  const fs::path root(dir);
  if (!fs::is_directory(root)) {
    throw Error(ErrorCategory::kIo, concat("model directory '", dir, "' does not exist"));
  }
  const fs::path config = root / "config.json";
  if (!fs::exists(config)) {
    throw Error(ErrorCategory::kIo, concat("model directory '", dir, "' has no config.json"));
  }
  config_ = load_mla_config(config.string());
  // The layer count is not part of one layer's config; load_mla_config has checked the JSON.
  std::ifstream in(config, std::ios::binary);
  const json root_json = json::parse(in, nullptr, false);
  if (root_json.contains("num_hidden_layers") &&
      root_json["num_hidden_layers"].is_number_integer()) {
    num_layers_ = root_json["num_hidden_layers"].get<std::int64_t>();
  }
  if (fs::exists(root / kIndexFile)) {
    weight_map_ = read_weight_map((root / kIndexFile).string());
  } else if (!fs::exists(root / kSingleFile)) {
    throw Error(ErrorCategory::kIo, concat("model directory '", dir, "' has neither ", kIndexFile,
                                           " nor ", kSingleFile));
  }
}

SafetensorsModel::~SafetensorsModel() = default;
SafetensorsModel::SafetensorsModel(SafetensorsModel&&) noexcept = default;
SafetensorsModel& SafetensorsModel::operator=(SafetensorsModel&&) noexcept = default;

const SafetensorsFile& SafetensorsModel::file_of(const std::string& name) const {
  std::string shard = kSingleFile;
  if (!weight_map_.empty()) {
    const auto it = weight_map_.find(name);
    if (it == weight_map_.end()) {
      throw Error(ErrorCategory::kIo, concat("model directory '", dir_, "': ", kIndexFile,
                                             " has no tensor '", name, "'"));
    }
    shard = it->second;
  }
  auto open = shards_.find(shard);
  if (open == shards_.end()) {
    const fs::path path = fs::path(dir_) / shard;
    if (!fs::exists(path)) {
      throw Error(ErrorCategory::kIo, concat("model directory '", dir_, "': shard '", shard,
                                             "' (holding tensor '", name, "') is missing"));
    }
    open = shards_.emplace(shard, std::make_unique<SafetensorsFile>(path.string())).first;
  }
  const SafetensorsFile& file = *open->second;
  if (!weight_map_.empty() && file.find(name) == nullptr) {
    throw Error(ErrorCategory::kIo,
                concat("model directory '", dir_, "': ", kIndexFile, " puts tensor '", name,
                       "' in shard '", shard, "', which does not hold it"));
  }
  return file;
}

std::vector<std::string> SafetensorsModel::open_shards() const {
  std::vector<std::string> names;
  for (const auto& [name, file] : shards_) names.push_back(name);
  return names;
}

MlaWeights load_mla_weights(const SafetensorsModel& model, int layer, MlaTensorParallel tp) {
  if (layer < 0) {
    throw Error(ErrorCategory::kOutOfRange, concat("layer ", layer, " is negative"));
  }
  if (model.num_layers() && layer >= *model.num_layers()) {
    throw Error(ErrorCategory::kOutOfRange,
                concat("model directory '", model.dir(), "': layer ", layer, " is out of range (",
                       *model.num_layers(), " layers in config.json)"));
  }
  MlaWeights full;
  try {
    full = load_mla_weights(
        [&](const std::string& name) -> const SafetensorsFile& { return model.file_of(name); },
        model.config(), layer);
  } catch (const Error& e) {
    // A wrong shape here means the weights and config.json disagree: say where both come from.
    if (e.category() != ErrorCategory::kInvalidArgument) throw;
    throw Error(e.category(),
                concat(e.message(), " (the expected shape follows '", model.dir(),
                       "/config.json': do the config and the weights belong together?)"),
                e.where());
  }
  // Sharded after the checks above, so that a tensor-parallel error is not read as a mismatch.
  if (tp.size == 1 && tp.rank == 0) return full;
  return shard_mla_weights(full, model.config(), tp);
}

}  // namespace fp8mla
