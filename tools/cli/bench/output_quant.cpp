// `fp8mla bench output-quant`: the fused output quantization (docs/design.md section 6) against
// the unfused pair, on CUDA device 0 through the public C++ API, for each key: fp8_static,
// fp8_group128 (f32 scales, TMA-aligned column-major), fp8_group128_ue8m0 (packed UE8M0 words,
// TMA-aligned column-major), fp8_group64 (f32, TMA-aligned) and nvfp4 (128x4 swizzled block
// scales). Two paths, one sequence of T tokens (causal), H heads, e4m3 Q/K and transposed V:
//  - one-shot: prefill_attention with the key (`fused`) against prefill_attention into bf16
//    followed by the standalone quantization op (`separate`), and plain prefill_attention into
//    bf16 (`plain`, no quantization at all), all without an LSE as a one-shot prefill runs;
//  - chunked prefix: attention over the new tokens with its LSE, attention over a prefix chunk of
//    T cached tokens (not causal) with its LSE, then merge_attention_states with the key
//    (`fused`) against the bf16 merge followed by the quantization op (`separate`) and the bf16
//    merge alone (`plain`). The merge alone (the tail, where the two differ) is timed too. And
//    the prefix chunk's attention folding the new tokens' state (prior_out / prior_lse) with the
//    key (`folded`, no merge pass: the layer's last chunk), and into bf16 (`folded plain`).
// fused / separate is what fusing saves; fused / plain what the quantization still costs (the
// target is within 2 % of plain attention, section 9).
//
// Method (bench/README.md): CUDA events around each timed unit (one call, or the unfused pair),
// --warmup untimed units, then --iters timed ones queued behind a host gate (device time only;
// --host-paced: not queued, for a profiler), median; a key's units (plain, fused, separate, the
// quantization alone) take turns over --rounds rounds, the row the median of the rounds. Inputs are
// random non-zero values from the harness's pool (e4m3 codes of random bf16, descales 1/16). After
// timing, the fused output and scales are compared byte for byte with the separate pair's (the
// contract: fused equals unfused then standalone); a mismatch fails the run after the JSON is
// written.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/harness.hpp"
#include "commands.hpp"
#include "fp8mla/attention.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_prep.hpp"
#include "fp8mla/output_quant.hpp"
#include "fp8mla/quantize.hpp"

