// The table of compiled prefill attention variants (from prefill_variants.def) and the runtime
// lookup. A miss is an error naming the requested key and the compiled ones.
#pragma once

#include <cuda_runtime_api.h>

#include <span>
#include <string>

#include "fp8mla/kernel_registry.hpp"
#include "ops/prefill_attention_params.hpp"

namespace fp8mla::cuda::attention {

struct PrefillVariant {
  const char* name;
  AttentionVariantKey key;
  void (*prepare)();
  void (*launch)(const PrefillAttentionParams&, cudaStream_t);
};

std::span<const PrefillVariant> prefill_variants();
// The variant for `key`; throws ErrorCategory::kUnsupported naming the key and the compiled ones
// when there is none.
const PrefillVariant& find_prefill_variant(const AttentionVariantKey& key);

}  // namespace fp8mla::cuda::attention
