// MLA configs and weights (docs/design.md section 5): the presets' values, safetensors files
// written and read back byte for byte, DeepSeek's per-layer names for bf16 and
// FP8-with-block-scales weights, and clear errors for missing tensors, wrong shapes or dtypes,
// mixed formats, truncated or malformed files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "error_test_util.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_config.hpp"
#include "fp8mla/mla_weights.hpp"
#include "fp8mla/numerics.hpp"
#include "fp8mla/safetensors.hpp"
#include "model/prefix_chunks.hpp"

namespace fp8mla {
namespace {

namespace fs = std::filesystem;

// A file path in the test's temporary folder, removed with it.
class TempDir {
 public:
  TempDir()
      : path_(fs::temp_directory_path() / ("fp8mla_model_test_" + std::to_string(::getpid()))) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

using test::expect_error;

std::vector<std::uint8_t> bytes_of(const TensorView& v) {
  const auto* p = static_cast<const std::uint8_t*>(v.data());
  return {p, p + v.numel() * dtype_size(v.dtype())};
}

TEST(MlaConfig, PresetsHoldDeepSeeksValues) {
  const MlaConfig v3 = mla_preset("deepseek-v3");
  EXPECT_EQ(v3.hidden, 7168);
  EXPECT_EQ(v3.heads, 128);
  EXPECT_EQ(v3.q_lora_rank, 1536);
  EXPECT_EQ(v3.kv_lora_rank, 512);
  ASSERT_TRUE(v3.rope.yarn.has_value());
  EXPECT_EQ(v3.rope.yarn->factor, 40.0);
  EXPECT_EQ(v3.rope.yarn->mscale_all_dim, 1.0);
  // mscale = 0.1 * ln(40) + 1; scale = mscale^2 / sqrt(192).
  const double mscale = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(v3.softmax_scale(), mscale * mscale / std::sqrt(192.0), 1e-12);
  const MlaConfig lite = mla_preset("deepseek-v2-lite");
  EXPECT_EQ(lite.hidden, 2048);
  EXPECT_EQ(lite.heads, 16);
  EXPECT_EQ(lite.q_lora_rank, 0);
  EXPECT_EQ(mla_preset("deepseek-v2").hidden, 5120);
  EXPECT_EQ(mla_preset("tiny").heads, 4);
  EXPECT_EQ(v3.q_width(), 128 * 192);
  EXPECT_EQ(v3.kv_b_width(), 128 * 256);
  expect_error([] { mla_preset("deepseek-v4"); }, ErrorCategory::kInvalidArgument,
               {"unknown MLA preset 'deepseek-v4'", "deepseek-v2-lite", "tiny"});
}

TEST(Safetensors, WriteAndReadBack) {
  TempDir dir;
  std::vector<std::uint16_t> a(6);
  for (int i = 0; i < 6; ++i) a[i] = encode_bf16(float(i) - 2.5f);
  std::vector<float> b = {1.0f, -2.0f, 3.5f};
  std::vector<std::uint8_t> c = {0x38, 0x40, 0xB8, 0x7E};
  const std::vector<std::pair<std::string, TensorView>> tensors = {
      {"a", TensorView(a.data(), DType::kBF16, {2, 3})},
      {"b", TensorView(b.data(), DType::kF32, {3})},
      {"c.weight", TensorView(c.data(), DType::kE4M3, {2, 2})}};
  const std::string path = dir.file("t.safetensors");
  write_safetensors(path, tensors);
  const SafetensorsFile file(path);
  ASSERT_EQ(file.tensors().size(), 3u);
  for (const auto& [name, view] : tensors) {
    const SafetensorsTensor& t = file.at(name);
    EXPECT_EQ(t.dtype, view.dtype());
    EXPECT_EQ(bytes_of(t.view()), bytes_of(view)) << name;
  }
  EXPECT_EQ(file.at("a").shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(file.find("missing"), nullptr);
  expect_error([&] { file.at("missing"); }, ErrorCategory::kIo, {"has no tensor 'missing'", path});
}

// A file with `header` as its JSON header and `data_bytes` zero bytes after it.
void write_raw(const std::string& path, const std::string& header, std::size_t data_bytes,
               std::uint64_t header_length_override = 0) {
  std::ofstream out(path, std::ios::binary);
  const std::uint64_t n = header_length_override ? header_length_override : header.size();
  for (int i = 0; i < 8; ++i) out.put(char((n >> (8 * i)) & 0xFF));
  out << header;
  out << std::string(data_bytes, '\0');
}

TEST(Safetensors, MalformedFilesAreClearErrors) {
  TempDir dir;
  const std::string p = dir.file("bad.safetensors");
  auto open = [&] { SafetensorsFile f(p); };
  expect_error([&] { SafetensorsFile f(dir.file("absent.safetensors")); }, ErrorCategory::kIo,
               {"cannot open"});
  write_raw(p, "{}", 0, 1000);
  expect_error(open, ErrorCategory::kIo, {"header length 1000 does not fit"});
  write_raw(p, "{not json", 0);
  expect_error(open, ErrorCategory::kIo, {"not valid JSON"});
  write_raw(p, R"({"w": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", 8);
  expect_error(open, ErrorCategory::kIo, {"tensor 'w'", "unsupported dtype 'F64'"});
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 8);
  expect_error(open, ErrorCategory::kIo, {"hold 4 bytes, the shape and dtype need 8"});
  // Truncated: the header promises more data than the file has.
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 10);
  expect_error(open, ErrorCategory::kIo, {"truncated"});
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4);
  expect_error(open, ErrorCategory::kIo, {"not a size"});
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [1]}})", 4);
  expect_error(open, ErrorCategory::kIo, {"dtype, shape and data_offsets"});
  // Metadata is allowed.
  write_raw(
      p,
      R"({"__metadata__": {"format": "pt"}, "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
      4);
  EXPECT_NO_THROW(open());
}

