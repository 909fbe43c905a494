// The fused output quantization of the prefill epilogue (docs/design.md section 6). A consumer
// thread holds 32 of an output row's 128 values, already rounded to bf16 as the bf16 store writes
// them: block j of 8 dims gives lane c of the quad (which holds the whole row) dims 8j + 2c and
// 8j + 2c + 1. The standalone ops' arithmetic (cuda/quantize/quant_device.cuh) then applies: a
// group of 128 is the quad's row, a group of 64 its blocks 0..7 or 8..15, an NVFP4 block of 16
// its blocks 2k and 2k + 1; each group max is two quad shuffles. With vector stores the quad
// transposes its bytes first, so that one store of the quad covers 32 (e4m3) or 16 (e2m1)
// contiguous bytes instead of 2-byte or 1-byte pieces.
#pragma once

#include <cstdint>

#include "cuda/quantize/output_quant_target.hpp"
#include "cuda/quantize/quant_device.cuh"

namespace fp8mla::cuda::attention {

// A 4 x 4 matrix of 16-bit elements over the lanes of a quad, lane c holding row c as
// lo = e[c][0] | e[c][1] << 16, hi = e[c][2] | e[c][3] << 16, transposed: lane c then holds
// column c the same way. Two exchanges: rows c and c ^ 2 swap their half rows, then c and c ^ 1
// their elements.
__device__ __forceinline__ void quad_transpose16(std::uint32_t& lo, std::uint32_t& hi) {
  const int c = threadIdx.x % 4;
  const bool upper = c & 2, odd = c & 1;
  const std::uint32_t half = __shfl_xor_sync(~0u, upper ? lo : hi, 2);
  // Rows c & 1 (a) and (c & 1) + 2 (b), columns (c & 2) and (c & 2) + 1.
  const std::uint32_t a = upper ? half : lo, b = upper ? hi : half;
  const std::uint32_t other =
      __shfl_xor_sync(~0u, odd ? __byte_perm(a, b, 0x5410) : __byte_perm(a, b, 0x7632), 1);
  lo = odd ? __byte_perm(other, a, 0x7610) : __byte_perm(a, other, 0x5410);
  hi = odd ? __byte_perm(other, b, 0x7632) : __byte_perm(b, other, 0x7610);
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(~0u, x, 1));
  return fmaxf(x, __shfl_xor_sync(~0u, x, 2));
}

// The row's e4m3 pairs e[j] (dims 8j + 2c, 8j + 2c + 1) at dst, the head's 128 bytes.
__device__ __forceinline__ void store_e4m3_row(std::uint8_t* dst, const std::uint16_t (&e)[16],
                                               bool vectors, bool valid) {
  const int c = threadIdx.x % 4;
  if (vectors) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      std::uint32_t lo = e[4 * i] | std::uint32_t(e[4 * i + 1]) << 16;
      std::uint32_t hi = e[4 * i + 2] | std::uint32_t(e[4 * i + 3]) << 16;
      quad_transpose16(lo, hi);  // lane c: block 4i + c, from all four lanes
      if (valid) *reinterpret_cast<uint2*>(dst + 8 * (4 * i + c)) = make_uint2(lo, hi);
    }
  } else if (valid) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      dst[8 * j + 2 * c] = std::uint8_t(e[j]);
      dst[8 * j + 2 * c + 1] = std::uint8_t(e[j] >> 8);
    }
  }
}

// The row's e2m1 bytes b[j] (dims 8j + 2c, 8j + 2c + 1) at dst, the head's 64 bytes.
__device__ __forceinline__ void store_e2m1_row(std::uint8_t* dst, const std::uint32_t (&b)[16],
                                               bool vectors, bool valid) {
  const int c = threadIdx.x % 4;
  if (vectors) {
#pragma unroll
    for (int i = 0; i < 4; i += 2) {
      // Element d of the lane's row: its bytes of blocks 4i + d and 4i + 4 + d.
      std::uint32_t e[4];
#pragma unroll
      for (int d = 0; d < 4; ++d) e[d] = b[4 * i + d] | b[4 * i + 4 + d] << 8;
      std::uint32_t lo = e[0] | e[1] << 16, hi = e[2] | e[3] << 16;
      quad_transpose16(lo, hi);
      if (valid) {
        *reinterpret_cast<std::uint32_t*>(dst + 16 * i + 4 * c) = __byte_perm(lo, hi, 0x6420);
        *reinterpret_cast<std::uint32_t*>(dst + 16 * i + 16 + 4 * c) = __byte_perm(lo, hi, 0x7531);
      }
    }
  } else if (valid) {
#pragma unroll
    for (int j = 0; j < 16; ++j) dst[4 * j + c] = std::uint8_t(b[j]);
  }
}

