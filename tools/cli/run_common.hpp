// What `fp8mla run` (run_command.cpp) and its tensor- and context-parallel driver
// (parallel_run.cpp) share: the options, the report, the batch inputs and the scoring.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fp8mla/mla_layer.hpp"

namespace fp8mla::cli {

constexpr std::int64_t kPageSize = 64;

struct RunOptions {
  std::string device = "auto";  // auto, cpu or cuda
  std::string preset;           // empty: deepseek-v3 on the GPU, tiny on the CPU
  std::string weights;          // safetensors file; empty: generated
  std::string model;            // Hugging Face model directory: config and weights
  int layer = 0;
  std::string weight_format;  // empty: fp8 on the GPU, bf16 on the CPU
  std::uint64_t seed = 1;
  std::int64_t chunk_capacity = 0;
  bool calibrate = false;
  float headroom = kMlaCalibrationHeadroom;
  std::string json;
  int tp = 1;  // tensor-parallel ranks (over heads)
  int cp = 1;  // context-parallel ranks (over tokens)
};

struct PathResult {
  std::string name;
  MlaStageTimes times;
  double total_ms = 0;
  double max_abs = 0, mean_abs = 0, cosine = 0;
};

struct Report {
  std::string device, preset, weights;
  std::vector<std::string> notes;  // how each projection runs, and o_proj's input
  std::string accuracy_batch, timing_batch;
  std::vector<PathResult> paths;  // FP8 path, BF16 path
  PathResult between{"fp8 vs bf16"};
  std::optional<MlaCalibration> calibration;  // --calibrate
  PathResult calibrated{"fp8 calibrated"};    // the FP8 path with the calibrated scales
  std::int64_t timing_tokens = 0;
  double attention_flop = 0;  // of the timing batch
  int tp = 1, cp = 1;
  // --tp / --cp: the one-rank layer's outputs against float64, and the assembled outputs
  // against them (FP8 path, BF16 path each).
  std::vector<PathResult> one_rank, vs_one_rank;
};

using Lens = std::vector<std::pair<std::int64_t, std::int64_t>>;  // (prefix, extend) per sequence

// A batch's inputs on the host: pages handed out in order, random hidden states and cached latent
// rows (the prefixes' cache contents).
struct BatchInputs {
  Lens lens;
  MlaBatch batch;
  std::vector<std::uint16_t> hidden;
  std::vector<std::uint8_t> cache;
  std::int64_t tokens = 0, prefix_tokens = 0, pages = 0;
  double attention_flop = 0;  // every extend query against its prefix and the keys up to it
};

BatchInputs make_inputs(const MlaConfig& config, const Lens& lens, std::uint64_t seed);
std::string describe(const BatchInputs& in, std::int64_t chunk_capacity);
MlaPrefillOptions prefill_options(const RunOptions& opt);
// Accuracy of bf16 `out` against `ref`.
void score(const std::vector<std::uint16_t>& out, const std::vector<double>& ref, PathResult& r);
// Scores the two paths' outputs against the reference and against each other.
void score_paths(const std::vector<std::vector<std::uint16_t>>& outputs,
                 const std::vector<double>& ref, Report& r);
// The float64 reference of the batch with its cached prefix rows read at `cache_scale_inv`.
std::vector<double> reference(const MlaConfig& config, const MlaWeights& weights,
                              const BatchInputs& in, float cache_scale_inv);

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

}  // namespace fp8mla::cli
