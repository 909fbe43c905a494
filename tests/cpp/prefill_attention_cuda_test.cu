// CUDA prefill_attention (Hopper kernel) against a float64 reference on the dequantized inputs,
// under the error rule of docs/design.md section 8: max |O - O_ref| <= 2 x the error of a BF16
// attention on the same dequantized inputs (scores, P and O rounded to bf16, as an eager bf16
// attention does) + the bf16 rounding noise of O; LSE within 1e-3. Outputs are poisoned first;
// every row of every sequence is checked for having been written, bytes around the views stay
// untouched; the reference is computed on all rows of small cases and on boundary and random rows
// of large ones. Also: all-ones V gives exactly 1, determinism over 100 runs, PDL on/off, layout
// errors, and e4m3 V token-major (transposed in shared memory by the kernel) giving the bytes of
// V transposed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "attention_reference.hpp"
#include "buffer_test_util.hpp"
#include "cuda/common/runtime.hpp"
#include "cuda_test_util.hpp"
#include "device_case_util.cuh"
#include "fp8mla/attention.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/kernel_registry.hpp"
#include "fp8mla/numerics.hpp"

namespace fp8mla {
namespace {

using test::bf16_round;
using test::DeviceBuffer;
using test::reference_row;
using test::RowRef;
using test::rows_to_check;

constexpr int kDqk = 192;
constexpr int kDv = 128;
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Case {
  std::vector<int> q_lens;
  std::vector<int> k_lens;  // empty: the q lengths
  int heads = 1;
  bool fp8 = true;
  bool causal = true;
  float descale[3] = {0.3f, 0.3f, 0.5f};  // q, k, v (e4m3 only)
  bool ones_v = false;
  bool strided = false;  // q, k (and bf16 v) as slices of wider rows
  // Elements added to out's head stride (twice to its token stride): 8 keeps the rows 8-byte
  // aligned (the kernel's vector stores), 2 does not (its 4-byte stores).
  int out_pad = 0;
  bool lse_transposed = false;
  bool v_token_major = false;  // e4m3: v token-major, as bf16's, instead of transposed
  bool shared_rope = false;    // every head's last 64 key dims are head 0's (MLA's K)

  std::string describe() const {
    std::string s = std::string(fp8 ? "e4m3" : "bf16") + (causal ? " causal" : " full") +
                    " H=" + std::to_string(heads) + " q=[";
    for (int n : q_lens) s += std::to_string(n) + " ";
    s += "] k=[";
    for (int n : (k_lens.empty() ? q_lens : k_lens)) s += std::to_string(n) + " ";
    return s + "]" + (strided ? " strided" : "") +
           (out_pad ? " out_pad=" + std::to_string(out_pad) : "") +
           (fp8 && v_token_major ? " v token-major" : "") + (shared_rope ? " shared rope" : "");
  }
};

// Inputs on the host (codes and dequantized values, logical [T, H, D]) and on the device.
struct Problem : test::AttentionInputs {  // the dequantized inputs, for the reference
  Case c;
  // Device storage and views.
  std::vector<DeviceBuffer> buffers;
  TensorView q_view, k_view, v_view, out_view, lse_view, cu_q_view, cu_k_view;
  TensorView k_rope_view;             // empty unless a test splits K
  std::vector<std::uint8_t> k_bytes;  // k's host bytes, rows of k_row elements
  std::int64_t k_row = 0;
  TensorView descale_views[3];
  std::int64_t out_token_stride = 0, out_head_stride = 0;
  std::int64_t out_elems = 0;

  DeviceBuffer& add(std::size_t bytes, std::uint8_t poison = test::kPoison) {
    buffers.emplace_back(std::max<std::size_t>(bytes, 16), poison);
    return buffers.back();
  }
};

// Random codes for [n, H, d] at element offsets t * ts + h * hs + i * ds of `codes`.
void fill(std::vector<std::uint8_t>& bytes, std::vector<double>& values, bool fp8, float descale,
          float range, bool ones, std::int64_t n, int heads, int d, std::int64_t ts,
          std::int64_t hs, std::int64_t ds, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-range, range);
  values.assign(std::size_t(n * heads * d), 0.0);
  for (std::int64_t t = 0; t < n; ++t) {
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < d; ++i) {
        const float x = ones ? 1.0f : dist(rng);
        const std::int64_t at = t * ts + h * hs + i * ds;
        double value;
        if (fp8) {
          const std::uint8_t code = encode_e4m3(x);
          bytes[std::size_t(at)] = code;
          value = double(decode_e4m3(code) * descale);
        } else {
          const std::uint16_t bits = encode_bf16(x);
          std::memcpy(&bytes[std::size_t(at) * 2], &bits, 2);
          value = double(decode_bf16(bits));
        }
        values[std::size_t((t * heads + h) * d + i)] = value;
      }
    }
  }
}

