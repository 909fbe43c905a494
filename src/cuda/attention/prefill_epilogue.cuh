// Epilogue of the prefill kernel: O / l (times the V descale) to bf16 with the caller's strides,
// and the natural-log LSE. For e4m3, l is the sum of the rounded P that O accumulated (the ones
// columns, o[64 + 2h]); the LSE always uses the f32 sum of the unrounded P. Rows that saw no key
// write O = 0 and LSE = -inf; rows past the sequence's queries write nothing.
#pragma once

#include <cstdint>

#include "cuda/attention/prefill_kernel_params.hpp"
#include "cuda/attention/prefill_scheduler.cuh"
#include "cuda/attention/prefill_softmax.cuh"

namespace fp8mla::cuda::attention {

// `row` is the sequence-local query row of the thread's row half 0.
template <typename Traits, bool kRowSum>
__device__ __forceinline__ void store_output(const PrefillKernelParams& p, const TileWork& w,
                                             int row, const OnlineSoftmax<Traits, kRowSum>& softmax,
                                             float v_scale, const float (&o)[Traits::kORegs]) {
  const int c = threadIdx.x % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row + 8 * h;
    if (r >= w.q_len) continue;
    const float sum = softmax.row_sum[h];
    const float o_sum = Traits::kOnesRows > 0 ? o[64 + 2 * h] : sum;
    const float inv = o_sum > 0.0f ? v_scale / o_sum : 0.0f;
    const std::int64_t token = w.q_start + r;
    std::uint16_t* out = p.out + token * p.out_token_stride + w.head * p.out_head_stride + 2 * c;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      std::uint32_t packed;
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;"
          : "=r"(packed)
          : "f"(o[4 * j + 2 * h + 1] * inv), "f"(o[4 * j + 2 * h] * inv));
      *reinterpret_cast<std::uint32_t*>(out + 8 * j) = packed;
    }
    if (p.lse != nullptr && c == 0) {
      p.lse[token * p.lse_token_stride + w.head * p.lse_head_stride] = softmax.lse(h);
    }
  }
}

}  // namespace fp8mla::cuda::attention
