#include "core/check.hpp"

#include <gtest/gtest.h>

#include <string>

namespace fp8mla {
namespace {

std::string message_of(auto fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.message();
  }
  return "<no error>";
}

const ArgChecker kCheck("quantize_fp8");

TEST(ArgChecker, AcceptsValidArguments) {
  alignas(16) std::uint16_t storage[4 * 256];
  TensorView t(storage, DType::kBF16, {4, 256});
  kCheck.dtype(t, "input", {DType::kBF16, DType::kF16});
  kCheck.ndim(t, "input", 2);
  kCheck.ndim(t, "input", 1, 8);
  kCheck.size(t, "input", -1, 256);
  kCheck.device(t, "input", Device::cpu());
  kCheck.aligned(t, "input", 16);
  EXPECT_EQ(kCheck.rows(t, "input").rows, 4);
}

TEST(ArgChecker, MessagesSayExpectedAndGiven) {
  TensorView t(nullptr, DType::kBF16, {4, 256});
  EXPECT_EQ(message_of([&] {
              kCheck.dtype(t, "out", {DType::kE4M3, DType::kE5M2});
            }),
            "quantize_fp8: `out` dtype: expected one of {e4m3fn, e5m2}, got bf16");
  EXPECT_EQ(message_of([&] { kCheck.dtype(t, "scale", {DType::kF32}); }),
            "quantize_fp8: `scale` dtype: expected f32, got bf16");
  EXPECT_EQ(message_of([&] { kCheck.ndim(t, "q", 3); }),
            "quantize_fp8: `q`: expected 3 dims, got bf16[4, 256] strides [256, 1] on cpu");
  EXPECT_EQ(message_of([&] { kCheck.size(t, "q", 1, 192); }),
            "quantize_fp8: `q` dim 1: expected size 192, got bf16[4, 256] strides [256, 1] on cpu");
  EXPECT_EQ(
      message_of([&] { kCheck.device(t, "q", Device::cuda(0)); }),
      "quantize_fp8: `q`: expected a tensor on cuda:0, got bf16[4, 256] strides [256, 1] on cpu");
  EXPECT_EQ(message_of([&] { kCheck.require(false, ErrorCategory::kUnsupported, "group 96"); }),
            "quantize_fp8: group 96");
}

TEST(ArgChecker, AlignmentOfPointerAndStrides) {
  alignas(16) std::uint8_t storage[1024];
  TensorView misaligned(storage + 2, DType::kBF16, {4, 64});
  EXPECT_NE(message_of([&] {
              kCheck.aligned(misaligned, "x", 16);
            }).find("expected a 16-byte aligned data pointer"),
            std::string::npos);
  TensorView odd_rows(storage, DType::kBF16, {4, 60}, {60, 1});  // 120-byte rows
  EXPECT_NE(message_of([&] {
              kCheck.aligned(odd_rows, "x", 16);
            }).find("expected dim 0's stride to be a multiple of 16 bytes, got 60 elements"),
            std::string::npos);
}

TEST(ArgChecker, RowsErrorsNameOpAndArgument) {
  TensorView column(nullptr, DType::kF32, {4, 8}, {1, 4});
  EXPECT_NE(message_of([&] {
              kCheck.rows(column, "input");
            }).find("quantize_fp8: `input`: expected the last dim to be contiguous"),
            std::string::npos);
}

TEST(ArgChecker, ContiguousLastDimAcceptsEmptyViews) {
  kCheck.contiguous_last_dim(TensorView(nullptr, DType::kF32, {4, 8}), "x");
  kCheck.contiguous_last_dim(TensorView(nullptr, DType::kF32, {0, 64}, {0, 0}), "empty");
  kCheck.contiguous_last_dim(TensorView(nullptr, DType::kF32, {4, 1}, {1, 7}), "column");
  EXPECT_EQ(message_of([] {
              kCheck.contiguous_last_dim(TensorView(nullptr, DType::kF32, {4, 8}, {1, 4}), "x");
            }),
            "quantize_fp8: `x`: expected a contiguous last dim (stride 1), got f32[4, 8] strides "
            "[1, 4] on cpu");
}

}  // namespace
}  // namespace fp8mla
