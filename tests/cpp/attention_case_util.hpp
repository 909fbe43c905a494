// prefill_attention and the fused-output merge as cases of the shared form (specs, init, run,
// describe; buffer_test_util.hpp), for the rerun, graph, batch and PDL tests: a ragged batch whose
// sequences take their data from their own seeds, so that one sequence has the same input bytes
// alone and inside any batch.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "buffer_test_util.hpp"
#include "fp8mla/attention.hpp"
#include "fp8mla/numerics.hpp"
#include "fp8mla/output_quant.hpp"
#include "merge_states_test_util.hpp"

namespace fp8mla::test {

inline constexpr std::int64_t kCaseDqk = 192, kCaseDv = 128;

// Buffers: 0 q, 1 k, 2 v, 3 cu_seqlens_q, 4 cu_seqlens_k, 5 descales (q, k, v), 6 out, 7 lse,
// 8 output scale (f32 block scales [Tq, H] of a fused fp8_group128 output, or the fp8_static
// scale; unused otherwise); with `fold`, 9 prior_out bf16 [Tq, H, 128] and 10 prior_lse f32
// [Tq, H], each sequence's rows from its own seed (some LSEs -inf). q, k and token-major v are
// token-major [T, H, D]; e4m3 v is transposed ([H][128][pitch] memory) unless v_token_major.
struct PrefillCase {
  bool fp8 = true;
  bool causal = true;
  bool with_lse = true;
  bool v_token_major = false;  // e4m3 only; bf16 V is always token-major
  std::int64_t heads = 16;
  std::vector<int> q_lens = {130, 1, 77, 64};
  std::vector<int> k_lens;                       // empty: q_lens
  std::vector<std::uint64_t> seq_seeds;          // empty: seed * 1000 + b
  OutputQuantKey quant = OutputQuantKey::kNone;  // or kFp8Group128, kFp8Static
  bool fold = false;                             // fold a prior state (CUDA: non-causal only)
  std::uint64_t seed = 1;

  const std::vector<int>& keys() const { return k_lens.empty() ? q_lens : k_lens; }
  std::int64_t tq() const { return std::accumulate(q_lens.begin(), q_lens.end(), std::int64_t{0}); }
  std::int64_t tk() const { return std::accumulate(keys().begin(), keys().end(), std::int64_t{0}); }
  DType dtype() const { return fp8 ? DType::kE4M3 : DType::kBF16; }
  bool v_transposed() const { return fp8 && !v_token_major; }
  std::int64_t v_pitch() const { return round_up(std::max<std::int64_t>(tk(), 1), 16); }
  std::uint64_t seq_seed(std::size_t b) const {
    return seq_seeds.empty() ? seed * 1000 + b : seq_seeds[b];
  }

  std::vector<Spec> specs() const {
    const std::int64_t h = heads, q = tq(), k = tk(), b = std::int64_t(q_lens.size());
    const Spec v = v_transposed() ? Spec{DType::kE4M3,
                                         {k, h, kCaseDv},
                                         {1, kCaseDv * v_pitch(), v_pitch()},
                                         0,
                                         h * kCaseDv * v_pitch()}
                                  : dense(dtype(), {k, h, kCaseDv});
    const Spec out = quant == OutputQuantKey::kNone ? dense(DType::kBF16, {q, h, kCaseDv})
                                                    : dense(DType::kE4M3, {q, h * kCaseDv});
    const Spec scale = quant == OutputQuantKey::kFp8Group128 ? dense(DType::kF32, {q, h})
                                                             : dense(DType::kF32, {1});
    std::vector<Spec> s = {dense(dtype(), {q, h, kCaseDqk}),
                           dense(dtype(), {k, h, kCaseDqk}),
                           v,
                           dense(DType::kI32, {b + 1}),
                           dense(DType::kI32, {b + 1}),
                           dense(DType::kF32, {3}),
                           out,
                           dense(DType::kF32, {q, h}),
                           scale};
    if (fold) {
      s.push_back(dense(DType::kBF16, {q, h, kCaseDv}));
      s.push_back(dense(DType::kF32, {q, h}));
    }
    return s;
  }

