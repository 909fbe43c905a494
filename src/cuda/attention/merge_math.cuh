// The arithmetic of merging two attention states (fp8mla/attention.hpp, op 9), shared by the merge
// kernels (merge_states.cu) and the prefill epilogue's fold of a prior state
// (prefill_epilogue.cuh), so that both give the same bytes. The operations and their order are
// the CPU twin's (src/cpu/merge_states.cpp); only expf/logf differ from std::exp/std::log.
#pragma once

#include <cuda_runtime.h>

namespace fp8mla::cuda {

// The weights of a row's two states.
struct MergeWeights {
  float m, w_a, w_b, s;
  bool empty;  // both states empty: O = 0, lse = -inf
};

__device__ __forceinline__ MergeWeights merge_weights(float la, float lb) {
  // +inf is how FlashAttention-3 reports a row without keys: an empty state, as -inf.
  la = la == INFINITY ? -INFINITY : la;
  lb = lb == INFINITY ? -INFINITY : lb;
  MergeWeights w;
  w.empty = la == -INFINITY && lb == -INFINITY;
  w.m = la > lb ? la : lb;
  w.w_a = w.empty ? 0.0f : expf(la - w.m);
  w.w_b = w.empty ? 0.0f : expf(lb - w.m);
  w.s = w.w_a + w.w_b;
  return w;
}

__device__ __forceinline__ float merged_lse(const MergeWeights& w) {
  return w.empty ? -INFINITY : w.m + logf(w.s);
}

// kVec merged values; load_a(x) / load_b(x) read kVec values of state a / b. A side of weight 0
// is not read.
template <int kVec, typename LoadA, typename LoadB>
__device__ __forceinline__ void merge_values(const MergeWeights& w, LoadA&& load_a, LoadB&& load_b,
                                             float (&y)[kVec]) {
  if (w.empty) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) y[i] = 0.0f;
  } else if (w.w_b == 0.0f) {
    float xa[kVec];
    load_a(xa);
#pragma unroll
    for (int i = 0; i < kVec; ++i) y[i] = (w.w_a * xa[i]) / w.s;
  } else if (w.w_a == 0.0f) {
    float xb[kVec];
    load_b(xb);
#pragma unroll
    for (int i = 0; i < kVec; ++i) y[i] = (w.w_b * xb[i]) / w.s;
  } else {
    float xa[kVec], xb[kVec];
    load_a(xa);
    load_b(xb);
    // Both products rounded before the sum, as the CPU twin computes it: left to the compiler,
    // the sum contracts into an fma in some instantiations and not in others.
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      y[i] = __fadd_rn(__fmul_rn(w.w_a, xa[i]), __fmul_rn(w.w_b, xb[i])) / w.s;
    }
  }
}

}  // namespace fp8mla::cuda
