// The producer of the prefill kernel (one thread of warpgroup 0), work tile after work tile: Q
// once the consumers are done with the last tile's (q_empty), then K and V key tile by key tile
// into the stage ring, each load completing on its stage's full barrier; it reuses a stage once
// both consumer warpgroups have arrived on its empty barrier. Key tiles are visited last to
// first, so the tiles that need masking come first. The ring runs on from one work tile to the
// next, so the next tile's loads start while the consumers finish the last one.
//
// e4m3 V given token-major: its tile lands untransposed in the stage (completing on v_loaded),
// and warps 1..3 of the warpgroup turn it into the V^T the transposed load writes, in place
// (transpose_v), then arrive on v_full. The consumers see the same bytes either way.
#pragma once

#include <cstdint>

#include "cuda/attention/prefill_kernel_params.hpp"
#include "cuda/attention/prefill_scheduler.cuh"
#include "cuda/attention/prefill_shared_storage.cuh"
#include "cuda/attention/prefill_v_transpose.hpp"
#include "cuda/common/sm90.cuh"

namespace fp8mla::cuda::attention {

template <typename Traits>
class PrefillProducer {
 public:
  __device__ PrefillProducer(const PrefillKernelParams& p, SharedStorage<Traits>& smem)
      : p_(p), smem_(smem) {}

