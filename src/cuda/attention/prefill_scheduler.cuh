// Which work tiles a CTA of the prefill kernel runs. A scheduler sets the launch grid and hands a
// CTA its tiles one after another; every thread of the CTA computes the same TileWork from
// cu_seqlens (no host sync decides anything), and every role runs it.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "fp8mla/error.hpp"
#include "fp8mla/numerics.hpp"

#include "cuda/attention/prefill_kernel_params.hpp"
#include "ops/prefill_attention_params.hpp"

namespace fp8mla::cuda::attention {

// The arithmetic here is host-callable too (FP8MLA_HOST_DEVICE):
// tests/cpp/prefill_scheduler_test.cu checks it on the CPU against a direct reading of the causal
// rule, for any batch.

// One work tile: kBlockM query rows of one (sequence, head) against the keys they can see.
struct TileWork {
  int head;
  int m_block;         // 128-row block of the sequence's queries
  int q_start, q_len;  // the sequence's queries (token offset, count)
  int k_start, k_len;  // its keys
  // Key tiles start key_shift keys before the sequence's first key, so that their first key is
  // 16-byte aligned (TMA needs that of the innermost coordinate: the key of transposed e4m3 V);
  // tile n holds the sequence's keys n * kBlockN - key_shift onwards, the shifted-in ones masked.
  int key_shift;
  int n_blocks;   // key tiles to visit: 0 for rows that see no key
  bool has_rows;  // false: the m block lies past the sequence's queries
};

// The work tile of (m block, head, sequence).
template <typename Traits>
FP8MLA_HOST_DEVICE TileWork make_tile_work(const PrefillKernelParams& p, int m_block, int head,
                                           int seq, int q_start, int q_len) {
  TileWork w;
  w.m_block = m_block;
  w.head = head;
  w.q_start = q_start;
  w.q_len = q_len;
  w.k_start = p.cu_seqlens_k[seq];
  w.k_len = p.cu_seqlens_k[seq + 1] - w.k_start;
  w.key_shift = Traits::kFp8 ? w.k_start % 16 : 0;
  w.has_rows = w.m_block * Traits::kBlockM < w.q_len;
  // Keys [0, n_end) can be visible to some row of the block; bottom-right causal alignment puts
  // key j in reach of row i when j <= i + k_len - q_len.
  int n_end = w.k_len;
  if (Traits::kIsCausal) {
    const int last_row = w.m_block * Traits::kBlockM + Traits::kBlockM - 1;
    n_end = min(n_end, last_row + 1 + w.k_len - w.q_len);
  }
  w.n_blocks = n_end > 0 ? (n_end + w.key_shift + Traits::kBlockN - 1) / Traits::kBlockN : 0;
  return w;
}

// The work tiles in one order on a one-dimensional index (rising index: the order the tiles are
// meant to start in): sequence by sequence, each one's heads in sections, and within a section
// the tiles by rank, every head of the section at each rank. A causal tile's rank counts from its
// sequence's last m block (rank 0: the tile with the most keys), so a section's tiles go longest
// first. Tiles that run together read the same tokens of neighbouring heads, whose rows share
// DRAM pages and cache lines.
//  - The sections but the last of a sequence are small: their keys and values fit in
//    kLocalBytes, so the CTAs that read the same key tiles run at about the same time and find
//    them in L2. One section's tail overlaps the next one's start.
//  - The last section is the one whose tail what follows waits for (the kernel's end, for the
//    last sequence): it takes enough heads that its longest-first tiles fill every SM for twice
//    the longest tile (a greedy schedule of decreasing jobs then ends within half of one), as
//    many as fit in kL2Bytes.
// The sizes come from max_seqlen_q and max_seqlen_k; the index covers max_seqlen_q's m blocks of
// every sequence, and a tile whose rank lies past its sequence's blocks has no rows.
//
// A CTA runs tiles of the order in rounds of gridDim.x: CTA b takes tile b of even rounds and
// tile gridDim.x - 1 - b of odd ones (within a round the tiles go longest first, so the zigzag
// evens out what each CTA gets). With a grid of every tile that is one tile a CTA, handed out
// by the hardware to whichever SM frees first: the schedule for long tiles, whose lengths vary
// too much for a fixed assignment. Where every tile is short (at most kPersistentKeys keys) and
// there are many rounds, the grid is persistent, one CTA per SM (one fills an SM's shared
// memory): the producer then loads the next tile while the consumers finish the last one, and
// the CTA's set-up is paid once, which is a large share of a short tile (16 x 1k: +20 % on the
// H200, docs/design.md op 8). Finding a tile is arithmetic on its index and the sequence's
// offsets, the loads a tile needs anyway: nothing waits on a scan of the batch.
template <typename Traits>
struct ZigzagTileScheduler {
  // Persistent grids: every tile at most this many keys, and at least kPersistentRounds rounds.
  static constexpr int kPersistentKeys = 2048;
  static constexpr int kPersistentRounds = 8;

