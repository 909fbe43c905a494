// Online softmax of the prefill kernel, on the wgmma accumulator layout, and the conversion of P
// to the register layout of wgmma's A operand.
//
// Accumulator layout (m64 n128, per warp 16 rows): lane (g = lane / 4, c = lane % 4) holds, for
// each 8-column block j, s[4j + 0..1] = row g, columns 8j + 2c + {0, 1}, and s[4j + 2..3] = the
// same columns of row g + 8. A thread's two rows are "row halves" 0 and 1; the four lanes of a
// quad share them, so row reductions are two shuffles.
//
// The row max is taken on the raw scores s; P = exp2(s * scale_log2 - max * scale_log2) with
// scale_log2 = softmax_scale * log2(e) (* the FP8 descales) > 0 is one FFMA and one ex2 an
// element. The row sum l stays a per-thread partial until the end. A row with no visible key so
// far has max -inf and contributes exp2(-inf) = 0 without producing NaN.
//
// Every product that meets an addition is written out with its rounding (fmaf, __fmul_rn,
// __fadd_rn): left to the compiler, each inlined copy of this code (first, middle and last turns,
// masked or not, one work tile or many a CTA) chose FMA contraction on its own, so the same row
// got different bits from different copies; that broke batch invariance whenever a change moved
// the copies apart.
#pragma once

#include <cstdint>

#include "cuda/attention/prefill_scheduler.cuh"
#include "cuda/common/convert.cuh"

namespace fp8mla::cuda::attention {

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// kRowSum = false (e4m3 without an LSE, see consume()) leaves row_sum at 0.
template <typename Traits, bool kRowSum = true>
struct OnlineSoftmax {
  float scale_log2;
  float row_max[2];     // raw score units, over the keys seen so far
  float row_sum[2];     // this thread's share of sum(exp2((s - row_max) * scale_log2)) * 2^kPShift
  float correction[2];  // of the last update: the factor earlier sums were scaled by
  float exp_offset[2];  // of the last fold_max: kPShift - row_max * scale_log2

  __device__ void init(float scale) {
    scale_log2 = scale;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.0f;
  }

