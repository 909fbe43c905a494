// `fp8mla run`: the main job. One MLA layer prefill on a ragged batch (sequences with and without
// a cached prefix), through the FP8 path and the BF16 path, against the float64 reference on the
// same inputs: a per-stage time table, throughput, and accuracy (max and mean abs error, cosine).
//
// On a GPU (the default when one is present) the layer runs on cuda:0 with the DeepSeek-V3 preset
// and FP8 block-scaled weights: accuracy on a small batch (the float64 reference of a V3 layer is
// slow on the host), time on a batch of about 7k new tokens after 10k cached ones. On the CPU the
// tiny preset runs one batch for both. Weights are generated from --seed, or read from a
// safetensors file (--weights, --layer) with DeepSeek's tensor names, or config and weights both
// come from a Hugging Face model directory (--model, --layer). With --calibrate the layer's static
// scales are calibrated on the accuracy batch first (MlaLayer::calibrate), reported, and the FP8
// path's accuracy with them is shown next to the unit scales'; the timed runs then use them.
// --tp N --cp M run the layer on N x M ranks driven by this process (parallel_run.hpp).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
#include "fp8mla/hf_model.hpp"
#include "fp8mla/mla_layer.hpp"
#include "fp8mla/numerics.hpp"
#include "fp8mla/runtime_info.hpp"
#include "fp8mla/safetensors.hpp"
#include "parallel_run.hpp"
#include "run_common.hpp"
#if defined(FP8MLA_WITH_CUDA)
#include "gpu_layer.hpp"
#endif

