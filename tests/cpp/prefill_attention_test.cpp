// prefill_attention on the CPU (docs/design.md section 3, op 8; section 8): the op against a
// float64 reference written here on the same dequantized inputs, over single sequences, ragged
// batches, prefixes (k_len > q_len), causal and non-causal, FP8 and BF16 inputs with descales != 1,
// strided views and a transposed LSE buffer; outputs are poisoned (NaN) first and checked in full,
// and every bad argument is an Error with a clear message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "buffer_test_util.hpp"
#include "error_test_util.hpp"
#include "fp8mla/attention.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/kernel_registry.hpp"
#include "fp8mla/numerics.hpp"

namespace fp8mla {
namespace {

using test::HostBuffer;

constexpr float kInf = std::numeric_limits<float>::infinity();
// Relative error of rounding to bf16 (unit roundoff 2^-8), plus a little for the fp32 math.
constexpr double kBf16Rounding = 0.00390625 * 1.01;

struct PrefillCase {
  std::vector<int> q_lens;
  std::vector<int> k_lens;  // empty: the q lengths (no prefix)
  int heads = 1;
  int dqk = 192;
  int dv = 128;
  DType dtype = DType::kBF16;
  bool causal = true;
  float descale[3] = {1.0f, 1.0f, 1.0f};  // q, k, v (FP8 only)
  bool strided = false;                   // q, k, v, out as views with gaps
  enum class Lse { kNone, kTokenMajor, kTransposed } lse = Lse::kTokenMajor;
  bool ones_v = false;        // every v element 1
  bool v_transposed = false;  // v as a [Tk, H, Dv] view of [H][Dv][Tk + 3] memory
};

// A [n0, n1, n2] view in `buf` with element strides; `offset` elements in.
TensorView view3(HostBuffer& buf, DType dtype, std::int64_t offset, std::int64_t n0,
                 std::int64_t n1, std::int64_t n2, std::int64_t s0, std::int64_t s1) {
  return TensorView(buf.data() + offset * dtype_size(dtype), dtype, {n0, n1, n2}, {s0, s1, 1});
}

struct Tensor3 {
  HostBuffer buf;
  TensorView view;
};

// Storage of a [n, heads, d] tensor: contiguous, or (strided) head-major with padded rows and an
// offset, so that token and head strides are both unusual.
Tensor3 make3(DType dtype, std::int64_t n, std::int64_t heads, std::int64_t d, bool strided) {
  if (!strided) {
    Tensor3 t{HostBuffer(std::size_t(std::max<std::int64_t>(n * heads * d, 1) * dtype_size(dtype))),
              {}};
    t.view = view3(t.buf, dtype, 0, n, heads, d, heads * d, d);
    return t;
  }
  const std::int64_t w = d + 32, offset = 16;  // head-major [heads, n, w], view from column 16
  Tensor3 t{HostBuffer(std::size_t((heads * n * w + offset + 1) * dtype_size(dtype))), {}};
  t.view = view3(t.buf, dtype, offset, n, heads, d, w, n * w);
  return t;
}

std::int64_t at3(const TensorView& v, std::int64_t t, std::int64_t h, std::int64_t d) {
  return t * v.stride(0) + h * v.stride(1) + d * v.stride(2);
}

// Fills `t` with random values; returns the dequantized values (fp32 as the op computes them,
// widened to double), logical [n, heads, d].
std::vector<double> fill(Tensor3& t, DType dtype, float descale, float range, std::mt19937& rng,
                         bool ones = false) {
  const TensorView& v = t.view;
  std::uniform_real_distribution<float> dist(-range, range);
  std::vector<double> values;
  values.reserve(std::size_t(v.numel()));
  for (std::int64_t i = 0; i < v.size(0); ++i) {
    for (std::int64_t h = 0; h < v.size(1); ++h) {
      for (std::int64_t d = 0; d < v.size(2); ++d) {
        const float x = ones ? 1.0f : dist(rng);
        const std::int64_t at = at3(v, i, h, d);
        if (dtype == DType::kE4M3) {
          const std::uint8_t code = encode_e4m3(x);
          static_cast<std::uint8_t*>(v.data())[at] = code;
          values.push_back(double(decode_e4m3(code) * descale));
        } else {
          const std::uint16_t bits = encode_bf16(x);
          static_cast<std::uint16_t*>(v.data())[at] = bits;
          values.push_back(double(decode_bf16(bits)));
        }
      }
    }
  }
  return values;
}

// Cumulative offsets [0, l0, l0 + l1, ...] of sequence lengths, and their I32 host buffer.
struct SeqLens {
  explicit SeqLens(const std::vector<int>& lens) : offsets(1, 0), buf((lens.size() + 1) * 4) {
    for (int len : lens) offsets.push_back(offsets.back() + len);
    std::memcpy(buf.data(), offsets.data(), offsets.size() * 4);
  }
  TensorView view() { return TensorView(buf.data(), DType::kI32, {std::int64_t(offsets.size())}); }
  std::vector<std::int32_t> offsets;
  HostBuffer buf;
};

// v as [tk, heads, dv]: as make3 does, or transposed ([H][Dv][tk + 3] memory).
Tensor3 make_v(const PrefillCase& c, std::int64_t tk) {
  if (!c.v_transposed) return make3(c.dtype, tk, c.heads, c.dv, c.strided);
  const std::int64_t pitch = tk + 3;
  Tensor3 v{HostBuffer(std::size_t(std::max<std::int64_t>(c.heads * c.dv * pitch, 1)) *
                       dtype_size(c.dtype)),
            {}};
  v.view = TensorView(v.buf.data(), c.dtype, {tk, c.heads, c.dv}, {1, c.dv * pitch, pitch});
  return v;
}

// The float64 reference of query row t, head h over its first `visible` keys (from key k0):
// o = softmax(scale * q k^T) v, and the returned log-sum-exp (-inf with no visible key, o = 0).
double reference_row(const PrefillCase& c, const std::vector<double>& qd,
                     const std::vector<double>& kd, const std::vector<double>& vd, std::int64_t t,
                     std::int64_t h, std::int64_t k0, std::int64_t visible, double scale,
                     std::vector<double>& o) {
  const std::int64_t H = c.heads;
  std::fill(o.begin(), o.end(), 0.0);
  if (visible == 0) return -std::numeric_limits<double>::infinity();
  std::vector<double> s(std::size_t(visible), 0.0);
  double m = -std::numeric_limits<double>::infinity();
  for (std::int64_t j = 0; j < visible; ++j) {
    const double* qr = &qd[std::size_t((t * H + h) * c.dqk)];
    const double* kr = &kd[std::size_t(((k0 + j) * H + h) * c.dqk)];
    double dot = 0.0;
    for (int d = 0; d < c.dqk; ++d) dot += qr[d] * kr[d];
    s[j] = scale * dot;
    m = std::max(m, s[j]);
  }
  double l = 0.0;
  for (std::int64_t j = 0; j < visible; ++j) {
    const double p = std::exp(s[j] - m);
    l += p;
    const double* vr = &vd[std::size_t(((k0 + j) * H + h) * c.dv)];
    for (int d = 0; d < c.dv; ++d) o[d] += p * vr[d];
  }
  for (double& x : o) x /= l;
  return m + std::log(l);
}

// Nothing written outside the out view (mask: 1 for an element byte); the LSE buffer untouched
// without an lse view. Returns the failures, reporting the first few.
int count_stray_writes(const HostBuffer& out, const std::vector<std::uint8_t>& mask,
                       const HostBuffer& lse_buf, bool lse_given, int failures) {
  for (std::size_t i = 0; i < out.bytes(); ++i) {
    if (!mask[i] && out.data()[i] != test::kPoison && ++failures <= 10) {
      ADD_FAILURE() << "out buffer byte " << i << " outside the view was written";
    }
  }
  if (!lse_given) {
    for (std::size_t i = 0; i < lse_buf.bytes(); ++i) {
      if (lse_buf.data()[i] != test::kPoison && ++failures <= 10) ADD_FAILURE() << "lse written";
    }
  }
  return failures;
}

void run_case(const PrefillCase& c, std::uint32_t seed = 1) {
  std::mt19937 rng(seed);
  const std::vector<int>& q_lens = c.q_lens;
  const std::vector<int>& k_lens = c.k_lens.empty() ? c.q_lens : c.k_lens;
  ASSERT_EQ(q_lens.size(), k_lens.size());
  const std::int64_t batch = std::int64_t(q_lens.size());
  SeqLens cu_q(q_lens), cu_k(k_lens);
  const std::int64_t tq = cu_q.offsets.back(), tk = cu_k.offsets.back(), H = c.heads;
  const bool fp8 = c.dtype == DType::kE4M3;
  float descales[3] = {fp8 ? c.descale[0] : 1.0f, fp8 ? c.descale[1] : 1.0f,
                       fp8 ? c.descale[2] : 1.0f};

  Tensor3 q = make3(c.dtype, tq, H, c.dqk, c.strided);
  Tensor3 k = make3(c.dtype, tk, H, c.dqk, c.strided);
  Tensor3 v = make_v(c, tk);
  const float range = fp8 ? 8.0f : 1.5f;  // logits of a few units: peaked, not one-hot
  const std::vector<double> qd = fill(q, c.dtype, descales[0], range, rng);
  const std::vector<double> kd = fill(k, c.dtype, descales[1], range, rng);
  const std::vector<double> vd = fill(v, c.dtype, descales[2], range, rng, c.ones_v);
  Tensor3 out = make3(DType::kBF16, tq, H, c.dv, c.strided);

  const std::int64_t lse_elems = std::max<std::int64_t>(tq * H, 1);
  HostBuffer lse_buf(std::size_t(lse_elems * 4));
  TensorView lse;
  if (c.lse == PrefillCase::Lse::kTokenMajor) {
    lse = TensorView(lse_buf.data(), DType::kF32, {tq, H});
  } else if (c.lse == PrefillCase::Lse::kTransposed) {
    lse = TensorView(lse_buf.data(), DType::kF32, {tq, H}, {1, tq});
  }

  PrefillAttentionArgs a;
  a.q = q.view;
  a.k = k.view;
  a.v = v.view;
  a.cu_seqlens_q = cu_q.view();
  a.cu_seqlens_k = cu_k.view();
  a.max_seqlen_q = q_lens.empty() ? 0 : *std::max_element(q_lens.begin(), q_lens.end());
  a.max_seqlen_k = k_lens.empty() ? 0 : *std::max_element(k_lens.begin(), k_lens.end());
  a.softmax_scale = float(1.0 / std::sqrt(double(c.dqk)));
  a.causal = c.causal;
  if (fp8) {
    a.q_descale = TensorView(&descales[0], DType::kF32, {1});
    a.k_descale = TensorView(&descales[1], DType::kF32, {1});
    a.v_descale = TensorView(&descales[2], DType::kF32, {1});
  }
  a.out = out.view;
  a.lse = lse;

  // Snapshot the inputs: the op must not write them.
  const std::vector<std::uint8_t> q_before(q.buf.payload().begin(), q.buf.payload().end());
  const std::vector<std::uint8_t> k_before(k.buf.payload().begin(), k.buf.payload().end());
  const std::vector<std::uint8_t> v_before(v.buf.payload().begin(), v.buf.payload().end());
  ASSERT_NO_THROW(prefill_attention(a));
  EXPECT_TRUE(std::equal(q_before.begin(), q_before.end(), q.buf.payload().begin()));
  EXPECT_TRUE(std::equal(k_before.begin(), k_before.end(), k.buf.payload().begin()));
  EXPECT_TRUE(std::equal(v_before.begin(), v_before.end(), v.buf.payload().begin()));
  for (HostBuffer* b : {&q.buf, &k.buf, &v.buf, &out.buf, &lse_buf, &cu_q.buf, &cu_k.buf}) {
    EXPECT_TRUE(b->guards_intact());
  }

  // Expected bytes of `out` (poison outside the view) and of the LSE buffer.
  std::vector<std::uint8_t> out_expected_mask(out.buf.bytes(), 0);  // 1: an element byte
  int failures = 0;
  std::vector<double> o(std::size_t(c.dv));
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t ql = q_lens[b], kl = k_lens[b];
    for (std::int64_t i = 0; i < ql; ++i) {
      const std::int64_t t = cu_q.offsets[b] + i;
      const std::int64_t visible = c.causal ? std::clamp<std::int64_t>(i + kl - ql + 1, 0, kl) : kl;
      for (std::int64_t h = 0; h < H; ++h) {
        const double ref_lse = reference_row(c, qd, kd, vd, t, h, cu_k.offsets[b], visible,
                                             double(a.softmax_scale), o);
        const auto* out_row =
            static_cast<const std::uint16_t*>(out.view.data()) + at3(out.view, t, h, 0);
        for (int d = 0; d < c.dv; ++d) {
          const std::size_t byte =
              std::size_t(reinterpret_cast<const std::uint8_t*>(out_row + d) - out.buf.data());
          out_expected_mask[byte] = out_expected_mask[byte + 1] = 1;
          const float got = decode_bf16(out_row[d]);
          bool ok;
          if (visible == 0) {
            ok = out_row[d] == 0;  // +0 exactly
          } else if (c.ones_v) {
            ok = got == 1.0f;
          } else {
            ok = std::fabs(got - o[d]) <=
                 kBf16Rounding * std::fabs(o[d]) + 1e-5 * range * descales[2];
          }
          if (!ok && ++failures <= 10) {
            ADD_FAILURE() << "out[" << t << ", " << h << ", " << d << "] = " << got
                          << ", reference " << o[d] << " (sequence " << b << ", row " << i
                          << ", visible keys " << visible << ")";
          }
        }
        if (c.lse != PrefillCase::Lse::kNone) {
          const float got =
              static_cast<const float*>(lse.data())[t * lse.stride(0) + h * lse.stride(1)];
          const bool ok =
              visible == 0 ? got == -kInf
                           : std::fabs(got - ref_lse) <= 1e-4 * std::max(1.0, std::fabs(ref_lse));
          if (!ok && ++failures <= 10) {
            ADD_FAILURE() << "lse[" << t << ", " << h << "] = " << got << ", reference " << ref_lse;
          }
        }
      }
    }
  }
  failures = count_stray_writes(out.buf, out_expected_mask, lse_buf,
                                c.lse != PrefillCase::Lse::kNone, failures);
  EXPECT_EQ(failures, 0);
}

PrefillCase single(int len, int heads) {
  PrefillCase c;
  c.q_lens = {len};
  c.heads = heads;
  return c;
}

// Sequences of these query and key lengths.
PrefillCase batch(std::vector<int> q_lens, std::vector<int> k_lens, int heads) {
  PrefillCase c;
  c.q_lens = std::move(q_lens);
  c.k_lens = std::move(k_lens);
  c.heads = heads;
  return c;
}

// `c` with FP8 inputs and these q, k, v descales.
PrefillCase as_fp8(PrefillCase c, float q_descale = 1.0f, float k_descale = 1.0f,
                   float v_descale = 1.0f) {
  c.dtype = DType::kE4M3;
  c.descale[0] = q_descale;
  c.descale[1] = k_descale;
  c.descale[2] = v_descale;
  return c;
}

TEST(PrefillAttentionCpu, SingleSequencesBf16) {
  for (int heads : {1, 16}) {
    for (int len : {1, 2, 63, 64, 65, 127, 128, 129}) {
      SCOPED_TRACE(testing::Message() << "len " << len << ", heads " << heads);
      run_case(single(len, heads));
    }
  }
}

TEST(PrefillAttentionCpu, SingleSequencesFp8) {
  for (int heads : {1, 16}) {
    for (int len : {1, 64, 129}) {
      SCOPED_TRACE(testing::Message() << "len " << len << ", heads " << heads);
      run_case(as_fp8(single(len, heads), 0.3f, 0.125f, 2.5f));
    }
  }
}

TEST(PrefillAttentionCpu, LongSequence) {
  run_case(single(1000, 1));
  run_case(as_fp8(single(1000, 2), 0.2f, 0.2f, 0.5f), 7);
}

TEST(PrefillAttentionCpu, Sequence4096) {
  PrefillCase c = single(4096, 1);
  c.lse = PrefillCase::Lse::kTransposed;
  run_case(c, 8);
}

TEST(PrefillAttentionCpu, RaggedBatchWithEmptySequences) {
  PrefillCase c = batch({0, 1, 37, 0, 130, 1, 64}, {}, 4);
  run_case(c);
  run_case(as_fp8(c, 0.5f, 0.75f, 1.5f), 2);
}

TEST(PrefillAttentionCpu, PrefixCausal) {
  // Keys past the queries: prefix > extend, prefix only, no prefix.
  PrefillCase c = batch({5, 1, 64, 0, 17}, {50, 200, 129, 33, 17}, 3);
  run_case(c);
  run_case(as_fp8(c, 0.25f, 0.4f, 3.0f), 3);
}

TEST(PrefillAttentionCpu, NonCausal) {
  PrefillCase c = batch({40, 1, 0, 77}, {10, 90, 5, 77}, 2);
  c.causal = false;
  run_case(c);
  run_case(as_fp8(c, 0.5f), 4);
}

TEST(PrefillAttentionCpu, EmptyRowsGiveZeroAndMinusInf) {
  // k_len 0; causal rows 0..14 of the second sequence see no key.
  PrefillCase c = batch({3, 20, 4, 2}, {0, 5, 4, 0}, 2);
  run_case(c);
  c.causal = false;
  run_case(c);
}

TEST(PrefillAttentionCpu, AllOnesVGivesExactlyOne) {
  PrefillCase c = batch({1, 129, 7, 3}, {1, 129, 30, 0}, 3);
  c.ones_v = true;
  run_case(c);
  run_case(as_fp8(c, 0.7f), 5);  // 1.0 is exact in e4m3; v descale 1
}

TEST(PrefillAttentionCpu, HeadDimsAndLayouts) {
  for (auto [dqk, dv] :
       {std::pair{192, 128}, std::pair{128, 128}, std::pair{64, 64}, std::pair{128, 64}}) {
    SCOPED_TRACE(testing::Message() << "dqk " << dqk << ", dv " << dv);
    PrefillCase c = batch({9, 0, 33}, {20, 4, 33}, 5);
    c.dqk = dqk;
    c.dv = dv;
    c.strided = true;
    c.lse = PrefillCase::Lse::kTransposed;
    run_case(c);
    run_case(as_fp8(c, 1.0f, 0.3f), 6);
  }
}

// V transposed (contiguous tokens), the layout the FP8 CUDA kernel reads.
TEST(PrefillAttentionCpu, TransposedV) {
  PrefillCase c = batch({9, 0, 70}, {20, 4, 70}, 3);
  c.v_transposed = true;
  run_case(c);
  c.causal = false;
  run_case(as_fp8(c), 8);
}

TEST(PrefillAttentionCpu, TransposedLseAndNoLse) {
  PrefillCase c = single(65, 16);
  c.lse = PrefillCase::Lse::kTransposed;
  run_case(c);
  c.lse = PrefillCase::Lse::kNone;
  run_case(c);
}

TEST(PrefillAttentionCpu, ZeroTokens) {
  PrefillCase c;
  c.q_lens = {};
  run_case(c);
  c.q_lens = {0, 0};
  c.k_lens = {0, 3};
  run_case(c);
}

// No keys with a split K: an empty k_rope without data (as torch's empty tensors are) is given
// all the same, so k is [0, H, Dqk - 64]; every row is empty (0, -inf).
TEST(PrefillAttentionCpu, SplitKOfNoKeys) {
  std::int32_t cu_q[2] = {0, 2}, cu_k[2] = {0, 0};
  std::vector<std::uint16_t> q(2 * 4 * 192, 0x3F80), out(2 * 4 * 128, 0xFFFF);
  std::vector<float> lse(2 * 4, 1.0f);
  PrefillAttentionArgs a;
  a.q = TensorView(q.data(), DType::kBF16, {2, 4, 192});
  a.k = TensorView(nullptr, DType::kBF16, {0, 4, 128});
  a.k_rope = TensorView(nullptr, DType::kBF16, {0, 64});
  a.v = TensorView(nullptr, DType::kBF16, {0, 4, 128});
  a.cu_seqlens_q = TensorView(cu_q, DType::kI32, {2});
  a.cu_seqlens_k = TensorView(cu_k, DType::kI32, {2});
  a.max_seqlen_q = 2;
  a.softmax_scale = 0.1f;
  a.out = TensorView(out.data(), DType::kBF16, {2, 4, 128});
  a.lse = TensorView(lse.data(), DType::kF32, {2, 4});
  prefill_attention(a);
  for (std::uint16_t o : out) EXPECT_EQ(o, 0);
  for (float l : lse) EXPECT_EQ(l, -std::numeric_limits<float>::infinity());
}

// K as its per-head dims and the shared last 64 once per key (k_rope) gives the bytes of the whole
// K with those 64 in every head; the per-head view's rows hold noise past its dims.
void expect_split_k_equals_whole(DType dtype, int dqk, bool causal, bool rope_3d) {
  SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " dqk " << dqk
                                  << (causal ? " causal" : "")
                                  << (rope_3d ? ", k_rope [Tk, 1, 64]" : ", k_rope [Tk, 64]"));
  const std::vector<int> q_lens = {9, 0, 33, 1}, k_lens = {20, 4, 33, 50};
  SeqLens cu_q(q_lens), cu_k(k_lens);
  const std::int64_t tq = cu_q.offsets.back(), tk = cu_k.offsets.back(), H = 3;
  const std::int64_t eb = std::int64_t(dtype_size(dtype)), nope = dqk - 64;
  std::mt19937 rng(11);
  Tensor3 q = make3(dtype, tq, H, dqk, false);
  Tensor3 k = make3(dtype, tk, H, dqk, false);
  Tensor3 v = make3(dtype, tk, H, 128, true);
  fill(q, dtype, 1.0f, 2.0f, rng);
  fill(k, dtype, 1.0f, 2.0f, rng);
  fill(v, dtype, 1.0f, 2.0f, rng);
  HostBuffer rope(std::size_t(tk * 80 * eb));  // [Tk, 64] rows 80 apart
  for (std::int64_t t = 0; t < tk; ++t) {
    const std::uint8_t* head0 = k.buf.data() + at3(k.view, t, 0, nope) * eb;
    for (std::int64_t h = 1; h < H; ++h) {
      std::memcpy(k.buf.data() + at3(k.view, t, h, nope) * eb, head0, std::size_t(64 * eb));
    }
    std::memcpy(rope.data() + t * 80 * eb, head0, std::size_t(64 * eb));
  }
  Tensor3 k_nope = make3(dtype, tk, H, dqk, false);  // K's bytes, noise in the shared dims
  std::memcpy(k_nope.buf.data(), k.buf.data(), k.buf.bytes());
  for (std::int64_t t = 0; t < tk; ++t) {
    for (std::int64_t h = 0; h < H; ++h) {
      std::memset(k_nope.buf.data() + at3(k.view, t, h, nope) * eb, 0x3A, std::size_t(64 * eb));
    }
  }
  float descale = 0.5f;
  PrefillAttentionArgs a;
  a.q = q.view;
  a.k = k.view;
  a.v = v.view;
  a.cu_seqlens_q = cu_q.view();
  a.cu_seqlens_k = cu_k.view();
  a.max_seqlen_q = 33;
  a.max_seqlen_k = 50;
  a.softmax_scale = 0.1f;
  a.causal = causal;
  if (dtype == DType::kE4M3) {
    a.q_descale = a.k_descale = a.v_descale = TensorView(&descale, DType::kF32, {1});
  }
  HostBuffer whole_out(std::size_t(tq * H * 128 * 2)), split_out(whole_out.bytes());
  HostBuffer whole_lse(std::size_t(tq * H * 4)), split_lse(whole_lse.bytes());
  a.out = TensorView(whole_out.data(), DType::kBF16, {tq, H, 128});
  a.lse = TensorView(whole_lse.data(), DType::kF32, {tq, H});
  ASSERT_NO_THROW(prefill_attention(a));
  a.k = TensorView(k_nope.buf.data(), dtype, {tk, H, nope}, {H * dqk, dqk, 1});
  a.k_rope = rope_3d ? TensorView(rope.data(), dtype, {tk, 1, 64}, {80, 64, 1})
                     : TensorView(rope.data(), dtype, {tk, 64}, {80, 1});
  a.out = TensorView(split_out.data(), DType::kBF16, {tq, H, 128});
  a.lse = TensorView(split_lse.data(), DType::kF32, {tq, H});
  ASSERT_NO_THROW(prefill_attention(a));
  EXPECT_TRUE(std::equal(whole_out.payload().begin(), whole_out.payload().end(),
                         split_out.payload().begin()));
  EXPECT_TRUE(std::equal(whole_lse.payload().begin(), whole_lse.payload().end(),
                         split_lse.payload().begin()));
  for (HostBuffer* b : {&split_out, &split_lse, &rope, &k_nope.buf}) {
    EXPECT_TRUE(b->guards_intact());
  }
}

