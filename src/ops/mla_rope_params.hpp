// Plain parameter structs of the RoPE ops of fp8mla/mla_prep.hpp (mla_rope_quantize_fp8, and the
// device copy of make_cos_sin_cache): what the argument checks in mla_rope.cpp produce and what
// both the CPU implementation and the CUDA kernel consume.
#pragma once

#include <cstdint>

#include "fp8mla/mla_prep.hpp"
#include "fp8mla/stream.hpp"
#include "ops/mla_prep_params.hpp"

namespace fp8mla {

// q_out[t, h] = e4m3([q_nope[t, h] * q_scale_inv | rope(q_pe[t, h], p) * q_scale_inv]) and
// k_out[t, h] = e4m3([k_nope[t, h] * k_scale_inv | rope(k_pe[t], p) * k_scale_inv]) with
// p = positions[t]; with cache_write also the latent row [kv_c[t] | rope(k_pe[t], p)] * scale_inv.
struct MlaRopeQuantizeParams {
  std::int64_t tokens = 0;
  std::int64_t heads = 0;
  TokenHeads q_nope;                // [T, H, 128] bf16/f16
  TokenHeads q_pe;                  // [T, H, 64], same dtype
  TokenHeads k_nope;                // [T, H, 128], same dtype
  TokenHeads k_pe;                  // [T, 1, 64] (heads == 1, head_stride == 0), same dtype
  const void* positions = nullptr;  // i32 or i64 [T], contiguous
  DType position_dtype = DType::kI64;
  const float* cos_sin = nullptr;  // [max_pos, 64]: [cos(32) | sin(32)], rows contiguous
  std::int64_t max_pos = 0;
  std::int64_t cos_sin_row_stride = 0;  // floats
  RopeStyle style = RopeStyle::kInterleaved;
  float q_scale_inv = 1.0f;
  float k_scale_inv = 1.0f;
  TokenHeads q_out;  // e4m3 [T, H, 192]
  TokenHeads k_out;  // e4m3 [T, H, 192], or [T, H, 128] with k_split
  bool k_split = false;
  // false: no k_nope, K's nope part written elsewhere; k_out then holds K's RoPE part alone
  // (bytes 128.. of each head), or is absent with k_split.
  bool k_nope_part = true;
  TokenHeads k_rope_out;  // with k_split: e4m3 [T, 1, 64] (heads == 1)
  bool cache_write = false;
  TokenHeads kv_c;          // [T, 1, 512] (heads == 1), same dtype as q_nope; with cache_write
  LatentCacheParams cache;  // with cache_write
};

FP8MLA_HOST_DEVICE std::int64_t load_position(const MlaRopeQuantizeParams& p, std::int64_t token) {
  return p.position_dtype == DType::kI32
             ? std::int64_t(static_cast<const std::int32_t*>(p.positions)[token])
             : static_cast<const std::int64_t*>(p.positions)[token];
}

namespace cpu {
void mla_rope_quantize_fp8(const MlaRopeQuantizeParams& p);
}  // namespace cpu

namespace cuda {
void mla_rope_quantize_fp8(const MlaRopeQuantizeParams& p, CudaStream stream);
// Blocking copy of a host [rows, cols] f32 table (contiguous) into device rows `dst_row_stride`
// floats apart (make_cos_sin_cache's set-up copy).
void copy_f32_rows_to_device(float* dst, std::int64_t dst_row_stride, const float* src,
                             std::int64_t rows, std::int64_t cols);
}  // namespace cuda

}  // namespace fp8mla
