// `fp8mla bench projection`: DeepSeek-V3's kv_b_proj (H = 128 heads, 512 -> H x 256, FP8 block-
// scaled weights) at T tokens, the two ways the layer's FP8 path runs it:
//   bf16: cuBLASLt's block-scaled GEMM writing bf16 [T, H x 256] (K-nope and V then quantized
//         to e4m3 by the backend's hook, not timed here);
//   e4m3: fp8mla's e4m3-output GEMM on each half (fp8_kv_from_projection): K-nope token-major
//         [T, H x 128] and V transposed [H x 128, pitch], which attention reads as they are.
// Random e4m3 inputs and weights (fp8mla's own quantization of random bf16 values) and random
// block scales; each row its own timed run (warm-up and settle first, median of --iters); the
// e4m3 row also checks that its V, run token-major, holds the transposed output's bytes.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/device.hpp"
#include "bench/harness.hpp"
#include "commands.hpp"
#include "cuda/model/cublas_linear.hpp"
#include "cuda/model/fp8_block_gemm.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_prep.hpp"

namespace fp8mla::cli {
namespace {

constexpr std::int64_t kHeads = 128, kIn = 512, kHalf = kHeads * 128;

struct Options {
  std::vector<std::int64_t> tokens = {2048, 8192, 32768};
  int warmup = 5;
  int iters = 20;
  double settle_ms = 200;
  std::string json;
};

// The GEMMs' operands for T tokens (a multiple of 4: one scale pitch for both GEMMs): x e4m3
// [T, 512] with column-major group scales, the weight e4m3 [H x 256, 512] grouped by half (K-nope
// rows, then V rows) with its block scales, and the outputs.
struct Operands {
  std::int64_t tokens, scale_pitch, v_pitch;
  DeviceBuffer x, x_scales, weight, weight_scales, y_bf16, k_nope, v, v_check, workspace;

  Operands(const RandomBf16Pool& pool, std::int64_t T)
      : tokens(T),
        scale_pitch(T),
        v_pitch(transposed_v_pitch(T)),
        x(T * kIn),
        x_scales(scale_pitch * (kIn / 128) * 4),
        weight(2 * kHalf * kIn),
        weight_scales(2 * kHalf / 128 * cuda::model::linear_scale_columns(kIn) * 4),
        y_bf16(T * 2 * kHalf * 2),
        k_nope(T * kHalf),
        v(kHalf * v_pitch),
        v_check(T * kHalf),
        workspace(std::int64_t(cuda::model::kLinearWorkspaceBytes)) {
    fill_random_e4m3(pool, x.data(), T * kIn, 1.0f, 1, 7);
    fill_random_e4m3(pool, weight.data(), 2 * kHalf * kIn, 1.0f, 2, 7);
    // Scales near 1/64 (the pool's values reach 16; 512-term sums stay far from saturation).
    std::vector<float> xs(std::size_t(x_scales.bytes() / 4)),
        ws(std::size_t(weight_scales.bytes() / 4));
    for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = (1.0f + float(i % 7) / 8.0f) / 64.0f;
    for (std::size_t i = 0; i < ws.size(); ++i) ws[i] = (1.0f + float(i % 5) / 8.0f) / 64.0f;
    cuda::check(cudaMemcpy(x_scales.data(), xs.data(), xs.size() * 4, cudaMemcpyHostToDevice),
                "cudaMemcpy(x scales)");
    cuda::check(cudaMemcpy(weight_scales.data(), ws.data(), ws.size() * 4, cudaMemcpyHostToDevice),
                "cudaMemcpy(weight scales)");
  }