TEST(PrefillAttentionCpu, KRopeGivesTheBytesOfKWithRopeInEveryHead) {
  expect_split_k_equals_whole(DType::kBF16, 192, true, false);
  expect_split_k_equals_whole(DType::kE4M3, 192, true, true);
  expect_split_k_equals_whole(DType::kE4M3, 128, false, false);
  expect_split_k_equals_whole(DType::kBF16, 128, false, true);
}

// ---- bad arguments -------------------------------------------------------------------------

using test::expect_error;
using test::fake;
using test::kFake;

// Valid arguments (fake data) for 2 sequences, 10 query and 12 key tokens, 4 heads; cu_seqlens
// point at real memory since the CPU path reads them.
struct BadArgs {
  std::int32_t cu_q[3] = {0, 4, 10};
  std::int32_t cu_k[3] = {0, 6, 12};
  float descale = 1.0f;
  PrefillAttentionArgs a;
  explicit BadArgs(DType dtype = DType::kBF16) {
    a.q = fake(dtype, {10, 4, 192});
    a.k = fake(dtype, {12, 4, 192});
    a.v = fake(dtype, {12, 4, 128});
    a.cu_seqlens_q = TensorView(cu_q, DType::kI32, {3});
    a.cu_seqlens_k = TensorView(cu_k, DType::kI32, {3});
    a.max_seqlen_q = 6;
    a.max_seqlen_k = 6;
    a.softmax_scale = 0.1f;
    a.out = fake(DType::kBF16, {10, 4, 128});
    a.lse = fake(DType::kF32, {10, 4});
    if (dtype == DType::kE4M3) {
      a.q_descale = a.k_descale = a.v_descale = TensorView(&descale, DType::kF32, {1});
    }
  }
};

