// Plain parameters of the attention ops' fused output quantization (docs/design.md section 6):
// the standalone quantization op of the key (ops/quantize_params.hpp) with its output and scales
// set by the argument checks (ops/output_quant.cpp). Its input, the op's bf16 output rows
// [T, H * Dv], is the implementation's own: the CPU path computes it into a buffer first.
#pragma once

#include "fp8mla/output_quant.hpp"
#include "ops/quantize_params.hpp"

namespace fp8mla {

struct OutputQuantParams {
  OutputQuantKey key = OutputQuantKey::kNone;
  QuantizeFp8Params fp8;      // kFp8Static: a scale_inv in memory (output_scale)
  QuantizeGroupParams group;  // kFp8Group128, kFp8Group64
  QuantizeNvfp4Params nvfp4;  // kNvfp4: global scale output_scale
  friend bool operator==(const OutputQuantParams&, const OutputQuantParams&) = default;
};

namespace cpu {
// The key's standalone quantization of `input` (bf16 [n, W] rows, the first n of `out`'s T): the
// same code as quantize_fp8, quantize_fp8_per_token_group and quantize_nvfp4 run. With n < T (a
// padded batch) rows n .. T of `out` and the scales are not written; the swizzled NVFP4 padding
// rows are still T .. round_up(T, 128). Nothing for kNone.
void quantize_output(OutputQuantParams p, const Rows& input);
}  // namespace cpu

}  // namespace fp8mla
