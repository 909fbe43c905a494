// Which quantization an attention output asks for (docs/design.md section 6): the output
// quantization key, read from the output's dtype and the scale tensors given with it.
//
// The quantized attention output is the o_proj input: `output` is [T, W] (W = H * Dv) or the
// [T, H, Dv] view it comes from, any token and head strides, last dim contiguous; "rows" are its
// T tokens (dim 0). W counts values: a packed-FP4 output holds W / 2 bytes per row.
// detect_output_quant_key reads metadata only (dtypes, shapes, strides, devices): it works on
// views of any device, touches no data, allocates nothing on success and is cheap enough to call
// on every op call. A default TensorView() (no data, no dims; None in Python) is "not given"; a
// view with dims is given even without data (0 tokens).
#pragma once

#include <cstdint>
#include <string_view>

#include "fp8mla/tensor_view.hpp"

namespace fp8mla {

enum class OutputQuantKey : std::uint8_t {
  kNone,         // no quantization: the output is bf16
  kFp8Static,    // e4m3 at a per-tensor scale (`output_scale`)
  kFp8Group128,  // e4m3 per token and group of 128 along the row (`output_block_scale`)
  kFp8Group64,   // the same with groups of 64
  kNvfp4,        // e2m1x2 with e4m3 block scales of 16 and a global scale
};

// "none", "fp8_static", "fp8_group128", "fp8_group64", "nvfp4": the spellings of
// BackendCapabilities::output_quant and BackendRequirements::output_quant.
std::string_view to_string(OutputQuantKey key);

// The rules (T = output rows, D = output_dim, which must be the output's row width W):
//  - neither scale given: kNone; the output must then be bf16.
//  - `output_block_scale` with an e4m3 output: per-token-group FP8 of group size D / G, which
//    must be 64 or 128 (kFp8Group64, kFp8Group128). No `output_scale` with it. G, the group
//    count, is read from the scale tensor in each layout quantize_fp8_per_token_group takes:
//      f32 or ue8m0 [R, G], any strides (row-major, column-major (1, R), TMA-aligned
//      column-major (1, round_up(R, 4)), ...): G = size(1);
//      i32 [R, ceil(G / 4)] (packed UE8M0, 4 groups a word): G is whichever of D / 64 and
//      D / 128 packs into size(1) words; when both do (D <= 256) the layout cannot tell the
//      group sizes apart and it is an error (use ue8m0 bytes).
//    R, the scale rows, must be at least T (a scale tensor sized for a padded token count is
//    fine).
//  - `output_block_scale` with an e2m1x2 output: kNvfp4. D a multiple of 16; the block scales
//    e4m3, as quantize_nvfp4 writes them: linear [R, D / 16] or the 128x4 swizzled 2-d
//    [R, round_up(D / 16, 4)] (R rows) or 5-d [R / 128, round_up(D / 16, 4) / 4, 32, 4, 4]
//    (128 rows a tile), R >= T; and `output_scale`, the global scale, is required.
//  - `output_scale` alone with an e4m3 output: kFp8Static.
//  - `output_scale` is always one f32 (shape [] or [1]); every scale is on the output's device.
// Any other combination (both scales for group FP8, a scale with a bf16 output, a scale with
// an output that is neither e4m3 nor e2m1x2, an e4m3 or e2m1x2 output without scales, a group
// count that does not divide D, too few scale rows, a wrong scale dtype, D not the row width, a
// last dim that is not contiguous) throws ErrorCategory::kInvalidArgument naming what was
// expected and what was given. Without scales only the output's dtype is checked.
// The values in one row of `output`: the product of dims 1.. (of a 2-d or 3-d view), doubled for
// e2m1x2 (two values a byte); 0 for fewer than 2 dims. The output_dim the attention ops pass.
std::int64_t output_row_width(const TensorView& output);

OutputQuantKey detect_output_quant_key(const TensorView& output, const TensorView& output_scale,
                                       const TensorView& output_block_scale,
                                       std::int64_t output_dim);

}  // namespace fp8mla