void expect_bad(void (*mutate)(BadArgs&), ErrorCategory category,
                std::initializer_list<std::string> needles, DType dtype = DType::kBF16) {
  BadArgs b(dtype);
  mutate(b);
  expect_error([&] { prefill_attention(b.a); }, category, needles);
}

// Valid arguments but for one view.
void expect_bad_view(TensorView PrefillAttentionArgs::*view, const TensorView& bad,
                     ErrorCategory category, std::initializer_list<std::string> needles,
                     DType dtype = DType::kBF16) {
  BadArgs b(dtype);
  b.a.*view = bad;
  expect_error([&] { prefill_attention(b.a); }, category, needles);
}

TEST(PrefillAttentionArgs, DtypeMismatch) {
  expect_bad(
      [](BadArgs& b) {
        b.a.q = fake(DType::kF16, {10, 4, 192});
      },
      ErrorCategory::kInvalidArgument,
      {"prefill_attention: `q` dtype", "expected one of {e4m3fn, bf16}", "got f16"});
  expect_bad_view(&PrefillAttentionArgs::k, fake(DType::kE4M3, {12, 4, 192}),
                  ErrorCategory::kInvalidArgument,
                  {"`k` dtype", "expected bf16 (the dtype of `q`)", "got e4m3fn"});
  expect_bad_view(&PrefillAttentionArgs::v, fake(DType::kBF16, {12, 4, 128}),
                  ErrorCategory::kInvalidArgument, {"`v` dtype", "expected e4m3fn", "got bf16"},
                  DType::kE4M3);
}

