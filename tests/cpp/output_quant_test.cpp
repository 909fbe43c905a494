// detect_output_quant_key (fp8mla/output_quant.hpp): every rule and every error, on metadata
// only (fake data pointers, never read), and the attention ops' errors for a quantized output.
#include "fp8mla/output_quant.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "error_test_util.hpp"
#include "fp8mla/attention.hpp"

namespace fp8mla {
namespace {

using test::expect_error;
using test::fake;
using test::kFake;

TensorView strided(DType dtype, std::initializer_list<std::int64_t> shape,
                   std::initializer_list<std::int64_t> strides, Device device = Device::cpu()) {
  return TensorView(kFake, dtype, shape, strides, device);
}

// One row of the table: the arguments and the key, or the error's category and words.
struct Case {
  std::string name;
  TensorView output, scale, block;
  std::int64_t output_dim = 512;
  std::optional<OutputQuantKey> key;  // nullopt: an error
  std::vector<std::string> needles;
  ErrorCategory category = ErrorCategory::kInvalidArgument;
};

// The o_proj input of 10 tokens and 4 heads of 128: [10, 512].
const TensorView kE4m3 = fake(DType::kE4M3, {10, 512});
const TensorView kFp4 = fake(DType::kE2M1x2, {10, 256});
const TensorView kBf16 = fake(DType::kBF16, {10, 512});
const TensorView kOne = fake(DType::kF32, {1});

std::vector<Case> valid_cases() {
  using K = OutputQuantKey;
  const DType f32 = DType::kF32, ue8m0 = DType::kUE8M0, i32 = DType::kI32;
  return {
      {"bf16, no scales", kBf16, {}, {}, 512, K::kNone},
      {"bf16 [T, H, Dv], no scales", fake(DType::kBF16, {10, 4, 128}), {}, {}, 512, K::kNone},
      {"static, scale [1]", kE4m3, kOne, {}, 512, K::kFp8Static},
      {"static, scale []", kE4m3, fake(f32, {}), {}, 512, K::kFp8Static},
      {"static, [T, H, Dv] strided",
       strided(DType::kE4M3, {10, 4, 128}, {1024, 256, 1}),
       kOne,
       {},
       512,
       K::kFp8Static},
      {"group128 row-major", kE4m3, {}, strided(f32, {10, 4}, {4, 1}), 512, K::kFp8Group128},
      {"group128 column-major", kE4m3, {}, strided(f32, {10, 4}, {1, 10}), 512, K::kFp8Group128},
      {"group128 TMA-aligned", kE4m3, {}, strided(f32, {10, 4}, {1, 12}), 512, K::kFp8Group128},
      {"group128 padded rows", kE4m3, {}, strided(f32, {16, 4}, {1, 16}), 512, K::kFp8Group128},
      {"group128 ue8m0", kE4m3, {}, fake(ue8m0, {10, 4}), 512, K::kFp8Group128},
      {"group128 packed", kE4m3, {}, strided(i32, {10, 1}, {1, 12}), 512, K::kFp8Group128},
      {"group64 row-major", kE4m3, {}, strided(f32, {10, 8}, {8, 1}), 512, K::kFp8Group64},
      {"group64 column-major", kE4m3, {}, strided(f32, {10, 8}, {1, 10}), 512, K::kFp8Group64},
      {"group64 TMA-aligned", kE4m3, {}, strided(f32, {10, 8}, {1, 12}), 512, K::kFp8Group64},
      {"group64 ue8m0 column-major",
       kE4m3,
       {},
       strided(ue8m0, {10, 8}, {1, 12}),
       512,
       K::kFp8Group64},
      {"group64 packed", kE4m3, {}, strided(i32, {10, 2}, {1, 12}), 512, K::kFp8Group64},
      {"group128, [T, H, Dv] strided",
       strided(DType::kE4M3, {10, 4, 128}, {640, 160, 1}),
       {},
       fake(f32, {10, 4}),
       512,
       K::kFp8Group128},
      {"group64, row stride > W",
       strided(DType::kE4M3, {10, 512}, {1024, 1}),
       {},
       fake(f32, {10, 8}),
       512,
       K::kFp8Group64},
      {"group128, 0 rows",
       fake(DType::kE4M3, {0, 512}),
       {},
       fake(f32, {0, 4}),
       512,
       K::kFp8Group128},
      {"group128, 0 rows without data",
       fake(DType::kE4M3, {0, 512}),
       {},
       TensorView(nullptr, f32, {0, 4}),
       512,
       K::kFp8Group128},
      {"packed, 3 heads",
       fake(DType::kE4M3, {10, 384}),
       {},
       fake(i32, {10, 1}),
       384,
       K::kFp8Group128},
      {"nvfp4 linear", kFp4, kOne, fake(DType::kE4M3, {10, 32}), 512, K::kNvfp4},
      {"nvfp4 swizzled 2-d", kFp4, kOne, fake(DType::kE4M3, {128, 32}), 512, K::kNvfp4},
      {"nvfp4 swizzled 5-d", kFp4, kOne, fake(DType::kE4M3, {1, 8, 32, 4, 4}), 512, K::kNvfp4},
      {"nvfp4 swizzled, padded blocks", fake(DType::kE2M1x2, {10, 40}), kOne,
       fake(DType::kE4M3, {128, 8}), 80, K::kNvfp4},
  };
}

std::vector<Case> error_cases() {
  const DType f32 = DType::kF32, i32 = DType::kI32, e4m3 = DType::kE4M3;
  auto bad = [](std::string name, TensorView output, TensorView scale, TensorView block,
                std::int64_t dim, std::vector<std::string> needles) {
    return Case{std::move(name), output, scale, block, dim, std::nullopt, std::move(needles)};
  };
  return {
      bad("e4m3 without scales", kE4m3, {}, {}, 512,
          {"`output` dtype: expected bf16, got e4m3fn", "needs output_scale or output_block"}),
      bad("e2m1x2 without scales", kFp4, {}, {}, 512,
          {"expected bf16, got e2m1x2", "needs output_scale"}),
      bad("f32 without scales", fake(f32, {10, 512}), {}, {}, 512,
          {"`output` dtype: expected bf16, got f32"}),
      bad("scale with bf16", kBf16, kOne, {}, 512,
          {"`output` dtype: expected e4m3fn", "with output_scale, got bf16"}),
      bad("block with bf16", kBf16, {}, fake(f32, {10, 4}), 512,
          {"e2m1x2 (NVFP4) with output_block_scale, got bf16"}),
      bad("block with e5m2", fake(DType::kE5M2, {10, 512}), {}, fake(f32, {10, 4}), 512,
          {"got e5m2"}),
      bad("both scales, group FP8", kE4m3, kOne, fake(f32, {10, 4}), 512,
          {"`output_scale`: expected none with `output_block_scale`", "got f32[1]"}),
      bad("groups do not divide", kE4m3, {}, fake(f32, {10, 3}), 512,
          {"expected a group count that divides output_dim 512, got 3 groups"}),
      bad("zero groups", kE4m3, {}, fake(f32, {10, 0}), 512, {"got 0 groups"}),
      bad("group of 256", kE4m3, {}, fake(f32, {10, 2}), 512,
          {"expected groups of 64 or 128", "512 / 2 = 256"}),
      bad("group of 32", kE4m3, {}, fake(DType::kUE8M0, {10, 16}), 512, {"= 32"}),
      bad("fewer scale rows", kE4m3, {}, strided(f32, {9, 4}, {1, 12}), 512,
          {"`output_block_scale`: expected at least 10 rows", "got f32[9, 4]"}),
      bad("fewer packed rows", kE4m3, {}, fake(i32, {8, 1}), 512, {"at least 10 rows"}),
      bad("packed words fit no group size", kE4m3, {}, fake(i32, {10, 3}), 512,
          {"expected ceil(G / 4) words a row for G = 512 / 128 or 512 / 64", "got i32[10, 3]"}),
      bad("packed words fit both group sizes", fake(e4m3, {10, 256}), {}, fake(i32, {10, 1}), 256,
          {"1 packed UE8M0 words a row fit both group sizes 64 and 128", "ue8m0 bytes"}),
      bad("group scale dtype", kE4m3, {}, fake(DType::kF16, {10, 4}), 512,
          {"`output_block_scale` dtype: expected one of {f32, ue8m0, i32}, got f16"}),
      bad("group scale 3-d", kE4m3, {}, fake(f32, {10, 4, 1}), 512,
          {"`output_block_scale`: expected 2 dims"}),
      bad("output_dim not the row width", kE4m3, {}, fake(f32, {10, 4}), 256,
          {"output_dim: expected the row width of `output`, 512 values, got 256"}),
      bad("output_dim of packed fp4 bytes", kFp4, kOne, fake(e4m3, {10, 16}), 256,
          {"512 values (two e2m1 values a byte), got 256"}),
      bad("last dim not contiguous", strided(e4m3, {10, 512}, {1024, 2}), kOne, {}, 512,
          {"`output`: expected a contiguous last dim"}),
      bad("1-d output", fake(e4m3, {512}), kOne, {}, 512,
          {"`output`: expected [T, W] or [T, H, Dv]"}),
      bad("scale dtype", kE4m3, fake(DType::kBF16, {1}), {}, 512,
          {"`output_scale` dtype: expected f32, got bf16"}),
      bad("scale of 2 elements", kE4m3, fake(f32, {2}), {}, 512,
          {"`output_scale`: expected one f32 of shape [] or [1], got f32[2]"}),
      bad("scale [1, 1]", kE4m3, fake(f32, {1, 1}), {}, 512, {"expected one f32"}),
      bad("scale on another device", kE4m3, fake(f32, {1}, Device::cuda(0)), {}, 512,
          {"`output_scale`: expected a tensor on cpu", "cuda:0"}),
      bad("block scale on another device", kE4m3, {}, fake(f32, {10, 4}, Device::cuda(0)), 512,
          {"`output_block_scale`: expected a tensor on cpu"}),
      bad("nvfp4 without the global scale", kFp4, {}, fake(e4m3, {10, 32}), 512,
          {"`output_scale`: expected the global scale (one f32) of the NVFP4 `output`, got none"}),
      bad("scale alone with e2m1x2", kFp4, kOne, {}, 512,
          {"`output_block_scale`: expected e4m3 block scales with the e2m1x2 (NVFP4)"}),
      bad("nvfp4 block scale dtype", kFp4, kOne, fake(f32, {10, 32}), 512,
          {"`output_block_scale` dtype: expected e4m3fn, got f32"}),
      bad("nvfp4 block count", kFp4, kOne, fake(e4m3, {10, 16}), 512,
          {"expected NVFP4 block scales, linear [R, 32] or 128x4 swizzled [R, 32] or "
           "[R / 128, 8, 32, 4, 4]"}),
      bad("nvfp4 5-d tile shape", kFp4, kOne, fake(e4m3, {1, 8, 32, 4, 2}), 512,
          {"expected NVFP4 block scales"}),
      bad("nvfp4 fewer rows", kFp4, kOne, fake(e4m3, {9, 32}), 512, {"at least 10 rows"}),
      bad("nvfp4 fewer 5-d rows", fake(DType::kE2M1x2, {200, 256}), kOne,
          fake(e4m3, {1, 8, 32, 4, 4}), 512, {"at least 200 rows", "e4m3fn[1, 8, 32, 4, 4]"}),
      bad("nvfp4 output_dim not a multiple of 16", fake(DType::kE2M1x2, {10, 4}), kOne,
          fake(e4m3, {10, 1}), 8, {"output_dim: expected a multiple of 16", "got 8"}),
  };
}

TEST(OutputQuantKey, Strings) {
  EXPECT_EQ(to_string(OutputQuantKey::kNone), "none");
  EXPECT_EQ(to_string(OutputQuantKey::kFp8Static), "fp8_static");
  EXPECT_EQ(to_string(OutputQuantKey::kFp8Group128), "fp8_group128");
  EXPECT_EQ(to_string(OutputQuantKey::kFp8Group64), "fp8_group64");
  EXPECT_EQ(to_string(OutputQuantKey::kNvfp4), "nvfp4");
}

TEST(DetectOutputQuantKey, Keys) {
  for (const Case& c : valid_cases()) {
    SCOPED_TRACE(c.name);
    OutputQuantKey key{};
    try {
      key = detect_output_quant_key(c.output, c.scale, c.block, c.output_dim);
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
      continue;
    }
    EXPECT_EQ(to_string(key), to_string(*c.key));
  }
}

TEST(DetectOutputQuantKey, Errors) {
  for (const Case& c : error_cases()) {
    SCOPED_TRACE(c.name);
    try {
      const OutputQuantKey key = detect_output_quant_key(c.output, c.scale, c.block, c.output_dim);
      ADD_FAILURE() << "expected an fp8mla::Error, got the key " << to_string(key);
    } catch (const Error& e) {
      EXPECT_EQ(e.category(), c.category) << e.what();
      EXPECT_EQ(e.message().rfind("detect_output_quant_key: ", 0), 0u) << e.message();
      for (const std::string& needle : c.needles) {
        EXPECT_NE(e.message().find(needle), std::string::npos)
            << "message lacks '" << needle << "': " << e.message();
      }
    }
  }
}

// The attention ops read their output's key the same way (fake views: the check comes before
// any data is read). Both paths fuse every key (output_quant_fused_test.cpp,
// output_quant_cuda_test.cu).
struct OpCase {
  std::string name;
  TensorView out, scale, block;
  ErrorCategory category;
  std::vector<std::string> needles;
};

void expect_op_error(const std::string& op, const OpCase& c, const std::function<void()>& run) {
  SCOPED_TRACE(op + ": " + c.name);
  try {
    run();
    ADD_FAILURE() << "expected an fp8mla::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), c.category) << e.what();
    EXPECT_EQ(e.message().rfind(op + ": ", 0), 0u) << e.message();
    for (const std::string& needle : c.needles) {
      EXPECT_NE(e.message().find(needle), std::string::npos)
          << "message lacks '" << needle << "': " << e.message();
    }
  }
}

std::vector<OpCase> op_cases(std::int64_t tokens, std::int64_t heads) {
  const ErrorCategory invalid = ErrorCategory::kInvalidArgument;
  const TensorView e4m3 = fake(DType::kE4M3, {tokens, heads, 128});
  return {
      {"e4m3 without scales",
       e4m3,
       {},
       {},
       invalid,
       {"`out` dtype: expected bf16, got e4m3fn (a quantized output needs output_scale or "
        "output_block_scale)"}},
      {"scale with bf16",
       fake(DType::kBF16, {tokens, heads, 128}),
       kOne,
       {},
       invalid,
       {"`out` dtype: expected e4m3fn", "got bf16"}},
      {"group of 256",
       e4m3,
       {},
       fake(DType::kF32, {tokens, heads / 2}),
       invalid,
       {"`output_block_scale`: expected groups of 64 or 128"}},
  };
}

TEST(DetectOutputQuantKey, PrefillAttentionOutputErrors) {
  std::int32_t cu_q[3] = {0, 4, 10}, cu_k[3] = {0, 6, 12};
  for (const OpCase& c : op_cases(10, 4)) {
    PrefillAttentionArgs a;
    a.q = fake(DType::kBF16, {10, 4, 192});
    a.k = fake(DType::kBF16, {12, 4, 192});
    a.v = fake(DType::kBF16, {12, 4, 128});
    a.cu_seqlens_q = TensorView(cu_q, DType::kI32, {3});
    a.cu_seqlens_k = TensorView(cu_k, DType::kI32, {3});
    a.max_seqlen_q = a.max_seqlen_k = 6;
    a.softmax_scale = 0.1f;
    a.out = c.out;
    a.output_scale = c.scale;
    a.output_block_scale = c.block;
    expect_op_error("prefill_attention", c, [&] { prefill_attention(a); });
  }
}

TEST(DetectOutputQuantKey, MergeAttentionStatesOutputErrors) {
  for (const OpCase& c : op_cases(6, 4)) {
    const TensorView o = fake(DType::kBF16, {6, 4, 128});
    const TensorView lse = fake(DType::kF32, {6, 4});
    expect_op_error("merge_attention_states", c,
                    [&] { merge_attention_states(o, lse, o, lse, c.out, lse, c.scale, c.block); });
  }
  // f32 states keep their f32 `out` without scales, and name f32 when it is missing.
  const TensorView o32 = fake(DType::kF32, {4, 2, 128}), lse = fake(DType::kF32, {4, 2});
  expect_op_error(
      "merge_attention_states",
      {"e4m3 out, f32 states",
       fake(DType::kE4M3, {4, 2, 128}),
       {},
       {},
       ErrorCategory::kInvalidArgument,
       {"`out` dtype: expected f32, got e4m3fn"}},
      [&] {
        merge_attention_states(o32, lse, o32, lse, fake(DType::kE4M3, {4, 2, 128}), lse, {}, {});
      });
}

}  // namespace
}  // namespace fp8mla
