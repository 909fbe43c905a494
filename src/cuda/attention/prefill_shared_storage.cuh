// Shared memory of one CTA of the prefill kernel: Q, the K and V rings, e4m3's f32 partial sums
// of O and the pipeline's barriers, as one struct. Every tile starts on a 1024-byte boundary (the
// 128B swizzle period, which wgmma descriptors and TMA's swizzle assume).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cuda/attention/prefill_traits.cuh"
#include "cuda/attention/prefill_v_transpose.hpp"
#include "cuda/common/sm90.cuh"

namespace fp8mla::cuda::attention {

// The mbarriers of the load pipeline. The producer's loads complete on the full barriers; each
// consumer warp arrives on a stage's empty barriers once it no longer reads that stage. One
// array with int offsets: separate arrays (64-bit indexing) change the producer's code. A
// token-major e4m3 V tile completes on v_loaded instead; the transposing warps then arrive on
// v_full (see PrefillProducer::transpose_v). q_empty: the consumers have issued their last
// product with the tile's Q, which the producer may then overwrite with the next tile's.
template <int kStages>
struct PipelineBarriers {
  // q_full, k_full[], v_full[], k_empty[], v_empty[], v_loaded[], q_empty (the later ones last:
  // the others keep their offsets)
  std::uint64_t words[2 + 5 * kStages];

  __device__ std::uint64_t* q_full() { return words; }
  __device__ std::uint64_t* k_full(int stage) { return words + 1 + stage; }
  __device__ std::uint64_t* v_full(int stage) { return words + 1 + kStages + stage; }
  __device__ std::uint64_t* k_empty(int stage) { return words + 1 + 2 * kStages + stage; }
  __device__ std::uint64_t* v_empty(int stage) { return words + 1 + 3 * kStages + stage; }
  __device__ std::uint64_t* v_loaded(int stage) { return words + 1 + 4 * kStages + stage; }
  __device__ std::uint64_t* q_empty() { return words + 1 + 5 * kStages; }
};

// e4m3: the f32 partial sums of O (see PrefillTraits::kPromoteTiles), per consumer warpgroup
// float4 [kORegs / 4][128 threads]. bf16 keeps none (an empty member that takes no space).
template <typename Traits>
struct alignas(1024) OutputPartialSums {
  float4 slots[Traits::kConsumerWarpgroups][Traits::kORegs / 4][128];

  // Consumer warpgroup cw's (an int offset, as for the barriers).
  __device__ const float4* of(int cw) const { return slots[0][0] + cw * 32 * Traits::kORegs; }
};
struct NoOutputPartialSums {};

template <typename Traits>
struct SharedStorage {
  alignas(1024) std::uint8_t q[Traits::kQBytes];
  alignas(1024) std::uint8_t k[Traits::kStages][Traits::kKBytes];
  // Each stage: the V tile TMA writes (kVBytes), then e4m3's kOnesRows rows of ones.
  alignas(1024) std::uint8_t v[Traits::kStages][Traits::kVStageBytes];
  [[no_unique_address]] std::conditional_t<(Traits::kPromoteTiles > 0), OutputPartialSums<Traits>,
                                           NoOutputPartialSums>
      o_partial;
  PipelineBarriers<Traits::kStages> barriers;

  static_assert(Traits::kKBytes % 1024 == 0 && Traits::kVStageBytes % 1024 == 0,
                "a ring stride that keeps every tile 1024-byte aligned");

  // The storage at the first 1024-byte boundary of the dynamic shared memory (which the launch
  // sizes with shared_launch_bytes).
  __device__ static SharedStorage& at(std::uint8_t* dynamic_shared) {
    constexpr std::uintptr_t kAlign = alignof(SharedStorage);
    return *reinterpret_cast<SharedStorage*>(
        (reinterpret_cast<std::uintptr_t>(dynamic_shared) + kAlign - 1) & ~(kAlign - 1));
  }

  // By every thread, before the CTA's __syncthreads: the e4m3 ones rows after each V tile.
  __device__ void init_ones_rows() {
    if constexpr (Traits::kOnesRows > 0) {
      constexpr int kWords = Traits::kOnesRows * Traits::kBlockN / 4;
      for (int s = 0; s < Traits::kStages; ++s) {
        auto* ones = reinterpret_cast<std::uint32_t*>(v[s] + Traits::kVBytes);
        for (int i = threadIdx.x; i < kWords; i += blockDim.x) ones[i] = 0x38383838u;  // e4m3 1.0
      }
      cutlass::arch::fence_view_async_shared();  // visible to wgmma's reads
    }
  }

  // By one thread, before the CTA's __syncthreads. v_full completes on the producer's load, or
  // (e4m3 V given token-major) once each transposing warp has arrived.
  __device__ void init_barriers(bool v_token_major) {
    sm90::Barrier::init(barriers.q_full(), 1);
    sm90::Barrier::init(barriers.q_empty(), Traits::kConsumerWarpgroups * 4);  // one a warp
    for (int s = 0; s < Traits::kStages; ++s) {
      sm90::Barrier::init(barriers.k_full(s), 1);
      sm90::Barrier::init(barriers.v_full(s), v_token_major ? v_transpose::kWarps : 1);
      if constexpr (Traits::kFp8) sm90::Barrier::init(barriers.v_loaded(s), 1);
      // One arrival per consumer warp.
      sm90::Barrier::init(barriers.k_empty(s), Traits::kConsumerWarpgroups * 4);
      sm90::Barrier::init(barriers.v_empty(s), Traits::kConsumerWarpgroups * 4);
    }
    cutlass::arch::fence_barrier_init();
  }
};

// The dynamic shared memory a CTA is launched with: the storage up to its last barrier (sizeof
// would add the tail padding to 1024 bytes, which nothing uses) and the slack that aligning its
// base may take.
template <typename Traits>
constexpr int shared_launch_bytes() {
  using Storage = SharedStorage<Traits>;
  constexpr std::size_t kBytes =
      offsetof(Storage, barriers) + sizeof(Storage::barriers) + alignof(Storage);
  static_assert(alignof(Storage) == 1024);
  static_assert(kBytes <= 227 * 1024, "over the sm_90 shared memory limit");
  return int(kBytes);
}

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

// A role's position in the CTA's pipelines, carried from one work tile to the next: the ring
// position of the next key tile, and the phase of Q's barriers (one lap per tile that loads Q).
template <typename Traits>
struct PipelineState {
  Stage<Traits> stage;
  std::uint32_t q_phase = 0;
};

}  // namespace fp8mla::cuda::attention