TEST(PrefillAttentionArgs, WrongHeadDims) {
  expect_bad(
      [](BadArgs& b) {
        b.a.q = fake(DType::kBF16, {10, 4, 256});
        b.a.k = fake(DType::kBF16, {12, 4, 256});
      },
      ErrorCategory::kUnsupported, {"`q`: expected a head dim of 192, 128 or 64", "256"});
  expect_bad_view(&PrefillAttentionArgs::k, fake(DType::kBF16, {12, 4, 128}),
                  ErrorCategory::kInvalidArgument, {"`k`: expected [12, 4, 192]"});
  expect_bad_view(&PrefillAttentionArgs::v, fake(DType::kBF16, {12, 4, 192}),
                  ErrorCategory::kUnsupported, {"`v`: expected a head dim of 128 or 64"});
}

TEST(PrefillAttentionArgs, BadKRope) {
  // k keeps all 192 dims although k_rope gives the last 64.
  expect_bad_view(&PrefillAttentionArgs::k_rope, fake(DType::kBF16, {12, 64}),
                  ErrorCategory::kInvalidArgument,
                  {"`k`: expected [12, 4, 128]", "the rest is `k_rope`", "got"});
  const auto with_k_rope = [](const TensorView& k_rope, DType dtype = DType::kBF16) {
    return [=](BadArgs& b) {
      b.a.k = fake(dtype, {12, 4, 128});
      b.a.k_rope = k_rope;
    };
  };
  const auto bad = [](auto mutate, ErrorCategory category, std::initializer_list<std::string> n,
                      DType dtype = DType::kBF16) {
    BadArgs b(dtype);
    mutate(b);
    expect_error([&] { prefill_attention(b.a); }, category, n);
  };
  bad(with_k_rope(fake(DType::kF16, {12, 64})), ErrorCategory::kInvalidArgument,
      {"`k_rope` dtype: expected bf16 (the dtype of `q`)", "got f16"});
  bad(with_k_rope(fake(DType::kBF16, {11, 64})), ErrorCategory::kInvalidArgument,
      {"`k_rope`: expected [12, 64] or [12, 1, 64]", "got"});
  bad(with_k_rope(fake(DType::kBF16, {12, 4, 64})), ErrorCategory::kInvalidArgument,
      {"`k_rope`: expected [12, 64] or [12, 1, 64]", "one row for all heads"});
  bad(with_k_rope(fake(DType::kBF16, {12, 32})), ErrorCategory::kInvalidArgument,
      {"`k_rope`: expected [12, 64]"});
  bad(with_k_rope(fake(DType::kBF16, {12})), ErrorCategory::kInvalidArgument, {"`k_rope`"});
  bad(with_k_rope(TensorView(kFake, DType::kBF16, {12, 64}, {1, 12})),
      ErrorCategory::kInvalidArgument, {"`k_rope`", "contiguous"});
  bad(
      [](BadArgs& b) {
        b.a.q = fake(DType::kBF16, {10, 4, 64});
        b.a.k = fake(DType::kBF16, {12, 4, 0});
        b.a.v = fake(DType::kBF16, {12, 4, 64});
        b.a.out = fake(DType::kBF16, {10, 4, 64});
        b.a.k_rope = fake(DType::kBF16, {12, 64});
      },
      ErrorCategory::kUnsupported, {"`k_rope`: expected `q` with a head dim of 128 or 192"});
  bad(with_k_rope(fake(DType::kBF16, {12, 64}, Device::cuda(0))), ErrorCategory::kInvalidArgument,
      {"`k_rope`", "cuda:0"});
}

