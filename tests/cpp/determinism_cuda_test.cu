// Every CUDA op run 1000 times on the same inputs gives the same bytes every time: each run starts
// from the same buffers (outputs restored to their poison), every buffer is fingerprinted on the
// device after every run, and the last run's bytes are also compared in full with the first's.
// Inputs are random (a few hundred tokens, 16 heads). Attention is also rerun while other work
// shares the GPU: a second prefill_attention and a merge on other streams and a kernel that holds
// SMs' shared memory, so the op's CTAs land on other SMs in another order from run to run.
//
// Why the ops are deterministic: no kernel accumulates through floating-point atomics or an order
// that depends on scheduling. Each prefill_attention tile is one (sequence, head, query block),
// reduced within its CTA in a fixed order; the dynamic amax is a max (exact in any order); the
// other ops are elementwise or reduce within one row or group.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "attention_case_util.hpp"
#include "cuda/common/runtime.hpp"
#include "cuda_test_util.hpp"
#include "device_case_util.cuh"
#include "merge_states_test_util.hpp"
#include "mla_kv_test_util.hpp"
#include "mla_rope_test_util.hpp"
#include "quantize_test_util.hpp"

namespace fp8mla::test {
namespace {

const std::size_t kRuns = rerun_count();

// Runs 1 .. kRuns of `dc` on `stream`, fingerprints into rows 1 .. kRuns of `f` (row 0: before).
template <typename Case>
void enqueue_reruns(const DeviceCase<Case>& dc, const Fingerprints& f, cudaStream_t stream,
                    std::size_t first, std::size_t last) {
  for (std::size_t r = first; r <= last; ++r) {
    dc.restore(stream);
    dc.run(stream);
    dc.fingerprint(f, r, stream);
  }
}

template <typename Case>
void expect_identical_reruns(const Case& c) {
  SCOPED_TRACE(c.describe());
  const DeviceCase<Case> dc(c);
  const TestStream stream;
  const Fingerprints f(kRuns + 1, dc.size());
  dc.fingerprint(f, 0, stream.get());
  enqueue_reruns(dc, f, stream.get(), 1, 1);
  stream.sync();
  const std::vector<std::vector<std::uint8_t>> first = dc.download();
  enqueue_reruns(dc, f, stream.get(), 2, kRuns);
  stream.sync();
  EXPECT_TRUE(same_every_run(f, kRuns, c.describe()));
  const std::vector<std::vector<std::uint8_t>> last = dc.download();
  for (std::size_t i = 0; i < first.size(); ++i) {
    EXPECT_TRUE(same_bytes(last[i], first[i], concat("run ", kRuns, " vs run 1, buffer ", i)));
  }
  EXPECT_TRUE(dc.guards_intact());
}

TEST(RerunCuda, QuantizeFp8StaticAndDynamic) {
  FP8MLA_REQUIRE_HOPPER();
  for (Fp8Scale scale : {Fp8Scale::kValue, Fp8Scale::kMemory, Fp8Scale::kDynamic}) {
    expect_identical_reruns(
        Fp8Case{.shape = {384, 2048}, .scale = scale, .scale_inv = 0.75f, .seed = 11});
  }
}

TEST(RerunCuda, QuantizePerTokenGroup) {
  FP8MLA_REQUIRE_HOPPER();
  expect_identical_reruns(
      GroupCase{.shape = {384, 7168}, .layout = ScaleLayout::kF32TmaColMajor, .seed = 12});
  expect_identical_reruns(GroupCase{.shape = {384, 2048},
                                    .group_size = 64,
                                    .layout = ScaleLayout::kPackedTmaColMajor,
                                    .seed = 13});
}

TEST(RerunCuda, QuantizeNvfp4) {
  FP8MLA_REQUIRE_HOPPER();
  expect_identical_reruns(Nvfp4Case{.shape = {384, 2048}, .global_scale = 42.0f, .seed = 14});
}

TEST(RerunCuda, RopeQuantizeWithAndWithoutCache) {
  FP8MLA_REQUIRE_HOPPER();
  for (std::int64_t page_size : {0, 64}) {
    RopeCase c;
    c.tokens = 300;
    c.heads = 16;
    c.page_size = page_size;
    c.q_scale_inv = 2.0f;
    c.cache_scale_inv = 0.5f;
    c.seed = 15;
    expect_identical_reruns(c);
  }
}

TEST(RerunCuda, KvCacheWriteAndGather) {
  FP8MLA_REQUIRE_HOPPER();
  KvWriteCase w;
  w.tokens = 300;
  w.cache = {8, 64, 0, 0};
  w.skip_every = 7;
  w.scale_inv = 2.0f;
  w.seed = 16;
  expect_identical_reruns(w);
  KvGatherCase g;
  g.tokens = 300;
  g.cache = {8, 64, 0, 0};
  g.scale = 0.5f;
  g.seed = 17;
  expect_identical_reruns(g);
}

TEST(RerunCuda, KvPackAndVQuantize) {
  FP8MLA_REQUIRE_HOPPER();
  for (bool v_only : {false, true}) {
    for (bool transposed : {true, false}) {
      KvPackCase c;
      c.tokens = 300;
      c.heads = 16;
      c.v_transposed = transposed;
      c.v_pitch_pad = transposed ? 4 : 0;
      c.k_scale_inv = 2.0f;
      c.v_scale_inv = 0.5f;
      c.v_only = v_only;
      c.seed = 18;
      expect_identical_reruns(c);
    }
  }
}

// e4m3 with and without the LSE (different main loops), V in both layouts, bf16, full and causal.
TEST(RerunCuda, PrefillAttention) {
  FP8MLA_REQUIRE_HOPPER();
  expect_identical_reruns(PrefillCase{.seed = 19});
  expect_identical_reruns(PrefillCase{.with_lse = false, .seed = 20});
  expect_identical_reruns(PrefillCase{.v_token_major = true, .seed = 21});
  expect_identical_reruns(PrefillCase{.fp8 = false, .seed = 22});
  expect_identical_reruns(
      PrefillCase{.causal = false, .q_lens = {100, 37}, .k_lens = {300, 5}, .seed = 23});
}

TEST(RerunCuda, PrefillAttentionFusedOutputQuant) {
  FP8MLA_REQUIRE_HOPPER();
  expect_identical_reruns(PrefillCase{.quant = OutputQuantKey::kFp8Group128, .seed = 24});
  expect_identical_reruns(PrefillCase{.quant = OutputQuantKey::kFp8Static, .seed = 25});
}

// The folding kernels (a prior state merged in the epilogue), e4m3 and bf16, into bf16 and into
// the quantized o_proj input.
TEST(RerunCuda, PrefillAttentionFoldingAPriorState) {
  FP8MLA_REQUIRE_HOPPER();
  expect_identical_reruns(PrefillCase{.causal = false, .fold = true, .seed = 26});
  expect_identical_reruns(PrefillCase{.fp8 = false, .causal = false, .fold = true, .seed = 27});
  expect_identical_reruns(PrefillCase{.causal = false,
                                      .with_lse = false,
                                      .quant = OutputQuantKey::kFp8Group128,
                                      .fold = true,
                                      .seed = 28});
}

TEST(RerunCuda, MergeAttentionStates) {
  FP8MLA_REQUIRE_HOPPER();
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    expect_identical_reruns(MergeCase{.dtype = dtype, .tokens = 300, .heads = 16, .seed = 26});
  }
  expect_identical_reruns(
      MergeCase{.tokens = 300, .heads = 16, .form = MergeCase::Form::kInplace, .seed = 27});
  expect_identical_reruns(MergeNvfp4Case{.seed = 28});
}

// ---- With other work on the GPU -----------------------------------------------------------------

// Holds `shared_bytes` of an SM's shared memory and its threads for about `cycles` clocks, so
// that the ops' CTAs cannot start on that SM meanwhile.
__global__ void occupy_sms_kernel(long long cycles, float* sink) {
  extern __shared__ float scratch[];
  const long long start = clock64();
  float x = float(threadIdx.x);
  while (clock64() - start < cycles) x = fmaf(x, 0.999f, 1.0f);
  scratch[threadIdx.x] = x;
  __syncthreads();
  if (scratch[(threadIdx.x + 1) % blockDim.x] == -1.0f) *sink = x;  // never: keeps the loop
}

TEST(RerunCuda, AttentionWithOtherWorkOnTheGpu) {
  FP8MLA_REQUIRE_HOPPER();
  const DeviceCase<PrefillCase> prefill(PrefillCase{.seed = 31});
  const DeviceCase<PrefillCase> other(
      PrefillCase{.fp8 = false, .heads = 32, .q_lens = {512, 300}, .seed = 32});
  const DeviceCase<MergeCase> merge(MergeCase{.tokens = 2048, .heads = 16, .seed = 33});
  const TestStream a, b, c, d;
  const Fingerprints fa(kRuns + 1, prefill.size()), fb(kRuns + 1, other.size()),
      fm(kRuns + 1, merge.size());
  prefill.fingerprint(fa, 0, a.get());
  other.fingerprint(fb, 0, b.get());
  merge.fingerprint(fm, 0, c.get());
  const int shared_bytes = 100 * 1024;
  cuda::check(cudaFuncSetAttribute(occupy_sms_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   shared_bytes),
              "cudaFuncSetAttribute");
  const cuda::DeviceBuffer sink(4);
  const int sms = cuda::device_props(0).sm_count;
  // Run 1 of each alone on a quiet GPU: the reference the concurrent runs must equal.
  enqueue_reruns(prefill, fa, a.get(), 1, 1);
  enqueue_reruns(other, fb, b.get(), 1, 1);
  enqueue_reruns(merge, fm, c.get(), 1, 1);
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  for (std::size_t r = 2; r <= kRuns; ++r) {
    if (r % 50 == 2) {  // a third to all of the SMs held for about 20 us
      occupy_sms_kernel<<<unsigned(sms / 3 + int(r % 3) * sms / 3), 256, shared_bytes, d.get()>>>(
          40000, reinterpret_cast<float*>(sink.data()));
      cuda::check_launch("occupy_sms_kernel");
    }
    enqueue_reruns(prefill, fa, a.get(), r, r);
    enqueue_reruns(other, fb, b.get(), r, r);
    enqueue_reruns(merge, fm, c.get(), r, r);
  }
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  EXPECT_TRUE(same_every_run(fa, kRuns, prefill.get().describe()));
  EXPECT_TRUE(same_every_run(fb, kRuns, other.get().describe()));
  EXPECT_TRUE(same_every_run(fm, kRuns, merge.get().describe()));
  EXPECT_TRUE(prefill.guards_intact());
  EXPECT_TRUE(other.guards_intact());
}

}  // namespace
}  // namespace fp8mla::test
