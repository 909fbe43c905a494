// The compiled kernel variants and their one-time set-up (docs/design.md section 4). The prefill
// attention kernel exists for the variants listed in src/cuda/attention/prefill_variants.def (none
// in a build without CUDA); src/cuda/attention/prefill_registry.cpp holds their table. The runtime
// lookup (prefill_attention) and warm_up_attention compute keys with the same function,
// attention_variant_key, so a key warmed up is the key a call asks for.
#pragma once

#include <string>
#include <vector>

#include "fp8mla/attention.hpp"
#include "fp8mla/dtype.hpp"

namespace fp8mla {

struct AttentionVariantKey {
  DType dtype = DType::kBF16;  // of q, k and v
  bool causal = true;
  int head_dim_qk = 192;
  int head_dim_v = 128;
  bool folds_prior_state = false;  // PrefillAttentionArgs::prior_out given
  friend bool operator==(const AttentionVariantKey&, const AttentionVariantKey&) = default;
};

std::string to_string(const AttentionVariantKey& key);  // e.g. "e4m3 causal Dqk 192 Dv 128"

// The variant prefill_attention(args) runs.
AttentionVariantKey attention_variant_key(const PrefillAttentionArgs& args);

// The compiled variants (none in a build without CUDA).
std::vector<AttentionVariantKey> compiled_attention_variants();

// What a configuration asks of the attention kernel: its input dtypes (e4m3 for the FP8 path,
// bf16 for the BF16 path: the dtype of the attention's inputs, not of the model), causal calls
// (extend tokens) and non-causal ones (prefix chunks), and the head dims; non-causal calls that
// fold a prior state (prefix chunks merged in their attention call, as the MLA layer runs them).
struct AttentionNeeds {
  std::vector<DType> dtypes = {DType::kE4M3};
  bool causal = true;
  bool non_causal = true;
  int head_dim_qk = 192;
  int head_dim_v = 128;
  bool non_causal_fold = false;
};

// Every key `needs` can produce, each through attention_variant_key on arguments shaped as the
// runtime call's.
std::vector<AttentionVariantKey> attention_keys(const AttentionNeeds& needs);

// Checks that every key of `needs` is compiled (ErrorCategory::kUnsupported listing the needed,
// missing and compiled keys otherwise) and does each one's one-time set-up (the kernel loaded,
// its shared-memory limit set) in the calling thread's current CUDA context, so no call pays for
// it later (a context made again by cudaDeviceReset gets it at its first launch).
void warm_up_attention(const AttentionNeeds& needs);

}  // namespace fp8mla
