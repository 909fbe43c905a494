// `fp8mla run --tp N --cp M` (parallel_run.hpp): every rank of the N x M grid on its own thread
// of this process. Rank (t, c)'s layer is shard t of the full weights with the TP group of CP
// rank c (the N ranks with that c) reducing o_proj's partial sums; its prefill is
// prefill_context_parallel of CP rank c's share of the batch with the CP group of TP rank t (the
// M ranks with that t) gathering the latent rows, on its own copy of the cache. Every TP rank of
// CP rank c then holds the full output rows of c's tokens; the full output is assembled from TP
// rank 0 of each c. With M == 1 the ranks run the plain prefill of the whole batch (no gather).
#include "parallel_run.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "fp8mla/attention_backend.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_parallel.hpp"
#include "fp8mla/numerics.hpp"
#include "fp8mla/runtime_info.hpp"
#if defined(FP8MLA_WITH_CUDA)
#include "bench/device.hpp"
#include "gpu_layer.hpp"
#endif

namespace fp8mla::cli {
namespace {

using Rows = std::vector<std::uint16_t>;

// The N x M grid; rank (t, c) has index c * N + t (its device on the GPU).
struct Grid {
  int tp = 1, cp = 1;
  int ranks() const { return tp * cp; }
  int index(int t, int c) const { return c * tp + t; }
};

// CP rank c's share of `full`. With M == 1 the whole batch, every row (the plain prefill).
MlaContextParallelBatch rank_share(const MlaBatch& full, int c, int m) {
  if (m > 1) return mla_context_parallel_batch(full, {c, m});
  MlaContextParallelBatch share;
  share.batch = full;
  share.tokens.resize(std::size_t(full.extend_tokens()));
  std::iota(share.tokens.begin(), share.tokens.end(), std::int64_t{0});
  return share;
}

Rows take_rows(const Rows& x, const std::vector<std::int64_t>& rows, std::int64_t width) {
  Rows out(rows.size() * std::size_t(width));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::copy_n(x.begin() + rows[i] * width, width, out.begin() + std::int64_t(i) * width);
  }
  return out;
}

void put_rows(const Rows& part, const std::vector<std::int64_t>& rows, std::int64_t width,
              Rows& full) {
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::copy_n(part.begin() + std::int64_t(i) * width, width, full.begin() + rows[i] * width);
  }
}

// Per stage, the slowest rank's time.
MlaStageTimes slowest(const std::vector<MlaStageTimes>& ranks) {
  MlaStageTimes m = ranks.front();
  for (const MlaStageTimes& t : ranks) {
    m.projections = std::max(m.projections, t.projections);
    m.prep = std::max(m.prep, t.prep);
    m.gather = std::max(m.gather, t.gather);
    m.prefix = std::max(m.prefix, t.prefix);
    m.attention = std::max(m.attention, t.attention);
    m.merge = std::max(m.merge, t.merge);
    m.output = std::max(m.output, t.output);
    m.reduce = std::max(m.reduce, t.reduce);
  }
  return m;
}

double slowest_total(const std::vector<MlaStageTimes>& ranks) {
  double m = 0;
  for (const MlaStageTimes& t : ranks) m = std::max(m, t.total());
  return m;
}

// Runs f(t, c) for every rank, each on its own thread (the collectives are rendezvous of the
// group's threads), and rethrows the first rank's error once all have joined.
template <typename F>
void on_rank_threads(Grid g, F f) {
  std::mutex mutex;
  std::exception_ptr error;
  std::vector<std::thread> threads;
  for (int c = 0; c < g.cp; ++c) {
    for (int t = 0; t < g.tp; ++t) {
      threads.emplace_back([&, t, c] {
        try {
          f(t, c);
        } catch (...) {
          const std::lock_guard<std::mutex> lock(mutex);
          if (!error) error = std::current_exception();
        }
      });
    }
  }
  for (std::thread& th : threads) th.join();
  if (error) std::rethrow_exception(error);
}

