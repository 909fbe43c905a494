// The in-place transposition of a token-major e4m3 V tile in shared memory (prefill kernel,
// fp8mla/attention.hpp): which bytes each lane of the transposing warps moves. Plain C++ so that
// a host test (tests/cpp/prefill_v_transpose_test.cpp) replays the whole transposition byte by
// byte; prefill_producer.cuh runs it with ldmatrix, prmt and stmatrix.
//
// FP8 wgmma reads V^T: [kDv rows][kBlockN keys], K-major, 128B-swizzled (prefill_traits.cuh). A
// token-major V tile is loaded by TMA into the same 16 KiB of the stage with the same swizzle but
// untransposed, [kBlockN keys][kDv dims]. With M the tile as the matrix of its 128 swizzled rows
// of 128 bytes, byte (r, c) at swizzled_offset(r, c), TMA writes M[key][dim] = V[key][dim] and
// wgmma wants M[dim][key] = V[key][dim]: the job is M := M^T, with one address function for both.
// So the 16x16-byte block (R, C) (rows 16R.., chunk C) and block (C, R) occupy, together, the
// bytes their transposes go to: each step of a warp reads such a pair and writes it back
// transposed, and no step touches another's bytes. No staging buffer is needed (the e4m3 kernel's
// shared memory is nearly full), and the warps need no barrier between them.
//
// A step: one ldmatrix.x4 (b16, not transposed) loads 4 matrices of 8 rows x 16 bytes, 2 per
// block: matrix 2b + i holds the 8 keys of block b's 16 whose index within the block is
// load_row(.) (one key of each even-odd pair; i picks which). Lane t then holds, per block, the
// same 4 dims of keys 2(t/4) and 2(t/4) + 1 in two registers; two prmt make, per pair of dims,
// the 16-bit (even key, odd key) byte pairs of 2 dims a register; stmatrix.x4.trans (16-bit
// transpose) writes them as rows of V^T. A 16-bit transpose of 2x2 byte pairs, each pair
// transposed by prmt, is the byte transpose. load_row and store_row interleave the rows so that
// each 8-row matrix covers the 8 chunk positions of the swizzle: no bank conflicts.
//
// The 64 blocks make 32 steps (28 pairs (R, C), (C, R) with R != C, 4 of two diagonal blocks),
// dealt round-robin to the kWarps warps, each of which runs its steps unrolled (their pairs
// compile-time constants).
#pragma once

#include <cstdint>

#include "fp8mla/numerics.hpp"  // FP8MLA_HOST_DEVICE

