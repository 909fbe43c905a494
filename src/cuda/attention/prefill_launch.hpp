// Host entry of one compiled prefill attention variant. Declared here for the variant table
// (prefill_registry.cpp); defined in prefill_launch.cuh and instantiated once per variant by the
// files CMake generates from prefill_variants.def.
#pragma once

#include <cuda_runtime_api.h>

#include "ops/prefill_attention_params.hpp"

namespace fp8mla::cuda::attention {

template <typename Traits>
void launch_prefill(const PrefillAttentionParams& p, cudaStream_t stream);

// Loads the variant's kernel in the current context and allows its shared memory, as its first
// launch there would (warm_up_attention: ahead of a CUDA graph capture).
template <typename Traits>
void prepare_prefill();

}  // namespace fp8mla::cuda::attention
