// The MLA layer tests' batch fixture (shared by the CPU and CUDA layer tests): sequences with
// their prefix/extend lengths on shuffled whole pages of a random FP8 cache, random hidden states;
// the comparison of an output with the float64 reference, and the checks both tests make on it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fp8mla/attention_backend.hpp"
#include "fp8mla/mla_layer.hpp"
#include "fp8mla/mla_weights.hpp"
#include "fp8mla/numerics.hpp"
#include "model/mla_executor.hpp"

namespace fp8mla {

constexpr std::int64_t kPages = 96;
constexpr std::int64_t kPageSize = 16;

struct Fixture {
  MlaConfig config;
  MlaBatch batch;
  std::vector<std::uint16_t> hidden;
  std::vector<std::uint8_t> cache;  // [pages, page_size, 576]
  std::int64_t tokens = 0;

  Fixture(std::vector<std::pair<std::int64_t, std::int64_t>> lens, std::uint32_t seed,
          const char* preset = "tiny")
      : config(mla_preset(preset)) {
    std::mt19937 rng(seed);
    // Slots: whole pages, shuffled, handed to sequences in order.
    std::vector<std::int64_t> pages(kPages);
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    std::size_t next_page = 0;
    for (auto [prefix, extend] : lens) {
      MlaSequence s;
      s.prefix = prefix;
      s.extend = extend;
      while (std::int64_t(s.slots.size()) < prefix + extend) {
        const std::int64_t page = pages.at(next_page++);
        for (std::int64_t i = 0; i < kPageSize && std::int64_t(s.slots.size()) < prefix + extend;
             ++i) {
          s.slots.push_back(page * kPageSize + i);
        }
      }
      batch.sequences.push_back(std::move(s));
      tokens += extend;
    }
    std::normal_distribution<float> normal(0.0f, 1.0f);
    hidden.resize(std::size_t(tokens * config.hidden));
    for (auto& h : hidden) h = encode_bf16(normal(rng));
    // Every cache row random (prefix rows are read; the others must survive untouched).
    cache.resize(std::size_t(kPages * kPageSize * kMlaLatentDim));
    for (auto& b : cache) b = encode_e4m3(normal(rng));
  }
  TensorView cache_view() {
    return TensorView(cache.data(), DType::kE4M3, {kPages, kPageSize, kMlaLatentDim});
  }
  TensorView hidden_view() {
    return TensorView(hidden.data(), DType::kBF16, {tokens, config.hidden});
  }
  // The prefix chunks the layer's plan makes of the batch with `options` (0: none).
  std::int64_t planned_chunks(const MlaPrefillOptions& options) const {
    MlaBatchPlan plan;
    plan_mla_batch(config, batch, options, plan);
    return std::int64_t(plan.chunks.size());
  }
};

// The rows of `all` at `rows`, each `width` elements (a rank's share of a batch's rows).
template <typename T>
std::vector<T> take_rows(const std::vector<T>& all, const std::vector<std::int64_t>& rows,
                         std::int64_t width) {
  std::vector<T> out;
  for (std::int64_t r : rows)
    out.insert(out.end(), all.begin() + r * width, all.begin() + (r + 1) * width);
  return out;
}

struct Compare {
  double cosine = 0, max_abs = 0;
};

inline Compare compare(const std::vector<std::uint16_t>& out, const std::vector<double>& ref) {
  double dot = 0, nn = 0, rr = 0;
  Compare c;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double o = decode_bf16(out[i]);
    dot += o * ref[i];
    nn += o * o;
    rr += ref[i] * ref[i];
    c.max_abs = std::max(c.max_abs, std::abs(o - ref[i]));
  }
  c.cosine = dot / std::sqrt(nn * rr);
  return c;
}

