// Cheaper exact forms of the quantization arithmetic of docs/design.md section 2, for host and
// device: the CUDA kernels run them, the CPU ops keep the plain forms (x / s, encode_e2m1), and
// tests/cpp/quant_arith_test.cpp proves both give the same bits on every input the ops admit.
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

}  // namespace fp8mla
