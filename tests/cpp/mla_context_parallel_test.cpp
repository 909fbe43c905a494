// Context parallelism of the MLA layer on the CPU (docs/parallelism.md): the zigzag split of a
// batch over N ranks, and N rank layers on their own threads and caches, their latent rows
// all-gathered through the in-process communicators.
//
// What is exact. Every cache row is computed by the one rank that owns its token, from that
// token's hidden row alone, so after the all-gather every rank's cache holds the one-rank
// layer's bytes. Each rank's output is the one-rank layer's prefill of the rank's own batch
// (its chunks, with everything before each chunk as a cached prefix) over that cache, bit for
// bit. Against the one-rank layer on the full batch it is not exact: a chunk's earlier keys come
// from the FP8 cache, as a cached prefix's do, instead of from the new tokens' unrounded latent;
// the float64 reference of the full batch bounds both (cosine, and the error rule). With tensor
// parallelism as well (2 x 2 ranks), each rank's output is its TP group's prefill of its batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "error_test_util.hpp"
#include "fp8mla/attention_backend.hpp"
#include "fp8mla/mla_layer.hpp"
#include "fp8mla/mla_parallel.hpp"
#include "mla_layer_test_util.hpp"

namespace fp8mla {
namespace {

using Lens = std::vector<std::pair<std::int64_t, std::int64_t>>;  // (prefix, extend)
using Output = std::vector<std::uint16_t>;

MlaBatch batch_of(const Lens& lens) {
  MlaBatch b;
  std::int64_t slot = 0;
  for (auto [prefix, extend] : lens) {
    MlaSequence s{prefix, extend, {}};
    for (std::int64_t i = 0; i < prefix + extend; ++i) s.slots.push_back(1000 + slot++);
    b.sequences.push_back(std::move(s));
  }
  return b;
}

// Causal query-key pairs of a batch: what a rank's attention costs.
double pairs(const MlaBatch& b) {
  double n = 0;
  for (const MlaSequence& s : b.sequences)
    n += double(s.extend) * double(s.prefix) + 0.5 * double(s.extend) * double(s.extend + 1);
  return n;
}

TEST(MlaContextParallelSplit, EveryTokenOnceInOrderWithItsPrefixAndBalanced) {
  for (const Lens& lens : {Lens{{0, 4096}}, Lens{{0, 37}, {20, 50}, {0, 1}, {5, 0}, {300, 999}},
                           Lens{{0, 3}}, Lens{{7, 0}}}) {
    const MlaBatch full = batch_of(lens);
    const std::int64_t T = full.extend_tokens();
    for (int n : {1, 2, 3, 4, 8}) {
      SCOPED_TRACE(testing::Message() << "size " << n << ", " << lens.size() << " sequences");
      std::vector<int> owner(std::size_t(T), -1);
      std::vector<MlaContextParallelBatch> ranks;
      for (int r = 0; r < n; ++r) ranks.push_back(mla_context_parallel_batch(full, {r, n}));
      std::int64_t most = 0, fewest = T;
      double most_pairs = 0, fewest_pairs = 1e300;
      for (int r = 0; r < n; ++r) {
        const MlaContextParallelBatch& b = ranks[std::size_t(r)];
        EXPECT_EQ(b.cp.rank, r);
        EXPECT_EQ(b.gathered_slots, ranks[0].gathered_slots);  // the same on every rank
        ASSERT_EQ(std::int64_t(b.tokens.size()), b.batch.extend_tokens());
        // Each local sequence is a run of one full sequence, its prefix everything before it.
        std::size_t i = 0;
        for (const MlaSequence& s : b.batch.sequences) {
          EXPECT_GT(s.extend, 0);
          const std::int64_t row = b.tokens[i];
          std::int64_t first = 0, seq = 0;
          while (first + full.sequences[std::size_t(seq)].extend <= row)
            first += full.sequences[std::size_t(seq++)].extend;
          const MlaSequence& f = full.sequences[std::size_t(seq)];
          EXPECT_EQ(s.prefix, f.prefix + (row - first));
          ASSERT_LE(s.prefix + s.extend, f.prefix + f.extend);
          EXPECT_TRUE(std::equal(s.slots.begin(), s.slots.end(), f.slots.begin()));
          for (std::int64_t k = 0; k < s.extend; ++k, ++i) {
            EXPECT_EQ(b.tokens[i], row + k);
            ASSERT_EQ(owner[std::size_t(row + k)], -1) << "token " << row + k << " twice";
            owner[std::size_t(row + k)] = r;
            // The gathered rows: this rank's block holds its tokens' slots in its order.
            EXPECT_EQ(b.gathered_slots[std::size_t(r * b.rows_per_rank) + i],
                      f.slots[std::size_t(s.prefix + k)]);
          }
        }
        for (std::int64_t j = std::int64_t(i); j < b.rows_per_rank; ++j)
          EXPECT_EQ(b.gathered_slots[std::size_t(r * b.rows_per_rank + j)], -1);
        const std::int64_t t = std::int64_t(b.tokens.size());
        most = std::max(most, t);
        fewest = std::min(fewest, t);
        most_pairs = std::max(most_pairs, pairs(b.batch));
        fewest_pairs = std::min(fewest_pairs, pairs(b.batch));
        const MlaWorkspaceLimits l = b.workspace_limits();
        EXPECT_EQ(l.max_tokens, t);
        EXPECT_EQ(l.max_gathered_rows, n * b.rows_per_rank);
      }
      EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0);
      EXPECT_EQ(ranks[0].rows_per_rank, most);
      // Chunks are equal to a token: a rank's count is off by at most 2 per sequence.
      EXPECT_LE(most - fewest, 2 * std::int64_t(lens.size()));
      if (lens.size() == 1 && T == 4096) {  // zigzag: the same causal work on every rank
        EXPECT_LE(most_pairs / fewest_pairs, 1.01);
      }
      if (n == 1) {  // one rank: the batch itself, less its sequences without new tokens
        std::int64_t kept = 0;
        for (const MlaSequence& s : full.sequences) kept += s.extend > 0;
        ASSERT_EQ(std::int64_t(ranks[0].batch.sequences.size()), kept);
        std::vector<std::int64_t> identity(static_cast<std::size_t>(T));
        std::iota(identity.begin(), identity.end(), 0);
        EXPECT_EQ(ranks[0].tokens, identity);
      }
    }
  }
}

TEST(MlaContextParallelSplit, BadSpecsAreClearErrors) {
  const MlaBatch full = batch_of({{0, 8}});
  test::expect_error(
      [&] {
        mla_context_parallel_batch(full, {0, 0});
      },
      ErrorCategory::kInvalidArgument, {"rank 0 of 0"});
  test::expect_error(
      [&] {
        mla_context_parallel_batch(full, {-1, 2});
      },
      ErrorCategory::kInvalidArgument, {"rank -1 of 2"});
  test::expect_error(
      [&] {
        mla_context_parallel_batch(full, {2, 2});
      },
      ErrorCategory::kInvalidArgument, {"rank 2 of 2"});
  MlaBatch short_slots = full;
  short_slots.sequences[0].slots.pop_back();
  test::expect_error(
      [&] {
        mla_context_parallel_batch(short_slots, {0, 2});
      },
      ErrorCategory::kInvalidArgument,
      {"sequence 0: expected prefix, extend >= 0", "got prefix 0, extend 8, 7 slots"});
}

struct RankRun {
  MlaContextParallelBatch batch;
  Output out;
  std::vector<std::uint8_t> cache;
  MlaStageTimes times;
};

// Each rank's layer on its own thread and its own copy of the fixture's cache.
std::vector<RankRun> run_ranks(const Fixture& f, const std::vector<MlaLayer*>& layers,
                               const AttentionBackend& backend, const MlaPrefillOptions& o) {
  const int n = int(layers.size());
  std::vector<std::unique_ptr<MlaCommunicator>> comms = make_cpu_communicators(n);
  std::vector<RankRun> runs(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      RankRun& run = runs[std::size_t(r)];
      run.batch = mla_context_parallel_batch(f.batch, {r, n});
      const std::int64_t t = std::int64_t(run.batch.tokens.size()), hidden = f.config.hidden;
      std::vector<std::uint16_t> x = take_rows(f.hidden, run.batch.tokens, hidden);
      run.out.assign(std::size_t(t * hidden), 0xFFFF);  // NaN poison
      run.cache = f.cache;
      layers[std::size_t(r)]->prefill_context_parallel(
          TensorView(x.data(), DType::kBF16, {t, hidden}), run.batch, *comms[std::size_t(r)],
          TensorView(run.cache.data(), DType::kE4M3, {kPages, kPageSize, kMlaLatentDim}), backend,
          o, TensorView(run.out.data(), DType::kBF16, {t, hidden}), {}, &run.times);
    });
  }
  for (std::thread& t : threads) t.join();
  return runs;
}

