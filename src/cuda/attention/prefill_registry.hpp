// The CUDA entry point of prefill_attention (fp8mla/attention.hpp), run by
// ops/prefill_attention.cpp once the arguments are checked. The variant table behind it is
// prefill_registry.cpp's.
#pragma once

#include "fp8mla/kernel_registry.hpp"
#include "fp8mla/stream.hpp"
#include "ops/prefill_attention_params.hpp"

namespace fp8mla::cuda {

// Launches the compiled variant `key` (a line of src/cuda/attention/prefill_variants.def) on p; a
// key that was not compiled is an ErrorCategory::kUnsupported error listing the compiled ones.
void prefill_attention(const AttentionVariantKey& key, const PrefillAttentionParams& p,
                       CudaStream stream);

}  // namespace fp8mla::cuda
