// The prefill attention variants (fp8mla/kernel_registry.hpp, docs/design.md section 4): the table
// of the compiled ones, built from prefill_variants.def in a CUDA build and empty without CUDA; the
// key of a call, computed by the one function both the runtime lookup and warm_up_attention use;
// the lookup, whose miss is an error naming the key and the compiled ones; each variant's one-time
// set-up.
#include "cuda/attention/prefill_registry.hpp"

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "fp8mla/error.hpp"
#if defined(FP8MLA_WITH_CUDA)
#include "cuda/attention/prefill_launch.hpp"
#include "cuda/attention/prefill_traits.cuh"
#endif

namespace fp8mla {
namespace {

struct PrefillVariant {
  AttentionVariantKey key;
  void (*prepare)();  // its one-time set-up on the current device
  void (*launch)(const PrefillAttentionParams&, CudaStream);
};

#if defined(FP8MLA_WITH_CUDA)
using cuda::attention::launch_prefill;
using cuda::attention::PrefillTraits;
using cuda::attention::prepare_prefill;
#define FP8MLA_PREFILL_VARIANT(name, fp8, causal, dqk, dv, fold)              \
  PrefillVariant{{fp8 ? DType::kE4M3 : DType::kBF16, causal, dqk, dv, fold},  \
                 &prepare_prefill<PrefillTraits<fp8, causal, dqk, dv, fold>>, \
                 &launch_prefill<PrefillTraits<fp8, causal, dqk, dv, fold>>},
constexpr PrefillVariant kVariants[] = {
#include "cuda/attention/prefill_variants.def"
};
#undef FP8MLA_PREFILL_VARIANT
#endif

std::span<const PrefillVariant> variants() {
#if defined(FP8MLA_WITH_CUDA)
  return kVariants;
#else
  return {};
#endif
}

// "k1; k2; ..." ("" for none).
std::string joined(const std::vector<AttentionVariantKey>& keys) {
  std::string s;
  for (const AttentionVariantKey& key : keys) s += concat(s.empty() ? "" : "; ", to_string(key));
  return s;
}

const PrefillVariant& find_variant(const AttentionVariantKey& key) {
  for (const PrefillVariant& v : variants()) {
    if (v.key == key) return v;
  }
  throw Error(ErrorCategory::kUnsupported,
              concat("prefill_attention: no CUDA kernel for (", to_string(key),
                     "); this build has: ", joined(compiled_attention_variants())));
}

}  // namespace

std::string to_string(const AttentionVariantKey& key) {
  return concat(dtype_name(key.dtype), key.causal ? " causal" : " non-causal", " Dqk ",
                key.head_dim_qk, " Dv ", key.head_dim_v,
                key.folds_prior_state ? " folding a prior state" : "");
}

AttentionVariantKey attention_variant_key(const PrefillAttentionArgs& args) {
  return {args.q.dtype(), args.causal, int(args.q.ndim() == 3 ? args.q.size(2) : 0),
          int(args.v.ndim() == 3 ? args.v.size(2) : 0), given(args.prior_out)};
}

std::vector<AttentionVariantKey> compiled_attention_variants() {
  std::vector<AttentionVariantKey> keys;
  for (const PrefillVariant& v : variants()) keys.push_back(v.key);
  return keys;
}

std::vector<AttentionVariantKey> attention_keys(const AttentionNeeds& needs) {
  std::vector<AttentionVariantKey> keys;
  for (DType dtype : needs.dtypes) {
    for (int call = 0; call < 3; ++call) {  // causal, non-causal, non-causal folding
      const bool causal = call == 0, fold = call == 2;
      if (causal ? !needs.causal : fold ? !needs.non_causal_fold : !needs.non_causal) continue;
      // Arguments shaped as a runtime call's (the key reads dtypes, head dims, the mask and
      // whether a prior state is given).
      PrefillAttentionArgs args;
      args.q = TensorView(nullptr, dtype, {0, 1, needs.head_dim_qk});
      args.v = TensorView(nullptr, dtype, {0, 1, needs.head_dim_v});
      args.causal = causal;
      if (fold) args.prior_out = TensorView(nullptr, DType::kBF16, {0, 1, needs.head_dim_v});
      const AttentionVariantKey key = attention_variant_key(args);
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    }
  }
  return keys;
}

void warm_up_attention(const AttentionNeeds& needs) {
  const std::vector<AttentionVariantKey> needed = attention_keys(needs);
  const std::vector<AttentionVariantKey> compiled = compiled_attention_variants();
  std::vector<AttentionVariantKey> missing;
  for (const AttentionVariantKey& key : needed) {
    if (std::find(compiled.begin(), compiled.end(), key) == compiled.end()) missing.push_back(key);
  }
  if (!missing.empty()) {
    throw Error(ErrorCategory::kUnsupported,
                concat("warm_up_attention: needed (", joined(needed), "); missing (",
                       joined(missing), "); this build has (",
                       compiled.empty() ? "none: built without CUDA" : joined(compiled), ")"));
  }
  for (const AttentionVariantKey& key : needed) find_variant(key).prepare();
}

namespace cuda {

void prefill_attention(const AttentionVariantKey& key, const PrefillAttentionParams& p,
                       CudaStream stream) {
  find_variant(key).launch(p, stream);
}

}  // namespace cuda
}  // namespace fp8mla
