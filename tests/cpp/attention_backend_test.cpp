// What the attention backends declare (fp8mla/attention_backend.hpp): the CPU ones a fixed set,
// the Hopper ones the dtypes and head dims of the compiled kernel variants and the architecture
// they were built for, so a build without CUDA has a name for them and nothing they can serve.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "error_test_util.hpp"
#include "fp8mla/attention_backend.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/kernel_registry.hpp"
#include "fp8mla/mla_prep.hpp"
#include "fp8mla/numerics.hpp"

namespace fp8mla {
namespace {

using HeadDims = std::vector<std::pair<int, int>>;

const std::vector<std::string> kFusedKeys = {"fp8_static", "fp8_group128", "fp8_group64", "nvfp4"};

TEST(AttentionBackends, CpuBackendsDeclareTheCpuAttention) {
  EXPECT_EQ(attention_backend_names(),
            (std::vector<std::string>{"cpu", "cpu-bf16", "fp8-hopper", "bf16-hopper"}));
  const HeadDims cpu_dims = {{192, 128}, {128, 128}, {64, 64}, {128, 64}};
  const BackendCapabilities cpu = make_attention_backend("cpu")->capabilities();
  EXPECT_EQ(cpu.attention_dtypes, (std::vector{DType::kE4M3, DType::kBF16}));
  EXPECT_EQ(cpu.head_dims, cpu_dims);
  EXPECT_EQ(cpu.architectures, std::vector<std::string>{"cpu"});
  EXPECT_TRUE(cpu.prepare_prefill_qkv && cpu.pack_prefix_chunk_kv);
  EXPECT_EQ(cpu.v_layout, VLayout::kTokenMajor);
  const BackendCapabilities bf16 = make_attention_backend("cpu-bf16")->capabilities();
  EXPECT_EQ(bf16.attention_dtypes, std::vector{DType::kBF16});
  EXPECT_EQ(bf16.head_dims, cpu_dims);
  EXPECT_FALSE(bf16.prepare_prefill_qkv || bf16.pack_prefix_chunk_kv);
  // The CPU attention fuses every output quantization key.
  EXPECT_EQ(cpu.output_quant, kFusedKeys);
  EXPECT_EQ(bf16.output_quant, kFusedKeys);
}

TEST(AttentionBackends, HopperBackendsDeclareTheCompiledVariants) {
  const BackendCapabilities fp8 = make_attention_backend("fp8-hopper")->capabilities();
  const BackendCapabilities bf16 = make_attention_backend("bf16-hopper")->capabilities();
  EXPECT_TRUE(fp8.prepare_prefill_qkv && fp8.pack_prefix_chunk_kv);
  EXPECT_EQ(fp8.v_layout, VLayout::kTransposed);
  EXPECT_FALSE(bf16.prepare_prefill_qkv || bf16.pack_prefix_chunk_kv);
#if defined(FP8MLA_WITH_CUDA)
  EXPECT_EQ(fp8.attention_dtypes, (std::vector{DType::kE4M3, DType::kBF16}));
  EXPECT_EQ(bf16.attention_dtypes, std::vector{DType::kBF16});
  for (const BackendCapabilities* caps : {&fp8, &bf16}) {
    EXPECT_EQ(caps->head_dims, (HeadDims{{192, 128}})) << caps->name;
    EXPECT_EQ(caps->architectures, std::vector<std::string>{"sm_90a"}) << caps->name;
    EXPECT_EQ(caps->output_quant, kFusedKeys) << caps->name;  // the epilogue fuses every key
  }
#else
  for (const BackendCapabilities* caps : {&fp8, &bf16}) {
    EXPECT_TRUE(caps->attention_dtypes.empty() && caps->head_dims.empty() &&
                caps->architectures.empty() && caps->output_quant.empty())
        << caps->name;
  }
  test::expect_error([&] { check_backend(fp8, {}, Device::cuda(0)); }, ErrorCategory::kUnsupported,
                     {"Supported: attention dtypes none, head dims none,", "architectures none.",
                      "Missing: attention dtype e4m3fn, head dims 192/128, architecture "});
#endif
}

// With V and v_out left empty the hook does Q, K and the cache write alone, byte for byte as with
// them (the layer's FP8 path, whose kv_b GEMM writes V in e4m3 itself).
TEST(AttentionBackends, HookWithoutVDoesQAndKAlone) {
  constexpr std::int64_t T = 3, H = 2;
  std::vector<std::uint16_t> q(T * H * 192), k_nope(T * H * 128), k_pe(T * 64), kv_c(T * 512),
      v(T * H * 128);
  std::uint32_t state = 1;
  for (auto* data : {&q, &k_nope, &k_pe, &kv_c, &v}) {
    for (auto& x : *data) {
      state = state * 1664525u + 1013904223u;
      x = encode_bf16(float(int(state >> 20) - 2048) / 1024.0f);
    }
  }
  std::vector<float> cos_sin(16 * 64);
  make_cos_sin_cache(TensorView(cos_sin.data(), DType::kF32, {16, 64}), RopeConfig{});
  const std::vector<std::int64_t> positions = {3, 0, 9}, slots = {5, 1, 6};
  struct Outputs {
    std::vector<std::uint8_t> q, k, k_rope, cache, v;
  };
  const auto run = [&](bool with_v) {
    Outputs o{std::vector<std::uint8_t>(T * H * 192, 0xAB),
              std::vector<std::uint8_t>(T * H * 128, 0xAB), std::vector<std::uint8_t>(T * 64, 0xAB),
              std::vector<std::uint8_t>(8 * 576, 0xAB),
              std::vector<std::uint8_t>(T * H * 128, 0xAB)};
    PrepareQkvArgs a;
    MlaRopeQuantizeArgs& r = a.qk;
    r.q_nope = TensorView(q.data(), DType::kBF16, {T, H, 128}, {H * 192, 192, 1});
    r.q_pe = TensorView(q.data() + 128, DType::kBF16, {T, H, 64}, {H * 192, 192, 1});
    r.k_nope = TensorView(k_nope.data(), DType::kBF16, {T, H, 128});
    r.k_pe = TensorView(k_pe.data(), DType::kBF16, {T, 64});
    r.positions = TensorView(const_cast<std::int64_t*>(positions.data()), DType::kI64, {T});
    r.cos_sin = TensorView(cos_sin.data(), DType::kF32, {16, 64});
    r.q_scale_inv = 0.5f;
    r.k_scale_inv = 2.0f;
    r.q_out = TensorView(o.q.data(), DType::kE4M3, {T, H, 192});
    r.k_out = TensorView(o.k.data(), DType::kE4M3, {T, H, 128});
    r.k_rope_out = TensorView(o.k_rope.data(), DType::kE4M3, {T, 64});
    r.cache_write =
        LatentCacheWrite{TensorView(o.cache.data(), DType::kE4M3, {2, 4, 576}),
                         TensorView(const_cast<std::int64_t*>(slots.data()), DType::kI64, {T}),
                         0.25f,
                         {}};
    r.kv_c = TensorView(kv_c.data(), DType::kBF16, {T, 512});
    if (with_v) {
      a.v = TensorView(v.data(), DType::kBF16, {T, H, 128});
      a.v_out = TensorView(o.v.data(), DType::kE4M3, {T, H, 128});
    }
    make_attention_backend("cpu")->prepare_prefill_qkv(a);
    return o;
  };
  const Outputs with_v = run(true), without_v = run(false);
  EXPECT_EQ(with_v.q, without_v.q);
  EXPECT_EQ(with_v.k, without_v.k);
  EXPECT_EQ(with_v.k_rope, without_v.k_rope);
  EXPECT_EQ(with_v.cache, without_v.cache);
  EXPECT_NE(with_v.v, std::vector<std::uint8_t>(T * H * 128, 0xAB));  // the hook did write V
  EXPECT_EQ(without_v.v, std::vector<std::uint8_t>(T * H * 128, 0xAB));
}

}  // namespace
}  // namespace fp8mla
