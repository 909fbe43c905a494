// Vectorised element access for the memory-bound kernels: 16-byte loads of bf16/f16/f32 turned
// into fp32, and the 32-bit fast division that maps a flat vector index to (row, column).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/convert.cuh"
#include "fp8mla/dtype.hpp"

namespace fp8mla::cuda {

// Input element types: storage and widening to fp32.
// The 16-bit ones also widen a packed pair (low half first) and take the lane-wise
// max(|a|, |b|) of two pairs, NaN-propagating.
struct Bf16In {
  using Storage = std::uint16_t;
  __device__ static float to_f32(Storage x) { return decode_bf16(x); }
  __device__ static float2 to_f32x2(std::uint32_t x) {
    return {__uint_as_float(x << 16), __uint_as_float(x & 0xFFFF0000u)};
  }
  __device__ static std::uint32_t abs_max_nan(std::uint32_t a, std::uint32_t b) {
    return abs_max_nan_bf16x2(a, b);
  }
};
struct F16In {
  using Storage = std::uint16_t;
  __device__ static float to_f32(Storage x) { return cvt_f16_to_f32(x); }
  __device__ static float2 to_f32x2(std::uint32_t x) { return cvt_f16x2_to_f32x2(x); }
  __device__ static std::uint32_t abs_max_nan(std::uint32_t a, std::uint32_t b) {
    return abs_max_nan_f16x2(a, b);
  }
};
struct F32In {
  using Storage = float;
  __device__ static float to_f32(Storage x) { return x; }
};

// Calls fn.template operator()<InputType>() for the runtime dtype (bf16, f16 or f32).
template <typename Fn>
void dispatch_input_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kBF16:
      fn.template operator()<Bf16In>();
      break;
    case DType::kF16:
      fn.template operator()<F16In>();
      break;
    default:
      fn.template operator()<F32In>();
      break;
  }
}

// The same for ops that take bf16 or f16 only.
template <typename Fn>
void dispatch_16bit(DType dtype, Fn&& fn) {
  if (dtype == DType::kBF16) {
    fn.template operator()<Bf16In>();
  } else {
    fn.template operator()<F16In>();
  }
}

// Calls fn.template operator()<kWide>() when `wide`, else fn.template operator()<1>(): the vector
// variant of a kernel or its scalar one.
template <int kWide, typename Fn>
void dispatch_vector_width(bool wide, Fn&& fn) {
  if (wide) {
    fn.template operator()<kWide>();
  } else {
    fn.template operator()<1>();
  }
}

// kN consecutive elements as fp32. When kN elements fill whole 16-byte words the address must be
// 16-byte aligned and each word is one LDG.128; otherwise the loads are scalar.
template <typename In, int kN>
__device__ __forceinline__ void load_f32(const typename In::Storage* p, float (&out)[kN]) {
  using S = typename In::Storage;
  constexpr int kPerWord = 16 / sizeof(S);
  if constexpr (kN % kPerWord == 0) {
    uint4 words[kN / kPerWord];
#pragma unroll
    for (int w = 0; w < kN / kPerWord; ++w) words[w] = __ldg(reinterpret_cast<const uint4*>(p) + w);
    if constexpr (std::is_same_v<In, Bf16In>) {  // bf16 pairs widen by a shift and a mask
      const std::uint32_t* w = reinterpret_cast<const std::uint32_t*>(words);
#pragma unroll
      for (int i = 0; i < kN / 2; ++i) {
        out[2 * i] = __uint_as_float(w[i] << 16);
        out[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
      }
    } else {
      const S* s = reinterpret_cast<const S*>(words);
#pragma unroll
      for (int i = 0; i < kN; ++i) out[i] = In::to_f32(s[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) out[i] = In::to_f32(__ldg(p + i));
  }
}

// 16 consecutive 16-bit elements as 8 packed pairs (low half first): two LDG.128 when kVector
// (the address 16-byte aligned), else 16 scalar loads.
template <bool kVector>
__device__ __forceinline__ void load_pairs16(const std::uint16_t* p, std::uint32_t (&w)[8]) {
  if constexpr (kVector) {
    const uint4 lo = __ldg(reinterpret_cast<const uint4*>(p));
    const uint4 hi = __ldg(reinterpret_cast<const uint4*>(p) + 1);
    w[0] = lo.x, w[1] = lo.y, w[2] = lo.z, w[3] = lo.w;
    w[4] = hi.x, w[5] = hi.y, w[6] = hi.z, w[7] = hi.w;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      w[i] = __ldg(p + 2 * i) | (std::uint32_t(__ldg(p + 2 * i + 1)) << 16);
    }
  }
}

// kN fp8 bytes (kN even) from kN fp32 values, e4m3 or e5m2 by `e5m2`, stored with one access of
// kN bytes when kN is 2, 4, 8 or 16 (the address must be aligned to that).
template <int kN>
__device__ __forceinline__ void store_fp8(std::uint8_t* p, const float (&x)[kN], bool e5m2) {
  static_assert(kN % 2 == 0 || kN == 1);
  if constexpr (kN == 1) {
    *p = e5m2 ? std::uint8_t(cvt_e5m2x2(x[0], 0.0f)) : std::uint8_t(cvt_e4m3x2(x[0], 0.0f));
  } else {
    std::uint16_t pairs[kN / 2];
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) {
      pairs[i] = e5m2 ? cvt_e5m2x2(x[2 * i], x[2 * i + 1]) : cvt_e4m3x2(x[2 * i], x[2 * i + 1]);
    }
    if constexpr (kN == 16) {
      *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(pairs);
    } else if constexpr (kN == 8) {
      *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(pairs);
    } else if constexpr (kN == 4) {
      *reinterpret_cast<std::uint32_t*>(p) = *reinterpret_cast<const std::uint32_t*>(pairs);
    } else {
#pragma unroll
      for (int i = 0; i < kN / 2; ++i) reinterpret_cast<std::uint16_t*>(p)[i] = pairs[i];
    }
  }
}

// n / d and n % d for 32-bit n by a 64-bit multiply: magic = ceil(2^64 / d) is exact for every
// n < 2^32 and d < 2^32 (the error n / 2^64 stays below 1 / d).
struct FastDivmod {
  std::uint32_t divisor = 1;
  std::uint64_t magic = 0;  // unused for divisor 1

  FastDivmod() = default;
  explicit FastDivmod(std::uint32_t d) : divisor(d), magic(d > 1 ? ~0ull / d + 1 : 0) {}

  __device__ __forceinline__ std::uint32_t div(std::uint32_t n) const {
    return divisor == 1 ? n : std::uint32_t(__umul64hi(n, magic));
  }
  __device__ __forceinline__ void divmod(std::uint32_t n, std::uint32_t& q,
                                         std::uint32_t& r) const {
    q = div(n);
    r = n - q * divisor;
  }
};

// Block-wide max of non-negative floats (NaNs already dropped); the result is valid in thread 0.
template <int kThreads>
__device__ __forceinline__ float block_max(float v) {
  __shared__ float warp_max[kThreads / 32];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(~0u, v, offset));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < kThreads / 32 ? warp_max[threadIdx.x] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(~0u, v, offset));
  }
  return v;
}

}  // namespace fp8mla::cuda