  cuda::model::Fp8BlockGemmParams half(int h, bool transposed, void* y, std::int64_t pitch) const {
    cuda::model::Fp8BlockGemmParams g;
    const std::int64_t scale_columns = cuda::model::linear_scale_columns(kIn);
    g.x = x.data();
    g.x_scales = x_scales.as<const float>();
    g.x_scale_pitch = scale_pitch;
    g.weight = weight.data() + h * kHalf * kIn;
    g.weight_scales = weight_scales.as<const float>() + h * (kHalf / 128) * scale_columns;
    g.weight_scale_pitch = scale_columns;
    g.rows = tokens;
    g.out = kHalf;
    g.in = kIn;
    g.scale = 0.5f;
    g.y = y;
    g.y_pitch = pitch;
    g.transposed = transposed;
    return g;
  }
};

// Whether the transposed V holds the token-major V's bytes.
bool transposed_matches(const Operands& o) {
  const std::size_t T = std::size_t(o.tokens), n = std::size_t(kHalf);
  std::vector<std::uint8_t> t(n * std::size_t(o.v_pitch)), r(T * n);
  cuda::check(cudaMemcpy(t.data(), o.v.data(), t.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
  cuda::check(cudaMemcpy(r.data(), o.v_check.data(), r.size(), cudaMemcpyDeviceToHost),
              "cudaMemcpy");
  for (std::size_t row = 0; row < T; ++row) {
    for (std::size_t c = 0; c < n; ++c) {
      if (t[c * std::size_t(o.v_pitch) + row] != r[row * n + c]) return false;
    }
  }
  return true;
}

void run(const Options& options) {
  for (std::int64_t T : options.tokens) {
    if (T <= 0 || T % 4 != 0) {
      throw Error(ErrorCategory::kInvalidArgument,
                  concat("bench projection: expected token counts that are positive multiples of "
                         "4, got ",
                         T));
    }
  }
  const RandomBf16Pool pool;
  cuda::model::CublasLtHandle handle;
  EventTimer timer(options.iters);
  timer.set_settle_ms(options.settle_ms);
  const std::string device = cuda::current_device_props().name;
  std::printf("fp8mla bench projection: deepseek-v3 kv_b_proj (%lld heads, %lld -> %lld) on %s\n",
              static_cast<long long>(kHeads), static_cast<long long>(kIn),
              static_cast<long long>(2 * kHalf), device.c_str());
  std::printf("%-5s %7s %10s %9s %10s %10s %s\n", "path", "tokens", "us", "TFLOP/s", "out MB",
              "e4m3/bf16", "check");
  std::vector<std::string> rows;
  for (std::int64_t T : options.tokens) {
    Operands o(pool, T);
    const cuda::model::LinearWeight w{cuda::model::LinearFormat::kFp8Block, o.weight.data(),
                                      o.weight_scales.as<const float>(), 2 * kHalf, kIn};
    cuda::model::CublasLinear bf16(handle.get(), w, T);
    const auto run_bf16 = [&](int) {
      bf16.run(o.x.data(), o.x_scales.as<const float>(), T, o.y_bf16.data(), o.workspace.data(),
               std::size_t(o.workspace.bytes()), nullptr);
    };
    const auto run_e4m3 = [&](int) {
      cuda::model::fp8_block_gemm(o.half(0, false, o.k_nope.data(), kHalf), o.workspace.data(),
                                  std::size_t(o.workspace.bytes()), nullptr);
      cuda::model::fp8_block_gemm(o.half(1, true, o.v.data(), o.v_pitch), o.workspace.data(),
                                  std::size_t(o.workspace.bytes()), nullptr);
    };
    const double bf16_us = timer.median_us(run_bf16, options.warmup);
    const double e4m3_us = timer.median_us(run_e4m3, options.warmup);
    cuda::model::fp8_block_gemm(o.half(1, false, o.v_check.data(), kHalf), o.workspace.data(),
                                std::size_t(o.workspace.bytes()), nullptr);
    cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const bool ok = transposed_matches(o);
    const double flop = 2.0 * double(T) * double(2 * kHalf) * double(kIn);
    const struct {
      const char* name;
      double us, out_mb;
    } results[] = {{"bf16", bf16_us, double(T * 2 * kHalf * 2) / 1e6},
                   {"e4m3", e4m3_us, double(T * 2 * kHalf) / 1e6}};
    for (const auto& r : results) {
      const bool e4m3 = std::strcmp(r.name, "e4m3") == 0;
      std::printf("%-5s %7lld %10.1f %9.0f %10.1f %10s %s\n", r.name, static_cast<long long>(T),
                  r.us, flop / r.us / 1e6, r.out_mb,
                  e4m3 ? std::to_string(r.us / bf16_us).substr(0, 5).c_str() : "",
                  e4m3 ? (ok ? "ok" : "TRANSPOSED V DIFFERS") : "");
      rows.push_back(JsonFields()
                         .add("path", json_string(r.name))
                         .add("tokens", T)
                         .add("us", json_number(r.us))
                         .add("tflops", json_number(flop / r.us / 1e6))
                         .add("check", json_bool(!e4m3 || ok))
                         .object());
    }
    if (!ok) throw Error(ErrorCategory::kInternal, "bench projection: transposed V differs");
  }
  if (!options.json.empty()) {
    write_json_document(options.json, document_header("projection", true), "rows", rows);
  }
}

}  // namespace

void add_bench_projection_command(CLI::App& bench) {
  auto options = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand(
      "projection",
      "kv_b_proj of DeepSeek-V3: cuBLASLt's bf16-output GEMM vs the e4m3-output pair");
  cmd->add_option("--tokens", options->tokens, "Token counts, multiples of 4")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--warmup", options->warmup, "Untimed runs")->check(CLI::Range(0, 1000));
  cmd->add_option("--iters", options->iters, "Timed runs")->check(CLI::Range(1, 10000));
  cmd->add_option("--settle-ms", options->settle_ms,
                  "Untimed runs for about this long before each row's timed ones (0: none)")
      ->check(CLI::Range(0.0, 60000.0))
      ->capture_default_str();
  cmd->add_option("--json", options->json, "Write the results as JSON to this file");
  cmd->callback([options] { run(*options); });
}

}  // namespace fp8mla::cli
