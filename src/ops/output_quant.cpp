// The output quantization key (fp8mla/output_quant.hpp): the rules, on metadata only.
#include "ops/output_quant.hpp"

#include "ops/quantize_scales.hpp"

#include <iterator>
#include <string>

namespace fp8mla {
namespace {

constexpr std::string_view kScale = "output_scale";
constexpr std::string_view kBlockScale = "output_block_scale";

std::int64_t round_up(std::int64_t value, std::int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// The output of a quantized key: [T, W] or [T, H, Dv], contiguous last dim, W == output_dim.
void check_output(const ArgChecker& check, const TensorView& output, std::string_view name,
                  std::int64_t output_dim) {
  check.require(output.ndim() == 2 || output.ndim() == 3, ErrorCategory::kInvalidArgument, [&] {
    return concat("`", name, "`: expected [T, W] or [T, H, Dv] (the o_proj input), got ",
                  output.describe());
  });
  check.contiguous_last_dim(output, name);
  const bool packed = output.dtype() == DType::kE2M1x2;
  check.require(output_dim == output_row_width(output), ErrorCategory::kInvalidArgument, [&] {
    return concat("output_dim: expected the row width of `", name, "`, ", output_row_width(output),
                  packed ? " values (two e2m1 values a byte)" : " values", ", got ", output_dim);
  });
}

// The global or per-tensor scale: one f32 on the output's device.
void check_scale(const ArgChecker& check, const TensorView& scale, Device device) {
  check.dtype(scale, kScale, {DType::kF32});
  check.require(scale.numel() == 1 && scale.ndim() <= 1, ErrorCategory::kInvalidArgument, [&] {
    return concat("`", kScale, "`: expected one f32 of shape [] or [1], got ", scale.describe());
  });
  check.device(scale, kScale, device);
}

void check_scale_rows(const ArgChecker& check, std::int64_t scale_rows, std::int64_t rows,
                      const TensorView& block, std::string_view output_name) {
  check.require(scale_rows >= rows, ErrorCategory::kInvalidArgument, [&] {
    return concat("`", kBlockScale, "`: expected at least ", rows, " rows (one per row of `",
                  output_name, "`), got ", block.describe());
  });
}

// The group count of packed UE8M0 words: whichever of D / 128 and D / 64 groups pack into them.
std::int64_t packed_groups(const ArgChecker& check, const TensorView& block,
                           std::int64_t output_dim) {
  const std::int64_t words = block.size(1);
  std::int64_t groups = 0, matches = 0;
  for (std::int64_t group_size : {128, 64}) {
    const std::int64_t g = output_dim / group_size;
    if (output_dim % group_size == 0 && (g + 3) / 4 == words) {
      groups = g;
      ++matches;
    }
  }
  check.require(matches == 1, ErrorCategory::kInvalidArgument, [&] {
    const std::string expected =
        concat("ceil(G / 4) words a row for G = ", output_dim, " / 128 or ", output_dim,
               " / 64 groups (packed UE8M0, 4 groups a word)");
    if (matches == 0)
      return concat("`", kBlockScale, "`: expected ", expected, ", got ", block.describe());
    return concat("`", kBlockScale, "`: ", words,
                  " packed UE8M0 words a row fit both group "
                  "sizes 64 and 128 of output_dim ",
                  output_dim,
                  ": give ue8m0 bytes or f32 "
                  "scales, which count the groups, got ",
                  block.describe());
  });
  return groups;
}

// Per-token-group FP8: the group size from the scales' group count.
OutputQuantKey group_key(const ArgChecker& check, const TensorView& output,
                         std::string_view output_name, const TensorView& block,
                         std::int64_t output_dim) {
  check.dtype(block, kBlockScale, {DType::kF32, DType::kUE8M0, DType::kI32});
  check.ndim(block, kBlockScale, 2);
  check_scale_rows(check, block.size(0), output.size(0), block, output_name);
  const std::int64_t groups =
      block.dtype() == DType::kI32 ? packed_groups(check, block, output_dim) : block.size(1);
  check.require(groups > 0 && output_dim % groups == 0, ErrorCategory::kInvalidArgument, [&] {
    return concat("`", kBlockScale, "`: expected a group count that divides output_dim ",
                  output_dim, ", got ", groups, " groups a row in ", block.describe());
  });
  const std::int64_t group_size = output_dim / groups;
  check.require(group_size == 64 || group_size == 128, ErrorCategory::kInvalidArgument, [&] {
    return concat("`", kBlockScale, "`: expected groups of 64 or 128 (output_dim / groups), got ",
                  output_dim, " / ", groups, " = ", group_size, " from ", block.describe());
  });
  return group_size == 128 ? OutputQuantKey::kFp8Group128 : OutputQuantKey::kFp8Group64;
}

// NVFP4: e4m3 block scales of 16 values, linear or 128x4 swizzled, as quantize_nvfp4 writes them.
void check_nvfp4_block_scale(const ArgChecker& check, const TensorView& block, std::int64_t rows,
                             std::int64_t output_dim, std::string_view output_name) {
  check.require(output_dim % 16 == 0, ErrorCategory::kInvalidArgument, [&] {
    return concat("output_dim: expected a multiple of 16 (the NVFP4 block), got ", output_dim);
  });
  check.dtype(block, kBlockScale, {DType::kE4M3});
  const std::int64_t blocks = output_dim / 16, padded = round_up(blocks, 4);
  const bool as_2d = block.ndim() == 2 && (block.size(1) == blocks || block.size(1) == padded);
  const bool as_5d = block.ndim() == 5 && block.size(1) * 4 == padded && block.size(2) == 32 &&
                     block.size(3) == 4 && block.size(4) == 4;
  check.require(as_2d || as_5d, ErrorCategory::kInvalidArgument, [&] {
    return concat("`", kBlockScale, "`: expected NVFP4 block scales, linear [R, ", blocks,
                  "] or 128x4 swizzled [R, ", padded, "] or [R / 128, ", padded / 4,
                  ", 32, 4, 4], got ", block.describe());
  });
  check_scale_rows(check, as_5d ? block.size(0) * 128 : block.size(0), rows, block, output_name);
}

// A keyed `out` as the rows the standalone op writes: [tokens, heads * dim] values, a token's
// values contiguous (a 3-d view's head stride is its last dim), any row stride.
Rows quantized_rows(const ArgChecker& check, const TensorView& out, std::int64_t tokens,
                    std::int64_t heads, std::int64_t dim) {
  const bool packed = out.dtype() == DType::kE2M1x2;
  const std::int64_t width = heads * dim, cols = packed ? width / 2 : width;
  const bool shape = out.size(0) == tokens && output_row_width(out) == width &&
                     (out.ndim() == 2 || out.size(1) == heads);
  check.require(shape, ErrorCategory::kInvalidArgument, [&] {
    return concat("`out`: expected [", tokens, ", ", heads, ", ", packed ? dim / 2 : dim, "] or [",
                  tokens, ", ", cols, "] (", tokens, " tokens of ", heads, " x ", dim, " values",
                  packed ? ", two e2m1 values a byte" : "", "), got ", out.describe());
  });
  check.require(out.ndim() == 2 || heads <= 1 || out.stride(1) == out.size(2),
                ErrorCategory::kInvalidArgument, [&] {
                  const char* what = "`out`: a quantized output needs the values of a token ";
                  return concat(what, "contiguous (head stride ", out.size(2),
                                ", the o_proj input's rows), got ", out.describe());
                });
  check.require(tokens <= 1 || out.stride(0) >= cols, ErrorCategory::kInvalidArgument, [&] {
    return concat("`out`: expected a token stride that keeps the rows of ", cols,
                  " elements apart, got ", out.describe());
  });
  return {out.data(), out.dtype(), tokens, cols, out.stride(0)};
}

// NVFP4 block scales of the first rows: the 128x4 swizzled layout where the tensor can hold its
// tiles (the 5-d view, or a contiguous 2-d [R, round_up(W / 16, 4)] with R a multiple of 128),
// linear [R, W / 16] otherwise; over the tiles or rows of the output's tokens.
void set_output_nvfp4_scales(const ArgChecker& check, QuantizeNvfp4Params& p,
                             const TensorView& block) {
  const std::int64_t rows = p.input.rows, blocks = p.input.cols / 16;
  const bool five_d = block.ndim() == 5;
  const bool swizzled = five_d || (block.size(1) == round_up(blocks, 4) &&
                                   block.size(0) % 128 == 0 && block.is_contiguous());
  check.require(swizzled || block.size(1) == blocks, ErrorCategory::kInvalidArgument, [&] {
    return concat("`", kBlockScale, "`: 128x4 swizzled block scales [R, ", round_up(blocks, 4),
                  "] need R a multiple of 128 and contiguous memory, got ", block.describe());
  });
  const std::int64_t used = !swizzled ? rows : five_d ? (rows + 127) / 128 : round_up(rows, 128);
  set_nvfp4_scales(check, p, block.narrow(0, 0, used), kBlockScale,
                   swizzled ? Nvfp4ScaleLayout::kSwizzled128x4 : Nvfp4ScaleLayout::kLinear);
}

}  // namespace

std::int64_t output_row_width(const TensorView& output) {
  if (output.ndim() < 2) return 0;
  std::int64_t width = output.dtype() == DType::kE2M1x2 ? 2 : 1;
  for (int d = 1; d < output.ndim(); ++d) width *= output.size(d);
  return width;
}

std::string_view to_string(OutputQuantKey key) {
  // In the enum's order.
  static constexpr std::string_view kNames[] = {"none", "fp8_static", "fp8_group128", "fp8_group64",
                                                "nvfp4"};
  const auto index = std::size_t(key);
  return index < std::size(kNames) ? kNames[index] : "unknown";
}

OutputQuantKey detect_output_quant_key(const ArgChecker& check, const TensorView& output,
                                       std::string_view output_name, const TensorView& output_scale,
                                       const TensorView& output_block_scale,
                                       std::int64_t output_dim, DType unquantized) {
  const bool has_scale = given(output_scale), has_block = given(output_block_scale);
  const DType dtype = output.dtype();
  const bool fp8 = dtype == DType::kE4M3, fp4 = dtype == DType::kE2M1x2;
  if (!has_scale && !has_block) {
    check.require(dtype == unquantized, ErrorCategory::kInvalidArgument, [&] {
      return concat(
          "`", output_name, "` dtype: expected ", dtype_name(unquantized), ", got ",
          dtype_name(dtype),
          fp8 || fp4 ? " (a quantized output needs output_scale or output_block_scale)" : "");
    });
    return OutputQuantKey::kNone;
  }
  check.require(fp8 || fp4, ErrorCategory::kInvalidArgument, [&] {
    return concat("`", output_name,
                  "` dtype: expected e4m3fn (static or group FP8) or e2m1x2 "
                  "(NVFP4) with ",
                  has_block ? kBlockScale : kScale, ", got ", dtype_name(dtype));
  });
  check_output(check, output, output_name, output_dim);
  const Device device = output.device();
  if (has_scale) check_scale(check, output_scale, device);
  if (!has_block) {
    check.require(fp8, ErrorCategory::kInvalidArgument, [&] {
      return concat("`", kBlockScale, "`: expected e4m3 block scales with the e2m1x2 (NVFP4) `",
                    output_name, "` and its global `", kScale, "`, got none");
    });
    return OutputQuantKey::kFp8Static;
  }
  check.device(output_block_scale, kBlockScale, device);
  if (fp4) {
    check.require(has_scale, ErrorCategory::kInvalidArgument, [&] {
      return concat("`", kScale, "`: expected the global scale (one f32) of the NVFP4 `",
                    output_name, "`, got none");
    });
    check_nvfp4_block_scale(check, output_block_scale, output.size(0), output_dim, output_name);
    return OutputQuantKey::kNvfp4;
  }
  check.require(!has_scale, ErrorCategory::kInvalidArgument, [&] {
    return concat("`", kScale, "`: expected none with `", kBlockScale, "` and an e4m3fn `",
                  output_name, "` (group FP8 has only the per-group scales), got ",
                  output_scale.describe());
  });
  return group_key(check, output, output_name, output_block_scale, output_dim);
}

OutputQuantKey detect_output_quant_key(const TensorView& output, const TensorView& output_scale,
                                       const TensorView& output_block_scale,
                                       std::int64_t output_dim) {
  const ArgChecker check("detect_output_quant_key");
  return detect_output_quant_key(check, output, "output", output_scale, output_block_scale,
                                 output_dim, DType::kBF16);
}

OutputQuantKey check_output_quant_key(const ArgChecker& check, const TensorView& out,
                                      const TensorView& output_scale,
                                      const TensorView& output_block_scale, DType unquantized) {
  return detect_output_quant_key(check, out, "out", output_scale, output_block_scale,
                                 output_row_width(out), unquantized);
}

void check_output_scale_value(const ArgChecker& check, const OutputQuantParams& p) {
  if (p.key == OutputQuantKey::kFp8Static) check.positive_scale(*p.fp8.scale_inv_ptr, kScale);
  if (p.key == OutputQuantKey::kNvfp4) check.positive_scale(*p.nvfp4.global_scale, kScale);
}

OutputQuantParams output_quant_params(const ArgChecker& check, OutputQuantKey key,
                                      const TensorView& out, const TensorView& output_scale,
                                      const TensorView& output_block_scale, std::int64_t tokens,
                                      std::int64_t heads, std::int64_t dim) {
  OutputQuantParams p;
  p.key = key;
  if (key == OutputQuantKey::kNone) return p;
  const Rows rows = quantized_rows(check, out, tokens, heads, dim);
  // The input is the implementation's bf16 buffer: its shape here, its data there.
  const Rows input{nullptr, DType::kBF16, tokens, heads * dim, heads * dim};
  switch (key) {
    case OutputQuantKey::kFp8Static:
      check.aligned(output_scale, kScale, 4);
      p.fp8.input = input;
      p.fp8.out = rows;
      p.fp8.scale = QuantizeFp8Params::Scale::kMemory;  // output_scale is quantize_fp8's scale_inv
      p.fp8.scale_inv_ptr = output_scale.data_as<const float>();
      break;
    case OutputQuantKey::kFp8Group128:
    case OutputQuantKey::kFp8Group64:
      p.group.input = input;
      p.group.out = rows;
      p.group.group_size = key == OutputQuantKey::kFp8Group128 ? 128 : 64;
      set_group_scales(check, p.group, output_block_scale.narrow(0, 0, tokens), kBlockScale,
                       out.device(), false);
      break;
    case OutputQuantKey::kNvfp4:
      check.aligned(output_scale, kScale, 4);
      p.nvfp4.input = input;
      p.nvfp4.out = rows;
      p.nvfp4.global_scale = output_scale.data_as<const float>();
      set_output_nvfp4_scales(check, p.nvfp4, output_block_scale);
      break;
    case OutputQuantKey::kNone:
      break;
  }
  check.outputs_apart(out, "out", output_block_scale, kBlockScale);
  return p;
}

}  // namespace fp8mla
