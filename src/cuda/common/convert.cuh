// Hardware conversions (PTX cvt) for the device path. Each one is proved bit-identical to the
// software codec in fp8mla/numerics.hpp on every input by tests/cpp/numerics_cuda_test.cu; below
// sm_89 they fall back to that codec.
#pragma once

#include <cstdint>

#include "fp8mla/numerics.hpp"
#include "ops/quant_arith.hpp"

namespace fp8mla::cuda {

// Two fp32 values to two e4m3fn bytes (lo in the low byte), nearest-even, saturating.
__device__ __forceinline__ std::uint16_t cvt_e4m3x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  std::uint16_t out;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(out) : "f"(hi), "f"(lo));
  return out;
#else
  return std::uint16_t(encode_e4m3(lo) | (encode_e4m3(hi) << 8));
#endif
}

__device__ __forceinline__ std::uint16_t cvt_e5m2x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  std::uint16_t out;
  asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(out) : "f"(hi), "f"(lo));
  return out;
#else
  return std::uint16_t(encode_e5m2(lo) | (encode_e5m2(hi) << 8));
#endif
}

// Two packed fp16 values (low half first) straight to two e4m3fn bytes.
__device__ __forceinline__ std::uint16_t cvt_e4m3x2_from_f16x2(std::uint32_t f16x2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  std::uint16_t out;
  asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(out) : "r"(f16x2));
  return out;
#else
  return cvt_e4m3x2(decode_f16(std::uint16_t(f16x2)), decode_f16(std::uint16_t(f16x2 >> 16)));
#endif
}

__device__ __forceinline__ std::uint16_t cvt_e5m2x2_from_f16x2(std::uint32_t f16x2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  std::uint16_t out;
  asm("cvt.rn.satfinite.e5m2x2.f16x2 %0, %1;" : "=h"(out) : "r"(f16x2));
  return out;
#else
  return cvt_e5m2x2(decode_f16(std::uint16_t(f16x2)), decode_f16(std::uint16_t(f16x2 >> 16)));
#endif
}

__device__ __forceinline__ float cvt_f16_to_f32(std::uint16_t x) {
  float out;
  asm("cvt.f32.f16 %0, %1;" : "=f"(out) : "h"(x));
  return out;
}

// Two packed fp16 values (low half first) to fp32.
__device__ __forceinline__ float2 cvt_f16x2_to_f32x2(std::uint32_t f16x2) {
  return {cvt_f16_to_f32(std::uint16_t(f16x2)), cvt_f16_to_f32(std::uint16_t(f16x2 >> 16))};
}

// Two e4m3fn / e5m2 bytes to fp32, through the hardware's fp8 -> f16x2 conversion.
__device__ __forceinline__ float2 cvt_e4m3x2_to_f32x2(std::uint16_t fp8x2) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 890
  return {decode_e4m3(std::uint8_t(fp8x2)), decode_e4m3(std::uint8_t(fp8x2 >> 8))};
#else
  std::uint32_t f16x2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(f16x2) : "h"(fp8x2));
  return cvt_f16x2_to_f32x2(f16x2);
#endif
}

__device__ __forceinline__ float2 cvt_e5m2x2_to_f32x2(std::uint16_t fp8x2) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 890
  return {decode_e5m2(std::uint8_t(fp8x2)), decode_e5m2(std::uint8_t(fp8x2 >> 8))};
#else
  std::uint32_t f16x2;
  asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(f16x2) : "h"(fp8x2));
  return cvt_f16x2_to_f32x2(f16x2);
#endif
}

__device__ __forceinline__ std::uint16_t cvt_bf16(float x) {
  std::uint16_t out;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(out) : "f"(x));
  return out;
}

__device__ __forceinline__ std::uint16_t cvt_f16(float x) {
  std::uint16_t out;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(out) : "f"(x));
  return out;
}

// prmt.b32: byte n of the result is byte (s >> 4n) & 7 of {b, a} (a the low word); with bit 3 of
// that nibble set it is the selected byte's sign bit copied into all eight bits.
__device__ __forceinline__ std::uint32_t byte_perm(std::uint32_t a, std::uint32_t b,
                                                   std::uint32_t s) {
  std::uint32_t out;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(out) : "r"(a), "r"(b), "r"(s));
  return out;
}

// Per 16-bit lane of two packed bf16 / f16 pairs: max(|a|, |b|), NaN if either is NaN (the sign
// bit is the xor of the inputs' and means nothing here).
__device__ __forceinline__ std::uint32_t abs_max_nan_bf16x2(std::uint32_t a, std::uint32_t b) {
  std::uint32_t out;
  asm("max.NaN.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(out) : "r"(a), "r"(b));
  return out;
}

__device__ __forceinline__ std::uint32_t abs_max_nan_f16x2(std::uint32_t a, std::uint32_t b) {
  std::uint32_t out;
  asm("max.NaN.xorsign.abs.f16x2 %0, %1, %2;" : "=r"(out) : "r"(a), "r"(b));
  return out;
}

// fp4 e2m1 (4-bit code), nearest-even, saturating, NaN -> +6; sm_90 has no e2m1 cvt, so this is
// fp8mla::e2m1_code (one fp32 addition does the rounding). Equal to encode_e2m1 on every input
// (tests/cpp/numerics_cuda_test.cu).
__device__ __forceinline__ std::uint32_t cvt_e2m1(float x) {
  return e2m1_code(x);
}

}  // namespace fp8mla::cuda
