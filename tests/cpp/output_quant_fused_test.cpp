// Fused output quantization on the CPU (docs/design.md section 6): prefill_attention and
// merge_attention_states with a quantized `out` give, bit for bit, the op with a bf16 `out`
// followed by the standalone quantization op, for every key, scale dtype and scale layout. Every
// output and scale buffer is poisoned before the call, twice with different bytes, so that a byte
// the op must write and does not is caught, and guard bands and the bytes past the scale rows
// the op uses (padded scale tensors) must stay as they were.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "buffer_test_util.hpp"
#include "error_test_util.hpp"
#include "fp8mla/attention.hpp"
#include "fp8mla/output_quant.hpp"
#include "output_quant_test_util.hpp"

namespace fp8mla {
namespace {

using test::HostBuffer;
using test::QuantBuffers;
using test::QuantCase;
using test::Rng;

constexpr std::int64_t kHeads = 4, kDim = 128, kWidth = kHeads * kDim;

std::vector<test::QuantCase> quant_cases(std::int64_t t) {
  return test::quant_cases(t, kHeads, kDim);
}

// Runs `fused(out, output_scale, output_block_scale)` and the reference (`bf16` rows, the op's
// unquantized output, through the standalone op) on buffers poisoned alike, and compares them.
void expect_fused_matches(
    const QuantCase& c, const TensorView& bf16,
    const std::function<void(const TensorView&, const TensorView&, const TensorView&)>& fused) {
  SCOPED_TRACE(c.name);
  for (std::uint8_t poison : {std::uint8_t(0xFF), std::uint8_t(0x00)}) {
    QuantBuffers got(c, poison), want(c, poison);
    const TensorView out = c.out.view(got.out.data());
    const auto [scale, block] = test::op_scales(c, got.scale.data(), got.global.data());
    ASSERT_EQ(to_string(detect_output_quant_key(out, scale, block, output_row_width(out))),
              to_string(c.key));
    try {
      fused(out, scale, block);
    } catch (const Error& e) {
      FAIL() << e.what();
    }
    test::run_standalone(c, bf16, want);
    EXPECT_TRUE(test::same_bytes(got.out.payload(), want.out.payload(), "out"));
    EXPECT_TRUE(test::same_bytes(got.scale.payload(), want.scale.payload(), "scales"));
    EXPECT_TRUE(test::same_bytes(got.global.payload(), want.global.payload(), "output_scale"));
    EXPECT_TRUE(got.out.guards_intact() && got.scale.guards_intact());
  }
}

// n values in (-range, range), as bf16 or e4m3 codes.
void fill(HostBuffer& buffer, DType dtype, std::int64_t n, float range, Rng& rng) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = (rng.uniform() * 2.0f - 1.0f) * range;
    if (dtype == DType::kE4M3) {
      buffer.data()[i] = encode_e4m3(x);
    } else {
      test::store_f32(buffer.data(), dtype, i, x);
    }
  }
}

// ---- prefill_attention
// ---------------------------------------------------------------------------

// A ragged causal batch: a sequence after a cached prefix (7 keys), an empty one, one with fewer
// keys than queries (its first rows see no key), queries without keys, and a plain one. bf16, or
// e4m3 with descales.
struct PrefillBatch {
  DType dtype;
  std::vector<std::int32_t> cu_q = {0, 5, 5, 9, 12, 18}, cu_k = {0, 12, 12, 14, 14, 20};
  std::int64_t tq = 18, tk = 20;
  HostBuffer q, k, v;
  float descales[3] = {0.5f, 0.25f, 2.0f};
  explicit PrefillBatch(DType d = DType::kBF16)
      : dtype(d),
        q(std::size_t(tq * kHeads * 192) * dtype_size(d)),
        k(std::size_t(tk * kHeads * 192) * dtype_size(d)),
        v(std::size_t(tk * kHeads * kDim) * dtype_size(d)) {
    Rng rng(7);
    const bool fp8 = dtype == DType::kE4M3;
    fill(q, dtype, tq * kHeads * 192, fp8 ? 2.0f : 1.0f, rng);
    fill(k, dtype, tk * kHeads * 192, fp8 ? 4.0f : 1.0f, rng);
    fill(v, dtype, tk * kHeads * kDim, fp8 ? 2.0f : 4.0f, rng);
  }
  PrefillAttentionArgs args(const TensorView& out) {
    PrefillAttentionArgs a;
    a.q = TensorView(q.data(), dtype, {tq, kHeads, 192});
    a.k = TensorView(k.data(), dtype, {tk, kHeads, 192});
    a.v = TensorView(v.data(), dtype, {tk, kHeads, kDim});
    a.cu_seqlens_q = TensorView(cu_q.data(), DType::kI32, {std::int64_t(cu_q.size())});
    a.cu_seqlens_k = TensorView(cu_k.data(), DType::kI32, {std::int64_t(cu_k.size())});
    a.max_seqlen_q = a.max_seqlen_k = 12;
    a.softmax_scale = 0.0722f;
    if (dtype == DType::kE4M3) {
      a.q_descale = TensorView(&descales[0], DType::kF32, {1});
      a.k_descale = TensorView(&descales[1], DType::kF32, {1});
      a.v_descale = TensorView(&descales[2], DType::kF32, {1});
    }
    a.out = out;
    return a;
  }
};