Problem make_problem(const Case& c, std::uint32_t seed) {
  Problem p;
  p.c = c;
  p.heads = c.heads;
  p.causal = c.causal;
  std::mt19937 rng(seed);
  const std::vector<int>& k_lens = c.k_lens.empty() ? c.q_lens : c.k_lens;
  for (std::size_t b = 0; b < c.q_lens.size(); ++b) {
    p.cu_q.push_back(p.cu_q.back() + c.q_lens[b]);
    p.cu_k.push_back(p.cu_k.back() + k_lens[b]);
  }
  p.tq = p.cu_q.back();
  p.tk = p.cu_k.back();
  const int H = c.heads;
  const DType dtype = c.fp8 ? DType::kE4M3 : DType::kBF16;
  const int eb = c.fp8 ? 1 : 2;
  const float dq = c.fp8 ? c.descale[0] : 1.0f, dk = c.fp8 ? c.descale[1] : 1.0f,
              dv = c.fp8 ? c.descale[2] : 1.0f;
  const float range = c.fp8 ? 8.0f : 2.4f;  // logits with a standard deviation of about 2

  // q and k: [T, H, 192], rows of 256 elements when strided (a slice of a wider projection).
  const std::int64_t row = c.strided ? 256 : kDqk;
  auto make_qk = [&](std::int64_t n, float descale, std::vector<double>& values, TensorView& view,
                     bool shared_rope) {
    std::vector<std::uint8_t> bytes(std::size_t(std::max<std::int64_t>(n * H * row, 1) * eb), 0);
    fill(bytes, values, c.fp8, descale, range, false, n, H, kDqk, H * row, row, 1, rng);
    for (std::int64_t t = 0; shared_rope && t < n; ++t) {
      for (int h = 1; h < H; ++h) {
        for (int i = kDqk - 64; i < kDqk; ++i) {
          const std::size_t from = std::size_t(t * H * row + i), to = from + std::size_t(h * row);
          std::memcpy(&bytes[to * eb], &bytes[from * eb], std::size_t(eb));
          values[std::size_t((t * H + h) * kDqk + i)] = values[std::size_t(t * H * kDqk + i)];
        }
      }
    }
    DeviceBuffer& buf = p.add(bytes.size());
    buf.upload(bytes.data());
    view = TensorView(buf.data(), dtype, {n, H, kDqk}, {H * row, row, 1}, Device::cuda(0));
    return bytes;
  };
  make_qk(p.tq, dq, p.q, p.q_view, false);
  p.k_bytes = make_qk(p.tk, dk, p.k, p.k_view, c.shared_rope);
  p.k_row = row;

  // v: e4m3 transposed [H][128][tk rounded up to 16] (or token-major); bf16 token-major. The
  // values depend on the seed alone, not on the layout.
  {
    std::int64_t ts, hs, ds, elems;
    if (c.fp8 && !c.v_token_major) {
      const std::int64_t pitch = (p.tk + 15) / 16 * 16 + (c.strided ? 32 : 0);
      ts = 1, ds = pitch, hs = kDv * pitch, elems = H * hs;
    } else {
      const std::int64_t vrow = c.strided ? 256 : kDv;
      ts = H * vrow, hs = vrow, ds = 1, elems = p.tk * ts;
    }
    std::vector<std::uint8_t> bytes(std::size_t(std::max<std::int64_t>(elems, 1) * eb), 0);
    fill(bytes, p.v, c.fp8, dv, range, c.ones_v, p.tk, H, kDv, ts, hs, ds, rng);
    DeviceBuffer& buf = p.add(bytes.size());
    buf.upload(bytes.data());
    p.v_view = TensorView(buf.data(), dtype, {p.tk, H, kDv}, {ts, hs, ds}, Device::cuda(0));
  }

  // out: poisoned, with padded strides; lse poisoned, maybe transposed.
  p.out_head_stride = kDv + c.out_pad;
  p.out_token_stride = H * p.out_head_stride + 2 * c.out_pad;
  p.out_elems = std::max<std::int64_t>(p.tq * p.out_token_stride, 1);
  DeviceBuffer& out = p.add(std::size_t(p.out_elems * 2));
  p.out_view = TensorView(out.data(), DType::kBF16, {p.tq, H, kDv},
                          {p.out_token_stride, p.out_head_stride, 1}, Device::cuda(0));
  DeviceBuffer& lse = p.add(std::size_t(p.tq * H * 4));
  p.lse_view = c.lse_transposed
                   ? TensorView(lse.data(), DType::kF32, {p.tq, H}, {1, p.tq}, Device::cuda(0))
                   : TensorView(lse.data(), DType::kF32, {p.tq, H}, {H, 1}, Device::cuda(0));

  const std::int64_t batch = std::int64_t(c.q_lens.size());
  DeviceBuffer& cu_q = p.add(p.cu_q.size() * 4);
  cu_q.upload(p.cu_q.data());
  DeviceBuffer& cu_k = p.add(p.cu_k.size() * 4);
  cu_k.upload(p.cu_k.data());
  p.cu_q_view = TensorView(cu_q.data(), DType::kI32, {batch + 1}, Device::cuda(0));
  p.cu_k_view = TensorView(cu_k.data(), DType::kI32, {batch + 1}, Device::cuda(0));
  const float descales[3] = {dq, dk, dv};
  for (int i = 0; i < 3; ++i) {
    DeviceBuffer& d = p.add(4);
    d.upload(&descales[i]);
    p.descale_views[i] = TensorView(d.data(), DType::kF32, {1}, Device::cuda(0));
  }
  return p;
}

