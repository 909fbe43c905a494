// `fp8mla bench layer`: one DeepSeek-V3 MLA layer prefill on cuda:0, a single sequence of T new
// tokens (2k, 8k, 32k) with no prefix or a cached prefix of T tokens (one-shot up to 8192 prefix
// keys, chunks of 8192 above), through
//   fp8:  FP8 block-scaled weights, the "fp8-hopper" backend (the FP8 path, o_proj's input
//         written by the attention: fused output quantization);
//   fp8-sq: the same with o_proj's input quantized separately (--output-quant separate or both);
//   fp8-mg: the fp8 row with each prefix chunk merged after its attention call instead of folded
//         in it (--chunks merge or both; rows with chunks only);
//   fp8-kv: the fp8 row with K-nope and V written in e4m3 by kv_b's own GEMMs
//         (fp8_kv_from_projection) instead of quantized by the hook (--kv-output projection or
//         both);
//   bf16: the same weights, the "bf16-hopper" backend (the BF16 path);
//   bf16w: bf16 weights, "bf16-hopper" (the BF16 path of a BF16 checkpoint).
// Time: CUDA events around prefill (metadata upload included), warm-up, median; then one run
// with the per-stage clock stamps. bench/layer.py times an eager PyTorch BF16 layer on the same
// shapes.
// --cp N times context parallelism's per-rank compute instead (bench_context_parallel), --tp
// N,... tensor parallelism's (bench_tensor_parallel).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/harness.hpp"
#include "commands.hpp"
#include "fp8mla/attention_backend.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_layer.hpp"
#include "fp8mla/mla_parallel.hpp"
#include "fp8mla/numerics.hpp"
#include "gpu_layer.hpp"

