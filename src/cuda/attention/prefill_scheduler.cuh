// Which work tile a CTA of the prefill kernel runs. A scheduler sets the launch grid and gives a
// CTA its work (is_valid: whether there is any); every thread of the CTA computes the same
// TileWork from cu_seqlens (no host sync decides anything), and every role runs it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/prefill_kernel_params.hpp"
#include "ops/prefill_attention_params.hpp"

namespace fp8mla::cuda::attention {

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
__device__ __forceinline__ TileWork make_tile_work(const PrefillKernelParams& p, int m_block,
                                                   int head, int seq) {
  TileWork w;
  w.m_block = m_block;
  w.head = head;
  w.q_start = p.cu_seqlens_q[seq];
  w.q_len = p.cu_seqlens_q[seq + 1] - w.q_start;
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

// One CTA per work tile, on the grid (m blocks, heads, sequences). Causal grids take the m blocks
// last to first, so the CTAs with the most keys start first.
template <typename Traits>
struct StaticTileScheduler {
  // The launch grid (x = 0: no work at all).
  static dim3 grid(const PrefillAttentionParams& p) {
    const std::int64_t m_blocks = (p.max_seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
    return dim3(unsigned(m_blocks), unsigned(p.heads), unsigned(p.batch));
  }

  __device__ TileWork initial_work(const PrefillKernelParams& p) const {
    const int m_block = Traits::kIsCausal ? int(gridDim.x - 1 - blockIdx.x) : int(blockIdx.x);
    return make_tile_work<Traits>(p, m_block, int(blockIdx.y), int(blockIdx.z));
  }
  // A CTA whose m block lies past its sequence's queries has no work.
  __device__ static bool is_valid(const TileWork& w) { return w.has_rows; }
};

// The sequence-local key of column 0 of key tile n.
__device__ __forceinline__ int tile_first_key(const TileWork& w, int n, int block_n) {
  return n * block_n - w.key_shift;
}

// Whether key tile n needs the per-element mask: it starts before the sequence's keys or runs
// past them, or (causal) some key of it lies beyond the first row's diagonal.
template <typename Traits>
__device__ __forceinline__ bool tile_needs_mask(const TileWork& w, int n) {
  const int first = tile_first_key(w, n, Traits::kBlockN);
  const int end = first + Traits::kBlockN;
  if (first < 0 || end > w.k_len) return true;
  return Traits::kIsCausal && end - 1 > w.m_block * Traits::kBlockM + w.k_len - w.q_len;
}

}  // namespace fp8mla::cuda::attention
