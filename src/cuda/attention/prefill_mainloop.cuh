// The two roles of the prefill kernel's main loop.
//  Producer (one thread of warpgroup 0): Q once, then K and V tile by tile into the stage ring,
//    each load completing on its stage's full barrier; it reuses a stage once both consumer
//    warpgroups have arrived on its empty barrier.
//  Consumers (warpgroups 1..kConsumerWarpgroups, 64 query rows each): S = Q K^T and O += P V with
//    wgmma; P comes from registers (see prefill_softmax.cuh for its layout).
// Key tiles are visited last to first, so the tiles that need masking come first.
#pragma once

#include <cstdint>

#include "cuda/attention/prefill_kernel_params.hpp"
#include "cuda/attention/prefill_scheduler.cuh"
#include "cuda/attention/prefill_traits.cuh"
#include "cuda/common/sm90.cuh"

namespace fp8mla::cuda::attention {

// Shared memory of one CTA, carved as PrefillTraits lays it out.
template <typename Traits>
struct SharedStorage {
  std::uint8_t* base;  // 1024-byte aligned

  __device__ std::uint8_t* q() const { return base + Traits::kQOffset; }
  __device__ std::uint8_t* k(int stage) const {
    return base + Traits::kKOffset + stage * Traits::kKBytes;
  }
  __device__ std::uint8_t* v(int stage) const {
    return base + Traits::kVOffset + stage * Traits::kVStageBytes;
  }
  // The f32 partial sums of O of consumer warpgroup cw (e4m3), float4 [kORegs / 4][128].
  __device__ float4* o_partial(int cw) const {
    return reinterpret_cast<float4*>(base + Traits::kOPartialOffset) + cw * 32 * Traits::kORegs;
  }
  __device__ std::uint64_t* barriers() const {
    return reinterpret_cast<std::uint64_t*>(base + Traits::kBarrierOffset);
  }
  __device__ std::uint64_t* q_full() const { return barriers(); }
  __device__ std::uint64_t* k_full(int stage) const { return barriers() + 1 + stage; }
  __device__ std::uint64_t* v_full(int stage) const {
    return barriers() + 1 + Traits::kStages + stage;
  }
  __device__ std::uint64_t* k_empty(int stage) const {
    return barriers() + 1 + 2 * Traits::kStages + stage;
  }
  __device__ std::uint64_t* v_empty(int stage) const {
    return barriers() + 1 + 3 * Traits::kStages + stage;
  }

  // By every thread, before the CTA's __syncthreads: the e4m3 ones rows after each V tile.
  __device__ void init_ones_rows() const {
    if constexpr (Traits::kOnesRows > 0) {
      constexpr int kWords = Traits::kOnesRows * Traits::kBlockN / 4;
      for (int s = 0; s < Traits::kStages; ++s) {
        auto* ones = reinterpret_cast<std::uint32_t*>(v(s) + Traits::kVBytes);
        for (int i = threadIdx.x; i < kWords; i += blockDim.x) ones[i] = 0x38383838u;  // e4m3 1.0
      }
      cutlass::arch::fence_view_async_shared();  // visible to wgmma's reads
    }
  }

  // By one thread, before the CTA's __syncthreads.
  __device__ void init_barriers() const {
    sm90::Barrier::init(q_full(), 1);
    for (int s = 0; s < Traits::kStages; ++s) {
      sm90::Barrier::init(k_full(s), 1);
      sm90::Barrier::init(v_full(s), 1);
      // One arrival per consumer warp.
      sm90::Barrier::init(k_empty(s), Traits::kConsumerWarpgroups * 4);
      sm90::Barrier::init(v_empty(s), Traits::kConsumerWarpgroups * 4);
    }
    cutlass::arch::fence_barrier_init();
  }
};

// Ring position of a key tile: its stage and the parity of the stage's lap, stepped tile by tile
// (cheaper in the loop than a division by kStages).
template <typename Traits>
struct Stage {
  int index = 0;
  std::uint32_t phase = 0;

