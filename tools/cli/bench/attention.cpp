// `fp8mla bench attention`: times prefill_attention (op 8) on CUDA device 0 through the public
// C++ API: e4m3 (V transposed, as the FP8 kernel reads it) and bf16, causal and not, H = 128,
// Dqk = 192, Dv = 128, on single sequences and a ragged batch of 16 x 1k (the shapes of the
// targets in docs/design.md section 9). K has MLA's structure: its last 64 dims (the RoPE part)
// are the same in every head; with --k-rope they are passed once per key as k_rope.
//
// Method (bench/README.md): CUDA events around each launch, --warmup untimed launches, then
// --iters timed ones queued behind a host gate (device time only), median. The kernel is
// compute-bound (an 8k causal e4m3 call reads 0.5 GB and does 2.7 TFLOP: ~0.1 ms of memory
// traffic in ~3 ms), so one input set is reused: L2 residency does not change its time. FLOPs = 2 *
// H * (visible query-key pairs) * (Dqk + Dv); causal counts only the visible half. Inputs are
// random finite values (e4m3 codes from random bf16, descales 1/16) with a softmax scale that
// gives the scores unit variance; after timing, every output element is checked to be finite.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/harness.hpp"
#include "commands.hpp"
#include "fp8mla/attention.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_prep.hpp"

