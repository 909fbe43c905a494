// The output quantization key as the ops read it (fp8mla/output_quant.hpp), with errors naming
// the calling op and its output argument.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/check.hpp"
#include "fp8mla/output_quant.hpp"
#include "ops/output_quant_params.hpp"

namespace fp8mla {

// detect_output_quant_key with `check`'s op in its messages and `output_name` for the output;
// without scales the output must be `unquantized` (the op's unquantized output dtype).
OutputQuantKey detect_output_quant_key(const ArgChecker& check, const TensorView& output,
                                       std::string_view output_name, const TensorView& output_scale,
                                       const TensorView& output_block_scale,
                                       std::int64_t output_dim, DType unquantized);

// The attention ops' output check, made before their other checks: without scales `out` must be
// `unquantized`; with them the key is detected over output_row_width(out).
OutputQuantKey check_output_quant_key(const ArgChecker& check, const TensorView& out,
                                      const TensorView& output_scale,
                                      const TensorView& output_block_scale, DType unquantized);

// The standalone quantization of a keyed `out` holding `tokens` x `heads` x `dim` values: `out`
// [tokens, heads, dim] (dim / 2 bytes for e2m1x2) with a token's values contiguous, or
// [tokens, heads * dim], any token stride; the scales read as the standalone op reads them, over
// the first `tokens` scale rows (NVFP4: the 128x4 swizzled layout where the tensor can hold its
// tiles, linear otherwise; see docs/design.md section 6). {kNone} for kNone.
// The CPU path reads a static or global output scale on the host: one that is not finite and > 0
// is an error (the CUDA kernels read it on the device, unchecked).
void check_output_scale_value(const ArgChecker& check, const OutputQuantParams& p);

OutputQuantParams output_quant_params(const ArgChecker& check, OutputQuantKey key,
                                      const TensorView& out, const TensorView& output_scale,
                                      const TensorView& output_block_scale, std::int64_t tokens,
                                      std::int64_t heads, std::int64_t dim);

}  // namespace fp8mla
