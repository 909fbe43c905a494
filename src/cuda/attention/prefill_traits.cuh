// Tile shapes and shared-memory tile formats of the Hopper prefill attention kernel (op 8).
//
// One CTA owns kBlockM = 128 query rows of one (sequence, head): warpgroup 0 is the producer (one
// thread issues the TMA loads), warpgroups 1 and 2 each own 64 rows and run S = Q K^T, the online
// softmax and O += P V with wgmma. K and V go through a kStages-deep ring of kBlockN-key tiles.
//
// Every Q/K tile is stored as kDqk / 64 chunks of [rows][64 elements] (64 bytes a row for e4m3,
// swizzled 64B; 128 bytes for bf16, swizzled 128B), the layout TMA writes and wgmma reads as a
// K-major operand. Each wgmma k-step covers 32 bytes of a row for both dtypes (k32 e4m3, k16
// bf16). V differs by dtype, because FP8 wgmma only reads K-major operands:
//  - e4m3: V is given transposed (keys contiguous, see fp8mla/attention.hpp) and lands as
//    [kDv rows][kBlockN keys], K-major, swizzled 128B. Each stage's tile is followed by 8 rows of
//    e4m3 ones, so the P V wgmma runs with N = kDv + 8 and its extra columns hold the sum of the
//    rounded P of each row: O is normalized by exactly what it accumulated (an all-ones V gives
//    exactly 1).
//  - bf16: V is token-major and lands as kDv / 64 chunks of [kBlockN keys][64 dims], read by the
//    transposing (MN-major) form of wgmma.
// e4m3 K tiles hold each group of 16 keys in even-odd order (keys 0, 2, .., 14, then 1, 3, .., 15;
// the TMA map walks the rows that way). Lane c of a quad then holds, in S's accumulator layout,
// keys 4c .. 4c + 3 of each group: exactly what its register of the P V wgmma's A operand (k32)
// wants, so P goes from S to the operand with two conversions a register and no shuffle. V keeps
// the natural key order. prefill_shared_storage.cuh places the tiles in shared memory.
#pragma once

#include <cstdint>

namespace fp8mla::cuda::attention {

enum class Swizzle : int { k64B = 64, k128B = 128 };

template <bool kIsFp8, bool kCausal, int kHeadDimQk = 192, int kHeadDimV = 128, bool kFold = false>
struct PrefillTraits {
  static constexpr bool kFp8 = kIsFp8;
  static constexpr bool kIsCausal = kCausal;
  // The epilogue folds a prior state into the output (PrefillAttentionArgs::prior_out): a
  // variant of its own, so that the others' code is untouched by it.
  static constexpr bool kFoldsPrior = kFold;
  static constexpr int kDqk = kHeadDimQk;
  static constexpr int kDv = kHeadDimV;
  static_assert(kDqk % 64 == 0 && kDv == 128, "the kernel is built for Dqk in 64s and Dv = 128");

  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = 128;
  // K/V ring depth: three stages where shared memory allows (e4m3), since a consumer holds a
  // tile's V until the next tile's scores are issued.
  static constexpr int kStages = kFp8 ? 3 : 2;
  static constexpr int kConsumerWarpgroups = kBlockM / 64;
  static constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);

  static constexpr int kElementBytes = kFp8 ? 1 : 2;
  // Q/K: chunks of 64 elements along the head dim.
  static constexpr int kChunkElems = 64;
  static constexpr int kChunks = kDqk / kChunkElems;
  static constexpr int kChunkRowBytes = kChunkElems * kElementBytes;
  static constexpr Swizzle kQkSwizzle = kFp8 ? Swizzle::k64B : Swizzle::k128B;
  static constexpr int kQChunkBytes = kBlockM * kChunkRowBytes;
  static constexpr int kKChunkBytes = kBlockN * kChunkRowBytes;
  static constexpr int kQBytes = kQChunkBytes * kChunks;
  static constexpr int kKBytes = kKChunkBytes * kChunks;
  static constexpr int kVBytes = kBlockN * kDv * kElementBytes;  // what TMA writes
  static constexpr int kOnesRows = kFp8 ? 8 : 0;
  static constexpr int kVStageBytes = kVBytes + kOnesRows * kBlockN;
  // P V: N = kDv (+ 8 ones columns for e4m3); a thread holds N / 2 accumulators.
  static constexpr int kPvN = kDv + kOnesRows;
  static constexpr int kORegs = kPvN / 2;
  // One wgmma k-step reads 32 bytes of each row: 32 e4m3 or 16 bf16 elements.
  static constexpr int kMmaK = 32 / kElementBytes;
  static constexpr int kQkSteps = kDqk * kElementBytes / 32;  // k-steps of S = Q K^T

  // e4m3 wgmma keeps only about 14 bits when it adds into its accumulator, which over thousands
  // of keys biases O and the ones-column sum. So O restarts every kPromoteTiles tiles, after its
  // value is added into f32 partial sums kept in shared memory (kORegs a thread).
  static constexpr int kPromoteTiles = kFp8 ? 8 : 0;

  // Whether K tiles hold their keys in even-odd order (see above).
  static constexpr bool kEvenOddKeys = kFp8;
  // The key (from the tile's first) that S column n holds for lane c = 0 of a quad (whose columns
  // are 8j and 8j + 1); lane c's columns hold kLaneKeyStep * c more.
  static constexpr int key_of_column(int n) {
    return kEvenOddKeys ? (n & ~15) | ((n & 7) << 1) | ((n >> 3) & 1) : n;
  }
  static constexpr int kLaneKeyStep = kEvenOddKeys ? 4 : 2;

  // A P tile is scaled by 2^kPShift before its FP8 cast so that probabilities down to 2^-14 stay
  // normal e4m3 numbers (the row maximum becomes 256, exact); the row sum carries the same factor,
  // so it cancels in O / l.
  static constexpr float kPShift = kFp8 ? 8.0f : 0.0f;
};

}  // namespace fp8mla::cuda::attention
