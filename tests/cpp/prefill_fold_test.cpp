// prefill_attention folding a prior state on the CPU (fp8mla/attention.hpp, docs/design.md op 8):
// the bytes of the call without it followed by merge_attention_states, written apart, in place,
// without an LSE and quantized by every output key; rows past a padded batch's tokens untouched;
// an empty prior state gives the call's own bytes; two key chunks folded one into the other give
// one call over all keys within bf16 rounding; and bad prior states are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "buffer_test_util.hpp"
#include "error_test_util.hpp"
#include "fp8mla/attention.hpp"
#include "fp8mla/numerics.hpp"
#include "output_quant_test_util.hpp"
#include "prefill_fold_test_util.hpp"

namespace fp8mla {
namespace {

using test::FoldBatch;
using test::HostBuffer;

constexpr Device kCpu = Device::cpu();

std::vector<void*> bases_of(std::vector<HostBuffer>& buffers) {
  std::vector<void*> bases;
  for (HostBuffer& b : buffers) bases.push_back(b.data());
  return bases;
}

HostBuffer copy_of(const HostBuffer& from) {
  HostBuffer to(from.bytes());
  std::memcpy(to.data(), from.data(), from.bytes());
  return to;
}

// The call without the prior state, into fresh buffers: its bf16 out and LSE.
struct OwnState {
  HostBuffer out, lse;
  OwnState(const FoldBatch& batch, std::span<void* const> bases)
      : out(std::size_t(batch.tq() * batch.heads * FoldBatch::kDv * 2)),
        lse(std::size_t(batch.tq() * batch.heads * 4)) {
    prefill_attention(batch.args(bases, kCpu, out_view(batch), lse_view(batch)));
  }
  TensorView out_view(const FoldBatch& b) {
    return TensorView(out.data(), DType::kBF16, {b.tq(), b.heads, FoldBatch::kDv});
  }
  TensorView lse_view(const FoldBatch& b) {
    return TensorView(lse.data(), DType::kF32, {b.tq(), b.heads});
  }
};

TEST(PrefillFold, EqualsTheCallThenTheMerge) {
  for (bool fp8 : {true, false}) {
    for (bool causal : {false, true}) {
      for (const FoldBatch& batch : test::fold_batches(fp8, causal)) {
        SCOPED_TRACE(batch.describe());
        std::vector<HostBuffer> host = batch.host();
        const std::vector<void*> bases = bases_of(host);
        OwnState own(batch, bases);
        const TensorView prior_out = batch.prior_out(bases, kCpu);
        const TensorView prior_lse = batch.prior_lse(bases, kCpu);
        const auto out_of = [&](HostBuffer& b) {
          return TensorView(b.data(), DType::kBF16, {batch.tq(), batch.heads, FoldBatch::kDv});
        };
        const auto lse_of = [&](HostBuffer& b) {
          return TensorView(b.data(), DType::kF32, {batch.tq(), batch.heads});
        };
        // Apart, with and without the LSE.
        HostBuffer want_out(host[6].bytes()), want_lse(host[7].bytes());
        merge_attention_states(prior_out, prior_lse, own.out_view(batch), own.lse_view(batch),
                               out_of(want_out), lse_of(want_lse), {}, {},
                               batch.real_tokens(bases, kCpu));
        for (bool with_lse : {true, false}) {
          HostBuffer out(host[6].bytes()), lse(host[7].bytes());
          PrefillAttentionArgs a =
              batch.args(bases, kCpu, out_of(out), with_lse ? lse_of(lse) : TensorView());
          a.prior_out = prior_out;
          a.prior_lse = prior_lse;
          prefill_attention(a);
          EXPECT_TRUE(test::same_bytes(out.payload(), want_out.payload(), "out"));
          if (with_lse) EXPECT_TRUE(test::same_bytes(lse.payload(), want_lse.payload(), "lse"));
          EXPECT_TRUE(out.guards_intact() && lse.guards_intact());
        }
        // In place: the prior state is the output.
        HostBuffer state = copy_of(host[6]), state_lse = copy_of(host[7]);
        HostBuffer want_state = copy_of(host[6]), want_state_lse = copy_of(host[7]);
        merge_attention_states(out_of(want_state), lse_of(want_state_lse), own.out_view(batch),
                               own.lse_view(batch), out_of(want_state), lse_of(want_state_lse), {},
                               {}, batch.real_tokens(bases, kCpu));
        PrefillAttentionArgs a = batch.args(bases, kCpu, out_of(state), lse_of(state_lse));
        a.prior_out = a.out;
        a.prior_lse = a.lse;
        prefill_attention(a);
        EXPECT_TRUE(test::same_bytes(state.payload(), want_state.payload(), "out in place"));
        EXPECT_TRUE(test::same_bytes(state_lse.payload(), want_state_lse.payload(), "lse"));
      }
    }
  }
}

// The last chunk of a chunked prefix writes the o_proj input: the merged output quantized by the
// key (the merge with the same scales), every key and scale layout, outputs poisoned twice.
TEST(PrefillFold, QuantizedOutputIsTheMergeQuantized) {
  for (bool fp8 : {true, false}) {
    for (const FoldBatch& batch : test::fold_batches(fp8, false)) {
      SCOPED_TRACE(batch.describe());
      std::vector<HostBuffer> host = batch.host();
      const std::vector<void*> bases = bases_of(host);
      OwnState own(batch, bases);
      for (const test::QuantCase& c : test::quant_cases(batch.tq(), batch.heads, FoldBatch::kDv)) {
        SCOPED_TRACE(c.name);
        for (std::uint8_t poison : {std::uint8_t(0xFF), std::uint8_t(0x00)}) {
          test::QuantBuffers got(c, poison), want(c, poison);
          HostBuffer lse(host[7].bytes(), poison), want_lse(host[7].bytes(), poison);
          const TensorView lse_view(lse.data(), DType::kF32, {batch.tq(), batch.heads});
          const auto [scale, block] = test::op_scales(c, got.scale.data(), got.global.data());
          PrefillAttentionArgs a = batch.args(bases, kCpu, c.out.view(got.out.data()), lse_view);
          a.output_scale = scale;
          a.output_block_scale = block;
          a.prior_out = batch.prior_out(bases, kCpu);
          a.prior_lse = batch.prior_lse(bases, kCpu);
          prefill_attention(a);
          const auto [want_scale, want_block] =
              test::op_scales(c, want.scale.data(), want.global.data());
          merge_attention_states(
              a.prior_out, a.prior_lse, own.out_view(batch), own.lse_view(batch),
              c.out.view(want.out.data()),
              TensorView(want_lse.data(), DType::kF32, {batch.tq(), batch.heads}), want_scale,
              want_block, batch.real_tokens(bases, kCpu));
          EXPECT_TRUE(test::same_bytes(got.out.payload(), want.out.payload(), "out"));
          EXPECT_TRUE(test::same_bytes(got.scale.payload(), want.scale.payload(), "scales"));
          EXPECT_TRUE(test::same_bytes(lse.payload(), want_lse.payload(), "lse"));
          EXPECT_TRUE(got.out.guards_intact() && got.scale.guards_intact());
        }
      }
    }
  }
}

// An empty prior state (-inf or +inf everywhere) leaves the call's own output and LSE, byte for
// byte; the padded rows keep what they held.
TEST(PrefillFold, EmptyPriorStateGivesTheCallsOwnBytes) {
  for (bool fp8 : {true, false}) {
    for (const FoldBatch& batch : test::fold_batches(fp8, true)) {
      SCOPED_TRACE(batch.describe());
      std::vector<HostBuffer> host = batch.host();
      const std::vector<void*> bases = bases_of(host);
      for (std::int64_t i = 0; i < batch.tq() * batch.heads; ++i) {
        const float empty = (i % 2 ? -1.0f : 1.0f) * std::numeric_limits<float>::infinity();
        std::memcpy(host[7].data() + 4 * i, &empty, 4);
      }
      OwnState own(batch, bases);
      HostBuffer out(host[6].bytes()), lse(host[7].bytes());
      PrefillAttentionArgs a = batch.args(
          bases, kCpu, TensorView(out.data(), DType::kBF16, {batch.tq(), batch.heads, 128}),
          TensorView(lse.data(), DType::kF32, {batch.tq(), batch.heads}));
      a.prior_out = batch.prior_out(bases, kCpu);
      a.prior_lse = batch.prior_lse(bases, kCpu);
      prefill_attention(a);
      const std::size_t real_out = std::size_t(batch.real() * batch.heads * 128 * 2);
      const std::size_t real_lse = std::size_t(batch.real() * batch.heads * 4);
      EXPECT_TRUE(test::same_bytes(out.payload().first(real_out), own.out.payload().first(real_out),
                                   "out"));
      EXPECT_TRUE(test::same_bytes(lse.payload().first(real_lse), own.lse.payload().first(real_lse),
                                   "lse"));
      for (std::size_t i = real_out; i < out.bytes(); ++i) {
        ASSERT_EQ(out.data()[i], test::kPoison) << "padded out byte " << i;
      }
    }
  }
}

// Keys split in two chunks, the second call folding into the first's state, against one call
// over all of them (non-causal, bf16): the same attention within two bf16 roundings.
TEST(PrefillFold, TwoChunksFoldedEqualOneCall) {
  FoldBatch whole;
  whole.fp8 = false;
  whole.q_lens = {40, 17, 3};
  whole.k_lens = {90, 31, 2};
  std::vector<HostBuffer> host = whole.host();
  const std::vector<void*> bases = bases_of(host);
  OwnState one_call(whole, bases);
  // Chunk A: each sequence's first half of keys; chunk B: the rest.
  FoldBatch chunk[2] = {whole, whole};
  std::vector<int> first(whole.k_lens.size());
  for (std::size_t s = 0; s < first.size(); ++s) {
    first[s] = whole.k_lens[s] / 2;
    chunk[0].k_lens[s] = first[s];
    chunk[1].k_lens[s] = whole.k_lens[s] - first[s];
  }
  const std::int64_t k_row = whole.heads * FoldBatch::kDqk * 2, v_row = whole.heads * 128 * 2;
  std::vector<HostBuffer> chunk_host[2] = {chunk[0].host(), chunk[1].host()};
  for (int c = 0; c < 2; ++c) {  // the chunk's keys and values, copied from the whole batch's
    std::memcpy(chunk_host[c][0].data(), host[0].data(), host[0].bytes());
    std::int64_t from = 0, to = 0;
    for (std::size_t s = 0; s < first.size(); ++s) {
      const std::int64_t skip = c == 0 ? 0 : first[s], n = chunk[c].k_lens[s];
      std::memcpy(chunk_host[c][1].data() + to * k_row, host[1].data() + (from + skip) * k_row,
                  std::size_t(n * k_row));
      std::memcpy(chunk_host[c][2].data() + to * v_row, host[2].data() + (from + skip) * v_row,
                  std::size_t(n * v_row));
      from += whole.k_lens[s];
      to += n;
    }
  }
  const std::vector<void*> bases_a = bases_of(chunk_host[0]), bases_b = bases_of(chunk_host[1]);
  OwnState state(chunk[0], bases_a);
  PrefillAttentionArgs b =
      chunk[1].args(bases_b, kCpu, state.out_view(whole), state.lse_view(whole));
  b.prior_out = b.out;
  b.prior_lse = b.lse;
  prefill_attention(b);
  // Each state's O is rounded to bf16 (half a step: 2^-9 relative) before the merge weighs it,
  // and the merged O again: within 3 half steps of the largest |O|.
  double worst = 0.0, largest = 0.0;
  for (std::int64_t i = 0; i < whole.real() * whole.heads * 128; ++i) {
    const float got = test::load_f32(state.out.data(), DType::kBF16, i);
    const float want = test::load_f32(one_call.out.data(), DType::kBF16, i);
    worst = std::max(worst, std::abs(double(got) - want));
    largest = std::max(largest, std::abs(double(want)));
  }
  EXPECT_GT(worst, 0.0) << "two bf16 roundings should show somewhere";
  EXPECT_LE(worst, 3.0 * 0x1p-9 * largest) << "largest |O| " << largest;
  for (std::int64_t i = 0; i < whole.real() * whole.heads; ++i) {
    float got, want;
    std::memcpy(&got, state.lse.data() + 4 * i, 4);
    std::memcpy(&want, one_call.lse.data() + 4 * i, 4);
    ASSERT_NEAR(got, want, 1e-5f * std::max(1.0f, std::abs(want))) << "lse " << i;
  }
}

TEST(PrefillFold, BadPriorStatesAreClearErrors) {
  FoldBatch batch;
  std::vector<HostBuffer> host = batch.host();
  const std::vector<void*> bases = bases_of(host);
  HostBuffer out(host[6].bytes()), lse(host[7].bytes());
  const std::int64_t tq = batch.tq(), h = batch.heads;
  const TensorView out_view(out.data(), DType::kBF16, {tq, h, 128});
  const TensorView lse_view(lse.data(), DType::kF32, {tq, h});
  const auto call = [&](TensorView prior_out, TensorView prior_lse, TensorView o = {},
                        TensorView l = {}) {
    return [=, &batch, &bases, &out_view, &lse_view] {
      PrefillAttentionArgs a =
          batch.args(bases, kCpu, o.ndim() ? o : out_view, l.ndim() ? l : lse_view);
      a.prior_out = prior_out;
      a.prior_lse = prior_lse;
      prefill_attention(a);
    };
  };
  const TensorView po = batch.prior_out(bases, kCpu), pl = batch.prior_lse(bases, kCpu);
  using test::expect_error;
  const ErrorCategory bad = ErrorCategory::kInvalidArgument;
  expect_error(call(po, {}), bad,
               {"expected `prior_out` and `prior_lse` together", "only `prior_out`"});
  expect_error(call({}, pl), bad, {"only `prior_lse`"});
  expect_error(call(TensorView(host[6].data(), DType::kF16, {tq, h, 128}), pl), bad,
               {"`prior_out` dtype: expected bf16, got f16"});
  expect_error(call(TensorView(host[6].data(), DType::kBF16, {tq, h, 64}), pl), bad,
               {"`prior_out`: expected [", "the shape of the output"});
  expect_error(call(po, TensorView(host[7].data(), DType::kF32, {tq, h - 1})), bad,
               {"`prior_lse`: expected ["});
  expect_error(call(po, TensorView(host[7].data(), DType::kF32, {tq, h}, Device::cuda(0))), bad,
               {"`prior_lse`: expected a tensor on cpu"});
  // An output overlapping the prior state without being it (a shifted or re-strided view), and
  // an LSE over the prior output.
  HostBuffer two(2 * host[6].bytes());
  auto* base = reinterpret_cast<std::uint16_t*>(two.data());
  const TensorView prior_in_two(base, DType::kBF16, {tq, h, 128});
  expect_error(call(prior_in_two, pl, TensorView(base + 128, DType::kBF16, {tq, h, 128})), bad,
               {"`out`: expected memory apart from `prior_out`"});
  const TensorView head_major(base, DType::kBF16, {tq, h, 128}, {128, tq * 128, 1});
  expect_error(call(head_major, pl, prior_in_two), bad,
               {"`out` aliases `prior_out` as another view"});
  expect_error(call(po, pl, {}, TensorView(host[6].data(), DType::kF32, {tq, h})), bad,
               {"`lse`: expected memory apart from `prior_out`"});
  // Folding in place is allowed: the same views.
  HostBuffer state = copy_of(host[6]), state_lse = copy_of(host[7]);
  const TensorView sv(state.data(), DType::kBF16, {tq, h, 128});
  const TensorView sl(state_lse.data(), DType::kF32, {tq, h});
  call(sv, sl, sv, sl)();
  EXPECT_TRUE(out.guards_intact() && lse.guards_intact() && state.guards_intact());
}

}  // namespace
}  // namespace fp8mla
