// The CUDA layer's workspace contract, checked on the host (no GPU needed): a workspace sized by
// MlaLayer::workspace_bytes for some limits holds every batch within them (the prefill carves it
// for the batch's own sizes), for both paths, one-shot and chunked prefixes, on the presets; and
// the cuBLASLt space comes last and inside the workspace, every piece aligned.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>

#include "model/mla_executor.hpp"
#include "model/mla_workspace.hpp"

namespace fp8mla {
namespace {

MlaBatch random_batch(std::mt19937& rng, const MlaWorkspaceLimits& limits) {
  std::uniform_int_distribution<std::int64_t> sequences(1, limits.max_sequences);
  MlaBatch batch;
  const std::int64_t n = sequences(rng);
  std::int64_t tokens_left = limits.max_tokens, prefix_left = limits.max_prefix_tokens;
  for (std::int64_t i = 0; i < n; ++i) {
    MlaSequence s;
    s.extend = std::uniform_int_distribution<std::int64_t>(0, tokens_left)(rng);
    s.prefix = std::uniform_int_distribution<std::int64_t>(0, prefix_left)(rng);
    tokens_left -= s.extend;
    prefix_left -= s.prefix;
    for (std::int64_t t = 0; t < s.prefix + s.extend; ++t) s.slots.push_back(t);
    batch.sequences.push_back(std::move(s));
  }
  return batch;
}

TEST(MlaWorkspace, LimitsHoldEveryBatchWithinThem) {
  std::mt19937 rng(7);
  for (const char* preset : {"deepseek-v3", "deepseek-v2-lite", "tiny"}) {
    MlaConfig config = mla_preset(preset);
    config.max_position = 1 << 20;  // the random batches need no RoPE table here
    for (bool fp8 : {true, false}) {
      for (std::int64_t capacity : {64, 1000, 8192}) {
        MlaPrefillOptions options;
        options.one_shot_max_prefix = 3000;
        options.chunk_capacity = capacity;
        const MlaWorkspaceLimits limits{4097, 9, 20000};
        const std::size_t sized = mla_workspace_bytes(config, work_sizes(limits, options, fp8));
        for (int trial = 0; trial < 40; ++trial) {
          SCOPED_TRACE(::testing::Message() << preset << (fp8 ? " fp8" : " bf16") << " capacity "
                                            << capacity << " trial " << trial);
          MlaBatchPlan plan;
          plan_mla_batch(config, random_batch(rng, limits), options, plan);
          EXPECT_LE(mla_workspace_bytes(config, work_sizes(plan, fp8)), sized);
        }
      }
    }
  }
}

TEST(MlaWorkspace, PiecesAreAlignedAndInside) {
  const MlaConfig config = mla_preset("deepseek-v3");
  MlaPrefillOptions options;
  for (bool fp8 : {true, false}) {
    const WorkSizes sizes = work_sizes(MlaWorkspaceLimits{1001, 3, 9000}, options, fp8);
    const std::size_t bytes = mla_workspace_bytes(config, sizes);
    std::byte* const base = reinterpret_cast<std::byte*>(std::uintptr_t(1) << 20);
    const MlaBuffers b = carve_mla_workspace(base, config, sizes);
    for (const void* p :
         {static_cast<const void*>(b.meta_begin), static_cast<const void*>(b.gemm_x),
          static_cast<const void*>(b.q), static_cast<const void*>(b.kv),
          static_cast<const void*>(b.attn), static_cast<const void*>(b.cublas)}) {
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % kMlaWorkspaceAlign, 0u);
      EXPECT_GE(static_cast<const std::byte*>(p), base);
    }
    EXPECT_EQ(b.cublas + b.cublas_bytes, base + bytes);  // the last piece ends the workspace
    EXPECT_EQ(fp8, b.q8 != nullptr);
    EXPECT_EQ(!fp8, b.k16 != nullptr);
  }
}

}  // namespace
}  // namespace fp8mla
