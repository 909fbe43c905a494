// prefill_attention folding a prior state (PrefillAttentionArgs::prior_out / prior_lse), shared by
// the CPU and CUDA tests: a ragged batch with its prior state as host buffers (a device test
// uploads them), and the reference the contract names, run on the same device: the call without
// the prior state (bf16 out and LSE) followed by merge_attention_states over the real tokens.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "buffer_test_util.hpp"
#include "fp8mla/attention.hpp"
#include "fp8mla/numerics.hpp"

namespace fp8mla::test {

// Buffers: 0 q [tq, H, 192], 1 k [tk, H, 192], 2 v [tk, H, 128] token-major, 3 cu_seqlens_q,
// 4 cu_seqlens_k, 5 descales (q, k, v), 6 prior_out bf16 [tq, H, 128], 7 prior_lse f32 [tq, H].
// tq counts `padding` rows past the real tokens (a batch padded for a CUDA graph).
struct FoldBatch {
  static constexpr std::int64_t kDqk = 192, kDv = 128;
  bool fp8 = true;
  bool causal = false;
  std::int64_t heads = 4;
  std::vector<int> q_lens = {5, 0, 130, 3, 7}, k_lens = {12, 4, 200, 0, 1};
  std::int64_t padding = 0;
  std::uint64_t seed = 3;

  std::int64_t real() const { return sum(q_lens); }
  std::int64_t tq() const { return real() + padding; }
  std::int64_t tk() const { return sum(k_lens); }
  std::int64_t sequences() const { return std::int64_t(q_lens.size()); }
  DType dtype() const { return fp8 ? DType::kE4M3 : DType::kBF16; }
  std::string describe() const {
    std::string lens;
    for (std::size_t b = 0; b < q_lens.size(); ++b) lens += concat(" ", q_lens[b], "/", k_lens[b]);
    return concat(fp8 ? "e4m3" : "bf16", causal ? " causal" : " non-causal", " q/k lens", lens,
                  ", padding ", padding);
  }

  std::vector<HostBuffer> host() const {
    const std::int64_t q = tq(), k = tk(), h = heads, es = std::int64_t(dtype_size(dtype()));
    std::vector<HostBuffer> b;
    for (std::int64_t bytes :
         {q * h * kDqk * es, k * h * kDqk * es, k * h * kDv * es, (sequences() + 1) * 4,
          (sequences() + 1) * 4, std::int64_t(12), q * h * kDv * 2, q * h * 4}) {
      b.emplace_back(std::size_t(std::max<std::int64_t>(bytes, 1)));
    }
    Rng rng(seed);
    const auto fill = [&](HostBuffer& buffer, std::int64_t n, float range) {
      for (std::int64_t i = 0; i < n; ++i) {
        const float x = (rng.uniform() * 2.0f - 1.0f) * range;
        if (fp8) {
          buffer.data()[i] = encode_e4m3(x);
        } else {
          store_f32(buffer.data(), DType::kBF16, i, x);
        }
      }
    };
    fill(b[0], q * h * kDqk, fp8 ? 2.0f : 1.0f);
    fill(b[1], k * h * kDqk, fp8 ? 4.0f : 1.0f);
    fill(b[2], k * h * kDv, fp8 ? 2.0f : 4.0f);
    std::vector<std::int32_t> cu_q{0}, cu_k{0};
    for (std::size_t s = 0; s < q_lens.size(); ++s) {
      cu_q.push_back(cu_q.back() + q_lens[s]);
      cu_k.push_back(cu_k.back() + k_lens[s]);
    }
    std::memcpy(b[3].data(), cu_q.data(), cu_q.size() * 4);
    std::memcpy(b[4].data(), cu_k.data(), cu_k.size() * 4);
    const float descales[3] = {0.5f, 0.25f, 2.0f};
    std::memcpy(b[5].data(), descales, sizeof descales);
    for (std::int64_t i = 0; i < q * h * kDv; ++i) {
      store_f32(b[6].data(), DType::kBF16, i, (rng.uniform() * 2.0f - 1.0f) * 3.0f);
    }
    // Prior LSEs around this call's own (so both weights matter), and empty states: -inf, and
    // +inf as FlashAttention-3 writes a row without keys.
    constexpr float kInf = std::numeric_limits<float>::infinity();
    for (std::int64_t i = 0; i < q * h; ++i) {
      const float lse = i % 7 == 3 ? -kInf : i % 11 == 5 ? kInf : rng.uniform() * 8.0f - 2.0f;
      std::memcpy(b[7].data() + 4 * i, &lse, 4);
    }
    return b;
  }

  // The call without a prior state, writing `out` and `lse` (either may be empty views).
  PrefillAttentionArgs args(std::span<void* const> bases, Device device, const TensorView& out,
                            const TensorView& lse) const {
    const auto at = [&](int i) { return bases[std::size_t(i)]; };
    const DType dt = dtype();
    PrefillAttentionArgs a;
    a.q = TensorView(at(0), dt, {tq(), heads, kDqk}, device);
    a.k = TensorView(at(1), dt, {tk(), heads, kDqk}, device);
    a.v = TensorView(at(2), dt, {tk(), heads, kDv}, device);
    a.cu_seqlens_q = TensorView(at(3), DType::kI32, {sequences() + 1}, device);
    a.cu_seqlens_k = TensorView(at(4), DType::kI32, {sequences() + 1}, device);
    // Bounds no offsets can violate: the padded rows count as queries for them.
    a.max_seqlen_q = std::max(*std::max_element(q_lens.begin(), q_lens.end()),
                              int((tq() + sequences() - 1) / sequences()));
    a.max_seqlen_k = *std::max_element(k_lens.begin(), k_lens.end());
    a.softmax_scale = 0.0722f;
    a.causal = causal;
    if (fp8) {
      auto* descales = static_cast<float*>(at(5));
      a.q_descale = TensorView(descales, DType::kF32, {1}, device);
      a.k_descale = TensorView(descales + 1, DType::kF32, {1}, device);
      a.v_descale = TensorView(descales + 2, DType::kF32, {1}, device);
    }
    a.out = out;
    a.lse = lse;
    return a;
  }
  TensorView prior_out(std::span<void* const> bases, Device device) const {
    return TensorView(bases[6], DType::kBF16, {tq(), heads, kDv}, device);
  }
  TensorView prior_lse(std::span<void* const> bases, Device device) const {
    return TensorView(bases[7], DType::kF32, {tq(), heads}, device);
  }
  // The real token count, the last element of cu_seqlens_q (merge_attention_states' num_tokens).
  TensorView real_tokens(std::span<void* const> bases, Device device) const {
    return TensorView(static_cast<std::int32_t*>(bases[3]) + sequences(), DType::kI32, {1}, device);
  }

 private:
  static std::int64_t sum(const std::vector<int>& v) {
    std::int64_t n = 0;
    for (int x : v) n += x;
    return n;
  }
};

// The batches both tests walk: empty sequences, sequences without keys, rows over several 128-row
// tiles, one key, and a padded batch.
inline std::vector<FoldBatch> fold_batches(bool fp8, bool causal) {
  FoldBatch ragged;
  ragged.fp8 = fp8;
  ragged.causal = causal;
  FoldBatch padded = ragged;
  padded.q_lens = {20, 9};
  padded.k_lens = {33, 9};
  padded.padding = 7;
  padded.seed = 5;
  return {ragged, padded};
}

}  // namespace fp8mla::test
