// The table of compiled prefill attention variants (from prefill_variants.def) and the runtime
// lookup. A miss is an error naming the requested key and the compiled ones.
#pragma once

#include <cuda_runtime_api.h>

#include <span>
#include <string>

#include "ops/prefill_attention_params.hpp"

namespace fp8mla::cuda::attention {

struct PrefillVariantKey {
  bool fp8;
  bool causal;
  int dqk;
  int dv;
  friend bool operator==(const PrefillVariantKey&, const PrefillVariantKey&) = default;
};

struct PrefillVariant {
  const char* name;
  PrefillVariantKey key;
  void (*prepare)();
  void (*launch)(const PrefillAttentionParams&, cudaStream_t);
};

std::span<const PrefillVariant> prefill_variants();
std::string describe(const PrefillVariantKey& key);
// The variant for `key`; throws ErrorCategory::kUnsupported when none was compiled.
const PrefillVariant& find_prefill_variant(const PrefillVariantKey& key);

}  // namespace fp8mla::cuda::attention