  // Once per CTA, before its first load.
  __device__ void prefetch_maps() const {
    cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&p_.q_map));
    cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&p_.k_map));
    if (p_.k_rope_split) {
      cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&p_.k_rope_map));
    }
    cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&p_.v_map));
  }

  // The loads of work tile w; none where its rows see no key (the consumers then read nothing).
  __device__ void load(const TileWork& w, PipelineState<Traits>& state) const {
    if (w.n_blocks <= 0) return;
    PipelineBarriers<Traits::kStages>& bar = smem_.barriers;
    // A fresh barrier counts as having completed the phase before its first, so the first tile's
    // wait (and the first lap of each stage's) passes at once.
    sm90::Barrier::wait(bar.q_empty(), state.q_phase ^ 1);
    state.q_phase ^= 1;
    sm90::Barrier::arrive_and_expect_tx(bar.q_full(), Traits::kQBytes);
    const int q_row = w.q_start + w.m_block * Traits::kBlockM;
    for (int c = 0; c < Traits::kChunks; ++c) {
      sm90::tma_load_3d(&p_.q_map, bar.q_full(), smem_.q + c * Traits::kQChunkBytes,
                        c * Traits::kChunkElems, q_row, w.head);
    }
    Stage<Traits> s = state.stage;
    for (int it = 0; it < w.n_blocks; ++it, s = s.next()) {
      const int n = w.n_blocks - 1 - it;
      sm90::Barrier::wait(bar.k_empty(s.index), s.phase ^ 1);
      const int key = w.k_start + tile_first_key(w, n, Traits::kBlockN);
      sm90::Barrier::arrive_and_expect_tx(bar.k_full(s.index), Traits::kKBytes);
      load_k_tile(bar.k_full(s.index), smem_.k[s.index], key, w.head);
      sm90::Barrier::wait(bar.v_empty(s.index), s.phase ^ 1);
      std::uint64_t* v_loaded =
          Traits::kFp8 && p_.v_token_major ? bar.v_loaded(s.index) : bar.v_full(s.index);
      sm90::Barrier::arrive_and_expect_tx(v_loaded, Traits::kVBytes);
      load_v_tile(v_loaded, smem_.v[s.index], key, w.head);
    }
    state.stage = s;
  }

  // By warps 1..3 (e4m3 V given token-major; the kernel calls it only then), warp kWarp + 1: each
  // V tile of work tile w, once loaded, transposed in place into the stage's V^T
  // (prefill_v_transpose.hpp: each warp swaps its pairs of 16x16-byte blocks, disjoint from the
  // other warps'), then released to the consumers. The stage is free to write: the load into it
  // waited for its v_empty, and its next load waits for the consumers, who wait for this v_full.
  // `stage`: the ring position of the tile's first key tile, stepped past its last.
  template <int kWarp>
  __device__ void transpose_v(const TileWork& w, Stage<Traits>& stage) const {
    if constexpr (Traits::kFp8) {
      static_assert(Traits::kVBytes == v_transpose::kTileBytes);
      if (w.n_blocks <= 0) return;
      const int lane = int(threadIdx.x % 32);
      const LaneTerms lt{v_transpose::load_lane_offset(lane), v_transpose::store_lane_offset(lane),
                         v_transpose::half_flip(lane), v_transpose::byte_selector(lane, 0)};
      PipelineBarriers<Traits::kStages>& bar = smem_.barriers;
      Stage<Traits> s = stage;
      for (int it = 0; it < w.n_blocks; ++it, s = s.next()) {
        sm90::Barrier::wait(bar.v_loaded(s.index), s.phase);
        transpose_tile<kWarp>(sm90::smem_address(smem_.v[s.index]), lt);
        cutlass::arch::fence_view_async_shared();  // the writes, visible to wgmma's reads
        __syncwarp();
        if (lane == 0) cutlass::arch::ClusterBarrier::arrive(bar.v_full(s.index));
      }
      stage = s;
    }
  }

 private:
  // A transposing lane's terms (prefill_v_transpose.hpp; the second byte selector is sel0 ^
  // 0x1111).
  struct LaneTerms {
    std::uint32_t ld, st, flip, sel0;
  };

  // Warp kWarp's steps of the tile at shared address `tile`, unrolled so that each step's pair is
  // a constant and its offsets two bit operations a lane (about ten instructions a step). The
  // next step's ldmatrix goes out before this one's stmatrix (the steps touch disjoint bytes);
  // __syncwarp orders a step's reads by every lane before its writes. The lane terms are made
  // opaque tile by tile: hoisted out of the tile loop, every step's offsets would stay live and
  // spill past the warpgroup's kProducerRegisters.
  template <int kWarp>
  __device__ __forceinline__ static void transpose_tile(std::uint32_t tile, LaneTerms lt) {
    asm volatile("" : "+r"(lt.ld), "+r"(lt.st), "+r"(lt.flip));
    constexpr int kCount = v_transpose::warp_steps(kWarp);
    const auto step = [](int i) { return v_transpose::step_pair(kWarp + i * v_transpose::kWarps); };
    std::uint32_t r[4];
    sm90::ldmatrix_x4(tile + v_transpose::load_offset(step(0), lt.flip, lt.ld), r);
#pragma unroll
    for (int i = 0; i < kCount; ++i) {
      const std::uint32_t t[4] = {
          __byte_perm(r[0], r[1], lt.sel0), __byte_perm(r[0], r[1], lt.sel0 ^ 0x1111u),
          __byte_perm(r[2], r[3], lt.sel0), __byte_perm(r[2], r[3], lt.sel0 ^ 0x1111u)};
      if (i + 1 < kCount) {
        sm90::ldmatrix_x4(tile + v_transpose::load_offset(step(i + 1), lt.flip, lt.ld), r);
      }
      __syncwarp();
      sm90::stmatrix_trans_x4(tile + v_transpose::store_offset(step(i), lt.flip, lt.st), t);
    }
  }

  // The K tile of keys [key, key + kBlockN) of `head` (e4m3: key % 16 == 0, in even-odd order).
  // Chunk c of the head dim comes from k's maps, or (the last, with k_rope) from k_rope's, whose
  // one row serves every head.
  __device__ __forceinline__ void load_k_tile(std::uint64_t* full, std::uint8_t* dst, int key,
                                              int head) const {
    for (int c = 0; c < Traits::kChunks; ++c) {
      const bool rope = p_.k_rope_split && c == Traits::kChunks - 1;
      load_k_chunk(rope ? &p_.k_rope_map : &p_.k_map, rope ? &p_.k_rope_tail_map : &p_.k_tail_map,
                   full, dst + c * Traits::kKChunkBytes, rope ? 0 : c * Traits::kChunkElems, key,
                   rope ? 0 : head);
    }
  }

  // One 64-element chunk of a K tile, at `element` of the maps' rows.
  __device__ __forceinline__ void load_k_chunk(const CUtensorMap* map, const CUtensorMap* tail_map,
                                               std::uint64_t* full, std::uint8_t* dst, int element,
                                               int key, int head) const {
    constexpr int kGroups = Traits::kBlockN / 16;
    if constexpr (Traits::kEvenOddKeys) {
      const int group = key / 16;
      if (group + kGroups <= p_.k_full_groups) {
        sm90::tma_load_5d(map, full, dst, element, 0, 0, group, head);
        return;
      }
      // The tile reaches past the last complete group: each half group from the strided map,
      // which reads keys past the end as zero (they are masked).
      for (int g = 0; g < kGroups; ++g) {
        for (int odd = 0; odd < 2; ++odd) {
          sm90::tma_load_3d(tail_map, full, dst + (2 * g + odd) * 8 * Traits::kChunkRowBytes,
                            element, key + 16 * g + odd, head);
        }
      }
    } else {
      sm90::tma_load_3d(map, full, dst, element, key, head);
    }
  }

  // The V tile of keys [key, key + kBlockN) of `head`.
  __device__ __forceinline__ void load_v_tile(std::uint64_t* full, std::uint8_t* dst, int key,
                                              int head) const {
    if constexpr (Traits::kFp8) {
      // Transposed V: one box of kDv rows x kBlockN keys; token-major: kBlockN rows x kDv dims
      // (the map's dims are swapped).
      const bool token_major = p_.v_token_major;
      sm90::tma_load_3d(&p_.v_map, full, dst, token_major ? 0 : key, token_major ? key : 0, head);
    } else {
      constexpr int kVChunkBytes = Traits::kBlockN * 64 * 2;
      for (int c = 0; c < Traits::kDv / 64; ++c) {
        sm90::tma_load_3d(&p_.v_map, full, dst + c * kVChunkBytes, c * 64, key, head);
      }
    }
  }

  const PrefillKernelParams& p_;
  SharedStorage<Traits>& smem_;
};

}  // namespace fp8mla::cuda::attention