inline std::vector<double> widen(const std::vector<std::uint16_t>& bf16) {
  std::vector<double> v(bf16.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = decode_bf16(bf16[i]);
  return v;
}

// Rows of the cache a prefill changed: every extend token's slot must have changed and no other
// row (prefix rows are only read). Returns {changed elsewhere, unchanged extend rows}.
inline std::pair<std::int64_t, std::int64_t> cache_rows_changed(
    const Fixture& f, const std::vector<std::uint8_t>& before) {
  std::vector<bool> extend_row(std::size_t(kPages * kPageSize), false);
  for (const MlaSequence& s : f.batch.sequences) {
    for (std::int64_t i = s.prefix; i < s.prefix + s.extend; ++i)
      extend_row[std::size_t(s.slots[std::size_t(i)])] = true;
  }
  std::int64_t changed_elsewhere = 0, unchanged_extend = 0;
  for (std::int64_t r = 0; r < kPages * kPageSize; ++r) {
    const bool same =
        std::equal(f.cache.begin() + r * kMlaLatentDim, f.cache.begin() + (r + 1) * kMlaLatentDim,
                   before.begin() + r * kMlaLatentDim);
    if (extend_row[std::size_t(r)]) {
      unchanged_extend += same;
    } else {
      changed_elsewhere += !same;
    }
  }
  return {changed_elsewhere, unchanged_extend};
}

// Options for one prefix mode: capacity 0 attends every prefix one-shot, another capacity chunks
// every prefix (whatever its length) into chunks of that many keys.
inline MlaPrefillOptions prefix_mode(std::int64_t capacity) {
  MlaPrefillOptions o;
  o.one_shot_max_prefix = capacity == 0 ? 1 << 30 : 0;
  o.chunk_capacity = std::max<std::int64_t>(capacity, 1);
  return o;
}

// The checks of each layer output against the float64 reference, for the two paths (FP8: index
// 0, BF16: 1), one-shot first, then chunked: cosine; chunked within 2x the one-shot error (the
// error rule); the extend rows of the cache written and no other row.
//
// e4m3 weights quantize each projection's input to e4m3 per 128-group (DeepSeek's recipe); the
// FP8 path rounds the attention inputs to e4m3 on top of that, two e4m3 roundings deep, where
// 0.999 is out of reach (0.9984-0.9989 measured). Every other combination keeps 0.999.
class LayerAccuracy {
 public:
  LayerAccuracy(WeightFormat format, const std::vector<double>& ref) : format_(format), ref_(ref) {}

  double min_cosine(bool fp8_path) const {
    return fp8_path && format_ == WeightFormat::kFp8Block ? 0.998 : 0.999;
  }

  void check(const std::string& label, bool fp8_path, std::int64_t capacity,
             const std::vector<std::uint16_t>& out, const Fixture& f,
             const std::vector<std::uint8_t>& cache_before) {
    const int p = fp8_path ? 0 : 1;
    const Compare c = compare(out, ref_);
    std::printf("[ layer    ] %s capacity %lld: cosine %.6f, max abs %.3g\n", label.c_str(),
                static_cast<long long>(capacity), c.cosine, c.max_abs);
    EXPECT_GE(c.cosine, min_cosine(fp8_path));
    if (capacity == 0) {
      one_shot_[p] = out;
      one_shot_error_[p] = c.max_abs;
    } else {
      EXPECT_LE(c.max_abs, 2.0 * one_shot_error_[p] + 1e-3);
    }
    const auto [changed_elsewhere, unchanged_extend] = cache_rows_changed(f, cache_before);
    EXPECT_EQ(changed_elsewhere, 0);
    EXPECT_EQ(unchanged_extend, 0);
  }

  // The two paths' one-shot outputs agree with each other as closely as with the reference.
  void check_paths_agree() const {
    EXPECT_GE(compare(one_shot_[0], widen(one_shot_[1])).cosine, min_cosine(true));
  }
  const std::vector<std::uint16_t>& one_shot(bool fp8_path) const {
    return one_shot_[fp8_path ? 0 : 1];
  }

 private:
  WeightFormat format_;
  const std::vector<double>& ref_;
  std::vector<std::uint16_t> one_shot_[2];
  double one_shot_error_[2] = {0, 0};
};

// A shipped backend that counts the attention calls asked for a quantized output and those that
// fold a prior state; with `fuses` false it declares no fused output quantization (a backend that
// cannot fuse), with `folds` false no folding of prior states (the layer merges chunks after
// their calls).
class OutputQuantProbe final : public AttentionBackend {
 public:
  OutputQuantProbe(const char* name, bool fuses, bool folds = true)
      : base_(make_attention_backend(name)), caps_(base_->capabilities()) {
    if (!fuses) {
      caps_.name += " (no output quantization)";
      caps_.output_quant.clear();
    }
    if (!folds) {
      caps_.name += " (no folding)";
      caps_.fold_prior_state = false;
    }
  }
  const BackendCapabilities& capabilities() const override { return caps_; }
  void prefill_attention(const PrefillAttentionArgs& args, CudaStream stream) const override {
    const auto given = [](const TensorView& t) { return t.data() != nullptr || t.ndim() > 0; };
    keyed_calls += given(args.output_block_scale) || given(args.output_scale);
    folded_calls += given(args.prior_out);
    base_->prefill_attention(args, stream);
  }
  void prepare_prefill_qkv(const PrepareQkvArgs& args, CudaStream stream) const override {
    const bool kv = args.v.data() != nullptr || args.qk.k_nope.data() != nullptr;
    (kv ? hook_calls_with_kv : hook_calls_without_kv) += 1;
    base_->prepare_prefill_qkv(args, stream);
  }
  void pack_prefix_chunk_kv(const MlaKvPackArgs& args, CudaStream stream) const override {
    base_->pack_prefix_chunk_kv(args, stream);
  }
  mutable int keyed_calls = 0;
  mutable int folded_calls = 0;
  mutable int hook_calls_with_kv = 0;     // the hook quantized K-nope and V
  mutable int hook_calls_without_kv = 0;  // they came from kv_b's e4m3 GEMMs

 private:
  std::unique_ptr<AttentionBackend> base_;
  BackendCapabilities caps_;
};

// The batches of the fused output quantization tests: no prefix (one attention call writes
// o_proj's input), and prefixes (one-shot: the one call; chunked: the last chunk's call folding
// it in, or the last merge with a backend that does not fold).
inline const std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>>&
output_quant_batches() {
  static const std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> batches = {
      {{0, 37}, {0, 5}, {0, 130}}, {{0, 37}, {130, 20}, {300, 1}, {5, 0}, {17, 9}}};
  return batches;
}

}  // namespace fp8mla