TEST(PrefillAttentionArgs, HeadOrTokenMismatch) {
  expect_bad_view(&PrefillAttentionArgs::k, fake(DType::kBF16, {12, 8, 192}),
                  ErrorCategory::kInvalidArgument, {"`k`: expected [12, 4, 192]"});
  expect_bad_view(&PrefillAttentionArgs::v, fake(DType::kBF16, {11, 4, 128}),
                  ErrorCategory::kInvalidArgument, {"`v`: expected [12, 4, 128]"});
  expect_bad_view(&PrefillAttentionArgs::q, fake(DType::kBF16, {10, 4}),
                  ErrorCategory::kInvalidArgument, {"`q`: expected 3 dims"});
}

TEST(PrefillAttentionArgs, CuSeqlensDtypeAndLength) {
  expect_bad([](BadArgs& b) { b.a.cu_seqlens_q = TensorView(b.cu_q, DType::kF32, {3}); },
             ErrorCategory::kInvalidArgument, {"`cu_seqlens_q` dtype", "expected i32"});
  expect_bad([](BadArgs& b) { b.a.cu_seqlens_k = TensorView(b.cu_k, DType::kI32, {2}); },
             ErrorCategory::kInvalidArgument,
             {"`cu_seqlens_k`: expected the length of `cu_seqlens_q` (3)"});
  expect_bad([](BadArgs& b) { b.a.cu_seqlens_q = TensorView(b.cu_q, DType::kI32, {0}); },
             ErrorCategory::kInvalidArgument, {"`cu_seqlens_q`: expected [batch + 1]"});
}

