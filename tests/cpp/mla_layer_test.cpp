// MlaLayer::prefill on the CPU (tiny preset) against the float64 reference: the FP8 and BF16
// attention paths (the "cpu" and "cpu-bf16" backends), one-shot and chunked prefix (chunks where
// some sequences have no keys), bf16 and FP8-block weights. Cosine >= 0.999 against the reference
// (0.998 for the FP8 path with FP8-block weights, see LayerAccuracy);
// chunked within 2x the one-shot error; the extend tokens' latent rows written to their slots and
// nothing else; every output element written; clear errors for a bad batch. The fused output
// quantization gives the separate one's bytes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "error_test_util.hpp"
#include "fp8mla/attention_backend.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_layer.hpp"
#include "fp8mla/numerics.hpp"
#include "fp8mla/safetensors.hpp"
#include "mla_layer_test_util.hpp"
#include "model/fp8_gemm_rule.hpp"
#include "model/mla_executor.hpp"

namespace fp8mla {
namespace {

std::vector<std::uint16_t> run(MlaLayer& layer, Fixture& f, const AttentionBackend& backend,
                               const MlaPrefillOptions& o) {
  std::vector<std::uint16_t> out(f.hidden.size(), 0xFFFF);  // NaN poison
  layer.prefill(f.hidden_view(), f.batch, f.cache_view(), backend, o,
                TensorView(out.data(), DType::kBF16, {f.tokens, f.config.hidden}));
  for (std::uint16_t b : out) EXPECT_FALSE(std::isnan(decode_bf16(b)));
  return out;
}

class MlaLayerCpu : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(MlaLayerCpu, PathsAndChunkingMatchTheReference) {
  // Sequences with and without prefixes, a prefix spanning chunks, an empty extension.
  Fixture f({{0, 37}, {130, 20}, {300, 1}, {5, 0}, {17, 9}}, 1);
  const MlaWeights w = generate_mla_weights(f.config, GetParam(), 3);
  const std::vector<std::uint8_t> cache_before = f.cache;
  std::vector<double> ref(f.hidden.size());
  mla_prefill_reference(f.config, w, f.hidden_view(), f.batch, f.cache_view(), 1.0f, ref.data());
  MlaLayer layer(f.config, w);
  LayerAccuracy accuracy(GetParam(), ref);
  // "cpu" has the FP8 hook (the FP8 path); "cpu-bf16" has not (the BF16 path).
  for (const char* name : {"cpu", "cpu-bf16"}) {
    const std::unique_ptr<AttentionBackend> backend = make_attention_backend(name);
    const bool fp8 = backend->capabilities().prepare_prefill_qkv;
    for (std::int64_t capacity : {0, 64, 100, 1000}) {
      SCOPED_TRACE(::testing::Message() << name << " capacity " << capacity);
      f.cache = cache_before;
      const std::vector<std::uint16_t> out = run(layer, f, *backend, prefix_mode(capacity));
      accuracy.check(fp8 ? "fp8" : "bf16", fp8, capacity, out, f, cache_before);
    }
  }
  accuracy.check_paths_agree();
}

// The FP8 path's K-nope and V straight from kv_b's GEMM (fp8_kv_from_projection): within the
// FP8 path's budget against the reference in every prefix mode, the hook given neither, and no
// less accurate than the output with the hook's (K-nope and V rounded once from the f32 sums
// instead of through bf16). With bf16 weights kv_b is no FP8 GEMM and the option changes nothing.
TEST(MlaLayerCpuFp8Weights, KvFromTheProjection) {
  Fixture f({{0, 37}, {130, 20}, {300, 1}, {5, 0}, {17, 9}}, 1);
  const std::vector<std::uint8_t> cache_before = f.cache;
  for (const WeightFormat format : {WeightFormat::kFp8Block, WeightFormat::kBf16}) {
    const MlaWeights w = generate_mla_weights(f.config, format, 3);
    std::vector<double> ref(f.hidden.size());
    mla_prefill_reference(f.config, w, f.hidden_view(), f.batch, f.cache_view(), 1.0f, ref.data());
    MlaLayer layer(f.config, w);
    LayerAccuracy accuracy(format, ref);
    const OutputQuantProbe probe("cpu", true);
    const bool fp8_gemm = format == WeightFormat::kFp8Block;
    for (std::int64_t capacity : {0, 64, 1000}) {
      SCOPED_TRACE(::testing::Message()
                   << (fp8_gemm ? "fp8 block" : "bf16") << " weights, capacity " << capacity);
      MlaPrefillOptions direct = prefix_mode(capacity), hooked = direct;
      direct.fp8_kv_from_projection = true;
      hooked.fp8_kv_from_projection = false;
      probe.hook_calls_with_kv = probe.hook_calls_without_kv = 0;
      f.cache = cache_before;
      const std::vector<std::uint16_t> a = run(layer, f, probe, direct);
      EXPECT_EQ(probe.hook_calls_without_kv, fp8_gemm ? 1 : 0);
      EXPECT_EQ(probe.hook_calls_with_kv, fp8_gemm ? 0 : 1);
      accuracy.check("fp8, K and V from kv_b", true, capacity, a, f, cache_before);
      const std::vector<std::uint8_t> cache_direct = f.cache;
      f.cache = cache_before;
      const std::vector<std::uint16_t> b = run(layer, f, probe, hooked);
      EXPECT_EQ(f.cache, cache_direct);  // the latent rows do not depend on V
      if (!fp8_gemm) {
        EXPECT_EQ(a, b);
        continue;
      }
      // As accurate as the hook's K and V: their difference is e4m3 rounding noise of the same
      // size as each one's error (codes near a rounding boundary flip), not a bias.
      const auto cosine = [&](const std::vector<std::uint16_t>& out) {
        double dot = 0, xx = 0, yy = 0;
        for (std::size_t i = 0; i < out.size(); ++i) {
          const double x = decode_bf16(out[i]);
          dot += x * ref[i];
          xx += x * x;
          yy += ref[i] * ref[i];
        }
        return dot / std::sqrt(xx * yy);
      };
      EXPECT_GE(cosine(a), cosine(b) - 1e-4) << cosine(a) << " vs " << cosine(b);
      EXPECT_NE(a, b);
    }
  }
}

// e4m3 weights whose input dim is not a multiple of 128 (hidden 200, q_lora_rank 96): those
// projections run as bf16 GEMMs on the dequantized weight, in the layer and in the reference.
TEST(MlaLayerCpuFp8Weights, InputDimsNotMultiplesOf128) {
  Fixture f({{0, 20}, {40, 12}}, 5);
  f.config.hidden = 200;
  f.config.q_lora_rank = 96;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  f.hidden.resize(std::size_t(f.tokens * f.config.hidden));
  for (auto& h : f.hidden) h = encode_bf16(normal(rng));
  const MlaWeights w = generate_mla_weights(f.config, WeightFormat::kFp8Block, 4);
  const std::vector<std::uint8_t> cache_before = f.cache;
  std::vector<double> ref(f.hidden.size());
  mla_prefill_reference(f.config, w, f.hidden_view(), f.batch, f.cache_view(), 1.0f, ref.data());
  MlaLayer layer(f.config, w);
  int dequantized = 0;
  for (const std::string& n : layer.projection_notes()) {
    dequantized += n.find("bf16 GEMM on the dequantized e4m3 weight") != std::string::npos;
  }
  EXPECT_EQ(dequantized, 3);  // q_a_proj and kv_a_proj_with_mqa (in 200), q_b_proj (in 96)
  LayerAccuracy accuracy(WeightFormat::kFp8Block, ref);
  for (const char* name : {"cpu", "cpu-bf16"}) {
    SCOPED_TRACE(name);
    f.cache = cache_before;
    const std::unique_ptr<AttentionBackend> backend = make_attention_backend(name);
    const bool fp8 = backend->capabilities().prepare_prefill_qkv;
    accuracy.check(name, fp8, 0, run(layer, f, *backend, prefix_mode(0)), f, cache_before);
  }
}

// The FP8 GEMM rule the CUDA layer shares (model/fp8_gemm_rule.hpp), as the CPU layer says it:
// q_b_proj with in = 384 (not a multiple of 512) runs the FP8 GEMM; with in = 264 it does not.
TEST(MlaLayerCpuFp8Weights, TheFp8GemmRuleDecidesEachProjection) {
  for (const std::int64_t q_lora_rank : {384, 264}) {
    Fixture f({{0, 4}}, 5);
    f.config.q_lora_rank = q_lora_rank;
    const MlaLayer layer(f.config, generate_mla_weights(f.config, WeightFormat::kFp8Block, 4));
    const std::string& q_b = layer.projection_notes()[1];
    EXPECT_NE(q_b.find(concat("q_b_proj [768, ", q_lora_rank, "]: ",
                              q_lora_rank % 128 == 0 ? "fp8 block-scaled GEMM"
                                                     : "bf16 GEMM on the dequantized e4m3 weight")),
              std::string::npos)
        << q_b;
  }
  EXPECT_TRUE(model::fp8_gemm_shape(576, 7168));
  EXPECT_TRUE(model::fp8_gemm_shape(768, 384));
  EXPECT_FALSE(model::fp8_gemm_shape(768, 264));
  EXPECT_FALSE(model::fp8_gemm_shape(260, 512));
}

INSTANTIATE_TEST_SUITE_P(Weights, MlaLayerCpu,
                         ::testing::Values(WeightFormat::kBf16, WeightFormat::kFp8Block),
                         [](const auto& info) {
                           return info.param == WeightFormat::kBf16 ? "bf16" : "fp8_block";
                         });

// One prefill or calibration at a time per layer: a second one entering meanwhile (another
// thread) is an error naming the rule, and the layer is free again once the first returns.
TEST(MlaLayerCpuArgs, OneCallAtATimePerLayer) {
  MlaLayer::Impl impl;
  {
    const OneCallAtATime first(impl, "MlaLayer::prefill");
    test::expect_error([&] { const OneCallAtATime second(impl, "MlaLayer::calibrate"); },
                       ErrorCategory::kInvalidArgument,
                       {"MlaLayer::calibrate: another prefill or calibration of this layer",
                        "give each thread its own MlaLayer"});
  }
  EXPECT_NO_THROW(const OneCallAtATime again(impl, "MlaLayer::prefill"));
}

TEST(MlaLayerCpuArgs, BadBatchAndTensorsAreClearErrors) {
  Fixture f({{4, 3}}, 2);
  MlaLayer layer(f.config, generate_mla_weights(f.config, WeightFormat::kBf16, 1));
  const std::unique_ptr<AttentionBackend> cpu = make_attention_backend("cpu");
  std::vector<std::uint16_t> out(f.hidden.size());
  const TensorView out_view(out.data(), DType::kBF16, {f.tokens, f.config.hidden});
  auto expect_error = [&](auto fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
    }
  };
  MlaBatch bad = f.batch;
  bad.sequences[0].slots.pop_back();
  expect_error([&] { layer.prefill(f.hidden_view(), bad, f.cache_view(), *cpu, {}, out_view); },
               "sequence 0: expected prefix, extend >= 0");
  bad = f.batch;
  bad.sequences[0].extend = 2;
  expect_error([&] { layer.prefill(f.hidden_view(), bad, f.cache_view(), *cpu, {}, out_view); },
               "expected `hidden` contiguous bf16 [2, 512]");
  expect_error(
      [&] {
        layer.prefill(f.hidden_view(), f.batch, f.cache_view(), *cpu, {},
                      TensorView(out.data(), DType::kBF16, {f.tokens, 256}));
      },
      "expected `out` contiguous bf16 [3, 512]");
  std::vector<std::uint16_t> none(1);
  expect_error(
      [&] {
        layer.prefill(TensorView(none.data(), DType::kBF16, {3, 512}, Device::cuda(0)), f.batch,
                      f.cache_view(), *cpu, {}, out_view);
      },
      "expected `hidden` on the layer's device cpu");
}

// Weights read back from a safetensors file (DeepSeek's names) give the layer bit-identical output.
TEST(MlaLayerCpuArgs, WeightsFromSafetensorsGiveTheSameOutput) {
  Fixture f({{40, 12}, {0, 5}}, 4);
  const MlaWeights generated = generate_mla_weights(f.config, WeightFormat::kFp8Block, 9);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("fp8mla_layer_test_" + std::to_string(::getpid()) + ".safetensors"))
                               .string();
  write_safetensors(path, mla_weight_tensors(generated, f.config, 2));
  const std::unique_ptr<AttentionBackend> cpu = make_attention_backend("cpu");
  const std::vector<std::uint8_t> cache_before = f.cache;
  MlaLayer from_memory(f.config, generated);
  const std::vector<std::uint16_t> a = run(from_memory, f, *cpu, {});
  f.cache = cache_before;
  std::vector<std::uint16_t> b;
  {
    const SafetensorsFile file(path);
    MlaLayer from_file(f.config, load_mla_weights(file, f.config, 2));
    b = run(from_file, f, *cpu, {});
  }
  std::filesystem::remove(path);
  EXPECT_EQ(a, b);
}