  // The launch grid for a device of `sm_count` SMs (x = 0: no work at all).
  static dim3 grid(const PrefillAttentionParams& p, int sm_count) {
    const std::int64_t all = tiles(p);
    const bool persistent =
        p.max_seqlen_k <= kPersistentKeys && all >= std::int64_t(kPersistentRounds) * sm_count;
    return dim3(unsigned(persistent ? sm_count : all));
  }

  // The tile order's parameters (TileOrder in prefill_kernel_params.hpp) for a device of
  // `sm_count` SMs.
  static TileOrder order(const PrefillAttentionParams& p, int sm_count) {
    // 24 MiB: half the H100/H200 L2, whose two partitions each hold a copy of what both read.
    constexpr std::int64_t kL2Bytes = std::int64_t(24) << 20;
    constexpr std::int64_t kLocalBytes = std::int64_t(4) << 20;
    const std::int64_t head_bytes = std::max<std::int64_t>(p.max_seqlen_k, 1) *
                                    (Traits::kDqk + Traits::kDv) * Traits::kElementBytes;
    const std::int64_t small = std::clamp<std::int64_t>(kLocalBytes / head_bytes, 1, p.heads);
    // A head's work in key tiles, estimated from the longest query and key runs.
    const std::int64_t m = m_blocks(p);
    const std::int64_t longest =
        (std::int64_t(p.max_seqlen_k) + Traits::kBlockN - 1) / Traits::kBlockN;
    const std::int64_t head_work =
        std::max<std::int64_t>(m * longest / (Traits::kIsCausal ? 2 : 1), 1);
    const std::int64_t tail_heads = (2 * longest * sm_count + head_work - 1) / head_work;
    const std::int64_t last_target =
        std::clamp<std::int64_t>(std::min(tail_heads, kL2Bytes / head_bytes), small, p.heads);
    const std::int64_t sections = (p.heads - last_target) / small;
    TileOrder o;
    o.tiles = int(tiles(p));
    o.small_sections = int(sections);
    o.section_heads = int(small);
    o.sequence_tiles = cutlass::FastDivmod(int(m * p.heads));
    o.section_tiles = cutlass::FastDivmod(int(m * small));
    o.heads[0] = cutlass::FastDivmod(int(small));
    o.heads[1] = cutlass::FastDivmod(int(p.heads - sections * small));
    return o;
  }

  // Whether this CTA has a work tile with rows. Only a grid of one CTA a tile has CTAs without
  // (a ragged batch's shorter sequences: the index gives every sequence max_seqlen_q's blocks);
  // they can leave before the roles start. The test is make_tile_work's has_rows on the rank (a
  // causal m block counts from the other end, over the same blocks), without the key offsets.
  __device__ static bool has_rows(const PrefillKernelParams& p) {
    if (int(gridDim.x) < p.order.tiles) return true;  // persistent: every CTA has tiles
    return tile_has_rows(p, int(blockIdx.x));
  }
  // Whether tile `tile` of the order has rows, from its slot alone (work_of's has_rows). (The grid
  // test above stays in has_rows, ahead of the slot: with both read first, as arguments of one
  // call, ptxas serialized the e4m3 causal kernel's wgmmas for want of registers.)
  FP8MLA_HOST_DEVICE static bool tile_has_rows(const PrefillKernelParams& p, int tile) {
    const Slot s = slot_of(p, tile);
    return s.rank * Traits::kBlockM < p.cu_seqlens_q[s.seq + 1] - p.cu_seqlens_q[s.seq];
  }

  // Calls fn(work) for each of this CTA's work tiles that has rows, in its order. Every role of
  // the CTA calls it and sees the same tiles.
  template <typename Fn>
  __device__ static void for_each_tile(const PrefillKernelParams& p, Fn&& fn) {
    const int ctas = int(gridDim.x), cta = int(blockIdx.x);
    for (int round = 0;; ++round) {
      const int tile = tile_of(round, ctas, cta);
      if (tile >= p.order.tiles) return;
      const TileWork w = work_of(p, tile);
      if (w.has_rows) fn(w);
    }
  }

