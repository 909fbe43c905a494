// The bad inputs of the quantization ops (fp8mla/quantize.hpp) and of the views every op takes
// (fp8mla/tensor_view.hpp): dtype, shape, stride, alignment, device, huge sizes, bad scales and
// outputs over their inputs.
#include <cmath>
#include <limits>
#include <vector>

#include "bad_inputs_catalogue.hpp"
#include "fp8mla/quantize.hpp"

namespace fp8mla::test {
namespace {

constexpr auto kInvalid = ErrorCategory::kInvalidArgument;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// quantize_fp8 of a valid bf16 [4, 64] input into `out` at scale_inv.
void fp8_into(Arena& a, const TensorView& out, float scale_inv = 1.0f) {
  quantize_fp8(a.input(DType::kBF16, {4, 64}), out, scale_inv);
}

std::vector<BadInput> fp8_bad_inputs() {
  return {
      {"quantize_fp8: i32 input",
       [](Arena& a) {
         quantize_fp8(a.input(DType::kI32, {4, 64}), a.output(DType::kE4M3, {4, 64}), 1.0f);
       },
       kInvalid,
       {"`input` dtype", "expected one of {bf16, f16, f32}", "got i32"}},
      {"quantize_fp8: bf16 out",
       [](Arena& a) {
         fp8_into(a, a.output(DType::kBF16, {4, 64}));
       },
       kInvalid,
       {"`out` dtype", "expected one of {e4m3fn, e5m2}", "got bf16"}},
      {"quantize_fp8: out of another shape",
       [](Arena& a) {
         fp8_into(a, a.output(DType::kE4M3, {4, 32}));
       },
       kInvalid,
       {"expected the shape of `input`", "bf16[4, 64]", "got e4m3fn[4, 32]"}},
      {"quantize_fp8: misaligned input",
       [](Arena& a) {
         quantize_fp8(a.input(DType::kBF16, {4, 64}, {.byte_offset = 1}),
                      a.output(DType::kE4M3, {4, 64}), 1.0f);
       },
       kInvalid,
       {"`input`: expected a 2-byte aligned data pointer", "got address"}},
      {"quantize_fp8: strided last dim of out",
       [](Arena& a) {
         fp8_into(a, a.output(DType::kE4M3, {4, 64}, {.strides = {128, 2}}));
       },
       kInvalid,
       {"`out`", "contiguous (stride 1)", "strides [128, 2]"}},
      {"quantize_fp8: input that does not fold onto rows",
       [](Arena& a) {
         quantize_fp8(a.input(DType::kBF16, {4, 3, 64}, {.strides = {200, 64, 1}}),
                      a.output(DType::kE4M3, {4, 3, 64}), 1.0f);
       },
       kInvalid,
       {"`input`", "cannot fold", "dim 0 has stride 200, expected 192"}},
      {"quantize_fp8: out on cuda:0",
       [](Arena& a) {
         fp8_into(a, a.output(DType::kE4M3, {4, 64}, {.device = Device::cuda(0)}));
       },
       kInvalid,
       {"`out`: expected a tensor on cpu", "on cuda:0"}},
      {"quantize_fp8: NaN scale_inv",
       [](Arena& a) {
         fp8_into(a, a.output(DType::kE4M3, {4, 64}), kNaN);
       },
       kInvalid,
       {"`scale_inv`: expected a finite scale > 0", "got nan"}},
      {"quantize_fp8: infinite scale_inv",
       [](Arena& a) {
         fp8_into(a, a.output(DType::kE4M3, {4, 64}), kInf);
       },
       kInvalid,
       {"`scale_inv`: expected a finite scale > 0", "got inf"}},
      {"quantize_fp8: zero scale_inv",
       [](Arena& a) {
         fp8_into(a, a.output(DType::kE4M3, {4, 64}), 0.0f);
       },
       kInvalid,
       {"`scale_inv`: expected a finite scale > 0", "got 0"}},
      {"quantize_fp8: negative scale_inv",
       [](Arena& a) {
         fp8_into(a, a.output(DType::kE4M3, {4, 64}), -2.0f);
       },
       kInvalid,
       {"`scale_inv`: expected a finite scale > 0", "got -2"}},
      {"quantize_fp8: scale_inv tensor of two elements",
       [](Arena& a) {
         quantize_fp8(a.input(DType::kBF16, {4, 64}), a.output(DType::kE4M3, {4, 64}),
                      a.input(DType::kF32, {2}));
       },
       kInvalid,
       {"`scale_inv`: expected one f32 of shape [] or [1]", "got f32[2]"}},
      {"quantize_fp8: NaN scale_inv in memory",
       [](Arena& a) {
         quantize_fp8(a.input(DType::kBF16, {4, 64}), a.output(DType::kE4M3, {4, 64}),
                      a.scalar(kNaN));
       },
       kInvalid,
       {"`scale_inv`: expected a finite scale > 0", "got nan"}},
      {"quantize_fp8: out over its own input",
       [](Arena& a) {
         const TensorView in = a.input(DType::kBF16, {4, 64});
         quantize_fp8(in, TensorView(in.data(), DType::kE4M3, {4, 64}), 1.0f);
       },
       kInvalid,
       {"`out`: expected memory apart from `input`", "e4m3fn[4, 64]", "bf16[4, 64]"}},
      {"quantize_fp8_dynamic: scale of shape [1, 1]",
       [](Arena& a) {
         quantize_fp8_dynamic(a.input(DType::kBF16, {4, 64}), a.output(DType::kE4M3, {4, 64}),
                              a.output(DType::kF32, {1, 1}));
       },
       kInvalid,
       {"`scale`: expected one f32", "got f32[1, 1]"}},
      {"quantize_fp8_dynamic: scale inside out",
       [](Arena& a) {
         const TensorView out = a.output(DType::kE4M3, {4, 64});
         quantize_fp8_dynamic(a.input(DType::kBF16, {4, 64}), out,
                              TensorView(out.data(), DType::kF32, {1}));
       },
       kInvalid,
       {"`scale`: expected memory apart from `out`", "f32[1]"}},
  };
}

std::vector<BadInput> group_bad_inputs() {
  const auto group = [](Arena& a, const TensorView& scales, GroupQuantOptions options = {}) {
    quantize_fp8_per_token_group(a.input(DType::kBF16, {4, 256}), a.output(DType::kE4M3, {4, 256}),
                                 scales, options);
  };
  return {
      {"quantize_fp8_per_token_group: group size 96",
       [=](Arena& a) {
         group(a, a.output(DType::kF32, {4, 2}), {96});
       },
       ErrorCategory::kUnsupported,
       {"expected group_size 64 or 128", "got 96"}},
      {"quantize_fp8_per_token_group: NaN eps",
       [=](Arena& a) {
         group(a, a.output(DType::kF32, {4, 2}), {128, kNaN});
       },
       kInvalid,
       {"expected a finite eps > 0", "got nan"}},
      {"quantize_fp8_per_token_group: negative eps",
       [=](Arena& a) {
         group(a, a.output(DType::kF32, {4, 2}), {128, -1.0f});
       },
       kInvalid,
       {"expected a finite eps > 0", "got -1"}},
      {"quantize_fp8_per_token_group: infinite eps",
       [=](Arena& a) {
         group(a, a.output(DType::kF32, {4, 2}), {128, std::numeric_limits<float>::infinity()});
       },
       kInvalid,
       {"expected a finite eps > 0", "got inf"}},
      {"quantize_fp8_per_token_group: row not a multiple of the group",
       [](Arena& a) {
         quantize_fp8_per_token_group(a.input(DType::kBF16, {4, 200}),
                                      a.output(DType::kE4M3, {4, 200}),
                                      a.output(DType::kF32, {4, 3}), {64});
       },
       kInvalid,
       {"expected the last dim to be a multiple of group_size 64", "got bf16[4, 200]"}},
      {"quantize_fp8_per_token_group: e5m2 out",
       [](Arena& a) {
         quantize_fp8_per_token_group(a.input(DType::kBF16, {4, 128}),
                                      a.output(DType::kE5M2, {4, 128}),
                                      a.output(DType::kF32, {4, 1}));
       },
       kInvalid,
       {"`out` dtype", "expected e4m3fn", "got e5m2"}},
      {"quantize_fp8_per_token_group: bf16 scales",
       [=](Arena& a) {
         group(a, a.output(DType::kBF16, {4, 2}));
       },
       kInvalid,
       {"`scales` dtype", "expected one of {f32, ue8m0, i32}", "got bf16"}},
      {"quantize_fp8_per_token_group: scales of too few groups",
       [=](Arena& a) {
         group(a, a.output(DType::kF32, {4, 1}));
       },
       kInvalid,
       {"`scales`: expected [4, 2]", "got f32[4, 1]"}},
      {"quantize_fp8_per_token_group: packed scales of one word a group",
       [=](Arena& a) {
         group(a, a.output(DType::kI32, {4, 4}), {64});
       },
       kInvalid,
       {"`scales`: expected [4, 1]", "packed UE8M0 words", "got i32[4, 4]"}},
      {"quantize_fp8_per_token_group: scales that overlap themselves",
       [=](Arena& a) {
         group(a, a.output(DType::kF32, {4, 2}, {.strides = {1, 2}}));
       },
       kInvalid,
       {"`scales`: expected strides that keep every scale apart", "strides [1, 2]"}},
      {"quantize_fp8_per_token_group: scales on cuda:0",
       [=](Arena& a) {
         group(a, a.output(DType::kF32, {4, 2}, {.device = Device::cuda(0)}));
       },
       kInvalid,
       {"`scales`: expected a tensor on cpu", "on cuda:0"}},
      {"quantize_fp8_per_token_group: scales inside the input",
       [](Arena& a) {
         const TensorView in = a.input(DType::kBF16, {4, 256});
         quantize_fp8_per_token_group(in, a.output(DType::kE4M3, {4, 256}),
                                      TensorView(in.data(), DType::kF32, {4, 2}));
       },
       kInvalid,
       {"`scales`: expected memory apart from `input`", "f32[4, 2]", "bf16[4, 256]"}},
  };
}

std::vector<BadInput> nvfp4_bad_inputs() {
  const auto nvfp4 = [](Arena& a, const TensorView& in, const TensorView& out,
                        const TensorView& block_scales,
                        Nvfp4ScaleLayout layout = Nvfp4ScaleLayout::kSwizzled128x4) {
    quantize_nvfp4(in, out, block_scales, a.scalar(1.0f), layout);
  };
  return {
      {"quantize_nvfp4: f32 input",
       [=](Arena& a) {
         nvfp4(a, a.input(DType::kF32, {4, 64}), a.output(DType::kE2M1x2, {4, 32}),
               a.output(DType::kE4M3, {128, 4}));
       },
       kInvalid,
       {"`input` dtype", "expected one of {bf16, f16}", "got f32"}},
      {"quantize_nvfp4: row not a multiple of 16",
       [=](Arena& a) {
         nvfp4(a, a.input(DType::kBF16, {4, 40}), a.output(DType::kE2M1x2, {4, 20}),
               a.output(DType::kE4M3, {128, 4}));
       },
       kInvalid,
       {"expected the last dim to be a multiple of 16", "got bf16[4, 40]"}},
      {"quantize_nvfp4: out not halved",
       [=](Arena& a) {
         nvfp4(a, a.input(DType::kBF16, {4, 64}), a.output(DType::kE2M1x2, {4, 64}),
               a.output(DType::kE4M3, {128, 4}));
       },
       kInvalid,
       {"expected the shape of `input` with the last dim halved", "got e2m1x2[4, 64]"}},
      {"quantize_nvfp4: bf16 global scale",
       [](Arena& a) {
         quantize_nvfp4(a.input(DType::kBF16, {4, 64}), a.output(DType::kE2M1x2, {4, 32}),
                        a.output(DType::kE4M3, {128, 4}), a.input(DType::kBF16, {1}));
       },
       kInvalid,
       {"`global_scale` dtype", "expected f32", "got bf16"}},
      {"quantize_nvfp4: zero global scale",
       [](Arena& a) {
         quantize_nvfp4(a.input(DType::kBF16, {4, 64}), a.output(DType::kE2M1x2, {4, 32}),
                        a.output(DType::kE4M3, {128, 4}), a.scalar(0.0f));
       },
       kInvalid,
       {"`global_scale`: expected a finite scale > 0", "got 0"}},
      {"quantize_nvfp4: infinite global scale",
       [](Arena& a) {
         quantize_nvfp4(a.input(DType::kBF16, {4, 64}), a.output(DType::kE2M1x2, {4, 32}),
                        a.output(DType::kE4M3, {128, 4}), a.scalar(kInf));
       },
       kInvalid,
       {"`global_scale`: expected a finite scale > 0", "got inf"}},
      {"quantize_nvfp4: swizzled scales of too few tiles",
       [=](Arena& a) {
         nvfp4(a, a.input(DType::kBF16, {4, 80}), a.output(DType::kE2M1x2, {4, 40}),
               a.output(DType::kE4M3, {1, 1, 32, 4, 4}));
       },
       kInvalid,
       {"expected contiguous [1, 2, 32, 4, 4] or [128, 8]", "got e4m3fn[1, 1, 32, 4, 4]"}},
      {"quantize_nvfp4: linear scales of too few blocks",
       [=](Arena& a) {
         nvfp4(a, a.input(DType::kBF16, {4, 80}), a.output(DType::kE2M1x2, {4, 40}),
               a.output(DType::kE4M3, {4, 4}), Nvfp4ScaleLayout::kLinear);
       },
       kInvalid,
       {"`block_scales` (linear layout): expected [4, 5]", "got e4m3fn[4, 4]"}},
      {"quantize_nvfp4: block scales on cuda:0",
       [=](Arena& a) {
         nvfp4(a, a.input(DType::kBF16, {4, 64}), a.output(DType::kE2M1x2, {4, 32}),
               a.output(DType::kE4M3, {128, 4}, {.device = Device::cuda(0)}));
       },
       kInvalid,
       {"`block_scales`: expected a tensor on cpu", "on cuda:0"}},
      {"quantize_nvfp4: out over its input",
       [=](Arena& a) {
         const TensorView in = a.input(DType::kBF16, {4, 64});
         nvfp4(a, in, TensorView(in.data(), DType::kE2M1x2, {4, 32}),
               a.output(DType::kE4M3, {128, 4}));
       },
       kInvalid,
       {"`out`: expected memory apart from `input`", "e2m1x2[4, 32]"}},
      {"quantize_nvfp4: huge row count",
       [=](Arena& a) {
         // 2^40 rows over a small buffer: rejected by the scale shape before any row is read.
         nvfp4(a, a.input(DType::kBF16, {std::int64_t(1) << 40, 64}),
               a.output(DType::kE2M1x2, {std::int64_t(1) << 40, 32}),
               a.output(DType::kE4M3, {128, 4}));
       },
       kInvalid,
       {"block_scales", "got e4m3fn[128, 4]"}},
  };
}

// The views every op takes: sizes and strides no memory could hold, and ranges past a view.
std::vector<BadInput> view_bad_inputs() {
  constexpr std::int64_t k2To32 = std::int64_t(1) << 32;
  return {
      {"TensorView: 2^70 elements",
       [](Arena& a) {
         // 2^70 elements wrap to 0 in an int64: unchecked, an empty and so "valid" call.
         const TensorView in(a.input(DType::kBF16, {1}).data(), DType::kBF16, {k2To32, k2To32, 64});
         quantize_fp8(
             in, TensorView(a.output(DType::kE4M3, {1}).data(), DType::kE4M3, {k2To32, k2To32, 64}),
             1.0f);
       },
       kInvalid,
       {"expected a view spanning at most 2^63 - 1 bytes", "got bf16[4294967296, 4294967296, 64]"}},
      {"TensorView: strides reaching past 2^63 bytes",
       [](Arena& a) {
         TensorView(a.input(DType::kF32, {2, 2}).data(), DType::kF32, {2, 2},
                    {std::int64_t(1) << 62, 1});
       },
       kInvalid,
       {"expected a view spanning at most 2^63 - 1 bytes", "strides [4611686018427387904, 1]"}},
      {"TensorView: negative stride",
       [](Arena& a) {
         TensorView(a.input(DType::kBF16, {4, 64}).data(), DType::kBF16, {4, 64}, {-64, 1});
       },
       kInvalid,
       {"expected non-negative strides", "got [-64, 1]"}},
      {"TensorView: negative size",
       [](Arena& a) {
         TensorView(a.input(DType::kBF16, {4}).data(), DType::kBF16, {4, -1});
       },
       kInvalid,
       {"expected non-negative sizes", "got shape [4, -1]"}},
      {"TensorView: 9 dims",
       [](Arena& a) {
         TensorView(a.input(DType::kBF16, {1}).data(), DType::kBF16, {1, 1, 1, 1, 1, 1, 1, 1, 1});
       },
       kInvalid,
       {"expected at most 8 dims", "got 9"}},
      {"TensorView::narrow past the end",
       [](Arena& a) {
         a.input(DType::kBF16, {4, 64}).narrow(0, 2, 3);
       },
       ErrorCategory::kOutOfRange,
       {"range [2, 5) out of bounds for dim 0 of size 4"}},
  };
}

}  // namespace

std::vector<BadInput> quantize_bad_inputs() {
  std::vector<BadInput> all = fp8_bad_inputs();
  for (auto part : {group_bad_inputs(), nvfp4_bad_inputs(), view_bad_inputs()}) {
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

std::vector<ValidCall> quantize_valid_calls() {
  return {
      {"quantize_fp8",
       [](Arena& a) {
         fp8_into(a, a.output(DType::kE4M3, {4, 64}));
       }},
      {"quantize_fp8_per_token_group",
       [](Arena& a) {
         quantize_fp8_per_token_group(a.input(DType::kBF16, {4, 256}),
                                      a.output(DType::kE4M3, {4, 256}),
                                      a.output(DType::kF32, {4, 2}));
       }},
      {"quantize_nvfp4",
       [](Arena& a) {
         quantize_nvfp4(a.input(DType::kBF16, {4, 64}), a.output(DType::kE2M1x2, {4, 32}),
                        a.output(DType::kE4M3, {128, 4}), a.scalar(1.0f));
       }},
  };
}

}  // namespace fp8mla::test