class MlaWeightsFormats : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(MlaWeightsFormats, GeneratedWeightsRoundTripThroughDeepSeekNames) {
  TempDir dir;
  for (const char* preset : {"tiny", "deepseek-v2-lite"}) {
    SCOPED_TRACE(preset);
    const MlaConfig config = mla_preset(preset);
    const MlaWeights w = generate_mla_weights(config, GetParam(), 7);
    const std::string path = dir.file("layer.safetensors");
    write_safetensors(path, mla_weight_tensors(w, config, 3));
    const SafetensorsFile file(path);
    EXPECT_NE(file.find("model.layers.3.self_attn.kv_b_proj.weight"), nullptr);
    EXPECT_EQ(file.find("model.layers.3.self_attn.q_a_proj.weight") != nullptr,
              config.q_lora_rank > 0);
    const MlaWeights loaded = load_mla_weights(file, config, 3);
    EXPECT_EQ(loaded.format, GetParam());
    const auto expected = mla_weight_tensors(w, config, 3);
    const auto got = mla_weight_tensors(loaded, config, 3);
    ASSERT_EQ(got.size(), expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].first, expected[i].first);
      EXPECT_EQ(bytes_of(got[i].second), bytes_of(expected[i].second)) << got[i].first;
    }
    expect_error([&] { load_mla_weights(file, config, 4); }, ErrorCategory::kIo,
                 {"has no tensor 'model.layers.4.self_attn."});
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, MlaWeightsFormats,
                         ::testing::Values(WeightFormat::kBf16, WeightFormat::kFp8Block),
                         [](const auto& info) {
                           return info.param == WeightFormat::kBf16 ? "bf16" : "fp8_block";
                         });

