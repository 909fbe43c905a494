// The quantization arithmetic of docs/design.md section 2 as device functions: one definition for
// the standalone kernels (per_token_group.cu, nvfp4.cu) and the fused output quantization of the
// attention epilogue and the merge of attention states, so that fused and standalone give the
// same bytes.
#pragma once

#include <cstdint>

#include "cuda/common/convert.cuh"
#include "cuda/quantize/output_quant_target.hpp"
#include "fp8mla/numerics.hpp"
#include "ops/quant_arith.hpp"
#include "ops/quantize_params.hpp"

namespace fp8mla::cuda {

// ---- per-token-group FP8

// The scale of a group of max `amax` (eps included) in `format` (ops/quant_arith.hpp).
__device__ __forceinline__ GroupScale group_scale(float amax,
                                                  QuantizeGroupParams::ScaleFormat format) {
  return fp8mla::group_scale(amax, format != QuantizeGroupParams::ScaleFormat::kF32);
}

// x / s for the kN values of a group (or a part of one), the values then encoded to e4m3: RN(x / s)
// through the reciprocal of s (f32 scales), IEEE division (f32 scales below 2^-90), or the exact
// product with 1 / s (power-of-two scales). The choice is made once for the kN values.
template <int kN>
__device__ __forceinline__ void scale_group(float (&x)[kN], const GroupScale& g) {
  if (g.apply == GroupScale::Apply::kReciprocal) {
#pragma unroll
    for (int i = 0; i < kN; ++i) x[i] = divide_by_reciprocal(x[i], g.s, g.factor);
  } else if (g.apply == GroupScale::Apply::kMultiply) {
#pragma unroll
    for (int i = 0; i < kN; ++i) x[i] *= g.factor;
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) x[i] = __fdiv_rn(x[i], g.s);
  }
}

// The scale of group g of `row`. Packed UE8M0 words are written one byte
// at a time, so no group waits for its three neighbours; the row's last group also zeroes the
// bytes of its word past it.
__device__ __forceinline__ void write_group_scale(const GroupScales& a, std::int64_t row,
                                                  std::uint32_t g, const GroupScale& scale) {
  const float s = scale.s;
  const std::uint8_t exponent = scale.exponent;
  using Format = QuantizeGroupParams::ScaleFormat;
  const std::int64_t at = row * a.row_stride;
  switch (a.format) {
    case Format::kF32:
    case Format::kF32Pow2:
      static_cast<float*>(a.data)[at + g * a.col_stride] = s;
      break;
    case Format::kUe8m0:
      static_cast<std::uint8_t*>(a.data)[at + g * a.col_stride] = exponent;
      break;
    case Format::kPackedUe8m0: {
      auto* word = reinterpret_cast<std::uint8_t*>(static_cast<std::uint32_t*>(a.data) + at +
                                                   (g / 4) * a.col_stride);
      word[g % 4] = exponent;
      if (g + 1 == a.groups_per_row) {
        for (std::uint32_t b = g % 4 + 1; b < 4; ++b) word[b] = 0;
      }
      break;
    }
  }
}

// ---- NVFP4

// The e4m3 block scale of a block max, and the factor the block's values are multiplied by
// before their e2m1 encoding (0 for a zero scale).
__device__ __forceinline__ std::uint8_t nvfp4_block_scale(float amax, float global_scale,
                                                          float inv_global_scale, float& inv) {
  const std::uint8_t sf = std::uint8_t(cvt_e4m3x2(global_scale * nvfp4_block_quotient(amax), 0.0f));
  const float sf_value = cvt_e4m3x2_to_f32x2(sf).x;
  inv = sf_value == 0.0f ? 0.0f : __frcp_rn(sf_value * inv_global_scale);
  return sf;
}

// The reciprocal of the global scale, as the block scales use it.
__device__ __forceinline__ float nvfp4_inv_global_scale(float global_scale) {
  return __frcp_rn(global_scale);
}

// The max |x| of a block of 16 held as 8 packed bf16 / f16 pairs, in fp32, NaN if one of them is
// NaN. A max is exact in any order, so for a block without NaN this is the plain form's amax.
template <typename In>
__device__ __forceinline__ float nvfp4_abs_max_or_nan(const std::uint32_t (&w)[8]) {
  std::uint32_t m[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) m[i] = In::abs_max_nan(w[i], w[i + 4]);
  std::uint32_t top = In::abs_max_nan(In::abs_max_nan(m[0], m[1]), In::abs_max_nan(m[2], m[3]));
  top = In::abs_max_nan(top, byte_perm(top, top, 0x1032));  // both lanes hold the max
  return In::to_f32x2(top & 0x7FFF7FFFu).y;
}

// Whether nvfp4_encode8_below7 may encode a block of max `amax` (from nvfp4_abs_max_or_nan) with
// factor `inv`: inv in [+0, FLT_MAX] and amax * inv < 7. Then every product x * inv is below 7 in
// magnitude (rounding is monotonic), none is NaN, and each has its value's sign.
__device__ __forceinline__ bool nvfp4_below7(float amax, float inv) {
  return __float_as_uint(inv) <= __float_as_uint(kFloatMax) && amax * inv < 7.0f;
}

