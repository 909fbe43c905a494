#include "cuda/attention/prefill_variants.hpp"

#include "cuda/attention/prefill_launch.hpp"
#include "cuda/attention/prefill_traits.cuh"
#include "fp8mla/error.hpp"

namespace fp8mla::cuda::attention {
namespace {

#define FP8MLA_PREFILL_VARIANT(name, fp8, causal, dqk, dv)              \
  PrefillVariant{#name,                                                 \
                 {fp8 ? DType::kE4M3 : DType::kBF16, causal, dqk, dv},  \
                 &prepare_prefill<PrefillTraits<fp8, causal, dqk, dv>>, \
                 &launch_prefill<PrefillTraits<fp8, causal, dqk, dv>>},
constexpr PrefillVariant kVariants[] = {
#include "cuda/attention/prefill_variants.def"
};
#undef FP8MLA_PREFILL_VARIANT

}  // namespace

std::span<const PrefillVariant> prefill_variants() {
  return kVariants;
}

const PrefillVariant& find_prefill_variant(const AttentionVariantKey& key) {
  for (const PrefillVariant& v : kVariants) {
    if (v.key == key) return v;
  }
  std::string compiled;
  for (const PrefillVariant& v : kVariants) {
    compiled += concat(compiled.empty() ? "" : "; ", to_string(v.key));
  }
  throw Error(ErrorCategory::kUnsupported, concat("prefill_attention: no CUDA kernel for (",
                                                  to_string(key), "); this build has: ", compiled));
}

}  // namespace fp8mla::cuda::attention

namespace fp8mla::cuda {

void prefill_attention(const AttentionVariantKey& key, const PrefillAttentionParams& p,
                       CudaStream stream) {
  attention::find_prefill_variant(key).launch(p, stream);
}

std::vector<AttentionVariantKey> compiled_prefill_variants() {
  std::vector<AttentionVariantKey> keys;
  for (const attention::PrefillVariant& v : attention::prefill_variants()) keys.push_back(v.key);
  return keys;
}

void prepare_prefill_variant(const AttentionVariantKey& key) {
  attention::find_prefill_variant(key).prepare();
}

}  // namespace fp8mla::cuda