// The FP8 path's fused output quantization (docs/design.md section 5): the last writer of the
// attention output (the one attention call; with chunks the last chunk's call, which folds it
// into the output, or the last merge with a backend that does not fold) writes o_proj's e4m3
// input and scales. On the CPU both are the standalone quantization of the bf16 output it would
// write (section 6), so the layer output is bit-identical to the separate quantization's, with a
// backend that fuses (option off) and one that cannot, and folding the chunks in their calls
// gives the bytes of merging them after. The plan and the stage times say which ran; the probes
// count the keyed and the folding calls.
TEST(MlaLayerCpuOutputQuant, FusedEqualsSeparateBitForBit) {
  for (const auto& lens : output_quant_batches()) {
    Fixture f(lens, 5);
    const MlaWeights w = generate_mla_weights(f.config, WeightFormat::kFp8Block, 7);
    MlaLayer layer(f.config, w);
    const std::vector<std::uint8_t> cache_before = f.cache;
    const bool prefixes = std::any_of(lens.begin(), lens.end(), [](auto l) { return l.first > 0; });
    const OutputQuantProbe fusing("cpu", true), plain("cpu", false), merging("cpu", true, false);
    for (std::int64_t capacity : {0, 64, 100}) {
      SCOPED_TRACE(::testing::Message() << "batch of " << lens.size() << ", capacity " << capacity);
      const std::int64_t chunks = f.planned_chunks(prefix_mode(capacity));
      EXPECT_EQ(chunks > 0, prefixes && capacity > 0);
      MlaPrefillOptions fused = prefix_mode(capacity), separate = fused;
      separate.fuse_output_quant = false;
      const auto run_timed = [&](const OutputQuantProbe& backend, const MlaPrefillOptions& o,
                                 MlaOutputQuant expected) {
        f.cache = cache_before;
        backend.keyed_calls = backend.folded_calls = 0;
        std::vector<std::uint16_t> out(f.hidden.size(), 0xFFFF);
        MlaStageTimes times;
        layer.prefill(f.hidden_view(), f.batch, f.cache_view(), backend, o,
                      TensorView(out.data(), DType::kBF16, {f.tokens, f.config.hidden}), {},
                      &times);
        const bool folds = backend.capabilities().fold_prior_state && o.fold_chunks;
        EXPECT_EQ(times.output_quant, expected) << to_string(times.output_quant);
        EXPECT_EQ(layer.output_quant_plan(backend, o).mode, expected);
        EXPECT_EQ(backend.keyed_calls,
                  expected == MlaOutputQuant::kFused && (chunks == 0 || folds) ? 1 : 0);
        EXPECT_EQ(backend.folded_calls, folds ? chunks : 0);
        EXPECT_EQ(times.merge == 0.0, folds || chunks == 0) << times.merge;
        return out;
      };
      const std::vector<std::uint16_t> a = run_timed(fusing, fused, MlaOutputQuant::kFused);
      const std::vector<std::uint8_t> cache_fused = f.cache;
      const std::vector<std::uint16_t> b = run_timed(fusing, separate, MlaOutputQuant::kSeparate);
      EXPECT_EQ(f.cache, cache_fused);
      const std::vector<std::uint16_t> c = run_timed(plain, fused, MlaOutputQuant::kSeparate);
      const std::vector<std::uint16_t> d = run_timed(merging, fused, MlaOutputQuant::kFused);
      const std::vector<std::uint16_t> e = run_timed(merging, separate, MlaOutputQuant::kSeparate);
      MlaPrefillOptions unfolded = fused;
      unfolded.fold_chunks = false;  // the A/B switch: merged after each call
      const std::vector<std::uint16_t> g = run_timed(fusing, unfolded, MlaOutputQuant::kFused);
      EXPECT_EQ(a, g);
      EXPECT_EQ(a, b);
      EXPECT_EQ(a, c);
      EXPECT_EQ(a, d);
      EXPECT_EQ(a, e);
      for (std::uint16_t v : a) ASSERT_FALSE(std::isnan(decode_bf16(v)));
      EXPECT_NE(std::count(a.begin(), a.end(), std::uint16_t(0)), std::ptrdiff_t(a.size()));
    }
    EXPECT_NE(layer.output_quant_plan(fusing, {}).note.find("fused fp8_group128"),
              std::string::npos);
    MlaPrefillOptions off;
    off.fuse_output_quant = false;
    EXPECT_NE(layer.output_quant_plan(fusing, off).note.find("fuse_output_quant is off"),
              std::string::npos);
    EXPECT_NE(layer.output_quant_plan(plain, {}).note.find(
                  "attention backend 'cpu (no output quantization)' does not fuse fp8_group128"),
              std::string::npos)
        << layer.output_quant_plan(plain, {}).note;
  }
}

