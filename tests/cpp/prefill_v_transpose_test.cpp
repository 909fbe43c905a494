// The in-place transposition of a token-major e4m3 V tile (src/cuda/attention/
// prefill_v_transpose.hpp), replayed on the host byte by byte: the shared-memory image TMA writes
// for a token-major tile, every step of every transposing warp through emulated ldmatrix.x4, prmt
// and stmatrix.x4.trans (the lane/register/row layouts of PTX's m8n8 b16 fragments, as cute
// encodes them in Copy_Traits<SM75_U32x4_LDSM_N> and Copy_Traits<SM90_U16x8_STSM_T>), against the
// image the transposed TMA load writes. Both images come from the swizzle rule alone (128B: the
// 16-byte chunk index XOR row % 8 in each 1024-byte block, i.e. offset bits 4-6 ^= bits 7-9), not
// from the header's function. Also: no two steps touch the same byte (so the warps need no barrier
// between them), each step writes exactly the bytes it read, no shared-memory bank conflicts, and
// the ones rows after the tile are not touched. Runs without a GPU.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "cuda/attention/prefill_v_transpose.hpp"

namespace fp8mla::cuda::attention::v_transpose {
namespace {

constexpr int kOnesBytes = 8 * 128;  // the e4m3 ones rows after each V tile (prefill_traits.cuh)

// The 128B swizzle on a linear offset row * 128 + col (cute Swizzle<3,4,3>).
int swizzle_128b(int row, int col) {
  const int linear = row * 128 + col;
  return linear ^ (((linear >> 7) & 7) << 4);
}

using Tile = std::vector<std::uint8_t>;
using V = std::array<std::array<std::uint8_t, 128>, 128>;  // [key][dim]

// What TMA writes into a stage: the token-major box (rows = keys) or the transposed one (rows =
// dims), each followed by the ones rows.
Tile token_major_image(const V& v) {
  Tile t(kTileBytes + kOnesBytes, 0x38);
  for (int key = 0; key < 128; ++key) {
    for (int dim = 0; dim < 128; ++dim) t[std::size_t(swizzle_128b(key, dim))] = v[key][dim];
  }
  return t;
}
Tile transposed_image(const V& v) {
  Tile t(kTileBytes + kOnesBytes, 0x38);
  for (int key = 0; key < 128; ++key) {
    for (int dim = 0; dim < 128; ++dim) t[std::size_t(swizzle_128b(dim, key))] = v[key][dim];
  }
  return t;
}

std::uint32_t load_word(const Tile& t, std::uint32_t at) {
  return std::uint32_t(t[at]) | std::uint32_t(t[at + 1]) << 8 | std::uint32_t(t[at + 2]) << 16 |
         std::uint32_t(t[at + 3]) << 24;
}

// prmt.b32 d, a, b, sel (default mode): byte i of d is byte sel[4i + 2 : 4i] of {b, a} (a bytes
// 0-3, b 4-7); the selectors here never set the sign-replicate bit.
std::uint32_t prmt(std::uint32_t a, std::uint32_t b, std::uint32_t sel) {
  const std::uint64_t bytes = std::uint64_t(b) << 32 | a;
  std::uint32_t d = 0;
  for (int i = 0; i < 4; ++i) {
    const std::uint32_t nibble = (sel >> (4 * i)) & 0xF;
    EXPECT_EQ(nibble & 8, 0u) << "sign-replicating selector";
    d |= std::uint32_t((bytes >> (8 * (nibble & 7))) & 0xFF) << (8 * i);
  }
  return d;
}

using Regs = std::array<std::array<std::uint32_t, 4>, 32>;  // [lane][register]
using Addresses = std::array<std::uint32_t, 32>;            // the address each lane gives

// ldmatrix.sync.aligned.m8n8.x4.shared.b16: lanes 8m .. 8m + 7 address the 8 rows (16 bytes) of
// matrix m; register m of lane t gets bytes 4 (t % 4) .. + 3 of row t / 4 of matrix m.
Regs ldmatrix_x4(const Tile& t, const Addresses& rows) {
  Regs r{};
  for (int lane = 0; lane < 32; ++lane) {
    for (int m = 0; m < 4; ++m) r[lane][m] = load_word(t, rows[8 * m + lane / 4] + 4 * (lane % 4));
  }
  return r;
}

// stmatrix.sync.aligned.m8n8.x4.trans.shared.b16: lanes 8m .. 8m + 7 address the rows of matrix
// m; 16-bit half e of register m of lane t goes to row 2 (t % 4) + e, halfword t / 4 (bytes
// 2 (t / 4), + 1, low byte first).
void stmatrix_trans_x4(Tile& t, const Addresses& rows, const Regs& r) {
  for (int lane = 0; lane < 32; ++lane) {
    for (int m = 0; m < 4; ++m) {
      for (int e = 0; e < 2; ++e) {
        const std::uint32_t half = (r[lane][m] >> (16 * e)) & 0xFFFF;
        const std::uint32_t at = rows[8 * m + 2 * (lane % 4) + e] + 2 * (lane / 4);
        t[at] = std::uint8_t(half & 0xFF);
        t[at + 1] = std::uint8_t(half >> 8);
      }
    }
  }
}

// Each 8-row matrix of an ldmatrix/stmatrix is one shared-memory wavefront: its 8 rows of 16
// bytes must fall in 8 different groups of 4 banks.
void expect_no_bank_conflict(const Addresses& rows, const char* what, int step) {
  for (int m = 0; m < 4; ++m) {
    std::set<std::uint32_t> banks;
    for (int r = 0; r < 8; ++r) {
      const std::uint32_t at = rows[8 * m + r];
      EXPECT_EQ(at % 16, 0u) << what << " step " << step;
      EXPECT_LT(at + 16, std::uint32_t(kTileBytes) + 1) << what << " step " << step;
      for (int w = 0; w < 4; ++w) banks.insert((at / 4 + std::uint32_t(w)) % 32);
    }
    EXPECT_EQ(banks.size(), 32u) << what << " step " << step << " matrix " << m;
  }
}

// One step of one warp, as prefill_producer.cuh runs it. Returns the bytes it read and wrote.
std::pair<std::set<std::uint32_t>, std::set<std::uint32_t>> run_step(Tile& t, int step) {
  Addresses ld{}, st{};
  for (int lane = 0; lane < 32; ++lane) {
    ld[lane] = load_offset(step_pair(step), half_flip(lane), load_lane_offset(lane));
    st[lane] = store_offset(step_pair(step), half_flip(lane), store_lane_offset(lane));
  }
  expect_no_bank_conflict(ld, "ldmatrix", step);
  expect_no_bank_conflict(st, "stmatrix", step);
  const Regs loaded = ldmatrix_x4(t, ld);
  Regs out{};
  for (int lane = 0; lane < 32; ++lane) {
    const std::uint32_t sel0 = byte_selector(lane, 0), sel1 = byte_selector(lane, 1);
    EXPECT_EQ(sel1, sel0 ^ 0x1111u);  // what the device loop uses
    for (int b = 0; b < 2; ++b) {
      out[lane][2 * b] = prmt(loaded[lane][2 * b], loaded[lane][2 * b + 1], sel0);
      out[lane][2 * b + 1] = prmt(loaded[lane][2 * b], loaded[lane][2 * b + 1], sel1);
    }
  }
  stmatrix_trans_x4(t, st, out);
  std::set<std::uint32_t> read, written;
  for (int lane = 0; lane < 32; ++lane) {
    for (std::uint32_t i = 0; i < 16; ++i) {
      read.insert(ld[lane] + i);
      written.insert(st[lane] + i);
    }
  }
  return {read, written};
}

V random_v(std::uint32_t seed) {
  std::mt19937 rng(seed);
  V v;
  for (auto& row : v) {
    for (auto& x : row) x = std::uint8_t(rng());
  }
  return v;
}

TEST(PrefillVTranspose, SwizzleAndOffsetsFollowTheRule) {
  for (int row = 0; row < 128; ++row) {
    for (int col = 0; col < 128; ++col) {
      ASSERT_EQ(swizzled_offset(row, col), swizzle_128b(row, col));
    }
  }
  // The device's offsets (lane term XOR the block's chunk) against the plain formula.
  for (int step = 0; step < kSteps; ++step) {
    for (int lane = 0; lane < 32; ++lane) {
      const Block b = source_block(step, lane >= 16);
      const StepPair s = step_pair(step);
      EXPECT_EQ(load_offset(s, half_flip(lane), load_lane_offset(lane)),
                std::uint32_t(swizzle_128b(16 * b.row + load_row(lane), 16 * b.chunk)));
      EXPECT_EQ(store_offset(s, half_flip(lane), store_lane_offset(lane)),
                std::uint32_t(swizzle_128b(16 * b.chunk + store_row(lane), 16 * b.row)));
    }
  }
}

// The header's bit-operation forms of the lane terms against their definitions.
TEST(PrefillVTranspose, LaneTermsMatchTheirDefinitions) {
  for (int lane = 0; lane < 32; ++lane) {
    const int m = lane / 8, r = lane % 8;
    // ldmatrix: row r of matrix m holds a key of pair r, the even one in even matrices for r < 4.
    EXPECT_EQ(load_row(lane), (r < 4 ? 2 * r : 2 * r + 1) ^ (m % 2)) << lane;
    // stmatrix: row c = r holds dim 4 (c / 2) + 2 (c % 2) + (m % 2 ^ c >= 4).
    EXPECT_EQ(store_row(lane), 4 * (r / 2) + 2 * (r % 2) + ((m % 2) ^ int(r >= 4))) << lane;
    for (int half = 0; half < 2; ++half) {
      // Halves e = 0, 1: (even key, odd key) bytes of dim j = 2e + (half ^ q >= 2); the even
      // key is in register a (bytes 0-3) for lanes 0-15, in b (4-7) for lanes 16-31.
      const int q = lane % 4, even = lane < 16 ? 0 : 4, odd = 4 - even;
      std::uint32_t sel = 0;
      for (int e = 0; e < 2; ++e) {
        const int j = 2 * e + (half ^ int(q >= 2));
        sel |= std::uint32_t((even + j) | ((odd + j) << 4)) << (8 * e);
      }
      EXPECT_EQ(byte_selector(lane, half), sel) << lane << " " << half;
    }
  }
}

TEST(PrefillVTranspose, StepsCoverEveryBlockOnceInSwappedPairs) {
  std::set<std::pair<int, int>> seen;
  for (int step = 0; step < kSteps; ++step) {
    const Block lo = source_block(step, false), hi = source_block(step, true);
    EXPECT_TRUE(seen.insert({lo.row, lo.chunk}).second) << "step " << step;
    EXPECT_TRUE(seen.insert({hi.row, hi.chunk}).second) << "step " << step;
    // Either the two halves swap a block with its transpose, or both are diagonal blocks.
    const bool swapped = lo.row == hi.chunk && lo.chunk == hi.row && lo.row != lo.chunk;
    const bool diagonal = lo.row == lo.chunk && hi.row == hi.chunk;
    EXPECT_TRUE(swapped || diagonal) << "step " << step;
    for (const Block& b : {lo, hi}) {
      EXPECT_TRUE(b.row >= 0 && b.row < 8 && b.chunk >= 0 && b.chunk < 8) << "step " << step;
    }
  }
  EXPECT_EQ(seen.size(), 64u);
}

TEST(PrefillVTranspose, TransposesTheTokenMajorImageIntoTheTransposedOne) {
  for (std::uint32_t seed : {1u, 2u, 3u}) {
    const V v = random_v(seed);
    Tile t = token_major_image(v);
    const Tile expected = transposed_image(v);
    std::set<std::uint32_t> touched;
    // Warp w runs its warp_steps(w) steps w, w + kWarps, ...; all of warp 0's first, then warp
    // 1's... (any order gives the same, as no two steps share a byte; the device issues a step's
    // ldmatrix before the last one's stmatrix).
    int steps = 0;
    for (int warp = 0; warp < kWarps; ++warp) {
      for (int i = 0; i < warp_steps(warp); ++i, ++steps) {
        const int step = warp + i * kWarps;
        ASSERT_LT(step, kSteps);
        const auto [read, written] = run_step(t, step);
        EXPECT_EQ(read, written) << "step " << step << " writes bytes it did not read";
        EXPECT_EQ(read.size(), 512u);
        for (std::uint32_t at : read) {
          EXPECT_TRUE(touched.insert(at).second) << "byte " << at << " again in step " << step;
        }
      }
    }
    EXPECT_EQ(steps, kSteps);
    EXPECT_EQ(touched.size(), std::size_t(kTileBytes));
    int wrong = 0;
    for (std::size_t i = 0; i < t.size(); ++i) wrong += t[i] != expected[i];
    EXPECT_EQ(wrong, 0) << "seed " << seed;  // the ones rows included
  }
}

TEST(PrefillVTranspose, StepOrderDoesNotMatter) {
  const V v = random_v(9);
  Tile forward = token_major_image(v), backward = forward;
  for (int step = 0; step < kSteps; ++step) run_step(forward, step);
  for (int step = kSteps - 1; step >= 0; --step) run_step(backward, step);
  EXPECT_EQ(forward, backward);
  EXPECT_EQ(forward, transposed_image(v));
}

// A value per (key, dim) pair's low bits: a mistake that swaps two bytes of equal random value
// would hide in the random tiles; here every byte of a 16x16 block differs.
TEST(PrefillVTranspose, DistinctBytesWithinEveryBlock) {
  V v;
  for (int key = 0; key < 128; ++key) {
    for (int dim = 0; dim < 128; ++dim) v[key][dim] = std::uint8_t((key % 16) * 16 + dim % 16);
  }
  Tile t = token_major_image(v);
  for (int step = 0; step < kSteps; ++step) run_step(t, step);
  EXPECT_EQ(t, transposed_image(v));
  // And one that tells the blocks apart.
  for (int key = 0; key < 128; ++key) {
    for (int dim = 0; dim < 128; ++dim) v[key][dim] = std::uint8_t((key / 16) * 8 + dim / 16);
  }
  t = token_major_image(v);
  for (int step = 0; step < kSteps; ++step) run_step(t, step);
  EXPECT_EQ(t, transposed_image(v));
}

}  // namespace
}  // namespace fp8mla::cuda::attention::v_transpose
