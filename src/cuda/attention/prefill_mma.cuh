// The consumers' tensor-core products of the prefill kernel: S = Q K^T from shared memory, and
// O (+)= P V with P from registers, each as the wgmmas of one consumer warpgroup's 64 rows.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/attention/prefill_shared_storage.cuh"
#include "cuda/common/sm90.cuh"

namespace fp8mla::cuda::attention {

// wgmma instruction shapes: m64 n128, k32 (e4m3) or k16 (bf16). S = Q K^T takes Q from shared
// memory (QK) or from registers (QKFromRegisters); kHalf: n64, the first 64 keys of a tile only.
template <bool kFp8>
struct MmaOps;
template <>
struct MmaOps<true> {
  template <bool kHalf>
  using QK = std::conditional_t<kHalf, cute::SM90::GMMA::MMA_64x64x32_F32E4M3E4M3_SS_TN<>,
                                cute::SM90::GMMA::MMA_64x128x32_F32E4M3E4M3_SS_TN<>>;
  template <bool kHalf>
  using QKFromRegisters =
      std::conditional_t<kHalf, cute::SM90::GMMA::MMA_64x64x32_F32E4M3E4M3_RS_TN<>,
                         cute::SM90::GMMA::MMA_64x128x32_F32E4M3E4M3_RS_TN<>>;
  using PV = cute::SM90::GMMA::MMA_64x136x32_F32E4M3E4M3_RS_TN<>;  // + 8 ones columns
};
template <>
struct MmaOps<false> {
  template <bool kHalf>
  using QK = std::conditional_t<
      kHalf, cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<sm90::Major::K, sm90::Major::K>,
      cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<sm90::Major::K, sm90::Major::K>>;
  template <bool kHalf>
  using QKFromRegisters = std::conditional_t<
      kHalf, cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_RS<sm90::Major::K, sm90::Major::K>,
      cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_RS<sm90::Major::K, sm90::Major::K>>;
  using PV = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_RS<sm90::Major::K, sm90::Major::MN>;
};

// S's accumulators that a wgmma writes: all 64 of a thread, or (kHalf, n64) the first 32, which
// hold columns 0-63 (prefill_softmax.cuh gives the layout).
template <bool kHalf>
__device__ __forceinline__ auto& score_columns(float (&s)[64]) {
  if constexpr (kHalf) {
    return reinterpret_cast<float(&)[32]>(s);
  } else {
    return s;
  }
}

// Q, the A operand of S = Q K^T, for one consumer warpgroup's 64 rows (`row0` = 0 or 64 of the
// block). Each wgmma k-step reads 32 bytes of every row; step i lies in head-dim chunk
// i / kStepsPerChunk. Two forms with one interface (issue k-step i against K's descriptor):
//  - QInShared: read from shared memory by every wgmma (SS);
//  - QInRegisters: loaded once per work tile into the A-operand registers (RS; kQkSteps x 4
//    words a thread, 24 for e4m3, 48 for bf16). S's wgmmas then read only K from shared memory
//    (docs/design.md, op 8, says which variants take which form).
template <typename Traits>
struct QkSteps {
  static constexpr int kSwizzle = int(Traits::kQkSwizzle);
  static constexpr std::uint32_t kGroupStride = 8 * Traits::kChunkRowBytes;
  static constexpr int kStepsPerChunk = Traits::kChunkRowBytes / 32;
  // Byte offset of k-step i from the start of a Q or K tile whose chunks are `chunk_bytes` long.
  __device__ static constexpr std::uint32_t offset(int i, std::uint32_t chunk_bytes) {
    return (i / kStepsPerChunk) * chunk_bytes + (i % kStepsPerChunk) * 32;
  }
};

// Both: load() once Q's tile has landed; kInRegisters: whether Q's shared memory may be released
// right after it.
template <typename Traits>
struct QInShared {
  static constexpr bool kInRegisters = false;
  std::uint64_t desc;

  __device__ void load(const SharedStorage<Traits>& smem, int row0) {
    desc = sm90::smem_descriptor(sm90::smem_address(smem.q) + row0 * Traits::kChunkRowBytes,
                                 QkSteps<Traits>::kSwizzle, 16, QkSteps<Traits>::kGroupStride);
  }
  template <bool kHalf>
  __device__ __forceinline__ void issue(int i, std::uint64_t k, float (&s)[64],
                                        bool accumulate) const {
    const std::uint64_t a =
        sm90::advance_descriptor(desc, QkSteps<Traits>::offset(i, Traits::kQChunkBytes));
    sm90::mma_ss<typename MmaOps<Traits::kFp8>::template QK<kHalf>>(a, k, score_columns<kHalf>(s),
                                                                    accumulate);
  }
};

template <typename Traits>
struct QInRegisters {
  static constexpr bool kInRegisters = true;
  std::uint32_t r[Traits::kQkSteps][4];