namespace fp8mla::cli {
namespace {

constexpr int kDqk = kMlaQkDim;  // 192
constexpr int kDv = kMlaVDim;    // 128
constexpr float kDescale = 1.0f / 16.0f;
constexpr float kStaticScale = 1.0f;    // |o| < 16: no e4m3 saturation
constexpr float kGlobalScale = 100.0f;  // NVFP4 block scales well inside e4m3's range

enum class ScaleLayout { kStatic, kGroupF32, kGroupPacked, kNvfp4Swizzled };

struct KeyInfo {
  const char* name;
  OutputQuantKey key;
  int group_size;  // FP8 groups
  ScaleLayout layout;
  const char* what;
};

const KeyInfo kKeys[] = {
    {"fp8_static", OutputQuantKey::kFp8Static, 0, ScaleLayout::kStatic, "per-tensor e4m3"},
    {"fp8_group128", OutputQuantKey::kFp8Group128, 128, ScaleLayout::kGroupF32,
     "group 128, f32 scales TMA-aligned column-major"},
    {"fp8_group128_ue8m0", OutputQuantKey::kFp8Group128, 128, ScaleLayout::kGroupPacked,
     "group 128, packed UE8M0 i32 TMA-aligned column-major"},
    {"fp8_group64", OutputQuantKey::kFp8Group64, 64, ScaleLayout::kGroupF32,
     "group 64, f32 scales TMA-aligned column-major"},
    {"nvfp4", OutputQuantKey::kNvfp4, 0, ScaleLayout::kNvfp4Swizzled,
     "NVFP4, 128x4 swizzled block scales"},
};

TensorView on_gpu(void* data, DType dtype, std::vector<std::int64_t> shape,
                  std::vector<std::int64_t> strides = {}) {
  const Device gpu = Device::cuda(0);
  if (strides.empty()) return TensorView(data, dtype, shape, gpu);
  return TensorView(data, dtype, shape, strides, gpu);
}

// The quantized o_proj input of T tokens of W values in one key: `out`, its scales, the one f32
// (static scale_inv or NVFP4 global scale), and the standalone op that writes them from bf16.
class QuantOutput {
 public:
  QuantOutput(const KeyInfo& k, std::int64_t tokens, std::int64_t width) : key_(k), scalar_(4) {
    const bool fp4 = k.layout == ScaleLayout::kNvfp4Swizzled;
    out_ = DeviceBuffer(tokens * (fp4 ? width / 2 : width));
    const std::int64_t pitch = round_up(tokens, 4);  // TMA-aligned column-major
    const std::int64_t groups = k.group_size > 0 ? width / k.group_size : 0;
    switch (k.layout) {
      case ScaleLayout::kStatic:
        break;
      case ScaleLayout::kGroupF32:
        scales_ = DeviceBuffer(groups * pitch * 4);
        block_ = on_gpu(scales_.data(), DType::kF32, {tokens, groups}, {1, pitch});
        break;
      case ScaleLayout::kGroupPacked: {
        const std::int64_t words = (groups + 3) / 4;
        scales_ = DeviceBuffer(words * pitch * 4);
        block_ = on_gpu(scales_.data(), DType::kI32, {tokens, words}, {1, pitch});
        break;
      }
      case ScaleLayout::kNvfp4Swizzled:
        scales_ = DeviceBuffer(round_up(tokens, 128) * (width / 16));
        block_ = on_gpu(scales_.data(), DType::kE4M3, {round_up(tokens, 128), width / 16});
        break;
    }
    const float value = fp4 ? kGlobalScale : kStaticScale;
    cuda::check(cudaMemcpy(scalar_.data(), &value, 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    out_view_ = fp4 ? on_gpu(out_.data(), DType::kE2M1x2, {tokens, width / 2})
                    : on_gpu(out_.data(), DType::kE4M3, {tokens, width});
    if (detect_output_quant_key(out_view_, output_scale(), block_, width) != k.key) {
      throw Error(ErrorCategory::kInternal,
                  concat("output-quant: the tensors of ", k.name, " are not detected as that key"));
    }
  }

  const TensorView& out() const { return out_view_; }
  // The op's output_scale and output_block_scale.
  TensorView output_scale() const {
    if (key_.layout == ScaleLayout::kStatic || key_.layout == ScaleLayout::kNvfp4Swizzled) {
      return on_gpu(scalar_.data(), DType::kF32, {1});
    }
    return {};
  }
  const TensorView& output_block_scale() const { return block_; }

  // The standalone op of the key over bf16 rows [T, W].
  void quantize(const TensorView& bf16) const {
    switch (key_.layout) {
      case ScaleLayout::kStatic:
        quantize_fp8(bf16, out_view_, output_scale());
        return;
      case ScaleLayout::kGroupF32:
      case ScaleLayout::kGroupPacked:
        quantize_fp8_per_token_group(bf16, out_view_, block_, {key_.group_size, 1e-10f, false});
        return;
      case ScaleLayout::kNvfp4Swizzled:
        quantize_nvfp4(bf16, out_view_, block_, output_scale(), Nvfp4ScaleLayout::kSwizzled128x4);
        return;
    }
  }

  // Whether `other` holds the same output and scale bytes.
  bool same_bytes(const QuantOutput& other) const {
    const auto bytes = [](const DeviceBuffer& b) {
      return b.bytes() > 0 ? to_host<std::uint8_t>(b.data(), b.bytes())
                           : std::vector<std::uint8_t>();
    };
    return bytes(out_) == bytes(other.out_) && bytes(scales_) == bytes(other.scales_);
  }

 private:
  const KeyInfo& key_;
  DeviceBuffer out_, scales_, scalar_;
  TensorView out_view_, block_;
};

// One sequence of T new tokens and a prefix chunk of T cached ones, H heads, e4m3 Q, K, V
// (V transposed) with descales; bf16 attention outputs and LSEs for the chunked path.
struct Problem {
  std::int64_t tokens;
  int heads;
  DeviceBuffer q, k, v, prefix_k, prefix_v, cu_q, cu_k, descale;
  DeviceBuffer o_new, lse_new, o_prefix, lse_prefix, merged, merged_lse;

  Problem(const RandomBf16Pool& pool, std::int64_t t, int h, bool chunked)
      : tokens(t),
        heads(h),
        q(t * h * kDqk),
        k(t * h * kDqk),
        v(t * h * kDv),
        prefix_k(chunked ? t * h * kDqk : 0),
        prefix_v(chunked ? t * h * kDv : 0),
        cu_q(8),
        cu_k(8),
        descale(4),
        o_new(t * h * kDv * 2),
        lse_new(chunked ? t * h * 4 : 0),
        o_prefix(chunked ? t * h * kDv * 2 : 0),
        lse_prefix(chunked ? t * h * 4 : 0),
        merged(chunked ? t * h * kDv * 2 : 0),
        merged_lse(chunked ? t * h * 4 : 0) {
    const std::uint64_t step = RandomBf16Pool::kElements;
    fill_random_e4m3(pool, q.data(), t * h * kDqk, 16.0f, 1, step);
    fill_random_e4m3(pool, k.data(), t * h * kDqk, 16.0f, 2, step);
    fill_random_e4m3(pool, v.data(), t * h * kDv, 16.0f, 3, step);
    if (chunked) {
      fill_random_e4m3(pool, prefix_k.data(), t * h * kDqk, 16.0f, 4, step);
      fill_random_e4m3(pool, prefix_v.data(), t * h * kDv, 16.0f, 5, step);
    }
    const std::int32_t offsets[2] = {0, std::int32_t(t)};
    for (const DeviceBuffer* cu : {&cu_q, &cu_k}) {
      cuda::check(cudaMemcpy(cu->data(), offsets, 8, cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    cuda::check(cudaMemcpy(descale.data(), &kDescale, 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  }

  std::int64_t width() const { return std::int64_t(heads) * kDv; }
  TensorView bf16_rows(const DeviceBuffer& b) const {
    return on_gpu(b.data(), DType::kBF16, {tokens, width()});
  }
  TensorView states(const DeviceBuffer& b) const {
    return on_gpu(b.data(), DType::kBF16, {tokens, heads, kDv});
  }
  TensorView lse(const DeviceBuffer& b) const {
    return on_gpu(b.data(), DType::kF32, {tokens, heads});
  }

  // Attention of the new tokens over `keys` (the new ones, causal, or the prefix chunk's, not
  // causal) into `out`; `lse` may be empty.
  PrefillAttentionArgs attention(bool prefix, const TensorView& out, const TensorView& lse) const {
    const std::int64_t t = tokens;
    PrefillAttentionArgs a;
    a.q = on_gpu(q.data(), DType::kE4M3, {t, heads, kDqk});
    a.k = on_gpu((prefix ? prefix_k : k).data(), DType::kE4M3, {t, heads, kDqk});
    // Transposed V, [H][128][T] memory (T a multiple of 16), as the FP8 kernel reads it fastest.
    a.v = on_gpu((prefix ? prefix_v : v).data(), DType::kE4M3, {t, heads, kDv}, {1, kDv * t, t});
    a.cu_seqlens_q = on_gpu(cu_q.data(), DType::kI32, {2});
    a.cu_seqlens_k = on_gpu(cu_k.data(), DType::kI32, {2});
    a.max_seqlen_q = a.max_seqlen_k = int(t);
    // Scores of unit variance (as bench attention: the pool's mean square is 28.6).
    a.softmax_scale = 1.0f / (std::sqrt(float(kDqk)) * RandomBf16Pool::kMeanSquare);
    a.causal = !prefix;
    a.q_descale = a.k_descale = a.v_descale = on_gpu(descale.data(), DType::kF32, {1});
    a.out = out;
    a.lse = lse;
    return a;
  }
};

// One row of the table: a path, a shape and a key, median microseconds of each variant.
struct Row {
  std::string path;  // "one-shot" or "chunked"
  std::int64_t tokens = 0;
  int heads = 0;
  std::string key;
  double plain_us = 0, fused_us = 0, separate_us = 0, quant_us = 0;
  // chunked: the merge alone, bf16, fused and followed by the quantization; the prefix call
  // folding the state, with the key and into bf16
  double merge_us = 0, merge_fused_us = 0, merge_separate_us = 0;
  double folded_us = 0, folded_plain_us = 0;
  bool same = true;
};

struct Options {
  std::vector<std::string> keys;
  std::vector<std::int64_t> tokens = {4096, 16384};
  std::vector<int> heads = {128, 16};
  bool no_chunked = false;
  int warmup = 3;
  int iters = 20;
  int rounds = 3;
  bool host_paced = false;
  std::string json;
  bool no_pdl = false;
};

// The median microseconds of each unit, each timed in o.rounds rounds (a median of o.iters in
// each) in which the units take turns, in an order rotated every round: the card heats to its
// power cap within a second, so a unit always timed first or last would be favoured.
std::vector<double> interleaved_us(const Options& o, EventTimer& timer,
                                   const std::vector<std::function<void()>>& units) {
  std::vector<std::vector<double>> rounds(units.size());
  for (int r = 0; r < o.rounds; ++r) {
    for (std::size_t k = 0; k < units.size(); ++k) {
      const std::size_t u = (k + std::size_t(r)) % units.size();
      rounds[u].push_back(timer.median_us([&](int) { units[u](); }, o.warmup, !o.host_paced));
    }
  }
  std::vector<double> us;
  for (std::vector<double>& t : rounds) {
    std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
    us.push_back(t[t.size() / 2]);
  }
  return us;
}

// The one-shot rows of one shape: for each key, plain attention, fused, separate and the
// quantization op alone, interleaved.
void run_one_shot(const Options& o, const Problem& p, const std::vector<std::size_t>& keys,
                  EventTimer& timer, std::vector<Row>& rows) {
  const PrefillAttentionArgs plain = p.attention(false, p.states(p.o_new), {});
  for (std::size_t i : keys) {
    const KeyInfo& key = kKeys[i];
    const QuantOutput fused_out(key, p.tokens, p.width()), separate_out(key, p.tokens, p.width());
    PrefillAttentionArgs fused = p.attention(false, fused_out.out(), {});
    fused.output_scale = fused_out.output_scale();
    fused.output_block_scale = fused_out.output_block_scale();
    const TensorView bf16 = p.bf16_rows(p.o_new);
    const std::vector<double> us =
        interleaved_us(o, timer,
                       {[&] { prefill_attention(plain); }, [&] { prefill_attention(fused); },
                        [&] {
                          prefill_attention(plain);
                          separate_out.quantize(bf16);
                        },
                        [&] { separate_out.quantize(bf16); }});
    Row r{"one-shot", p.tokens, p.heads, key.name, us[0]};
    r.fused_us = us[1];
    r.separate_us = us[2];
    r.quant_us = us[3];
    cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    r.same = fused_out.same_bytes(separate_out);
    rows.push_back(r);
  }
}

// The chunked-prefix rows of one shape: the two attentions with LSE, then the merge plain, fused
// or followed by the quantization; the whole path and the merge alone, interleaved for each key.
void run_chunked(const Options& o, const Problem& p, const std::vector<std::size_t>& keys,
                 EventTimer& timer, std::vector<Row>& rows) {
  const PrefillAttentionArgs new_tokens = p.attention(false, p.states(p.o_new), p.lse(p.lse_new));
  const PrefillAttentionArgs prefix = p.attention(true, p.states(p.o_prefix), p.lse(p.lse_prefix));
  const auto attend = [&] {
    prefill_attention(new_tokens);
    prefill_attention(prefix);
  };
  const auto merge = [&](const TensorView& out, const TensorView& scale, const TensorView& block) {
    merge_attention_states(p.states(p.o_new), p.lse(p.lse_new), p.states(p.o_prefix),
                           p.lse(p.lse_prefix), out, p.lse(p.merged_lse), scale, block);
  };
  const TensorView merged = p.states(p.merged);
  // The prefix chunk's call folding the new tokens' state: into `out` (with the key's scales) or
  // into bf16 `merged` with its LSE.
  PrefillAttentionArgs folded_plain = p.attention(true, merged, p.lse(p.merged_lse));
  folded_plain.prior_out = p.states(p.o_new);
  folded_plain.prior_lse = p.lse(p.lse_new);
  for (std::size_t i : keys) {
    const KeyInfo& key = kKeys[i];
    const QuantOutput fused_out(key, p.tokens, p.width()), separate_out(key, p.tokens, p.width());
    const QuantOutput folded_out(key, p.tokens, p.width());
    PrefillAttentionArgs folded = folded_plain;
    folded.out = folded_out.out();
    folded.lse = {};
    folded.output_scale = folded_out.output_scale();
    folded.output_block_scale = folded_out.output_block_scale();
    const auto fused_merge = [&] {
      merge(fused_out.out(), fused_out.output_scale(), fused_out.output_block_scale());
    };
    const auto separate_merge = [&] {
      merge(merged, {}, {});
      separate_out.quantize(p.bf16_rows(p.merged));
    };
    const std::vector<double> us = interleaved_us(
        o, timer,
        {[&] {
           attend();
           merge(merged, {}, {});
         },
         [&] { merge(merged, {}, {}); },
         [&] {
           attend();
           fused_merge();
         },
         [&] {
           attend();
           separate_merge();
         },
         fused_merge, separate_merge, [&] { separate_out.quantize(p.bf16_rows(p.merged)); },
         [&] {
           prefill_attention(new_tokens);
           prefill_attention(folded);
         },
         [&] {
           prefill_attention(new_tokens);
           prefill_attention(folded_plain);
         }});
    Row r{"chunked", p.tokens, p.heads, key.name, us[0]};
    r.merge_us = us[1];
    r.fused_us = us[2];
    r.separate_us = us[3];
    r.merge_fused_us = us[4];
    r.merge_separate_us = us[5];
    r.quant_us = us[6];
    r.folded_us = us[7];
    r.folded_plain_us = us[8];
    cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    // The fold's contract: the bytes of the call, then the merge with the key.
    prefill_attention(new_tokens);
    prefill_attention(prefix);
    fused_merge();
    prefill_attention(folded);
    cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    r.same = fused_out.same_bytes(separate_out) && folded_out.same_bytes(fused_out);
    rows.push_back(r);
  }
}

std::string tokens_name(std::int64_t t) {
  return t % 1024 == 0 ? std::to_string(t / 1024) + "k" : std::to_string(t);
}

void print_header() {
  std::printf("%-8s %-5s %-4s %-19s %10s %10s %10s %9s %9s %9s %10s %10s  %s\n", "path", "T", "H",
              "key", "plain us", "fused us", "sep us", "quant us", "f/sep", "f/plain", "merge f/s",
              "fold/f", "check");
}

void print_row(const Row& r) {
  // Chunked rows: the merge alone, fused / separate; the folded path / the fused one.
  char tail[16] = "-", fold[16] = "-";
  if (r.path == "chunked") {
    std::snprintf(tail, sizeof(tail), "%.3f", r.merge_fused_us / r.merge_separate_us);
    std::snprintf(fold, sizeof(fold), "%.3f", r.folded_us / r.fused_us);
  }
  std::printf("%-8s %-5s %-4d %-19s %10.1f %10.1f %10.1f %9.1f %9.3f %9.3f %10s %10s  %s\n",
              r.path.c_str(), tokens_name(r.tokens).c_str(), r.heads, r.key.c_str(), r.plain_us,
              r.fused_us, r.separate_us, r.quant_us, r.fused_us / r.separate_us,
              r.fused_us / r.plain_us, tail, fold, r.same ? "ok" : "MISMATCH");
  std::fflush(stdout);
}

void write_json(const Options& o, const std::vector<Row>& rows) {
  JsonFields header = document_header("output_quant", true);
  header.add("warmup", std::int64_t(o.warmup)).add("iters", std::int64_t(o.iters));
  header.add("rounds", std::int64_t(o.rounds)).add("host_paced", json_bool(o.host_paced));
  header.add("target_fused_over_plain", json_number(1.02));
  std::vector<std::string> objects;
  for (const Row& r : rows) {
    JsonFields f;
    f.add("path", json_string(r.path))
        .add("tokens", r.tokens)
        .add("heads", std::int64_t(r.heads))
        .add("key", json_string(r.key))
        .add("causal", json_bool(true))
        .add("plain_us", json_number(r.plain_us))
        .add("fused_us", json_number(r.fused_us))
        .add("separate_us", json_number(r.separate_us))
        .add("quant_us", json_number(r.quant_us))
        .add("fused_over_separate", json_number(r.fused_us / r.separate_us))
        .add("fused_over_plain", json_number(r.fused_us / r.plain_us));
    if (r.path == "chunked") {
      f.add("merge_us", json_number(r.merge_us))
          .add("merge_fused_us", json_number(r.merge_fused_us))
          .add("merge_separate_us", json_number(r.merge_separate_us))
          .add("merge_fused_over_separate", json_number(r.merge_fused_us / r.merge_separate_us))
          .add("folded_us", json_number(r.folded_us))
          .add("folded_plain_us", json_number(r.folded_plain_us))
          .add("folded_over_fused", json_number(r.folded_us / r.fused_us))
          .add("folded_plain_over_plain", json_number(r.folded_plain_us / r.plain_us));
    }
    f.add("same_bytes", json_bool(r.same));
    objects.push_back(f.object());
  }
  write_json_document(o.json, header, "rows", objects);
}

// What the device run needs, checked before it starts (so a bad command line fails without one).
std::vector<std::size_t> check_options(const Options& o) {
  for (std::int64_t t : o.tokens) {
    if (t < 16 || t % 16 != 0 || t > (std::int64_t(1) << 20)) {
      throw Error(ErrorCategory::kInvalidArgument,
                  concat("--tokens: expected multiples of 16 from 16 to 2^20 (the transposed V's "
                         "token pitch is 16-byte aligned), got ",
                         t));
    }
  }
  for (int h : o.heads) {
    if (h < 1 || h > 128) {
      throw Error(ErrorCategory::kInvalidArgument, concat("--heads: expected 1 to 128, got ", h));
    }
  }
  return select_ops(o.keys, names_of(kKeys), "--key");
}

void run(const Options& o) {
  const std::vector<std::size_t> keys = check_options(o);
  start_device(o.no_pdl);
  const RandomBf16Pool pool;
  EventTimer timer(o.iters);
  std::vector<Row> rows;
  std::printf(
      "prefill attention with fused output quantization vs attention + quantize_*; e4m3 "
      "Q/K/V (V transposed), causal, one sequence; chunked: a prefix chunk of T tokens; "
      "median of %d rounds (each unit a median of %d after %d warm-up%s), the units of a key "
      "interleaved\n",
      o.rounds, o.iters, o.warmup, o.host_paced ? ", host-paced" : ", queued");
  print_header();
  for (std::int64_t t : o.tokens) {
    for (int h : o.heads) {
      const Problem p(pool, t, h, !o.no_chunked);
      const std::size_t first = rows.size();
      run_one_shot(o, p, keys, timer, rows);
      if (!o.no_chunked) run_chunked(o, p, keys, timer, rows);
      for (std::size_t i = first; i < rows.size(); ++i) print_row(rows[i]);
    }
  }
  if (!o.json.empty()) write_json(o, rows);
  for (const Row& r : rows) {
    if (!r.same) {
      throw Error(ErrorCategory::kInternal,
                  concat("output-quant: fused and separate bytes differ for ", r.path,
                         " T=", r.tokens, " H=", r.heads, " ", r.key));
    }
  }
}

}  // namespace

void add_bench_output_quant_command(CLI::App& bench) {
  auto options = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand(
      "output-quant",
      "prefill attention (and the chunked-prefix merge) with fused output quantization vs "
      "attention + the quantization op");
  std::string key_help = "Keys, comma-separated (default all):";
  for (const KeyInfo& k : kKeys) key_help += concat("\n  ", k.name, ": ", k.what);
  cmd->add_option("--key", options->keys, key_help)->delimiter(',');
  cmd->add_option("--tokens", options->tokens, "Token counts T, comma-separated")->delimiter(',');
  cmd->add_option("--heads", options->heads, "Head counts H, comma-separated")->delimiter(',');
  cmd->add_flag("--no-chunked", options->no_chunked, "Skip the chunked-prefix path");
  cmd->add_option("--warmup", options->warmup, "Untimed units")->check(CLI::Range(0, 100));
  cmd->add_option("--iters", options->iters, "Timed units")->check(CLI::Range(1, 1000));
  cmd->add_option("--rounds", options->rounds, "Rounds in which a key's units take turns")
      ->check(CLI::Range(1, 20));
  cmd->add_flag("--host-paced", options->host_paced,
                "Launch the timed units one by one instead of queued behind a host gate (under a "
                "profiler, which serializes launches)");
  cmd->add_option("--json", options->json, "Write the results as JSON to this file");
  cmd->add_flag("--no-pdl", options->no_pdl, "Launch without programmatic dependent launch");
  cmd->callback([options] { run(*options); });
}

}  // namespace fp8mla::cli
