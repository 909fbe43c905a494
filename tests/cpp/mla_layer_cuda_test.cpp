// MlaLayer::prefill on cuda:0 against the float64 reference, both paths ("fp8-hopper" with the
// FP8 hook, "bf16-hopper" without), one-shot and chunked prefix, bf16 and FP8-block weights, on
// DeepSeek-V3, DeepSeek-V2-Lite (no query LoRA) and the tiny preset: the same accuracy bounds as
// the CPU layer; the extend rows of the cache written and nothing else; a NaN-poisoned output
// fully written. A shape cuBLASLt's FP8 block scaling declines runs dequantized, and says so.
// The fused output quantization gives the separate one's bytes.
// CUDA calibration equals the CPU's. Workspace, device and slot errors.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>

#include "cuda_test_util.hpp"
#include "error_test_util.hpp"
#include "fp8mla/attention_backend.hpp"
#include "fp8mla/error.hpp"
#include "mla_layer_test_util.hpp"

namespace fp8mla {
namespace {

using test::expect_error;

// Device copies of a fixture's tensors, and a workspace for the batch under both backends (the
// FP8 path with and without fused output quantization, with chunks folded in their attention
// calls or merged after them).
struct DeviceBatch {
  void *hidden = nullptr, *cache = nullptr, *out = nullptr, *workspace = nullptr;
  std::size_t workspace_bytes = 0;
  Fixture& f;