  __device__ Stage next() const {
    return index + 1 == Traits::kStages ? Stage{0, phase ^ 1} : Stage{index + 1, phase};
  }
};

// Loads the K tile of keys [key, key + kBlockN) of `head` (e4m3: key % 16 == 0, in even-odd
// order).
template <typename Traits>
__device__ __forceinline__ void load_k_tile(const PrefillKernelParams& p, std::uint64_t* full,
                                            std::uint8_t* dst, int key, int head) {
  constexpr int kGroups = Traits::kBlockN / 16;
  if constexpr (Traits::kEvenOddKeys) {
    const int group = key / 16;
    if (group + kGroups <= p.k_full_groups) {
      for (int c = 0; c < Traits::kChunks; ++c) {
        sm90::tma_load_5d(&p.k_map, full, dst + c * Traits::kKChunkBytes, c * Traits::kChunkElems,
                          0, 0, group, head);
      }
      return;
    }
    // The tile reaches past the last complete group: each half group from the strided map, which
    // reads keys past the end as zero (they are masked).
    for (int c = 0; c < Traits::kChunks; ++c) {
      for (int g = 0; g < kGroups; ++g) {
        for (int odd = 0; odd < 2; ++odd) {
          sm90::tma_load_3d(
              &p.k_tail_map, full,
              dst + c * Traits::kKChunkBytes + (2 * g + odd) * 8 * Traits::kChunkRowBytes,
              c * Traits::kChunkElems, key + 16 * g + odd, head);
        }
      }
    }
  } else {
    for (int c = 0; c < Traits::kChunks; ++c) {
      sm90::tma_load_3d(&p.k_map, full, dst + c * Traits::kKChunkBytes, c * Traits::kChunkElems,
                        key, head);
    }
  }
}

template <typename Traits>
__device__ void produce(const PrefillKernelParams& p, const SharedStorage<Traits>& smem,
                        const TileWork& w) {
  cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&p.q_map));
  cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&p.k_map));
  cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&p.v_map));

  sm90::Barrier::arrive_and_expect_tx(smem.q_full(), Traits::kQBytes);
  const int q_row = w.q_start + w.m_block * Traits::kBlockM;
  for (int c = 0; c < Traits::kChunks; ++c) {
    sm90::tma_load_3d(&p.q_map, smem.q_full(), smem.q() + c * Traits::kQChunkBytes,
                      c * Traits::kChunkElems, q_row, w.head);
  }
  Stage<Traits> s;
  for (int it = 0; it < w.n_blocks; ++it, s = s.next()) {
    const int n = w.n_blocks - 1 - it;
    // A fresh barrier counts as having completed the phase before its first, so the first lap
    // passes at once.
    sm90::Barrier::wait(smem.k_empty(s.index), s.phase ^ 1);
    const int key = w.k_start + tile_first_key(w, n, Traits::kBlockN);
    sm90::Barrier::arrive_and_expect_tx(smem.k_full(s.index), Traits::kKBytes);
    load_k_tile<Traits>(p, smem.k_full(s.index), smem.k(s.index), key, w.head);
    sm90::Barrier::wait(smem.v_empty(s.index), s.phase ^ 1);
    sm90::Barrier::arrive_and_expect_tx(smem.v_full(s.index), Traits::kVBytes);
    if constexpr (Traits::kFp8) {
      // Transposed V: one box of kDv dims x kBlockN keys.
      sm90::tma_load_3d(&p.v_map, smem.v_full(s.index), smem.v(s.index), key, 0, w.head);
    } else {
      constexpr int kVChunkBytes = Traits::kBlockN * 64 * 2;
      for (int c = 0; c < Traits::kDv / 64; ++c) {
        sm90::tma_load_3d(&p.v_map, smem.v_full(s.index), smem.v(s.index) + c * kVChunkBytes,
                          c * 64, key, w.head);
      }
    }
  }
}

// wgmma instruction shapes: m64 n128, k32 (e4m3) or k16 (bf16).
template <bool kFp8>
struct MmaOps;
template <>
struct MmaOps<true> {
  using QK = cute::SM90::GMMA::MMA_64x128x32_F32E4M3E4M3_SS_TN<>;
  using PV = cute::SM90::GMMA::MMA_64x136x32_F32E4M3E4M3_RS_TN<>;  // + 8 ones columns
};
template <>
struct MmaOps<false> {
  using QK = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<sm90::Major::K, sm90::Major::K>;
  using PV = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_RS<sm90::Major::K, sm90::Major::MN>;
};