PrefillAttentionArgs args_of(const Problem& p) {
  PrefillAttentionArgs a;
  a.q = p.q_view;
  a.k = p.k_view;
  a.k_rope = p.k_rope_view;
  a.v = p.v_view;
  a.cu_seqlens_q = p.cu_q_view;
  a.cu_seqlens_k = p.cu_k_view;
  a.max_seqlen_q = p.c.q_lens.empty() ? 0 : *std::max_element(p.c.q_lens.begin(), p.c.q_lens.end());
  const std::vector<int>& k_lens = p.c.k_lens.empty() ? p.c.q_lens : p.c.k_lens;
  a.max_seqlen_k = k_lens.empty() ? 0 : *std::max_element(k_lens.begin(), k_lens.end());
  a.softmax_scale = float(1.0 / std::sqrt(double(kDqk)));
  a.causal = p.c.causal;
  if (p.c.fp8) {
    a.q_descale = p.descale_views[0];
    a.k_descale = p.descale_views[1];
    a.v_descale = p.descale_views[2];
  }
  a.out = p.out_view;
  a.lse = p.lse_view;
  return a;
}

struct Outputs {
  std::vector<std::uint8_t> out, lse;
};

// Runs the op into freshly poisoned outputs, asking for the LSE or not.
Outputs run(Problem& p, bool with_lse = true) {
  p.buffers[3].fill(test::kPoison);
  p.buffers[4].fill(test::kPoison);
  PrefillAttentionArgs a = args_of(p);
  if (!with_lse) a.lse = TensorView();
  prefill_attention(a);
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  // out and lse are buffers 3 and 4 (after q, k, v).
  for (const DeviceBuffer& b : p.buffers) EXPECT_TRUE(b.guards_intact());
  return {p.buffers[3].download(), p.buffers[4].download()};
}

float out_at(const Problem& p, const Outputs& o, std::int64_t t, int h, int d) {
  std::uint16_t bits;
  std::memcpy(&bits, &o.out[std::size_t((t * p.out_token_stride + h * p.out_head_stride + d) * 2)],
              2);
  return decode_bf16(bits);
}

float lse_at(const Problem& p, const Outputs& o, std::int64_t t, int h) {
  const std::int64_t at = p.c.lse_transposed ? t + h * p.tq : t * p.c.heads + h;
  float x;
  std::memcpy(&x, &o.lse[std::size_t(at * 4)], 4);
  return x;
}