// The communicator groups: tp[c][t] for the N ranks of CP rank c (none when N == 1), cp[t][c]
// for the M ranks of TP rank t (none when M == 1).
struct Groups {
  std::vector<std::vector<std::unique_ptr<MlaCommunicator>>> tp, cp;
  MlaCommunicator* tp_of(int t, int c) const {
    return tp.empty() ? nullptr : tp[std::size_t(c)][std::size_t(t)].get();
  }
  MlaCommunicator* cp_of(int t, int c) const {
    return cp.empty() ? nullptr : cp[std::size_t(t)][std::size_t(c)].get();
  }
};

Groups cpu_groups(Grid g) {
  Groups groups;
  if (g.tp > 1)
    for (int c = 0; c < g.cp; ++c) groups.tp.push_back(make_cpu_communicators(g.tp));
  if (g.cp > 1)
    for (int t = 0; t < g.tp; ++t) groups.cp.push_back(make_cpu_communicators(g.cp));
  return groups;
}

std::vector<MlaWeights> shards_of(const MlaWeights& full, const MlaConfig& config, int n) {
  std::vector<MlaWeights> shards;
  for (int t = 0; t < n; ++t) shards.push_back(shard_mla_weights(full, config, {t, n}));
  return shards;
}

void set_header(const RunOptions& opt, Report& r) {
  r.tp = opt.tp;
  r.cp = opt.cp;
  r.paths = {PathResult{"fp8"}, PathResult{"bf16"}};
  r.one_rank = {PathResult{"one-rank fp8"}, PathResult{"one-rank bf16"}};
  r.vs_one_rank = {PathResult{"fp8 vs one-rank fp8"}, PathResult{"bf16 vs one-rank bf16"}};
}

// The assembled outputs (FP8 path, BF16 path) against float64 and the one-rank outputs.
void score_parallel(const std::vector<Rows>& assembled, const std::vector<Rows>& one_rank,
                    const std::vector<double>& ref, Report& r) {
  score_paths(assembled, ref, r);
  for (std::size_t i = 0; i < 2; ++i) {
    score(one_rank[i], ref, r.one_rank[i]);
    std::vector<double> base(one_rank[i].size());
    for (std::size_t k = 0; k < base.size(); ++k) base[k] = decode_bf16(one_rank[i][k]);
    score(assembled[i], base, r.vs_one_rank[i]);
  }
}

// ---- CPU: host tensors, make_cpu_communicators ---------------------------------------------

class CpuRanks {
 public:
  CpuRanks(const MlaConfig& config, const MlaWeights& weights, Grid g)
      : g_(g), groups_(cpu_groups(g)), shards_(shards_of(weights, config, g.tp)) {
    for (int c = 0; c < g.cp; ++c) {
      for (int t = 0; t < g.tp; ++t) {
        layers_.push_back(std::make_unique<MlaLayer>(config, shards_[std::size_t(t)], Device::cpu(),
                                                     MlaTensorParallel{t, g.tp},
                                                     groups_.tp_of(t, c)));
      }
    }
  }
  const MlaLayer& layer0() const { return *layers_.front(); }

  // Every rank's prefill of its share of `in` through backend `name` at once; the assembled
  // output, and in `p` the slowest rank's stage times and wall time.
  Rows prefill(const BatchInputs& in, const char* name, const MlaPrefillOptions& o, PathResult& p) {
    const std::int64_t width = layer0().config().hidden;
    Rows full(in.hidden.size(), 0xFFFF);  // NaN poison: a row no rank wrote shows
    std::vector<MlaStageTimes> times(std::size_t(g_.ranks()));
    std::vector<double> wall(times.size());
    on_rank_threads(g_, [&](int t, int c) {
      const std::size_t i = std::size_t(g_.index(t, c));
      const MlaContextParallelBatch share = rank_share(in.batch, c, g_.cp);
      const std::int64_t rows = std::int64_t(share.tokens.size());
      Rows x = take_rows(in.hidden, share.tokens, width), out(x.size());
      std::vector<std::uint8_t> cache = in.cache;
      const TensorView xv(x.data(), DType::kBF16, {rows, width});
      const TensorView ov(out.data(), DType::kBF16, {rows, width});
      const TensorView cv(cache.data(), DType::kE4M3, {in.pages, kPageSize, kMlaLatentDim});
      const std::unique_ptr<AttentionBackend> backend = make_attention_backend(name);
      const auto start = std::chrono::steady_clock::now();
      if (g_.cp > 1) {
        layers_[i]->prefill_context_parallel(xv, share, *groups_.cp_of(t, c), cv, *backend, o, ov,
                                             {}, &times[i]);
      } else {
        layers_[i]->prefill(xv, share.batch, cv, *backend, o, ov, {}, &times[i]);
      }
      wall[i] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                    .count();
      if (t == 0) put_rows(out, share.tokens, width, full);  // distinct rows per c
    });
    p.times = slowest(times);
    p.total_ms = *std::max_element(wall.begin(), wall.end());
    return full;
  }