  // The tile that CTA `cta` of a grid of `ctas` runs in round `round` (past the last: >= tiles).
  FP8MLA_HOST_DEVICE static int tile_of(int round, int ctas, int cta) {
    return round * ctas + (round & 1 ? ctas - 1 - cta : cta);
  }

  // The work tile at position `tile` of the order.
  FP8MLA_HOST_DEVICE static TileWork work_of(const PrefillKernelParams& p, int tile) {
    const Slot s = slot_of(p, tile);
    const int q_start = p.cu_seqlens_q[s.seq];
    const int q_len = p.cu_seqlens_q[s.seq + 1] - q_start;
    const int blocks = (q_len + Traits::kBlockM - 1) / Traits::kBlockM;
    // Past the sequence's blocks, m_block is out of range and has_rows false.
    const int m_block = Traits::kIsCausal && s.rank < blocks ? blocks - 1 - s.rank : s.rank;
    return make_tile_work<Traits>(p, m_block, s.head, s.seq, q_start, q_len);
  }

 private:
  // Where tile `tile` of the order sits: its sequence, its rank within its section (causal: 0 is
  // the sequence's last m block) and its head.
  struct Slot {
    int seq, rank, head;
  };
  FP8MLA_HOST_DEVICE static Slot slot_of(const PrefillKernelParams& p, int tile) {
    const TileOrder& o = p.order;
    int in_sequence, local, head_in_section;
    Slot s;
    s.seq = o.sequence_tiles.divmod(in_sequence, tile);
    int section = o.section_tiles.divmod(local, in_sequence);
    const bool last = section >= o.small_sections;
    if (last) {  // the last section's tiles, counted from its start
      local += (section - o.small_sections) * o.section_tiles.divisor;
      section = o.small_sections;
    }
    s.rank = o.heads[last].divmod(head_in_section, local);
    s.head = section * o.section_heads + head_in_section;
    return s;
  }

  static std::int64_t m_blocks(const PrefillAttentionParams& p) {
    return (p.max_seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  }
  // Every work tile of the order; the host checks that it fits the kernel's int index.
  static std::int64_t tiles(const PrefillAttentionParams& p) {
    const std::int64_t tiles = m_blocks(p) * p.batch * p.heads;
    if (tiles > INT32_MAX / 2) {
      throw Error(ErrorCategory::kUnsupported,
                  "prefill_attention: " + std::to_string(tiles) +
                      " work tiles (ceil(max_seqlen_q / 128) * batch * heads); the CUDA kernel "
                      "takes at most 2^30 - 1");
    }
    return tiles;
  }
};

// The sequence-local key of column 0 of key tile n.
FP8MLA_HOST_DEVICE int tile_first_key(const TileWork& w, int n, int block_n) {
  return n * block_n - w.key_shift;
}

// Whether key tile n needs the per-element mask: it starts before the sequence's keys or runs
// past them, or (causal) some key of it lies beyond the first row's diagonal.
template <typename Traits>
FP8MLA_HOST_DEVICE bool tile_needs_mask(const TileWork& w, int n) {
  const int first = tile_first_key(w, n, Traits::kBlockN);
  const int end = first + Traits::kBlockN;
  if (first < 0 || end > w.k_len) return true;
  return Traits::kIsCausal && end - 1 > w.m_block * Traits::kBlockM + w.k_len - w.q_len;
}

// Whether the 64 rows from `row0` of the work tile's block (a consumer warpgroup's) see keys of
// key tile n in its first 64 keys only: the rest lie past the sequence's keys or (causal) past
// the diagonal of the last of those rows, so their P is 0 for every row. Warpgroup 0's rows end
// 64 keys before warpgroup 1's, so on a causal work tile the last key tile is such a tile for
// warpgroup 0 wherever the diagonal bounds its rows, and for warpgroup 1 too where its own rows
// end in the tile's first half.
template <typename Traits>
FP8MLA_HOST_DEVICE bool sees_first_half(const TileWork& w, int n, int row0) {
  int end = w.k_len;  // keys [0, end) are seen by some of the rows
  if constexpr (Traits::kIsCausal) {
    end = min(end, w.m_block * Traits::kBlockM + row0 + 64 + w.k_len - w.q_len);
  }
  return end <= tile_first_key(w, n, Traits::kBlockN) + 64;
}

}  // namespace fp8mla::cuda::attention