namespace fp8mla::cuda::attention::v_transpose {

constexpr int kRows = 128;  // of 128 bytes: kBlockN keys or kDv dims
constexpr int kTileBytes = kRows * 128;
constexpr int kSteps = 32;
constexpr int kWarps = 3;  // warps 1..3 of the producer warpgroup (warp 0 issues the TMA loads)

// Byte (row, col) of a 128x128-byte tile at a 1024-byte boundary, in TMA's SWIZZLE_128B and
// wgmma's 128B K-major layout (cute Swizzle<3,4,3>: address bits 4-6 ^= bits 7-9): the 16-byte
// chunk index XOR row % 8.
FP8MLA_HOST_DEVICE constexpr int swizzled_offset(int row, int col) {
  return row * 128 + ((((col >> 4) ^ row) & 7) << 4) + (col & 15);
}

// A 16x16-byte block of the tile: rows 16 * row .. + 15, chunk (bytes 16 * chunk .. + 15).
struct Block {
  int row, chunk;
};

// Step `step`'s pair of blocks, as warp-uniform values: lanes 0-15 read block (p, q), lanes 16-31
// block (p ^ d, q ^ d); each half writes the transpose of its block into block (chunk, row).
// Steps 0-3: the diagonal blocks 2s and 2s + 1 (d = 1), each transposed onto itself; steps 4-31:
// (p, p ^ x) and (p ^ x, p) for x = 1..7, four each (p with bit h, x's highest, clear; d = x).
struct StepPair {
  int p, q, d;
};
FP8MLA_HOST_DEVICE constexpr StepPair step_pair(int step) {
  if (step < 4) return {2 * step, 2 * step, 1};
  const int x = (step - 4) / 4 + 1, j = (step - 4) % 4;
  const int h = x >= 4 ? 2 : x >= 2 ? 1 : 0;
  const int p = ((j >> h) << (h + 1)) | (j & ((1 << h) - 1));
  return {p, p ^ x, x};
}
// The offset bits of block (row, chunk) within the tile: its first row (16 rows of 128 bytes:
// bits 11-13) and its chunk (bits 4-6, where the swizzle XORs the row's term in).
FP8MLA_HOST_DEVICE constexpr std::uint32_t block_bits(int row, int chunk) {
  return std::uint32_t(row) << 11 | std::uint32_t(chunk) << 4;
}
// The lane's flip: lanes 16-31 take block (p ^ d, q ^ d), d XORed into both fields of block_bits;
// 0 for lanes 0-15.
FP8MLA_HOST_DEVICE constexpr std::uint32_t half_flip(int lane) {
  return lane >= 16 ? block_bits(7, 7) : 0u;
}
// The steps warp `warp` (0 .. kWarps - 1) takes: warp, warp + kWarps, ...
FP8MLA_HOST_DEVICE constexpr int warp_steps(int warp) {
  return (kSteps - warp + kWarps - 1) / kWarps;
}

// The block whose bytes lanes 0-15 (hi = false) or 16-31 read in step `step`.
FP8MLA_HOST_DEVICE constexpr Block source_block(int step, bool hi) {
  const StepPair s = step_pair(step);
  const int m = s.d & (hi ? 7 : 0);
  return {s.p ^ m, s.q ^ m};
}

// The row within its block (a key) of the ldmatrix row that lane `lane` addresses: matrices 0/1
// (2/3) of a block hold keys 0, 2, 4, 6, 9, 11, 13, 15 / 1, 3, 5, 7, 8, 10, 12, 14, so row r of
// either holds a key of pair r and row r of the other its partner, and each matrix's rows lie in
// 8 different chunk positions (row % 8). (r < 4 ? 2r : 2r + 1) ^ m % 2 for row r = lane % 8 of
// matrix m = lane / 8, in bit operations.
FP8MLA_HOST_DEVICE constexpr int load_row(int lane) {
  return (((lane & 7) << 1) | ((lane >> 2) & 1)) ^ ((lane >> 3) & 1);
}

// The row within its target block (a dim) of the stmatrix row that lane `lane` addresses. Row c
// of matrix m takes half c % 2 of register m % 2 of lanes with t % 4 = c / 2, which prmt filled
// with dim j of their 4, j = 2 (c % 2) + (m % 2 ^ c / 4) (the flip for c >= 4 keeps the 8 rows in
// 8 chunk positions): row 4 (c / 2) + j = 2c + (m % 2 ^ c / 4) for c = lane % 8, m = lane / 8.
FP8MLA_HOST_DEVICE constexpr int store_row(int lane) {
  return ((lane & 7) << 1) | (((lane >> 3) ^ (lane >> 2)) & 1);
}

// The prmt selector that makes register `half` (0, 1) of a block's pair from the two loaded
// registers {a = matrix 2b, b = matrix 2b + 1} of lane `lane` (bytes 0-3 of a, 4-7 of b; dim j of
// the lane's 4 is byte j): halves e = 0, 1 hold (even key, odd key) of dim j = 2e + (half ^ q >= 2)
// with q = lane % 4; the even key is in a for lanes 0-15 (pairs r = lane / 4 < 4, see load_row),
// in b for 16-31. Nibbles, low first: even, odd of dim j(0), then of dim j(1): 0x6240 + j(0) *
// 0x1111 with the even key in a, 0x2604 + j(0) * 0x1111 in b.
FP8MLA_HOST_DEVICE constexpr std::uint32_t byte_selector(int lane, int half) {
  const std::uint32_t j0 = std::uint32_t(half ^ ((lane >> 1) & 1));
  return ((lane & 16) ? 0x2604u : 0x6240u) + j0 * 0x1111u;
}

// Per lane, what the device loop adds to a block's base: row * 128 of its ldmatrix (stmatrix) row
// with that row's swizzle term; the block's chunk index then XORs into bits 4-6.
FP8MLA_HOST_DEVICE constexpr std::uint32_t load_lane_offset(int lane) {
  return std::uint32_t(swizzled_offset(load_row(lane), 0));
}
FP8MLA_HOST_DEVICE constexpr std::uint32_t store_lane_offset(int lane) {
  return std::uint32_t(swizzled_offset(store_row(lane), 0));
}

// The tile offsets the lane gives ldmatrix and stmatrix in step `s`: swizzled_offset(16 row +
// load_row, 16 chunk) of its block (its row % 8 is load_row % 8), and the same in the transposed
// block. The lane terms stay below 2048 and the block's fields lie in bits the swizzle leaves
// alone or XORs, so the offset is the lane term XOR the block's bits: with the step a constant,
// two bit operations a lane.
FP8MLA_HOST_DEVICE constexpr std::uint32_t load_offset(StepPair s, std::uint32_t flip,
                                                       std::uint32_t lane_ld) {
  return lane_ld ^ block_bits(s.p, s.q) ^ (block_bits(s.d, s.d) & flip);
}
FP8MLA_HOST_DEVICE constexpr std::uint32_t store_offset(StepPair s, std::uint32_t flip,
                                                        std::uint32_t lane_st) {
  return lane_st ^ block_bits(s.q, s.p) ^ (block_bits(s.d, s.d) & flip);
}

}  // namespace fp8mla::cuda::attention::v_transpose