 private:
  Grid g_;
  Groups groups_;
  std::vector<MlaWeights> shards_;
  std::vector<std::unique_ptr<MlaLayer>> layers_;  // rank (t, c) at index c * N + t
};

#if defined(FP8MLA_WITH_CUDA)
// ---- GPU: rank (t, c) on device c * N + t, NCCL groups --------------------------------------

constexpr const char* kGpuBackends[2] = {"fp8-hopper", "bf16-hopper"};

Groups nccl_groups(Grid g) {
  Groups groups;
  for (int c = 0; g.tp > 1 && c < g.cp; ++c) {
    std::vector<int> devices;
    for (int t = 0; t < g.tp; ++t) devices.push_back(g.index(t, c));
    groups.tp.push_back(make_nccl_communicators(devices));
  }
  for (int t = 0; g.cp > 1 && t < g.tp; ++t) {
    std::vector<int> devices;
    for (int c = 0; c < g.cp; ++c) devices.push_back(g.index(t, c));
    groups.cp.push_back(make_nccl_communicators(devices));
  }
  return groups;
}

MlaWorkspaceLimits limits_of(const MlaBatch& batch) {
  MlaWorkspaceLimits limits{batch.extend_tokens(), std::int64_t(batch.sequences.size()), 0};
  for (const MlaSequence& s : batch.sequences) limits.max_prefix_tokens += s.prefix;
  return limits;
}

// One rank: its layer, backends (its own: a backend may keep per-device state), stream, and
// device copies of its share of a batch.
struct GpuRank {
  int t = 0, c = 0, device = 0;
  std::unique_ptr<MlaLayer> layer;
  std::vector<std::unique_ptr<AttentionBackend>> backends;  // kGpuBackends
  cudaStream_t stream = nullptr;
  MlaContextParallelBatch share;
  std::int64_t pages = 0;
  DeviceBuffer hidden, cache, out, workspace;

  GpuRank() = default;
  GpuRank(const GpuRank&) = delete;
  GpuRank& operator=(const GpuRank&) = delete;
  ~GpuRank() {
    if (stream == nullptr) return;
    cudaSetDevice(device);
    cudaStreamDestroy(stream);
  }
};

class GpuRanks {
 public:
  GpuRanks(const MlaConfig& config, const MlaWeights& weights, Grid g)
      : g_(g), groups_(nccl_groups(g)), shards_(shards_of(weights, config, g.tp)) {
    for (int c = 0; c < g.cp; ++c) {
      for (int t = 0; t < g.tp; ++t) {
        auto k = std::make_unique<GpuRank>();
        k->t = t;
        k->c = c;
        k->device = g.index(t, c);
        k->layer =
            std::make_unique<MlaLayer>(config, shards_[std::size_t(t)], Device::cuda(k->device),
                                       MlaTensorParallel{t, g.tp}, groups_.tp_of(t, c));
        for (const char* name : kGpuBackends) k->backends.push_back(make_attention_backend(name));
        cuda::check(cudaSetDevice(k->device), "cudaSetDevice(rank)");
        cuda::check(cudaStreamCreateWithFlags(&k->stream, cudaStreamNonBlocking),
                    "cudaStreamCreateWithFlags(rank)");
        ranks_.push_back(std::move(k));
      }
    }
  }
  const MlaLayer& layer0() const { return *ranks_.front()->layer; }
  const AttentionBackend& backend0(int path) const {
    return *ranks_.front()->backends[std::size_t(path)];
  }
  std::size_t size() const { return ranks_.size(); }

