// The CUDA layer's workspace contract, checked on the host (no GPU needed): a workspace sized by
// MlaLayer::workspace_bytes for some limits holds every batch within them (the prefill carves it
// for the batch's own sizes), for both paths (the FP8 one with and without fused output
// quantization), one-shot and chunked prefixes, on the presets; and the cuBLASLt space comes last
// and inside the workspace, every piece aligned; the fused path needs no bf16 attention output
// without chunks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>

#include "model/mla_executor.hpp"
#include "model/mla_workspace.hpp"

namespace fp8mla {
namespace {

// The FP8 path with the o_proj input fused or quantized separately, and the BF16 path.
const MlaPath kPaths[] = {{true, DType::kE4M3, MlaOutputQuant::kFused},
                          {true, DType::kE4M3, MlaOutputQuant::kSeparate},
                          {false, DType::kBF16, MlaOutputQuant::kSeparate}};

const char* path_name(const MlaPath& path) {
  return !path.fp8 ? " bf16" : path.output_quant == MlaOutputQuant::kFused ? " fp8 fused" : " fp8";
}

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
    for (const MlaPath& path : kPaths) {
      for (std::int64_t capacity : {64, 1000, 8192}) {
        MlaPrefillOptions options;
        options.one_shot_max_prefix = 3000;
        options.chunk_capacity = capacity;
        const MlaWorkspaceLimits limits{4097, 9, 20000};
        const std::size_t sized = mla_workspace_bytes(config, work_sizes(limits, options, path));
        for (int trial = 0; trial < 40; ++trial) {
          SCOPED_TRACE(::testing::Message() << preset << path_name(path) << " capacity " << capacity
                                            << " trial " << trial);
          MlaBatchPlan plan;
          plan_mla_batch(config, random_batch(rng, limits), options, plan);
          EXPECT_LE(mla_workspace_bytes(config, work_sizes(plan, path)), sized);
        }
      }
    }
  }
}

TEST(MlaWorkspace, PiecesAreAlignedAndInside) {
  const MlaConfig config = mla_preset("deepseek-v3");
  MlaPrefillOptions options;
  for (const MlaPath& path : kPaths) {
    const bool fp8 = path.fp8;
    const WorkSizes sizes = work_sizes(MlaWorkspaceLimits{1001, 3, 9000}, options, path);
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

// The fused path writes o_proj's input into the GEMM input buffer: without chunks it keeps no
// bf16 attention output, with chunks it keeps the one the merges accumulate in.
TEST(MlaWorkspace, FusedPathDropsTheBf16OutputWithoutChunks) {
  const MlaConfig config = mla_preset("deepseek-v3");
  const std::int64_t T = 1001, bf16_output = T * config.heads * kMlaVDim * 2;
  MlaPrefillOptions options;
  for (std::int64_t prefix : {0, 5000, 20000}) {  // none, one-shot, chunked
    SCOPED_TRACE(::testing::Message() << "prefix " << prefix);
    const MlaWorkspaceLimits limits{T, 3, prefix};
    const std::int64_t fused =
        std::int64_t(mla_workspace_bytes(config, work_sizes(limits, options, kPaths[0])));
    const std::int64_t separate =
        std::int64_t(mla_workspace_bytes(config, work_sizes(limits, options, kPaths[1])));
    if (prefix > options.one_shot_max_prefix) {
      EXPECT_EQ(fused, separate);
    } else {
      EXPECT_GE(separate - fused, bf16_output);
      EXPECT_LT(separate - fused, bf16_output + std::int64_t(kMlaWorkspaceAlign));
    }
  }
}

}  // namespace
}  // namespace fp8mla