namespace fp8mla::cli {
namespace {

constexpr int kDqk = kMlaQkDim;  // 192
constexpr int kDv = kMlaVDim;    // 128

struct Shape {
  const char* name;
  std::vector<int> lens;
};

struct Row {
  std::string shape;
  std::string dtype;
  bool causal = false;
  double tflop = 0.0;
  double us = 0.0;
  std::int64_t non_finite = 0;
};

double visible_pairs(const std::vector<int>& lens, bool causal) {
  double pairs = 0.0;
  for (int n : lens) pairs += causal ? 0.5 * double(n) * double(n + 1) : double(n) * double(n);
  return pairs;
}

// Random e4m3 (pool values times 16) or bf16 values into `dst` (`count` elements).
void fill_inputs(const RandomBf16Pool& pool, std::byte* dst, std::int64_t count, bool fp8,
                 std::uint64_t salt) {
  if (fp8) {
    fill_random_e4m3(pool, dst, count, 16.0f, salt, std::uint64_t(RandomBf16Pool::kElements));
  } else {
    pool.fill(dst, count * 2, salt);
  }
}

// MLA's K: the RoPE part (the last 64 dims) of head 0 copied into every other head.
void share_rope_part(std::byte* k, std::int64_t tokens, int heads, int eb) {
  const std::size_t pitch = std::size_t(heads) * kDqk * eb, rope = std::size_t(kMlaRopeDim) * eb;
  const std::byte* head0 = k + (kDqk - kMlaRopeDim) * eb;
  for (int h = 1; h < heads; ++h) {
    cuda::check(cudaMemcpy2D(k + (std::int64_t(h) * kDqk + kDqk - kMlaRopeDim) * eb, pitch, head0,
                             pitch, rope, std::size_t(tokens), cudaMemcpyDeviceToDevice),
                "cudaMemcpy2D");
  }
}

Row run_shape(const Shape& shape, bool fp8, bool causal, bool with_lse, bool k_rope, int heads,
              int warmup, int iters) {
  const std::int64_t tokens = [&] {
    std::int64_t t = 0;
    for (int n : shape.lens) t += n;
    return t;
  }();
  const int eb = fp8 ? 1 : 2;
  const RandomBf16Pool pool;
  // With k_rope: k's [T, H, 128] rows, then k_rope's [T, 64] in the same buffer.
  const int k_width = k_rope ? kMlaNopeDim : kDqk;
  const std::int64_t k_elements = tokens * heads * k_width + (k_rope ? tokens * kMlaRopeDim : 0);
  DeviceBuffer q(tokens * heads * kDqk * eb), k(k_elements * eb);
  DeviceBuffer v(tokens * heads * kDv * eb), out(tokens * heads * kDv * 2);
  DeviceBuffer lse(tokens * heads * 4), cu(std::int64_t(shape.lens.size() + 1) * 4), descale(4);
  fill_inputs(pool, q.data(), tokens * heads * kDqk, fp8, 1);
  fill_inputs(pool, k.data(), k_elements, fp8, 2);
  fill_inputs(pool, v.data(), tokens * heads * kDv, fp8, 3);
  if (!k_rope) share_rope_part(k.data(), tokens, heads, eb);
  std::vector<std::int32_t> offsets{0};
  int max_len = 0;
  for (int n : shape.lens) {
    offsets.push_back(offsets.back() + n);
    max_len = std::max(max_len, n);
  }
  const float descale_value = 1.0f / 16.0f;
  cuda::check(cudaMemcpy(cu.data(), offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice),
              "cudaMemcpy");
  cuda::check(cudaMemcpy(descale.data(), &descale_value, 4, cudaMemcpyHostToDevice), "cudaMemcpy");

  const DType dtype = fp8 ? DType::kE4M3 : DType::kBF16;
  PrefillAttentionArgs a;
  a.q = TensorView(q.data(), dtype, {tokens, heads, kDqk}, Device::cuda(0));
  a.k = TensorView(k.data(), dtype, {tokens, heads, k_width}, Device::cuda(0));
  if (k_rope) {
    a.k_rope = TensorView(k.data() + tokens * heads * k_width * eb, dtype, {tokens, kMlaRopeDim},
                          Device::cuda(0));
  }
  // e4m3: transposed V, [H][128][tokens] memory (tokens is a multiple of 16 for these shapes).
  a.v = fp8 ? TensorView(v.data(), dtype, {tokens, heads, kDv}, {1, kDv * tokens, tokens},
                         Device::cuda(0))
            : TensorView(v.data(), dtype, {tokens, heads, kDv}, Device::cuda(0));
  const TensorView cu_view(cu.data(), DType::kI32, {std::int64_t(offsets.size())}, Device::cuda(0));
  a.cu_seqlens_q = cu_view;
  a.cu_seqlens_k = cu_view;
  a.max_seqlen_q = max_len;
  a.max_seqlen_k = max_len;
  // Scores of unit variance, as a real model's are: with the pool's values (mean square 28.6) the
  // plain 1 / sqrt(Dqk) would make every softmax row one-hot and P almost all zeros, which ran the
  // e4m3 kernel 3 % faster on the H200 than unit-variance scores.
  a.softmax_scale = 1.0f / (std::sqrt(float(kDqk)) * RandomBf16Pool::kMeanSquare);
  a.causal = causal;
  if (fp8) {
    const TensorView d(descale.data(), DType::kF32, {1}, Device::cuda(0));
    a.q_descale = a.k_descale = a.v_descale = d;
  }
  a.out = TensorView(out.data(), DType::kBF16, {tokens, heads, kDv}, Device::cuda(0));
  if (with_lse) a.lse = TensorView(lse.data(), DType::kF32, {tokens, heads}, Device::cuda(0));

  EventTimer timer(iters);
  Row row;
  row.shape = shape.name;
  row.dtype = fp8 ? "e4m3" : "bf16";
  row.causal = causal;
  row.tflop = 2.0 * heads * visible_pairs(shape.lens, causal) * (kDqk + kDv) / 1e12;
  row.us = timer.median_us([&](int) { prefill_attention(a); }, warmup, /*queued=*/true);
  const std::vector<std::uint16_t> host = to_host<std::uint16_t>(out.data(), tokens * heads * kDv);
  for (std::uint16_t bits : host) row.non_finite += (bits & 0x7F80) == 0x7F80;
  return row;
}

void write_json(const std::string& path, const std::vector<Row>& rows, int heads, bool with_lse,
                bool k_rope) {
  JsonFields header = document_header("attention", false);
  header.add("heads", std::int64_t(heads))
      .add("lse", json_bool(with_lse))
      .add("k_rope", json_bool(k_rope));
  std::vector<std::string> objects;
  for (const Row& r : rows) {
    objects.push_back(JsonFields()
                          .add("shape", json_string(r.shape))
                          .add("dtype", json_string(r.dtype))
                          .add("causal", json_bool(r.causal))
                          .add("tflop", json_number(r.tflop))
                          .add("us", json_number(r.us))
                          .add("tflops", json_number(r.tflop / r.us * 1e6))
                          .add("non_finite", r.non_finite)
                          .object());
  }
  write_json_document(path, header, "rows", objects);
}

}  // namespace

void add_bench_attention_command(CLI::App& bench) {
  struct Options {
    int heads = 128;
    int warmup = 3;
    int iters = 20;
    std::string json;
    bool no_lse = false;
    bool k_rope = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand(
      "attention", "prefill_attention (e4m3 and bf16, causal and not) in TFLOP/s");
  cmd->add_option("--heads", options->heads, "Heads")->check(CLI::Range(1, 128));
  cmd->add_option("--warmup", options->warmup, "Untimed launches")->check(CLI::Range(0, 100));
  cmd->add_option("--iters", options->iters, "Timed launches")->check(CLI::Range(1, 1000));
  cmd->add_option("--json", options->json, "Write the results as JSON to this file");
  cmd->add_flag("--no-lse", options->no_lse,
                "Ask for no LSE (as a one-shot prefill does): the e4m3 kernel then skips its row "
                "sum and accumulates Q K^T in one run instead of three");
  cmd->add_flag("--k-rope", options->k_rope,
                "Pass K's RoPE part (the same in every head) once per key as k_rope, k as its "
                "[T, H, 128] rows");
  cmd->callback([options] {
    const std::vector<Shape> shapes = {{"1k", {1024}},
                                       {"4k", {4096}},
                                       {"8k", {8192}},
                                       {"16k", {16384}},
                                       {"16x1k", std::vector<int>(16, 1024)}};
    std::printf("%-7s %-5s %-7s %10s %10s %10s\n", "shape", "dtype", "mask", "TFLOP", "us",
                "TFLOP/s");
    std::vector<Row> rows;
    for (const Shape& shape : shapes) {
      for (bool causal : {true, false}) {
        for (bool fp8 : {true, false}) {
          const Row r = run_shape(shape, fp8, causal, !options->no_lse, options->k_rope,
                                  options->heads, options->warmup, options->iters);
          std::printf("%-7s %-5s %-7s %10.3f %10.1f %10.1f%s\n", r.shape.c_str(), r.dtype.c_str(),
                      causal ? "causal" : "full", r.tflop, r.us, r.tflop / r.us * 1e6,
                      r.non_finite ? "  NON-FINITE OUTPUT" : "");
          std::fflush(stdout);
          rows.push_back(r);
        }
      }
    }
    if (!options->json.empty())
      write_json(options->json, rows, options->heads, !options->no_lse, options->k_rope);
    for (const Row& r : rows) {
      if (r.non_finite) throw Error(ErrorCategory::kInternal, "non-finite attention output");
    }
  });
}

}  // namespace fp8mla::cli
