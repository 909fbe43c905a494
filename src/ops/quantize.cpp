// Argument checks and CPU/CUDA dispatch of the quantization ops (fp8mla/quantize.hpp).
#include "fp8mla/quantize.hpp"

#include <cmath>
#include <string>
#include <tuple>
#include <utility>

#include "core/check.hpp"
#include "ops/device_dispatch.hpp"
#include "ops/quantize_params.hpp"
#include "ops/quantize_scales.hpp"

namespace fp8mla {
namespace {

Rows rows_of(const ArgChecker& check, const TensorView& t, std::string_view name) {
  const RowLayout r = check.rows(t, name);
  return {t.data(), t.dtype(), r.rows, r.cols, r.row_stride};
}

// The rows of an input with scales per row: a view of width 0 folds to no rows, but its scale
// tensor still has a row (of no groups) for each row of its leading dims.
std::int64_t scale_rows(const TensorView& input, const Rows& rows) {
  if (rows.cols != 0) return rows.rows;
  std::int64_t leading = 1;
  for (int d = 0; d + 1 < input.ndim(); ++d) leading *= input.size(d);
  return leading;
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
  check.apart(out, "out", input, "input");
  if (p.input.rows == 0 || p.input.cols == 0) return;
  dispatch(
      input.device(),
      [&] {
        // The host reads a scale in memory here; the CUDA kernel reads it on the device.
        if (p.scale == QuantizeFp8Params::Scale::kMemory) {
          check.positive_scale(*p.scale_inv_ptr, "scale_inv");
        }
        cpu::quantize_fp8(p);
      },
      [&](auto) { cuda::quantize_fp8(p, stream); });
}

}  // namespace

void quantize_fp8(const TensorView& input, const TensorView& out, float scale_inv,
                  CudaStream stream) {
  run_quantize_fp8(input, out, stream, [&](const ArgChecker& check, QuantizeFp8Params& p) {
    check.positive_scale(scale_inv, "scale_inv");
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
  check.apart(out, "out", input, "input");
  check.apart(scale, "scale", input, "input");
  check.apart(scale, "scale", out, "out");
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
  // An infinite eps would make every scale infinite and every value 0.
  check.require(options.eps > 0.0f && std::isfinite(options.eps), ErrorCategory::kInvalidArgument,
                [&] { return concat("expected a finite eps > 0, got ", options.eps); });
  p.group_size = options.group_size;
  p.eps = options.eps;

  p.input.rows = scale_rows(input, p.input);
  set_group_scales(check, p, scales, "scales", input.device(), options.round_scale_to_pow2);
  check.apart(out, "out", input, "input");
  check.apart(scales, "scales", input, "input");
  check.apart(scales, "scales", out, "out");
  if (p.input.rows == 0 || p.input.cols == 0) return;
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
  p.input.rows = scale_rows(input, p.input);
  set_nvfp4_scales(check, p, block_scales, "block_scales", layout);
  check.apart(out, "out", input, "input");
  check.apart(block_scales, "block_scales", input, "input");
  check.apart(block_scales, "block_scales", out, "out");
  if (p.input.rows == 0 || p.input.cols == 0) return;
  dispatch(
      input.device(),
      [&] {
        check.positive_scale(*p.global_scale, "global_scale");
        cpu::quantize_nvfp4(p);
      },
      [&](auto) { cuda::quantize_nvfp4(p, stream); });
}

}  // namespace fp8mla