// Every row of every sequence written (finite O, LSE finite or -inf), bytes outside the out view
// still poison. Without an LSE asked for, the LSE buffer must be all poison.
void expect_written_in_full(const Problem& p, const Outputs& o, bool with_lse = true) {
  std::vector<bool> in_view(std::size_t(p.out_elems), false);
  std::int64_t bad = 0;
  for (std::int64_t t = 0; t < p.tq; ++t) {
    for (int h = 0; h < p.c.heads; ++h) {
      for (int d = 0; d < kDv; ++d) {
        in_view[std::size_t(t * p.out_token_stride + h * p.out_head_stride + d)] = true;
        bad += !std::isfinite(out_at(p, o, t, h, d));
      }
      if (!with_lse) continue;
      const float lse = lse_at(p, o, t, h);
      bad += !(std::isfinite(lse) || lse == -std::numeric_limits<float>::infinity());
    }
  }
  EXPECT_EQ(bad, 0) << "non-finite or unwritten outputs";
  if (!with_lse) {
    EXPECT_EQ(std::count(o.lse.begin(), o.lse.end(), test::kPoison), std::ptrdiff_t(o.lse.size()))
        << "LSE written though not asked for";
  }
  std::int64_t touched = 0;
  for (std::int64_t e = 0; e < p.out_elems; ++e) {
    if (in_view[std::size_t(e)]) continue;
    touched += o.out[std::size_t(2 * e)] != test::kPoison ||
               o.out[std::size_t(2 * e + 1)] != test::kPoison;
  }
  EXPECT_EQ(touched, 0) << "elements outside the out view were written";
}

// K given as its per-head dims [Tk, H, 128] and the shared last 64 once per key (k_rope): the
// bytes of the full K that holds those 64 in every head. The per-head view's own rows carry
// noise past dim 128 (a kernel reading them would differ); k_rope is [Tk, 64] with a padded
// token stride or [Tk, 1, 64].
void split_k(Problem& p, bool three_dims) {
  const int H = p.c.heads, eb = p.c.fp8 ? 1 : 2;
  const DType dtype = p.c.fp8 ? DType::kE4M3 : DType::kBF16;
  std::vector<std::uint8_t> nope = p.k_bytes;
  std::mt19937 rng(5);
  for (std::int64_t t = 0; t < p.tk; ++t) {
    for (int h = 0; h < H; ++h) {
      for (int b = (kDqk - 64) * eb; b < kDqk * eb; ++b) {
        nope[std::size_t((t * H + h) * p.k_row * eb + b)] = std::uint8_t(rng() % 0x70);
      }
    }
  }
  DeviceBuffer& nope_buf = p.add(nope.size());
  nope_buf.upload(nope.data());
  p.k_view = TensorView(nope_buf.data(), dtype, {p.tk, H, kDqk - 64}, {H * p.k_row, p.k_row, 1},
                        Device::cuda(0));
  const std::int64_t pitch = three_dims ? 64 : 64 + 32 / eb;  // elements a key
  std::vector<std::uint8_t> rope(std::size_t(std::max<std::int64_t>(p.tk, 1) * pitch * eb), 0x3C);
  for (std::int64_t t = 0; t < p.tk; ++t) {
    std::memcpy(&rope[std::size_t(t * pitch * eb)],
                &p.k_bytes[std::size_t((t * H * p.k_row + kDqk - 64) * eb)], std::size_t(64 * eb));
  }
  DeviceBuffer& rope_buf = p.add(rope.size());
  rope_buf.upload(rope.data());
  p.k_rope_view =
      three_dims
          ? TensorView(rope_buf.data(), dtype, {p.tk, 1, 64}, {pitch, 64, 1}, Device::cuda(0))
          : TensorView(rope_buf.data(), dtype, {p.tk, 64}, {pitch, 1}, Device::cuda(0));
}

