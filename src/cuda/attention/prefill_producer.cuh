// The producer of the prefill kernel (one thread of warpgroup 0): Q once, then K and V tile by
// tile into the stage ring, each load completing on its stage's full barrier; it reuses a stage
// once both consumer warpgroups have arrived on its empty barrier. Key tiles are visited last to
// first, so the tiles that need masking come first.
#pragma once

#include <cstdint>

#include "cuda/attention/prefill_kernel_params.hpp"
#include "cuda/attention/prefill_scheduler.cuh"
#include "cuda/attention/prefill_shared_storage.cuh"
#include "cuda/common/sm90.cuh"

namespace fp8mla::cuda::attention {

template <typename Traits>
class PrefillProducer {
 public:
  __device__ PrefillProducer(const PrefillKernelParams& p, SharedStorage<Traits>& smem)
      : p_(p), smem_(smem) {}

  // The loads of work tile w; none where its rows see no key (the consumers then read nothing).
  __device__ void load(const TileWork& w) const {
    if (w.n_blocks <= 0) return;
    cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&p_.q_map));
    cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&p_.k_map));
    cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&p_.v_map));

    PipelineBarriers<Traits::kStages>& bar = smem_.barriers;
    sm90::Barrier::arrive_and_expect_tx(bar.q_full(), Traits::kQBytes);
    const int q_row = w.q_start + w.m_block * Traits::kBlockM;
    for (int c = 0; c < Traits::kChunks; ++c) {
      sm90::tma_load_3d(&p_.q_map, bar.q_full(), smem_.q + c * Traits::kQChunkBytes,
                        c * Traits::kChunkElems, q_row, w.head);
    }
    Stage<Traits> s;
    for (int it = 0; it < w.n_blocks; ++it, s = s.next()) {
      const int n = w.n_blocks - 1 - it;
      // A fresh barrier counts as having completed the phase before its first, so the first lap
      // passes at once.
      sm90::Barrier::wait(bar.k_empty(s.index), s.phase ^ 1);
      const int key = w.k_start + tile_first_key(w, n, Traits::kBlockN);
      sm90::Barrier::arrive_and_expect_tx(bar.k_full(s.index), Traits::kKBytes);
      load_k_tile(bar.k_full(s.index), smem_.k[s.index], key, w.head);
      sm90::Barrier::wait(bar.v_empty(s.index), s.phase ^ 1);
      sm90::Barrier::arrive_and_expect_tx(bar.v_full(s.index), Traits::kVBytes);
      load_v_tile(bar.v_full(s.index), smem_.v[s.index], key, w.head);
    }
  }

 private:
  // The K tile of keys [key, key + kBlockN) of `head` (e4m3: key % 16 == 0, in even-odd order).
  __device__ __forceinline__ void load_k_tile(std::uint64_t* full, std::uint8_t* dst, int key,
                                              int head) const {
    constexpr int kGroups = Traits::kBlockN / 16;
    if constexpr (Traits::kEvenOddKeys) {
      const int group = key / 16;
      if (group + kGroups <= p_.k_full_groups) {
        for (int c = 0; c < Traits::kChunks; ++c) {
          sm90::tma_load_5d(&p_.k_map, full, dst + c * Traits::kKChunkBytes,
                            c * Traits::kChunkElems, 0, 0, group, head);
        }
        return;
      }
      // The tile reaches past the last complete group: each half group from the strided map,
      // which reads keys past the end as zero (they are masked).
      for (int c = 0; c < Traits::kChunks; ++c) {
        for (int g = 0; g < kGroups; ++g) {
          for (int odd = 0; odd < 2; ++odd) {
            sm90::tma_load_3d(
                &p_.k_tail_map, full,
                dst + c * Traits::kKChunkBytes + (2 * g + odd) * 8 * Traits::kChunkRowBytes,
                c * Traits::kChunkElems, key + 16 * g + odd, head);
          }
        }
      }
    } else {
      for (int c = 0; c < Traits::kChunks; ++c) {
        sm90::tma_load_3d(&p_.k_map, full, dst + c * Traits::kKChunkBytes, c * Traits::kChunkElems,
                          key, head);
      }
    }
  }

  // The V tile of keys [key, key + kBlockN) of `head`.
  __device__ __forceinline__ void load_v_tile(std::uint64_t* full, std::uint8_t* dst, int key,
                                              int head) const {
    if constexpr (Traits::kFp8) {
      // Transposed V: one box of kDv dims x kBlockN keys.
      sm90::tma_load_3d(&p_.v_map, full, dst, key, 0, head);
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
