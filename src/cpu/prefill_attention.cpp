// CPU reference of prefill_attention (fp8mla/attention.hpp): fp32 math with a numerically stable
// softmax, one (query row, head) at a time, threaded over rows x heads.
//   s_j = softmax_scale * sum_d q[d] k_j[d]    (fp32 accumulation; q, k dequantized per element)
//   m = max_j s_j, p_j = exp(s_j - m), l = sum_j p_j, O = (sum_j p_j v_j) / l, LSE = m + log(l)
// A row with no visible key writes O = 0 and LSE = -inf.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/parallel_for.hpp"
#include "fp8mla/numerics.hpp"
#include "ops/prefill_attention_params.hpp"

namespace fp8mla::cpu {
namespace {

// decode_e4m3 of every code, looked up: each K and V element is read once per query row.
const std::array<float, 256>& e4m3_values() {
  static const std::array<float, 256> values = [] {
    std::array<float, 256> v{};
    for (int code = 0; code < 256; ++code) v[std::size_t(code)] = decode_e4m3(std::uint8_t(code));
    return v;
  }();
  return values;
}

// Element `offset` of an e4m3 or bf16 array, dequantized (e4m3: by `e4m3`, e4m3_values()).
inline float load(const void* base, DType dtype, std::int64_t offset, float descale,
                  const float* e4m3) {
  if (dtype == DType::kE4M3) return e4m3[static_cast<const std::uint8_t*>(base)[offset]] * descale;
  return decode_bf16(static_cast<const std::uint16_t*>(base)[offset]);
}

}  // namespace

void prefill_attention(const PrefillAttentionParams& p) {
  const std::int64_t rows = p.tq * p.heads;
  const float* e4m3 = e4m3_values().data();
  // Row r is (token r / heads, head r % heads); ~one sequence of work per chunk at most.
  parallel_for(rows, 16, [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> q(std::size_t(p.dqk)), o(std::size_t(p.dv));
    std::vector<float> s;
    for (std::int64_t r = begin; r < end; ++r) {
      const std::int64_t t = r / p.heads, h = r % p.heads;
      // The sequence of token t: the last b with cu_seqlens_q[b] <= t (a non-empty one).
      const std::int32_t* it =
          std::upper_bound(p.cu_seqlens_q, p.cu_seqlens_q + p.batch + 1, std::int32_t(t));
      const std::int64_t b = (it - p.cu_seqlens_q) - 1;
      const std::int64_t q_len = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
      const std::int64_t k_start = p.cu_seqlens_k[b];
      const std::int64_t k_len = p.cu_seqlens_k[b + 1] - k_start;
      const std::int64_t i = t - p.cu_seqlens_q[b];
      const std::int64_t visible =
          p.causal ? std::clamp<std::int64_t>(i + k_len - q_len + 1, 0, k_len) : k_len;

      std::fill(o.begin(), o.end(), 0.0f);
      float lse = -std::numeric_limits<float>::infinity();
      if (visible > 0) {
        const std::int64_t q_at = t * p.q_token_stride + h * p.q_head_stride;
        for (int d = 0; d < p.dqk; ++d)
          q[d] = load(p.q, p.dtype, q_at + d, p.q_descale_value, e4m3);
        s.resize(std::size_t(visible));
        float m = -std::numeric_limits<float>::infinity();
        const int k_dims = p.dqk - p.k_rope_dim;  // of k; the rest from k_rope
        for (std::int64_t j = 0; j < visible; ++j) {
          const std::int64_t k_at = (k_start + j) * p.k_token_stride + h * p.k_head_stride;
          const std::int64_t rope_at = (k_start + j) * p.k_rope_token_stride - k_dims;
          float dot = 0.0f;
          for (int d = 0; d < k_dims; ++d)
            dot += q[d] * load(p.k, p.dtype, k_at + d, p.k_descale_value, e4m3);
          for (int d = k_dims; d < p.dqk; ++d)
            dot += q[d] * load(p.k_rope, p.dtype, rope_at + d, p.k_descale_value, e4m3);
          s[j] = p.softmax_scale * dot;
          m = std::max(m, s[j]);
        }
        float l = 0.0f;
        for (std::int64_t j = 0; j < visible; ++j) {
          const float pj = std::exp(s[j] - m);
          l += pj;
          const std::int64_t v_at = (k_start + j) * p.v_token_stride + h * p.v_head_stride;
          for (int d = 0; d < p.dv; ++d)
            o[d] += pj * load(p.v, p.dtype, v_at + d * p.v_dim_stride, p.v_descale_value, e4m3);
        }
        for (float& x : o) x /= l;
        lse = m + std::log(l);
      }
      std::uint16_t* out = p.out + t * p.out_token_stride + h * p.out_head_stride;
      for (int d = 0; d < p.dv; ++d) out[d] = encode_bf16(o[d]);
      if (p.lse != nullptr) p.lse[t * p.lse_token_stride + h * p.lse_head_stride] = lse;
    }
  });
}

}  // namespace fp8mla::cpu