TEST(MlaWeights, Fp8BlocksDequantizeToTheGeneratedValues) {
  const MlaConfig config = mla_preset("tiny");
  const MlaWeights bf = generate_mla_weights(config, WeightFormat::kBf16, 11);
  const MlaWeights f8 = generate_mla_weights(config, WeightFormat::kFp8Block, 11);
  // Same seed, same values: e4m3 * block scale is within one e4m3 rounding (2^-4 relative of the
  // block max) of the bf16 weight.
  const TensorView a = bf.kv_b_proj.weight, q = f8.kv_b_proj.weight, s = f8.kv_b_proj.scale_inv;
  ASSERT_EQ(s.size(0), (config.kv_b_width() + 127) / 128);
  ASSERT_EQ(s.size(1), 4);
  double worst = 0.0;
  for (std::int64_t r = 0; r < a.size(0); ++r) {
    for (std::int64_t c = 0; c < a.size(1); ++c) {
      const float scale = s.data_as<float>()[(r / 128) * s.size(1) + c / 128];
      const float w8 = decode_e4m3(q.data_as<std::uint8_t>()[r * a.size(1) + c]) * scale;
      const float w16 = decode_bf16(a.data_as<std::uint16_t>()[r * a.size(1) + c]);
      worst = std::max(worst, double(std::fabs(w8 - w16)) / (448.0 * scale));
    }
  }
  EXPECT_LE(worst, 1.0 / 16 + 1.0 / 256);
}

TEST(MlaWeights, WrongShapeDtypeOrMixedFormatsAreClearErrors) {
  TempDir dir;
  const MlaConfig config = mla_preset("tiny");
  const std::string path = dir.file("w.safetensors");
  MlaWeights w = generate_mla_weights(config, WeightFormat::kBf16, 1);
  // o_proj with half its input columns.
  auto tensors = mla_weight_tensors(w, config, 0);
  for (auto& [name, view] : tensors) {
    if (name.ends_with("o_proj.weight")) {
      view = TensorView(view.data(), view.dtype(), {view.size(0), view.size(1) / 2});
    }
  }
  write_safetensors(path, tensors);
  expect_error([&] { load_mla_weights(SafetensorsFile(path), config, 0); },
               ErrorCategory::kInvalidArgument,
               {"o_proj.weight", "expected bf16 or e4m3fn [512, 512], got bf16 [512, 256]"});
  // An f32 norm.
  tensors = mla_weight_tensors(w, config, 0);
  std::vector<float> norm(std::size_t(config.kv_lora_rank), 1.0f);
  for (auto& [name, view] : tensors) {
    if (name.ends_with("kv_a_layernorm.weight")) {
      view = TensorView(norm.data(), DType::kF32, {config.kv_lora_rank});
    }
  }
  write_safetensors(path, tensors);
  expect_error([&] { load_mla_weights(SafetensorsFile(path), config, 0); },
               ErrorCategory::kInvalidArgument, {"kv_a_layernorm.weight", "expected bf16", "f32"});
  // One e4m3 projection among bf16 ones.
  const MlaWeights f8 = generate_mla_weights(config, WeightFormat::kFp8Block, 1);
  tensors = mla_weight_tensors(w, config, 0);
  for (auto& [name, view] : tensors) {
    if (name.ends_with("kv_b_proj.weight")) view = f8.kv_b_proj.weight;
  }
  write_safetensors(path, tensors);
  expect_error([&] { load_mla_weights(SafetensorsFile(path), config, 0); },
               ErrorCategory::kInvalidArgument, {"kv_b_proj.weight", "one format"});
  // An e4m3 projection without its scales.
  tensors = mla_weight_tensors(f8, config, 0);
  std::erase_if(tensors,
                [](const auto& t) { return t.first.ends_with("o_proj.weight_scale_inv"); });
  write_safetensors(path, tensors);
  expect_error([&] { load_mla_weights(SafetensorsFile(path), config, 0); }, ErrorCategory::kIo,
               {"o_proj.weight_scale_inv"});
  // A truncated file.
  write_safetensors(path, mla_weight_tensors(w, config, 0));
  fs::resize_file(path, fs::file_size(path) - 100);
  expect_error([&] { SafetensorsFile f(path); }, ErrorCategory::kIo, {"truncated"});
}

// ---- Chunked prefix plan ----------------------------------------------------------------------