// Issues (and commits) k-steps [first, first + count) of S = Q K^T for the consumer warpgroup's 64
// rows (`row0` = 0 or 64) of the tile in `stage`, the first of them overwriting s. A k-step reads
// 32 bytes of each row; step i lies in head-dim chunk i / kStepsPerChunk.
template <typename Traits, int kFirst, int kCount>
__device__ __forceinline__ void issue_qk_steps(const SharedStorage<Traits>& smem, int stage,
                                               int row0, float (&s)[64]) {
  constexpr int kSwizzle = int(Traits::kQkSwizzle);
  constexpr std::uint32_t kGroupStride = 8 * Traits::kChunkRowBytes;
  constexpr int kStepsPerChunk = Traits::kChunkRowBytes / 32;
  const std::uint64_t q = sm90::smem_descriptor(
      sm90::smem_address(smem.q()) + row0 * Traits::kChunkRowBytes, kSwizzle, 16, kGroupStride);
  const std::uint64_t k =
      sm90::smem_descriptor(sm90::smem_address(smem.k(stage)), kSwizzle, 16, kGroupStride);
  cute::warpgroup_arrive();
#pragma unroll
  for (int i = kFirst; i < kFirst + kCount; ++i) {
    const int c = i / kStepsPerChunk, kk = i % kStepsPerChunk;
    const std::uint64_t a = sm90::advance_descriptor(q, c * Traits::kQChunkBytes + kk * 32);
    const std::uint64_t b = sm90::advance_descriptor(k, c * Traits::kKChunkBytes + kk * 32);
    sm90::mma_ss<typename MmaOps<Traits::kFp8>::QK>(a, b, s, i > kFirst);
  }
  cute::warpgroup_commit_batch();
  sm90::fence_registers(s);
}

// S = Q K^T for the consumer warpgroup's rows: issues the wgmmas, calls pass_turn() once the last
// one is issued (the other consumer warpgroup may then issue its own), and returns with S
// complete (and any earlier wgmma of this warpgroup). e4m3 wgmma adds into its accumulator
// keeping only about 14 bits, which moves the scores by about 1e-3:
//  - kParts = 1, all 192 dims in the one accumulator: bf16 always, and e4m3 without an LSE. The
//    scores then only feed P, whose e4m3 rounding (2^-4 relative) dwarfs that; O's error and
//    the layer's cosine were unchanged against three parts.
//  - kParts = 3 (64 dims each, each run into a fresh accumulator, added in f32), e4m3 with an
//    LSE: it stays within 1e-3 of the exact one (one part measured 3.4e-3, two 1.3e-3). The
//    second accumulator is reused, so the turn is held across one wait and the first add.
// (The register fences after each wait keep the compiler from moving reads of the results above
// it.)
template <typename Traits, int kParts, typename PassTurn>
__device__ __forceinline__ void compute_qk(const SharedStorage<Traits>& smem, int stage, int row0,
                                           float (&s)[64], PassTurn&& pass_turn) {
  constexpr int kPart = Traits::kQkSteps / kParts;
  static_assert(Traits::kQkSteps % kParts == 0 && (kParts == 1 || (kParts == 3 && Traits::kFp8)));
  issue_qk_steps<Traits, 0, kPart>(smem, stage, row0, s);
  if constexpr (kParts == 1) {
    pass_turn();
    cute::warpgroup_wait<0>();
    sm90::fence_registers(s);
  } else {
    float t[64];
    const auto add_t = [&] {
      cute::warpgroup_wait<0>();
      sm90::fence_registers(s);
      sm90::fence_registers(t);
#pragma unroll
      for (int i = 0; i < 64; ++i) s[i] += t[i];
    };
    issue_qk_steps<Traits, kPart, kPart>(smem, stage, row0, t);
    add_t();
    issue_qk_steps<Traits, 2 * kPart, kPart>(smem, stage, row0, t);
    pass_turn();
    add_t();
  }
}

