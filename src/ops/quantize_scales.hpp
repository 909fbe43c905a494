// The scale tensors of the quantization ops, checked into their plain parameters: one set of rules
// for the standalone ops (quantize.cpp) and the attention ops' fused output quantization
// (output_quant.cpp), so that both read a scale tensor the same way. Messages name the calling
// op (`check`) and the argument (`name`).
#pragma once

#include <string_view>

#include "core/check.hpp"
#include "ops/quantize_params.hpp"

namespace fp8mla {

// quantize_fp8_per_token_group's scales for p.input.rows rows of p.input.cols / p.group_size
// groups (fp8mla/quantize.hpp): dtype, shape, alignment and non-overlapping strides, into
// p.scales, its strides and p.scale_format (f32, f32 powers of two, ue8m0 or packed i32).
void set_group_scales(const ArgChecker& check, QuantizeGroupParams& p, const TensorView& scales,
                      std::string_view name, Device device, bool round_scale_to_pow2);

// quantize_nvfp4's e4m3 block scales in `layout` for p.input.rows rows of p.input.cols / 16
// blocks: linear [M, K/16] (any row stride) or the contiguous 128x4 swizzled 5-d or 2-d view,
// into p.layout, p.block_scales and p.scale_row_stride. The dtype and device are the caller's.
void set_nvfp4_scales(const ArgChecker& check, QuantizeNvfp4Params& p,
                      const TensorView& block_scales, std::string_view name,
                      Nvfp4ScaleLayout layout);

}  // namespace fp8mla
