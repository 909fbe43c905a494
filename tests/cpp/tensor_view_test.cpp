#include "fp8mla/tensor_view.hpp"

#include <gtest/gtest.h>

#include <string>

#include "fp8mla/error.hpp"

namespace fp8mla {
namespace {

// Runs `fn`, expects an Error of `category` whose message contains every one of `needles`.
template <typename Fn>
void expect_error(Fn fn, ErrorCategory category, std::initializer_list<const char*> needles) {
  try {
    fn();
    ADD_FAILURE() << "expected an fp8mla::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), category) << e.what();
    for (const char* needle : needles) {
      EXPECT_NE(e.message().find(needle), std::string::npos)
          << "message lacks '" << needle << "': " << e.message();
    }
  }
}

TEST(TensorView, ContiguousStridesAndNumel) {
  TensorView t(nullptr, DType::kBF16, {4, 128, 256});
  EXPECT_EQ(t.ndim(), 3);
  EXPECT_EQ(t.numel(), 4 * 128 * 256);
  EXPECT_EQ(t.stride(0), 128 * 256);
  EXPECT_EQ(t.stride(1), 256);
  EXPECT_EQ(t.stride(-1), 1);
  EXPECT_EQ(t.size(-2), 128);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.describe(), "bf16[4, 128, 256] strides [32768, 256, 1] on cpu");
}

TEST(TensorView, DtypeSizesAndNames) {
  EXPECT_EQ(dtype_size(DType::kBF16), 2);
  EXPECT_EQ(dtype_size(DType::kF32), 4);
  EXPECT_EQ(dtype_size(DType::kE4M3), 1);
  EXPECT_EQ(dtype_size(DType::kE2M1x2), 1);
  EXPECT_EQ(dtype_size(DType::kI64), 8);
  EXPECT_EQ(dtype_name(DType::kE4M3), "e4m3fn");
  EXPECT_EQ(dtype_name(DType::kUE8M0), "ue8m0");
}

TEST(TensorView, DeviceToString) {
  EXPECT_EQ(to_string(Device::cpu()), "cpu");
  EXPECT_EQ(to_string(Device::cuda(3)), "cuda:3");
  EXPECT_NE(Device::cpu(), Device::cuda(0));
}

TEST(TensorView, NarrowMovesDataPointerAndKeepsStrides) {
  alignas(16) std::uint16_t storage[2 * 3 * 256];
  TensorView kv(storage, DType::kBF16, {2, 3, 256});
  TensorView rope = kv.narrow(-1, 128, 64);
  EXPECT_EQ(rope.data(), static_cast<void*>(storage + 128));
  EXPECT_EQ(rope.size(-1), 64);
  EXPECT_EQ(rope.stride(1), 256);
  EXPECT_FALSE(rope.is_contiguous());
  expect_error([&] { kv.narrow(2, 200, 64); }, ErrorCategory::kOutOfRange, {"[200, 264)", "256"});
}

TEST(TensorView, Size1DimsDoNotBreakContiguity) {
  TensorView t(nullptr, DType::kF32, {4, 1, 8}, {8, 12345, 1});
  EXPECT_TRUE(t.is_contiguous());
}

TEST(TensorView, RejectsBadShapes) {
  const std::int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  expect_error([&] { TensorView(nullptr, DType::kF32, std::span<const std::int64_t>(nine)); },
               ErrorCategory::kInvalidArgument, {"at most 8 dims", "got 9"});
  expect_error(
      [] {
        TensorView(nullptr, DType::kF32, {2, -1});
      },
      ErrorCategory::kInvalidArgument, {"non-negative sizes", "[2, -1]"});
  expect_error(
      [] {
        TensorView(nullptr, DType::kF32, {2, 3}, {3, -1});
      },
      ErrorCategory::kInvalidArgument, {"non-negative strides"});
  expect_error(
      [] {
        TensorView(nullptr, DType::kF32, {2, 3}, {3});
      },
      ErrorCategory::kInvalidArgument, {"one stride per dim (2)", "got 1"});
  TensorView t(nullptr, DType::kF32, {2, 3});
  expect_error([&] { (void)t.size(2); }, ErrorCategory::kOutOfRange, {"dim 2", "2-d"});
}

TEST(FoldRows, ContiguousFoldsEverythingButTheLastDim) {
  const RowLayout r = fold_rows(TensorView(nullptr, DType::kBF16, {5, 16, 192}), "q");
  EXPECT_EQ(r.rows, 80);
  EXPECT_EQ(r.cols, 192);
  EXPECT_EQ(r.row_stride, 192);
}

TEST(FoldRows, SliceOfTheLastDimFoldsWithTheParentRowStride) {
  // kv[..., 128:] of a [T, H, 256] tensor: T*H rows of 128 with row stride 256.
  TensorView kv(nullptr, DType::kBF16, {7, 16, 256});
  const RowLayout r = fold_rows(kv.narrow(-1, 128, 128), "kv[..., 128:]");
  EXPECT_EQ(r.rows, 7 * 16);
  EXPECT_EQ(r.cols, 128);
  EXPECT_EQ(r.row_stride, 256);
}

TEST(FoldRows, Size1DimsAndPaddedRowsFold) {
  const RowLayout r = fold_rows(TensorView(nullptr, DType::kF32, {3, 1, 100}, {640, 7, 1}), "x");
  EXPECT_EQ(r.rows, 3);
  EXPECT_EQ(r.row_stride, 640);
  const RowLayout one = fold_rows(TensorView(nullptr, DType::kF32, {576}), "row");
  EXPECT_EQ(one.rows, 1);
  EXPECT_EQ(one.cols, 576);
  const RowLayout scalar =
      fold_rows(TensorView(nullptr, DType::kF32, std::span<const std::int64_t>{}), "s");
  EXPECT_EQ(scalar.rows * scalar.cols, 1);
}

TEST(FoldRows, EmptyViewsFoldToZeroRows) {
  const RowLayout r = fold_rows(TensorView(nullptr, DType::kBF16, {0, 16, 128}, {9, 9, 9}), "x");
  EXPECT_EQ(r.rows, 0);
  EXPECT_EQ(r.cols, 128);
}

TEST(FoldRows, NonFoldableLayoutsNameTheDimAndStrides) {
  // A head-major view of a token-major buffer: dims 0 and 1 are swapped.
  TensorView transposed(nullptr, DType::kBF16, {16, 7, 128}, {128, 16 * 128, 1});
  expect_error(
      [&] { fold_rows(transposed, "quantize_fp8: input"); }, ErrorCategory::kInvalidArgument,
      {"quantize_fp8: input", "dim 0 has stride 128, expected 14336", "strides [128, 2048, 1]"});
  TensorView column(nullptr, DType::kF32, {4, 8}, {1, 4});
  expect_error([&] { fold_rows(column, "x"); }, ErrorCategory::kInvalidArgument,
               {"last dim to be contiguous", "strides [1, 4]"});
  TensorView overlapping(nullptr, DType::kF32, {4, 8}, {4, 1});
  expect_error([&] { fold_rows(overlapping, "x"); }, ErrorCategory::kInvalidArgument,
               {"not to overlap", "stride 4", "8 wide"});
}

TEST(Error, MessageCategoryAndLocation) {
  const Error e(ErrorCategory::kUnsupported, "expected group size 64 or 128, got 96");
  EXPECT_EQ(e.category(), ErrorCategory::kUnsupported);
  EXPECT_EQ(e.message(), "expected group size 64 or 128, got 96");
  EXPECT_NE(std::string(e.what()).find("unsupported error: expected group size"),
            std::string::npos);
  EXPECT_NE(std::string(e.where().file_name()).find("tensor_view_test.cpp"), std::string::npos);
  EXPECT_EQ(concat("a", 1, '-', 2.5), "a1-2.5");
}

// An error raised inside the library names its file as a path in the source tree, whichever
// directory the library was built from.
TEST(Error, LibraryLocationIsRelativeToTheSourceTree) {
  TensorView column(nullptr, DType::kF32, {4, 8}, {1, 4});
  try {
    fold_rows(column, "x");
    FAIL() << "fold_rows accepted a column-major view";
  } catch (const Error& e) {
    const std::string file = e.where().file_name();
    EXPECT_EQ(file.rfind("src/", 0), 0u) << file;
    EXPECT_NE(std::string(e.what()).find(concat("[", file, ":")), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fp8mla
