// Software codecs for every storage format the library reads or writes (docs/design.md section 2).
//
// These functions are the definition of fp8mla's numerics: CPU ops call them directly, and the CUDA
// kernels either call them too (compiled for the device) or use a hardware `cvt` that the tests
// prove bit-identical to them on every input. Usable from host and device code; no CUDA headers.
//
// Policy (one test per cell in tests/cpp/numerics_policy_test.cpp):
//   encoder      rounding        |x| > max        +-inf            NaN
//   e4m3fn       nearest-even    +-448 (sat.)     +-448            0x7F (sign dropped)
//   e5m2         nearest-even    +-57344 (sat.)   +-57344          0x7F (sign dropped)
//   e2m1         nearest-even    +-6 (sat.)       +-6              +6 (0x7)
//   ue8m0        ceil to 2^k     2^127 (0xFE)     2^127 (0xFE)     0xFF
//   bf16, f16    nearest-even    +-inf (IEEE)     +-inf            0x7FFF
// ue8m0 encodes a magnitude: the sign is ignored, and 0 or anything <= 2^-127 encodes 2^-127.
// Decoders are exact; every NaN code decodes to the canonical fp32 NaN 0x7FFFFFFF, except bf16,
// which widens by a shift and keeps its payload.
#pragma once

#include <cstdint>

#if !defined(__CUDA_ARCH__)
#include <bit>
#endif

#if defined(__CUDACC__)
#define FP8MLA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FP8MLA_HOST_DEVICE inline
#endif

namespace fp8mla {

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE5M2Max = 57344.0f;
inline constexpr float kE2M1Max = 6.0f;

FP8MLA_HOST_DEVICE std::uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  return std::bit_cast<std::uint32_t>(x);
#endif
}

FP8MLA_HOST_DEVICE float float_from_bits(std::uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  return std::bit_cast<float>(bits);
#endif
}

namespace codec {

inline constexpr std::uint32_t kCanonicalNanF32 = 0x7FFFFFFFu;

enum class Overflow {
  kSaturate,  // past the largest finite value (and +-inf) -> +-max
  kInfinity,  // IEEE: past max + half an ulp -> +-inf
};

// A binary minifloat with an implicit leading bit and subnormals.
template <int kExponentBits, int kMantissaBits, int kExponentBias>
struct MiniFloat {
  static constexpr int kExpBits = kExponentBits;
  static constexpr int kManBits = kMantissaBits;
  static constexpr int kBias = kExponentBias;
  static constexpr int kSignShift = kExpBits + kManBits;
  static constexpr std::uint32_t kManMask = (1u << kManBits) - 1;
  static constexpr std::uint32_t kExpMask = (1u << kExpBits) - 1;
  static constexpr int kMinNormalExp = 1 - kBias;
};

FP8MLA_HOST_DEVICE int leading_bit(std::uint32_t x) {  // x != 0
#if defined(__CUDA_ARCH__)
  return 31 - __clz(x);
#else
  return 31 - __builtin_clz(x);
#endif
}

// Rounds fp32 `x` to nearest-even in the format Fmt. `kMaxCode` is the largest finite positive
// code, `kNanCode` what NaN encodes to, `kInfCode` the +inf code (used with Overflow::kInfinity).
template <typename Fmt, Overflow kOverflow, std::uint32_t kMaxCode, std::uint32_t kNanCode,
          std::uint32_t kInfCode = 0>
FP8MLA_HOST_DEVICE std::uint32_t encode_from_f32(float x) {
  constexpr int kManBits = Fmt::kManBits;
  constexpr int kShiftNormal = 23 - kManBits;
  // fp32 bit pattern of the largest finite value of the format.
  constexpr std::uint32_t kMaxExp = kMaxCode >> kManBits;
  constexpr std::uint32_t kMaxF32 =
      ((kMaxExp - Fmt::kBias + 127) << 23) | ((kMaxCode & Fmt::kManMask) << kShiftNormal);
  // Halfway between max and the next value the format would have: the IEEE overflow point.
  constexpr std::uint32_t kOverflowF32 =
      kOverflow == Overflow::kSaturate ? kMaxF32 : kMaxF32 + (1u << (kShiftNormal - 1));
  constexpr std::uint32_t kOverflowCode = kOverflow == Overflow::kSaturate ? kMaxCode : kInfCode;

  const std::uint32_t u = float_bits(x);
  const std::uint32_t sign = (u >> 31) << Fmt::kSignShift;
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return kNanCode;
  if (a >= kOverflowF32) return sign | kOverflowCode;

  const int exp = int(a >> 23) - 127;  // -127 for fp32 zero and subnormals
  std::uint32_t q;
  std::uint32_t rem;
  int shift;
  if (exp >= Fmt::kMinNormalExp) {
    shift = kShiftNormal;
    q = (std::uint32_t(exp + Fmt::kBias) << kManBits) | ((a & 0x7FFFFFu) >> shift);
    rem = a & ((1u << shift) - 1);
  } else {
    // Subnormal in the target: count quanta of 2^(kMinNormalExp - kManBits).
    const std::uint32_t full = (a & 0x7FFFFFu) | (a >= 0x00800000u ? 0x00800000u : 0u);
    const int exp_eff = exp < -126 ? -126 : exp;
    shift = 23 + Fmt::kMinNormalExp - kManBits - exp_eff;
    if (shift > 24) return sign;  // below half the smallest subnormal: (-)0
    q = full >> shift;
    rem = full & ((1u << shift) - 1);
  }
  const std::uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // a carry moves into the exponent: correct
  return sign | q;
}

// Exact decode of a code of format Fmt to fp32. `kIeeeSpecials`: the all-ones exponent means
// inf/NaN (e5m2, f16). `kNanCode`: the single positive NaN code of formats without infinities
// (0x7F for e4m3fn), or 0 if the format has none.
template <typename Fmt, bool kIeeeSpecials, std::uint32_t kNanCode>
FP8MLA_HOST_DEVICE float decode_to_f32(std::uint32_t code) {
  constexpr int kManBits = Fmt::kManBits;
  const std::uint32_t sign = ((code >> Fmt::kSignShift) & 1u) << 31;
  const std::uint32_t exp = (code >> kManBits) & Fmt::kExpMask;
  const std::uint32_t man = code & Fmt::kManMask;
  if (kIeeeSpecials && exp == Fmt::kExpMask) {
    return float_from_bits(man ? kCanonicalNanF32 : (sign | 0x7F800000u));
  }
  if (kNanCode != 0 && (code & ((1u << Fmt::kSignShift) - 1)) == kNanCode) {
    return float_from_bits(kCanonicalNanF32);
  }
  if (exp == 0) {
    if (man == 0) return float_from_bits(sign);
    // Subnormal: normalise around the leading set bit p of the mantissa.
    const int p = leading_bit(man);
    const std::uint32_t f32_exp = std::uint32_t(p - kManBits + Fmt::kMinNormalExp + 127);
    return float_from_bits(sign | (f32_exp << 23) | ((man ^ (1u << p)) << (23 - p)));
  }
  const std::uint32_t f32_exp = exp - Fmt::kBias + 127;
  return float_from_bits(sign | (f32_exp << 23) | (man << (23 - kManBits)));
}

using E4M3 = MiniFloat<4, 3, 7>;
using E5M2 = MiniFloat<5, 2, 15>;
using E2M1 = MiniFloat<2, 1, 1>;
using F16 = MiniFloat<5, 10, 15>;
using BF16 = MiniFloat<8, 7, 127>;

}  // namespace codec

