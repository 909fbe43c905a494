// Tensor parallelism of the MLA layer on the CPU (docs/parallelism.md): N rank layers built from
// shard_mla_weights, reduced through the in-process communicators, against the one-rank layer.
//
// The bound. Per output element the one-rank layer writes y = bf16(z), z the f32 sum of o_proj's
// K products in input order. Rank r's heads give the same attention output bit for bit (q_b /
// kv_b rows are per-head dot products, attention is per head, o_proj's input groups of 128 are
// whole heads), so its o_proj writes p_r = bf16(s_r), s_r the f32 sum of its own K / N products,
// and the communicator returns y' = bf16(z'), z' = sum_r p_r in f32, rank 0 first. With the bf16
// unit roundoff u = 2^-8, |p_r - s_r| <= u |s_r| and |y - z| <= u |z|, |y' - z'| <= u |z'|, so
//   |y' - y| <= u (sum_r |s_r| + |z| + |z'|) + (f32 reordering: the two sums' errors, each at
//   most K 2^-24 sum_k |x_k w_k|, and the N-term sum's N 2^-24 sum_r |p_r|).
// Written in the bf16 values the test sees (|s_r| <= |p_r| / (1 - u), likewise z, z'):
//   |y' - y| <= u (sum_r |p_r| + |y| + |y'|) (1 + 2^-4),
// the 2^-4 covering 1 / (1 - u) and, in practice, the f32 terms: their worst case is covered only
// while sum_k |x_k w_k| stays below about 2^11 / K times the bf16 terms, but f32 rounding errors
// do not line up (they grow like sqrt(K) 2^-24) and stay orders of magnitude below the bf16 ones.
// Not exact: rounding each partial to bf16 and the sums' order change the result by a few bf16
// ulps of the larger terms (measured: at most 2.3, and 0.82 of the bound).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <ostream>
#include <thread>
#include <vector>

#include "fp8mla/attention_backend.hpp"
#include "fp8mla/mla_layer.hpp"
#include "fp8mla/mla_parallel.hpp"
#include "fp8mla/numerics.hpp"
#include "mla_layer_test_util.hpp"

namespace fp8mla {
namespace {

using Output = std::vector<std::uint16_t>;

struct RankOutputs {
  std::vector<Output> partials;                   // each rank's o_proj output, no communicator
  std::vector<Output> reduced;                    // each rank's output through the communicators
  std::vector<std::vector<std::uint8_t>> caches;  // each rank's cache after its prefills
};

Output prefill(MlaLayer& layer, const Fixture& f, std::vector<std::uint8_t>& cache,
               const AttentionBackend& backend, const MlaPrefillOptions& o) {
  Output out(f.hidden.size(), 0xFFFF);  // NaN poison
  std::vector<std::uint16_t> hidden = f.hidden;
  layer.prefill(TensorView(hidden.data(), DType::kBF16, {f.tokens, f.config.hidden}), f.batch,
                TensorView(cache.data(), DType::kE4M3, {kPages, kPageSize, kMlaLatentDim}), backend,
                o, TensorView(out.data(), DType::kBF16, {f.tokens, f.config.hidden}));
  return out;
}

// Every rank's layer on its own copy of the cache: first alone (partials), then all together on
// their own threads with the communicators (reduced).
RankOutputs run_ranks(const Fixture& f, const MlaWeights& full, int size,
                      const AttentionBackend& backend, const MlaPrefillOptions& o) {
  RankOutputs r;
  r.partials.resize(std::size_t(size));
  r.reduced.resize(std::size_t(size));
  r.caches.assign(std::size_t(size), f.cache);
  std::vector<std::unique_ptr<MlaCommunicator>> comms = make_cpu_communicators(size);
  std::vector<MlaLayer> alone, together;
  for (int rank = 0; rank < size; ++rank) {
    const MlaTensorParallel tp{rank, size};
    const MlaWeights shard = shard_mla_weights(full, f.config, tp);
    alone.emplace_back(f.config, shard, Device::cpu(), tp);
    together.emplace_back(f.config, shard, Device::cpu(), tp, comms[std::size_t(rank)].get());
    EXPECT_EQ(alone.back().config().heads, f.config.heads / size);
  }
  for (int rank = 0; rank < size; ++rank) {
    std::vector<std::uint8_t> cache = f.cache;
    r.partials[std::size_t(rank)] = prefill(alone[std::size_t(rank)], f, cache, backend, o);
  }
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      const std::size_t i = std::size_t(rank);
      r.reduced[i] = prefill(together[i], f, r.caches[i], backend, o);
    });
  }
  for (std::thread& t : threads) t.join();
  return r;
}