TEST(FusedOutputQuant, PrefillAttentionEqualsTheStandaloneOps) {
  for (DType dtype : {DType::kBF16, DType::kE4M3}) {
    SCOPED_TRACE(dtype_name(dtype));
    PrefillBatch batch(dtype);
    std::vector<std::uint16_t> bf16(std::size_t(batch.tq * kWidth));
    const TensorView bf16_out(bf16.data(), DType::kBF16, {batch.tq, kHeads, kDim});
    prefill_attention(batch.args(bf16_out));
    const TensorView rows(bf16.data(), DType::kBF16, {batch.tq, kWidth});
    // Rows 5 and 6 (the third sequence's first two) and 9..11 (no keys) see no key: zero rows.
    for (std::int64_t t : {5, 6, 9, 10, 11}) {
      for (std::int64_t i = 0; i < kWidth; ++i) ASSERT_EQ(bf16[t * kWidth + i], 0) << t;
    }
    for (const QuantCase& c : quant_cases(batch.tq)) {
      expect_fused_matches(
          c, rows, [&](const TensorView& out, const TensorView& scale, const TensorView& block) {
            PrefillAttentionArgs a = batch.args(out);
            a.output_scale = scale;
            a.output_block_scale = block;
            prefill_attention(a);
          });
    }
  }
}

TEST(FusedOutputQuant, PrefillAttentionWritesNothingForNoTokens) {
  PrefillBatch batch;
  batch.cu_q = {0, 0};
  batch.cu_k = {0, 0};
  batch.tq = batch.tk = 0;
  for (const QuantCase& c : quant_cases(0)) {
    SCOPED_TRACE(c.name);
    QuantBuffers got(c, test::kPoison), want(c, test::kPoison);
    const auto [scale, block] = test::op_scales(c, got.scale.data(), got.global.data());
    PrefillAttentionArgs a = batch.args(c.out.view(got.out.data()));
    a.output_scale = scale;
    a.output_block_scale = block;
    EXPECT_NO_THROW(prefill_attention(a));
    EXPECT_TRUE(test::same_bytes(got.scale.payload(), want.scale.payload(), "scales"));
  }
}

// ---- merge_attention_states
// ----------------------------------------------------------------------

// States of 18 tokens with empty (-inf) sides: rows where both are empty merge to O = 0.
struct MergeStates {
  DType dtype;
  std::int64_t t = 18;
  HostBuffer o_a, o_b, lse_a{std::size_t(t * kHeads * 4)}, lse_b{std::size_t(t * kHeads * 4)};
  explicit MergeStates(DType d)
      : dtype(d),
        o_a(std::size_t(t * kWidth) * dtype_size(d)),
        o_b(std::size_t(t * kWidth) * dtype_size(d)) {
    Rng rng(11);
    for (HostBuffer* o : {&o_a, &o_b}) {
      for (std::int64_t i = 0; i < t * kWidth; ++i) {
        test::store_f32(o->data(), dtype, i, (rng.uniform() * 2.0f - 1.0f) * 4.0f);
      }
    }
    for (HostBuffer* l : {&lse_a, &lse_b}) {
      for (std::int64_t i = 0; i < t * kHeads; ++i) {
        const float v = rng.below(4) == 0 ? -INFINITY : (rng.uniform() * 2.0f - 1.0f) * 8.0f;
        std::memcpy(l->data() + i * 4, &v, 4);
      }
    }
    // Token 3: both sides empty in every head, so its row is all zeros.
    for (HostBuffer* l : {&lse_a, &lse_b}) {
      for (std::int64_t h = 0; h < kHeads; ++h) {
        const float v = -INFINITY;
        std::memcpy(l->data() + (3 * kHeads + h) * 4, &v, 4);
      }
    }
  }
  TensorView o(HostBuffer& b) { return TensorView(b.data(), dtype, {t, kHeads, kDim}); }
  TensorView lse(HostBuffer& b) { return TensorView(b.data(), DType::kF32, {t, kHeads}); }
};

TEST(FusedOutputQuant, MergeAttentionStatesEqualsTheStandaloneOps) {
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(dtype_name(dtype));
    MergeStates s(dtype);
    HostBuffer merged(std::size_t(s.t * kWidth) * dtype_size(dtype)), lse(std::size_t(s.t * 16));
    merge_attention_states(s.o(s.o_a), s.lse(s.lse_a), s.o(s.o_b), s.lse(s.lse_b), s.o(merged),
                           s.lse(lse));
    // The unquantized intermediate is bf16: f32 states' merged values rounded once.
    std::vector<std::uint16_t> bf16(std::size_t(s.t * kWidth));
    for (std::size_t i = 0; i < bf16.size(); ++i) {
      bf16[i] = encode_bf16(test::load_f32(merged.data(), dtype, std::int64_t(i)));
    }
    const TensorView rows(bf16.data(), DType::kBF16, {s.t, kWidth});
    for (const QuantCase& c : quant_cases(s.t)) {
      HostBuffer out_lse(std::size_t(s.t * kHeads * 4));
      expect_fused_matches(
          c, rows, [&](const TensorView& out, const TensorView& scale, const TensorView& block) {
            merge_attention_states(s.o(s.o_a), s.lse(s.lse_a), s.o(s.o_b), s.lse(s.lse_b), out,
                                   s.lse(out_lse), scale, block);
          });
      EXPECT_TRUE(
          test::same_bytes(out_lse.payload(), lse.payload().first(out_lse.bytes()), "out_lse"));
    }
  }
}