  // Device copies of every rank's share of `in` (hidden rows, the whole cache) and a workspace
  // for both paths on it.
  void load(const BatchInputs& in, const MlaPrefillOptions& o) {
    tokens_ = in.tokens;
    const std::int64_t width = layer0().config().hidden;
    for (const std::unique_ptr<GpuRank>& rank : ranks_) {
      GpuRank& k = *rank;
      cuda::check(cudaSetDevice(k.device), "cudaSetDevice(rank)");
      k.share = rank_share(in.batch, k.c, g_.cp);
      const Rows x = take_rows(in.hidden, k.share.tokens, width);
      k.hidden = DeviceBuffer(x.data(), std::int64_t(x.size()) * 2);
      k.out = DeviceBuffer(std::int64_t(x.size()) * 2);
      k.pages = in.pages;
      k.cache = DeviceBuffer(in.cache.data(), std::int64_t(in.cache.size()));
      const MlaWorkspaceLimits limits =
          g_.cp > 1 ? k.share.workspace_limits() : limits_of(k.share.batch);
      std::size_t bytes = 0;
      for (const std::unique_ptr<AttentionBackend>& b : k.backends)
        bytes = std::max(bytes, k.layer->workspace_bytes(limits, o, *b));
      k.workspace = DeviceBuffer(std::int64_t(bytes));
    }
  }

  // Resets every rank's cache to `in`'s (a checked run writes the new tokens' rows).
  void set_cache(const BatchInputs& in) {
    for (const std::unique_ptr<GpuRank>& k : ranks_) {
      cuda::check(cudaSetDevice(k->device), "cudaSetDevice(rank)");
      cuda::check(
          cudaMemcpy(k->cache.data(), in.cache.data(), in.cache.size(), cudaMemcpyHostToDevice),
          "cudaMemcpy(rank cache)");
    }
  }

  // Every rank's prefill through path `path` (0: FP8, 1: BF16) at once, each from its own
  // thread on its own stream (NCCL's rule for one process driving several GPUs), waited for;
  // each rank's stage times (its own stage stamps) in (*times)[c * N + t] when asked for.
  void prefill(int path, const MlaPrefillOptions& o, std::vector<MlaStageTimes>* times) {
    on_rank_threads(g_, [&](int t, int c) {
      const std::size_t i = std::size_t(g_.index(t, c));
      GpuRank& k = *ranks_[i];
      cuda::check(cudaSetDevice(k.device), "cudaSetDevice(rank)");
      const Device d = Device::cuda(k.device);
      const std::int64_t rows = std::int64_t(k.share.tokens.size());
      const std::int64_t width = k.layer->config().hidden;
      const TensorView x(k.hidden.data(), DType::kBF16, {rows, width}, d);
      const TensorView out(k.out.data(), DType::kBF16, {rows, width}, d);
      const TensorView cache(k.cache.data(), DType::kE4M3, {k.pages, kPageSize, kMlaLatentDim}, d);
      const TensorView ws(k.workspace.data(), DType::kE4M3, {k.workspace.bytes()}, d);
      MlaStageTimes* rank_times = times != nullptr ? &(*times)[i] : nullptr;
      const AttentionBackend& b = *k.backends[std::size_t(path)];
      if (g_.cp > 1) {
        k.layer->prefill_context_parallel(x, k.share, *groups_.cp_of(t, c), cache, b, o, out, ws,
                                          rank_times, k.stream);
      } else {
        k.layer->prefill(x, k.share.batch, cache, b, o, out, ws, rank_times, k.stream);
      }
      cuda::check(cudaStreamSynchronize(k.stream), "cudaStreamSynchronize(rank)");
    });
  }