// e4m3 pairs of the scaled values.
__device__ __forceinline__ void e4m3_pairs(const float (&y)[32], std::uint16_t (&e)[16]) {
#pragma unroll
  for (int j = 0; j < 16; ++j) e[j] = cvt_e4m3x2(y[2 * j], y[2 * j + 1]);
}

// Per-token-group FP8 of kGroups groups a row (of 128 / kGroups values); lane g writes the scale
// of group g.
template <int kGroups>
__device__ __forceinline__ void store_group_row(const OutputQuantTarget& q, bool vectors,
                                                std::int64_t token, int head, float (&y)[32],
                                                bool valid) {
  constexpr int kPer = 32 / kGroups;  // a lane's values of one group
  GroupScale scale[kGroups];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    float(&part)[kPer] = *reinterpret_cast<float(*)[kPer]>(&y[g * kPer]);
    float amax = q.eps;
#pragma unroll
    for (int i = 0; i < kPer; ++i) amax = fmaxf(amax, fabsf(part[i]));
    scale[g] = group_scale(quad_max(amax), q.group.format);
    scale_group(part, scale[g]);
  }
  std::uint16_t e[16];
  e4m3_pairs(y, e);
  store_e4m3_row(q.out + token * q.out_row_stride + head * 128, e, vectors, valid);
  const int c = threadIdx.x % 4;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    if (valid && c == g) write_group_scale(q.group, token, head * kGroups + g, scale[g]);
  }
}

// NVFP4: 8 blocks a row; lane c writes the scales of blocks 2c and 2c + 1.
__device__ __forceinline__ void store_nvfp4_row(const OutputQuantTarget& q, bool vectors,
                                                std::int64_t token, int head, const float (&y)[32],
                                                bool valid) {
  const float global_scale = *q.scale;
  const float inv_global_scale = nvfp4_inv_global_scale(global_scale);
  std::uint8_t sf[8];
  float inv[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) amax = fmaxf(amax, fabsf(y[4 * k + i]));
    sf[k] = nvfp4_block_scale(quad_max(amax), global_scale, inv_global_scale, inv[k]);
  }
  std::uint32_t b[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) b[j] = nvfp4_pair(y[2 * j], y[2 * j + 1], inv[j / 2]);
  store_e2m1_row(q.out + token * q.out_row_stride + head * 64, b, vectors, valid);
  const int c = threadIdx.x % 4;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    if (valid && k / 2 == c) q.block_scales[nvfp4_scale_at(q, token, head * 8 + k)] = sf[k];
  }
}

// The row (token, head) in the key of q, from the thread's bf16 pairs words[j] (dims 8j + 2c in
// the low half). `valid`: the row exists; every lane takes part in the shuffles either way.
__device__ __forceinline__ void store_quantized_row(const OutputQuantTarget& q, bool vectors,
                                                    std::int64_t token, int head,
                                                    const std::uint32_t (&words)[16], bool valid) {
  float y[32];
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    y[2 * j] = __uint_as_float(words[j] << 16);
    y[2 * j + 1] = __uint_as_float(words[j] & 0xFFFF0000u);
  }
  switch (q.key) {
    case OutputQuantKey::kFp8Static: {
      const float scale_inv = *q.scale;
#pragma unroll
      for (int i = 0; i < 32; ++i) y[i] *= scale_inv;
      std::uint16_t e[16];
      e4m3_pairs(y, e);
      store_e4m3_row(q.out + token * q.out_row_stride + head * 128, e, vectors, valid);
      break;
    }
    case OutputQuantKey::kFp8Group128:
      store_group_row<1>(q, vectors, token, head, y, valid);
      break;
    case OutputQuantKey::kFp8Group64:
      store_group_row<2>(q, vectors, token, head, y, valid);
      break;
    case OutputQuantKey::kNvfp4:
      store_nvfp4_row(q, vectors, token, head, y, valid);
      break;
    case OutputQuantKey::kNone:
      break;
  }
}

// The NVFP4 swizzled layout's padding rows T .. round_up(T, 128), which no work tile owns: CTA b
// writes heads b, b + gridDim.x, .. of them as zeros, 8 blocks a head (the blocks of a row, 8 a
// head, fill whole 4-block tiles).
__device__ __forceinline__ void zero_padding_rows(const OutputQuantTarget& q) {
  if (!q.swizzled) return;
  const int padding = int((q.rows + 127) / 128 * 128 - q.rows);
  for (int head = int(blockIdx.x); head < q.width / 128; head += int(gridDim.x)) {
    for (int i = int(threadIdx.x); i < padding * 8; i += int(blockDim.x)) {
      q.block_scales[nvfp4_scale_at(q, q.rows + i / 8, head * 8 + i % 8)] = 0;
    }
  }
}

}  // namespace fp8mla::cuda::attention
