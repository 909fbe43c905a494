// Plain parameter structs of the latent-cache ops of fp8mla/mla_prep.hpp (mla_kv_cache_write,
// mla_kv_gather, mla_kv_pack_quantize_fp8 and mla_v_quantize_fp8): what the argument checks in
// mla_kv.cpp produce and what both the CPU implementation and the CUDA kernels consume.
#pragma once

#include <cstdint>

#include "fp8mla/stream.hpp"
#include "ops/mla_prep_params.hpp"

namespace fp8mla {

// kv_c [T, 512] and k_pe [T, 64] (heads == 1, bf16/f16) into the cache rows of cache.slots.
struct MlaKvCacheWriteParams {
  TokenHeads kv_c;
  TokenHeads k_pe;
  LatentCacheParams cache;  // scale_inv applies
};

// The cache rows of cache.slots ([tokens]) to bf16 kv_c_out [tokens, 512] and k_pe_out
// [tokens, 64] (heads == 1): bf16(decode_e4m3(q) * scale).
struct MlaKvGatherParams {
  LatentCacheParams cache;  // scale_inv unused
  float scale = 1.0f;
  TokenHeads kv_c_out;
  TokenHeads k_pe_out;
};

// k_out[t, h] = e4m3([k_nope[t, h] | k_pe[t]] * k_scale_inv), v_out[t, h] = e4m3(v[t, h] *
// v_scale_inv); k_pe has heads == 1 and head_stride == 0. Token and head counts are v's (equal to
// k_nope's unless v_only).
struct MlaKvPackParams {
  TokenHeads k_nope;  // [n, H, 128] bf16/f16
  TokenHeads k_pe;    // [n, 1, 64], same dtype
  TokenHeads v;       // [n, H, 128], same dtype
  float k_scale_inv = 1.0f;
  float v_scale_inv = 1.0f;
  TokenHeads k_out;  // e4m3 [n, H, 192], or [n, H, 128] with k_split
  bool k_split = false;
  TokenHeads k_rope_out;  // with k_split: e4m3 [n, 1, 64]
  TokenHeads v_out;  // e4m3 [n, H, 128]; transposed: token_stride 1, dims v_out_dim_stride apart
  bool v_transposed = false;
  std::int64_t v_out_dim_stride = 1;
  bool v_only = false;  // mla_v_quantize_fp8: only V is read and written; the K fields are unused
};

namespace cpu {
void mla_kv_cache_write(const MlaKvCacheWriteParams& p);
void mla_kv_gather(const MlaKvGatherParams& p);
void mla_kv_pack_quantize_fp8(const MlaKvPackParams& p);
}  // namespace cpu

namespace cuda {
void mla_kv_cache_write(const MlaKvCacheWriteParams& p, CudaStream stream);
void mla_kv_gather(const MlaKvGatherParams& p, CudaStream stream);
void mla_kv_pack_quantize_fp8(const MlaKvPackParams& p, CudaStream stream);
}  // namespace cuda

}  // namespace fp8mla
