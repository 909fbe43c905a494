// The scale tensors of the quantization ops (ops/quantize_scales.hpp).
#include "ops/quantize_scales.hpp"

#include "ops/device_dispatch.hpp"

namespace fp8mla {

void set_group_scales(const ArgChecker& check, QuantizeGroupParams& p, const TensorView& scales,
                      std::string_view name, Device device, bool round_scale_to_pow2) {
  check.dtype(scales, name, {DType::kF32, DType::kUE8M0, DType::kI32});
  check.ndim(scales, name, 2);
  check_devices(check, device, {{&scales, name}});
  check.aligned(scales, name, dtype_size(scales.dtype()));
  const std::int64_t groups = p.input.cols / p.group_size;
  const bool packed = scales.dtype() == DType::kI32;
  const std::int64_t scale_cols = packed ? (groups + 3) / 4 : groups;
  check.require(scales.size(0) == p.input.rows && scales.size(1) == scale_cols,
                ErrorCategory::kInvalidArgument, [&] {
                  return concat("`", name, "`: expected [", p.input.rows, ", ", scale_cols, "] (",
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
    return concat("`", name, "`: expected strides that keep every scale apart, got ",
                  scales.describe());
  });
  p.scales = scales.data();
  p.scale_row_stride = s0;
  p.scale_col_stride = s1;
  using Format = QuantizeGroupParams::ScaleFormat;
  p.scale_format = packed                            ? Format::kPackedUe8m0
                   : scales.dtype() == DType::kUE8M0 ? Format::kUe8m0
                   : round_scale_to_pow2             ? Format::kF32Pow2
                                                     : Format::kF32;
}

void set_nvfp4_scales(const ArgChecker& check, QuantizeNvfp4Params& p,
                      const TensorView& block_scales, std::string_view name,
                      Nvfp4ScaleLayout layout) {
  p.layout = layout;
  p.block_scales = block_scales.data_as<std::uint8_t>();
  const std::int64_t m = p.input.rows, k_blocks = p.input.cols / 16;
  if (layout == Nvfp4ScaleLayout::kLinear) {
    check.require(
        block_scales.ndim() == 2 && block_scales.size(0) == m && block_scales.size(1) == k_blocks,
        ErrorCategory::kInvalidArgument, [&] {
          return concat("`", name, "` (linear layout): expected [", m, ", ", k_blocks, "], got ",
                        block_scales.describe());
        });
    p.scale_row_stride = check.rows(block_scales, name).row_stride;
    return;
  }
  const std::int64_t m_tiles = (m + 127) / 128, k_tiles = (k_blocks + 3) / 4;
  const bool as_5d = block_scales.ndim() == 5 && block_scales.size(0) == m_tiles &&
                     block_scales.size(1) == k_tiles && block_scales.size(2) == 32 &&
                     block_scales.size(3) == 4 && block_scales.size(4) == 4;
  const bool as_2d = block_scales.ndim() == 2 && block_scales.size(0) == m_tiles * 128 &&
                     block_scales.size(1) == k_tiles * 4;
  check.require((as_5d || as_2d) && block_scales.is_contiguous(), ErrorCategory::kInvalidArgument,
                [&] {
                  return concat("`", name, "` (128x4 swizzled layout): expected contiguous [",
                                m_tiles, ", ", k_tiles, ", 32, 4, 4] or [", m_tiles * 128, ", ",
                                k_tiles * 4, "], got ", block_scales.describe());
                });
}

}  // namespace fp8mla