// The error rule on case c's rows; with split_rope, K given as k and k_rope (split_k).
void expect_error_rule(const Case& c, std::uint32_t seed = 7, bool split_rope = false) {
  SCOPED_TRACE(c.describe());
  Problem p = make_problem(c, seed);
  if (split_rope) split_k(p, false);
  const Outputs o = run(p);
  expect_written_in_full(p, o);
  // e4m3 without an LSE runs a cheaper loop (one Q K^T accumulator): its O meets the rule too.
  const Outputs o_no_lse = run(p, false);
  expect_written_in_full(p, o_no_lse, false);
  std::mt19937 rng(seed + 1);
  double err = 0.0, err_no_lse = 0.0, err_bf = 0.0, noise = 0.0, lse_err = 0.0;
  std::int64_t rows = 0;
  for (const auto& [t, h] : rows_to_check(p, rng)) {
    const RowRef r = reference_row(p, t, h);
    ++rows;
    for (int d = 0; d < kDv; ++d) {
      const double ref = r.o[std::size_t(d)];
      err = std::max(err, std::abs(double(out_at(p, o, t, h, d)) - ref));
      err_no_lse = std::max(err_no_lse, std::abs(double(out_at(p, o_no_lse, t, h, d)) - ref));
      err_bf = std::max(err_bf, std::abs(r.o_bf[std::size_t(d)] - ref));
      noise = std::max(noise, std::abs(bf16_round(bf16_round(ref + 0.3) - 0.3) - ref));
    }
    const double lse = lse_at(p, o, t, h);
    if (r.lse == -kInf) {
      EXPECT_EQ(lse, -kInf) << "row " << t << " head " << h << " sees no key";
      for (int d = 0; d < kDv; ++d) ASSERT_EQ(out_at(p, o, t, h, d), 0.0f);
    } else {
      lse_err = std::max(lse_err, std::abs(lse - r.lse));
    }
  }
  const double bound = 2.0 * err_bf + 2.0 * noise;
  EXPECT_LE(err, bound) << "max |O - ref| " << err << ", BF16 attention " << err_bf << ", noise "
                        << noise << " over " << rows << " rows";
  EXPECT_LE(err_no_lse, bound) << "without an LSE: max |O - ref| " << err_no_lse;
  EXPECT_LE(lse_err, 1e-3);
  std::printf(
      "[ rule     ] %s: err %.3g (no LSE %.3g), bf16 %.3g, bound %.3g, lse %.2g, %lld rows\n",
      c.describe().c_str(), err, err_no_lse, err_bf, bound, lse_err, static_cast<long long>(rows));
}

class PrefillCuda : public ::testing::TestWithParam<bool> {  // param: fp8
 protected:
  // Sequences of these query and key lengths (no key lengths: the query ones), FP8 as the param.
  Case batch(std::vector<int> q_lens, std::vector<int> k_lens, int heads) const {
    Case c;
    c.q_lens = std::move(q_lens);
    c.k_lens = std::move(k_lens);
    c.heads = heads;
    c.fp8 = GetParam();
    return c;
  }
};

TEST_P(PrefillCuda, SingleSequencesMeetTheErrorRule) {
  FP8MLA_REQUIRE_HOPPER();
  for (bool causal : {true, false}) {
    for (int n : {1, 2, 63, 64, 65, 127, 128, 129, 1000, 4096, 16384}) {
      Case c = batch({n}, {}, n <= 1000 ? 4 : 1);
      c.causal = causal;
      expect_error_rule(c, std::uint32_t(n));
    }
  }
}

TEST_P(PrefillCuda, RaggedBatchWithEmptyAndShortSequences) {
  FP8MLA_REQUIRE_HOPPER();
  for (bool causal : {true, false}) {
    Case c = batch({0, 1, 700, 0, 129, 1, 300}, {}, 16);
    c.causal = causal;
    c.out_pad = causal ? 0 : 2;  // rows not 16-byte aligned: the 4-byte stores
    expect_error_rule(c);
  }
}

TEST_P(PrefillCuda, PrefixLongerThanExtendCausal) {
  FP8MLA_REQUIRE_HOPPER();
  Case c = batch({100, 300, 1, 64}, {612, 1300, 1, 64 + 2000}, 16);
  expect_error_rule(c);
  // k_len < q_len: the first rows see no key (O = 0, LSE = -inf).
  c.q_lens = {300, 50};
  c.k_lens = {100, 0};
  expect_error_rule(c);
}

TEST_P(PrefillCuda, ManyHeadsStridedViewsTransposedLse) {
  FP8MLA_REQUIRE_HOPPER();
  Case c = batch({333, 1000}, {}, 128);
  c.strided = true;
  c.out_pad = 8;
  c.lse_transposed = true;
  expect_error_rule(c);
}

// 64 heads over 4100 keys: the tile order takes the heads in L2 sections (e4m3: 7, then 19
// each; bf16: 1, then 9 each), every sequence's blocks last to first within one.
TEST_P(PrefillCuda, HeadSectionsOfTheTileOrder) {
  FP8MLA_REQUIRE_HOPPER();
  Case c = batch({200, 1, 130}, {2000, 1500, 600}, 64);
  expect_error_rule(c);
}

