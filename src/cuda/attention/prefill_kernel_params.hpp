// Plain parameter struct of the Hopper prefill attention kernel: TMA maps of q, k and v plus the
// pointers and strides the epilogue writes through (the bf16 output, or the quantized one). Built
// on the host by prefill_launch.cuh from the op's PrefillAttentionParams; passed by value as a
// __grid_constant__ kernel parameter.
#pragma once

#include <cuda.h>

#include <cutlass/fast_math.h>

#include <cstdint>

#include "cuda/quantize/output_quant_target.hpp"

namespace fp8mla::cuda::attention {

// The order of the work tiles (ZigzagTileScheduler, prefill_scheduler.cuh): sequence
// by sequence, the heads in small_sections sections of section_heads, then one of the remaining
// heads, each section over the m blocks of max_seqlen_q. The divisors the CTA's tile is found by
// are precomputed (multiply-high and shift instead of a division, which costs short tiles
// several percent).
struct TileOrder {
  int tiles;  // every work tile of the order, those without rows included
  int small_sections;
  int section_heads;
  cutlass::FastDivmod sequence_tiles;  // m_blocks * heads
  cutlass::FastDivmod section_tiles;   // m_blocks * section_heads
  cutlass::FastDivmod heads[2];        // of a small section, of the last one
};

struct PrefillKernelParams {
  CUtensorMap q_map;  // [heads][tq][dqk] boxes of 128 tokens x 64 elements
  // bf16: [heads][tk][dqk], the same boxes. e4m3: [heads][groups][odd][8][dqk] over the complete
  // 16-key groups (key 16g + 2r + odd at [g][odd][r]), boxes of 64 elements x 8 groups: a tile in
  // even-odd key order (see prefill_traits.cuh).
  CUtensorMap k_map;
  // e4m3: [heads][tk][dqk] boxes of 64 elements x 16 keys taken every second one: half a group
  // (its even or its odd keys), for the tile that reaches past the last complete group.
  CUtensorMap k_tail_map;
  // With k_rope (the op's shared last 64 dims of K): k_map and k_tail_map cover k's own
  // dqk - 64 dims and K's last chunk comes from these two, the same maps over [1][tk][64].
  CUtensorMap k_rope_map;
  CUtensorMap k_rope_tail_map;
  int k_full_groups;  // e4m3: complete 16-key groups in k (tk / 16)
  bool k_rope_split;  // K's last chunk from the k_rope maps
  // e4m3: v given token-major (then v_map is like k's: the tile lands untransposed and the
  // producer warpgroup transposes it in shared memory) instead of transposed. (Here, in the
  // padding before v_map, so that no other member moves.)
  bool v_token_major;
  // e4m3: [heads][dv][tk] boxes of 128 keys x 128 dims, or token-major [heads][tk][dv] boxes of
  // 128 dims x 128 keys; bf16: like k.
  CUtensorMap v_map;
  const std::int32_t* cu_seqlens_q;
  const std::int32_t* cu_seqlens_k;
  const float* q_descale;  // e4m3 only
  const float* k_descale;
  const float* v_descale;
  float scale_log2;    // softmax_scale * log2(e)
  std::uint16_t* out;  // bf16, without an output quantization key
  std::int64_t out_token_stride, out_head_stride;
  // bf16: out and its strides allow 8-byte stores; quantized: quant.out and its row stride allow
  // 8-byte (e4m3) or 16-byte (e2m1x2) stores.
  bool out_vectors;
  OutputQuantTarget quant;  // the quantized output (key kNone: out above)
  float* lse;               // nullptr: not written
  std::int64_t lse_token_stride, lse_head_stride;
  TileOrder order;
  // The prior state a folding variant merges in (bf16 [tq][heads][dv] and f32 [tq][heads],
  // possibly out and lse themselves). Last, so that the other members keep their offsets.
  const std::uint16_t* prior_out;
  std::int64_t prior_out_token_stride, prior_out_head_stride;
  const float* prior_lse;
  std::int64_t prior_lse_token_stride, prior_lse_head_stride;
};

}  // namespace fp8mla::cuda::attention
