#include "cuda/attention/prefill_variants.hpp"

#include "cuda/attention/prefill_launch.hpp"
#include "cuda/attention/prefill_traits.cuh"
#include "fp8mla/error.hpp"

namespace fp8mla::cuda::attention {
namespace {

#define FP8MLA_PREFILL_VARIANT(name, fp8, causal, dqk, dv)              \
  PrefillVariant{#name,                                                 \
                 {fp8, causal, dqk, dv},                                \
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

std::string describe(const PrefillVariantKey& key) {
  return concat(key.fp8 ? "e4m3" : "bf16", key.causal ? " causal" : " non-causal", " Dqk ", key.dqk,
                " Dv ", key.dv);
}

const PrefillVariant& find_prefill_variant(const PrefillVariantKey& key) {
  for (const PrefillVariant& v : kVariants) {
    if (v.key == key) return v;
  }
  std::string compiled;
  for (const PrefillVariant& v : kVariants) {
    compiled += concat(compiled.empty() ? "" : "; ", describe(v.key));
  }
  throw Error(ErrorCategory::kUnsupported, concat("prefill_attention: no CUDA kernel for (",
                                                  describe(key), "); this build has: ", compiled));
}

}  // namespace fp8mla::cuda::attention

namespace fp8mla::cuda {

void prefill_attention(const PrefillAttentionParams& p, CudaStream stream) {
  const attention::PrefillVariantKey key{p.dtype == DType::kE4M3, p.causal, p.dqk, p.dv};
  attention::find_prefill_variant(key).launch(p, stream);
}

}  // namespace fp8mla::cuda