// The one-rank layer's prefill of `batch` over `cache` (a copy), on the rows `tokens` of hidden.
Output plain_prefill(MlaLayer& layer, const Fixture& f, const MlaBatch& batch,
                     const std::vector<std::int64_t>& tokens, std::vector<std::uint8_t> cache,
                     const AttentionBackend& backend, const MlaPrefillOptions& o) {
  const std::int64_t t = std::int64_t(tokens.size()), hidden = f.config.hidden;
  std::vector<std::uint16_t> x = take_rows(f.hidden, tokens, hidden);
  Output out(std::size_t(t * hidden), 0xFFFF);
  layer.prefill(TensorView(x.data(), DType::kBF16, {t, hidden}), batch,
                TensorView(cache.data(), DType::kE4M3, {kPages, kPageSize, kMlaLatentDim}), backend,
                o, TensorView(out.data(), DType::kBF16, {t, hidden}));
  return out;
}

struct CpCase {
  WeightFormat format;
  const char* backend;  // cpu: the FP8 path; cpu-bf16: the BF16 path
  int size;
};

class MlaContextParallelCpu : public testing::TestWithParam<CpCase> {};

TEST_P(MlaContextParallelCpu, RanksEqualTheirOwnPrefillOverTheGatheredCache) {
  const CpCase p = GetParam();
  Fixture f({{0, 61}, {40, 50}, {0, 1}, {9, 0}, {100, 3}}, 17);
  const MlaWeights w = generate_mla_weights(f.config, p.format, 5);
  const std::unique_ptr<AttentionBackend> backend = make_attention_backend(p.backend);
  MlaLayer one(f.config, w);
  std::vector<MlaLayer> layers;
  for (int r = 0; r < p.size; ++r) layers.emplace_back(f.config, w);
  std::vector<MlaLayer*> ptrs;
  for (MlaLayer& l : layers) ptrs.push_back(&l);

  std::vector<double> ref(f.hidden.size());
  {
    std::vector<std::uint8_t> cache = f.cache;
    mla_prefill_reference(
        f.config, w, f.hidden_view(), f.batch,
        TensorView(cache.data(), DType::kE4M3, {kPages, kPageSize, kMlaLatentDim}), 1.0f,
        ref.data());
  }
  for (std::int64_t capacity : {std::int64_t(0), std::int64_t(32)}) {
    SCOPED_TRACE(testing::Message() << "prefix chunk capacity " << capacity);
    const MlaPrefillOptions o = prefix_mode(capacity);
    // The one-rank layer on the whole batch: its cache is what every rank's must become.
    std::vector<std::uint8_t> full_cache = f.cache;
    Output y;
    {
      const TensorView cache(full_cache.data(), DType::kE4M3, {kPages, kPageSize, kMlaLatentDim});
      std::vector<std::uint16_t> x = f.hidden;
      y.assign(f.hidden.size(), 0xFFFF);
      one.prefill(TensorView(x.data(), DType::kBF16, {f.tokens, f.config.hidden}), f.batch, cache,
                  *backend, o, TensorView(y.data(), DType::kBF16, {f.tokens, f.config.hidden}));
    }
    const std::vector<RankRun> runs = run_ranks(f, ptrs, *backend, o);
    Output assembled(f.hidden.size(), 0xFFFF);
    for (int r = 0; r < p.size; ++r) {
      const RankRun& run = runs[std::size_t(r)];
      EXPECT_TRUE(run.cache == full_cache) << "rank " << r << "'s cache";
      EXPECT_TRUE(run.out ==
                  plain_prefill(one, f, run.batch.batch, run.batch.tokens, full_cache, *backend, o))
          << "rank " << r;
      EXPECT_GT(run.times.gather, 0.0);
      for (std::size_t i = 0; i < run.batch.tokens.size(); ++i) {
        std::copy_n(run.out.begin() + std::ptrdiff_t(i) * f.config.hidden, f.config.hidden,
                    assembled.begin() + run.batch.tokens[i] * f.config.hidden);
      }
    }
    const Compare one_rank = compare(y, ref), cp = compare(assembled, ref);
    std::printf(
        "[ cp       ] %s, %d ranks, capacity %lld: cosine %.6f (one rank %.6f), max abs "
        "%.3g (one rank %.3g)\n",
        p.backend, p.size, static_cast<long long>(capacity), cp.cosine, one_rank.cosine, cp.max_abs,
        one_rank.max_abs);
    const LayerAccuracy rule(p.format, ref);
    const bool fp8 = std::string(p.backend) == "cpu";
    EXPECT_GE(cp.cosine, rule.min_cosine(fp8));
    EXPECT_LE(cp.max_abs, 2.0 * one_rank.max_abs + 1e-3);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MlaContextParallelCpu,
                         testing::Values(CpCase{WeightFormat::kBf16, "cpu", 2},
                                         CpCase{WeightFormat::kBf16, "cpu-bf16", 3},
                                         CpCase{WeightFormat::kFp8Block, "cpu", 4},
                                         CpCase{WeightFormat::kFp8Block, "cpu-bf16", 2}),
                         [](const testing::TestParamInfo<CpCase>& i) {
                           return std::string(i.param.format == WeightFormat::kBf16
                                                  ? "Bf16Weights"
                                                  : "Fp8Weights") +
                                  (std::string(i.param.backend) == "cpu" ? "Fp8Path" : "Bf16Path") +
                                  std::to_string(i.param.size) + "Ranks";
                         });

// More ranks than a sequence has tokens: ranks without tokens still take part in the gather.
TEST(MlaContextParallelCpuEdges, RanksWithoutTokensStillGather) {
  Fixture f({{5, 3}}, 3);
  const MlaWeights w = generate_mla_weights(f.config, WeightFormat::kBf16, 2);
  const std::unique_ptr<AttentionBackend> backend = make_attention_backend("cpu");
  std::vector<MlaLayer> layers;
  for (int r = 0; r < 4; ++r) layers.emplace_back(f.config, w);
  std::vector<MlaLayer*> ptrs;
  for (MlaLayer& l : layers) ptrs.push_back(&l);
  MlaLayer one(f.config, w);
  std::vector<std::uint8_t> full_cache = f.cache;
  {
    std::vector<std::uint16_t> x = f.hidden;
    Output y(x.size());
    one.prefill(TensorView(x.data(), DType::kBF16, {f.tokens, f.config.hidden}), f.batch,
                TensorView(full_cache.data(), DType::kE4M3, {kPages, kPageSize, kMlaLatentDim}),
                *backend, {}, TensorView(y.data(), DType::kBF16, {f.tokens, f.config.hidden}));
  }
  const std::vector<RankRun> runs = run_ranks(f, ptrs, *backend, {});
  int empty = 0;
  for (const RankRun& run : runs) {
    empty += run.batch.tokens.empty();
    EXPECT_TRUE(run.cache == full_cache);
  }
  EXPECT_GT(empty, 0);
}

// TP x CP, 2 x 2 ranks: rank (t, c) is TP rank t's shard with the TP group of CP rank c, and CP
// rank c of the CP group of TP rank t. Its output is, bit for bit, the TP group's prefill of CP
// rank c's batch over the gathered cache (the same sums in the same order), the same on both TP
// ranks; every rank's cache is the one-rank layer's.
TEST(MlaContextParallelCpuEdges, WithTensorParallelEachRankIsItsTpGroupsPrefill) {
  constexpr int kTp = 2, kCp = 2;
  Fixture f({{0, 41}, {30, 22}, {0, 1}}, 37);
  const MlaWeights w = generate_mla_weights(f.config, WeightFormat::kBf16, 4);
  const std::unique_ptr<AttentionBackend> backend = make_attention_backend("cpu");
  std::vector<MlaWeights> shards;
  for (int t = 0; t < kTp; ++t) shards.push_back(shard_mla_weights(w, f.config, {t, kTp}));
  std::vector<std::uint8_t> full_cache = f.cache;
  {
    MlaLayer one(f.config, w);
    std::vector<std::uint16_t> x = f.hidden, y(x.size());
    one.prefill(f.hidden_view(), f.batch,
                TensorView(full_cache.data(), DType::kE4M3, {kPages, kPageSize, kMlaLatentDim}),
                *backend, {}, TensorView(y.data(), DType::kBF16, {f.tokens, f.config.hidden}));
  }
  // rank (t, c) at index c * kTp + t.
  const auto run_grid = [&](bool context_parallel, const std::vector<std::uint8_t>& cache) {
    std::vector<std::vector<std::unique_ptr<MlaCommunicator>>> tp_groups, cp_groups;
    for (int c = 0; c < kCp; ++c) tp_groups.push_back(make_cpu_communicators(kTp));
    for (int t = 0; t < kTp; ++t) cp_groups.push_back(make_cpu_communicators(kCp));
    std::vector<RankRun> runs(kTp * kCp);
    std::vector<std::thread> threads;
    for (int c = 0; c < kCp; ++c) {
      for (int t = 0; t < kTp; ++t) {
        threads.emplace_back([&, t, c] {
          RankRun& run = runs[std::size_t(c * kTp + t)];
          MlaLayer layer(f.config, shards[std::size_t(t)], Device::cpu(), {t, kTp},
                         tp_groups[std::size_t(c)][std::size_t(t)].get());
          run.batch = mla_context_parallel_batch(f.batch, {c, kCp});
          const std::int64_t n = std::int64_t(run.batch.tokens.size()), h = f.config.hidden;
          std::vector<std::uint16_t> x = take_rows(f.hidden, run.batch.tokens, h);
          run.out.assign(std::size_t(n * h), 0xFFFF);
          run.cache = cache;
          const TensorView xv(x.data(), DType::kBF16, {n, h}),
              ov(run.out.data(), DType::kBF16, {n, h});
          const TensorView cv(run.cache.data(), DType::kE4M3, {kPages, kPageSize, kMlaLatentDim});
          if (context_parallel) {
            layer.prefill_context_parallel(
                xv, run.batch, *cp_groups[std::size_t(t)][std::size_t(c)], cv, *backend, {}, ov);
          } else {  // the TP group alone, on CP rank c's batch over the gathered cache
            layer.prefill(xv, run.batch.batch, cv, *backend, {}, ov);
          }
        });
      }
    }
    for (std::thread& th : threads) th.join();
    return runs;
  };
  const std::vector<RankRun> grid = run_grid(true, f.cache);
  const std::vector<RankRun> tp_only = run_grid(false, full_cache);
  for (std::size_t i = 0; i < grid.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "rank (" << i % kTp << ", " << i / kTp << ")");
    EXPECT_TRUE(grid[i].cache == full_cache);
    EXPECT_TRUE(grid[i].out == tp_only[i].out);
    EXPECT_TRUE(grid[i].out == grid[i - i % kTp].out);  // the same on every TP rank
  }
}

