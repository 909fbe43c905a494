// Epilogue of the prefill kernel: a consumer warpgroup hands it each finished work tile, O (not
// yet normalized) and the softmax's row state of its 64 rows. This one rounds O / l (times the V
// descale) to bf16 and stores it with the caller's strides, or with an output quantization key
// quantizes those bf16 values (prefill_output_quant.cuh: the key is a runtime switch, taken once
// a row half); and it stores the natural-log LSE. For e4m3, l is the sum of the rounded P that O
// accumulated (the ones columns, o[64 + 2h]); the LSE always uses the f32 sum of the unrounded P.
// Rows that saw no key write O = 0 and LSE = -inf; rows past the sequence's queries write
// nothing. A variant that folds a prior state (Traits::kFoldsPrior) first merges the row's bf16 O
// and LSE into it with the merge kernels' arithmetic (merge_math.cuh): the bytes of this kernel
// without it followed by merge_attention_states.
#pragma once

#include <cstdint>

#include "cuda/attention/merge_math.cuh"
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
    if constexpr (Traits::kFoldsPrior) {
      store_folded(w, row, softmax, v_scale, o);
      return;
    }
    // The plain variants keep this form: their machine code is the one measured (a store
    // helper shared with store_folded changed their scheduling).
    const int c = threadIdx.x % 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row + 8 * h;  // the same for the four lanes of a quad
      std::uint32_t words[16];
      round_row(softmax, v_scale, o, h, words);
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
  // Row half h of O / l (times the V descale) as bf16 pairs: words[j] holds dims 8j + 2c and
  // 8j + 2c + 1 (c: the lane in its quad).
  template <bool kRowSum>
  __device__ __forceinline__ static void round_row(const OnlineSoftmax<Traits, kRowSum>& softmax,
                                                   float v_scale, const float (&o)[Traits::kORegs],
                                                   int h, std::uint32_t (&words)[16]) {
    const float sum = softmax.row_sum[h];
    const float o_sum = Traits::kOnesRows > 0 ? o[64 + 2 * h] : sum;
    const float inv = o_sum > 0.0f ? v_scale / o_sum : 0.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;"
          : "=r"(words[j])
          : "f"(o[4 * j + 2 * h + 1] * inv), "f"(o[4 * j + 2 * h] * inv));
    }
  }

  // The folding variant's store: both row halves rounded to bf16 first (O's registers are free
  // before the fold's loads), each merged with its prior state, then stored as store() does.
  template <bool kRowSum>
  __device__ __forceinline__ void store_folded(const TileWork& w, int row,
                                               const OnlineSoftmax<Traits, kRowSum>& softmax,
                                               float v_scale,
                                               const float (&o)[Traits::kORegs]) const {
    static_assert(kRowSum, "folding a prior state needs the row's LSE");
    const int c = threadIdx.x % 4;
    std::uint32_t words[2][16];
#pragma unroll
    for (int h = 0; h < 2; ++h) round_row(softmax, v_scale, o, h, words[h]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row + 8 * h;
      const std::int64_t token = w.q_start + r;
      const float lse = fold_prior(token, w.head, r < w.q_len, softmax.lse(h), words[h]);
      if (p_.quant.key != OutputQuantKey::kNone) {
        store_quantized_row(p_.quant, p_.out_vectors, token, w.head, words[h], r < w.q_len);
      } else {
        store_bf16_row(token, w.head, words[h], r < w.q_len);
      }
      if (p_.lse != nullptr && c == 0 && r < w.q_len) {
        p_.lse[token * p_.lse_token_stride + w.head * p_.lse_head_stride] = lse;
      }
    }
  }

  // Merges the prior state of row (token, head) with this tile's: words[j] (dims 8j + 2c,
  // 8j + 2c + 1 of the bf16 O) become the merged bf16 pairs; returns the merged LSE. Lane 0 of the
  // quad reads the prior LSE (before it may overwrite it: lse may be prior_lse) and shares it;
  // each lane reads the prior O of its own dims before any lane stores (out may be prior_out).
  __device__ __forceinline__ float fold_prior(std::int64_t token, int head, bool valid, float lse,
                                              std::uint32_t (&words)[16]) const {
    const int lane = threadIdx.x % 32;
    float prior_lse = -INFINITY;
    if (valid && lane % 4 == 0) {
      prior_lse = p_.prior_lse[token * p_.prior_lse_token_stride + head * p_.prior_lse_head_stride];
    }
    prior_lse = __shfl_sync(0xffffffff, prior_lse, lane & ~3);
    if (!valid) return lse;
    const MergeWeights weights = merge_weights(prior_lse, lse);
    const auto* prior =
        reinterpret_cast<const std::uint32_t*>(p_.prior_out + token * p_.prior_out_token_stride +
                                               head * p_.prior_out_head_stride + 2 * (lane % 4));
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const auto pair = [](std::uint32_t word, float(&x)[2]) {
        x[0] = decode_bf16(std::uint16_t(word));
        x[1] = decode_bf16(std::uint16_t(word >> 16));
      };
      float y[2];
      merge_values<2>(
          weights, [&](float(&x)[2]) { pair(prior[4 * j], x); },
          [&](float(&x)[2]) { pair(words[j], x); }, y);
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(words[j]) : "f"(y[1]), "f"(y[0]));
    }
    return merged_lse(weights);
  }

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
