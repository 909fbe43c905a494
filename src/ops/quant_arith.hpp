// Cheaper exact forms of the quantization arithmetic of docs/design.md section 2, for host and
// device: the CUDA kernels run them, the CPU ops keep the plain forms (x / s, encode_e2m1), and
// tests/cpp/quant_arith_test.cpp and quant_arith_exhaustive_test.cpp prove both give the same
// bits on every input the ops admit.
#pragma once

#include <cstdint>

#include "fp8mla/numerics.hpp"

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace fp8mla {

// ---- x / s through one reciprocal per group
//
// Markstein's theorem: with r = RN(1 / s) and q within one ulp of x / s, the remainder
// x - q * s is exact (one fma) and RN(q + (x - q * s) * r) = RN(x / s); q = RN(x * r) is that
// close. This needs no underflow or overflow on the way: s and 1 / s normal, and the remainder's
// grid (ulp(q) * ulp(s)) at or above the smallest subnormal 2^-149 whenever the quotient matters.
// A quotient that matters reaches e4m3 (>= 2^-11: near half its smallest subnormal) or is the
// scale amax / 448 (>= 2^-90 here), so ulp(q) >= 2^-34 and s >= 2^-90 keep the grid above
// 2^-149. Smaller quotients come out below 2^-10 too and encode to a zero of x's sign, as x / s
// does. The remainder is formed negated, e = q * s - x, and subtracted, so that a zero x keeps
// its sign (-0 - (+0) is -0; +0 + -0 would be +0). Callers check division_by_reciprocal_exact
// first and use IEEE division otherwise.

inline constexpr float kReciprocalDivisionMin = 0x1p-90f;  // smallest divisor the form covers
inline constexpr float kReciprocalDivisionMax = 0x1p126f;  // largest: 1 / s stays normal

// Whether divide_by_reciprocal(x, s, reciprocal_rn(s)) equals x / s for every x with
// |x / s| <= 2^10 (more than the 448 of a quantized value); false for NaN and inf.
FP8MLA_HOST_DEVICE bool division_by_reciprocal_exact(float s) {
  return s >= kReciprocalDivisionMin && s <= kReciprocalDivisionMax;
}

// RN(1 / s).
FP8MLA_HOST_DEVICE float reciprocal_rn(float s) {
#if defined(__CUDA_ARCH__)
  return __frcp_rn(s);
#else
  return 1.0f / s;
#endif
}

// RN(x / s) from r = reciprocal_rn(s), where division_by_reciprocal_exact(s): a multiply and
// two fmas.
FP8MLA_HOST_DEVICE float divide_by_reciprocal(float x, float s, float r) {
#if defined(__CUDA_ARCH__)
  const float q = __fmul_rn(x, r);
  return fmaf(-fmaf(q, s, -x), r, q);
#else
  const float q = x * r;
  return std::fma(-std::fma(q, s, -x), r, q);
#endif
}

// ---- The per-token-group scale
//
// The scale of a group and how its values are scaled, as docs/design.md section 2 defines them:
// s = amax / 448 (amax >= eps > 0), with UE8M0 rounded up to a power of two; q = x / s.
struct GroupScale {
  enum class Apply : std::uint8_t {
    kReciprocal,  // divide_by_reciprocal(x, s, factor): f32 scales in the covered range
    kDivide,      // IEEE x / s: f32 scales below 2^-90 (a tiny eps) or infinite
    kMultiply,    // x * factor, factor exactly 1 / s: power-of-two scales
  };
  float s = 0.0f;             // the stored f32 scale
  std::uint8_t exponent = 0;  // its UE8M0 byte, encode_ue8m0(amax / 448)
  Apply apply = Apply::kDivide;
  float factor = 0.0f;
};

// amax / 448 by its reciprocal needs amax / 448 >= 2^-90 (then s is normal, and so is its power
// of two) and a finite amax.
inline constexpr float kGroupScaleFastMin = kReciprocalDivisionMin * kE4M3Max;
inline constexpr float kFloatMax = 0x1.fffffep127f;

FP8MLA_HOST_DEVICE GroupScale group_scale(float amax, bool pow2) {
  GroupScale g;
  if (amax >= kGroupScaleFastMin && amax <= kFloatMax) {
    // s in [2^-90, 2^120]: normal, so encode_ue8m0 is the exponent rounded up and its power of
    // two and inverse are plain exponent fields.
    constexpr float kInvE4M3Max = 1.0f / kE4M3Max;  // RN(1 / 448)
    g.s = divide_by_reciprocal(amax, kE4M3Max, kInvE4M3Max);
    const std::uint32_t bits = float_bits(g.s);
    g.exponent = std::uint8_t((bits >> 23) + ((bits & 0x7FFFFFu) != 0));
    if (pow2) {
      g.s = float_from_bits(std::uint32_t(g.exponent) << 23);
      g.factor = float_from_bits(std::uint32_t(254 - g.exponent) << 23);
      g.apply = GroupScale::Apply::kMultiply;
    } else {
      g.factor = reciprocal_rn(g.s);
      g.apply = GroupScale::Apply::kReciprocal;
    }
    return g;
  }
#if defined(__CUDA_ARCH__)
  g.s = __fdiv_rn(amax, kE4M3Max);
#else
  g.s = amax / kE4M3Max;
#endif
  g.exponent = encode_ue8m0(g.s);
  if (pow2) {
    g.s = decode_ue8m0(g.exponent);
    g.factor = decode_ue8m0(std::uint8_t(254 - g.exponent));
    g.apply = GroupScale::Apply::kMultiply;
  }
  return g;
}

// x / s, the value encoded to e4m3.
FP8MLA_HOST_DEVICE float scale_value(const GroupScale& g, float x) {
  switch (g.apply) {
    case GroupScale::Apply::kReciprocal:
      return divide_by_reciprocal(x, g.s, g.factor);
    case GroupScale::Apply::kMultiply:
      return x * g.factor;
    case GroupScale::Apply::kDivide:
      break;
  }
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(x, g.s);
#else
  return x / g.s;
#endif
}

// ---- NVFP4

// amax / 6 of an NVFP4 block (amax >= 0), as in its block scale: by the reciprocal of 6 where the
// quotient is at least 2^-90 and amax finite, else by IEEE division.
FP8MLA_HOST_DEVICE float nvfp4_block_quotient(float amax) {
  constexpr float kInvE2M1Max = 1.0f / kE2M1Max;  // RN(1 / 6)
  if (amax >= kReciprocalDivisionMin * kE2M1Max && amax <= kFloatMax) {
    return divide_by_reciprocal(amax, kE2M1Max, kInvE2M1Max);
  }
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(amax, kE2M1Max);
#else
  return amax / kE2M1Max;
#endif
}

// ---- e2m1 by one fp32 addition
//
// For a = min(|p|, 6) the e2m1 step is half the power of two 2^e <= max(a, 1): 0.5 in [0, 2), 1 in
// [2, 4), 2 in [4, 6]. m = 2^(e + 22) + 2e steps has that step as its ulp, so a + m rounds a to a
// multiple of it with fp32's nearest-even rounding, and the sum's low mantissa bits are 2e + the
// steps of a: the code. Its parity is that of the steps, so ties go to the same even code as
// encode_e2m1. The sign comes from min(p, 6), which keeps -0 and is +6 for NaN (NaN -> +6).
// Equal to encode_e2m1 on every fp32 input (tests/cpp/quant_arith_exhaustive_test.cpp).
FP8MLA_HOST_DEVICE std::uint32_t e2m1_code(float p) {
#if defined(__CUDA_ARCH__)
  const float a = fminf(fabsf(p), kE2M1Max), signed_p = fminf(p, kE2M1Max);
#else  // std::fmin gives NaN for a signalling NaN, min.f32 the other operand
  const float a = std::fabs(p) < kE2M1Max ? std::fabs(p) : kE2M1Max;
  const float signed_p = p < kE2M1Max ? p : kE2M1Max;
#endif
  const std::uint32_t bits = float_bits(a);
  const std::uint32_t e = (bits < 0x3F800000u ? 0x3F800000u : bits) & 0x7F800000u;  // 2^e
  const std::uint32_t m = e + (e >> 22) + ((22u << 23) - 254u);  // (e >> 22) is 254 + 2e
  const std::uint32_t sum = float_bits(a + float_from_bits(m));
  return (sum & 0x7u) | ((float_bits(signed_p) >> 28) & 0x8u);
}

// The same rounding with the code's two parts apart, for |p| < 7 (not NaN): the magnitude is the
// low byte of the returned sum (its bits 3-7 are zero, so byte permutes can gather four sums into a
// word) and the sign is p's sign bit. Below 7 no clamp to 6 is needed: [6, 7) rounds to 6 at the
// step 2 of [4, 8). m is e + (e >> 22) + ((22 << 23) - 254) as above, built from the exponent field
// of g = max(|p|, 1) by a shift and a multiply. With p's sign bit equal to e2m1_code for every such
// p (tests/cpp/quant_arith_exhaustive_test.cpp).
FP8MLA_HOST_DEVICE std::uint32_t e2m1_magnitude_sum_below7(float p) {
#if defined(__CUDA_ARCH__)
  const float a = fabsf(p), g = fmaxf(a, 1.0f);
  const std::uint32_t e = __umulhi(float_bits(g), 1u << 9);  // a multiply, off the integer ALU
#else
  const float a = std::fabs(p), g = std::fmax(a, 1.0f);
  const std::uint32_t e = float_bits(g) >> 23;
#endif
  const std::uint32_t m = e * 0x800002u + ((22u << 23) - 254u);
  return float_bits(a + float_from_bits(m));
}

}  // namespace fp8mla