// fp8 e4m3fn
FP8MLA_HOST_DEVICE std::uint8_t encode_e4m3(float x) {
  return std::uint8_t(
      codec::encode_from_f32<codec::E4M3, codec::Overflow::kSaturate, 0x7E, 0x7F>(x));
}
FP8MLA_HOST_DEVICE float decode_e4m3(std::uint8_t code) {
  return codec::decode_to_f32<codec::E4M3, false, 0x7F>(code);
}

// fp8 e5m2
FP8MLA_HOST_DEVICE std::uint8_t encode_e5m2(float x) {
  return std::uint8_t(
      codec::encode_from_f32<codec::E5M2, codec::Overflow::kSaturate, 0x7B, 0x7F>(x));
}
FP8MLA_HOST_DEVICE float decode_e5m2(std::uint8_t code) {
  return codec::decode_to_f32<codec::E5M2, true, 0>(code);
}

// fp4 e2m1: a 4-bit code in the low nibble.
FP8MLA_HOST_DEVICE std::uint8_t encode_e2m1(float x) {
  return std::uint8_t(codec::encode_from_f32<codec::E2M1, codec::Overflow::kSaturate, 0x7, 0x7>(x));
}
FP8MLA_HOST_DEVICE float decode_e2m1(std::uint8_t code) {
  return codec::decode_to_f32<codec::E2M1, false, 0>(code & 0xFu);
}

// ue8m0 power-of-two scale: rounds |x| up to a power of two (see the policy table above).
FP8MLA_HOST_DEVICE std::uint8_t encode_ue8m0(float x) {
  const std::uint32_t a = float_bits(x) & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0xFF;
  if (a >= 0x7F000000u) return 0xFE;            // 2^127 and beyond (inf included)
  if (a < 0x00800000u) return a > 0x00400000u;  // fp32 subnormal or 0: 2^-127 or 2^-126
  return std::uint8_t((a >> 23) + ((a & 0x7FFFFFu) != 0));
}
FP8MLA_HOST_DEVICE float decode_ue8m0(std::uint8_t code) {
  if (code == 0xFF) return float_from_bits(codec::kCanonicalNanF32);
  if (code == 0) return float_from_bits(0x00400000u);  // 2^-127 is an fp32 subnormal
  return float_from_bits(std::uint32_t(code) << 23);
}

// bf16
FP8MLA_HOST_DEVICE std::uint16_t encode_bf16(float x) {
  return std::uint16_t(
      codec::encode_from_f32<codec::BF16, codec::Overflow::kInfinity, 0x7F7F, 0x7FFF, 0x7F80>(x));
}
FP8MLA_HOST_DEVICE float decode_bf16(std::uint16_t bits) {
  return float_from_bits(std::uint32_t(bits) << 16);
}

// IEEE fp16
FP8MLA_HOST_DEVICE std::uint16_t encode_f16(float x) {
  return std::uint16_t(
      codec::encode_from_f32<codec::F16, codec::Overflow::kInfinity, 0x7BFF, 0x7FFF, 0x7C00>(x));
}
FP8MLA_HOST_DEVICE float decode_f16(std::uint16_t bits) {
  return codec::decode_to_f32<codec::F16, true, 0>(bits);
}

}  // namespace fp8mla
