// `fp8mla run`: the main job. One MLA layer prefill on a ragged batch (sequences with and without
// a cached prefix), through the FP8 path and the BF16 path, against the float64 reference on the
// same inputs: a per-stage time table, throughput, and accuracy (max and mean abs error, cosine).
//
// This version runs the layer on the CPU (the tiny preset by default); the GPU layer is not in it
// yet, which the report says when a GPU is present. Weights are generated from --seed, or read
// from a safetensors file (--weights, --layer) with DeepSeek's tensor names.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "commands.hpp"
#include "fp8mla/attention_backend.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_layer.hpp"
#include "fp8mla/numerics.hpp"
#include "fp8mla/runtime_info.hpp"
#include "fp8mla/safetensors.hpp"

namespace fp8mla::cli {
namespace {

constexpr std::int64_t kPageSize = 64;

struct RunOptions {
  std::string preset = "tiny";
  std::string weights;  // safetensors file; empty: generated
  int layer = 0;
  std::string weight_format = "bf16";
  std::uint64_t seed = 1;
  std::int64_t chunk_capacity = 0;
  std::string json;
};

struct PathResult {
  std::string name;
  MlaStageTimes times;
  double total_ms = 0;
  double max_abs = 0, mean_abs = 0, cosine = 0;
};

// Accuracy of bf16 `out` against `ref`.
void score(const std::vector<std::uint16_t>& out, const std::vector<double>& ref, PathResult& r) {
  double dot = 0, nn = 0, rr = 0, sum = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double o = decode_bf16(out[i]), d = std::abs(o - ref[i]);
    dot += o * ref[i];
    nn += o * o;
    rr += ref[i] * ref[i];
    sum += d;
    r.max_abs = std::max(r.max_abs, d);
  }
  r.mean_abs = sum / double(ref.size());
  r.cosine = dot / std::sqrt(nn * rr);
}

// Progress on stderr for the steps of a run that takes more than a second.
class Progress {
 public:
  explicit Progress(int steps) : steps_(steps), start_(std::chrono::steady_clock::now()) {}
  void step(const char* what) {
    ++done_;
    if (std::chrono::steady_clock::now() - start_ > std::chrono::seconds(1) || done_ > 1) {
      std::fprintf(stderr, "\r[%-*s] %d/%d %-40s", steps_,
                   std::string(std::size_t(done_), '#').c_str(), done_, steps_, what);
      std::fflush(stderr);
    }
  }
  ~Progress() { std::fprintf(stderr, "\r%*s\r", steps_ + 60, ""); }

