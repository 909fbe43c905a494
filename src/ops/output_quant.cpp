// The output quantization key (fp8mla/output_quant.hpp): the rules, on metadata only.
#include "ops/output_quant.hpp"

#include <iterator>
#include <string>

namespace fp8mla {
namespace {

constexpr std::string_view kScale = "output_scale";
constexpr std::string_view kBlockScale = "output_block_scale";

// Not given: a default view. A view with dims is given even without data (no tokens: torch's
// empty tensors have no data pointer).
bool given(const TensorView& t) {
  return t.data() != nullptr || t.ndim() > 0;
}

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

void check_unquantized_output(const ArgChecker& check, const TensorView& out,
                              const TensorView& output_scale, const TensorView& output_block_scale,
                              DType unquantized) {
  const OutputQuantKey key = detect_output_quant_key(
      check, out, "out", output_scale, output_block_scale, output_row_width(out), unquantized);
  check.require(key == OutputQuantKey::kNone, ErrorCategory::kUnsupported, [&] {
    return concat("fused output quantization ", to_string(key),
                  " is not built yet: give a bf16 `out` without output scales and quantize it "
                  "with the standalone op, got `out` ",
                  out.describe());
  });
}

}  // namespace fp8mla