TEST(PrefillAttentionArgs, CuSeqlensValues) {
  expect_bad([](BadArgs& b) { b.cu_q[0] = 1; }, ErrorCategory::kInvalidArgument,
             {"`cu_seqlens_q`: expected 0 first, got 1"});
  expect_bad([](BadArgs& b) { b.cu_k[1] = 13; }, ErrorCategory::kInvalidArgument,
             {"`cu_seqlens_k`: expected non-decreasing offsets, got 13 then 12"});
  expect_bad([](BadArgs& b) { b.cu_q[2] = 11; }, ErrorCategory::kInvalidArgument,
             {"`cu_seqlens_q`: expected at most 10 (the tokens of `q`) last, got 11"});
  expect_bad([](BadArgs& b) { b.cu_k[2] = 13; }, ErrorCategory::kInvalidArgument,
             {"`cu_seqlens_k`: expected at most 12 (the tokens of `k`) last, got 13"});
}

TEST(PrefillAttentionArgs, MaxSeqlenTooSmall) {
  expect_bad([](BadArgs& b) { b.a.max_seqlen_q = 5; }, ErrorCategory::kInvalidArgument,
             {"`max_seqlen_q` (5) is smaller than the length 6 of sequence 1"});
  expect_bad([](BadArgs& b) { b.a.max_seqlen_k = 0; }, ErrorCategory::kInvalidArgument,
             {"`max_seqlen_k` (0) is smaller than the length 6 of sequence 0"});
  expect_bad([](BadArgs& b) { b.a.max_seqlen_q = -1; }, ErrorCategory::kInvalidArgument,
             {"expected max_seqlen_q and max_seqlen_k >= 0"});
}

