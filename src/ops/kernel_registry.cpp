#include "fp8mla/kernel_registry.hpp"

#include <algorithm>

#include "fp8mla/error.hpp"
#include "ops/prefill_attention_params.hpp"

namespace fp8mla {

std::string to_string(const AttentionVariantKey& key) {
  return concat(dtype_name(key.dtype), key.causal ? " causal" : " non-causal", " Dqk ",
                key.head_dim_qk, " Dv ", key.head_dim_v);
}

AttentionVariantKey attention_variant_key(const PrefillAttentionArgs& args) {
  return {args.q.dtype(), args.causal, int(args.q.ndim() == 3 ? args.q.size(2) : 0),
          int(args.v.ndim() == 3 ? args.v.size(2) : 0)};
}

std::vector<AttentionVariantKey> compiled_attention_variants() {
#if defined(FP8MLA_WITH_CUDA)
  return cuda::compiled_prefill_variants();
#else
  return {};
#endif
}

std::vector<AttentionVariantKey> attention_keys(const AttentionNeeds& needs) {
  std::vector<AttentionVariantKey> keys;
  for (DType dtype : needs.dtypes) {
    for (bool causal : {true, false}) {
      if (causal ? !needs.causal : !needs.non_causal) continue;
      // Arguments shaped as a runtime call's (the key reads dtypes, head dims and the mask).
      PrefillAttentionArgs args;
      args.q = TensorView(nullptr, dtype, {0, 1, needs.head_dim_qk});
      args.v = TensorView(nullptr, dtype, {0, 1, needs.head_dim_v});
      args.causal = causal;
      const AttentionVariantKey key = attention_variant_key(args);
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    }
  }
  return keys;
}

void warm_up_attention(const AttentionNeeds& needs) {
  const std::vector<AttentionVariantKey> needed = attention_keys(needs);
  const std::vector<AttentionVariantKey> compiled = compiled_attention_variants();
  std::string missing, all_needed, all_compiled;
  for (const AttentionVariantKey& key : needed) {
    all_needed += concat(all_needed.empty() ? "" : "; ", to_string(key));
    if (std::find(compiled.begin(), compiled.end(), key) == compiled.end()) {
      missing += concat(missing.empty() ? "" : "; ", to_string(key));
    }
  }
  for (const AttentionVariantKey& key : compiled) {
    all_compiled += concat(all_compiled.empty() ? "" : "; ", to_string(key));
  }
  if (!missing.empty()) {
    throw Error(ErrorCategory::kUnsupported,
                concat("warm_up_attention: needed (", all_needed, "); missing (", missing,
                       "); this build has (",
                       all_compiled.empty() ? "none: built without CUDA" : all_compiled, ")"));
  }
#if defined(FP8MLA_WITH_CUDA)
  for (const AttentionVariantKey& key : needed) cuda::prepare_prefill_variant(key);
#endif
}

}  // namespace fp8mla