// Only the FP8 path with an FP8 o_proj fuses; a missing key is the capability error.
TEST(MlaLayerCpuOutputQuant, OtherPathsAndTheCapabilityError) {
  Fixture f({{0, 3}}, 2);
  const std::unique_ptr<AttentionBackend> bf16 = make_attention_backend("cpu-bf16");
  const MlaLayer fp8_weights(f.config, generate_mla_weights(f.config, WeightFormat::kFp8Block, 1));
  const MlaOutputQuantPlan bf16_path = fp8_weights.output_quant_plan(*bf16, {});
  EXPECT_EQ(bf16_path.mode, MlaOutputQuant::kSeparate);
  EXPECT_NE(bf16_path.note.find("the BF16 path does not fuse it"), std::string::npos)
      << bf16_path.note;
  const MlaLayer bf16_weights(f.config, generate_mla_weights(f.config, WeightFormat::kBf16, 1));
  const MlaOutputQuantPlan none =
      bf16_weights.output_quant_plan(*make_attention_backend("cpu"), {});
  EXPECT_EQ(none.mode, MlaOutputQuant::kNone);
  EXPECT_NE(none.note.find("o_proj is a bf16 GEMM"), std::string::npos) << none.note;
  BackendCapabilities caps = make_attention_backend("cpu")->capabilities();
  caps.output_quant = {"fp8_static"};
  BackendRequirements required;
  required.output_quant = "fp8_group128";
  try {
    check_backend(caps, required, Device::cpu());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kUnsupported);
    EXPECT_NE(e.message().find("Missing: fused output quantization fp8_group128."),
              std::string::npos)
        << e.message();
  }
}

