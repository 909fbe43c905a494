// Which work a CTA of the prefill kernel owns: grid (m blocks, heads, sequences); causal grids
// take the m blocks last to first, so the CTAs with the most keys start first. Every thread
// computes the same TileWork from cu_seqlens (no host sync decides anything).
#pragma once

#include <cstdint>

namespace fp8mla::cuda::attention {

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

template <typename Traits>
__device__ __forceinline__ TileWork schedule_tile(const std::int32_t* cu_seqlens_q,
                                                  const std::int32_t* cu_seqlens_k) {
  TileWork w;
  w.m_block = Traits::kIsCausal ? int(gridDim.x - 1 - blockIdx.x) : int(blockIdx.x);
  w.head = int(blockIdx.y);
  const int seq = int(blockIdx.z);
  w.q_start = cu_seqlens_q[seq];
  w.q_len = cu_seqlens_q[seq + 1] - w.q_start;
  w.k_start = cu_seqlens_k[seq];
  w.k_len = cu_seqlens_k[seq + 1] - w.k_start;
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