namespace fp8mla::cli {

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

BatchInputs make_inputs(const MlaConfig& config, const Lens& lens, std::uint64_t seed) {
  BatchInputs in;
  in.lens = lens;
  std::int64_t next_slot = 0;
  double pairs = 0;
  for (auto [prefix, extend] : lens) {
    MlaSequence s{prefix, extend, {}};
    for (std::int64_t i = 0; i < prefix + extend; ++i) s.slots.push_back(next_slot + i);
    next_slot += (prefix + extend + kPageSize - 1) / kPageSize * kPageSize;
    in.prefix_tokens += prefix;
    pairs += double(extend) * double(prefix) + 0.5 * double(extend) * double(extend + 1);
    in.batch.sequences.push_back(std::move(s));
  }
  in.attention_flop = 2.0 * double(config.heads) * pairs * (kMlaQkDim + kMlaVDim);
  in.tokens = in.batch.extend_tokens();
  in.pages = std::max<std::int64_t>(next_slot / kPageSize, 1);
  std::mt19937 rng{std::uint32_t(seed)};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  in.hidden.resize(std::size_t(in.tokens * config.hidden));
  for (auto& h : in.hidden) h = encode_bf16(normal(rng));
  in.cache.resize(std::size_t(in.pages * kPageSize * kMlaLatentDim));
  for (auto& b : in.cache) b = encode_e4m3(normal(rng));
  return in;
}

std::string describe(const BatchInputs& in, std::int64_t chunk_capacity) {
  return concat(in.lens.size(), " sequences, ", in.tokens, " new tokens, ", in.prefix_tokens,
                " cached prefix tokens; ",
                chunk_capacity > 0 ? concat("prefix chunks of ", chunk_capacity, " keys")
                : in.prefix_tokens > MlaPrefillOptions{}.one_shot_max_prefix
                    ? concat("prefix chunks of ", MlaPrefillOptions{}.chunk_capacity, " keys")
                    : std::string("one-shot prefix attention"));
}

MlaPrefillOptions prefill_options(const RunOptions& opt) {
  MlaPrefillOptions o;
  if (opt.chunk_capacity > 0) {  // chunked whatever the prefix length
    o.one_shot_max_prefix = 0;
    o.chunk_capacity = opt.chunk_capacity;
  }
  return o;
}

// The float64 reference of the batch with its cached prefix rows read at `cache_scale_inv`.
std::vector<double> reference(const MlaConfig& config, const MlaWeights& weights,
                              const BatchInputs& in, float cache_scale_inv) {
  std::vector<double> ref(in.hidden.size());
  mla_prefill_reference(config, weights,
                        TensorView(const_cast<std::uint16_t*>(in.hidden.data()), DType::kBF16,
                                   {in.tokens, config.hidden}),
                        in.batch,
                        TensorView(const_cast<std::uint8_t*>(in.cache.data()), DType::kE4M3,
                                   {in.pages, kPageSize, kMlaLatentDim}),
                        cache_scale_inv, ref.data());
  return ref;
}

// Scores the two paths' outputs against the reference and against each other.
void score_paths(const std::vector<std::vector<std::uint16_t>>& outputs,
                 const std::vector<double>& ref, Report& r) {
  for (std::size_t i = 0; i < 2; ++i) score(outputs[i], ref, r.paths[i]);
  std::vector<double> bf16(outputs[1].size());
  for (std::size_t i = 0; i < bf16.size(); ++i) bf16[i] = decode_bf16(outputs[1][i]);
  score(outputs[0], bf16, r.between);
}

namespace {

constexpr std::int64_t kPageSize = 64;

void print(const Report& r) {
  std::printf("fp8mla run: one MLA layer prefill, preset %s, %s weights, on %s\n", r.preset.c_str(),
              r.weights.c_str(), r.device.c_str());
  const bool parallel = r.tp * r.cp > 1;
  if (parallel) {
    std::printf("  tensor parallel %d x context parallel %d, one process, %d ranks on threads\n",
                r.tp, r.cp, r.tp * r.cp);
  }
  for (const std::string& n : r.notes) std::printf("  %s\n", n.c_str());
  if (r.accuracy_batch == r.timing_batch) {
    std::printf("  batch: %s\n\n", r.timing_batch.c_str());
  } else {
    std::printf("  timed batch: %s\n  accuracy batch: %s\n\n", r.timing_batch.c_str(),
                r.accuracy_batch.c_str());
  }
  std::printf("%-14s %12s %12s\n", "stage (ms)", "FP8 path", "BF16 path");
  auto row = [&](const char* name, auto get) {
    std::printf("%-14s %12.3f %12.3f\n", name, get(r.paths[0]), get(r.paths[1]));
  };
  row("projections", [](const PathResult& p) { return p.times.projections; });
  row("prep", [](const PathResult& p) { return p.times.prep; });
  row("prefix keys", [](const PathResult& p) { return p.times.prefix; });
  row("attention", [](const PathResult& p) { return p.times.attention; });
  row("merge", [](const PathResult& p) { return p.times.merge; });
  if (parallel) row("gather", [](const PathResult& p) { return p.times.gather; });
  row("o_proj", [](const PathResult& p) { return p.times.output; });
  if (parallel) row("reduce", [](const PathResult& p) { return p.times.reduce; });
  row("total", [](const PathResult& p) { return p.total_ms; });
  std::printf("%-14s %12.0f %12.0f\n", "tokens/s",
              double(r.timing_tokens) / (r.paths[0].total_ms * 1e-3),
              double(r.timing_tokens) / (r.paths[1].total_ms * 1e-3));
  std::printf("%-14s %12.4g %12.4g\n", "attn TFLOP/s",
              r.attention_flop / (r.paths[0].times.attention * 1e-3) / 1e12,
              r.attention_flop / (r.paths[1].times.attention * 1e-3) / 1e12);
  std::printf("\n%-24s %12s %12s %12s\n", "accuracy", "max abs", "mean abs", "cosine");
  std::vector<const PathResult*> rows = {&r.paths[0], &r.paths[1], &r.between};
  if (r.calibration) rows.insert(rows.begin() + 1, &r.calibrated);
  for (const PathResult& p : r.one_rank) rows.push_back(&p);
  for (const PathResult* p : rows) {
    std::printf("%-24s %12.4g %12.4g %12.6f\n",
                (p == &r.between ? p->name : p->name + " vs float64").c_str(), p->max_abs,
                p->mean_abs, p->cosine);
  }
  for (const PathResult& p : r.vs_one_rank) {
    std::printf("%-24s %12.4g %12.4g %12.6f\n", p.name.c_str(), p.max_abs, p.mean_abs, p.cosine);
  }
  if (parallel) std::printf("\nstage times: the slowest rank's (per stage, and its total)\n");
  if (!r.calibration) return;
  const MlaCalibration& c = *r.calibration;
  std::printf("\ncalibration on the accuracy batch (headroom %g): fp8 and fp8 calibrated above\n",
              c.headroom);
  std::printf("%-24s %12s %12s %12s %12s\n", "", "Q", "K", "V", "cache");
  std::printf("%-24s %12.4g %12.4g %12.4g %12.4g\n", "amax", c.amax.q, c.amax.k, c.amax.v,
              c.amax.cache);
  std::printf("%-24s %12.4g %12.4g %12.4g %12.4g\n", "scale_inv (unit: 1)", c.fp8.q_scale_inv,
              c.fp8.k_scale_inv, c.fp8.v_scale_inv, c.cache_scale_inv);
}

void write_json(const Report& r, const std::string& path) {
  std::ofstream f(path);
  if (!f) throw Error(ErrorCategory::kIo, concat("--json: cannot open '", path, "' for writing"));
  f << "{\n  \"preset\": \"" << r.preset << "\",\n  \"device\": \"" << r.device
    << "\",\n  \"weights\": \"" << r.weights << "\",\n  \"timing_batch\": \"" << r.timing_batch
    << "\",\n  \"accuracy_batch\": \"" << r.accuracy_batch
    << "\",\n  \"tokens\": " << r.timing_tokens
    << ",\n  \"attention_tflop\": " << r.attention_flop / 1e12 << ",\n  \"tp\": " << r.tp
    << ",\n  \"cp\": " << r.cp << ",\n  \"paths\": [\n";
  for (std::size_t i = 0; i < r.paths.size(); ++i) {
    const PathResult& p = r.paths[i];
    f << "    {\"path\": \"" << p.name << "\", \"total_ms\": " << p.total_ms
      << ", \"projections_ms\": " << p.times.projections << ", \"prep_ms\": " << p.times.prep
      << ", \"prefix_ms\": " << p.times.prefix << ", \"attention_ms\": " << p.times.attention
      << ", \"merge_ms\": " << p.times.merge << ", \"output_ms\": " << p.times.output
      << ", \"gather_ms\": " << p.times.gather << ", \"reduce_ms\": " << p.times.reduce
      << ", \"max_abs\": " << p.max_abs << ", \"mean_abs\": " << p.mean_abs
      << ", \"cosine\": " << p.cosine << "}" << (i + 1 < r.paths.size() ? ",\n" : "\n");
  }
  f << "  ],\n  \"fp8_vs_bf16\": {\"max_abs\": " << r.between.max_abs
    << ", \"mean_abs\": " << r.between.mean_abs << ", \"cosine\": " << r.between.cosine << "}";
  for (std::size_t i = 0; i < r.vs_one_rank.size(); ++i) {
    const PathResult &o = r.one_rank[i], &v = r.vs_one_rank[i];
    f << ",\n  \"" << r.paths[i].name << "_one_rank\": {\"max_abs\": " << o.max_abs
      << ", \"mean_abs\": " << o.mean_abs << ", \"cosine\": " << o.cosine << "},\n  \""
      << r.paths[i].name << "_vs_one_rank\": {\"max_abs\": " << v.max_abs
      << ", \"mean_abs\": " << v.mean_abs << ", \"cosine\": " << v.cosine << "}";
  }
  if (r.calibration) {
    const MlaCalibration& c = *r.calibration;
    f << ",\n  \"calibration\": {\"headroom\": " << c.headroom << ", \"amax\": {\"q\": " << c.amax.q
      << ", \"k\": " << c.amax.k << ", \"v\": " << c.amax.v << ", \"cache\": " << c.amax.cache
      << "}, \"scale_inv\": {\"q\": " << c.fp8.q_scale_inv << ", \"k\": " << c.fp8.k_scale_inv
      << ", \"v\": " << c.fp8.v_scale_inv << ", \"cache\": " << c.cache_scale_inv
      << "}, \"fp8_calibrated\": {\"max_abs\": " << r.calibrated.max_abs
      << ", \"mean_abs\": " << r.calibrated.mean_abs << ", \"cosine\": " << r.calibrated.cosine
      << "}}";
  }
  f << "\n}\n";
}

// --calibrate: the prefill options with the calibrated scales. The FP8 path's output with them
// is scored against a reference at the calibrated cache scale: the batch's cached prefix bytes
// stand for other values at another scale.
MlaPrefillOptions calibrated_options(const RunOptions& opt, const MlaCalibration& c) {
  MlaPrefillOptions o = prefill_options(opt);
  c.apply_to(o);
  return o;
}
void score_calibrated(const MlaConfig& config, const MlaWeights& weights, const BatchInputs& in,
                      const std::vector<std::uint16_t>& out, Report& r) {
  score(out, reference(config, weights, in, r.calibration->cache_scale_inv), r.calibrated);
}

// The FP8 path through a backend with the prepare_prefill_qkv hook, the BF16 path without.
void run_on_cpu(const MlaConfig& config, const MlaWeights& weights, const RunOptions& opt,
                Report& r) {
  const BatchInputs in = make_inputs(config, {{0, 128}, {384, 64}, {768, 32}, {0, 1}}, opt.seed);
  r.device = "the CPU";
  r.accuracy_batch = r.timing_batch = describe(in, opt.chunk_capacity);
  r.timing_tokens = in.tokens;
  r.attention_flop = in.attention_flop;
  Progress progress(opt.calibrate ? 5 : 4);
  progress.step("float64 reference");
  std::vector<double> ref(in.hidden.size());
  const TensorView hidden(const_cast<std::uint16_t*>(in.hidden.data()), DType::kBF16,
                          {in.tokens, config.hidden});
  std::vector<std::uint8_t> cache = in.cache;
  const TensorView cache_view(cache.data(), DType::kE4M3, {in.pages, kPageSize, kMlaLatentDim});
  mla_prefill_reference(config, weights, hidden, in.batch, cache_view, 1.0f, ref.data());
  progress.step("preparing the layer");
  MlaLayer layer(config, weights);
  r.notes = layer.projection_notes();
  r.notes.push_back(
      "FP8 path, " +
      layer.output_quant_plan(*make_attention_backend("cpu"), prefill_options(opt)).note);
  std::vector<std::vector<std::uint16_t>> outputs;
  for (const char* name : {"cpu", "cpu-bf16"}) {
    const std::unique_ptr<AttentionBackend> backend = make_attention_backend(name);
    const bool fp8 = backend->capabilities().prepare_prefill_qkv;
    progress.step(fp8 ? "FP8 path" : "BF16 path");
    cache = in.cache;
    std::vector<std::uint16_t> out(in.hidden.size());
    PathResult p;
    p.name = fp8 ? "fp8" : "bf16";
    const auto start = std::chrono::steady_clock::now();
    layer.prefill(hidden, in.batch, cache_view, *backend, prefill_options(opt),
                  TensorView(out.data(), DType::kBF16, {in.tokens, config.hidden}), {}, &p.times);
    p.total_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    r.paths.push_back(p);
    outputs.push_back(std::move(out));
  }
  score_paths(outputs, ref, r);
  if (!opt.calibrate) return;
  progress.step("calibration, FP8 path with its scales");
  r.calibration = layer.calibrate(hidden, in.batch, {opt.headroom});
  cache = in.cache;
  std::vector<std::uint16_t> out(in.hidden.size());
  layer.prefill(hidden, in.batch, cache_view, *make_attention_backend("cpu"),
                calibrated_options(opt, *r.calibration),
                TensorView(out.data(), DType::kBF16, {in.tokens, config.hidden}));
  score_calibrated(config, weights, in, out, r);
}

#if defined(FP8MLA_WITH_CUDA)
// Accuracy on a small batch against the float64 reference; time (CUDA events per stage, the run
// with the median total of five after a warm-up) on a large one.
void run_on_gpu(const MlaConfig& config, const MlaWeights& weights, const RunOptions& opt,
                Report& r) {
  const std::unique_ptr<AttentionBackend> fp8 = make_attention_backend("fp8-hopper");
  const std::unique_ptr<AttentionBackend> bf16 = make_attention_backend("bf16-hopper");
  const std::vector<const AttentionBackend*> backends = {fp8.get(), bf16.get()};
  const MlaPrefillOptions options = prefill_options(opt);
  r.device = concat("cuda:0 (", cuda_devices().devices[0].name, ")");
  Progress progress(opt.calibrate ? 7 : 6);

  progress.step("accuracy batch: float64 reference");
  const BatchInputs small = make_inputs(config, {{0, 96}, {512, 32}, {100, 17}, {0, 1}}, opt.seed);
  r.accuracy_batch = describe(small, opt.chunk_capacity);
  std::vector<double> ref(small.hidden.size());
  std::vector<std::uint8_t> cache = small.cache;
  mla_prefill_reference(
      config, weights,
      TensorView(const_cast<std::uint16_t*>(small.hidden.data()), DType::kBF16,
                 {small.tokens, config.hidden}),
      small.batch, TensorView(cache.data(), DType::kE4M3, {small.pages, kPageSize, kMlaLatentDim}),
      1.0f, ref.data());
  std::vector<std::vector<std::uint16_t>> outputs;
  {
    progress.step("accuracy batch: both paths");
    GpuLayerHarness h(config, weights, small.batch, small.hidden, small.pages, kPageSize, options,
                      backends);
    r.notes = h.layer().projection_notes();
    r.notes.push_back("FP8 path, " + h.layer().output_quant_plan(*fp8, options).note);
    for (const AttentionBackend* b : backends) {
      h.set_cache(small.cache);
      h.prefill(*b);
      outputs.push_back(h.out());
    }
    if (opt.calibrate) {
      progress.step("accuracy batch: calibration, FP8 path with its scales");
      r.calibration = h.calibrate({opt.headroom});
      h.set_options(calibrated_options(opt, *r.calibration));
      h.set_cache(small.cache);
      h.prefill(*fp8);
      outputs.push_back(h.out());
    }
  }
  r.paths = {PathResult{"fp8"}, PathResult{"bf16"}};
  score_paths(outputs, ref, r);
  if (opt.calibrate) score_calibrated(config, weights, small, outputs[2], r);

  const BatchInputs large =
      make_inputs(config, {{0, 4096}, {8192, 2048}, {2048, 1024}, {0, 1}}, opt.seed + 1);
  r.timing_batch = describe(large, opt.chunk_capacity);
  r.timing_tokens = large.tokens;
  r.attention_flop = large.attention_flop;
  GpuLayerHarness h(config, weights, large.batch, large.hidden, large.pages, kPageSize,
                    r.calibration ? calibrated_options(opt, *r.calibration) : options, backends);
  h.set_cache(large.cache);
  for (std::size_t i = 0; i < backends.size(); ++i) {
    progress.step(i == 0 ? "timing the FP8 path" : "timing the BF16 path");
    h.prefill(*backends[i]);  // warm-up
    std::vector<MlaStageTimes> runs(5);
    for (MlaStageTimes& t : runs) h.prefill(*backends[i], &t);
    std::sort(runs.begin(), runs.end(),
              [](const MlaStageTimes& a, const MlaStageTimes& b) { return a.total() < b.total(); });
    r.paths[i].times = runs[runs.size() / 2];
    r.paths[i].total_ms = r.paths[i].times.total();
  }
}
#endif

// The layer's config and weights: a model directory's, or a preset's with weights from a file or
// generated. The files stay open (mapped) while the layer runs on views into them.
struct LayerSource {
  std::optional<SafetensorsModel> model;
  std::optional<SafetensorsFile> file;
  MlaConfig config;
  MlaWeights weights;

