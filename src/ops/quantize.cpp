// Argument checks and CPU/CUDA dispatch of the quantization ops (fp8mla/quantize.hpp).
#include "fp8mla/quantize.hpp"

#include <string>
#include <tuple>
#include <utility>

#include "core/check.hpp"
#include "ops/device_dispatch.hpp"
#include "ops/quantize_params.hpp"

namespace fp8mla {
namespace {

Rows rows_of(const ArgChecker& check, const TensorView& t, std::string_view name) {
  const RowLayout r = check.rows(t, name);
  return {t.data(), t.dtype(), r.rows, r.cols, r.row_stride};
}

// `out` has exactly the shape of `input`.
void check_same_shape(const ArgChecker& check, const TensorView& input, const TensorView& out) {
  bool same = input.ndim() == out.ndim();
  for (int d = 0; same && d < input.ndim(); ++d) same = input.size(d) == out.size(d);
  check.require(same, ErrorCategory::kInvalidArgument, [&] {
    return concat("`out`: expected the shape of `input` (", input.describe(), "), got ",
                  out.describe());
  });
}

// A single f32 (shape [] or [1]) on `device`.
const float* scalar_f32(const ArgChecker& check, const TensorView& t, std::string_view name,
                        Device device) {
  check.dtype(t, name, {DType::kF32});
  check.require(t.numel() == 1 && t.ndim() <= 1, ErrorCategory::kInvalidArgument, [&] {
    return concat("`", name, "`: expected one f32 of shape [] or [1], got ", t.describe());
  });
  check.device(t, name, device);
  check.aligned(t, name, 4);
  return t.data_as<const float>();
}

// Input/out checks shared by the FP8 ops; returns the (input, out) rows.
std::pair<Rows, Rows> fp8_rows(const ArgChecker& check, const TensorView& input,
                               const TensorView& out, std::initializer_list<DType> out_dtypes) {
  check.dtype(input, "input", {DType::kBF16, DType::kF16, DType::kF32});
  check.dtype(out, "out", out_dtypes);
  check_same_shape(check, input, out);
  check_devices(check, input.device(), {{&out, "out"}});
  check.aligned(input, "input", dtype_size(input.dtype()));
  return {rows_of(check, input, "input"), rows_of(check, out, "out")};
}

// quantize_fp8 with a static scale that set_scale(check, p) checks and puts into p.
template <typename SetScale>
void run_quantize_fp8(const TensorView& input, const TensorView& out, CudaStream stream,
                      SetScale set_scale) {
  const ArgChecker check("quantize_fp8");
  QuantizeFp8Params p;
  set_scale(check, p);
  std::tie(p.input, p.out) = fp8_rows(check, input, out, {DType::kE4M3, DType::kE5M2});
  if (p.input.rows == 0 || p.input.cols == 0) return;
  dispatch(
      input.device(), [&] { cpu::quantize_fp8(p); }, [&](auto) { cuda::quantize_fp8(p, stream); });
}

}  // namespace

void quantize_fp8(const TensorView& input, const TensorView& out, float scale_inv,
                  CudaStream stream) {
  run_quantize_fp8(input, out, stream, [&](const ArgChecker&, QuantizeFp8Params& p) {
    p.scale = QuantizeFp8Params::Scale::kValue;
    p.scale_inv = scale_inv;
  });
}

void quantize_fp8(const TensorView& input, const TensorView& out, const TensorView& scale_inv,
                  CudaStream stream) {
  run_quantize_fp8(input, out, stream, [&](const ArgChecker& check, QuantizeFp8Params& p) {
    p.scale = QuantizeFp8Params::Scale::kMemory;
    p.scale_inv_ptr = scalar_f32(check, scale_inv, "scale_inv", input.device());
  });
}

void quantize_fp8_dynamic(const TensorView& input, const TensorView& out, const TensorView& scale,
                          CudaStream stream) {
  const ArgChecker check("quantize_fp8_dynamic");
  QuantizeFp8Params p;
  p.scale = QuantizeFp8Params::Scale::kDynamic;
  p.scale_out = const_cast<float*>(scalar_f32(check, scale, "scale", input.device()));
  std::tie(p.input, p.out) = fp8_rows(check, input, out, {DType::kE4M3, DType::kE5M2});
  // An empty input still defines its scale: amax = 0 gives kMinDynamicScale.
  dispatch(
      input.device(), [&] { cpu::quantize_fp8(p); }, [&](auto) { cuda::quantize_fp8(p, stream); });
}

void quantize_fp8_per_token_group(const TensorView& input, const TensorView& out,
                                  const TensorView& scales, const GroupQuantOptions& options,
                                  CudaStream stream) {
  const ArgChecker check("quantize_fp8_per_token_group");
  QuantizeGroupParams p;
  std::tie(p.input, p.out) = fp8_rows(check, input, out, {DType::kE4M3});
  check.require(options.group_size == 64 || options.group_size == 128, ErrorCategory::kUnsupported,
                [&] { return concat("expected group_size 64 or 128, got ", options.group_size); });
  check.require(p.input.cols % options.group_size == 0, ErrorCategory::kInvalidArgument, [&] {
    return concat("`input`: expected the last dim to be a multiple of group_size ",
                  options.group_size, ", got ", input.describe());
  });
  check.require(options.eps > 0.0f, ErrorCategory::kInvalidArgument,
                [&] { return concat("expected eps > 0, got ", options.eps); });
  p.group_size = options.group_size;
  p.eps = options.eps;

  check.dtype(scales, "scales", {DType::kF32, DType::kUE8M0, DType::kI32});
  check.ndim(scales, "scales", 2);
  check_devices(check, input.device(), {{&scales, "scales"}});
  check.aligned(scales, "scales", dtype_size(scales.dtype()));
  const std::int64_t groups = p.input.cols / p.group_size;
  const bool packed = scales.dtype() == DType::kI32;
  const std::int64_t scale_cols = packed ? (groups + 3) / 4 : groups;
  check.require(scales.size(0) == p.input.rows && scales.size(1) == scale_cols,
                ErrorCategory::kInvalidArgument, [&] {
                  return concat("`scales`: expected [", p.input.rows, ", ", scale_cols, "] (",
                                packed ? "packed UE8M0 words for " : "", groups, " groups of ",
                                p.group_size, " per row), got ", scales.describe());
                });
  // Distinct scales must not share memory: one dim's stride spans the whole other dim.
  const std::int64_t s0 = scales.stride(0), s1 = scales.stride(1);
  const std::int64_t n0 = scales.size(0), n1 = scales.size(1);
  const bool disjoint =
      n0 == 0 || n1 == 0 ||  // an empty tensor has nothing to overlap
      (n0 == 1 || n1 == 1 ? (n0 == 1 || s0 > 0) && (n1 == 1 || s1 > 0)
                          : (s1 > 0 && s0 >= s1 * n1) || (s0 > 0 && s1 >= s0 * n0));
  check.require(disjoint, ErrorCategory::kInvalidArgument, [&] {
    return concat("`scales`: expected strides that keep every scale apart, got ",
                  scales.describe());
  });
  p.scales = scales.data();
  p.scale_row_stride = s0;
  p.scale_col_stride = s1;
  using Format = QuantizeGroupParams::ScaleFormat;
  p.scale_format = packed                            ? Format::kPackedUe8m0
                   : scales.dtype() == DType::kUE8M0 ? Format::kUe8m0
                   : options.round_scale_to_pow2     ? Format::kF32Pow2
                                                     : Format::kF32;
  if (p.input.rows == 0) return;
  dispatch(
      input.device(), [&] { cpu::quantize_fp8_per_token_group(p); },
      [&](auto) { cuda::quantize_fp8_per_token_group(p, stream); });
}

void quantize_nvfp4(const TensorView& input, const TensorView& out, const TensorView& block_scales,
                    const TensorView& global_scale, Nvfp4ScaleLayout layout, CudaStream stream) {
  const ArgChecker check("quantize_nvfp4");
  QuantizeNvfp4Params p;
  check.dtype(input, "input", {DType::kBF16, DType::kF16});
  check.dtype(out, "out", {DType::kE2M1x2});
  check.dtype(block_scales, "block_scales", {DType::kE4M3});
  check_devices(check, input.device(), {{&out, "out"}, {&block_scales, "block_scales"}});
  check.aligned(input, "input", dtype_size(input.dtype()));
  p.input = rows_of(check, input, "input");
  check.require(p.input.cols % 16 == 0, ErrorCategory::kInvalidArgument, [&] {
    return concat(
        "`input`: expected the last dim to be a multiple of 16 (the NVFP4 block), "
        "got ",
        input.describe());
  });
  bool out_shape = out.ndim() == input.ndim() && out.size(-1) * 2 == p.input.cols;
  for (int d = 0; out_shape && d + 1 < input.ndim(); ++d) out_shape = out.size(d) == input.size(d);
  check.require(out_shape, ErrorCategory::kInvalidArgument, [&] {
    return concat(
        "`out`: expected the shape of `input` with the last dim halved (two fp4 "
        "values per byte), input ",
        input.describe(), ", got ", out.describe());
  });
  p.out = rows_of(check, out, "out");
  p.global_scale = scalar_f32(check, global_scale, "global_scale", input.device());
  p.layout = layout;
  p.block_scales = block_scales.data_as<std::uint8_t>();

  const std::int64_t m = p.input.rows, k_blocks = p.input.cols / 16;
  if (layout == Nvfp4ScaleLayout::kLinear) {
    check.require(
        block_scales.ndim() == 2 && block_scales.size(0) == m && block_scales.size(1) == k_blocks,
        ErrorCategory::kInvalidArgument, [&] {
          return concat("`block_scales` (linear layout): expected [", m, ", ", k_blocks, "], got ",
                        block_scales.describe());
        });
    p.scale_row_stride = check.rows(block_scales, "block_scales").row_stride;
  } else {
    const std::int64_t m_tiles = (m + 127) / 128, k_tiles = (k_blocks + 3) / 4;
    const bool as_5d = block_scales.ndim() == 5 && block_scales.size(0) == m_tiles &&
                       block_scales.size(1) == k_tiles && block_scales.size(2) == 32 &&
                       block_scales.size(3) == 4 && block_scales.size(4) == 4;
    const bool as_2d = block_scales.ndim() == 2 && block_scales.size(0) == m_tiles * 128 &&
                       block_scales.size(1) == k_tiles * 4;
    check.require((as_5d || as_2d) && block_scales.is_contiguous(), ErrorCategory::kInvalidArgument,
                  [&] {
                    return concat("`block_scales` (128x4 swizzled layout): expected contiguous [",
                                  m_tiles, ", ", k_tiles, ", 32, 4, 4] or [", m_tiles * 128, ", ",
                                  k_tiles * 4, "], got ", block_scales.describe());
                  });
  }
  if (m == 0) return;
  dispatch(
      input.device(), [&] { cpu::quantize_nvfp4(p); },
      [&](auto) { cuda::quantize_nvfp4(p, stream); });
}

}  // namespace fp8mla