  DeviceBatch(Fixture& fixture, const MlaLayer& layer, const MlaPrefillOptions& o) : f(fixture) {
    const std::unique_ptr<AttentionBackend> fp8 = make_attention_backend("fp8-hopper");
    const std::unique_ptr<AttentionBackend> bf16 = make_attention_backend("bf16-hopper");
    MlaWorkspaceLimits limits{f.tokens, std::int64_t(f.batch.sequences.size()), 0};
    for (const MlaSequence& s : f.batch.sequences) limits.max_prefix_tokens += s.prefix;
    MlaPrefillOptions unfused = o;
    unfused.fuse_output_quant = false;
    const OutputQuantProbe merging("fp8-hopper", true, false);
    workspace_bytes = std::max(
        {layer.workspace_bytes(limits, o, *fp8), layer.workspace_bytes(limits, unfused, *fp8),
         layer.workspace_bytes(limits, o, *bf16), layer.workspace_bytes(limits, o, merging)});
    EXPECT_EQ(cudaMalloc(&hidden, f.hidden.size() * 2), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&cache, f.cache.size()), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&out, f.hidden.size() * 2), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&workspace, workspace_bytes), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(hidden, f.hidden.data(), f.hidden.size() * 2, cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  ~DeviceBatch() {
    for (void* p : {hidden, cache, out, workspace}) cudaFree(p);
  }
  TensorView hidden_view() const {
    return TensorView(hidden, DType::kBF16, {f.tokens, f.config.hidden}, Device::cuda(0));
  }
  TensorView cache_view() const {
    return TensorView(cache, DType::kE4M3, {kPages, kPageSize, kMlaLatentDim}, Device::cuda(0));
  }
  TensorView out_view() const {
    return TensorView(out, DType::kBF16, {f.tokens, f.config.hidden}, Device::cuda(0));
  }
  TensorView workspace_view(std::size_t bytes) const {
    return TensorView(workspace, DType::kE4M3, {std::int64_t(bytes)}, Device::cuda(0));
  }

  // One prefill with the cache reset to the fixture's and the output poisoned with NaN; returns
  // the output and leaves the device cache in f.cache.
  std::vector<std::uint16_t> run(MlaLayer& layer, const AttentionBackend& backend,
                                 const MlaPrefillOptions& o, MlaStageTimes* times = nullptr) {
    EXPECT_EQ(cudaMemcpy(cache, f.cache.data(), f.cache.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    EXPECT_EQ(cudaMemset(out, 0xFF, f.hidden.size() * 2), cudaSuccess);
    layer.prefill(hidden_view(), f.batch, cache_view(), backend, o, out_view(),
                  workspace_view(workspace_bytes), times);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<std::uint16_t> result(f.hidden.size());
    EXPECT_EQ(cudaMemcpy(result.data(), out, result.size() * 2, cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(cudaMemcpy(f.cache.data(), cache, f.cache.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    std::int64_t nan = 0;
    for (std::uint16_t b : result) nan += std::isnan(decode_bf16(b));
    EXPECT_EQ(nan, 0) << "output elements not written (NaN poison left)";
    return result;
  }
};

using Case = std::tuple<const char*, WeightFormat>;
class MlaLayerCuda : public ::testing::TestWithParam<Case> {};

TEST_P(MlaLayerCuda, PathsAndChunkingMatchTheReference) {
  FP8MLA_REQUIRE_HOPPER();
  const auto [preset, format] = GetParam();
  Fixture f({{0, 37}, {130, 20}, {300, 1}, {5, 0}, {17, 9}, {0, 130}}, 1, preset);
  const MlaWeights w = generate_mla_weights(f.config, format, 3);
  const std::vector<std::uint8_t> cache_before = f.cache;
  std::vector<double> ref(f.hidden.size());
  mla_prefill_reference(f.config, w, f.hidden_view(), f.batch, f.cache_view(), 1.0f, ref.data());
  MlaLayer layer(f.config, w, Device::cuda(0));
  for (const std::string& note : layer.projection_notes())
    std::printf("[ layer    ] %s\n", note.c_str());
  // A workspace for both modes: one-shot up to the default 8192 prefix keys, chunks of 64 above.
  MlaPrefillOptions sizing;
  sizing.chunk_capacity = 64;
  DeviceBatch d(f, layer, sizing);
  LayerAccuracy accuracy(format, ref);
  for (const char* name : {"fp8-hopper", "bf16-hopper"}) {
    const std::unique_ptr<AttentionBackend> backend = make_attention_backend(name);
    const bool fp8 = backend->capabilities().prepare_prefill_qkv;
    for (std::int64_t capacity : {0, 64, 1000}) {
      SCOPED_TRACE(::testing::Message() << name << " capacity " << capacity);
      f.cache = cache_before;
      const std::vector<std::uint16_t> out = d.run(layer, *backend, prefix_mode(capacity));
      accuracy.check(std::string(preset) + " " + name, fp8, capacity, out, f, cache_before);
      if (fp8 && format == WeightFormat::kFp8Block) {
        // K-nope and V straight from kv_b's e4m3-output GEMMs (fp8_kv_from_projection), the
        // hook given neither.
        MlaPrefillOptions direct = prefix_mode(capacity);
        direct.fp8_kv_from_projection = true;
        const OutputQuantProbe probe(name, true);
        f.cache = cache_before;
        accuracy.check(std::string(preset) + " " + name + ", K and V from kv_b", true, capacity,
                       d.run(layer, probe, direct), f, cache_before);
        EXPECT_EQ(probe.hook_calls_without_kv, 1);
        EXPECT_EQ(probe.hook_calls_with_kv, 0);
      }
    }
  }
  accuracy.check_paths_agree();

  // The CPU layer on the same inputs: the same model within the same bounds of each other.
  f.cache = cache_before;
  MlaLayer cpu(f.config, w);
  std::vector<std::uint16_t> cpu_out(f.hidden.size());
  cpu.prefill(f.hidden_view(), f.batch, f.cache_view(), *make_attention_backend("cpu-bf16"), {},
              TensorView(cpu_out.data(), DType::kBF16, {f.tokens, f.config.hidden}));
  EXPECT_GE(compare(accuracy.one_shot(false), widen(cpu_out)).cosine, 0.999);
}

INSTANTIATE_TEST_SUITE_P(
    Presets, MlaLayerCuda,
    ::testing::Combine(::testing::Values("deepseek-v3", "deepseek-v2-lite", "tiny"),
                       ::testing::Values(WeightFormat::kBf16, WeightFormat::kFp8Block)),
    [](const auto& info) {
      std::string name = std::get<0>(info.param);
      std::replace(name.begin(), name.end(), '-', '_');
      return name + (std::get<1>(info.param) == WeightFormat::kBf16 ? "_bf16" : "_fp8_block");
    });

// The fused output quantization on the GPU: the attention kernel's epilogue (the one call; with
// chunks the last chunk's call, folding it in, or the last merge with a backend that does not
// fold) writes o_proj's e4m3 input and column-major scales, the bytes the standalone kernel makes
// of the bf16 output it would write (docs/design.md section 6), so the layer output equals the
// separate quantization's bit for bit, with a backend that fuses (option off) and one that
// cannot; and the folding epilogue merges with the merge kernel's arithmetic, so folding the
// chunks equals merging them after their calls, bit for bit. The plan and the stage times say
// which ran; the probes count the keyed and the folding calls.
class MlaLayerCudaOutputQuant : public ::testing::TestWithParam<const char*> {};

TEST_P(MlaLayerCudaOutputQuant, FusedEqualsSeparateBitForBit) {
  FP8MLA_REQUIRE_HOPPER();
  const MlaConfig config = mla_preset(GetParam());
  MlaLayer layer(config, generate_mla_weights(config, WeightFormat::kFp8Block, 7), Device::cuda(0));
  // The comparison means something only with an FP8 o_proj.
  ASSERT_NE(layer.projection_notes().back().find("o_proj"), std::string::npos);
  ASSERT_NE(layer.projection_notes().back().find("fp8 block-scaled GEMM"), std::string::npos)
      << layer.projection_notes().back();
  const OutputQuantProbe fusing("fp8-hopper", true), plain("fp8-hopper", false),
      merging("fp8-hopper", true, false);
  std::printf("[ layer    ] %s\n", layer.output_quant_plan(fusing, {}).note.c_str());
  std::printf("[ layer    ] %s\n", layer.output_quant_plan(plain, {}).note.c_str());
  for (const auto& lens : output_quant_batches()) {
    Fixture f(lens, 5, GetParam());
    MlaPrefillOptions sizing;
    sizing.chunk_capacity = 64;
    DeviceBatch d(f, layer, sizing);
    const std::vector<std::uint8_t> cache_before = f.cache;
    const bool prefixes = std::any_of(lens.begin(), lens.end(), [](auto l) { return l.first > 0; });
    for (std::int64_t capacity : {0, 64, 1000}) {
      SCOPED_TRACE(::testing::Message()
                   << GetParam() << ", batch of " << lens.size() << ", capacity " << capacity);
      const std::int64_t chunks = f.planned_chunks(prefix_mode(capacity));
      EXPECT_EQ(chunks > 0, prefixes && capacity > 0);
      MlaPrefillOptions fused = prefix_mode(capacity), separate = fused;
      separate.fuse_output_quant = false;
      const auto run_timed = [&](const OutputQuantProbe& backend, const MlaPrefillOptions& o,
                                 MlaOutputQuant expected) {
        f.cache = cache_before;
        backend.keyed_calls = backend.folded_calls = 0;
        MlaStageTimes times;
        std::vector<std::uint16_t> out = d.run(layer, backend, o, &times);
        const bool folds = backend.capabilities().fold_prior_state && o.fold_chunks;
        EXPECT_EQ(times.output_quant, expected) << to_string(times.output_quant);
        EXPECT_EQ(layer.output_quant_plan(backend, o).mode, expected);
        EXPECT_EQ(backend.keyed_calls,
                  expected == MlaOutputQuant::kFused && (chunks == 0 || folds) ? 1 : 0);
        EXPECT_EQ(backend.folded_calls, folds ? chunks : 0);
        return out;
      };
      const std::vector<std::uint16_t> s1 = run_timed(fusing, separate, MlaOutputQuant::kSeparate);
      const std::vector<std::uint16_t> s2 = run_timed(fusing, separate, MlaOutputQuant::kSeparate);
      ASSERT_EQ(s1, s2) << "the separate path is not deterministic: no bit-exact comparison";
      const std::vector<std::uint8_t> cache_separate = f.cache;
      const std::vector<std::uint16_t> a = run_timed(fusing, fused, MlaOutputQuant::kFused);
      EXPECT_EQ(f.cache, cache_separate);
      const std::vector<std::uint16_t> c = run_timed(plain, fused, MlaOutputQuant::kSeparate);
      const std::vector<std::uint16_t> m = run_timed(merging, fused, MlaOutputQuant::kFused);
      const std::vector<std::uint16_t> ms = run_timed(merging, separate, MlaOutputQuant::kSeparate);
      MlaPrefillOptions unfolded = fused;
      unfolded.fold_chunks = false;  // the A/B switch: merged after each call
      EXPECT_EQ(run_timed(fusing, unfolded, MlaOutputQuant::kFused), m);
      std::int64_t differ = 0, differ_merged = 0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        differ += a[i] != s1[i];
        differ_merged += m[i] != s1[i];
      }
      EXPECT_EQ(differ, 0) << "of " << a.size() << " output elements differ, fused vs separate";
      EXPECT_EQ(differ_merged, 0) << "of " << a.size()
                                  << " output elements differ, chunks merged after their calls vs "
                                     "folded in them";
      EXPECT_EQ(c, s1);
      EXPECT_EQ(ms, s1);
      EXPECT_NE(std::count(a.begin(), a.end(), std::uint16_t(0)), std::ptrdiff_t(a.size()));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, MlaLayerCudaOutputQuant, ::testing::Values("deepseek-v3", "tiny"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// The layer's FP8 GEMM rule (model/fp8_gemm_rule.hpp) on the GPU: q_b with in = 384 (3 groups of
// 128, not a multiple of 512) runs the FP8 GEMM on padded block scales; with in = 264 (not whole
// groups) cuBLASLt is not asked: that weight is dequantized once and runs as a bf16 GEMM on bf16
// input, as the reference (and the CPU layer) run it. A q_lora_rank the q_a RMSNorm kernel cannot
// read is refused.
TEST(MlaLayerCudaArgs, TheFp8GemmRuleDecidesEachProjectionAndSaysSo) {
  FP8MLA_REQUIRE_HOPPER();
  for (const std::int64_t q_lora_rank : {384, 264}) {
    SCOPED_TRACE(::testing::Message() << "q_lora_rank " << q_lora_rank);
    Fixture f({{0, 37}, {130, 20}, {17, 9}}, 2);
    f.config.q_lora_rank = q_lora_rank;
    const MlaWeights w = generate_mla_weights(f.config, WeightFormat::kFp8Block, 5);
    MlaLayer layer(f.config, w, Device::cuda(0));
    const std::vector<std::string>& notes = layer.projection_notes();
    ASSERT_EQ(notes.size(), 5u);
    const std::string q_b = concat("q_b_proj [768, ", q_lora_rank, "]: ");
    const std::string want = q_lora_rank % 128 == 0
                                 ? q_b + "fp8 block-scaled GEMM"
                                 : q_b + "bf16 GEMM (cuBLASLt), weight dequantized at load";
    EXPECT_NE(notes[1].find(want), std::string::npos) << notes[1];
    EXPECT_NE(notes[0].find("fp8 block-scaled GEMM"), std::string::npos) << notes[0];
    std::vector<double> ref(f.hidden.size());
    mla_prefill_reference(f.config, w, f.hidden_view(), f.batch, f.cache_view(), 1.0f, ref.data());
    DeviceBatch d(f, layer, {});
    for (const char* name : {"fp8-hopper", "bf16-hopper"}) {
      const std::vector<std::uint8_t> cache_before = f.cache;
      const Compare c = compare(d.run(layer, *make_attention_backend(name), {}), ref);
      f.cache = cache_before;
      EXPECT_GE(c.cosine, 0.998) << name;
    }
  }
  Fixture f({{0, 5}}, 2);
  f.config.q_lora_rank = 260;
  const MlaWeights w = generate_mla_weights(f.config, WeightFormat::kFp8Block, 5);
  test::expect_error([&] { MlaLayer(f.config, w, Device::cuda(0)); }, ErrorCategory::kUnsupported,
                     {"q_lora_rank a multiple of 8 and at most 8192", "got 260"});
}

// MlaLayer::calibrate on cuda:0 against the CPU layer's on the same batch: the same steps (bf16
// RoPE bit for bit, the amax exact in any order), the projections through cuBLASLt instead of the
// CPU's f32 sums, so each amax and scale within 2% (a few bf16 steps). A second, smaller batch
// reuses the calibration workspace; the first batch again gives the same bits (deterministic).
TEST(MlaLayerCudaCalibration, EqualsTheCpuCalibration) {
  FP8MLA_REQUIRE_HOPPER();
  for (const char* preset : {"tiny", "deepseek-v3"}) {
    for (const WeightFormat format : {WeightFormat::kBf16, WeightFormat::kFp8Block}) {
      SCOPED_TRACE(::testing::Message()
                   << preset << (format == WeightFormat::kBf16 ? " bf16" : " fp8_block"));
      Fixture f({{0, 37}, {130, 20}, {300, 1}, {5, 0}, {17, 9}}, 6, preset);
      Fixture small({{3, 4}}, 7, preset);
      const MlaWeights w = generate_mla_weights(f.config, format, 3);
      MlaLayer cpu(f.config, w), gpu(f.config, w, Device::cuda(0));
      const auto on_device = [](Fixture& x, void*& at) {
        EXPECT_EQ(cudaMalloc(&at, x.hidden.size() * 2), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(at, x.hidden.data(), x.hidden.size() * 2, cudaMemcpyHostToDevice),
                  cudaSuccess);
        return TensorView(at, DType::kBF16, {x.tokens, x.config.hidden}, Device::cuda(0));
      };
      void *hidden = nullptr, *small_hidden = nullptr;
      const MlaCalibration want = cpu.calibrate(f.hidden_view(), f.batch);
      const MlaCalibration got = gpu.calibrate(on_device(f, hidden), f.batch);
      gpu.calibrate(on_device(small, small_hidden), small.batch);
      const MlaCalibration again = gpu.calibrate(
          TensorView(hidden, DType::kBF16, {f.tokens, f.config.hidden}, Device::cuda(0)), f.batch);
      cudaFree(hidden);
      cudaFree(small_hidden);
      std::printf(
          "[ calib    ] %s amax q/k/v/cache cuda %.5g %.5g %.5g %.5g, cpu %.5g %.5g %.5g %.5g\n",
          preset, got.amax.q, got.amax.k, got.amax.v, got.amax.cache, want.amax.q, want.amax.k,
          want.amax.v, want.amax.cache);
      const float g[] = {got.amax.q,          got.amax.k,          got.amax.v,
                         got.amax.cache,      got.fp8.q_scale_inv, got.fp8.k_scale_inv,
                         got.fp8.v_scale_inv, got.cache_scale_inv};
      const float c[] = {want.amax.q,          want.amax.k,          want.amax.v,
                         want.amax.cache,      want.fp8.q_scale_inv, want.fp8.k_scale_inv,
                         want.fp8.v_scale_inv, want.cache_scale_inv};
      for (int i = 0; i < 8; ++i) {
        EXPECT_GT(c[i], 0.0f);
        EXPECT_NEAR(g[i], c[i], 0.02 * c[i]) << "value " << i << " (amax q/k/v/cache, scales)";
      }
      EXPECT_EQ(again.amax.q, got.amax.q);
      EXPECT_EQ(again.amax.k, got.amax.k);
      EXPECT_EQ(again.amax.v, got.amax.v);
      EXPECT_EQ(again.amax.cache, got.amax.cache);
    }
  }
}

TEST(MlaLayerCudaArgs, WorkspaceAndDevicesAreChecked) {
  FP8MLA_REQUIRE_HOPPER();
  Fixture f({{40, 12}, {0, 5}}, 4);
  MlaLayer layer(f.config, generate_mla_weights(f.config, WeightFormat::kBf16, 9), Device::cuda(0));
  const std::unique_ptr<AttentionBackend> fp8 = make_attention_backend("fp8-hopper");
  DeviceBatch d(f, layer, {});
  expect_error(
      [&] {
        layer.prefill(d.hidden_view(), f.batch, d.cache_view(), *fp8, {}, d.out_view(),
                      d.workspace_view(1024));
      },
      ErrorCategory::kInvalidArgument, {"expected `workspace` 1-d contiguous, >= "});
  expect_error(
      [&] {
        layer.prefill(f.hidden_view(), f.batch, d.cache_view(), *fp8, {}, d.out_view(),
                      d.workspace_view(d.workspace_bytes));
      },
      ErrorCategory::kInvalidArgument, {"expected `hidden` on the layer's device cuda:0"});
  // A CPU backend cannot serve a CUDA layer.
  expect_error(
      [&] {
        layer.prefill(d.hidden_view(), f.batch, d.cache_view(), *make_attention_backend("cpu"), {},
                      d.out_view(), d.workspace_view(d.workspace_bytes));
      },
      ErrorCategory::kUnsupported, {"Missing: architecture sm_90a"});
  MlaBatch bad = f.batch;
  bad.sequences[1].slots[0] = kPages * kPageSize;
  expect_error(
      [&] {
        layer.prefill(d.hidden_view(), bad, d.cache_view(), *fp8, {}, d.out_view(),
                      d.workspace_view(d.workspace_bytes));
      },
      ErrorCategory::kInvalidArgument, {"is outside the cache's"});
}

}  // namespace
}  // namespace fp8mla
