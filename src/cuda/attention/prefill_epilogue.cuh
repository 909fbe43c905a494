// Epilogue of the prefill kernel: a consumer warpgroup hands it each finished work tile, O (not
// yet normalized) and the softmax's row state of its 64 rows. This one rounds O / l (times the V
// descale) to bf16 and stores it with the caller's strides, or with an output quantization key
// quantizes those bf16 values (prefill_output_quant.cuh: the key is a runtime switch, taken once
// a row half); and it stores the natural-log LSE. For e4m3, l is the sum of the rounded P that O
// accumulated (the ones columns, o[64 + 2h]); the LSE always uses the f32 sum of the unrounded P.
// Rows that saw no key write O = 0 and LSE = -inf; rows past the sequence's queries write
// nothing.
#pragma once

#include <cstdint>

#include "cuda/attention/prefill_kernel_params.hpp"
#include "cuda/attention/prefill_output_quant.cuh"
#include "cuda/attention/prefill_scheduler.cuh"
#include "cuda/attention/prefill_softmax.cuh"

namespace fp8mla::cuda::attention {

// Exchanges a word with the neighbour lane so that the even lane of each pair holds word 0 and
// the odd lane word 1 of both lanes, in lane order.
__device__ __forceinline__ void exchange_pair(std::uint32_t (&x)[2], bool odd) {
  const std::uint32_t other = __shfl_xor_sync(0xffffffff, odd ? x[0] : x[1], 1);
  x[0] = odd ? other : x[0];
  x[1] = odd ? x[1] : other;
}

// The output and the LSE. A quad holds a row's 128 dims as 16 blocks of 8, two per lane and
// block. With p.out_vectors, lane pairs exchange bf16 words so that each lane stores 8 bytes at
// once and a quad whole 32-byte sectors (quantized: the quad transposes its bytes to the same
// end): half-sector stores cost short sequences about a tenth of their time, the exchanges little.
template <typename Traits>
class OutputEpilogue {
 public:
  __device__ explicit OutputEpilogue(const PrefillKernelParams& p) : p_(p) {}

  // What the epilogue writes that no work tile owns, before any tile runs (after the PDL wait).
  __device__ static void write_untiled(const PrefillKernelParams& p) { zero_padding_rows(p.quant); }

  // `row`: the sequence-local query row of the thread's row half 0; o: the sum of P V, not
  // normalized (e4m3: with the ones columns).
  template <bool kRowSum>
  __device__ __forceinline__ void store(const TileWork& w, int row,
                                        const OnlineSoftmax<Traits, kRowSum>& softmax,
                                        float v_scale, const float (&o)[Traits::kORegs]) const {
    const int c = threadIdx.x % 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row + 8 * h;  // the same for the four lanes of a quad
      const float sum = softmax.row_sum[h];
      const float o_sum = Traits::kOnesRows > 0 ? o[64 + 2 * h] : sum;
      const float inv = o_sum > 0.0f ? v_scale / o_sum : 0.0f;
      std::uint32_t words[16];  // block j: dims 8j + 2c, 8j + 2c + 1
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;"
            : "=r"(words[j])
            : "f"(o[4 * j + 2 * h + 1] * inv), "f"(o[4 * j + 2 * h] * inv));
      }
      const std::int64_t token = w.q_start + r;
      if (p_.quant.key != OutputQuantKey::kNone) {
        store_quantized_row(p_.quant, p_.out_vectors, token, w.head, words, r < w.q_len);
      } else {
        store_bf16_row(token, w.head, words, r < w.q_len);
      }
      if (p_.lse != nullptr && c == 0 && r < w.q_len) {
        p_.lse[token * p_.lse_token_stride + w.head * p_.lse_head_stride] = softmax.lse(h);
      }
    }
  }

 private:
  // The row's bf16 pairs words[j] (dims 8j + 2c, 8j + 2c + 1); `valid`: the row exists.
  __device__ __forceinline__ void store_bf16_row(std::int64_t token, int head,
                                                 const std::uint32_t (&words)[16],
                                                 bool valid) const {
    const int c = threadIdx.x % 4;
    std::uint16_t* dst = p_.out + token * p_.out_token_stride + head * p_.out_head_stride;
    if (p_.out_vectors) {
      const bool odd = c & 1;
#pragma unroll
      for (int j = 0; j < 16; j += 2) {
        std::uint32_t x[2] = {words[j], words[j + 1]};
        exchange_pair(x, odd);  // every lane, whether its row exists or not
        // Lane c: dims 2 (c & 2) .. + 3 of block j + c % 2.
        if (valid) {
          *reinterpret_cast<uint2*>(dst + 8 * (j + odd) + 2 * (c & 2)) = make_uint2(x[0], x[1]);
        }
      }
    } else if (valid) {
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        *reinterpret_cast<std::uint32_t*>(dst + 8 * j + 2 * c) = words[j];
      }
    }
  }

  const PrefillKernelParams& p_;
};

}  // namespace fp8mla::cuda::attention
