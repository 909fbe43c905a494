// The Hopper prefill kernel's work division, on the CPU (host code only: no GPU needed). The
// scheduler's order, grid and per-CTA tiles (ZigzagTileScheduler), the per-tile decisions the
// roles take from a TileWork (how many key tiles to visit, which need the element mask, where a
// warpgroup computes S over the first 64 keys only) and the element mask itself (every lane of
// both consumer warpgroups on the accumulator layout) are checked against the causal rule read
// directly (docs/design.md op 8: row i of a sequence sees key j when j < k_len and, causal,
// j <= i + k_len - q_len), on seeded random ragged batches with prefixes, empty and one-token
// sequences, padded max_seqlen_q, many heads and small and large grids. The kernel's own tests
// (prefill_attention_cuda_test) check the numbers on the GPU; these check that every row is
// computed exactly once, against exactly the keys it sees, for any batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/attention/prefill_scheduler.cuh"
#include "cuda/attention/prefill_softmax.cuh"
#include "cuda/attention/prefill_traits.cuh"
#include "fp8mla/error.hpp"

namespace fp8mla::cuda::attention {
namespace {

struct BatchShape {
  std::vector<int> q_lens, k_lens;
  int heads = 1;
  int max_seqlen_q = 0;  // 0: the longest q_len (else a padded maximum, at least that)
  int sm_count = 132;

  std::string describe() const {
    std::ostringstream s;
    s << "heads " << heads << ", sms " << sm_count << ", max_seqlen_q " << max_seqlen_q
      << ", q/k lens";
    for (std::size_t i = 0; i < q_lens.size(); ++i) s << " " << q_lens[i] << "/" << k_lens[i];
    return s.str();
  }
};

// The op's parameters and the kernel's, as prefill_launch.cuh derives them for the scheduler.
template <typename Traits>
struct Launch {
  std::vector<std::int32_t> cu_q, cu_k;
  PrefillAttentionParams op;
  PrefillKernelParams kp{};
  int ctas = 0;