// The largest |y' - y| / bound over the elements (<= 1 passes), and the largest |y' - y| in bf16
// ulps of the element's largest magnitude among y and the partials (where partials cancel, y is
// small and its own ulp says little), for y' = `tp` and the partials given.
struct BoundCheck {
  double worst_ratio = 0, worst_ulps = 0;
};

BoundCheck check_bound(const Output& full, const Output& tp, const std::vector<Output>& partials,
                       std::size_t ranks_used) {
  constexpr double u = 1.0 / 256;
  BoundCheck b;
  for (std::size_t i = 0; i < full.size(); ++i) {
    const double y = decode_bf16(full[i]), yp = decode_bf16(tp[i]);
    double sum_abs = 0, largest = std::abs(y);
    for (std::size_t r = 0; r < ranks_used; ++r) {
      const double p = std::abs(decode_bf16(partials[r][i]));
      sum_abs += p;
      largest = std::max(largest, p);
    }
    const double bound = u * (sum_abs + std::abs(y) + std::abs(yp)) * (1 + 1.0 / 16);
    const double err = std::abs(yp - y);
    b.worst_ratio = std::max(b.worst_ratio, bound > 0 ? err / bound : (err > 0 ? 1e30 : 0));
    if (largest > 0)
      b.worst_ulps = std::max(b.worst_ulps, err / std::ldexp(1.0, std::ilogb(largest) - 7));
  }
  return b;
}

// bf16 of the f32 sum of the first `ranks` partials, rank 0 first: the communicator's sum.
Output rank_order_sum(const std::vector<Output>& partials, std::size_t ranks) {
  Output out(partials[0].size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    float s = 0;
    for (std::size_t r = 0; r < ranks; ++r) s += decode_bf16(partials[r][i]);
    out[i] = encode_bf16(s);
  }
  return out;
}

struct Case {
  WeightFormat format;
  std::int64_t heads;  // the tiny preset's 4, or more for FP8 shards of 2 heads
  std::vector<int> sizes;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << (c.format == WeightFormat::kBf16 ? "bf16" : "fp8") << " weights, " << c.heads << " heads";
}

class MlaTensorParallelCpu : public ::testing::TestWithParam<Case> {};

TEST_P(MlaTensorParallelCpu, SumOfRankPartialsMatchesTheOneRankLayer) {
  const Case& c = GetParam();
  // Without a cached prefix, and with prefixes (one-shot and chunked below).
  for (const auto& lens : std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>>{
           {{0, 21}, {0, 6}}, {{0, 13}, {70, 9}, {33, 0}, {40, 5}}}) {
    Fixture f(lens, 11);
    f.config.heads = c.heads;
    const MlaWeights full = generate_mla_weights(f.config, c.format, 5);
    MlaLayer plain(f.config, full);
    for (const char* name : {"cpu", "cpu-bf16"}) {
      const std::unique_ptr<AttentionBackend> backend = make_attention_backend(name);
      for (std::int64_t capacity : {0, 32}) {  // one-shot, chunked prefix
        const MlaPrefillOptions o = prefix_mode(capacity);
        std::vector<std::uint8_t> plain_cache = f.cache;
        const Output y = prefill(plain, f, plain_cache, *backend, o);
        for (int size : c.sizes) {
          SCOPED_TRACE(::testing::Message()
                       << name << " capacity " << capacity << " heads " << c.heads << " size "
                       << size << " prefix " << lens[1].first);
          const RankOutputs r = run_ranks(f, full, size, *backend, o);
          for (int rank = 0; rank < size; ++rank) {
            // Every rank gets the same reduced output, the f32 rank-order sum of the partials,
            // and writes the same latent cache as the one-rank layer (it is replicated).
            EXPECT_EQ(r.reduced[std::size_t(rank)], rank_order_sum(r.partials, std::size_t(size)));
            EXPECT_EQ(r.caches[std::size_t(rank)], plain_cache);
          }
          if (size == 1) {
            EXPECT_EQ(r.partials[0], y);  // one rank is the plain layer, bit for bit
            EXPECT_EQ(r.reduced[0], y);
            continue;
          }
          const BoundCheck b = check_bound(y, r.reduced[0], r.partials, std::size_t(size));
          std::printf(
              "[ tp       ] %s %s capacity %lld heads %lld size %d: max error %.3g bf16 ulps "
              "of the largest term, %.3g of the bound\n",
              c.format == WeightFormat::kBf16 ? "bf16" : "fp8", name,
              static_cast<long long>(capacity), static_cast<long long>(c.heads), size, b.worst_ulps,
              b.worst_ratio);
          EXPECT_LE(b.worst_ratio, 1.0);
          // The bound is not vacuous: leaving out the last rank's partial breaks it.
          const Output missing = rank_order_sum(r.partials, std::size_t(size - 1));
          EXPECT_GT(check_bound(y, missing, r.partials, std::size_t(size - 1)).worst_ratio, 1.0);
        }
      }
    }
  }
}