  // Sequence b's rows [first, first + n) of the prior state: O in (-3, 3), LSE in (-2, 6) with
  // every seventh -inf (an empty state).
  void fill_prior(std::vector<HostBuffer>& b, const std::vector<Spec>& s, std::int64_t first,
                  std::int64_t n, std::uint64_t seq_seed) const {
    Rng rng(seq_seed);
    for (std::int64_t t = first; t < first + n; ++t) {
      for (std::int64_t h = 0; h < heads; ++h) {
        for (std::int64_t i = 0; i < kCaseDv; ++i) {
          store_f32(b[9].data(), DType::kBF16, at(s[9], t, h, i), (rng.uniform() * 2 - 1) * 3);
        }
        const float lse =
            rng.below(7) == 0 ? -std::numeric_limits<float>::infinity() : rng.uniform() * 8 - 2;
        std::memcpy(b[10].data() + 4 * (s[10].offset + t * s[10].strides[0] + h), &lse, 4);
      }
    }
  }

  // Element (t, h, i) of a token-major or transposed [T, H, D] spec.
  static std::int64_t at(const Spec& s, std::int64_t t, std::int64_t h, std::int64_t i) {
    return s.offset + t * s.strides[0] + h * s.strides[1] + i * s.strides[2];
  }

  // Sequence b's tokens [first, first + n) of q, k or v: uniform values, e4m3 codes of
  // [-8, 8] or bf16 of [-2.4, 2.4] (logits with a standard deviation of about 2).
  void fill_sequence(HostBuffer& buffer, const Spec& s, std::int64_t first, std::int64_t n,
                     std::int64_t dim, std::uint64_t seq_seed) const {
    Rng rng(seq_seed);
    const float range = fp8 ? 8.0f : 2.4f;
    for (std::int64_t t = 0; t < n; ++t) {
      for (std::int64_t h = 0; h < heads; ++h) {
        for (std::int64_t i = 0; i < dim; ++i) {
          const float x = (rng.uniform() * 2.0f - 1.0f) * range;
          const std::int64_t e = at(s, first + t, h, i);
          if (fp8) {
            buffer.data()[e] = encode_e4m3(x);
          } else {
            store_f32(buffer.data(), DType::kBF16, e, x);
          }
        }
      }
    }
  }

  void init(std::vector<HostBuffer>& b) const {
    const std::vector<Spec> s = specs();
    // Bytes no view element covers (transposed V's pitch padding) get batch-dependent noise: a
    // kernel that read them would not give a sequence the same bytes in another batch.
    Rng noise(seed * 77 + std::uint64_t(q_lens.size()));
    for (std::size_t i = 0; i < b[2].bytes(); ++i) b[2].data()[i] = std::uint8_t(noise.below(0x7F));
    std::vector<std::int32_t> cu_q{0}, cu_k{0};
    for (std::size_t q = 0; q < q_lens.size(); ++q) {
      const std::uint64_t ss = seq_seed(q);
      fill_sequence(b[0], s[0], cu_q.back(), q_lens[q], kCaseDqk, ss * 3 + 0);
      fill_sequence(b[1], s[1], cu_k.back(), keys()[q], kCaseDqk, ss * 3 + 1);
      fill_sequence(b[2], s[2], cu_k.back(), keys()[q], kCaseDv, ss * 3 + 2);
      if (fold) fill_prior(b, s, cu_q.back(), q_lens[q], ss * 7 + 5);
      cu_q.push_back(cu_q.back() + q_lens[q]);
      cu_k.push_back(cu_k.back() + keys()[q]);
    }
    std::memcpy(b[3].data(), cu_q.data(), cu_q.size() * 4);
    std::memcpy(b[4].data(), cu_k.data(), cu_k.size() * 4);
    const float descales[3] = {0.3f, 0.3f, 0.5f};
    std::memcpy(b[5].data(), descales, sizeof descales);
    const float static_scale = 50.0f;  // |o| < 4: some outputs saturate
    if (quant == OutputQuantKey::kFp8Static) std::memcpy(b[8].data(), &static_scale, 4);
  }

