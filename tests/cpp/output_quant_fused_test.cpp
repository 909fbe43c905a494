// Fused output quantization on the CPU (docs/design.md section 6): prefill_attention and
// merge_attention_states with a quantized `out` give, bit for bit, the op with a bf16 `out`
// followed by the standalone quantization op, for every key, scale dtype and scale layout. Every
// output and scale buffer is poisoned before the call, twice with different bytes, so that a byte
// the op must write and does not is caught, and guard bands and the bytes past the scale rows
// the op uses (padded scale tensors) must stay as they were.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "buffer_test_util.hpp"
#include "error_test_util.hpp"
#include "fp8mla/attention.hpp"
#include "fp8mla/output_quant.hpp"
#include "fp8mla/quantize.hpp"

namespace fp8mla {
namespace {

using test::dense;
using test::HostBuffer;
using test::Rng;
using test::round_up;
using test::Spec;

constexpr std::int64_t kHeads = 4, kDim = 128, kWidth = kHeads * kDim;
constexpr float kStaticScale = 150.0f;  // o * 150 saturates the largest outputs (|v| < 4)
constexpr float kGlobalScale = 500.0f;

// One quantized output: `out` and the scale tensor as they are given to the op, the standalone
// op's scale view over the first `tokens` rows, and the call of that op.
struct QuantCase {
  std::string name;
  OutputQuantKey key = OutputQuantKey::kFp8Static;
  Spec out;    // e4m3 or e2m1x2: [T, H, Dv] (Dv / 2 bytes) or [T, W] (W / 2 bytes)
  Spec scale;  // output_block_scale (or output_scale for kFp8Static)
  // The standalone op on the bf16 [T, W] rows, `out` as rows and the scales it writes.
  std::function<void(const TensorView& bf16, const TensorView& out, const TensorView& scales,
                     const TensorView& global)>
      standalone;
  // The part of the scale tensor the standalone op is given (the first rows or tiles).
  std::function<TensorView(const TensorView& scales)> used = [](const TensorView& s) { return s; };
};

Spec strided(DType dtype, std::vector<std::int64_t> shape, std::vector<std::int64_t> strides,
             std::int64_t elems, std::int64_t offset = 0) {
  return {dtype, std::move(shape), std::move(strides), offset, elems + offset};
}

// `out` views: [T, W] rows padded by 48 bytes and 16 bytes in, or dense [T, H, Dv].
Spec out_spec(DType dtype, std::int64_t tokens, bool three_d) {
  const std::int64_t dim = dtype == DType::kE2M1x2 ? kDim / 2 : kDim;
  if (three_d) return dense(dtype, {tokens, kHeads, dim});
  return test::padded(dtype, {tokens, kHeads * dim}, 48, 16);
}

std::vector<QuantCase> group_cases(std::int64_t t) {
  std::vector<QuantCase> cases;
  const DType f32 = DType::kF32, ue8m0 = DType::kUE8M0, i32 = DType::kI32;
  for (int group : {128, 64}) {
    const std::int64_t g = kWidth / group, w = (g + 3) / 4, t4 = round_up(t, 4), r = t + 6;
    const OutputQuantKey key =
        group == 128 ? OutputQuantKey::kFp8Group128 : OutputQuantKey::kFp8Group64;
    struct Layout {
      std::string name;
      Spec scale;
    };
    const std::vector<Layout> layouts = {
        {"f32 row-major", dense(f32, {t, g})},
        {"f32 column-major", strided(f32, {t, g}, {1, t}, g * t)},
        {"f32 TMA-aligned column-major", strided(f32, {t, g}, {1, t4}, g * t4)},
        {"f32 padded rows (CUDA graph)", strided(f32, {r, g}, {1, r}, g * r)},
        {"ue8m0 row-major", dense(ue8m0, {t, g})},
        {"ue8m0 column-major", strided(ue8m0, {t, g}, {1, t}, g * t, 3)},
        {"packed i32 TMA-aligned column-major", strided(i32, {t, w}, {1, t4}, w * t4)},
        {"packed i32 row-major", dense(i32, {t, w})},
    };
    for (const Layout& l : layouts) {
      for (bool three_d : {false, true}) {
        QuantCase c;
        c.name = concat("group ", group, ", ", l.name, three_d ? ", out [T, H, Dv]" : "");
        c.key = key;
        c.out = out_spec(DType::kE4M3, t, three_d);
        c.scale = l.scale;
        c.standalone = [group](const TensorView& x, const TensorView& out, const TensorView& s,
                               const TensorView&) {
          quantize_fp8_per_token_group(x, out, s, {group, 1e-10f, false});
        };
        c.used = [t](const TensorView& s) { return s.narrow(0, 0, t); };
        cases.push_back(std::move(c));
      }
    }
  }
  return cases;
}

std::vector<QuantCase> quant_cases(std::int64_t t) {
  std::vector<QuantCase> cases = group_cases(t);
  for (bool three_d : {false, true}) {
    QuantCase c;
    c.name = concat("static", three_d ? ", out [T, H, Dv]" : "");
    c.out = out_spec(DType::kE4M3, t, three_d);
    c.scale = dense(DType::kF32, {1});
    c.standalone = [](const TensorView& x, const TensorView& out, const TensorView& scale,
                      const TensorView&) { quantize_fp8(x, out, scale); };
    cases.push_back(std::move(c));
  }
  const std::int64_t blocks = kWidth / 16, tiles = (t + 127) / 128, rows = tiles * 128;
  const DType e4m3 = DType::kE4M3;
  struct Nvfp4 {
    std::string name;
    Spec scale;
    Nvfp4ScaleLayout layout;
    std::int64_t used_rows;
  };
  const Nvfp4ScaleLayout swizzled = Nvfp4ScaleLayout::kSwizzled128x4;
  const Nvfp4ScaleLayout linear = Nvfp4ScaleLayout::kLinear;
  const std::vector<Nvfp4> layouts = {
      {"swizzled 2-d", dense(e4m3, {rows, blocks}), swizzled, rows},
      {"swizzled 5-d", dense(e4m3, {tiles, blocks / 4, 32, 4, 4}), swizzled, tiles},
      {"swizzled 2-d, a spare tile", dense(e4m3, {rows + 128, blocks}), swizzled, rows},
      {"linear", dense(e4m3, {t, blocks}), linear, t},
      {"linear, row stride 40 and spare rows",
       strided(e4m3, {t + 3, blocks}, {40, 1}, 40 * (t + 3)), linear, t},
  };
  for (const Nvfp4& l : layouts) {
    for (bool three_d : {false, true}) {
      QuantCase c;
      c.name = concat("nvfp4 ", l.name, three_d ? ", out [T, H, Dv / 2]" : "");
      c.key = OutputQuantKey::kNvfp4;
      c.out = out_spec(DType::kE2M1x2, t, three_d);
      c.scale = l.scale;
      c.standalone = [layout = l.layout](const TensorView& x, const TensorView& out,
                                         const TensorView& s, const TensorView& global) {
        quantize_nvfp4(x, out, s, global, layout);
      };
      c.used = [n = l.used_rows](const TensorView& s) { return s.narrow(0, 0, n); };
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

// `out` as the [T, cols] rows the standalone op takes (a 3-d view's heads are contiguous).
TensorView as_rows(const TensorView& out) {
  if (out.ndim() == 2) return out;
  return TensorView(out.data(), out.dtype(), {out.size(0), out.size(1) * out.size(2)},
                    {out.stride(0), 1});
}

// The buffers of one quantized call: out, scale tensor, and the global scale of NVFP4.
struct QuantBuffers {
  HostBuffer out, scale, global;
  QuantBuffers(const QuantCase& c, std::uint8_t poison)
      : out(c.out.bytes(), poison), scale(c.scale.bytes(), poison), global(4, poison) {
    const float one_scale = c.key == OutputQuantKey::kNvfp4 ? kGlobalScale : kStaticScale;
    std::memcpy(c.key == OutputQuantKey::kFp8Static ? scale.data() : global.data(), &one_scale, 4);
  }
  TensorView out_view(const QuantCase& c) { return c.out.view(out.data()); }
  TensorView scale_view(const QuantCase& c) { return c.scale.view(scale.data()); }
  TensorView global_view() { return TensorView(global.data(), DType::kF32, {1}); }
  // (output_scale, output_block_scale) of the fused call.
  std::pair<TensorView, TensorView> op_scales(const QuantCase& c) {
    if (c.key == OutputQuantKey::kFp8Static) return {scale_view(c), {}};
    if (c.key == OutputQuantKey::kNvfp4) return {global_view(), scale_view(c)};
    return {{}, scale_view(c)};
  }
};

// Runs `fused(out, output_scale, output_block_scale)` and the reference (`bf16` rows, the op's
// unquantized output, through the standalone op) on buffers poisoned alike, and compares them.
void expect_fused_matches(
    const QuantCase& c, const TensorView& bf16,
    const std::function<void(const TensorView&, const TensorView&, const TensorView&)>& fused) {
  SCOPED_TRACE(c.name);
  for (std::uint8_t poison : {std::uint8_t(0xFF), std::uint8_t(0x00)}) {
    QuantBuffers got(c, poison), want(c, poison);
    const auto [scale, block] = got.op_scales(c);
    ASSERT_EQ(to_string(detect_output_quant_key(got.out_view(c), scale, block,
                                                output_row_width(got.out_view(c)))),
              to_string(c.key));
    try {
      fused(got.out_view(c), scale, block);
    } catch (const Error& e) {
      FAIL() << e.what();
    }
    c.standalone(bf16, as_rows(want.out_view(c)), c.used(want.scale_view(c)), want.global_view());
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
    const auto [scale, block] = got.op_scales(c);
    PrefillAttentionArgs a = batch.args(got.out_view(c));
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

}  // namespace
}  // namespace fp8mla
