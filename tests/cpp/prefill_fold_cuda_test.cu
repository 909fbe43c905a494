// prefill_attention folding a prior state on the GPU (fp8mla/attention.hpp, docs/design.md op 8):
// the folding variants' epilogue merges with the merge kernels' arithmetic
// (src/cuda/attention/merge_math.cuh), so the fold gives, bit for bit, the CUDA call without the
// prior state followed by the CUDA merge_attention_states: apart, in place, without an LSE and
// quantized by every output key (outputs poisoned twice, guard bands checked); rows past a padded
// batch's tokens keep what they held. e4m3 and bf16, ragged batches with empty sequences and
// sequences without keys. A causal call with a prior state has no kernel: a clear error.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/common/runtime.hpp"
#include "cuda_test_util.hpp"
#include "error_test_util.hpp"
#include "fp8mla/attention.hpp"
#include "output_quant_test_util.hpp"
#include "prefill_fold_test_util.hpp"

namespace fp8mla {
namespace {

using test::DeviceBuffer;
using test::FoldBatch;

constexpr Device kGpu = Device::cuda(0);

void sync() {
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

TensorView out_view(const FoldBatch& b, const DeviceBuffer& d) {
  return TensorView(d.data(), DType::kBF16, {b.tq(), b.heads, FoldBatch::kDv}, kGpu);
}
TensorView lse_view(const FoldBatch& b, const DeviceBuffer& d) {
  return TensorView(d.data(), DType::kF32, {b.tq(), b.heads}, kGpu);
}

DeviceBuffer copy_of(const DeviceBuffer& from) {
  DeviceBuffer to(from.bytes());
  to.upload(from.download().data());
  return to;
}

// The CUDA call without the prior state: its bf16 out and LSE.
struct OwnState {
  DeviceBuffer out, lse;
  OwnState(const FoldBatch& b, std::span<void* const> bases)
      : out(std::size_t(b.tq() * b.heads * FoldBatch::kDv * 2)),
        lse(std::size_t(b.tq() * b.heads * 4)) {
    prefill_attention(b.args(bases, kGpu, out_view(b, out), lse_view(b, lse)));
  }
};

TEST(PrefillFoldCuda, EqualsTheCallThenTheMerge) {
  FP8MLA_REQUIRE_HOPPER();
  for (bool fp8 : {true, false}) {
    for (const FoldBatch& batch : test::fold_batches(fp8, false)) {
      SCOPED_TRACE(batch.describe());
      const std::vector<DeviceBuffer> device = test::upload(batch.host());
      const std::vector<void*> bases = test::device_bases(device);
      const OwnState own(batch, bases);
      const TensorView prior_out = batch.prior_out(bases, kGpu);
      const TensorView prior_lse = batch.prior_lse(bases, kGpu);
      DeviceBuffer want_out(device[6].bytes()), want_lse(device[7].bytes());
      merge_attention_states(prior_out, prior_lse, out_view(batch, own.out),
                             lse_view(batch, own.lse), out_view(batch, want_out),
                             lse_view(batch, want_lse), {}, {}, batch.real_tokens(bases, kGpu));
      sync();
      for (bool with_lse : {true, false}) {
        SCOPED_TRACE(with_lse ? "apart, with lse" : "apart, without lse");
        DeviceBuffer out(device[6].bytes()), lse(device[7].bytes());
        PrefillAttentionArgs a = batch.args(bases, kGpu, out_view(batch, out),
                                            with_lse ? lse_view(batch, lse) : TensorView());
        a.prior_out = prior_out;
        a.prior_lse = prior_lse;
        prefill_attention(a);
        sync();
        EXPECT_TRUE(test::same_bytes(out.download(), want_out.download(), "out"));
        EXPECT_TRUE(test::same_bytes(
            lse.download(), with_lse ? want_lse.download() : DeviceBuffer(lse.bytes()).download(),
            "lse"));
        EXPECT_TRUE(out.guards_intact() && lse.guards_intact());
      }
      // In place: the prior state is the output (each element read before it is written).
      DeviceBuffer state = copy_of(device[6]), state_lse = copy_of(device[7]);
      DeviceBuffer want_state = copy_of(device[6]), want_state_lse = copy_of(device[7]);
      merge_attention_states(out_view(batch, want_state), lse_view(batch, want_state_lse),
                             out_view(batch, own.out), lse_view(batch, own.lse),
                             out_view(batch, want_state), lse_view(batch, want_state_lse), {}, {},
                             batch.real_tokens(bases, kGpu));
      PrefillAttentionArgs a =
          batch.args(bases, kGpu, out_view(batch, state), lse_view(batch, state_lse));
      a.prior_out = a.out;
      a.prior_lse = a.lse;
      prefill_attention(a);
      sync();
      EXPECT_TRUE(test::same_bytes(state.download(), want_state.download(), "out in place"));
      EXPECT_TRUE(test::same_bytes(state_lse.download(), want_state_lse.download(), "lse"));
      EXPECT_TRUE(state.guards_intact() && state_lse.guards_intact());
    }
  }
}

// The last chunk writes the o_proj input: the fold quantized by each key and scale layout equals
// the CUDA merge with the same scales.
TEST(PrefillFoldCuda, QuantizedOutputIsTheMergeQuantized) {
  FP8MLA_REQUIRE_HOPPER();
  for (bool fp8 : {true, false}) {
    for (const FoldBatch& batch : test::fold_batches(fp8, false)) {
      SCOPED_TRACE(batch.describe());
      const std::vector<DeviceBuffer> device = test::upload(batch.host());
      const std::vector<void*> bases = test::device_bases(device);
      const OwnState own(batch, bases);
      for (const test::QuantCase& c :
           test::walked(test::quant_cases(batch.tq(), batch.heads, FoldBatch::kDv))) {
        SCOPED_TRACE(c.name);
        for (std::uint8_t poison : {std::uint8_t(0xFF), std::uint8_t(0x00)}) {
          test::QuantBuffers host(c, poison);
          const std::vector<DeviceBuffer> got = test::upload({host.out, host.scale, host.global});
          const std::vector<DeviceBuffer> want = test::upload({host.out, host.scale, host.global});
          const auto [scale, block] = test::op_scales(c, got[1].data(), got[2].data(), kGpu);
          PrefillAttentionArgs a =
              batch.args(bases, kGpu, c.out.view(got[0].data(), kGpu), TensorView());
          a.output_scale = scale;
          a.output_block_scale = block;
          a.prior_out = batch.prior_out(bases, kGpu);
          a.prior_lse = batch.prior_lse(bases, kGpu);
          prefill_attention(a);
          DeviceBuffer merged_lse(device[7].bytes());
          const auto [want_scale, want_block] =
              test::op_scales(c, want[1].data(), want[2].data(), kGpu);
          merge_attention_states(a.prior_out, a.prior_lse, out_view(batch, own.out),
                                 lse_view(batch, own.lse), c.out.view(want[0].data(), kGpu),
                                 lse_view(batch, merged_lse), want_scale, want_block,
                                 batch.real_tokens(bases, kGpu));
          sync();
          EXPECT_TRUE(test::same_bytes(got[0].download(), want[0].download(), "out"));
          EXPECT_TRUE(test::same_bytes(got[1].download(), want[1].download(), "scales"));
          EXPECT_TRUE(got[0].guards_intact() && got[1].guards_intact());
        }
      }
    }
  }
}

TEST(PrefillFoldCuda, CausalFoldHasNoKernel) {
  FP8MLA_REQUIRE_HOPPER();
  const FoldBatch batch = test::fold_batches(true, true)[0];
  const std::vector<DeviceBuffer> device = test::upload(batch.host());
  const std::vector<void*> bases = test::device_bases(device);
  DeviceBuffer out(device[6].bytes());
  PrefillAttentionArgs a = batch.args(bases, kGpu, out_view(batch, out), TensorView());
  a.prior_out = batch.prior_out(bases, kGpu);
  a.prior_lse = batch.prior_lse(bases, kGpu);
  test::expect_error([&] { prefill_attention(a); }, ErrorCategory::kUnsupported,
                     {"no CUDA kernel for (e4m3fn causal Dqk 192 Dv 128 folding a prior state)"});
  EXPECT_TRUE(test::same_bytes(out.download(), DeviceBuffer(out.bytes()).download(), "out"));
}

}  // namespace
}  // namespace fp8mla