TEST(PrefillAttentionArgs, BadOut) {
  expect_bad_view(&PrefillAttentionArgs::out, fake(DType::kF32, {10, 4, 128}),
                  ErrorCategory::kInvalidArgument, {"`out` dtype", "expected bf16", "got f32"});
  expect_bad_view(&PrefillAttentionArgs::out, fake(DType::kBF16, {10, 4, 192}),
                  ErrorCategory::kInvalidArgument, {"`out`: expected [10, 4, 128]"});
  expect_bad_view(
      &PrefillAttentionArgs::out, TensorView(kFake, DType::kBF16, {10, 4, 128}, {128, 0, 1}),
      ErrorCategory::kInvalidArgument, {"`out`: expected strides that keep every element apart"});
}

TEST(PrefillAttentionArgs, BadLse) {
  expect_bad_view(&PrefillAttentionArgs::lse, fake(DType::kF32, {4, 10}),
                  ErrorCategory::kInvalidArgument, {"`lse`: expected [10, 4]"});
  expect_bad_view(&PrefillAttentionArgs::lse, fake(DType::kBF16, {10, 4}),
                  ErrorCategory::kInvalidArgument, {"`lse` dtype", "expected f32", "got bf16"});
}

TEST(PrefillAttentionArgs, MissingDescaleForFp8) {
  expect_bad([](BadArgs& b) { b.a.k_descale = TensorView(); }, ErrorCategory::kInvalidArgument,
             {"`k_descale`: expected one f32 for FP8 inputs, got none"}, DType::kE4M3);
  expect_bad([](BadArgs& b) { b.a.v_descale = TensorView(&b.descale, DType::kBF16, {1}); },
             ErrorCategory::kInvalidArgument, {"`v_descale` dtype", "expected f32"}, DType::kE4M3);
}