  explicit Launch(const BatchShape& b) {
    cu_q.push_back(0);
    cu_k.push_back(0);
    for (std::size_t i = 0; i < b.q_lens.size(); ++i) {
      cu_q.push_back(cu_q.back() + b.q_lens[i]);
      cu_k.push_back(cu_k.back() + b.k_lens[i]);
    }
    op.batch = std::int64_t(b.q_lens.size());
    op.heads = b.heads;
    op.causal = Traits::kIsCausal;
    op.max_seqlen_q = std::max(b.max_seqlen_q, *std::max_element(b.q_lens.begin(), b.q_lens.end()));
    op.max_seqlen_k = *std::max_element(b.k_lens.begin(), b.k_lens.end());
    kp.cu_seqlens_q = cu_q.data();
    kp.cu_seqlens_k = cu_k.data();
    // As the launch: no grid (no query rows at all), no kernel and no order.
    ctas = int(ZigzagTileScheduler<Traits>::grid(op, b.sm_count).x);
    if (ctas > 0) kp.order = ZigzagTileScheduler<Traits>::order(op, b.sm_count);
  }
};

// Keys [0, limit) are what row i of a sequence sees.
int visible_limit(bool causal, int i, int q_len, int k_len) {
  if (!causal) return k_len;
  return std::clamp(i + 1 + k_len - q_len, 0, k_len);
}

// One work tile against the rule: its key tiles, masks and half-tile decisions.
template <typename Traits>
void expect_tile_follows_the_rule(const TileWork& w) {
  constexpr int kM = Traits::kBlockM, kN = Traits::kBlockN;
  const bool causal = Traits::kIsCausal;
  ASSERT_TRUE(w.has_rows);
  ASSERT_EQ(w.key_shift, Traits::kFp8 ? w.k_start % 16 : 0);
  const int first_row = w.m_block * kM;
  const int rows = std::min(kM, w.q_len - first_row);
  ASSERT_GT(rows, 0);
  // Rows see key prefixes; the block's last row sees the longest, its first the shortest.
  int longest = 0, shortest = w.k_len;
  for (int r = 0; r < rows; ++r) {
    const int limit = visible_limit(causal, first_row + r, w.q_len, w.k_len);
    longest = std::max(longest, limit);
    shortest = std::min(shortest, limit);
  }
  const int expected_blocks = longest > 0 ? (longest - 1 + w.key_shift) / kN + 1 : 0;
  EXPECT_EQ(w.n_blocks, expected_blocks) << "rows " << first_row << "+" << rows;
  for (int n = 0; n < w.n_blocks; ++n) {
    const int first = tile_first_key(w, n, kN);
    EXPECT_EQ(first, n * kN - w.key_shift);
    // Every key of the tile real and seen by every row, or the mask is needed; and only then.
    const bool all_seen = first >= 0 && first + kN <= w.k_len && shortest >= first + kN;
    EXPECT_EQ(tile_needs_mask<Traits>(w, n), !all_seen) << "key tile " << n;
    // A warpgroup's half S: none of its rows may see a key of the tile's second half.
    for (int row0 : {0, 64}) {
      if (!sees_first_half<Traits>(w, n, row0)) continue;
      for (int r = row0; r < std::min(row0 + 64, rows); ++r) {
        const int limit = visible_limit(causal, first_row + r, w.q_len, w.k_len);
        EXPECT_LE(limit, first + 64) << "key tile " << n << ", row " << r << " sees past its half";
      }
    }
  }
}

// Key tile n of work tile w masked by every thread of both consumer warpgroups, against the rule.
template <typename Traits>
void expect_mask_follows_the_rule(const TileWork& w, int n) {
  const int first = tile_first_key(w, n, Traits::kBlockN);
  for (int thread = 0; thread < 256; ++thread) {  // warpgroup thread / 128, its rows from 64 x it
    const int t = thread % 128, lane = t % 4;
    const int row =
        w.m_block * Traits::kBlockM + 64 * (thread / 128) + 16 * (t / 32) + (t % 32) / 4;
    float s[64];
    std::fill(std::begin(s), std::end(s), 1.0f);
    OnlineSoftmax<Traits>::mask_lane(s, w, n, row, lane);
    for (int i = 0; i < 64; ++i) {
      const int r = row + 8 * ((i / 2) % 2);
      const int key = first + Traits::key_of_column(8 * (i / 4) + 2 * lane + i % 2);
      const bool seen =
          key >= 0 && key < w.k_len && (!Traits::kIsCausal || key <= r + w.k_len - w.q_len);
      ASSERT_EQ(s[i], seen ? 1.0f : -INFINITY)
          << "key tile " << n << ", thread " << thread << ", element " << i << ": row " << r
          << ", key " << key << " (k_len " << w.k_len << ", q_len " << w.q_len << ")";
    }
  }
}

// Runs every CTA of the grid as the kernel does (the early exit, then its rounds) and checks
// that each (sequence, head, m block) with rows is run exactly once, and every tile by the rule.
template <typename Traits>
void expect_schedule_covers_the_batch(const BatchShape& b) {
  using Scheduler = ZigzagTileScheduler<Traits>;
  SCOPED_TRACE(b.describe());
  const Launch<Traits> l(b);
  if (l.ctas == 0) {
    EXPECT_EQ(l.op.max_seqlen_q, 0);
    return;
  }
  const int tiles = l.kp.order.tiles;
  const int m_blocks = (l.op.max_seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  ASSERT_EQ(std::int64_t(tiles), m_blocks * l.op.batch * l.op.heads);
  const bool persistent = l.ctas < tiles;
  if (persistent) {
    EXPECT_EQ(l.ctas, b.sm_count);
    EXPECT_LE(l.op.max_seqlen_k, Scheduler::kPersistentKeys);
  } else {
    EXPECT_EQ(l.ctas, tiles);
  }
  std::vector<int> runs_of_tile(std::size_t(tiles), 0);
  std::map<std::tuple<int, int, int>, int> runs;  // (q_start, head, m block)
  for (int cta = 0; cta < l.ctas; ++cta) {
    // The kernel's early exit: a one-tile CTA whose tile has no rows leaves before the roles.
    if (!persistent) {
      ASSERT_EQ(Scheduler::tile_has_rows(l.kp, cta), Scheduler::work_of(l.kp, cta).has_rows)
          << "tile " << cta;
      if (!Scheduler::tile_has_rows(l.kp, cta)) continue;
    }
    for (int round = 0;; ++round) {
      const int tile = Scheduler::tile_of(round, l.ctas, cta);
      if (tile >= tiles) break;
      ++runs_of_tile[std::size_t(tile)];
      const TileWork w = Scheduler::work_of(l.kp, tile);
      if (!w.has_rows) continue;
      ++runs[{w.q_start, w.head, w.m_block}];
      expect_tile_follows_the_rule<Traits>(w);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  if (persistent) {  // rowless tiles are only skipped where each CTA has one
    for (int t = 0; t < tiles; ++t) EXPECT_EQ(runs_of_tile[std::size_t(t)], 1) << "tile " << t;
  }
  std::size_t expected = 0;
  for (std::size_t s = 0; s < b.q_lens.size(); ++s) {
    const int blocks = (b.q_lens[s] + Traits::kBlockM - 1) / Traits::kBlockM;
    for (int h = 0; h < b.heads; ++h) {
      for (int m = 0; m < blocks; ++m) {
        const auto it = runs.find({l.cu_q[s], h, m});
        EXPECT_TRUE(it != runs.end() && it->second == 1)
            << "sequence " << s << ", head " << h << ", m block " << m << " ran "
            << (it == runs.end() ? 0 : it->second) << " times";
      }
    }
    expected += std::size_t(blocks) * std::size_t(b.heads);
  }
  EXPECT_EQ(runs.size(), expected);  // and nothing else (tiles past a sequence's rows)
}

// A random ragged batch: lengths near the tile edges, empty and one-token sequences, prefixes.
BatchShape random_batch(std::mt19937& rng) {
  const auto pick = [&](std::initializer_list<int> v) {
    return *(v.begin() + std::uniform_int_distribution<int>(0, int(v.size()) - 1)(rng));
  };
  const auto uniform = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  BatchShape b;
  const int batch = uniform(1, 9);
  for (int s = 0; s < batch; ++s) {
    const int q =
        pick({0, 1, 17, 63, 64, 65, 127, 128, 129, 256, uniform(1, 700), uniform(1, 3000)});
    const int prefix = pick({0, 0, 1, 15, 16, 127, 128, 1000, 4096, 8191, uniform(0, 5000)});
    b.q_lens.push_back(q);
    b.k_lens.push_back(q + prefix);
  }
  // Full attention also takes more queries than keys; causal rows before the keys see none.
  if (uniform(0, 3) == 0) b.k_lens[0] = b.q_lens[0] / 2;
  b.heads = pick({1, 2, 3, 16, 64, 128});
  b.sm_count = pick({132, 132, 78, 7, 1});
  b.max_seqlen_q = pick({0, 0, 4096});
  return b;
}

template <typename T>
class PrefillScheduler : public ::testing::Test {};
using Variants = ::testing::Types<PrefillTraits<true, true>, PrefillTraits<true, false>,
                                  PrefillTraits<false, true>, PrefillTraits<false, false>>;
TYPED_TEST_SUITE(PrefillScheduler, Variants);

TYPED_TEST(PrefillScheduler, RandomRaggedBatchesRunEveryRowOnceAgainstTheKeysItSees) {
  std::mt19937 rng(20261204);
  for (int i = 0; i < 150; ++i) {
    expect_schedule_covers_the_batch<TypeParam>(random_batch(rng));
    if (::testing::Test::HasFailure()) return;
  }
}

TYPED_TEST(PrefillScheduler, EdgeBatches) {
  const std::vector<BatchShape> batches = {
      {{1}, {1}, 1},
      {{128}, {128}, 1},
      {{129}, {129}, 3},
      {{0, 0, 5}, {0, 7, 5}, 2},
      {{5, 700}, {3, 900}, 8},  // rows before the first key
      {{3000, 17, 700, 5000, 1, 2200}, {7096, 17, 1700, 7048, 8192, 2712}, 128},
      {{0, 1024}, {5, 1024}, 128},                                    // key_shift 5
      {{200, 1, 130}, {2000, 1500, 600}, 64},                         // L2 sections of heads
      {std::vector<int>(16, 1024), std::vector<int>(16, 1024), 128},  // persistent grid
      {std::vector<int>(16, 1000), std::vector<int>(16, 2048), 16, 0, 7},
  };
  for (const BatchShape& b : batches) expect_schedule_covers_the_batch<TypeParam>(b);
}

// Where a causal block's diagonal starts on a key tile's edge (no prefix, or one of whole tiles,
// keys 16-aligned), warpgroup 0 takes the half S on its first key tile and warpgroup 1 does not:
// the saving the consumers' first turn is built for, in the common case.
TEST(PrefillSchedulerCausal, AlignedDiagonalGivesWarpgroupZeroTheHalfTile) {
  using Traits = PrefillTraits<true, true>;
  for (int prefix : {0, 128, 4096}) {
    const BatchShape b{{1024, 512}, {1024 + prefix, 512 + prefix}, 2};
    const Launch<Traits> l(b);
    for (int tile = 0; tile < l.kp.order.tiles; ++tile) {
      const TileWork w = ZigzagTileScheduler<Traits>::work_of(l.kp, tile);
      if (!w.has_rows) continue;
      ASSERT_EQ(w.key_shift, 0);
      EXPECT_TRUE(sees_first_half<Traits>(w, w.n_blocks - 1, 0)) << "tile " << tile;
      EXPECT_FALSE(sees_first_half<Traits>(w, w.n_blocks - 1, 64)) << "tile " << tile;
      EXPECT_FALSE(tile_needs_mask<Traits>(w, 0) && w.n_blocks > 1) << "tile " << tile;
    }
  }
}

// The order's tile index reaches 2^30 - 1: its multiply-high divisions against plain ones at
// sampled indices of a batch that large, and the host's refusal past it.
TEST(PrefillSchedulerOrder, LargestIndexAgreesWithPlainDivision) {
  using Traits = PrefillTraits<true, true>;
  using Scheduler = ZigzagTileScheduler<Traits>;
  BatchShape b;
  b.heads = 128;
  b.q_lens.assign(2047, 65536);  // 512 m blocks x 2047 x 128 heads = 134,135,424 tiles
  b.k_lens = b.q_lens;
  const Launch<Traits> l(b);
  const TileOrder& o = l.kp.order;
  const int m = 512;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> any_tile(0, o.tiles - 1);
  for (int i = 0; i < 20000; ++i) {
    const int tile = i < 4 ? o.tiles - 1 - i : any_tile(rng);
    // The documented order: sequence, then small sections of section_heads heads, then the last
    // section; within a section rank-major (every head of the section at each rank).
    const int seq = tile / (m * b.heads);
    int local = tile % (m * b.heads);
    int section = local / (m * o.section_heads);
    local %= m * o.section_heads;
    int heads_here = o.section_heads;
    if (section >= o.small_sections) {
      local += (section - o.small_sections) * m * o.section_heads;
      section = o.small_sections;
      heads_here = b.heads - o.small_sections * o.section_heads;
    }
    const int rank = local / heads_here;
    const int head = section * o.section_heads + local % heads_here;
    const TileWork w = Scheduler::work_of(l.kp, tile);
    ASSERT_EQ(w.q_start, l.cu_q[std::size_t(seq)]) << "tile " << tile;
    ASSERT_EQ(w.head, head) << "tile " << tile;
    ASSERT_EQ(w.m_block, m - 1 - rank) << "tile " << tile;
  }
  BatchShape too_many = b;
  too_many.q_lens.assign(16384 + 1, 65536);  // 2^30 + 512 x 128 tiles
  too_many.k_lens = too_many.q_lens;
  EXPECT_THROW(Launch<Traits>{too_many}, Error);
}

// The element mask of every thread of both consumer warpgroups (OnlineSoftmax::mask_lane, on the
// accumulator layout of prefill_softmax.cuh) sets -inf on exactly the scores whose key its row
// does not see, on the key tiles where masks fall (the first two and last two a work tile visits,
// and one between), for work tiles of random batches.
TYPED_TEST(PrefillScheduler, ElementMaskHidesExactlyTheKeysARowDoesNotSee) {
  using Traits = TypeParam;
  using Scheduler = ZigzagTileScheduler<Traits>;
  std::mt19937 rng(31);
  for (int batch = 0; batch < 40; ++batch) {
    const BatchShape b = random_batch(rng);
    SCOPED_TRACE(b.describe());
    const Launch<Traits> l(b);
    if (l.ctas == 0) continue;
    std::uniform_int_distribution<int> any_tile(0, l.kp.order.tiles - 1);
    for (int pick = 0; pick < 12; ++pick) {
      const TileWork w = Scheduler::work_of(l.kp, any_tile(rng));
      if (!w.has_rows) continue;
      for (int n : {0, 1, w.n_blocks / 2, w.n_blocks - 2, w.n_blocks - 1}) {
        if (n < 0 || n >= w.n_blocks) continue;
        expect_mask_follows_the_rule<Traits>(w, n);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

// The element mask finds a register's key as lane c's first key plus the register's column in
// lane 0 (prefill_softmax.cuh): true of the accumulator layout's columns under the key order.
TEST(PrefillSchedulerKeys, LaneKeyStepMatchesTheAccumulatorColumns) {
  const auto check = [](auto traits) {
    using Traits = decltype(traits);
    std::vector<int> hits(Traits::kBlockN, 0);
    for (int block = 0; block < Traits::kBlockN / 8; ++block) {
      for (int lane = 0; lane < 4; ++lane) {
        for (int e = 0; e < 2; ++e) {
          const int column = 8 * block + 2 * lane + e;  // wgmma's accumulator column
          const int key = Traits::key_of_column(column);
          EXPECT_EQ(key, Traits::kLaneKeyStep * lane + Traits::key_of_column(8 * block + e));
          ++hits[std::size_t(key)];
        }
      }
    }
    for (int k = 0; k < Traits::kBlockN; ++k) EXPECT_EQ(hits[std::size_t(k)], 1) << "key " << k;
  };
  check(PrefillTraits<true, true>{});
  check(PrefillTraits<false, true>{});
}

}  // namespace
}  // namespace fp8mla::cuda::attention