// The tiny preset's 4 heads shard into 1, 2 or 4 with bf16 weights; with FP8 block scales only
// into 2 (192-row q_b shards of one head do not fall on 128-row blocks). 16 heads (the real
// head dims, the tiny hidden size) shard FP8 weights over 2, 4 and 8 ranks.
INSTANTIATE_TEST_SUITE_P(Shapes, MlaTensorParallelCpu,
                         ::testing::Values(Case{WeightFormat::kBf16, 4, {1, 2, 4}},
                                           Case{WeightFormat::kFp8Block, 4, {1, 2}},
                                           Case{WeightFormat::kFp8Block, 16, {2, 4, 8}}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.format == WeightFormat::kBf16 ? "Bf16"
                                                                                       : "Fp8") +
                                  "Heads" + std::to_string(info.param.heads);
                         });

// The reduction is timed as its own stage: on each of 2 ranks; not for one rank, which has
// nothing to reduce (the communicator is not called).
TEST(MlaTensorParallelCpuTimes, TheReduceStageIsTimedOnEveryRank) {
  Fixture f({{0, 8}}, 2);
  const MlaWeights full = generate_mla_weights(f.config, WeightFormat::kBf16, 1);
  const std::unique_ptr<AttentionBackend> cpu = make_attention_backend("cpu");
  for (int size : {1, 2}) {
    std::vector<std::unique_ptr<MlaCommunicator>> comms = make_cpu_communicators(size);
    std::vector<MlaStageTimes> times(static_cast<std::size_t>(size));
    std::vector<std::thread> threads;
    for (int rank = 0; rank < size; ++rank) {
      threads.emplace_back([&, rank] {
        const MlaTensorParallel tp{rank, size};
        MlaLayer layer(f.config, shard_mla_weights(full, f.config, tp), Device::cpu(), tp,
                       comms[std::size_t(rank)].get());
        std::vector<std::uint8_t> cache = f.cache;
        std::vector<std::uint16_t> hidden = f.hidden;
        Output out(f.hidden.size());
        layer.prefill(TensorView(hidden.data(), DType::kBF16, {f.tokens, f.config.hidden}), f.batch,
                      TensorView(cache.data(), DType::kE4M3, {kPages, kPageSize, kMlaLatentDim}),
                      *cpu, {}, TensorView(out.data(), DType::kBF16, {f.tokens, f.config.hidden}),
                      {}, &times[std::size_t(rank)]);
      });
    }
    for (std::thread& t : threads) t.join();
    for (const MlaStageTimes& t : times) {
      EXPECT_GT(t.output, 0.0);
      if (size == 1) {
        EXPECT_EQ(t.reduce, 0.0);
      } else {
        EXPECT_GT(t.reduce, 0.0);
      }
      EXPECT_GE(t.total(), t.output + t.reduce);
    }
  }
}

}  // namespace
}  // namespace fp8mla
