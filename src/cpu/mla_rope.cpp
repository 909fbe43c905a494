// CPU implementation of mla_rope_quantize_fp8: the reference the CUDA kernel equals bit for bit.
// RoPE in fp32 with explicit fma (fp8mla/mla_prep.hpp), then e4m3(x * scale_inv). Every position
// and slot is validated before the first byte is written.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu/element_io.hpp"
#include "cpu/parallel_for.hpp"
#include "fp8mla/error.hpp"
#include "ops/mla_rope_params.hpp"

namespace fp8mla::cpu {
namespace {

constexpr int kHalf = kMlaRopeDim / 2;

const void* row_of(const TokenHeads& t, std::int64_t token, std::int64_t head) {
  return static_cast<const char*>(t.data) +
         (token * t.token_stride + head * t.head_stride) * std::int64_t(dtype_size(t.dtype));
}
std::uint8_t* out_row(const TokenHeads& t, std::int64_t token, std::int64_t head) {
  return static_cast<std::uint8_t*>(t.data) + token * t.token_stride + head * t.head_stride;
}

// y = rope(x) over kMlaRopeDim elements with the cos/sin row `cs` ([cos(32) | sin(32)]).
void rope(const float (&x)[kMlaRopeDim], const float* cs, RopeStyle style,
          float (&y)[kMlaRopeDim]) {
  for (int i = 0; i < kHalf; ++i) {
    const int a = style == RopeStyle::kInterleaved ? 2 * i : i;
    const int b = style == RopeStyle::kInterleaved ? 2 * i + 1 : i + kHalf;
    const float c = cs[i], s = cs[kHalf + i];
    y[a] = std::fma(x[a], c, -(x[b] * s));
    y[b] = std::fma(x[b], c, x[a] * s);
  }
}

void load_row(const TokenHeads& t, std::int64_t token, std::int64_t head, float (&x)[kMlaRopeDim]) {
  const void* row = row_of(t, token, head);
  for (int i = 0; i < kMlaRopeDim; ++i) x[i] = load_f32(row, t.dtype, i);
}

// out[i] = e4m3(in[i] * scale_inv), i < n.
void quantize_row(const void* in, DType dtype, std::int64_t n, float scale_inv, std::uint8_t* out) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = encode_e4m3(load_f32(in, dtype, i) * scale_inv);
}

void quantize_values(const float* x, int n, float scale_inv, std::uint8_t* out) {
  for (int i = 0; i < n; ++i) out[i] = encode_e4m3(x[i] * scale_inv);
}

}  // namespace

void mla_rope_quantize_fp8(const MlaRopeQuantizeParams& p) {
  // Validate first: nothing is written when any position or slot is bad.
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    const std::int64_t pos = load_position(p, t);
    if (pos < 0 || pos >= p.max_pos) {
      throw Error(ErrorCategory::kOutOfRange,
                  concat("mla_rope_quantize_fp8: `positions`[", t, "] = ", pos,
                         " is outside the cos_sin cache [0, ", p.max_pos, ")"));
    }
    if (!p.cache_write) continue;
    const std::int64_t slot = load_slot(p.cache, t);
    if (slot != -1 && latent_row(p.cache, slot) == nullptr) {
      throw Error(ErrorCategory::kOutOfRange,
                  concat("mla_rope_quantize_fp8: `slot_mapping`[", t, "] = ", slot,
                         " is outside the cache's [0, ", p.cache.num_pages * p.cache.page_size,
                         ") slots (or -1 to skip)"));
    }
  }
  const std::int64_t grain = std::max<std::int64_t>(1, 256 / p.heads);
  parallel_for(p.tokens, grain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t t = begin; t < end; ++t) {
      const float* cs = p.cos_sin + load_position(p, t) * p.cos_sin_row_stride;
      float x[kMlaRopeDim], k_rope[kMlaRopeDim], q_rope[kMlaRopeDim];
      load_row(p.k_pe, t, 0, x);
      rope(x, cs, p.style, k_rope);  // once per token, shared by every head
      for (std::int64_t h = 0; h < p.heads; ++h) {
        std::uint8_t* q = out_row(p.q_out, t, h);
        quantize_row(row_of(p.q_nope, t, h), p.q_nope.dtype, kMlaNopeDim, p.q_scale_inv, q);
        load_row(p.q_pe, t, h, x);
        rope(x, cs, p.style, q_rope);
        quantize_values(q_rope, kMlaRopeDim, p.q_scale_inv, q + kMlaNopeDim);
        if (p.k_nope_part) {
          quantize_row(row_of(p.k_nope, t, h), p.k_nope.dtype, kMlaNopeDim, p.k_scale_inv,
                       out_row(p.k_out, t, h));
        }
        if (!p.k_split) {
          quantize_values(k_rope, kMlaRopeDim, p.k_scale_inv, out_row(p.k_out, t, h) + kMlaNopeDim);
        }
      }
      if (p.k_split) {
        quantize_values(k_rope, kMlaRopeDim, p.k_scale_inv, out_row(p.k_rope_out, t, 0));
      }
      if (!p.cache_write) continue;
      std::uint8_t* row = latent_row(p.cache, load_slot(p.cache, t));
      if (row == nullptr) continue;  // slot -1
      quantize_row(row_of(p.kv_c, t, 0), p.kv_c.dtype, kMlaKvLoraRank, p.cache.scale_inv, row);
      quantize_values(k_rope, kMlaRopeDim, p.cache.scale_inv, row + kMlaKvLoraRank);
    }
  });
}

}  // namespace fp8mla::cpu