  // The full output of the last prefill, from TP rank 0 of each CP rank.
  Rows assemble() const {
    const std::int64_t width = layer0().config().hidden;
    Rows full(std::size_t(tokens_ * width), 0xFFFF);  // NaN poison: a row no rank wrote shows
    for (int c = 0; c < g_.cp; ++c) {
      const GpuRank& k = *ranks_[std::size_t(g_.index(0, c))];
      cuda::check(cudaSetDevice(k.device), "cudaSetDevice(rank)");
      put_rows(to_host<std::uint16_t>(k.out.data(), k.out.bytes() / 2), k.share.tokens, width,
               full);
    }
    return full;
  }

 private:
  Grid g_;
  Groups groups_;  // outlives the layers, which call it
  std::vector<MlaWeights> shards_;
  std::vector<std::unique_ptr<GpuRank>> ranks_;  // rank (t, c) at index c * N + t
  std::int64_t tokens_ = 0;
};

// A warm-up, then five runs on every rank at once; of the five, the one whose slowest rank is
// the median: per stage its slowest rank's time, and the slowest rank's total.
void time_path(GpuRanks& ranks, int path, const MlaPrefillOptions& o, PathResult& p) {
  ranks.prefill(path, o, nullptr);
  std::vector<std::vector<MlaStageTimes>> runs(5, std::vector<MlaStageTimes>(ranks.size()));
  for (std::vector<MlaStageTimes>& run : runs) ranks.prefill(path, o, &run);
  std::sort(runs.begin(), runs.end(),
            [](const auto& a, const auto& b) { return slowest_total(a) < slowest_total(b); });
  p.times = slowest(runs[runs.size() / 2]);
  p.total_ms = slowest_total(runs[runs.size() / 2]);
}

// The one-rank layer on cuda:0, both paths on the accuracy batch.
std::vector<Rows> one_rank_on_gpu(const MlaConfig& config, const MlaWeights& weights,
                                  const BatchInputs& in, const MlaPrefillOptions& options) {
  std::vector<std::unique_ptr<AttentionBackend>> owned;
  std::vector<const AttentionBackend*> backends;
  for (const char* name : kGpuBackends) {
    owned.push_back(make_attention_backend(name));
    backends.push_back(owned.back().get());
  }
  cuda::check(cudaSetDevice(0), "cudaSetDevice(0)");
  GpuLayerHarness h(config, weights, in.batch, in.hidden, in.pages, kPageSize, options, backends);
  std::vector<Rows> outputs;
  for (const AttentionBackend* b : backends) {
    h.set_cache(in.cache);
    h.prefill(*b);
    outputs.push_back(h.out());
  }
  return outputs;
}
#endif

}  // namespace

void check_parallel_devices(const RunOptions& opt, bool gpu) {
  if (!gpu) return;
  const CudaDevices devices = cuda_devices();
  const int have = int(devices.devices.size()), need = opt.tp * opt.cp;
  if (have >= need) return;
  throw Error(ErrorCategory::kUnsupported,
              concat("--tp ", opt.tp, " --cp ", opt.cp, ": needs ", need,
                     " CUDA devices (one per rank), this machine has ", have,
                     have == 0 ? concat(" (", devices.unavailable_reason, ")") : std::string(),
                     "; --device cpu runs the ranks on the CPU"));
}

void check_parallel_run(const RunOptions& opt, const MlaConfig& config, WeightFormat format) {
  if (opt.calibrate) {
    // Each rank would calibrate its own heads' scales; the report has one set.
    throw Error(ErrorCategory::kUnsupported,
                concat("--calibrate with --tp ", opt.tp, " --cp ", opt.cp,
                       " is not supported; run --calibrate without --tp and --cp"));
  }
  for (int t = 0; t < opt.tp; ++t) check_mla_tensor_parallel(config, {t, opt.tp}, format);
}