TEST(MlaContextParallelCpuEdges, MismatchedCommunicatorOrBatchIsAClearError) {
  Fixture f({{0, 8}}, 4);
  const MlaWeights w = generate_mla_weights(f.config, WeightFormat::kBf16, 2);
  const std::unique_ptr<AttentionBackend> backend = make_attention_backend("cpu");
  MlaLayer layer(f.config, w);
  std::vector<std::unique_ptr<MlaCommunicator>> comms = make_cpu_communicators(2);
  const MlaContextParallelBatch b = mla_context_parallel_batch(f.batch, {0, 2});
  std::vector<std::uint16_t> x = take_rows(f.hidden, b.tokens, f.config.hidden);
  Output out(x.size());
  const std::int64_t t = std::int64_t(b.tokens.size());
  const auto call = [&](const MlaContextParallelBatch& batch, MlaCommunicator& comm) {
    layer.prefill_context_parallel(TensorView(x.data(), DType::kBF16, {t, f.config.hidden}), batch,
                                   comm, f.cache_view(), *backend, {},
                                   TensorView(out.data(), DType::kBF16, {t, f.config.hidden}));
  };
  test::expect_error([&] { call(b, *comms[1]); }, ErrorCategory::kInvalidArgument,
                     {"the communicator is rank 1 of 2; expected the batch's rank 0 of 2"});
  MlaContextParallelBatch cut = b;
  cut.gathered_slots.pop_back();
  test::expect_error([&] { call(cut, *comms[0]); }, ErrorCategory::kInvalidArgument,
                     {"2 x 4 gathered slots"});
  // A slot past the cache (one rank, so that no other waits at the gather).
  std::vector<std::unique_ptr<MlaCommunicator>> alone = make_cpu_communicators(1);
  MlaContextParallelBatch off = mla_context_parallel_batch(f.batch, {0, 1});
  off.gathered_slots.back() = kPages * kPageSize;
  std::vector<std::uint16_t> x1 = f.hidden;
  Output out1(x1.size());
  std::vector<std::uint8_t> cache = f.cache;
  test::expect_error(
      [&] {
        layer.prefill_context_parallel(
            f.hidden_view(), off, *alone[0],
            TensorView(cache.data(), DType::kE4M3, {kPages, kPageSize, kMlaLatentDim}), *backend,
            {}, TensorView(out1.data(), DType::kBF16, {f.tokens, f.config.hidden}));
      },
      ErrorCategory::kInvalidArgument, {"is outside the cache's"});
}

}  // namespace
}  // namespace fp8mla