// CUDA tensors here (no GPU, or a build without CUDA, or cuda:1 not being current): an error
// naming the device; mixed devices: an error naming the odd tensor.
TEST(PrefillAttentionArgs, CudaTensorsOffTheCurrentDevice) {
  BadArgs b;
  const Device gpu = Device::cuda(1);
  b.a.q = fake(DType::kBF16, {10, 4, 192}, gpu);
  b.a.k = fake(DType::kBF16, {12, 4, 192}, gpu);
  b.a.v = fake(DType::kBF16, {12, 4, 128}, gpu);
  b.a.out = fake(DType::kBF16, {10, 4, 128}, gpu);
  b.a.lse = fake(DType::kF32, {10, 4}, gpu);
  b.a.cu_seqlens_q = fake(DType::kI32, {3}, gpu);
  b.a.cu_seqlens_k = fake(DType::kI32, {3}, gpu);
  try {
    prefill_attention(b.a);
    ADD_FAILURE() << "expected an fp8mla::Error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("cuda"), std::string::npos) << e.message();
  }
  b.a.out = fake(DType::kBF16, {10, 4, 128});  // mixed devices
  expect_error([&] { prefill_attention(b.a); }, ErrorCategory::kInvalidArgument,
               {"`out`: expected a tensor on cuda:1"});
}

TEST(PrefillAttentionArgs, NonFiniteScale) {
  expect_bad([](BadArgs& b) { b.a.softmax_scale = std::numeric_limits<float>::quiet_NaN(); },
             ErrorCategory::kInvalidArgument, {"expected a finite softmax_scale"});
}

}  // namespace
}  // namespace fp8mla

namespace fp8mla {
namespace {

// ---- Kernel variant registry (fp8mla/kernel_registry.hpp) -----------------------------------

TEST(AttentionRegistry, WarmedKeysAreTheRuntimeKeys) {
  // The FP8 path's calls have e4m3 inputs whatever the model dtype: warming up the e4m3 keys
  // covers them, and the bf16 keys would not.
  AttentionNeeds needs;
  needs.dtypes = {DType::kE4M3};
  const std::vector<AttentionVariantKey> warmed = attention_keys(needs);
  ASSERT_EQ(warmed.size(), 2u);
  for (bool causal : {true, false}) {
    PrefillAttentionArgs call;
    call.q = fake(DType::kE4M3, {300, 128, 192});
    call.v = fake(DType::kE4M3, {500, 128, 128});
    call.causal = causal;
    const AttentionVariantKey runtime = attention_variant_key(call);
    EXPECT_EQ(runtime.dtype, DType::kE4M3);
    EXPECT_NE(std::find(warmed.begin(), warmed.end(), runtime), warmed.end()) << to_string(runtime);
  }
  needs.dtypes = {DType::kBF16};
  PrefillAttentionArgs fp8_call;
  fp8_call.q = fake(DType::kE4M3, {1, 1, 192});
  fp8_call.v = fake(DType::kE4M3, {1, 1, 128});
  const std::vector<AttentionVariantKey> bf16_keys = attention_keys(needs);
  EXPECT_EQ(std::find(bf16_keys.begin(), bf16_keys.end(), attention_variant_key(fp8_call)),
            bf16_keys.end());
  needs.non_causal = false;
  EXPECT_EQ(attention_keys(needs).size(), 1u);
  // A call that folds a prior state (a prefix chunk) runs a variant of its own.
  needs.dtypes = {DType::kE4M3};
  needs.non_causal_fold = true;
  const std::vector<AttentionVariantKey> with_fold = attention_keys(needs);
  PrefillAttentionArgs chunk;
  chunk.q = fake(DType::kE4M3, {300, 128, 192});
  chunk.v = fake(DType::kE4M3, {500, 128, 128});
  chunk.causal = false;
  chunk.prior_out = fake(DType::kBF16, {300, 128, 128});
  const AttentionVariantKey folding = attention_variant_key(chunk);
  EXPECT_TRUE(folding.folds_prior_state);
  EXPECT_EQ(with_fold.size(), 2u);
  EXPECT_NE(std::find(with_fold.begin(), with_fold.end(), folding), with_fold.end());
  EXPECT_EQ(to_string(folding), "e4m3fn non-causal Dqk 192 Dv 128 folding a prior state");
}

TEST(AttentionRegistry, CompiledVariantsAndMissesNameTheKeys) {
  const std::vector<AttentionVariantKey> compiled = compiled_attention_variants();
#if defined(FP8MLA_WITH_CUDA)
  EXPECT_EQ(compiled.size(), 6u);  // 4 + the two non-causal variants that fold a prior state
  EXPECT_NE(std::find(compiled.begin(), compiled.end(),
                      AttentionVariantKey{DType::kE4M3, true, 192, 128}),
            compiled.end());
  for (DType dtype : {DType::kE4M3, DType::kBF16}) {
    EXPECT_NE(std::find(compiled.begin(), compiled.end(),
                        AttentionVariantKey{dtype, false, 192, 128, true}),
              compiled.end());
  }
#else
  EXPECT_TRUE(compiled.empty());
#endif
  AttentionNeeds needs;
  needs.head_dim_qk = 128;  // not compiled
  expect_error([&] { warm_up_attention(needs); }, ErrorCategory::kUnsupported,
               {"needed (e4m3fn causal Dqk 128 Dv 128; e4m3fn non-causal Dqk 128 Dv 128)",
                "missing (e4m3fn causal Dqk 128 Dv 128;", "this build has ("});
  EXPECT_EQ(to_string(AttentionVariantKey{DType::kBF16, false, 192, 128}),
            "bf16 non-causal Dqk 192 Dv 128");
}

}  // namespace
}  // namespace fp8mla
