// The attention ops' fused output quantization on the CPU (ops/output_quant_params.hpp): the
// standalone ops' own CPU code over the op's bf16 output, so fused and unfused give one result.
#include "ops/output_quant_params.hpp"

namespace fp8mla::cpu {

void quantize_output(OutputQuantParams p, const Rows& input) {
  if (input.rows == 0) return;
  switch (p.key) {
    case OutputQuantKey::kNone:
      return;
    case OutputQuantKey::kFp8Static:
      p.fp8.input = input;
      quantize_fp8(p.fp8);
      return;
    case OutputQuantKey::kFp8Group128:
    case OutputQuantKey::kFp8Group64:
      p.group.input = input;
      quantize_fp8_per_token_group(p.group);
      return;
    case OutputQuantKey::kNvfp4:
      p.nvfp4.input = input;
      quantize_nvfp4(p.nvfp4);
      return;
  }
}

}  // namespace fp8mla::cpu
