// A batch padded past its tokens on the CPU (docs/design.md section 6, CUDA-graph padding): the
// tensors sized for T tokens, cu_seqlens_q ending at n < T (prefill_attention) or num_tokens = n
// (merge_attention_states). The call writes the n real rows exactly as the same call without
// padding writes them, quantized or not, and nothing of rows n .. T (out, lse, scale rows: their
// poison stays); the swizzled NVFP4 padding rows are T .. round_up(T, 128), zeros.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "buffer_test_util.hpp"
#include "error_test_util.hpp"
#include "fp8mla/attention.hpp"
#include "output_quant_test_util.hpp"

namespace fp8mla {
namespace {

using test::HostBuffer;
using test::QuantBuffers;
using test::QuantCase;

constexpr std::int64_t kHeads = 4, kDim = 128, kWidth = kHeads * kDim;

// `count` values in (-range, range) as `dtype` codes (e4m3, bf16 or f32).
HostBuffer random_values(DType dtype, std::int64_t count, float range, test::Rng& rng) {
  HostBuffer b(std::size_t(count) * dtype_size(dtype));
  for (std::int64_t i = 0; i < count; ++i) {
    const float x = (rng.uniform() * 2.0f - 1.0f) * range;
    if (dtype == DType::kE4M3) {
      b.data()[i] = encode_e4m3(x);
    } else {
      test::store_f32(b.data(), dtype, i, x);
    }
  }
  return b;
}

// The fused call on buffers sized for `rows` tokens against the standalone op over the `real`
// rows of the unpadded call's bf16 output, the padded rows' poison kept.
void expect_padded_fused(
    const QuantCase& c, const TensorView& bf16, std::int64_t rows,
    const std::function<void(const TensorView&, const TensorView&, const TensorView&)>& fused) {
  SCOPED_TRACE(c.name);
  for (std::uint8_t poison : {std::uint8_t(0xFF), std::uint8_t(0x00)}) {
    QuantBuffers got(c, poison), want(c, poison);
    const auto [scale, block] = test::op_scales(c, got.scale.data(), got.global.data());
    try {
      fused(c.out.view(got.out.data()), scale, block);
    } catch (const Error& e) {
      FAIL() << e.what();
    }
    test::run_standalone(c, bf16, want);
    test::pad_swizzled(c, want, bf16.size(0), rows, kWidth, poison);
    EXPECT_TRUE(test::same_bytes(got.out.payload(), want.out.payload(), "out"));
    EXPECT_TRUE(test::same_bytes(got.scale.payload(), want.scale.payload(), "scales"));
    EXPECT_TRUE(got.out.guards_intact() && got.scale.guards_intact());
  }
}

// ---- prefill_attention
// ---------------------------------------------------------------------------

// A causal batch of three sequences (one after a cached prefix, one empty) in tensors of
// `rows` >= 14 query and 24 key rows; only the first 14 queries and 18 keys are real.
struct PaddedBatch {
  DType dtype;
  std::int64_t rows, key_rows = 24;
  std::vector<std::int32_t> cu_q = {0, 6, 6, 14}, cu_k = {0, 10, 10, 18};
  HostBuffer q, k, v;
  float descales[3] = {0.5f, 0.25f, 2.0f};
  PaddedBatch(DType d, std::int64_t padded_rows, test::Rng rng = test::Rng(5))
      : dtype(d),
        rows(padded_rows),
        q(random_values(d, rows * kHeads * 192, 2.0f, rng)),
        k(random_values(d, key_rows * kHeads * 192, 2.0f, rng)),
        v(random_values(d, key_rows * kHeads * kDim, 2.0f, rng)) {}
  std::int64_t real() const { return cu_q.back(); }
  // The call over the first `tq` query rows (the real ones, or all `rows`).
  PrefillAttentionArgs args(std::int64_t tq, const TensorView& out, const TensorView& lse) {
    PrefillAttentionArgs a;
    a.q = TensorView(q.data(), dtype, {tq, kHeads, 192});
    a.k = TensorView(k.data(), dtype, {key_rows, kHeads, 192});
    a.v = TensorView(v.data(), dtype, {key_rows, kHeads, kDim});
    a.cu_seqlens_q = TensorView(cu_q.data(), DType::kI32, {std::int64_t(cu_q.size())});
    a.cu_seqlens_k = TensorView(cu_k.data(), DType::kI32, {std::int64_t(cu_k.size())});
    a.max_seqlen_q = int(rows);
    a.max_seqlen_k = int(key_rows);
    a.softmax_scale = 0.0722f;
    if (dtype == DType::kE4M3) {
      a.q_descale = TensorView(&descales[0], DType::kF32, {1});
      a.k_descale = TensorView(&descales[1], DType::kF32, {1});
      a.v_descale = TensorView(&descales[2], DType::kF32, {1});
    }
    a.out = out;
    a.lse = lse;
    return a;
  }
};

TEST(PaddedBatch, PrefillAttentionWritesTheRealRowsOnly) {
  for (DType dtype : {DType::kBF16, DType::kE4M3}) {
    // 20 rows: padding inside the first 128-row tile; 140: a tile past the real rows.
    for (std::int64_t rows : {20, 140}) {
      SCOPED_TRACE(concat(dtype_name(dtype), ", ", rows, " rows"));
      PaddedBatch batch(dtype, rows);
      const std::int64_t real = batch.real();
      // The unpadded call: its bf16 output and LSE.
      HostBuffer bf16(std::size_t(real * kWidth * 2)), lse(std::size_t(real * kHeads * 4));
      prefill_attention(batch.args(real,
                                   TensorView(bf16.data(), DType::kBF16, {real, kHeads, kDim}),
                                   TensorView(lse.data(), DType::kF32, {real, kHeads})));
      // The padded bf16 call: the real rows as above, the padded ones untouched.
      HostBuffer padded(std::size_t(rows * kWidth * 2), test::kPoison),
          padded_lse(std::size_t(rows * kHeads * 4), test::kPoison);
      prefill_attention(batch.args(rows,
                                   TensorView(padded.data(), DType::kBF16, {rows, kHeads, kDim}),
                                   TensorView(padded_lse.data(), DType::kF32, {rows, kHeads})));
      HostBuffer want(padded.bytes(), test::kPoison), want_lse(padded_lse.bytes(), test::kPoison);
      std::memcpy(want.data(), bf16.data(), bf16.bytes());
      std::memcpy(want_lse.data(), lse.data(), lse.bytes());
      EXPECT_TRUE(test::same_bytes(padded.payload(), want.payload(), "out"));
      EXPECT_TRUE(test::same_bytes(padded_lse.payload(), want_lse.payload(), "lse"));
      // Quantized: every key and layout over the padded tensors.
      const TensorView real_rows(bf16.data(), DType::kBF16, {real, kWidth});
      for (const QuantCase& c : test::quant_cases(rows, kHeads, kDim)) {
        expect_padded_fused(
            c, real_rows, rows,
            [&](const TensorView& out, const TensorView& scale, const TensorView& block) {
              PrefillAttentionArgs a = batch.args(rows, out, {});
              a.output_scale = scale;
              a.output_block_scale = block;
              prefill_attention(a);
            });
      }
    }
  }
}

TEST(PaddedBatch, PrefillAttentionOffsetsPastTheTensorsAreAnError) {
  PaddedBatch batch(DType::kBF16, 14);
  HostBuffer out(std::size_t(14 * kWidth * 2));
  batch.cu_k.back() = 25;  // 24 key rows
  test::expect_error(
      [&] {
        prefill_attention(
            batch.args(14, TensorView(out.data(), DType::kBF16, {14, kHeads, kDim}), {}));
      },
      ErrorCategory::kInvalidArgument,
      {"prefill_attention: `cu_seqlens_k`: expected at most 24 (the tokens of `k`) last, got 25"});
}

// ---- merge_attention_states
// ----------------------------------------------------------------------

// States of `rows` tokens, some sides empty (-inf).
struct PaddedStates {
  std::int64_t rows;
  HostBuffer o_a, o_b, lse_a, lse_b;
  explicit PaddedStates(std::int64_t padded_rows, test::Rng rng = test::Rng(9))
      : rows(padded_rows),
        o_a(random_values(DType::kBF16, rows * kWidth, 4.0f, rng)),
        o_b(random_values(DType::kBF16, rows * kWidth, 4.0f, rng)),
        lse_a(random_values(DType::kF32, rows * kHeads, 8.0f, rng)),
        lse_b(random_values(DType::kF32, rows * kHeads, 8.0f, rng)) {
    for (std::int64_t i = 0; i < rows * kHeads; i += 5) {
      const float empty = -INFINITY;
      std::memcpy((i % 2 ? lse_a : lse_b).data() + i * 4, &empty, 4);
    }
  }
  TensorView o(HostBuffer& b, std::int64_t t) {
    return TensorView(b.data(), DType::kBF16, {t, kHeads, kDim});
  }
  TensorView lse(HostBuffer& b, std::int64_t t) {
    return TensorView(b.data(), DType::kF32, {t, kHeads});
  }
};

TEST(PaddedBatch, MergeAttentionStatesWritesTheFirstNumTokensOnly) {
  for (std::int64_t rows : {20, 140}) {
    for (std::int32_t real : {0, 13, int(rows)}) {
      SCOPED_TRACE(concat(real, " of ", rows, " rows"));
      PaddedStates s(rows);
      std::int32_t count = real;
      const TensorView num_tokens(&count, DType::kI32, {1});
      // The unpadded merge of the real rows.
      HostBuffer bf16(std::size_t(std::max<std::int64_t>(real, 1) * kWidth * 2)),
          lse(std::size_t(std::max<std::int64_t>(real, 1) * kHeads * 4));
      merge_attention_states(s.o(s.o_a, real), s.lse(s.lse_a, real), s.o(s.o_b, real),
                             s.lse(s.lse_b, real), s.o(bf16, real), s.lse(lse, real));
      HostBuffer padded(std::size_t(rows * kWidth * 2), test::kPoison),
          padded_lse(std::size_t(rows * kHeads * 4), test::kPoison);
      merge_attention_states(s.o(s.o_a, rows), s.lse(s.lse_a, rows), s.o(s.o_b, rows),
                             s.lse(s.lse_b, rows), s.o(padded, rows), s.lse(padded_lse, rows), {},
                             {}, num_tokens);
      HostBuffer want(padded.bytes(), test::kPoison), want_lse(padded_lse.bytes(), test::kPoison);
      std::memcpy(want.data(), bf16.data(), std::size_t(real * kWidth * 2));
      std::memcpy(want_lse.data(), lse.data(), std::size_t(real * kHeads * 4));
      EXPECT_TRUE(test::same_bytes(padded.payload(), want.payload(), "out"));
      EXPECT_TRUE(test::same_bytes(padded_lse.payload(), want_lse.payload(), "out_lse"));
      const TensorView real_rows(bf16.data(), DType::kBF16, {real, kWidth});
      for (const QuantCase& c : test::quant_cases(rows, kHeads, kDim)) {
        HostBuffer out_lse(padded_lse.bytes(), test::kPoison);
        expect_padded_fused(
            c, real_rows, rows,
            [&](const TensorView& out, const TensorView& scale, const TensorView& block) {
              merge_attention_states(s.o(s.o_a, rows), s.lse(s.lse_a, rows), s.o(s.o_b, rows),
                                     s.lse(s.lse_b, rows), out, s.lse(out_lse, rows), scale, block,
                                     num_tokens);
            });
        EXPECT_TRUE(test::same_bytes(out_lse.payload(), want_lse.payload(), "out_lse"));
      }
    }
  }
}

TEST(PaddedBatch, MergeAttentionStatesNumTokensErrors) {
  PaddedStates s(8);
  HostBuffer out(std::size_t(8 * kWidth * 2)), out_lse(std::size_t(8 * kHeads * 4));
  const auto merge = [&](const TensorView& num_tokens) {
    merge_attention_states(s.o(s.o_a, 8), s.lse(s.lse_a, 8), s.o(s.o_b, 8), s.lse(s.lse_b, 8),
                           s.o(out, 8), s.lse(out_lse, 8), {}, {}, num_tokens);
  };
  std::int32_t count[2] = {9, 0};
  test::expect_error([&] { merge(TensorView(count, DType::kI32, {1})); },
                     ErrorCategory::kInvalidArgument,
                     {"merge_attention_states: `num_tokens`: expected 0 to 8 (the tokens of "
                      "`o_a`), got 9"});
  count[0] = -1;
  test::expect_error([&] { merge(TensorView(count, DType::kI32, {1})); },
                     ErrorCategory::kInvalidArgument, {"`num_tokens`: expected 0 to 8", "got -1"});
  test::expect_error([&] { merge(TensorView(count, DType::kI32, {2})); },
                     ErrorCategory::kInvalidArgument,
                     {"`num_tokens`: expected one i32 of shape [] or [1], got i32[2]"});
  test::expect_error([&] { merge(TensorView(count, DType::kI64, {1})); },
                     ErrorCategory::kInvalidArgument, {"`num_tokens` dtype", "expected i32"});
}

}  // namespace
}  // namespace fp8mla