// ---- errors of a keyed `out`
// ---------------------------------------------------------------------

TEST(FusedOutputQuant, QuantizedOutLayoutErrors) {
  PrefillBatch batch;
  HostBuffer out(std::size_t(batch.tq * 1024)), scales(std::size_t(batch.tq * 64)),
      blocks(std::size_t(256 * 64)), one(4);
  const float value = 1.0f;
  std::memcpy(one.data(), &value, 4);
  const TensorView one_view(one.data(), DType::kF32, {1});
  const auto expect = [&](const TensorView& o, const TensorView& scale, const TensorView& block,
                          std::initializer_list<std::string> needles) {
    PrefillAttentionArgs a = batch.args(o);
    a.output_scale = scale;
    a.output_block_scale = block;
    std::vector<std::string> all(needles);
    all.insert(all.begin(), "prefill_attention: ");
    try {
      prefill_attention(a);
      ADD_FAILURE() << "expected an fp8mla::Error";
    } catch (const Error& e) {
      EXPECT_EQ(e.category(), ErrorCategory::kInvalidArgument) << e.what();
      for (const std::string& n : all)
        EXPECT_NE(e.message().find(n), std::string::npos) << e.what();
    }
  };
  const std::int64_t t = batch.tq;
  // Heads apart (head stride 256): the o_proj input's rows must be contiguous.
  expect(TensorView(out.data(), DType::kE4M3, {t, kHeads, kDim}, {1024, 256, 1}), one_view, {},
         {"a quantized output needs the values of a token contiguous (head stride 128"});
  // 3 heads for the batch's 4.
  expect(TensorView(out.data(), DType::kE4M3, {t, 384}), one_view, {},
         {"`out`: expected [18, 4, 128] or [18, 512]", "got e4m3fn[18, 384]"});
  // Rows that overlap.
  expect(TensorView(out.data(), DType::kE4M3, {t, kWidth}, {256, 1}), one_view, {},
         {"`out`: expected a token stride that keeps the rows of 512 elements apart"});
  // Group scales whose rows overlap their columns.
  expect(TensorView(out.data(), DType::kE4M3, {t, kWidth}), {},
         TensorView(scales.data(), DType::kF32, {t, 4}, {1, 1}),
         {"`output_block_scale`: expected strides that keep every scale apart"});
  // NVFP4 scales of the padded width (80 values: 5 blocks, 8 padded) but not a whole number of
  // 128-row tiles: neither layout. A merge of 1 head of 80 (fake views: no data is read).
  const TensorView o = test::fake(DType::kBF16, {t, 1, 80}), l = test::fake(DType::kF32, {t, 1});
  test::expect_error(
      [&] {
        merge_attention_states(o, l, o, l, test::fake(DType::kE2M1x2, {t, 40}), l, one_view,
                               test::fake(DType::kE4M3, {t, 8}));
      },
      ErrorCategory::kInvalidArgument,
      {"merge_attention_states: `output_block_scale`: 128x4 swizzled block scales [R, 8] need R a "
       "multiple of 128"});
}

// The sanitizer runs' subset (FP8MLA_QUANT_CASES=keys, set by scripts/sanitize.sh for racecheck
// and synccheck): the first case of each key, every key once; without it, every case.
TEST(FusedOutputQuant, SanitizerSubsetWalksTheFirstCaseOfEachKey) {
  const std::vector<QuantCase> all = quant_cases(300);
  ASSERT_EQ(::unsetenv("FP8MLA_QUANT_CASES"), 0);
  EXPECT_EQ(test::walked(quant_cases(300)).size(), all.size());
  ASSERT_EQ(::setenv("FP8MLA_QUANT_CASES", "keys", 1), 0);
  const std::vector<QuantCase> some = test::walked(quant_cases(300));
  ASSERT_EQ(::unsetenv("FP8MLA_QUANT_CASES"), 0);
  std::vector<std::string> want;  // the first case of each key, in order
  std::vector<OutputQuantKey> seen;
  for (const QuantCase& c : all) {
    if (std::find(seen.begin(), seen.end(), c.key) != seen.end()) continue;
    seen.push_back(c.key);
    want.push_back(c.name);
  }
  ASSERT_EQ(seen.size(), 4u);  // static, group 128, group 64, NVFP4
  std::vector<std::string> got;
  for (const QuantCase& c : some) got.push_back(c.name);
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace fp8mla
