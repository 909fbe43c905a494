// The fused output quantization of the prefill epilogue (docs/design.md section 6). A consumer
// thread holds 32 of an output row's 128 values, already rounded to bf16 as the bf16 store writes
// them: block j of 8 dims gives lane c of the quad (which holds the whole row) dims 8j + 2c and
// 8j + 2c + 1. The standalone ops' arithmetic (cuda/quantize/quant_device.cuh) then applies: a
// group of 128 is the quad's row, a group of 64 its blocks 0..7 or 8..15, an NVFP4 block of 16
// its blocks 2k and 2k + 1; each group max is two quad shuffles. With vector stores the quad
// transposes its e4m3 bytes first, so that one store of the quad covers 32 contiguous bytes
// instead of 2-byte pieces. NVFP4 regathers the bf16 row first instead (store_nvfp4_row), so
// that each lane holds two blocks whole: two block scales a lane instead of all eight, and the
// standalone op's block encoding.
#pragma once

#include <cstdint>

#include "cuda/common/vector_io.cuh"
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

// A 4 x 4 matrix of words over the lanes of a quad, lane c holding row c (r[d] = element (c, d)),
// transposed: lane c then holds column c (r[s] = element (s, c)). Lanes c and c ^ 2 swap the half
// rows the other keeps, then c and c ^ 1 the columns the other keeps; lane c then holds rows c,
// c ^ 1, c ^ 2 and c ^ 3 of its column, put in order by selects.
__device__ __forceinline__ void quad_transpose32(std::uint32_t (&r)[4]) {
  const int c = threadIdx.x % 4;
  const bool upper = c & 2, odd = c & 1;
  // Elements (c, h) and (c ^ 2, h) of the columns h = (c & 2), (c & 2) + 1.
  const std::uint32_t keep0 = upper ? r[2] : r[0], keep1 = upper ? r[3] : r[1];
  const std::uint32_t got0 = __shfl_xor_sync(~0u, upper ? r[0] : r[2], 2);
  const std::uint32_t got1 = __shfl_xor_sync(~0u, upper ? r[1] : r[3], 2);
  // Rows c and c ^ 2 of column c stay; rows c ^ 1 and c ^ 3 of it come from lane c ^ 1.
  const std::uint32_t own = odd ? keep1 : keep0, own2 = odd ? got1 : got0;
  const std::uint32_t in = __shfl_xor_sync(~0u, odd ? keep0 : keep1, 1);
  const std::uint32_t in2 = __shfl_xor_sync(~0u, odd ? got0 : got1, 1);
  const std::uint32_t a0 = odd ? in : own, a1 = odd ? own : in;      // rows c & 2, (c & 2) + 1
  const std::uint32_t b0 = odd ? in2 : own2, b1 = odd ? own2 : in2;  // the other two
  r[0] = upper ? b0 : a0;
  r[1] = upper ? b1 : a1;
  r[2] = upper ? a0 : b0;
  r[3] = upper ? a1 : b1;
}

// The row's bf16 pairs words[j] (dims 8j + 2c, 8j + 2c + 1 on lane c) regathered so that lane c
// holds dims 32c .. 32c + 31 in order: w[k] = dims 32c + 2k, 32c + 2k + 1.
__device__ __forceinline__ void quad_gather_quarters(const std::uint32_t (&words)[16],
                                                     std::uint32_t (&w)[16]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    // Row c of matrix i: the lane's words of blocks i, 4 + i, 8 + i, 12 + i (column d of it
    // is what lane d gathers); its column c: block 4c + i of lanes 0..3.
    std::uint32_t r[4] = {words[i], words[4 + i], words[8 + i], words[12 + i]};
    quad_transpose32(r);
#pragma unroll
    for (int s = 0; s < 4; ++s) w[4 * i + s] = r[s];
  }
}

// NVFP4: the quad regathers the row so that lane c holds NVFP4 blocks 2c and 2c + 1 whole, and
// quantizes them as the standalone op does (nvfp4_quantize_block); it writes their 16 code bytes
// and two scales.
__device__ __forceinline__ void store_nvfp4_row(const OutputQuantTarget& q, bool vectors,
                                                std::int64_t token, int head,
                                                const std::uint32_t (&words)[16], bool valid) {
  std::uint32_t w[16];
  quad_gather_quarters(words, w);
  const float global_scale = *q.scale;
  const float inv_global_scale = nvfp4_inv_global_scale(global_scale);
  uint2 codes[2];
  std::uint8_t sf[2];
#pragma unroll
  for (int b = 0; b < 2; ++b) {
    sf[b] = nvfp4_quantize_block<Bf16In>(*reinterpret_cast<const std::uint32_t(*)[8]>(&w[8 * b]),
                                         global_scale, inv_global_scale, codes[b]);
  }
  if (!valid) return;
  const int c = threadIdx.x % 4;
  std::uint8_t* dst = q.out + token * q.out_row_stride + head * 64 + 16 * c;
  if (vectors) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(codes[0].x, codes[0].y, codes[1].x, codes[1].y);
  } else {
    const std::uint32_t bytes[4] = {codes[0].x, codes[0].y, codes[1].x, codes[1].y};
#pragma unroll
    for (int i = 0; i < 16; ++i) dst[i] = std::uint8_t(bytes[i / 4] >> (8 * (i % 4)));
  }
#pragma unroll
  for (int b = 0; b < 2; ++b)
    q.block_scales[nvfp4_scale_at(q, token, head * 8 + 2 * c + b)] = sf[b];
}

// The row (token, head) in the key of q, from the thread's bf16 pairs words[j] (dims 8j + 2c in
// the low half). `valid`: the row exists; every lane takes part in the shuffles either way.
__device__ __forceinline__ void store_quantized_row(const OutputQuantTarget& q, bool vectors,
                                                    std::int64_t token, int head,
                                                    const std::uint32_t (&words)[16], bool valid) {
  if (q.key == OutputQuantKey::kNvfp4) {
    store_nvfp4_row(q, vectors, token, head, words, valid);
    return;
  }
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
    case OutputQuantKey::kNvfp4:  // above
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