TEST_P(PrefillCuda, AllOnesVGivesExactlyOne) {
  FP8MLA_REQUIRE_HOPPER();
  for (bool token_major : {false, true}) {
    if (token_major && !GetParam()) continue;  // bf16 V is token-major anyway
    Case c = batch({5, 700}, {3, 900}, 8);
    c.descale[2] = 1.0f;
    c.ones_v = true;
    c.v_token_major = token_major;
    SCOPED_TRACE(c.describe());
    Problem p = make_problem(c, 3);
    const Outputs o = run(p);
    // Sequence 0 (5 queries, 3 keys, causal): its first two rows see no key and give 0.
    std::int64_t wrong = 0;
    for (std::int64_t t = 0; t < p.tq; ++t) {
      const float expected = t < 2 ? 0.0f : 1.0f;
      for (int h = 0; h < c.heads; ++h) {
        for (int d = 0; d < kDv; ++d) wrong += out_at(p, o, t, h, d) != expected;
      }
    }
    EXPECT_EQ(wrong, 0);
  }
}

// Without an LSE the e4m3 kernel runs a cheaper loop (no f32 row sum, O normalized by the ones
// columns; Q K^T in one accumulator instead of three), so its O differs in the last bits and must
// meet the error rule on its own; bf16 runs the same loop either way and keeps the same bits.
// Neither writes the LSE buffer.
TEST_P(PrefillCuda, WithoutLseMeetsTheRuleAndWritesNoLse) {
  FP8MLA_REQUIRE_HOPPER();
  for (bool causal : {true, false}) {
    Case c = batch({1000, 0, 129, 1}, {1300, 5, 129, 0}, 16);
    c.causal = causal;
    if (c.fp8) {
      expect_error_rule(c, 13);  // runs both loops against one reference
      continue;
    }
    SCOPED_TRACE(c.describe());
    Problem p = make_problem(c, 13);
    const Outputs with_lse = run(p);
    const Outputs without = run(p, false);
    expect_written_in_full(p, without, false);
    EXPECT_EQ(without.out, with_lse.out);
  }
}

TEST_P(PrefillCuda, DeterministicOver100RunsAndPdlOnOff) {
  FP8MLA_REQUIRE_HOPPER();
  Case c = batch({1000, 37}, {}, 16);
  Problem p = make_problem(c, 11);
  const Outputs first = run(p);
  // 100 back-to-back launches; fewer under the sanitizers (FP8MLA_RERUNS): racecheck's host
  // memory grew past the H200 host's 125 GiB within 100 queued e4m3 launches.
  const std::size_t runs = std::min<std::size_t>(100, test::rerun_count());
  for (std::size_t i = 0; i < runs; ++i) prefill_attention(args_of(p));
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  EXPECT_EQ(p.buffers[3].download(), first.out);
  EXPECT_EQ(p.buffers[4].download(), first.lse);
  for (bool pdl : {false, true}) {
    test::PdlScope scope(pdl);
    const Outputs again = run(p);
    EXPECT_EQ(again.out, first.out) << "pdl " << pdl;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, PrefillCuda, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "e4m3" : "bf16"; });

// e4m3 V token-major: the kernel transposes each tile in shared memory into the bytes the
// transposed load writes, so on the same values O and the LSE must be bit-identical to V given
// transposed (with an LSE and without, whose loop differs), and meet the error rule on their own.
// Shapes: causal and not; ragged with lengths off 16 and 128 (sequences starting mid-group, key
// tiles reaching past the end); a prefix (k_len > q_len) and k_len < q_len; H = 16 and 128;
// strided views; one long sequence (every ring stage many times over, O's promotions).
// "" when a and b hold the same bytes; else how many differ and where the first does.
std::string byte_difference(const std::vector<std::uint8_t>& a,
                            const std::vector<std::uint8_t>& b) {
  if (a.size() != b.size())
    return "sizes " + std::to_string(a.size()) + ", " + std::to_string(b.size());
  std::size_t count = 0, first = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    if (count++ == 0) first = i;
  }
  return count == 0 ? ""
                    : std::to_string(count) + " bytes differ, first at " + std::to_string(first);
}

// After cudaDeviceReset the kernels live in a new context: their handles and their opt-in shared
// memory size (set once on the old one) must follow, and the same inputs give the same bytes.
TEST_P(PrefillCuda, SameBytesAfterTheContextIsRecreated) {
  FP8MLA_REQUIRE_HOPPER();
  const Case c = batch({300, 77}, {500, 77}, 16);
  Outputs first;
  {
    Problem p = make_problem(c, 23);
    first = run(p);
  }
  for (int life = 0; life < 2; ++life) {
    cuda::check(cudaDeviceReset(), "cudaDeviceReset");
    Problem p = make_problem(c, 23);
    const Outputs again = run(p);
    EXPECT_EQ(byte_difference(again.out, first.out), "") << "life " << life;
    EXPECT_EQ(byte_difference(again.lse, first.lse), "") << "life " << life;
  }
}

