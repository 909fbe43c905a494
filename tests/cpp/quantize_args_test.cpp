// Argument checks of the quantization ops: every bad input is an fp8mla::Error of the right
// category whose message names what was expected and what was given; nothing is written when a
// call is rejected; empty calls succeed and write nothing (a dynamic scale excepted).
//
// Checks run before any memory is touched, so most views here point at a fake (aligned) address.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "error_test_util.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/quantize.hpp"
#include "quantize_test_util.hpp"

namespace fp8mla {
namespace {

using test::HostBuffer;
using test::kPoison;

using test::expect_error;
using test::fake;
using test::kFake;

const TensorView kScalar = fake(DType::kF32, {1});

// The op called with these arguments is rejected as an invalid argument whose message holds
// every one of `needles`.
void expect_fp8_rejected(std::initializer_list<std::string> needles, const TensorView& input,
                         const TensorView& out) {
  expect_error([&] { quantize_fp8(input, out, 1.0f); }, ErrorCategory::kInvalidArgument, needles);
}

void expect_group_rejected(std::initializer_list<std::string> needles, const TensorView& input,
                           const TensorView& out, const TensorView& scales,
                           const GroupQuantOptions& options = {}) {
  expect_error([&] { quantize_fp8_per_token_group(input, out, scales, options); },
               ErrorCategory::kInvalidArgument, needles);
}

void expect_nvfp4_rejected(std::initializer_list<std::string> needles, const TensorView& input,
                           const TensorView& out, const TensorView& block_scales,
                           const TensorView& global_scale,
                           Nvfp4ScaleLayout layout = Nvfp4ScaleLayout::kSwizzled128x4) {
  expect_error([&] { quantize_nvfp4(input, out, block_scales, global_scale, layout); },
               ErrorCategory::kInvalidArgument, needles);
}

TEST(QuantizeArgs, WrongInputDtype) {
  expect_error(
      [] {
        quantize_fp8(fake(DType::kI32, {4, 64}), fake(DType::kE4M3, {4, 64}), 1.0f);
      },
      ErrorCategory::kInvalidArgument,
      {"quantize_fp8: `input` dtype", "expected one of {bf16, f16, f32}", "got i32"});
  expect_error(
      [] {
        quantize_nvfp4(fake(DType::kF32, {4, 64}), fake(DType::kE2M1x2, {4, 32}),
                       fake(DType::kE4M3, {128, 4}), kScalar);
      },
      ErrorCategory::kInvalidArgument,
      {"quantize_nvfp4: `input` dtype", "expected one of {bf16, f16}", "got f32"});
}

TEST(QuantizeArgs, WrongOutDtype) {
  expect_error(
      [] {
        quantize_fp8(fake(DType::kBF16, {4, 64}), fake(DType::kBF16, {4, 64}), 1.0f);
      },
      ErrorCategory::kInvalidArgument,
      {"`out` dtype", "expected one of {e4m3fn, e5m2}", "got bf16"});
  expect_nvfp4_rejected({"`out` dtype", "expected e2m1x2", "got e4m3fn"},
                        fake(DType::kBF16, {4, 64}), fake(DType::kE4M3, {4, 32}),
                        fake(DType::kE4M3, {128, 4}), kScalar);
}

TEST(QuantizeArgs, GroupQuantRejectsE5m2Out) {
  expect_group_rejected(
      {"quantize_fp8_per_token_group: `out` dtype", "expected e4m3fn", "got e5m2"},
      fake(DType::kBF16, {4, 128}), fake(DType::kE5M2, {4, 128}), fake(DType::kF32, {4, 1}));
}

TEST(QuantizeArgs, OutShapeMismatch) {
  expect_fp8_rejected(
      {"`out`: expected the shape of `input`", "bf16[4, 576]", "got e4m3fn[4, 512]"},
      fake(DType::kBF16, {4, 576}), fake(DType::kE4M3, {4, 512}));
  // The same element count in another shape is still a mismatch.
  expect_fp8_rejected({"expected the shape of `input`", "got e4m3fn[2, 2, 576]"},
                      fake(DType::kBF16, {4, 576}), fake(DType::kE4M3, {2, 2, 576}));
}

TEST(QuantizeArgs, NonFoldableInput) {
  // Dim 1 spans 3 * 64 = 192 elements, but dim 0 steps 200: no single row stride.
  const TensorView input(kFake, DType::kBF16, {4, 3, 64}, {200, 64, 1});
  expect_fp8_rejected(
      {"quantize_fp8: `input`", "cannot fold", "dim 0 has stride 200, expected 192"}, input,
      fake(DType::kE4M3, {4, 3, 64}));
}

TEST(QuantizeArgs, LastDimNotContiguous) {
  const TensorView input(kFake, DType::kBF16, {4, 64}, {128, 2});
  expect_fp8_rejected(
      {"`input`", "expected the last dim to be contiguous (stride 1)", "strides [128, 2]"}, input,
      fake(DType::kE4M3, {4, 64}));
  const TensorView out(kFake, DType::kE4M3, {4, 64}, {128, 2});
  expect_fp8_rejected({"`out`", "contiguous (stride 1)"}, fake(DType::kBF16, {4, 64}), out);
}

TEST(QuantizeArgs, GroupSize96IsUnsupported) {
  expect_error(
      [] {
        quantize_fp8_per_token_group(fake(DType::kBF16, {4, 192}), fake(DType::kE4M3, {4, 192}),
                                     fake(DType::kF32, {4, 2}), {96});
      },
      ErrorCategory::kUnsupported, {"expected group_size 64 or 128", "got 96"});
}

TEST(QuantizeArgs, ColsNotMultipleOfGroupSize) {
  expect_group_rejected(
      {"`input`: expected the last dim to be a multiple of group_size 64", "got bf16[4, 200]"},
      fake(DType::kBF16, {4, 200}), fake(DType::kE4M3, {4, 200}), fake(DType::kF32, {4, 3}), {64});
}

TEST(QuantizeArgs, EpsMustBePositive) {
  expect_group_rejected({"expected a finite eps > 0", "got 0"}, fake(DType::kBF16, {4, 128}),
                        fake(DType::kE4M3, {4, 128}), fake(DType::kF32, {4, 1}), {128, 0.0f});
}

TEST(QuantizeArgs, ScalesDtypeWrong) {
  expect_group_rejected({"`scales` dtype", "expected one of {f32, ue8m0, i32}", "got bf16"},
                        fake(DType::kBF16, {4, 128}), fake(DType::kE4M3, {4, 128}),
                        fake(DType::kBF16, {4, 1}));
}

TEST(QuantizeArgs, ScalesShapeWrong) {
  const TensorView input = fake(DType::kBF16, {4, 192}), out = fake(DType::kE4M3, {4, 192});
  expect_group_rejected({"`scales`: expected [4, 3]", "3 groups of 64 per row", "got f32[4, 2]"},
                        input, out, fake(DType::kF32, {4, 2}), {64});
  expect_group_rejected({"`scales`: expected 2 dims", "got f32[12]"}, input, out,
                        fake(DType::kF32, {12}), {64});
}

TEST(QuantizeArgs, PackedScalesShapeWrong) {
  // 3 groups fit one packed word per row; one word per group is wrong.
  expect_group_rejected(
      {"`scales`: expected [4, 1]", "packed UE8M0 words for 3 groups of 64", "got i32[4, 3]"},
      fake(DType::kBF16, {4, 192}), fake(DType::kE4M3, {4, 192}), fake(DType::kI32, {4, 3}), {64});
}

TEST(QuantizeArgs, OverlappingScaleStrides) {
  // Row stride 1 and column stride 2 over 4 rows: scale (2, 0) and scale (0, 1) share memory.
  const TensorView scales(kFake, DType::kF32, {4, 3}, {1, 2});
  expect_group_rejected(
      {"`scales`: expected strides that keep every scale apart", "strides [1, 2]"},
      fake(DType::kBF16, {4, 192}), fake(DType::kE4M3, {4, 192}), scales, {64});
}

TEST(QuantizeArgs, MisalignedInputPointer) {
  void* odd = static_cast<char*>(kFake) + 1;
  expect_fp8_rejected({"`input`: expected a 2-byte aligned data pointer", "got address 0x10001"},
                      TensorView(odd, DType::kBF16, {4, 64}), fake(DType::kE4M3, {4, 64}));
  expect_nvfp4_rejected({"`input`: expected a 2-byte aligned", "0x10001"},
                        TensorView(odd, DType::kF16, {4, 64}), fake(DType::kE2M1x2, {4, 32}),
                        fake(DType::kE4M3, {128, 4}), kScalar);
}

TEST(QuantizeArgs, ScaleInvWithTwoElements) {
  expect_error(
      [] {
        quantize_fp8(fake(DType::kBF16, {4, 64}), fake(DType::kE4M3, {4, 64}),
                     fake(DType::kF32, {2}));
      },
      ErrorCategory::kInvalidArgument,
      {"`scale_inv`: expected one f32 of shape [] or [1]", "got f32[2]"});
  expect_error(
      [] {
        quantize_fp8_dynamic(fake(DType::kBF16, {4, 64}), fake(DType::kE4M3, {4, 64}),
                             fake(DType::kF32, {1, 1}));
      },
      ErrorCategory::kInvalidArgument, {"`scale`: expected one f32", "got f32[1, 1]"});
}

TEST(QuantizeArgs, GlobalScaleWrongDtype) {
  expect_nvfp4_rejected({"quantize_nvfp4: `global_scale` dtype", "expected f32", "got bf16"},
                        fake(DType::kBF16, {4, 64}), fake(DType::kE2M1x2, {4, 32}),
                        fake(DType::kE4M3, {128, 4}), fake(DType::kBF16, {1}));
}

TEST(QuantizeArgs, Nvfp4KNotMultipleOf16) {
  expect_nvfp4_rejected(
      {"`input`: expected the last dim to be a multiple of 16", "got bf16[4, 40]"},
      fake(DType::kBF16, {4, 40}), fake(DType::kE2M1x2, {4, 20}), fake(DType::kE4M3, {128, 4}),
      kScalar);
}

TEST(QuantizeArgs, Nvfp4OutShapeWrong) {
  expect_nvfp4_rejected({"`out`: expected the shape of `input` with the last dim halved",
                         "bf16[4, 64]", "got e2m1x2[4, 64]"},
                        fake(DType::kBF16, {4, 64}), fake(DType::kE2M1x2, {4, 64}),
                        fake(DType::kE4M3, {128, 4}), kScalar);
}

TEST(QuantizeArgs, Nvfp4SwizzledScalesWrongShape) {
  // K = 80 is 5 blocks: two tiles of 4 along K.
  expect_nvfp4_rejected(
      {"`block_scales` (128x4 swizzled layout): expected contiguous [1, 2, 32, 4, 4] or [128, 8]",
       "got e4m3fn[1, 1, 32, 4, 4]"},
      fake(DType::kBF16, {4, 80}), fake(DType::kE2M1x2, {4, 40}),
      fake(DType::kE4M3, {1, 1, 32, 4, 4}), kScalar);
  expect_nvfp4_rejected({"[1, 2, 32, 4, 4] or [128, 8]", "got e4m3fn[4, 5]"},
                        fake(DType::kBF16, {4, 80}), fake(DType::kE2M1x2, {4, 40}),
                        fake(DType::kE4M3, {4, 5}), kScalar);
}

TEST(QuantizeArgs, Nvfp4SwizzledScalesNotContiguous) {
  const TensorView scales(kFake, DType::kE4M3, {128, 8}, {16, 1});
  expect_nvfp4_rejected({"128x4 swizzled layout): expected contiguous", "strides [16, 1]"},
                        fake(DType::kBF16, {4, 80}), fake(DType::kE2M1x2, {4, 40}), scales,
                        kScalar);
}

TEST(QuantizeArgs, Nvfp4LinearScalesWrongShape) {
  expect_nvfp4_rejected({"`block_scales` (linear layout): expected [4, 5]", "got e4m3fn[4, 4]"},
                        fake(DType::kBF16, {4, 80}), fake(DType::kE2M1x2, {4, 40}),
                        fake(DType::kE4M3, {4, 4}), kScalar, Nvfp4ScaleLayout::kLinear);
}

// Detected before anything about CUDA is asked, in every build.
TEST(QuantizeArgs, DeviceMismatch) {
  const Device gpu = Device::cuda(0);
  expect_fp8_rejected({"`out`: expected a tensor on cuda:0, the device of the other tensors",
                       "e4m3fn[4, 64] strides [64, 1] on cpu"},
                      fake(DType::kBF16, {4, 64}, gpu), fake(DType::kE4M3, {4, 64}));
  expect_error(
      [&] {
        quantize_fp8_dynamic(fake(DType::kBF16, {4, 64}, gpu), fake(DType::kE4M3, {4, 64}, gpu),
                             kScalar);
      },
      ErrorCategory::kInvalidArgument, {"`scale`: expected a tensor on cuda:0", "on cpu"});
  expect_group_rejected(
      {"`scales`: expected a tensor on cpu, the device of the other tensors", "on cuda:0"},
      fake(DType::kBF16, {4, 128}), fake(DType::kE4M3, {4, 128}), fake(DType::kF32, {4, 1}, gpu));
  expect_nvfp4_rejected(
      {"`block_scales`: expected a tensor on cuda:0, the device of the other tensors",
       "e4m3fn[128, 4]", "on cpu"},
      fake(DType::kBF16, {4, 64}, gpu), fake(DType::kE2M1x2, {4, 32}, gpu),
      fake(DType::kE4M3, {128, 4}), fake(DType::kF32, {1}, gpu));
}

TEST(QuantizeArgs, CudaTensorsWithoutCuda) {
#if defined(FP8MLA_WITH_CUDA)
  GTEST_SKIP() << "this build has CUDA: CUDA tensors are valid (quantize_cuda_test runs them)";
#else
  const Device gpu = Device::cuda(0);
  expect_error(
      [&] {
        quantize_fp8(fake(DType::kBF16, {4, 64}, gpu), fake(DType::kE4M3, {4, 64}, gpu), 1.0f);
      },
      ErrorCategory::kUnsupported, {"tensors are on cuda:0", "built without CUDA"});
  // Even an empty call: the device is checked before the row count.
  expect_error(
      [&] {
        quantize_fp8_dynamic(fake(DType::kBF16, {0, 64}, gpu), fake(DType::kE4M3, {0, 64}, gpu),
                             fake(DType::kF32, {1}, gpu));
      },
      ErrorCategory::kUnsupported, {"built without CUDA"});
#endif
}

// ---- Nothing written on error; empty calls
// ---------------------------------------------------------

::testing::AssertionResult untouched(const HostBuffer& b, const char* what) {
  const std::vector<std::uint8_t> poison(b.bytes(), kPoison);
  const ::testing::AssertionResult same = test::same_bytes(b.payload(), poison, what);
  if (!same) return same;
  return b.guards_intact();
}

// Each call fails on its last check, after the outputs were seen as valid.
TEST(QuantizeArgs, NothingWrittenWhenRejected) {
  HostBuffer in(4 * 3 * 64 * 2), out(4 * 200), scale(4), scales(64), global(4);
  test::fill_input(in.data(), DType::kBF16, 4 * 3 * 64, test::Data::kRandom, 1);
  const TensorView input(in.data(), DType::kBF16, {4, 3, 64});
  const TensorView unfoldable_out(out.data(), DType::kE4M3, {4, 3, 64}, {200, 64, 1});
  const TensorView scale_view(scale.data(), DType::kF32, {1});

  EXPECT_THROW(quantize_fp8(input, unfoldable_out, 1.0f), Error);
  EXPECT_THROW(quantize_fp8_dynamic(input, unfoldable_out, scale_view), Error);
  EXPECT_THROW(quantize_fp8(input, TensorView(out.data(), DType::kE4M3, {4, 3, 64}),
                            TensorView(scale.data(), DType::kF32, {2})),
               Error);
  EXPECT_THROW(
      quantize_fp8_per_token_group(input, TensorView(out.data(), DType::kE4M3, {4, 3, 64}),
                                   TensorView(scales.data(), DType::kF32, {12, 1}, {0, 1}), {64}),
      Error);
  EXPECT_THROW(quantize_nvfp4(input, TensorView(out.data(), DType::kE2M1x2, {4, 3, 32}),
                              TensorView(scales.data(), DType::kE4M3, {16, 4}), scale_view),
               Error);
  EXPECT_TRUE(untouched(out, "out"));
  EXPECT_TRUE(untouched(scale, "scale"));
  EXPECT_TRUE(untouched(scales, "scales"));
}

TEST(QuantizeArgs, ZeroRowsWriteNothing) {
  HostBuffer in(64), out(64), scales(64), scale(4);
  const TensorView scale_view(scale.data(), DType::kF32, {});
  for (std::vector<std::int64_t> shape :
       {std::vector<std::int64_t>{0, 576}, std::vector<std::int64_t>{3, 0, 576},
        std::vector<std::int64_t>{5, 0}}) {
    SCOPED_TRACE(test::shape_string(shape));
    const TensorView input(in.data(), DType::kBF16, shape), output(out.data(), DType::kE4M3, shape);
    EXPECT_NO_THROW(quantize_fp8(input, output, 1.0f));
    EXPECT_NO_THROW(quantize_fp8(input, output, scale_view));
  }
  EXPECT_TRUE(untouched(out, "out"));

  const TensorView input(in.data(), DType::kBF16, {0, 192}),
      output(out.data(), DType::kE4M3, {0, 192});
  EXPECT_NO_THROW(quantize_fp8_per_token_group(
      input, output, TensorView(scales.data(), DType::kF32, {0, 3}), {64}));
  EXPECT_NO_THROW(quantize_fp8_per_token_group(
      input, output, TensorView(scales.data(), DType::kI32, {0, 1}, {1, 4}), {64}));
  const TensorView nvfp4_in(in.data(), DType::kBF16, {0, 80});
  const TensorView nvfp4_out(out.data(), DType::kE2M1x2, {0, 40});
  test::store_f32(scale.data(), DType::kF32, 0, 1.0f);
  EXPECT_NO_THROW(quantize_nvfp4(
      nvfp4_in, nvfp4_out, TensorView(scales.data(), DType::kE4M3, {0, 2, 32, 4, 4}), scale_view));
  EXPECT_NO_THROW(quantize_nvfp4(nvfp4_in, nvfp4_out,
                                 TensorView(scales.data(), DType::kE4M3, {0, 8}), scale_view));
  EXPECT_NO_THROW(quantize_nvfp4(nvfp4_in, nvfp4_out,
                                 TensorView(scales.data(), DType::kE4M3, {0, 5}), scale_view,
                                 Nvfp4ScaleLayout::kLinear));
  EXPECT_TRUE(untouched(out, "out"));
  EXPECT_TRUE(untouched(scales, "scales"));

  // Rows of width 0: their scale tensors keep a row (of no groups) for each of the 5 rows.
  const TensorView narrow_in(in.data(), DType::kBF16, {5, 0});
  EXPECT_NO_THROW(
      quantize_fp8_per_token_group(narrow_in, TensorView(out.data(), DType::kE4M3, {5, 0}),
                                   TensorView(scales.data(), DType::kF32, {5, 0}), {128}));
  EXPECT_THROW(quantize_fp8_per_token_group(narrow_in, TensorView(out.data(), DType::kE4M3, {5, 0}),
                                            TensorView(scales.data(), DType::kF32, {0, 0}), {128}),
               Error);
  const TensorView narrow_fp4(out.data(), DType::kE2M1x2, {5, 0});
  EXPECT_NO_THROW(quantize_nvfp4(narrow_in, narrow_fp4,
                                 TensorView(scales.data(), DType::kE4M3, {5, 0}), scale_view,
                                 Nvfp4ScaleLayout::kLinear));
  EXPECT_NO_THROW(quantize_nvfp4(narrow_in, narrow_fp4,
                                 TensorView(scales.data(), DType::kE4M3, {128, 0}), scale_view));
  EXPECT_TRUE(untouched(out, "out"));
  EXPECT_TRUE(untouched(scales, "scales"));

  // An empty input still has a defined dynamic scale: amax 0 gives the floor.
  scale.fill(kPoison);
  EXPECT_NO_THROW(quantize_fp8_dynamic(input, output, scale_view));
  float got = 0.0f;
  std::memcpy(&got, scale.data(), 4);
  EXPECT_EQ(got, kMinDynamicScale);
  EXPECT_TRUE(untouched(out, "out"));
  EXPECT_TRUE(scale.guards_intact());
}

// Column-major scales of 0 rows have column stride 0 (strides (1, M)); with no scales at all,
// none can overlap, so the call is as valid as any other empty call.
TEST(QuantizeArgs, ZeroRowsColumnMajorScales) {
  HostBuffer scales(16);
  const TensorView input(kFake, DType::kBF16, {0, 192}), out(kFake, DType::kE4M3, {0, 192});
  EXPECT_NO_THROW(quantize_fp8_per_token_group(
      input, out, TensorView(scales.data(), DType::kF32, {0, 3}, {1, 0}), {64}));
  EXPECT_NO_THROW(quantize_fp8_per_token_group(
      input, out, TensorView(scales.data(), DType::kUE8M0, {0, 3}, {1, 0}), {64}));
  EXPECT_TRUE(untouched(scales, "scales"));
}

}  // namespace
}  // namespace fp8mla