// Every prefix token in exactly one chunk, in order; chunks full but the last; no chunk over the
// capacity; sequences without keys in a chunk have an empty run. `chunks` holds an earlier plan,
// which planning reuses: the result must equal a plan into a fresh vector.
void expect_plan(const std::vector<std::int64_t>& lens, std::int64_t capacity,
                 std::vector<PrefixChunk>& chunks) {
  SCOPED_TRACE(::testing::Message() << "capacity " << capacity);
  plan_prefix_chunks(lens, capacity, chunks);
  std::vector<PrefixChunk> fresh;
  plan_prefix_chunks(lens, capacity, fresh);
  ASSERT_EQ(chunks.size(), fresh.size());
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    EXPECT_EQ(chunks[c].cu_seqlens_k, fresh[c].cu_seqlens_k);
    EXPECT_EQ(chunks[c].first_token, fresh[c].first_token);
    EXPECT_EQ(chunks[c].max_seqlen_k, fresh[c].max_seqlen_k);
  }
  std::int64_t total = 0;
  for (std::int64_t n : lens) total += n;
  ASSERT_EQ(std::int64_t(chunks.size()), (total + capacity - 1) / capacity);
  std::vector<std::int64_t> next(lens.size(), 0);  // per sequence: next token expected
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    const PrefixChunk& chunk = chunks[c];
    ASSERT_EQ(chunk.cu_seqlens_k.size(), lens.size() + 1);
    EXPECT_EQ(chunk.cu_seqlens_k[0], 0);
    EXPECT_LE(chunk.keys(), capacity);
    if (c + 1 < chunks.size()) EXPECT_EQ(chunk.keys(), capacity);
    std::int32_t longest = 0;
    for (std::size_t b = 0; b < lens.size(); ++b) {
      const std::int32_t n = chunk.cu_seqlens_k[b + 1] - chunk.cu_seqlens_k[b];
      ASSERT_GE(n, 0);
      longest = std::max(longest, n);
      if (n == 0) continue;
      EXPECT_EQ(chunk.first_token[b], next[b]) << "sequence " << b << " chunk " << c;
      next[b] += n;
    }
    EXPECT_EQ(chunk.max_seqlen_k, longest);
  }
  for (std::size_t b = 0; b < lens.size(); ++b) EXPECT_EQ(next[b], lens[b]) << "sequence " << b;
}

TEST(PrefixChunks, CoverEveryTokenOnceWithinCapacity) {
  const std::vector<std::int64_t> lens = {0, 5, 1000, 0, 1, 4096, 0};
  std::vector<PrefixChunk> chunks;  // one vector through every plan, as a layer reuses it
  for (std::int64_t capacity : {1, 3, 64, 999, 1000, 1001, 5102, 100000})
    expect_plan(lens, capacity, chunks);
  expect_plan({0, 0}, 16, chunks);
  expect_plan({}, 16, chunks);
  expect_plan({7}, 7, chunks);
  // A chunk where the first sequences have no keys: the 1000-token prefix ends mid-chunk.
  plan_prefix_chunks(lens, 600, chunks);
  EXPECT_EQ(chunks[1].cu_seqlens_k[1], 0);  // sequences 0 and 1 have nothing in chunk 1
  EXPECT_EQ(chunks[1].cu_seqlens_k[2], 0);
  EXPECT_EQ(chunks[1].first_token[2], 595);
}

TEST(PrefixChunks, BadArgumentsAreClearErrors) {
  const std::vector<std::int64_t> lens = {3, -1};
  std::vector<PrefixChunk> chunks;
  expect_error([&] { plan_prefix_chunks(lens, 8, chunks); }, ErrorCategory::kInvalidArgument,
               {"prefix length of sequence 1 is -1"});
  const std::vector<std::int64_t> ok = {3};
  expect_error([&] { plan_prefix_chunks(ok, 0, chunks); }, ErrorCategory::kInvalidArgument,
               {"expected a capacity in [1, 2^31 - 1], got 0"});
}

}  // namespace
}  // namespace fp8mla