// Calls in turn on two problems of one shape, and on one problem with and without the LSE (for
// e4m3 another kernel, whose bytes differ): each call writes its own outputs with its own inputs
// (the launch reuses the last call's kernel parameters only for the same arguments).
TEST_P(PrefillCuda, CallsInTurnWriteEachTheirOwnOutputs) {
  FP8MLA_REQUIRE_HOPPER();
  const Case c = batch({300, 77}, {500, 77}, 16);
  Problem a = make_problem(c, 31);
  Problem b = make_problem(c, 32);
  const Outputs a_first = run(a);
  const Outputs a_first_no_lse = run(a, /*with_lse=*/false);
  const Outputs b_first = run(b);
  ASSERT_NE(byte_difference(a_first.out, b_first.out), "");
  for (int turn = 0; turn < 2; ++turn) {
    EXPECT_EQ(byte_difference(run(a).out, a_first.out), "") << "turn " << turn;
    EXPECT_EQ(byte_difference(run(b).out, b_first.out), "") << "turn " << turn;
    const Outputs a_no_lse = run(a, /*with_lse=*/false);
    EXPECT_EQ(byte_difference(a_no_lse.out, a_first_no_lse.out), "") << "turn " << turn;
    EXPECT_EQ(a_no_lse.lse, std::vector<std::uint8_t>(a_no_lse.lse.size(), test::kPoison))
        << "turn " << turn << ": the LSE was written without being asked for";
  }
}

// A batch of the byte-equality tests: sequence lengths, heads, masking, strided q and k.
struct Shape {
  std::vector<int> q_lens, k_lens;
  int heads;
  bool causal, strided;
};

Case case_of(const Shape& shape) {
  Case c;
  c.q_lens = shape.q_lens;
  c.k_lens = shape.k_lens;
  c.heads = shape.heads;
  c.causal = shape.causal;
  c.strided = shape.strided;
  return c;
}

TEST(PrefillCudaVLayouts, TokenMajorVGivesTheBytesOfTransposedV) {
  FP8MLA_REQUIRE_HOPPER();
  const Shape shapes[] = {
      {{1000}, {}, 16, true, false},
      {{1000}, {}, 16, false, false},
      {{0, 1, 700, 0, 129, 1, 300}, {}, 16, true, false},
      {{0, 1, 700, 0, 129, 1, 300}, {}, 16, false, true},
      {{100, 300, 1, 64}, {612, 1300, 1, 64 + 2000}, 16, true, false},
      {{300, 50}, {100, 0}, 16, true, false},
      {{333, 1000}, {}, 128, true, true},
      {{333, 77}, {1333, 77}, 128, false, false},
      {{4096}, {}, 1, true, false},
  };
  std::uint32_t seed = 21;
  for (const Shape& shape : shapes) {
    Case c = case_of(shape);
    c.lse_transposed = shape.heads == 128;
    Case tm = c;
    tm.v_token_major = true;
    SCOPED_TRACE(tm.describe());
    Problem transposed = make_problem(c, seed);
    Problem token_major = make_problem(tm, seed);
    ASSERT_EQ(transposed.v, token_major.v);  // the same values, laid out two ways
    ASSERT_EQ(token_major.v_view.stride(2), 1);
    ASSERT_EQ(transposed.v_view.stride(0), 1);
    for (bool with_lse : {true, false}) {
      const Outputs a = run(transposed, with_lse);
      const Outputs b = run(token_major, with_lse);
      expect_written_in_full(token_major, b, with_lse);
      EXPECT_EQ(byte_difference(a.out, b.out), "") << "O, with_lse " << with_lse;
      if (with_lse) EXPECT_EQ(byte_difference(a.lse, b.lse), "") << "LSE";
    }
    expect_error_rule(tm, seed);
    ++seed;
  }
}