// O (+)= P V over the tile in `stage` (for e4m3 with the ones columns, N = kPvN); `p` holds P in
// the A-operand register layout, one entry per k-step of kMmaK keys. Issues and commits; the
// caller waits.
template <typename Traits>
__device__ __forceinline__ void issue_pv(const SharedStorage<Traits>& smem, int stage,
                                         std::uint32_t (&p)[Traits::kBlockN / Traits::kMmaK][4],
                                         float (&o)[Traits::kORegs], bool accumulate) {
  const std::uint32_t v_address = sm90::smem_address(smem.v(stage));
  // e4m3: V^T rows of 128 keys (128 bytes), K-major, stepping 32 keys along the row; rows kDv..
  // are the ones rows, the next 8-row group. bf16: V rows of 64 dims (128 bytes) per chunk,
  // MN-major, stepping 16 key rows; the two 64-dim chunks are kBlockN rows apart.
  const std::uint64_t v =
      Traits::kFp8 ? sm90::smem_descriptor(v_address, 128, 16, 8 * 128)
                   : sm90::smem_descriptor(v_address, 128, Traits::kBlockN * 128, 8 * 128);
  constexpr std::uint32_t kStepBytes = Traits::kFp8 ? 32 : 16 * 128;
  sm90::fence_registers(o);
#pragma unroll
  for (int ks = 0; ks < Traits::kBlockN / Traits::kMmaK; ++ks) sm90::fence_registers(p[ks]);
  cute::warpgroup_arrive();
#pragma unroll
  for (int ks = 0; ks < Traits::kBlockN / Traits::kMmaK; ++ks) {
    const std::uint64_t b = sm90::advance_descriptor(v, ks * kStepBytes);
    sm90::mma_rs<typename MmaOps<Traits::kFp8>::PV>(p[ks], b, o, accumulate || ks > 0);
  }
  cute::warpgroup_commit_batch();
  sm90::fence_registers(o);
}

// O's f32 partial sums (e4m3, see PrefillTraits::kPromoteTiles): partial = partial * pending + o
// at each promotion, where `pending` is the product of the softmax corrections since the last one
// (per row half); the final O is partial * pending + o. Each thread's slots are its own (no
// barrier), zeroed once so that every promotion is the same branch-free read-modify-write.
template <typename Traits>
struct OutputPartial {
  std::uint32_t slots;  // shared address of this thread's float4 0; float4 j is 2 KiB further
  float pending[2];

  static constexpr std::uint32_t kSlotStride = 128 * sizeof(float4);

  __device__ void init(const SharedStorage<Traits>& smem, int cw) {
    slots = sm90::smem_address(smem.o_partial(cw) + threadIdx.x % 128);
#pragma unroll
    for (int j = 0; j < Traits::kORegs / 4; ++j) {
      sm90::st_shared_f4(slots + j * kSlotStride, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
    }
    pending[0] = pending[1] = 1.0f;
  }
  __device__ void rescale(const float (&correction)[2]) {
    pending[0] *= correction[0];
    pending[1] *= correction[1];
  }
  // o[4j + 2h + e] is row half h: float4 j holds (h0, h0, h1, h1).
  __device__ float4 combined(int j, const float (&o)[Traits::kORegs]) const {
    float4 v = sm90::ld_shared_f4(slots + j * kSlotStride);
    v.x = fmaf(v.x, pending[0], o[4 * j]);
    v.y = fmaf(v.y, pending[0], o[4 * j + 1]);
    v.z = fmaf(v.z, pending[1], o[4 * j + 2]);
    v.w = fmaf(v.w, pending[1], o[4 * j + 3]);
    return v;
  }
  __device__ void add(const float (&o)[Traits::kORegs]) {
#pragma unroll
    for (int j = 0; j < Traits::kORegs / 4; ++j) {
      sm90::st_shared_f4(slots + j * kSlotStride, combined(j, o));
    }
    pending[0] = pending[1] = 1.0f;
  }
  __device__ void fold_into(float (&o)[Traits::kORegs]) const {
#pragma unroll
    for (int j = 0; j < Traits::kORegs / 4; ++j) {
      const float4 v = combined(j, o);
      o[4 * j] = v.x;
      o[4 * j + 1] = v.y;
      o[4 * j + 2] = v.z;
      o[4 * j + 3] = v.w;
    }
  }
};

}  // namespace fp8mla::cuda::attention
