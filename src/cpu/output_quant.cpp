// The attention ops' fused output quantization on the CPU (ops/output_quant_params.hpp): the
// standalone ops' own CPU code over the op's bf16 output, so fused and unfused give one result.
// A padded call (fewer input rows than `out` has) writes the input's rows only, as the CUDA
// kernels do: the swizzled NVFP4 padding is that of `out`'s row count (docs/design.md section 6).
#include "ops/output_quant_params.hpp"

namespace fp8mla::cpu {

void quantize_output(OutputQuantParams p, const Rows& input) {
  switch (p.key) {
    case OutputQuantKey::kNone:
      return;
    case OutputQuantKey::kFp8Static:
      p.fp8.input = input;
      p.fp8.out.rows = input.rows;
      quantize_fp8(p.fp8);
      return;
    case OutputQuantKey::kFp8Group128:
    case OutputQuantKey::kFp8Group64:
      p.group.input = input;
      p.group.out.rows = input.rows;
      quantize_fp8_per_token_group(p.group);
      return;
    case OutputQuantKey::kNvfp4: {
      const std::int64_t rows = p.nvfp4.out.rows;
      p.nvfp4.input = input;
      p.nvfp4.out.rows = input.rows;
      quantize_nvfp4_rows(p.nvfp4);
      if (p.nvfp4.layout == Nvfp4ScaleLayout::kSwizzled128x4) {
        zero_swizzled_nvfp4_padding(p.nvfp4, rows, input.rows);
      }
      return;
    }
  }
}

}  // namespace fp8mla::cpu
