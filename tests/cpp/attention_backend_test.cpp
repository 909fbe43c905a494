// What the attention backends declare (fp8mla/attention_backend.hpp): the CPU ones a fixed set,
// the Hopper ones the dtypes and head dims of the compiled kernel variants and the architecture
// they were built for, so a build without CUDA has a name for them and nothing they can serve.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "error_test_util.hpp"
#include "fp8mla/attention_backend.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/kernel_registry.hpp"

namespace fp8mla {
namespace {

using HeadDims = std::vector<std::pair<int, int>>;

const std::vector<std::string> kFusedKeys = {"fp8_static", "fp8_group128", "fp8_group64", "nvfp4"};

TEST(AttentionBackends, CpuBackendsDeclareTheCpuAttention) {
  EXPECT_EQ(attention_backend_names(),
            (std::vector<std::string>{"cpu", "cpu-bf16", "fp8-hopper", "bf16-hopper"}));
  const HeadDims cpu_dims = {{192, 128}, {128, 128}, {64, 64}, {128, 64}};
  const BackendCapabilities cpu = make_attention_backend("cpu")->capabilities();
  EXPECT_EQ(cpu.attention_dtypes, (std::vector{DType::kE4M3, DType::kBF16}));
  EXPECT_EQ(cpu.head_dims, cpu_dims);
  EXPECT_EQ(cpu.architectures, std::vector<std::string>{"cpu"});
  EXPECT_TRUE(cpu.prepare_prefill_qkv && cpu.pack_prefix_chunk_kv);
  EXPECT_EQ(cpu.v_layout, VLayout::kTokenMajor);
  const BackendCapabilities bf16 = make_attention_backend("cpu-bf16")->capabilities();
  EXPECT_EQ(bf16.attention_dtypes, std::vector{DType::kBF16});
  EXPECT_EQ(bf16.head_dims, cpu_dims);
  EXPECT_FALSE(bf16.prepare_prefill_qkv || bf16.pack_prefix_chunk_kv);
  // The CPU attention fuses every output quantization key.
  EXPECT_EQ(cpu.output_quant, kFusedKeys);
  EXPECT_EQ(bf16.output_quant, kFusedKeys);
}

TEST(AttentionBackends, HopperBackendsDeclareTheCompiledVariants) {
  const BackendCapabilities fp8 = make_attention_backend("fp8-hopper")->capabilities();
  const BackendCapabilities bf16 = make_attention_backend("bf16-hopper")->capabilities();
  EXPECT_TRUE(fp8.prepare_prefill_qkv && fp8.pack_prefix_chunk_kv);
  EXPECT_EQ(fp8.v_layout, VLayout::kTransposed);
  EXPECT_FALSE(bf16.prepare_prefill_qkv || bf16.pack_prefix_chunk_kv);
#if defined(FP8MLA_WITH_CUDA)
  EXPECT_EQ(fp8.attention_dtypes, (std::vector{DType::kE4M3, DType::kBF16}));
  EXPECT_EQ(bf16.attention_dtypes, std::vector{DType::kBF16});
  for (const BackendCapabilities* caps : {&fp8, &bf16}) {
    EXPECT_EQ(caps->head_dims, (HeadDims{{192, 128}})) << caps->name;
    EXPECT_EQ(caps->architectures, std::vector<std::string>{"sm_90a"}) << caps->name;
    EXPECT_EQ(caps->output_quant, kFusedKeys) << caps->name;  // the epilogue fuses every key
  }
#else
  for (const BackendCapabilities* caps : {&fp8, &bf16}) {
    EXPECT_TRUE(caps->attention_dtypes.empty() && caps->head_dims.empty() &&
                caps->architectures.empty() && caps->output_quant.empty())
        << caps->name;
  }
  test::expect_error([&] { check_backend(fp8, {}, Device::cuda(0)); }, ErrorCategory::kUnsupported,
                     {"Supported: attention dtypes none, head dims none,", "architectures none.",
                      "Missing: attention dtype e4m3fn, head dims 192/128, architecture "});
#endif
}

}  // namespace
}  // namespace fp8mla
