// The output quantization key as the ops read it (fp8mla/output_quant.hpp), with errors naming
// the calling op and its output argument.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/check.hpp"
#include "fp8mla/output_quant.hpp"

namespace fp8mla {

// detect_output_quant_key with `check`'s op in its messages and `output_name` for the output;
// without scales the output must be `unquantized` (the op's unquantized output dtype).
OutputQuantKey detect_output_quant_key(const ArgChecker& check, const TensorView& output,
                                       std::string_view output_name, const TensorView& output_scale,
                                       const TensorView& output_block_scale,
                                       std::int64_t output_dim, DType unquantized);

// The attention ops' output check: without scales `out` must be `unquantized`; with them the
// key is detected (over output_row_width(out)) and, since no op fuses a quantization yet,
// rejected as ErrorCategory::kUnsupported.
void check_unquantized_output(const ArgChecker& check, const TensorView& out,
                              const TensorView& output_scale, const TensorView& output_block_scale,
                              DType unquantized);

}  // namespace fp8mla