  // ldmatrix.x4 per k-step: matrix m holds rows 8 (m % 2) .. + 7 of the warp's 16 and bytes
  // 16 (m / 2) .. + 15 of the step, so register m of lane (g, c) is row g (+ 8) and bytes
  // 4c .. 4c + 3 (+ 16): the wgmma A-operand layout, for k32 e4m3 and k16 bf16 alike. The
  // chunk's rows are swizzled by the tile format: 16-byte unit u of row r sits at u ^ (r's
  // bits above the swizzle's row span).
  __device__ void load(const SharedStorage<Traits>& smem, int row0) {
    constexpr int kUnitsPerRow = QkSteps<Traits>::kSwizzle / 16;
    constexpr int kStepsPerChunk = QkSteps<Traits>::kStepsPerChunk;
    const int lane = int(threadIdx.x % 32), m = lane / 8;
    const int row = row0 + 16 * int((threadIdx.x % 128) / 32) + 8 * (m % 2) + lane % 8;
    const int swizzle = (row * Traits::kChunkRowBytes >> 7) & (kUnitsPerRow - 1);
    const std::uint32_t base = sm90::smem_address(smem.q) + row * Traits::kChunkRowBytes;
#pragma unroll
    for (int i = 0; i < Traits::kQkSteps; ++i) {
      const int unit = (2 * (i % kStepsPerChunk) + m / 2) ^ swizzle;
      sm90::ldmatrix_x4(base + (i / kStepsPerChunk) * Traits::kQChunkBytes + 16 * unit, r[i]);
    }
  }
  template <bool kHalf>
  __device__ __forceinline__ void issue(int i, std::uint64_t k, float (&s)[64],
                                        bool accumulate) const {
    sm90::mma_rs<typename MmaOps<Traits::kFp8>::template QKFromRegisters<kHalf>>(
        r[i], k, score_columns<kHalf>(s), accumulate);
  }
};

// Issues (and commits) k-steps [first, first + count) of S = Q K^T for the consumer warpgroup's
// rows (Q: a QInShared or QInRegisters) against the K tile in `stage`, the first of them
// overwriting s (kHalf: the tile's first 64 keys only, into s's first 32 registers).
template <typename Traits, int kFirst, int kCount, bool kHalf = false, typename Q>
__device__ __forceinline__ void issue_qk_steps(const SharedStorage<Traits>& smem, int stage,
                                               const Q& q, float (&s)[64]) {
  const std::uint64_t k =
      sm90::smem_descriptor(sm90::smem_address(smem.k[stage]), QkSteps<Traits>::kSwizzle, 16,
                            QkSteps<Traits>::kGroupStride);
  cute::warpgroup_arrive();
#pragma unroll
  for (int i = kFirst; i < kFirst + kCount; ++i) {
    const std::uint64_t b =
        sm90::advance_descriptor(k, QkSteps<Traits>::offset(i, Traits::kKChunkBytes));
    q.template issue<kHalf>(i, b, s, i > kFirst);
  }
  cute::warpgroup_commit_batch();
  sm90::fence_registers(s);
}

// Adds promoted part t of S into s once this warpgroup's wgmmas but the newest kPending are
// complete (kHalf: the first 32 registers, a tile's first 64 keys).
template <int kPending, bool kHalf = false>
__device__ __forceinline__ void add_promoted_part(float (&s)[64], float (&t)[64]) {
  cute::warpgroup_wait<kPending>();
  sm90::fence_registers(s);
  sm90::fence_registers(t);
#pragma unroll
  for (int i = 0; i < (kHalf ? 32 : 64); ++i) s[i] += t[i];
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
//    second accumulator is reused, so the turn is held across one wait and the first add. (The
//    LSE's middle turns issue the same parts, in the same order, around P V: parts_then_pv.)
// (The register fences after each wait keep the compiler from moving reads of the results above
// it.)
// kHalf: the tile's first 64 keys only (s's first 32 registers; the rest are left as they were).
template <typename Traits, int kParts, bool kHalf, typename Q, typename PassTurn>
__device__ __forceinline__ void compute_qk(const SharedStorage<Traits>& smem, int stage, const Q& q,
                                           float (&s)[64], PassTurn&& pass_turn) {
  constexpr int kPart = Traits::kQkSteps / kParts;
  static_assert(Traits::kQkSteps % kParts == 0 && (kParts == 1 || (kParts == 3 && Traits::kFp8)));
  issue_qk_steps<Traits, 0, kPart, kHalf>(smem, stage, q, s);
  if constexpr (kParts == 1) {
    pass_turn();
    cute::warpgroup_wait<0>();
    sm90::fence_registers(s);
  } else {
    float t[64];
    issue_qk_steps<Traits, kPart, kPart, kHalf>(smem, stage, q, t);
    add_promoted_part<0, kHalf>(s, t);
    issue_qk_steps<Traits, 2 * kPart, kPart, kHalf>(smem, stage, q, t);
    pass_turn();
    add_promoted_part<0, kHalf>(s, t);
  }
}

// O (+)= P V over the tile in `stage` (for e4m3 with the ones columns, N = kPvN); `p` holds P in
// the A-operand register layout, one entry per k-step of kMmaK keys. Issues and commits; the
// caller waits.
template <typename Traits>
__device__ __forceinline__ void issue_pv(const SharedStorage<Traits>& smem, int stage,
                                         std::uint32_t (&p)[Traits::kBlockN / Traits::kMmaK][4],
                                         float (&o)[Traits::kORegs], bool accumulate) {
  const std::uint32_t v_address = sm90::smem_address(smem.v[stage]);
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

}  // namespace fp8mla::cuda::attention
