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

// Two values to one byte of e2m1 codes (the first in the low nibble).
__device__ __forceinline__ std::uint32_t nvfp4_pair(float x0, float x1, float inv) {
  return cvt_e2m1(x0 * inv) | (cvt_e2m1(x1 * inv) << 4);
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
