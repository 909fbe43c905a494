// Each op captured once in a CUDA graph (on a stream of the test's own, through the op's stream
// argument) and replayed after its buffers' contents changed in place (same pointers, inputs from
// another seed, outputs poisoned again): the replay gives the bytes of an eager call on the new
// contents, in every buffer. So a launch reads its inputs from device memory at replay time and
// bakes nothing of the captured contents in. The eager results on the old and the new contents
// must differ somewhere, so that a graph replaying the old values could not pass.
// prefill_attention and merge_attention_states with a fused output quantization and padded token
// counts are output_quant_graph_cuda_test's; here they run with bf16 outputs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "attention_case_util.hpp"
#include "cuda_test_util.hpp"
#include "device_case_util.cuh"
#include "merge_states_test_util.hpp"
#include "mla_kv_test_util.hpp"
#include "mla_rope_test_util.hpp"
#include "quantize_test_util.hpp"

namespace fp8mla::test {
namespace {

// Captures `c`, replays it on the contents of `c` reseeded with seed + 2 (the same shapes: some
// cases pick a scalar's shape by the seed's parity) and compares with the eager call.
template <typename Case>
void expect_replay_equals_eager(const Case& c) {
  SCOPED_TRACE(c.describe());
  const Case changed = reseeded(c, c.seed + 2);
  DeviceCase<Case> dc(c);
  const TestStream stream;
  const std::vector<std::vector<std::uint8_t>> before_old = dc.download();
  dc.run(stream.get());  // warm-up outside the capture, as an engine does before capturing
  stream.sync();
  const std::vector<std::vector<std::uint8_t>> eager_old = dc.download();
  dc.load(c);
  const CapturedGraph graph(stream.get(), [&] { dc.run(stream.get()); });

  dc.load(changed);
  const std::vector<std::vector<std::uint8_t>> before = dc.download();
  graph.launch(stream.get());
  stream.sync();
  const std::vector<std::vector<std::uint8_t>> replayed = dc.download();
  dc.load(changed);
  dc.run(stream.get());
  stream.sync();
  const std::vector<std::vector<std::uint8_t>> eager = dc.download();

  // Some buffer the op wrote (changed from what it held) holds other bytes than on the old
  // contents; buffers the op only reads do not count.
  bool contents_matter = false;
  for (std::size_t i = 0; i < eager.size(); ++i) {
    EXPECT_TRUE(same_bytes(replayed[i], eager[i], concat("replay vs eager, buffer ", i)));
    contents_matter |=
        eager[i] != before[i] && eager_old[i] != before_old[i] && eager[i] != eager_old[i];
  }
  EXPECT_TRUE(contents_matter) << "no output differs between the old and the new contents";
  EXPECT_TRUE(dc.guards_intact());
}

TEST(GraphCaptureCuda, QuantizeFp8StaticAndDynamic) {
  FP8MLA_REQUIRE_HOPPER();
  for (Fp8Scale scale : {Fp8Scale::kValue, Fp8Scale::kMemory, Fp8Scale::kDynamic}) {
    expect_replay_equals_eager(
        Fp8Case{.shape = {300, 1024}, .scale = scale, .scale_inv = 0.75f, .seed = 41});
  }
}

TEST(GraphCaptureCuda, QuantizePerTokenGroup) {
  FP8MLA_REQUIRE_HOPPER();
  for (ScaleLayout layout : {ScaleLayout::kF32TmaColMajor, ScaleLayout::kUe8m0RowMajor,
                             ScaleLayout::kPackedTmaColMajor}) {
    expect_replay_equals_eager(GroupCase{.shape = {300, 2048}, .layout = layout, .seed = 42});
  }
}

TEST(GraphCaptureCuda, QuantizeNvfp4) {
  FP8MLA_REQUIRE_HOPPER();
  for (Nvfp4Scales scales : {Nvfp4Scales::kSwizzled5d, Nvfp4Scales::kLinear}) {
    expect_replay_equals_eager(
        Nvfp4Case{.shape = {300, 1024}, .scales = scales, .global_scale = 42.0f, .seed = 43});
  }
}

TEST(GraphCaptureCuda, RopeQuantizeWithAndWithoutCache) {
  FP8MLA_REQUIRE_HOPPER();
  for (std::int64_t page_size : {0, 16}) {
    RopeCase c;
    c.tokens = 300;
    c.heads = 16;
    c.page_size = page_size;
    c.seed = 44;
    expect_replay_equals_eager(c);
  }
}

TEST(GraphCaptureCuda, KvCacheWriteAndGather) {
  FP8MLA_REQUIRE_HOPPER();
  KvWriteCase w;
  w.tokens = 300;
  w.cache = {8, 64, 0, 0};
  w.skip_every = 5;
  w.seed = 45;
  expect_replay_equals_eager(w);
  KvGatherCase g;
  g.tokens = 300;
  g.cache = {8, 64, 0, 0};
  g.scale = 0.5f;
  g.seed = 46;
  expect_replay_equals_eager(g);
}

TEST(GraphCaptureCuda, KvPackAndVQuantize) {
  FP8MLA_REQUIRE_HOPPER();
  for (bool v_only : {false, true}) {
    KvPackCase c;
    c.tokens = 300;
    c.heads = 16;
    c.v_transposed = true;
    c.v_only = v_only;
    c.seed = 47;
    expect_replay_equals_eager(c);
  }
}

TEST(GraphCaptureCuda, PrefillAttentionBf16Out) {
  FP8MLA_REQUIRE_HOPPER();
  expect_replay_equals_eager(PrefillCase{.seed = 48});
  expect_replay_equals_eager(PrefillCase{.with_lse = false, .seed = 49});
  expect_replay_equals_eager(PrefillCase{.fp8 = false, .seed = 50});
  // The folding kernel: the prior state is read at replay time too.
  expect_replay_equals_eager(PrefillCase{.causal = false, .fold = true, .seed = 53});
}

TEST(GraphCaptureCuda, MergeAttentionStates) {
  FP8MLA_REQUIRE_HOPPER();
  expect_replay_equals_eager(MergeCase{.tokens = 300, .heads = 16, .seed = 51});
  expect_replay_equals_eager(
      MergeCase{.tokens = 300, .heads = 16, .form = MergeCase::Form::kInplace, .seed = 52});
}

}  // namespace
}  // namespace fp8mla::test
