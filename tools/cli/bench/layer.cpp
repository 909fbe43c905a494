// `fp8mla bench layer`: one DeepSeek-V3 MLA layer prefill on cuda:0, a single sequence of T new
// tokens (2k, 8k, 32k) with no prefix or a cached prefix of T tokens (one-shot up to 8192 prefix
// keys, chunks of 8192 above), through
//   fp8:  FP8 block-scaled weights, the "fp8-hopper" backend (the FP8 path);
//   bf16: the same weights, the "bf16-hopper" backend (the BF16 path);
//   bf16w: bf16 weights, "bf16-hopper" (the BF16 path of a BF16 checkpoint).
// Time: CUDA events around prefill (metadata upload included), warm-up, median; then one run
// with the per-stage events. bench/layer.py times an eager PyTorch BF16 layer on the same shapes.
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
#include "fp8mla/numerics.hpp"
#include "gpu_layer.hpp"

namespace fp8mla::cli {
namespace {

constexpr std::int64_t kPageSize = 64;

struct Row {
  std::string path;
  std::int64_t tokens = 0, prefix = 0;
  double ms = 0;
  MlaStageTimes stages;
  double attention_tflop = 0;
};

void write_json(const std::string& path, const std::vector<Row>& rows, const std::string& device) {
  JsonFields header;
  header.add("bench", json_string("layer"))
      .add("device", json_string(device))
      .add("preset", json_string("deepseek-v3"));
  std::vector<std::string> objects;
  for (const Row& r : rows) {
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
                          .object());
  }
  write_json_document(path, header, "rows", objects);
}

}  // namespace

void add_bench_layer_command(CLI::App& bench) {
  struct Options {
    std::vector<std::int64_t> tokens = {2048, 8192, 32768};
    int warmup = 2;
    int iters = 5;
    std::string json;
  };
  auto options = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand(
      "layer", "DeepSeek-V3 MLA layer prefill: FP8 path vs BF16 path, with and without prefix");
  cmd->add_option("--tokens", options->tokens, "New tokens of the sequence")->capture_default_str();
  cmd->add_option("--warmup", options->warmup, "Untimed runs")->check(CLI::Range(0, 100));
  cmd->add_option("--iters", options->iters, "Timed runs")->check(CLI::Range(1, 1000));
  cmd->add_option("--json", options->json, "Write the results as JSON to this file");
  cmd->callback([options] {
    const MlaConfig config = mla_preset("deepseek-v3");
    const MlaWeights fp8_weights = generate_mla_weights(config, WeightFormat::kFp8Block, 1);
    const MlaWeights bf16_weights = generate_mla_weights(config, WeightFormat::kBf16, 1);
    const std::unique_ptr<AttentionBackend> fp8 = make_attention_backend("fp8-hopper");
    const std::unique_ptr<AttentionBackend> bf16 = make_attention_backend("bf16-hopper");
    const std::vector<const AttentionBackend*> backends = {fp8.get(), bf16.get()};
    const std::string device = cuda::current_device_props().name;
    std::printf("fp8mla bench layer: deepseek-v3 on %s\n", device.c_str());
    std::printf("%-6s %7s %7s %10s %8s %8s %8s %8s %8s %8s\n", "path", "tokens", "prefix", "ms",
                "proj", "prep", "prefix", "attn", "merge", "o_proj");
    std::vector<Row> rows;
    EventTimer timer(options->iters);
    for (std::int64_t T : options->tokens) {
      for (std::int64_t prefix : {std::int64_t(0), T}) {
        MlaBatch batch;
        MlaSequence s{prefix, T, {}};
        for (std::int64_t i = 0; i < prefix + T; ++i) s.slots.push_back(i);
        batch.sequences.push_back(std::move(s));
        const std::int64_t pages = (prefix + T + kPageSize - 1) / kPageSize;
        std::mt19937 rng{7};
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<std::uint16_t> hidden(std::size_t(T * config.hidden));
        for (auto& h : hidden) h = encode_bf16(normal(rng));
        std::vector<std::uint8_t> cache(std::size_t(pages * kPageSize * kMlaLatentDim));
        for (auto& b : cache) b = encode_e4m3(normal(rng));
        const double pairs = double(T) * double(prefix) + 0.5 * double(T) * double(T + 1);
        for (const char* path : {"fp8", "bf16", "bf16w"}) {
          const bool bf16w = std::string(path) == "bf16w";
          GpuLayerHarness h(config, bf16w ? bf16_weights : fp8_weights, batch, hidden, pages,
                            kPageSize, {}, backends);
          h.set_cache(cache);
          const AttentionBackend& backend = std::string(path) == "fp8" ? *fp8 : *bf16;
          Row r{path, T, prefix};
          r.attention_tflop = 2.0 * double(config.heads) * pairs * (kMlaQkDim + kMlaVDim) / 1e12;
          r.ms = timer.median_us([&](int) { h.prefill(backend); }, options->warmup) / 1e3;
          h.prefill(backend, &r.stages);
          std::printf("%-6s %7lld %7lld %10.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f\n", path,
                      static_cast<long long>(T), static_cast<long long>(prefix), r.ms,
                      r.stages.projections, r.stages.prep, r.stages.prefix, r.stages.attention,
                      r.stages.merge, r.stages.output);
          std::fflush(stdout);
          rows.push_back(r);
        }
      }
    }
    if (!options->json.empty()) write_json(options->json, rows, device);
  });
}

}  // namespace fp8mla::cli