TEST(PrefillCudaSplitK, KRopeGivesTheBytesOfKWithRopeInEveryHead) {
  FP8MLA_REQUIRE_HOPPER();
  // Key counts that are and are not multiples of 16 (e4m3's tail map), prefixes, empty sequences.
  const Shape shapes[] = {
      {{1000}, {}, 16, true, false},
      {{0, 1, 700, 0, 129, 1, 300}, {}, 16, false, true},
      {{100, 300, 1, 64}, {612, 1300, 1, 64 + 2000}, 16, true, false},
      {{333, 77}, {1333, 77}, 128, true, true},
      {{4096}, {}, 1, true, false},
  };
  std::uint32_t seed = 41;
  for (bool fp8 : {true, false}) {
    for (const Shape& shape : shapes) {
      Case c = case_of(shape);
      c.fp8 = fp8;
      c.shared_rope = true;
      SCOPED_TRACE(c.describe());
      Problem whole = make_problem(c, seed);
      Problem split = make_problem(c, seed);
      split_k(split, /*three_dims=*/seed % 2 == 0);
      for (bool with_lse : {true, false}) {
        const Outputs a = run(whole, with_lse);
        const Outputs b = run(split, with_lse);
        expect_written_in_full(split, b, with_lse);
        EXPECT_EQ(byte_difference(a.out, b.out), "") << "O, with_lse " << with_lse;
        if (with_lse) EXPECT_EQ(byte_difference(a.lse, b.lse), "") << "LSE";
      }
      ++seed;
    }
    Case c;  // and the error rule for one ragged batch with prefixes
    c.q_lens = {100, 300, 1, 64};
    c.k_lens = {612, 1300, 1, 64 + 2000};
    c.heads = 8;
    c.fp8 = fp8;
    c.shared_rope = true;
    expect_error_rule(c, seed, /*split_rope=*/true);
  }
}

TEST(PrefillCudaArgs, LayoutAndVariantErrors) {
  FP8MLA_REQUIRE_HOPPER();
  Case c;
  c.q_lens = {64};
  c.heads = 2;
  Problem p = make_problem(c, 1);
  auto expect_error = [&](const PrefillAttentionArgs& a, const std::string& needle) {
    try {
      prefill_attention(a);
      ADD_FAILURE() << "no error; expected one mentioning: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // e4m3 V token-major is taken (TokenMajorVGivesTheBytesOfTransposedV), but TMA steps over its
  // tokens: a token stride that is not a multiple of 16 bytes is an error naming the stride.
  PrefillAttentionArgs a = args_of(p);
  DeviceBuffer v_tm(std::size_t(64 * (2 * kDv + 8)));
  a.v = TensorView(v_tm.data(), DType::kE4M3, {64, 2, kDv}, {2 * kDv + 8, kDv, 1}, Device::cuda(0));
  expect_error(a, "`v`: expected dim 0's stride to be a multiple of 16 bytes, got 264 elements");
  // Transposed e4m3 V steps over dims: a dim stride (token pitch) of 72 keys is one.
  DeviceBuffer v_t(std::size_t(2 * kDv * 72));
  a.v = TensorView(v_t.data(), DType::kE4M3, {64, 2, kDv}, {1, kDv * 72, 72}, Device::cuda(0));
  expect_error(a, "`v`: expected dim 2's stride to be a multiple of 16 bytes, got 72 elements");
  // A head dim without a compiled variant names the compiled ones.
  a = args_of(p);
  a.q = TensorView(p.q_view.data(), DType::kE4M3, {64, 2, 128}, {2 * 192, 192, 1}, Device::cuda(0));
  a.k = TensorView(p.k_view.data(), DType::kE4M3, {64, 2, 128}, {2 * 192, 192, 1}, Device::cuda(0));
  expect_error(a, "e4m3fn causal Dqk 192 Dv 128");
  // A q token stride that is not a multiple of 16 bytes.
  a = args_of(p);
  a.q = TensorView(p.q_view.data(), DType::kE4M3, {64, 2, kDqk}, {2 * kDqk + 8, kDqk, 1},
                   Device::cuda(0));
  expect_error(a, "multiple of 16 bytes");
  // max_seqlen_q that no offsets allow (one sequence of 64 queries).
  a = args_of(p);
  a.max_seqlen_q = 32;
  expect_error(a, "cannot bound 1 sequences of 64 queries");
  // Nothing was written by the failed calls.
  const std::vector<std::uint8_t> out = p.buffers[3].download();
  EXPECT_TRUE(
      std::all_of(out.begin(), out.end(), [](std::uint8_t b) { return b == test::kPoison; }));
}

// warm_up_attention sets up every variant a configuration can ask for; calls then find them.
TEST(PrefillCudaArgs, WarmUpPreparesTheNeededVariants) {
  FP8MLA_REQUIRE_HOPPER();
  AttentionNeeds needs;
  needs.dtypes = {DType::kE4M3, DType::kBF16};
  EXPECT_NO_THROW(warm_up_attention(needs));
}

}  // namespace
}  // namespace fp8mla