  LayerSource(const RunOptions& opt, bool gpu, Report& r) {
    if (!opt.model.empty()) {
      if (!opt.weights.empty() || !opt.preset.empty()) {
        throw Error(ErrorCategory::kInvalidArgument,
                    "--model takes the config and the weights from the model directory; it "
                    "cannot be combined with --weights or --preset");
      }
      model.emplace(opt.model);
      config = model->config();
      weights = load_mla_weights(*model, opt.layer);
      r.preset = concat(config.name, " (", opt.model, ")");
      r.weights =
          concat(weights.format == WeightFormat::kBf16 ? "bf16" : "fp8", " layer ", opt.layer);
      return;
    }
    config = mla_preset(!opt.preset.empty() ? opt.preset : gpu ? "deepseek-v3" : "tiny");
    r.preset = config.name;
    if (!opt.weights.empty()) {
      file.emplace(opt.weights);
      weights = load_mla_weights(*file, config, opt.layer);
      r.weights = concat(opt.weights, " layer ", opt.layer);
      return;
    }
    const std::string format = !opt.weight_format.empty() ? opt.weight_format
                               : gpu                      ? "fp8"
                                                          : "bf16";
    weights = generate_mla_weights(
        config, format == "fp8" ? WeightFormat::kFp8Block : WeightFormat::kBf16, opt.seed);
    r.weights = format + " generated";
  }
};

void run(const RunOptions& opt) {
  const bool gpu_present = !cuda_devices().devices.empty();
#if defined(FP8MLA_WITH_CUDA)
  const bool gpu = opt.device == "cuda" || (opt.device == "auto" && gpu_present);
#else
  const bool gpu = false;
  if (opt.device == "cuda") {
    throw Error(ErrorCategory::kUnsupported, "--device cuda: this build has no CUDA");
  }
#endif
  const bool parallel = opt.tp * opt.cp > 1;  // --tp 1 --cp 1: the one-rank run
  if (parallel) check_parallel_devices(opt, gpu);
  if (gpu && !gpu_present) {
    throw Error(ErrorCategory::kUnsupported, concat("--device cuda: no usable CUDA device (",
                                                    cuda_devices().unavailable_reason, ")"));
  }
  Report r;
  const LayerSource source(opt, gpu, r);
  const MlaConfig& config = source.config;
  const MlaWeights& weights = source.weights;
  if (parallel) {
    check_parallel_run(opt, config, weights.format);
#if defined(FP8MLA_WITH_CUDA)
    if (gpu) {
      run_parallel_on_gpu(config, weights, opt, r);
    } else {
      run_parallel_on_cpu(config, weights, opt, r);
    }
#else
    run_parallel_on_cpu(config, weights, opt, r);
#endif
  } else {
#if defined(FP8MLA_WITH_CUDA)
    if (gpu) {
      run_on_gpu(config, weights, opt, r);
    } else {
      run_on_cpu(config, weights, opt, r);
    }
#else
    run_on_cpu(config, weights, opt, r);
#endif
  }
  print(r);
  if (!opt.json.empty()) write_json(r, opt.json);
}

// A finite number at least `low`, with a message that says so (CLI11's Range prints the type's
// maximum as its upper bound).
CLI::Validator at_least(double low, const char* what) {
  return CLI::Validator(
      [low, what](std::string& value) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(value.c_str(), &end);
        if (end == value.c_str() || *end != '\0' || !std::isfinite(v) || v < low) {
          return concat("expected ", what, ", got '", value, "'");
        }
        return "";
      },
      what);
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto opt = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand(
      "run", "One MLA layer prefill: FP8 path vs BF16 path vs a float64 reference");
  cmd->add_option("--device", opt->device, "auto (the GPU when present), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--preset", opt->preset,
                  "deepseek-v2-lite, deepseek-v2, deepseek-v3 or tiny (default: deepseek-v3 on the "
                  "GPU, tiny on the CPU)");
  cmd->add_option("--weights", opt->weights, "safetensors file with DeepSeek's tensor names");
  cmd->add_option("--model", opt->model,
                  "Hugging Face model directory (config.json and its safetensors, sharded or "
                  "not) of a DeepSeek-V2/V3 or Kimi-K2 model; instead of --preset and --weights");
  CLI::Option* layer =
      cmd->add_option("--layer", opt->layer, "layer index in --weights or --model (default 0)")
          ->check(at_least(0, "a layer index >= 0"));
  cmd->add_option("--weight-format", opt->weight_format,
                  "generated weights: bf16 or fp8 (128x128 blocks; default fp8 on the GPU, "
                  "bf16 on the CPU)")
      ->check(CLI::IsMember({"bf16", "fp8"}));
  cmd->add_option("--seed", opt->seed, "seed of the generated weights and inputs")
      ->check(at_least(0, "a seed >= 0"));
  cmd->add_option("--chunk-capacity", opt->chunk_capacity,
                  "attend the prefixes in chunks of this many keys (0: the layer's default, "
                  "one-shot up to 8192 prefix keys)")
      ->check(at_least(0, "a key count >= 0"));
  cmd->add_flag("--calibrate", opt->calibrate,
                "calibrate the static FP8 scales (Q, K, V, cache) on the accuracy batch, report "
                "them and the FP8 path's accuracy with them; the timed runs use them");
  cmd->add_option("--headroom", opt->headroom,
                  "--calibrate: the sample's amax maps to 448 / headroom (>= 1)")
      ->check(at_least(1, "a headroom >= 1"))
      ->capture_default_str();
  cmd->add_option("--json", opt->json, "write the report as JSON to this file");
  cmd->add_option("--tp", opt->tp,
                  "tensor-parallel ranks over the heads: 1, 2, 4 or 8, dividing the heads (FP8 "
                  "weights: an even number of heads per rank)")
      ->check(CLI::IsMember({1, 2, 4, 8}))
      ->capture_default_str();
  cmd->add_option("--cp", opt->cp,
                  "context-parallel ranks over the new tokens (1 to 8). With --tp, N x M ranks, "
                  "all driven by this one process on threads (no launcher; on the GPU one device "
                  "each, N x M devices), so the assembled output is compared with the one-rank "
                  "layer and the float64 reference in the same run")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  cmd->callback([opt, layer] {
    if (layer->count() > 0 && opt->weights.empty() && opt->model.empty()) {
      throw Error(ErrorCategory::kInvalidArgument,
                  "fp8mla run: --layer picks a layer of --weights or --model; give one of them");
    }
    run(*opt);
  });
}

}  // namespace fp8mla::cli