  // Masks keys outside the sequence or (causal) past each row's diagonal. `row` is the
  // sequence-local query row of row half 0 (row half 1 is row + 8). Element i holds key key0 +
  // offset(i), so each test compares a compile-time offset with a per-row bound: one compare and
  // one select an element. Keys before the sequence only occur in its first tile when that starts
  // early for alignment (key0 < 0).
  __device__ void mask(float (&s)[64], const TileWork& w, int n, int row) const {
    mask_lane(s, w, n, row, int(threadIdx.x % 4));
  }
  // The same for the thread whose lane in its quad is `lane` (host-callable: the CPU tests
  // check it on every lane of a warpgroup).
  FP8MLA_HOST_DEVICE static void mask_lane(float (&s)[64], const TileWork& w, int n, int row,
                                           int lane) {
    // Element i is column 8 * (i / 4) + 2c + i % 2 of row half (i / 2) % 2.
    constexpr auto offset = [](int i) { return Traits::key_of_column(8 * (i / 4) + i % 2); };
    const int key0 = tile_first_key(w, n, Traits::kBlockN) + Traits::kLaneKeyStep * lane;
    int end[2];  // per row half: offsets from key0 at or past this are masked
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int limit =
          Traits::kIsCausal ? min(w.k_len, row + 8 * h + 1 + w.k_len - w.q_len) : w.k_len;
      end[h] = limit - key0;
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      if (offset(i) >= end[(i / 2) % 2]) s[i] = -INFINITY;
    }
    if (key0 < 0) {
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        if (offset(i) < -key0) s[i] = -INFINITY;
      }
    }
  }

  // Folds tile s into the running max and sum and turns s into P = exp2((s - max) * scale_log2)
  // * 2^kPShift; `correction` is then the factor that earlier sums and O must take (rescale).
  // kBlocks = 8: the tile's first 64 keys only (s's first 32 registers; the caller sees to the
  // others, whose keys no row sees).
  template <int kBlocks = 16>
  __device__ void update(float (&s)[64]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      fold_max<kBlocks>(s, h);
      scale_scores<kBlocks>(s, h);
      exp2_scores<kBlocks>(s, h);
    }
  }

  // update(s) in its two steps, per row half h (rows r and r + 8 are independent): the running
  // max (and the correction), then the exp2s. A consumer can so place the steps around its P V's
  // wait.
  template <int kBlocks = 16>
  __device__ __forceinline__ void fold_max(const float (&s)[64], int h) {
    // Four chains of 4 and a tree of them: 7 dependent steps where one chain takes 17, with
    // few live temporaries (a full tree of 16 spills).
    float v[4];
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) {
      const float pair = fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]);
      v[j % 4] = j < 4 ? pair : fmaxf(v[j % 4], pair);
    }
    v[0] = fmaxf(v[0], v[1]);
    v[2] = fmaxf(v[2], v[3]);
    float m = fmaxf(row_max[h], fmaxf(v[0], v[2]));
    m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, 2));
    const float base = m == -INFINITY ? 0.0f : __fmul_rn(m, scale_log2);
    correction[h] = fast_exp2(fmaf(row_max[h], scale_log2, -base));
    row_max[h] = m;
    exp_offset[h] = __fadd_rn(Traits::kPShift, -base);
  }
  __device__ __forceinline__ void exponentiate(float (&s)[64], int h) {
    scale_scores(s, h);
    exp2_scores(s, h);
  }
  // exponentiate(s, h) in its two steps: the exponents, then their exp2s (and the row sum).
  template <int kBlocks = 16>
  __device__ __forceinline__ void scale_scores(float (&s)[64], int h) const {
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[4 * j + 2 * h + e];
        x = fmaf(x, scale_log2, exp_offset[h]);
      }
    }
  }
  template <int kBlocks = 16>
  __device__ __forceinline__ void exp2_scores(float (&s)[64], int h) {
    float sum = kRowSum ? __fmul_rn(row_sum[h], correction[h]) : 0.0f;
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[4 * j + 2 * h + e];
        x = fast_exp2(x);
        if constexpr (kRowSum) sum += x;
      }
    }
    if constexpr (kRowSum) row_sum[h] = sum;
  }

  // Scales O by the last update's correction (after update(s)).
  __device__ void rescale(float (&o)[Traits::kORegs]) const {
#pragma unroll
    for (int h = 0; h < 2; ++h) rescale_half(o, h);
  }

  // The quad's full row sums (call once, after the last tile).
  __device__ void finish() {
    if constexpr (kRowSum) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        row_sum[h] += __shfl_xor_sync(0xffffffff, row_sum[h], 1);
        row_sum[h] += __shfl_xor_sync(0xffffffff, row_sum[h], 2);
      }
    }
  }

  // Natural-log LSE of row half h (needs finish()): -inf when the row saw no key.
  __device__ float lse(int h) const {
    constexpr float kLn2 = 0.69314718055994531f;
    return row_sum[h] > 0.0f
               ? fmaf(row_max[h], scale_log2, __fadd_rn(__log2f(row_sum[h]), -Traits::kPShift)) *
                     kLn2
               : -INFINITY;
  }

 private:
  __device__ void rescale_half(float (&o)[Traits::kORegs], int h) const {
#pragma unroll
    for (int j = 0; j < Traits::kPvN / 8; ++j) {
      o[4 * j + 2 * h] = __fmul_rn(o[4 * j + 2 * h], correction[h]);
      o[4 * j + 2 * h + 1] = __fmul_rn(o[4 * j + 2 * h + 1], correction[h]);
    }
  }
};

// P (accumulator layout, 64 f32) to the A-operand registers of the P V wgmma, one [4] per
// k-step. bf16 (k16): the layouts agree, a pair of columns per register. e4m3 (k32): register
// 2 * half + h of k-step ks wants keys 16m + 4c .. + 3 of row half h, m = 2 * ks + half. With K in
// even-odd order (see prefill_traits.cuh) lane c holds them itself: keys 16m + 4c + {0, 2} in
// block 2m and 16m + 4c + {1, 3} in block 2m + 1, so a register is two conversions.
template <typename Traits>
__device__ __forceinline__ void p_to_operand(
    const float (&s)[64], std::uint32_t (&a)[Traits::kBlockN / Traits::kMmaK][4]) {
  if constexpr (Traits::kFp8) {
    static_assert(Traits::kEvenOddKeys);
#pragma unroll
    for (int ks = 0; ks < Traits::kBlockN / 32; ++ks) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int even = 4 * (4 * ks + 2 * half) + 2 * h;  // block 2m, row half h
          const int odd = even + 4;                          // block 2m + 1
          a[ks][2 * half + h] = std::uint32_t(cvt_e4m3x2(s[even], s[odd])) |
                                (std::uint32_t(cvt_e4m3x2(s[even + 1], s[odd + 1])) << 16);
        }
      }
    }
  } else {
#pragma unroll
    for (int ks = 0; ks < Traits::kBlockN / 16; ++ks) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        // r: (row half r % 2) of block 2ks + r / 2.
        const int i = 4 * (2 * ks + r / 2) + 2 * (r % 2);
        std::uint32_t packed;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(s[i + 1]), "f"(s[i]));
        a[ks][r] = packed;
      }
    }
  }
}

}  // namespace fp8mla::cuda::attention