namespace fp8mla::cli {
namespace {

constexpr std::int64_t kPageSize = 64;

// A row kind of the table: weights, backend, whether o_proj's input is fused and whether prefix
// chunks fold into the output in their attention calls.
struct PathSpec {
  const char* name;
  bool fp8_weights, fp8_backend, fuse_output_quant;
  bool fold_chunks = true;
  bool kv_from_projection = false;
};

// The paths to time: the FP8 path with, without or both ways of making o_proj's input, with
// chunks folded, merged or both, and with K-nope and V quantized by the hook, written by kv_b or
// both.
std::vector<PathSpec> paths_for(const std::string& output_quant, const std::string& chunks,
                                const std::string& kv_output) {
  std::vector<PathSpec> paths;
  const bool fused = output_quant != "separate";
  if (fused && chunks != "merge" && kv_output != "projection") {
    paths.push_back({"fp8", true, true, true});
  }
  if (fused && kv_output != "hook") paths.push_back({"fp8-kv", true, true, true, true, true});
  if (fused && chunks != "fold") paths.push_back({"fp8-mg", true, true, true, false});
  if (output_quant != "fused") paths.push_back({"fp8-sq", true, true, false});
  paths.push_back({"bf16", true, false, true});
  paths.push_back({"bf16w", false, false, true});
  return paths;
}

struct Row {
  std::string path;
  std::int64_t tokens = 0, prefix = 0;
  double ms = 0;
  MlaStageTimes stages;
  double attention_tflop = 0;
};

void write_json(const std::string& path, const std::vector<Row>& rows, const std::string& device,
                double settle_ms) {
  JsonFields header;
  header.add("bench", json_string("layer"))
      .add("device", json_string(device))
      .add("preset", json_string("deepseek-v3"))
      .add("settle_ms", json_number(settle_ms));
  std::vector<std::string> objects;
  for (const Row& r : rows) {
    const std::string output_quant(to_string(r.stages.output_quant));
    objects.push_back(JsonFields()
                          .add("path", json_string(r.path))
                          .add("tokens", r.tokens)
                          .add("prefix", r.prefix)
                          .add("ms", json_number(r.ms))
                          .add("attention_tflop", json_number(r.attention_tflop))
                          .add("projections_ms", json_number(r.stages.projections))
                          .add("prep_ms", json_number(r.stages.prep))
                          .add("prefix_ms", json_number(r.stages.prefix))
                          .add("attention_ms", json_number(r.stages.attention))
                          .add("merge_ms", json_number(r.stages.merge))
                          .add("output_ms", json_number(r.stages.output))
                          .add("output_quant", json_string(output_quant))
                          .object());
  }
  write_json_document(path, header, "rows", objects);
}

// A random hidden state per token and a random FP8 cache of `pages` pages.
std::vector<std::uint16_t> random_hidden(std::int64_t tokens, std::int64_t width) {
  std::mt19937 rng{7};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::uint16_t> hidden(std::size_t(tokens * width));
  for (auto& h : hidden) h = encode_bf16(normal(rng));
  return hidden;
}
std::vector<std::uint8_t> random_cache(std::int64_t pages) {
  std::mt19937 rng{11};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::uint8_t> cache(std::size_t(pages * kPageSize * kMlaLatentDim));
  for (auto& b : cache) b = encode_e4m3(normal(rng));
  return cache;
}

// One sequence of T new tokens after `prefix` cached ones on slots 0, 1, ...: its random hidden
// states and a random cache of the pages it spans.
struct SequenceInputs {
  MlaBatch batch;
  std::int64_t pages = 0;
  std::vector<std::uint16_t> hidden;
  std::vector<std::uint8_t> cache;
};
SequenceInputs one_sequence(const MlaConfig& config, std::int64_t T, std::int64_t prefix) {
  SequenceInputs in;
  MlaSequence s{prefix, T, {}};
  for (std::int64_t i = 0; i < prefix + T; ++i) s.slots.push_back(i);
  in.batch.sequences.push_back(std::move(s));
  in.pages = (prefix + T + kPageSize - 1) / kPageSize;
  in.hidden = random_hidden(T, config.hidden);
  in.cache = random_cache(in.pages);
  return in;
}

// --cp N: each context-parallel rank's compute for one sequence of T new tokens, timed one rank
// after another on this GPU: the prefill of the rank's batch (its two zigzag chunks, each over
// everything before it as a cached prefix) over a cache that already holds every row, which is
// what the rank runs after the all-gather. The all-gather itself needs N GPUs and is not timed;
// its bytes are printed. Every prefix is attended one-shot. Against the one-rank prefill of the
// whole sequence: efficiency = one-rank time / (N x the slowest rank's).
void bench_context_parallel(const MlaConfig& config, const MlaWeights& weights,
                            const std::vector<const AttentionBackend*>& backends, int cp,
                            const std::vector<std::int64_t>& token_counts, EventTimer& timer,
                            int warmup) {
  std::printf("%-6s %7s %4s %6s %10s %9s %11s %12s\n", "path", "tokens", "cp", "rank", "ms",
              "tokens", "prefix", "gather MB");
  for (std::int64_t T : token_counts) {
    const SequenceInputs in = one_sequence(config, T, 0);
    const auto& [full, pages, hidden, cache] = in;
    MlaPrefillOptions options;
    options.one_shot_max_prefix = T;
    for (const AttentionBackend* backend : backends) {
      const char* path = backend->capabilities().prepare_prefill_qkv ? "fp8" : "bf16";
      double one = 0, slowest = 0;
      for (int rank = -1; rank < cp; ++rank) {  // -1: the one-rank prefill of the whole sequence
        const MlaContextParallelBatch b =
            mla_context_parallel_batch(full, {std::max(rank, 0), rank < 0 ? 1 : cp});
        std::vector<std::uint16_t> rows;
        for (std::int64_t t : b.tokens)
          rows.insert(rows.end(), hidden.begin() + t * config.hidden,
                      hidden.begin() + (t + 1) * config.hidden);
        GpuLayerHarness h(config, weights, b.batch, rows, pages, kPageSize, options, {backend});
        h.set_cache(cache);
        const double ms = timer.median_us([&](int) { h.prefill(*backend); }, warmup) / 1e3;
        if (rank < 0) {
          one = ms;
        } else {
          slowest = std::max(slowest, ms);
        }
        std::int64_t prefix = 0;
        for (const MlaSequence& q : b.batch.sequences) prefix += q.prefix;
        const double gather_mb =
            rank < 0 ? 0 : double(cp - 1) * double(b.rows_per_rank) * kMlaLatentDim / 1e6;
        std::printf(
            "%-6s %7lld %4d %6s %10.3f %9lld %11lld %12.1f\n", path, static_cast<long long>(T),
            rank < 0 ? 1 : cp, rank < 0 ? "all" : std::to_string(rank).c_str(), ms,
            static_cast<long long>(b.tokens.size()), static_cast<long long>(prefix), gather_mb);
        std::fflush(stdout);
      }
      std::printf(
          "# %s %lld tokens, cp %d: slowest rank %.3f ms, efficiency %.3f (one rank "
          "%.3f ms / (%d x slowest))\n",
          path, static_cast<long long>(T), cp, slowest, one / (cp * slowest), one, cp);
    }
  }
}

// --tp N,...: one tensor-parallel rank's compute for one sequence of T new tokens (no prefix):
// the layer of rank 0's shard (H / N heads; every rank does the same work), on this GPU, against
// the whole layer. The all-reduce of o_proj's partial sums needs N GPUs and is not timed; its
// bytes per rank are printed (T x hidden bf16). Efficiency = whole-layer time / (N x the rank's).
void bench_tensor_parallel(const MlaConfig& config, const MlaWeights& weights,
                           const std::vector<const AttentionBackend*>& backends,
                           const std::vector<int>& sizes,
                           const std::vector<std::int64_t>& token_counts, EventTimer& timer,
                           int warmup) {
  std::printf("%-6s %7s %4s %10s %11s %14s\n", "path", "tokens", "tp", "ms", "efficiency",
              "all-reduce MB");
  for (std::int64_t T : token_counts) {
    const SequenceInputs in = one_sequence(config, T, 0);
    const auto& [batch, pages, hidden, cache] = in;
    for (const AttentionBackend* backend : backends) {
      const char* path = backend->capabilities().prepare_prefill_qkv ? "fp8" : "bf16";
      double whole = 0;
      for (int n : sizes) {
        const MlaTensorParallel tp{0, n};
        const MlaWeights shard = shard_mla_weights(weights, config, tp);
        GpuLayerHarness h(config, shard, batch, hidden, pages, kPageSize, {}, {backend}, tp);
        h.set_cache(cache);
        const double ms = timer.median_us([&](int) { h.prefill(*backend); }, warmup) / 1e3;
        if (n == 1) whole = ms;
        std::printf("%-6s %7lld %4d %10.3f %11.3f %14.1f\n", path, static_cast<long long>(T), n, ms,
                    whole / (n * ms), double(T * config.hidden * 2) / 1e6);
        std::fflush(stdout);
      }
    }
  }
}

}  // namespace

void add_bench_layer_command(CLI::App& bench) {
  struct Options {
    std::vector<std::int64_t> tokens = {2048, 8192, 32768};
    int warmup = 2;
    int iters = 5;
    double settle_ms = 300;
    std::string json;
    std::string output_quant = "fused";
    std::string chunks = "fold";
    std::string kv_output = "hook";
    int cp = 1;
    std::vector<int> tp;
  };
  auto options = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand(
      "layer", "DeepSeek-V3 MLA layer prefill: FP8 path vs BF16 path, with and without prefix");
  cmd->add_option("--tokens", options->tokens, "New tokens of the sequence")->capture_default_str();
  cmd->add_option("--warmup", options->warmup, "Untimed runs")->check(CLI::Range(0, 100));
  cmd->add_option("--iters", options->iters, "Timed runs")->check(CLI::Range(1, 1000));
  cmd->add_option("--settle-ms", options->settle_ms,
                  "Untimed runs for about this long before each path's timed ones, so that each "
                  "is timed in its own steady state under the power cap (0: none)")
      ->check(CLI::Range(0.0, 60000.0))
      ->capture_default_str();
  cmd->add_option("--json", options->json, "Write the results as JSON to this file");
  cmd->add_option("--output-quant", options->output_quant,
                  "FP8 path's o_proj input: fused into the attention (row fp8), quantized "
                  "separately (row fp8-sq), or both rows")
      ->check(CLI::IsMember({"fused", "separate", "both"}))
      ->capture_default_str();
  cmd->add_option("--chunks", options->chunks,
                  "FP8 path's prefix chunks: folded into the output by their attention calls "
                  "(row fp8), merged after them (row fp8-mg, shapes with chunks only), or both")
      ->check(CLI::IsMember({"fold", "merge", "both"}))
      ->capture_default_str();
  cmd->add_option("--kv-output", options->kv_output,
                  "FP8 path's e4m3 K-nope and V: quantized from bf16 by the hook (row fp8), "
                  "written by kv_b's own e4m3-output GEMMs (row fp8-kv), or both")
      ->check(CLI::IsMember({"hook", "projection", "both"}))
      ->capture_default_str();
  cmd->add_option("--cp", options->cp,
                  "Context parallelism instead: each of N ranks' share of one sequence (no "
                  "prefix), timed one rank after another on this GPU, against the whole "
                  "sequence; the all-gather is not timed")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--tp", options->tp,
                  "Tensor parallelism instead: one rank's shard (H / N heads) for each N given "
                  "(1, 2, 4, 8), timed on this GPU against the whole layer; the all-reduce is not "
                  "timed")
      ->check(CLI::IsMember({1, 2, 4, 8}))
      ->delimiter(',');
  cmd->callback([options] {
    const MlaConfig config = mla_preset("deepseek-v3");
    const MlaWeights fp8_weights = generate_mla_weights(config, WeightFormat::kFp8Block, 1);
    const MlaWeights bf16_weights = generate_mla_weights(config, WeightFormat::kBf16, 1);
    const std::unique_ptr<AttentionBackend> fp8 = make_attention_backend("fp8-hopper");
    const std::unique_ptr<AttentionBackend> bf16 = make_attention_backend("bf16-hopper");
    const std::vector<const AttentionBackend*> backends = {fp8.get(), bf16.get()};
    const std::string device = cuda::current_device_props().name;
    const std::vector<PathSpec> paths =
        paths_for(options->output_quant, options->chunks, options->kv_output);
    std::printf("fp8mla bench layer: deepseek-v3 on %s\n", device.c_str());
    EventTimer timer(options->iters);
    timer.set_settle_ms(options->settle_ms);
    if (!options->tp.empty()) {
      std::vector<int> sizes = {1};  // the whole layer first: the efficiency's reference
      for (int n : options->tp)
        if (n > 1) sizes.push_back(n);
      bench_tensor_parallel(config, fp8_weights, backends, sizes, options->tokens, timer,
                            options->warmup);
      return;
    }
    if (options->cp > 1) {
      bench_context_parallel(config, fp8_weights, backends, options->cp, options->tokens, timer,
                             options->warmup);
      return;
    }
    std::printf("%-6s %7s %7s %10s %8s %8s %8s %8s %8s %8s\n", "path", "tokens", "prefix", "ms",
                "proj", "prep", "prefix", "attn", "merge", "o_proj");
    std::vector<Row> rows;
    for (std::int64_t T : options->tokens) {
      for (std::int64_t prefix : {std::int64_t(0), T}) {
        const SequenceInputs in = one_sequence(config, T, prefix);
        const auto& [batch, pages, hidden, cache] = in;
        const double pairs = double(T) * double(prefix) + 0.5 * double(T) * double(T + 1);
        for (const PathSpec& path : paths) {
          if (!path.fold_chunks && prefix <= MlaPrefillOptions{}.one_shot_max_prefix) continue;
          MlaPrefillOptions prefill_options;
          prefill_options.fuse_output_quant = path.fuse_output_quant;
          prefill_options.fold_chunks = path.fold_chunks;
          prefill_options.fp8_kv_from_projection = path.kv_from_projection;
          GpuLayerHarness h(config, path.fp8_weights ? fp8_weights : bf16_weights, batch, hidden,
                            pages, kPageSize, prefill_options, backends);
          h.set_cache(cache);
          const AttentionBackend& backend = path.fp8_backend ? *fp8 : *bf16;
          if (T == options->tokens.front() && prefix == 0) {
            std::printf("# %s: %s\n", path.name,
                        h.layer().output_quant_plan(backend, prefill_options).note.c_str());
          }
          Row r{path.name, T, prefix};
          r.attention_tflop = 2.0 * double(config.heads) * pairs * (kMlaQkDim + kMlaVDim) / 1e12;
          r.ms = timer.median_us([&](int) { h.prefill(backend); }, options->warmup) / 1e3;
          h.prefill(backend, &r.stages);
          std::printf("%-6s %7lld %7lld %10.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f\n", path.name,
                      static_cast<long long>(T), static_cast<long long>(prefix), r.ms,
                      r.stages.projections, r.stages.prep, r.stages.prefix, r.stages.attention,
                      r.stages.merge, r.stages.output);
          std::fflush(stdout);
          rows.push_back(r);
        }
      }
    }
    if (!options->json.empty()) {
      write_json(options->json, rows, device, options->settle_ms);
    }
  });
}

}  // namespace fp8mla::cli