// A backend that lacks what the layer needs: an error listing required, supported and missing.
TEST(MlaLayerCpuArgs, BackendCapabilitiesAreChecked) {
  BackendCapabilities caps = make_attention_backend("cpu-bf16")->capabilities();
  BackendRequirements required;  // e4m3 attention, the hook and the pack
  required.prepare_prefill_qkv = true;
  required.pack_prefix_chunk_kv = true;
  required.page_size = 256;
  try {
    check_backend(caps, required, Device::cpu());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kUnsupported);
    for (const char* needle : {"attention backend 'cpu-bf16' cannot serve this layer on cpu",
                               "Required: attention dtype e4m3fn",
                               "Supported: attention dtypes bf16", "page sizes 1-128",
                               "Missing: attention dtype e4m3fn, page size 256, "
                               "prepare_prefill_qkv, pack_prefix_chunk_kv."}) {
      EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
    }
  }
  caps.architectures = {"sm_90a"};
  required = {};
  required.attention_dtype = DType::kBF16;
  try {
    check_backend(caps, required, Device::cpu());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("Missing: architecture cpu."), std::string::npos) << e.message();
  }
  EXPECT_NO_THROW(check_backend(make_attention_backend("cpu")->capabilities(), {}, Device::cpu()));
  try {
    make_attention_backend("fa3");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("unknown attention backend 'fa3'; known: cpu, cpu-bf16"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace fp8mla