void run_parallel_on_cpu(const MlaConfig& config, const MlaWeights& weights, const RunOptions& opt,
                         Report& r) {
  const BatchInputs in = make_inputs(config, {{0, 128}, {384, 64}, {768, 32}, {0, 1}}, opt.seed);
  const MlaPrefillOptions options = prefill_options(opt);
  set_header(opt, r);
  r.device = "the CPU";
  r.accuracy_batch = r.timing_batch = describe(in, opt.chunk_capacity);
  r.timing_tokens = in.tokens;
  r.attention_flop = in.attention_flop;
  Progress progress(4);
  progress.step("float64 reference");
  const std::vector<double> ref = reference(config, weights, in, 1.0f);
  progress.step("the one-rank layer, both paths");
  std::vector<Rows> one_rank;
  {
    MlaLayer layer(config, weights);
    for (const char* name : {"cpu", "cpu-bf16"}) {
      std::vector<std::uint8_t> cache = in.cache;
      Rows out(in.hidden.size());
      layer.prefill(TensorView(const_cast<std::uint16_t*>(in.hidden.data()), DType::kBF16,
                               {in.tokens, config.hidden}),
                    in.batch,
                    TensorView(cache.data(), DType::kE4M3, {in.pages, kPageSize, kMlaLatentDim}),
                    *make_attention_backend(name), options,
                    TensorView(out.data(), DType::kBF16, {in.tokens, config.hidden}));
      one_rank.push_back(std::move(out));
    }
  }
  progress.step("preparing the ranks' layers");
  CpuRanks ranks(config, weights, {opt.tp, opt.cp});
  r.notes = ranks.layer0().projection_notes();
  r.notes.push_back("FP8 path, " +
                    ranks.layer0().output_quant_plan(*make_attention_backend("cpu"), options).note);
  progress.step("both paths on every rank");
  std::vector<Rows> assembled;
  assembled.push_back(ranks.prefill(in, "cpu", options, r.paths[0]));
  assembled.push_back(ranks.prefill(in, "cpu-bf16", options, r.paths[1]));
  score_parallel(assembled, one_rank, ref, r);
}

#if defined(FP8MLA_WITH_CUDA)
// Accuracy on the small batch against float64 and the one-rank layer on cuda:0; time on the
// large one, every rank at once.
void run_parallel_on_gpu(const MlaConfig& config, const MlaWeights& weights, const RunOptions& opt,
                         Report& r) {
  const MlaPrefillOptions options = prefill_options(opt);
  const Grid g{opt.tp, opt.cp};
  set_header(opt, r);
  r.device = concat("cuda:0..", g.ranks() - 1, " (", cuda_devices().devices[0].name, ")");
  Progress progress(6);
  progress.step("accuracy batch: float64 reference");
  const BatchInputs small = make_inputs(config, {{0, 96}, {512, 32}, {100, 17}, {0, 1}}, opt.seed);
  r.accuracy_batch = describe(small, opt.chunk_capacity);
  const std::vector<double> ref = reference(config, weights, small, 1.0f);
  progress.step("accuracy batch: the one-rank layer on cuda:0");
  const std::vector<Rows> one_rank = one_rank_on_gpu(config, weights, small, options);

  progress.step("preparing the ranks' layers");
  GpuRanks ranks(config, weights, g);
  r.notes = ranks.layer0().projection_notes();
  r.notes.push_back("FP8 path, " +
                    ranks.layer0().output_quant_plan(ranks.backend0(0), options).note);
  progress.step("accuracy batch: both paths on every rank");
  ranks.load(small, options);
  std::vector<Rows> assembled;
  for (int path = 0; path < 2; ++path) {
    ranks.set_cache(small);
    ranks.prefill(path, options, nullptr);
    assembled.push_back(ranks.assemble());
  }
  score_parallel(assembled, one_rank, ref, r);

  const BatchInputs large =
      make_inputs(config, {{0, 4096}, {8192, 2048}, {2048, 1024}, {0, 1}}, opt.seed + 1);
  r.timing_batch = describe(large, opt.chunk_capacity);
  r.timing_tokens = large.tokens;
  r.attention_flop = large.attention_flop;
  ranks.load(large, options);
  for (int path = 0; path < 2; ++path) {
    progress.step(path == 0 ? "timing the FP8 path" : "timing the BF16 path");
    time_path(ranks, path, options, r.paths[std::size_t(path)]);
  }
}
#endif

}  // namespace fp8mla::cli