 private:
  int steps_, done_ = 0;
  std::chrono::steady_clock::time_point start_;
};

void run(const RunOptions& opt) {
  const MlaConfig config = mla_preset(opt.preset);
  std::optional<SafetensorsFile> file;
  MlaWeights weights;
  if (!opt.weights.empty()) {
    file.emplace(opt.weights);
    weights = load_mla_weights(*file, config, opt.layer);
  } else {
    weights = generate_mla_weights(
        config, opt.weight_format == "fp8" ? WeightFormat::kFp8Block : WeightFormat::kBf16,
        opt.seed);
  }
  // The batch: new prompts and prompts continuing a cached prefix, pages handed out in order.
  const std::vector<std::pair<std::int64_t, std::int64_t>> lens = {
      {0, 128}, {384, 64}, {768, 32}, {0, 1}};
  MlaBatch batch;
  std::int64_t next_slot = 0, prefix_total = 0;
  for (auto [prefix, extend] : lens) {
    MlaSequence s{prefix, extend, {}};
    for (std::int64_t i = 0; i < prefix + extend; ++i) s.slots.push_back(next_slot + i);
    next_slot += (prefix + extend + kPageSize - 1) / kPageSize * kPageSize;
    prefix_total += prefix;
    batch.sequences.push_back(std::move(s));
  }
  const std::int64_t T = batch.extend_tokens(), pages = next_slot / kPageSize;
  std::mt19937 rng(std::uint32_t(opt.seed));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::uint16_t> hidden(std::size_t(T * config.hidden));
  for (auto& h : hidden) h = encode_bf16(normal(rng));
  std::vector<std::uint8_t> cache(std::size_t(pages * kPageSize * kMlaLatentDim));
  for (auto& b : cache) b = encode_e4m3(normal(rng));  // the cached prefixes' latent rows
  const std::vector<std::uint8_t> cache_before = cache;
  const TensorView hidden_view(hidden.data(), DType::kBF16, {T, config.hidden});
  const TensorView cache_view(cache.data(), DType::kE4M3, {pages, kPageSize, kMlaLatentDim});

  Progress progress(4);
  progress.step("float64 reference");
  std::vector<double> ref(hidden.size());
  mla_prefill_reference(config, weights, hidden_view, batch, cache_view, 1.0f, ref.data());
  progress.step("preparing the layer");
  MlaLayer layer(config, weights);
  std::vector<PathResult> results;
  std::vector<std::vector<std::uint16_t>> outputs;
  // The FP8 path through a backend with the prepare_prefill_qkv hook, the BF16 path without.
  for (const char* backend_name : {"cpu", "cpu-bf16"}) {
    const std::unique_ptr<AttentionBackend> backend = make_attention_backend(backend_name);
    const bool fp8 = backend->capabilities().prepare_prefill_qkv;
    progress.step(fp8 ? "FP8 path" : "BF16 path");
    cache = cache_before;
    MlaPrefillOptions o;
    if (opt.chunk_capacity > 0) {  // chunked whatever the prefix length
      o.one_shot_max_prefix = 0;
      o.chunk_capacity = opt.chunk_capacity;
    }
    std::vector<std::uint16_t> out(hidden.size());
    PathResult r;
    r.name = fp8 ? "fp8" : "bf16";
    const auto start = std::chrono::steady_clock::now();
    layer.prefill(hidden_view, batch, cache_view, *backend, o,
                  TensorView(out.data(), DType::kBF16, {T, config.hidden}), {}, &r.times);
    r.total_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    score(out, ref, r);
    results.push_back(r);
    outputs.push_back(std::move(out));
  }
  PathResult between{"fp8 vs bf16"};
  std::vector<double> bf16(outputs[1].size());
  for (std::size_t i = 0; i < bf16.size(); ++i) bf16[i] = decode_bf16(outputs[1][i]);
  score(outputs[0], bf16, between);

  // Attention work: every extend query against its prefix and the extend keys up to it.
  double pairs = 0;
  for (auto [prefix, extend] : lens)
    pairs += double(extend) * double(prefix) + 0.5 * double(extend) * double(extend + 1);
  const double attention_flop = 2.0 * double(config.heads) * pairs * (kMlaQkDim + kMlaVDim);

  const CudaDevices devices = cuda_devices();
  std::printf(
      "fp8mla run: one MLA layer prefill, preset %s, %s weights, on the CPU\n", config.name.c_str(),
      opt.weights.empty() ? (opt.weight_format + " generated").c_str() : opt.weights.c_str());
  if (!devices.devices.empty()) {
    std::printf("  (a GPU is present, %s; the GPU layer is not in this version)\n",
                devices.devices[0].name.c_str());
  }
  std::printf("  batch: %zu sequences, %lld new tokens, %lld cached prefix tokens; %s\n\n",
              lens.size(), static_cast<long long>(T), static_cast<long long>(prefix_total),
              opt.chunk_capacity > 0
                  ? ("prefix chunks of " + std::to_string(opt.chunk_capacity) + " keys").c_str()
                  : "one-shot prefix attention");
  std::printf("%-14s %12s %12s\n", "stage (ms)", "FP8 path", "BF16 path");
  auto row = [&](const char* name, auto get) {
    std::printf("%-14s %12.2f %12.2f\n", name, get(results[0]), get(results[1]));
  };
  row("projections", [](const PathResult& r) { return r.times.projections; });
  row("prep", [](const PathResult& r) { return r.times.prep; });
  row("prefix keys", [](const PathResult& r) { return r.times.prefix; });
  row("attention", [](const PathResult& r) { return r.times.attention; });
  row("merge", [](const PathResult& r) { return r.times.merge; });
  row("o_proj", [](const PathResult& r) { return r.times.output; });
  row("total", [](const PathResult& r) { return r.total_ms; });
  row("tokens/s", [&](const PathResult& r) { return double(T) / (r.total_ms * 1e-3); });
  std::printf("%-14s %12.4f %12.4f\n", "attn TFLOP/s",
              attention_flop / (results[0].times.attention * 1e-3) / 1e12,
              attention_flop / (results[1].times.attention * 1e-3) / 1e12);
  std::printf("\n%-24s %12s %12s %12s\n", "accuracy", "max abs", "mean abs", "cosine");
  for (const PathResult* r : {&results[0], &results[1], &between}) {
    std::printf("%-24s %12.4g %12.4g %12.6f\n",
                (r == &between ? r->name : r->name + " vs float64").c_str(), r->max_abs,
                r->mean_abs, r->cosine);
  }

  if (!opt.json.empty()) {
    std::ofstream f(opt.json);
    if (!f)
      throw Error(ErrorCategory::kIo, concat("--json: cannot open '", opt.json, "' for writing"));
    f << "{\n  \"preset\": \"" << config.name << "\",\n  \"device\": \"cpu\",\n  \"tokens\": " << T
      << ",\n  \"prefix_tokens\": " << prefix_total
      << ",\n  \"chunk_capacity\": " << opt.chunk_capacity
      << ",\n  \"attention_tflop\": " << attention_flop / 1e12 << ",\n  \"paths\": [\n";
    for (std::size_t i = 0; i < results.size(); ++i) {
      const PathResult& r = results[i];
      f << "    {\"path\": \"" << r.name << "\", \"total_ms\": " << r.total_ms
        << ", \"projections_ms\": " << r.times.projections << ", \"prep_ms\": " << r.times.prep
        << ", \"prefix_ms\": " << r.times.prefix << ", \"attention_ms\": " << r.times.attention
        << ", \"merge_ms\": " << r.times.merge << ", \"output_ms\": " << r.times.output
        << ", \"max_abs\": " << r.max_abs << ", \"mean_abs\": " << r.mean_abs
        << ", \"cosine\": " << r.cosine << "}" << (i + 1 < results.size() ? ",\n" : "\n");
    }
    f << "  ],\n  \"fp8_vs_bf16\": {\"max_abs\": " << between.max_abs
      << ", \"mean_abs\": " << between.mean_abs << ", \"cosine\": " << between.cosine << "}\n}\n";
  }
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto opt = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand(
      "run", "One MLA layer prefill: FP8 path vs BF16 path vs a float64 reference");
  cmd->add_option("--preset", opt->preset, "deepseek-v2-lite, deepseek-v2, deepseek-v3 or tiny")
      ->capture_default_str();
  cmd->add_option("--weights", opt->weights, "safetensors file with DeepSeek's tensor names");
  cmd->add_option("--layer", opt->layer, "layer index in --weights")->check(CLI::NonNegativeNumber);
  cmd->add_option("--weight-format", opt->weight_format,
                  "generated weights: bf16 or fp8 (128x128 blocks)")
      ->check(CLI::IsMember({"bf16", "fp8"}))
      ->capture_default_str();
  cmd->add_option("--seed", opt->seed, "seed of the generated weights and inputs");
  cmd->add_option("--chunk-capacity", opt->chunk_capacity,
                  "attend the prefixes in chunks of this many keys (0: the layer's default, "
                  "one-shot up to 8192 prefix keys)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--json", opt->json, "write the report as JSON to this file");
  cmd->callback([opt] { run(*opt); });
}

}  // namespace fp8mla::cli