// Eight values (four packed pairs) times inv to eight e2m1 codes, value i in nibble i, for a
// block where nvfp4_below7 holds. The magnitudes are e2m1_magnitude_sum_below7's low bytes,
// gathered four to a word by byte permutes; the signs are the pairs' sign bits, spread to whole
// bytes by the same permutes.
template <typename In>
__device__ __forceinline__ std::uint32_t nvfp4_encode8_below7(const std::uint32_t* w, float inv) {
  std::uint32_t s[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = In::to_f32x2(w[i]);
    s[2 * i] = e2m1_magnitude_sum_below7(x.x * inv);
    s[2 * i + 1] = e2m1_magnitude_sum_below7(x.y * inv);
  }
  std::uint32_t pair[4];  // low byte: the magnitudes of values 2j and 2j + 1, a nibble each
#pragma unroll
  for (int j = 0; j < 4; ++j) pair[j] = s[2 * j] + (s[2 * j + 1] << 4);
  const std::uint32_t magnitudes =
      byte_perm(byte_perm(pair[0], pair[1], 0x40), byte_perm(pair[2], pair[3], 0x40), 0x5410);
  // 0x00 or 0xFF by the sign of values 0-3 and 4-7, then of the even and of the odd ones
  const std::uint32_t lo = byte_perm(w[0], w[1], 0xFDB9), hi = byte_perm(w[2], w[3], 0xFDB9);
  const std::uint32_t even_sign = byte_perm(lo, hi, 0x6420), odd_sign = byte_perm(lo, hi, 0x7531);
  return magnitudes | (even_sign & 0x08080808u) | (odd_sign & 0x80808080u);
}

// Two values to one byte of e2m1 codes (the first in the low nibble).
__device__ __forceinline__ std::uint32_t nvfp4_pair(float x0, float x1, float inv) {
  return cvt_e2m1(x0 * inv) | (cvt_e2m1(x1 * inv) << 4);
}

// The plain form, for the blocks nvfp4_below7 turns away: the max over fp32 values with NaNs
// dropped (what the scale of a block with a NaN or an infinity takes), and each value's code by
// cvt_e2m1.
template <typename In>
__device__ __forceinline__ float nvfp4_plain_abs_max(const std::uint32_t (&w)[8]) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float2 x = In::to_f32x2(w[i]);
    amax = fmaxf(amax, fmaxf(fabsf(x.x), fabsf(x.y)));
  }
  return amax;
}

template <typename In>
__device__ __forceinline__ std::uint32_t nvfp4_plain_encode8(const std::uint32_t* w, float inv) {
  std::uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = In::to_f32x2(w[i]);
    packed |= nvfp4_pair(x.x, x.y, inv) << (8 * i);
  }
  return packed;
}

// One block of 16 values (8 packed pairs, in order) to its 8 code bytes in `codes` (value i in
// nibble i); returns its scale byte. The standalone op and the fused output quantization both
// encode through this.
template <typename In>
__device__ __forceinline__ std::uint8_t nvfp4_quantize_block(const std::uint32_t (&w)[8],
                                                             float global_scale,
                                                             float inv_global_scale, uint2& codes) {
  const float amax = nvfp4_abs_max_or_nan<In>(w);
  const bool finite = amax <= kFloatMax;
  float inv;
  const std::uint8_t sf = nvfp4_block_scale(finite ? amax : nvfp4_plain_abs_max<In>(w),
                                            global_scale, inv_global_scale, inv);
  if (nvfp4_below7(amax, inv)) {
    codes = make_uint2(nvfp4_encode8_below7<In>(w, inv), nvfp4_encode8_below7<In>(w + 4, inv));
  } else {
    codes = make_uint2(nvfp4_plain_encode8<In>(w, inv), nvfp4_plain_encode8<In>(w + 4, inv));
  }
  return sf;
}

// The byte of the block scale of (row, block) in a fused output's NVFP4 scale tensor.
__device__ __forceinline__ std::int64_t nvfp4_scale_at(const OutputQuantTarget& q, std::int64_t row,
                                                       std::int64_t block) {
  return q.swizzled ? swizzled_scale_offset(row, block, q.width / 16)
                    : row * q.block_scale_row_stride + block;
}

// The 128x4 swizzled layout's padding in row `row` of a fused output (the blocks past W / 16 in
// the last 4-block tile; all of them in the rows past T), written as zeros by threads `first`,
// first + step, ... as the standalone op writes it.
__device__ __forceinline__ void zero_nvfp4_padding(const OutputQuantTarget& q, std::int64_t row,
                                                   int first, int step) {
  const std::int64_t blocks = q.width / 16, padded = (blocks + 3) / 4 * 4;
  for (std::int64_t b = (row < q.rows ? blocks : 0) + first; b < padded; b += step) {
    q.block_scales[swizzled_scale_offset(row, b, blocks)] = 0;
  }
}

}  // namespace fp8mla::cuda
