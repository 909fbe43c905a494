// The fused output quantization in a CUDA graph (docs/design.md section 6, CUDA-graph padding):
// prefill_attention and merge_attention_states captured once with tensors sized for a padded token
// count, then replayed with different real token counts, only the device contents of cu_seqlens
// (prefill) or num_tokens (merge) changing between replays. Each replay gives the bytes of the
// same call made eagerly, and those are the standalone op's over the real rows: the padded rows of
// `out`, the LSE and the scales (poisoned with a new byte before each replay) stay untouched,
// the swizzled NVFP4 padding past the padded count is zeros, and the scale tensor keeps its
// padded stride (TMA-aligned column-major for T rows, spare rows). Every key and scale layout.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/common/runtime.hpp"
#include "cuda_test_util.hpp"
#include "device_case_util.cuh"
#include "fp8mla/attention.hpp"
#include "output_quant_test_util.hpp"

namespace fp8mla {
namespace {

using test::CapturedGraph;
using test::DeviceBuffer;
using test::HostBuffer;
using test::QuantBuffers;
using test::QuantCase;
using test::TestStream;

constexpr std::int64_t kHeads = 4, kDqk = 192, kDv = 128, kWidth = kHeads * kDv;
// The padded token count the graphs are captured for.
constexpr std::int64_t kRows = 300, kKeyRows = 320;
// Each replay's poison: a byte the previous replay did not leave behind.
constexpr std::uint8_t kReplayPoison[] = {0xFF, 0x5A, 0xC3};

DeviceBuffer upload(const HostBuffer& host) {
  DeviceBuffer device(host.bytes());
  device.upload(host.data());
  return device;
}

void sync(cudaStream_t stream) {
  cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

// The device buffers of one quantized call (out, scale tensor, global scale) and their poison.
struct QuantTarget {
  const QuantCase& c;
  DeviceBuffer out, scale, global;
  QuantTarget(const QuantCase& qc, std::uint8_t poison)
      : c(qc),
        out(qc.out.bytes(), poison),
        scale(qc.scale.bytes(), poison),
        global(std::size_t(4), poison) {
    repoison(poison);
  }
  // Every byte back to `poison`, the one-element scale set.
  void repoison(std::uint8_t poison) {
    const QuantBuffers host(c, poison);
    out.upload(host.out.data());
    scale.upload(host.scale.data());
    global.upload(host.global.data());
  }
  TensorView out_view() const { return c.out.view(out.data(), Device::cuda(0)); }
  std::pair<TensorView, TensorView> scales() const {
    return test::op_scales(c, scale.data(), global.data(), Device::cuda(0));
  }
};

// The replay's bytes against the eager call's and against the standalone op over `real_bf16`
// (the real rows of the unquantized output) with the padded rows' poison kept.
void expect_replay_matches(const QuantTarget& replayed, const QuantTarget& eager,
                           const TensorView& real_bf16, std::uint8_t poison) {
  QuantBuffers want(replayed.c, poison);
  test::run_standalone(replayed.c, real_bf16, want);
  test::pad_swizzled(replayed.c, want, real_bf16.size(0), kRows, kWidth, poison);
  const std::vector<std::uint8_t> out = replayed.out.download(), scale = replayed.scale.download();
  EXPECT_TRUE(test::same_bytes(out, eager.out.download(), "out (replay vs eager)"));
  EXPECT_TRUE(test::same_bytes(scale, eager.scale.download(), "scales (replay vs eager)"));
  EXPECT_TRUE(test::same_bytes(out, want.out.payload(), "out"));
  EXPECT_TRUE(test::same_bytes(scale, want.scale.payload(), "scales"));
  EXPECT_TRUE(test::same_bytes(replayed.global.download(), want.global.payload(), "global"));
  EXPECT_TRUE(replayed.out.guards_intact() && replayed.scale.guards_intact());
}

// The rows [real, rows) of an LSE [rows, kHeads] still hold `poison`; the real ones `want`'s.
void expect_lse_rows(const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want,
                     std::int64_t real, std::uint8_t poison) {
  std::vector<std::uint8_t> expected(got.size(), poison);
  std::copy_n(want.begin(), std::size_t(real * kHeads * 4), expected.begin());
  EXPECT_TRUE(test::same_bytes(got, expected, "lse"));
}

// ---- prefill_attention
// ---------------------------------------------------------------------------

// The real sequences of one replay: query and key counts of the batch's two sequences.
struct RealBatch {
  std::vector<int> q_lens, k_lens;
};
// The capture's, then two others with fewer and with far fewer real tokens (one sequence empty).
const RealBatch kReplays[] = {{{130, 3}, {140, 3}}, {{100, 20}, {100, 30}}, {{7, 0}, {7, 5}}};
constexpr int kMaxSeqlen = 160;  // the bounds captured with the graph: at least every replay's

// q, k, v sized for kRows queries and kKeyRows keys, cu_seqlens whose contents each replay sets.
struct PaddedBatch {
  bool fp8;
  DeviceBuffer q, k, v, cu_q{12}, cu_k{12}, descales;

  explicit PaddedBatch(bool e4m3)
      : fp8(e4m3),
        q(random(kRows * kHeads * kDqk, 2.0f, 1)),
        k(random(kKeyRows * kHeads * kDqk, 4.0f, 2)),
        v(random(kKeyRows * kHeads * kDv, 2.0f, 3)),
        descales(test::to_device(std::vector<float>{0.5f, 0.25f, 2.0f})) {}

  DeviceBuffer random(std::int64_t n, float range, std::uint64_t seed) const {
    const DType dtype = fp8 ? DType::kE4M3 : DType::kBF16;
    HostBuffer host(std::size_t(n) * dtype_size(dtype));
    test::Rng rng(seed);
    for (std::int64_t i = 0; i < n; ++i) {
      const float x = (rng.uniform() * 2.0f - 1.0f) * (fp8 ? range : 1.0f);
      if (fp8) {
        host.data()[i] = encode_e4m3(x);
      } else {
        test::store_f32(host.data(), dtype, i, x);
      }
    }
    return upload(host);
  }

  // The replay's offsets into cu_seqlens (outside any graph); returns its real query count.
  std::int64_t set(const RealBatch& b) {
    std::vector<std::int32_t> q{0, b.q_lens[0], b.q_lens[0] + b.q_lens[1]};
    std::vector<std::int32_t> k{0, b.k_lens[0], b.k_lens[0] + b.k_lens[1]};
    cu_q.upload(q.data());
    cu_k.upload(k.data());
    return q.back();
  }

  PrefillAttentionArgs args(const TensorView& out, const TensorView& lse) const {
    const Device gpu = Device::cuda(0);
    const DType dtype = fp8 ? DType::kE4M3 : DType::kBF16;
    PrefillAttentionArgs a;
    a.q = TensorView(q.data(), dtype, {kRows, kHeads, kDqk}, gpu);
    a.k = TensorView(k.data(), dtype, {kKeyRows, kHeads, kDqk}, gpu);
    a.v = TensorView(v.data(), dtype, {kKeyRows, kHeads, kDv}, gpu);
    a.cu_seqlens_q = TensorView(cu_q.data(), DType::kI32, {3}, gpu);
    a.cu_seqlens_k = TensorView(cu_k.data(), DType::kI32, {3}, gpu);
    a.max_seqlen_q = a.max_seqlen_k = kMaxSeqlen;
    a.softmax_scale = 0.0722f;
    if (fp8) {
      a.q_descale = TensorView(descales.as<float>(), DType::kF32, {1}, gpu);
      a.k_descale = TensorView(descales.as<float>() + 1, DType::kF32, {1}, gpu);
      a.v_descale = TensorView(descales.as<float>() + 2, DType::kF32, {1}, gpu);
    }
    a.out = out;
    a.lse = lse;
    return a;
  }
};

// The eager bf16 output rows [real, W] and LSE of each replay's batch.
struct Unfused {
  std::vector<std::uint8_t> rows, lse;
};

// With or without the LSE, as the fused call (the e4m3 kernel's O differs in the last bits).
std::vector<Unfused> unfused_outputs(PaddedBatch& batch, bool with_lse, cudaStream_t stream) {
  const Device gpu = Device::cuda(0);
  std::vector<Unfused> result;
  for (const RealBatch& b : kReplays) {
    const std::int64_t real = batch.set(b);
    DeviceBuffer out(std::size_t(kRows * kWidth * 2)), lse(std::size_t(kRows * kHeads * 4));
    const TensorView lse_view =
        with_lse ? TensorView(lse.data(), DType::kF32, {kRows, kHeads}, gpu) : TensorView();
    prefill_attention(
        batch.args(TensorView(out.data(), DType::kBF16, {kRows, kHeads, kDv}, gpu), lse_view),
        stream);
    sync(stream);
    result.push_back({out.download(0, std::size_t(real * kWidth * 2)), lse.download()});
  }
  return result;
}

// The fused call of `c` captured once, replayed for each of kReplays against the eager call.
void expect_prefill_graph(PaddedBatch& batch, const std::vector<Unfused>& unfused,
                          const QuantCase& c, bool with_lse, cudaStream_t stream) {
  SCOPED_TRACE(c.name);
  const Device gpu = Device::cuda(0);
  QuantTarget replayed(c, kReplayPoison[0]), eager(c, kReplayPoison[0]);
  DeviceBuffer lse(std::size_t(kRows * kHeads * 4)), eager_lse(lse.bytes());
  const auto call = [&](const QuantTarget& t, const DeviceBuffer& l) {
    PrefillAttentionArgs a =
        batch.args(t.out_view(), with_lse ? TensorView(l.data(), DType::kF32, {kRows, kHeads}, gpu)
                                          : TensorView());
    std::tie(a.output_scale, a.output_block_scale) = t.scales();
    prefill_attention(a, stream);
  };
  batch.set(kReplays[0]);
  call(eager, eager_lse);  // eagerly first: what a call sets up once is not captured
  sync(stream);
  const CapturedGraph graph(stream, [&] { call(replayed, lse); });
  for (std::size_t i = 0; i < std::size(kReplays); ++i) {
    SCOPED_TRACE(concat("replay ", i));
    const std::uint8_t poison = kReplayPoison[i];
    const std::int64_t real = batch.set(kReplays[i]);
    replayed.repoison(poison);
    eager.repoison(poison);
    lse.fill(poison);
    eager_lse.fill(poison);
    graph.launch(stream);
    sync(stream);
    call(eager, eager_lse);
    sync(stream);
    const TensorView rows(const_cast<std::uint8_t*>(unfused[i].rows.data()), DType::kBF16,
                          {real, kWidth});
    expect_replay_matches(replayed, eager, rows, poison);
    if (with_lse) {
      EXPECT_TRUE(test::same_bytes(lse.download(), eager_lse.download(), "lse (replay vs eager)"));
      expect_lse_rows(lse.download(), unfused[i].lse, real, poison);
    }
  }
}

TEST(OutputQuantGraph, PrefillAttentionReplaysWithFewerRealTokens) {
  FP8MLA_REQUIRE_HOPPER();
  const TestStream stream;
  for (bool fp8 : {true, false}) {
    PaddedBatch batch(fp8);
    for (bool with_lse : {false, true}) {
      SCOPED_TRACE(concat(fp8 ? "e4m3" : "bf16", with_lse ? ", with lse" : ""));
      const std::vector<Unfused> unfused = unfused_outputs(batch, with_lse, stream.get());
      for (const QuantCase& c : test::walked(test::quant_cases(kRows, kHeads, kDv))) {
        expect_prefill_graph(batch, unfused, c, with_lse, stream.get());
      }
    }
  }
}

// ---- merge_attention_states
// ----------------------------------------------------------------------

// The real token counts of the replays: the capture's, fewer, all of them, far fewer.
constexpr std::int32_t kMergeReplays[] = {133, 120, int(kRows), 7};

// bf16 states of kRows tokens (a quarter of the sides empty) and the num_tokens the replays set.
struct PaddedStates {
  DeviceBuffer o_a, o_b, lse_a, lse_b, num_tokens{4};
  PaddedStates()
      : o_a(random_states(1)), o_b(random_states(2)), lse_a(random_lse(3)), lse_b(random_lse(4)) {}

  static DeviceBuffer random_states(std::uint64_t seed) {
    HostBuffer host(std::size_t(kRows * kWidth * 2));
    test::Rng rng(seed);
    for (std::int64_t i = 0; i < kRows * kWidth; ++i) {
      test::store_f32(host.data(), DType::kBF16, i, (rng.uniform() * 2.0f - 1.0f) * 4.0f);
    }
    return upload(host);
  }
  static DeviceBuffer random_lse(std::uint64_t seed) {
    std::vector<float> lse(std::size_t(kRows * kHeads));
    test::Rng rng(seed);
    for (float& x : lse) x = rng.below(4) == 0 ? -INFINITY : (rng.uniform() * 2.0f - 1.0f) * 8.0f;
    return test::to_device(lse);
  }
  void set(std::int32_t real) { num_tokens.upload(&real); }

  TensorView o(const DeviceBuffer& b) const {
    return TensorView(b.data(), DType::kBF16, {kRows, kHeads, kDv}, Device::cuda(0));
  }
  TensorView lse(const DeviceBuffer& b) const {
    return TensorView(b.data(), DType::kF32, {kRows, kHeads}, Device::cuda(0));
  }
  TensorView count() const {
    return TensorView(num_tokens.data(), DType::kI32, {1}, Device::cuda(0));
  }
};

TEST(OutputQuantGraph, MergeAttentionStatesReplaysWithFewerRealTokens) {
  FP8MLA_REQUIRE_HOPPER();
  const TestStream stream;
  PaddedStates s;
  // The unfused merge of every row: each row's bytes are those of a merge of the real rows only.
  DeviceBuffer merged(s.o_a.bytes()), merged_lse(s.lse_a.bytes());
  merge_attention_states(s.o(s.o_a), s.lse(s.lse_a), s.o(s.o_b), s.lse(s.lse_b), s.o(merged),
                         s.lse(merged_lse), stream.get());
  sync(stream.get());
  const std::vector<std::uint8_t> bf16 = merged.download(), want_lse = merged_lse.download();
  for (const QuantCase& c : test::walked(test::quant_cases(kRows, kHeads, kDv))) {
    SCOPED_TRACE(c.name);
    QuantTarget replayed(c, kReplayPoison[0]), eager(c, kReplayPoison[0]);
    DeviceBuffer out_lse(s.lse_a.bytes()), eager_lse(s.lse_a.bytes());
    const auto call = [&](const QuantTarget& t, const DeviceBuffer& l) {
      const auto [scale, block] = t.scales();
      merge_attention_states(s.o(s.o_a), s.lse(s.lse_a), s.o(s.o_b), s.lse(s.lse_b), t.out_view(),
                             s.lse(l), scale, block, s.count(), stream.get());
    };
    s.set(kMergeReplays[0]);
    call(eager, eager_lse);  // eagerly first: what a call sets up once is not captured
    sync(stream.get());
    const CapturedGraph graph(stream.get(), [&] { call(replayed, out_lse); });
    for (std::size_t i = 0; i < std::size(kMergeReplays); ++i) {
      const std::int32_t real = kMergeReplays[i];
      SCOPED_TRACE(concat("replay ", i, ": ", real, " tokens"));
      const std::uint8_t poison = kReplayPoison[i % std::size(kReplayPoison)];
      s.set(real);
      replayed.repoison(poison);
      eager.repoison(poison);
      out_lse.fill(poison);
      eager_lse.fill(poison);
      graph.launch(stream.get());
      sync(stream.get());
      call(eager, eager_lse);
      sync(stream.get());
      const TensorView rows(const_cast<std::uint8_t*>(bf16.data()), DType::kBF16, {real, kWidth});
      expect_replay_matches(replayed, eager, rows, poison);
      const std::vector<std::uint8_t> got_lse = out_lse.download();
      EXPECT_TRUE(test::same_bytes(got_lse, eager_lse.download(), "out_lse (replay vs eager)"));
      expect_lse_rows(got_lse, want_lse, real, poison);
    }
  }
}

}  // namespace
}  // namespace fp8mla
