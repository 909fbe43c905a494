// Plain parameter struct of prefill_attention (fp8mla/attention.hpp, docs/design.md section 3, op
// 8): what the argument checks in ops/prefill_attention.cpp produce and what the CPU implementation
// and the CUDA launcher consume. Strides are in elements of the tensor's own dtype.
#pragma once

#include <cstdint>

#include "fp8mla/dtype.hpp"
#include "ops/output_quant_params.hpp"

namespace fp8mla {

struct PrefillAttentionParams {
  DType dtype = DType::kBF16;  // of q, k and v: kE4M3 or kBF16
  const void* q = nullptr;     // [tq, heads, dqk]
  const void* k = nullptr;     // [tk, heads, dqk - k_rope_dim]
  // k_rope_dim > 0: the last k_rope_dim dims of every head's key, [tk, k_rope_dim], shared by
  // the heads (fp8mla/attention.hpp); 0: k holds every dim.
  const void* k_rope = nullptr;
  int k_rope_dim = 0;
  std::int64_t k_rope_token_stride = 0;
  const void* v = nullptr;  // [tk, heads, dv]: token-major (v_dim_stride 1) or transposed
                            // (v_token_stride 1, fp8mla/attention.hpp)
  std::int64_t q_token_stride = 0, q_head_stride = 0;
  std::int64_t k_token_stride = 0, k_head_stride = 0;
  std::int64_t v_token_stride = 0, v_head_stride = 0, v_dim_stride = 1;

  std::int64_t tq = 0;  // q's rows; the CPU path computes cu_seqlens_q's last (the real ones)
  std::int64_t tk = 0;
  std::int64_t heads = 0;
  int dqk = 0;
  int dv = 0;

  // i32 [batch + 1] on the op's device; CPU path: validated (0 first, non-decreasing, at most tq/tk
  // last: a padded batch, docs/design.md section 6; lengths within max_seqlen_*).
  const std::int32_t* cu_seqlens_q = nullptr;
  const std::int32_t* cu_seqlens_k = nullptr;
  std::int64_t batch = 0;
  int max_seqlen_q = 0;
  int max_seqlen_k = 0;

  float softmax_scale = 0.0f;
  bool causal = true;

  // FP8 inputs: one f32 each on the op's device (nullptr for bf16). The CPU path reads them on
  // the host into the *_value fields (1 for bf16), which are what cpu::prefill_attention uses.
  const float* q_descale = nullptr;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  float q_descale_value = 1.0f;
  float k_descale_value = 1.0f;
  float v_descale_value = 1.0f;

  std::uint16_t* out = nullptr;  // bf16 [tq, heads, dv], without an output quantization key
  std::int64_t out_token_stride = 0, out_head_stride = 0;
  // A quantized `out` [tq, heads * dv]: the CUDA kernel writes it directly; the CPU path
  // computes `out` into a bf16 buffer and quantizes that (ops/prefill_attention.cpp).
  OutputQuantParams quant;
  float* lse = nullptr;  // optional f32 [tq, heads]; nullptr: not written
  std::int64_t lse_token_stride = 0, lse_head_stride = 0;
  // Optional prior state folded into the output (fp8mla/attention.hpp): bf16 [tq, heads, dv] and
  // f32 [tq, heads], possibly `out` and `lse` themselves; nullptr: none.
  const std::uint16_t* prior_out = nullptr;
  std::int64_t prior_out_token_stride = 0, prior_out_head_stride = 0;
  const float* prior_lse = nullptr;
  std::int64_t prior_lse_token_stride = 0, prior_lse_head_stride = 0;
  friend bool operator==(const PrefillAttentionParams&, const PrefillAttentionParams&) = default;
};

namespace cpu {
void prefill_attention(const PrefillAttentionParams& p);
}  // namespace cpu

}  // namespace fp8mla
