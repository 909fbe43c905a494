// CPU merge_attention_states (docs/design.md section 3, op 9) against a float64 reference: bf16 and
// f32, every argument with its own layout (lse_a [T, H] against lse_b a transposed [H, T] buffer,
// o_b a strided slice, out head-major), empty rows on one or both sides, the in-place forms,
// poisoned outputs and guard bytes; then the argument checks.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "error_test_util.hpp"
#include "fp8mla/attention.hpp"
#include "fp8mla/error.hpp"
#include "merge_states_test_util.hpp"

namespace fp8mla {
namespace {

using test::HostBuffer;
using test::MergeCase;

void run_case(const MergeCase& c) {
  SCOPED_TRACE(c.describe());
  std::vector<HostBuffer> host = test::host_buffers(c);
  const std::vector<HostBuffer> before = test::host_buffers(c);
  const std::vector<void*> bases = test::host_bases(host);
  const test::MergeRef ref = test::merge_reference(c, bases);
  c.run(bases, Device::cpu());
  test::expect_matches_reference(c, bases, ref);
  std::vector<std::vector<std::uint8_t>> after;
  for (const HostBuffer& h : host) {
    after.emplace_back(h.payload().begin(), h.payload().end());
    EXPECT_TRUE(h.guards_intact());
  }
  test::expect_rest_unchanged(c, before, after, bases);
}

TEST(MergeStatesCpu, ShapesDtypesForms) {
  test::for_each_sweep_case(20000, [](const MergeCase& c) { run_case(c); });
}

// FlashAttention-3 writes +inf for a row without keys: such states merge as empty ones, never NaN.
TEST(MergeStatesCpu, PositiveInfinityIsAnEmptyState) {
  for (int empty : {30, 100}) {
    MergeCase c;
    c.empty_as_pos_inf = true;
    c.empty_a_percent = empty;
    c.empty_b_percent = 40;
    run_case(c);
  }
}

TEST(MergeStatesCpu, LargeTokensManyHeads) {
  MergeCase c;
  c.tokens = 1000;
  c.heads = 128;
  c.dim = 128;
  run_case(c);
}

TEST(MergeStatesCpu, RandomEmptyRowsNeverNan) {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    MergeCase c;
    c.dtype = seed % 2 ? DType::kBF16 : DType::kF32;
    c.tokens = 1 + std::int64_t(seed % 9);
    c.heads = 1 + std::int64_t(seed % 5) * 7;
    c.dim = seed % 3 ? 128 : 64;
    c.empty_a_percent = int(seed * 13 % 101);
    c.empty_b_percent = int(seed * 29 % 101);
    c.form = seed % 3 ? MergeCase::Form::kGeneral : MergeCase::Form::kInplace;
    c.seed = seed;
    run_case(c);
  }
}

TEST(MergeStatesCpu, AllEmptyAndOddDims) {
  for (std::int64_t d : {1, 3, 72, 128}) {
    MergeCase c;
    c.dim = d;
    c.empty_a_percent = c.empty_b_percent = 100;
    run_case(c);
    c.empty_a_percent = 0;
    c.misalign = true;
    run_case(c);
  }
}

// ---- Argument checks ---------------------------------------------------------------------------

void* const kFake = reinterpret_cast<void*>(std::uintptr_t{0x10000});
void* const kFake2 = reinterpret_cast<void*>(std::uintptr_t{0x90000});

TensorView fake(DType dtype, std::initializer_list<std::int64_t> shape, void* at = kFake,
                Device device = Device::cpu()) {
  return TensorView(at, dtype, shape, device);
}

using test::expect_error;

struct Args {
  TensorView o_a = fake(DType::kBF16, {4, 2, 128});
  TensorView lse_a = fake(DType::kF32, {4, 2});
  TensorView o_b = fake(DType::kBF16, {4, 2, 128}, kFake2);
  TensorView lse_b = fake(DType::kF32, {4, 2}, kFake2);
  TensorView out = fake(DType::kBF16, {4, 2, 128}, kFake);
  TensorView out_lse = fake(DType::kF32, {4, 2}, kFake);
  void run() const { merge_attention_states(o_a, lse_a, o_b, lse_b, out, out_lse); }
};

void expect_bad(Args a, ErrorCategory category, std::initializer_list<std::string> needles) {
  expect_error([&] { a.run(); }, category, needles);
}

TEST(MergeStatesArgs, WrongODtype) {
  Args a;
  a.o_a = fake(DType::kF16, {4, 2, 128});
  expect_bad(a, ErrorCategory::kInvalidArgument,
             {"merge_attention_states: `o_a` dtype", "expected one of {bf16, f32}", "got f16"});
}

TEST(MergeStatesArgs, MixedDtypes) {
  Args a;
  a.o_b = fake(DType::kF32, {4, 2, 128}, kFake2);
  expect_bad(a, ErrorCategory::kInvalidArgument, {"`o_b` dtype", "got f32"});
  Args b;
  b.out = fake(DType::kF32, {4, 2, 128});
  expect_bad(b, ErrorCategory::kInvalidArgument, {"`out` dtype", "got f32"});
}

TEST(MergeStatesArgs, ShapeMismatch) {
  Args a;
  a.o_b = fake(DType::kBF16, {4, 2, 64}, kFake2);
  expect_bad(a, ErrorCategory::kInvalidArgument, {"`o_b`"});
  Args b;
  b.out = fake(DType::kBF16, {5, 2, 128});
  expect_bad(b, ErrorCategory::kInvalidArgument, {"`out`"});
  Args c;
  c.o_a = fake(DType::kBF16, {8, 128});
  expect_bad(c, ErrorCategory::kInvalidArgument, {"`o_a`"});
}

TEST(MergeStatesArgs, LseWrongDtype) {
  Args a;
  a.lse_b = fake(DType::kBF16, {4, 2}, kFake2);
  expect_bad(a, ErrorCategory::kInvalidArgument, {"`lse_b` dtype", "expected f32", "got bf16"});
}

TEST(MergeStatesArgs, LseWrongShape) {
  Args a;
  a.lse_a = fake(DType::kF32, {2, 4});
  expect_bad(a, ErrorCategory::kInvalidArgument, {"`lse_a`"});
  Args b;
  b.out_lse = fake(DType::kF32, {4, 2, 1});
  expect_bad(b, ErrorCategory::kInvalidArgument, {"`out_lse`"});
}

TEST(MergeStatesArgs, NonContiguousLastDim) {
  Args a;
  a.o_b = TensorView(kFake2, DType::kBF16, {4, 2, 128}, {512, 256, 2});
  expect_bad(a, ErrorCategory::kInvalidArgument, {"`o_b`", "contiguous last dim"});
}

TEST(MergeStatesArgs, DeviceMismatch) {
  Args a;
  a.lse_b = fake(DType::kF32, {4, 2}, kFake2, Device::cuda(0));
  expect_bad(a, ErrorCategory::kInvalidArgument, {"`lse_b`"});
}

TEST(MergeStatesArgs, OverlappingOutputs) {
  Args a;
  a.out = TensorView(kFake, DType::kBF16, {4, 2, 128}, {0, 128, 1});
  expect_bad(a, ErrorCategory::kInvalidArgument, {"`out`", "apart"});
  Args b;
  b.out_lse = TensorView(kFake, DType::kF32, {4, 2}, {1, 1});
  expect_bad(b, ErrorCategory::kInvalidArgument, {"`out_lse`", "apart"});
}

TEST(MergeStatesArgs, AliasWithOtherStrides) {
  Args a;
  a.out = TensorView(kFake, DType::kBF16, {4, 2, 128}, {128, 512, 1});
  expect_bad(a, ErrorCategory::kInvalidArgument, {"`out` aliases `o_a`"});
}

// Only (o_a, lse_a) is the in-place form: out on o_b, or out_lse on lse_b, is an overlap.
TEST(MergeStatesArgs, OutputOnTheSecondStateIsAnOverlap) {
  Args a;
  a.out = a.o_b;
  expect_bad(a, ErrorCategory::kInvalidArgument, {"`out`", "`o_b`"});
  Args b;
  b.out_lse = b.lse_b;
  expect_bad(b, ErrorCategory::kInvalidArgument, {"`out_lse`", "`lse_b`"});
}

TEST(MergeStatesArgs, EmptyCallWritesNothing) {
  HostBuffer buf(64);
  const TensorView o(buf.data(), DType::kBF16, {0, 2, 128});
  const TensorView l(buf.data(), DType::kF32, {0, 2});
  merge_attention_states(o, l, o, l, o, l);
  merge_attention_states_inplace(o, l, o, l);
  for (std::uint8_t b : buf.payload()) EXPECT_EQ(b, test::kPoison);
}

}  // namespace
}  // namespace fp8mla