  PrefillAttentionArgs args(std::span<void* const> bases, Device device) const {
    const std::vector<Spec> s = specs();
    const auto v = [&](int i) { return s[std::size_t(i)].view(bases[std::size_t(i)], device); };
    PrefillAttentionArgs a;
    a.q = v(0);
    a.k = v(1);
    a.v = v(2);
    a.cu_seqlens_q = v(3);
    a.cu_seqlens_k = v(4);
    a.max_seqlen_q = q_lens.empty() ? 0 : *std::max_element(q_lens.begin(), q_lens.end());
    a.max_seqlen_k = keys().empty() ? 0 : *std::max_element(keys().begin(), keys().end());
    a.softmax_scale = float(1.0 / std::sqrt(double(kCaseDqk)));
    a.causal = causal;
    if (fp8) {
      char* descales = static_cast<char*>(bases[5]);
      a.q_descale = TensorView(descales, DType::kF32, {1}, device);
      a.k_descale = TensorView(descales + 4, DType::kF32, {1}, device);
      a.v_descale = TensorView(descales + 8, DType::kF32, {1}, device);
    }
    a.out = v(6);
    if (with_lse) a.lse = v(7);
    if (quant == OutputQuantKey::kFp8Group128) a.output_block_scale = v(8);
    if (quant == OutputQuantKey::kFp8Static) a.output_scale = v(8);
    if (fold) {
      a.prior_out = v(9);
      a.prior_lse = v(10);
    }
    return a;
  }
  void run(std::span<void* const> bases, Device device, CudaStream stream = nullptr) const {
    prefill_attention(args(bases, device), stream);
  }
  std::string describe() const {
    std::string lens;
    for (std::size_t b = 0; b < q_lens.size(); ++b) lens += concat(" ", q_lens[b], "/", keys()[b]);
    return concat("prefill_attention ", fp8 ? "e4m3" : "bf16", causal ? " causal" : " full",
                  " H=", heads, " q/k lens", lens, with_lse ? ", LSE" : ", no LSE",
                  v_transposed() ? ", V transposed" : ", V token-major", ", output ",
                  to_string(quant), fold ? ", folding a prior state" : "", ", seed ", seed);
  }
};

// merge_attention_states of bf16 states with the fused NVFP4 output: MergeCase's buffers 0-3 and
// 5 (o_a, lse_a, o_b, lse_b, out_lse), then 4 the e2m1x2 out [T, H * D / 2], 6 linear block
// scales e4m3 [T, H * D / 16], 7 the global scale.
struct MergeNvfp4Case {
  MergeCase states{.tokens = 300, .heads = 16, .dim = 128};
  std::uint64_t seed = 1;

  std::vector<Spec> specs() const {
    MergeCase m = states;
    m.seed = seed;
    std::vector<Spec> s = m.specs();
    const std::int64_t t = m.tokens, w = m.heads * m.dim;
    s[4] = dense(DType::kE2M1x2, {t, w / 2});
    s.push_back(dense(DType::kE4M3, {t, w / 16}));
    s.push_back(dense(DType::kF32, {1}));
    return s;
  }
  void init(std::vector<HostBuffer>& b) const {
    MergeCase m = states;
    m.seed = seed;
    m.init(b);
    const float global_scale = 500.0f;
    std::memcpy(b[7].data(), &global_scale, 4);
  }
  void run(std::span<void* const> bases, Device device, CudaStream stream = nullptr) const {
    const std::vector<Spec> s = specs();
    const auto v = [&](int i) { return s[std::size_t(i)].view(bases[std::size_t(i)], device); };
    merge_attention_states(v(0), v(1), v(2), v(3), v(4), v(5), v(7), v(6), TensorView(), stream);
  }
  std::string describe() const {
    return concat("merge_attention_states -> nvfp4 (linear scales), ", states.describe());
  }
};

}  // namespace fp8mla::test
