// The CUDA kernels' forms of the quantization arithmetic (src/ops/quant_arith.hpp), evaluated on
// the host, against the plain forms the CPU ops use (docs/design.md section 2): the group scale
// amax / 448 and x / s by IEEE division. Random and adversarial cases here; the sweeps over every
// divisor mantissa and every amax are in quant_arith_exhaustive_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "ops/quant_arith.hpp"
#include "quant_arith_test_util.hpp"

namespace fp8mla::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Every bf16 x with |x| <= amax (and -0, the subnormals), through the group of max amax.
void check_bf16_inputs(float amax, DivisionCheck& check) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const float x = decode_bf16(std::uint16_t(b));
    if (std::fabs(x) <= amax) check.value(x, amax);
  }
}

TEST(QuantArith, GroupScaleEqualsIeeeAtBoundaries) {
  const float amaxes[] = {kGroupScaleFastMin,
                          std::nextafter(kGroupScaleFastMin, 0.0f),
                          std::nextafter(kGroupScaleFastMin, kInf),
                          448.0f * 0x1p-126f,
                          0x1p-126f,
                          0x1p-149f,
                          1e-10f,
                          1.0f,
                          448.0f,
                          std::nextafter(448.0f, 0.0f),
                          3.0e38f,
                          kFloatMax,
                          kInf};
  for (float amax : amaxes) {
    for (bool pow2 : {false, true}) EXPECT_TRUE(group_scale_matches(amax, pow2)) << amax;
  }
}

TEST(QuantArith, GroupScaleEqualsIeeeOnRandomAmax) {
  std::mt19937 rng(7);
  for (int i = 0; i < 2'000'000; ++i) {
    const float amax = float_from_bits(rng() % 0x7F800001u);  // +0 .. +inf
    if (amax == 0.0f) continue;
    ASSERT_TRUE(group_scale_matches(amax, false)) << std::hexfloat << amax;
    ASSERT_TRUE(group_scale_matches(amax, true)) << std::hexfloat << amax;
  }
}

// Every bf16 input against groups whose scale is at the ends of the covered range, outside it
// (the IEEE fallback), and in between.
TEST(QuantArith, DivisionEqualsIeeeForEveryBf16Input) {
  DivisionCheck check;
  const float amaxes[] = {kGroupScaleFastMin,
                          std::nextafter(kGroupScaleFastMin, kInf),
                          std::nextafter(kGroupScaleFastMin, 0.0f),
                          0x1p-126f,
                          0x1p-140f,  // subnormal amax: eps that small
                          1e-10f,
                          1.0f,
                          3.0f,
                          448.0f,
                          65504.0f,
                          3.3895314e38f,  // the largest bf16
                          kFloatMax,
                          kInf};
  for (float amax : amaxes) check_bf16_inputs(amax, check);
  check.expect_clean();
  EXPECT_GT(check.fast_path(), 0);
  EXPECT_GT(check.fallback(), 0);
}

// Random f32 divisors and inputs, random scale exponents across the covered range and past its
// ends.
TEST(QuantArith, DivisionEqualsIeeeOnRandomF32) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> exponent(-140, 127);
  DivisionCheck check;
  for (int i = 0; i < 200'000; ++i) {
    const float amax = std::ldexp(1.0f + float(rng() & 0x7FFFFFu) * 0x1p-23f, exponent(rng));
    if (amax == 0.0f || std::isinf(amax)) continue;
    for (int j = 0; j < 16; ++j) {
      const float fraction = float(rng() & 0xFFFFFFu) * 0x1p-24f;  // [0, 1)
      check.value((rng() & 1 ? -1.0f : 1.0f) * amax * fraction, amax);
    }
    check.value(amax, amax);
    check.value(-amax, amax);
  }
  check.expect_clean();
}

// x / s close to the midpoints between e4m3 values (ties of the e4m3 rounding) and to the f32
// midpoints around them, for random scales.
TEST(QuantArith, DivisionEqualsIeeeNearE4m3Ties) {
  std::mt19937 rng(13);
  std::uniform_int_distribution<int> exponent(-100, 100);
  std::vector<float> ties;  // the positive midpoints between consecutive e4m3 values
  for (std::uint32_t c = 0; c < 0x7E; ++c) {
    ties.push_back((decode_e4m3(std::uint8_t(c)) + decode_e4m3(std::uint8_t(c + 1))) / 2);
  }
  DivisionCheck check;
  for (int i = 0; i < 20'000; ++i) {
    const float amax = std::ldexp(1.0f + float(rng() & 0x7FFFFFu) * 0x1p-23f, exponent(rng));
    const float s = amax / kE4M3Max;
    for (float t : ties) {
      const float x = t * s;  // within an ulp of the tie
      for (int d = -2; d <= 2; ++d) {
        const float xd = float_from_bits(float_bits(x) + std::uint32_t(d));
        if (xd <= amax) {
          check.value(xd, amax);
          check.value(-xd, amax);
        }
      }
    }
  }
  check.expect_clean();
}

// Subnormal and zero inputs, tiny quotients (below e4m3's smallest subnormal), -0.
TEST(QuantArith, DivisionKeepsSignsOfZerosAndTinyQuotients) {
  DivisionCheck check;
  const float amaxes[] = {kGroupScaleFastMin, 1e-30f, 1e-10f, 1.0f, 1e30f, kFloatMax};
  for (float amax : amaxes) {
    for (float x : {0.0f, -0.0f, 0x1p-149f, -0x1p-149f, 0x1p-130f, -0x1p-127f, 0x1p-126f}) {
      if (std::fabs(x) <= amax) check.value(x, amax);
    }
    for (int k = 5; k < 40; ++k) {  // quotients 448 * 2^-k around 2^-10
      for (float sign : {1.0f, -1.0f}) {
        const float x = sign * std::ldexp(amax, -k);
        check.value(x, amax);
        check.value(std::nextafter(x, 0.0f), amax);
        check.value(std::nextafter(x, sign * kInf), amax);
      }
    }
  }
  check.expect_clean();
}

// eps = 2^-149 over a zero group gives s = 0 and 0 / 0; a group with +-inf gives s = inf.
TEST(QuantArith, DivisionOfDegenerateScales) {
  DivisionCheck check;
  for (float x : {0.0f, -0.0f}) check.value(x, 0x1p-149f);  // s rounds to 0: NaN
  for (float x : {kInf, -kInf, 1.0f, -0.0f, kFloatMax}) check.value(x, kInf);
  check.value(std::numeric_limits<float>::quiet_NaN(), 1.0f);
  check.expect_clean();
  EXPECT_GT(check.fallback(), 0);
}

TEST(QuantArith, Nvfp4BlockQuotientEqualsIeee) {
  std::mt19937 rng(17);
  std::vector<float> amaxes = {0.0f, 0x1p-149f, kReciprocalDivisionMin * kE2M1Max, kFloatMax, kInf};
  amaxes.push_back(std::nextafter(amaxes[2], 0.0f));
  for (int i = 0; i < 1'000'000; ++i) amaxes.push_back(float_from_bits(rng() % 0x7F800001u));
  int mismatches = 0;
  for (float amax : amaxes) {
    if (float_bits(nvfp4_block_quotient(amax)) != float_bits(amax / kE2M1Max) &&
        ++mismatches <= 5) {
      ADD_FAILURE() << std::hexfloat << amax << ": " << nvfp4_block_quotient(amax);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// e2m1_code on every bf16 and f16 value, on every fp32 within 4 ulps of each e2m1 midpoint and
// binade edge, and on the special values (the full fp32 sweep is in the exhaustive test).
TEST(QuantArith, E2m1CodeEqualsEncodeE2m1) {
  std::vector<float> inputs = {0.0f,
                               -0.0f,
                               kInf,
                               -kInf,
                               std::numeric_limits<float>::quiet_NaN(),
                               -std::numeric_limits<float>::quiet_NaN(),
                               std::numeric_limits<float>::signaling_NaN(),
                               0x1p-149f,
                               kFloatMax};
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    inputs.push_back(decode_bf16(std::uint16_t(b)));
    inputs.push_back(decode_f16(std::uint16_t(b)));
  }
  for (float edge : {0.25f, 0.75f, 1.0f, 1.25f, 1.75f, 2.0f, 2.5f, 3.5f, 4.0f, 5.0f, 6.0f, 7.0f}) {
    for (int d = -4; d <= 4; ++d) {
      const float x = float_from_bits(float_bits(edge) + std::uint32_t(d));
      inputs.push_back(x);
      inputs.push_back(-x);
    }
  }
  int mismatches = 0;
  for (float x : inputs) {
    if (e2m1_code(x) != encode_e2m1(x) && ++mismatches <= 5) {
      ADD_FAILURE() << std::hexfloat << x << ": 0x" << std::hex << e2m1_code(x) << ", expected 0x"
                    << int(encode_e2m1(x));
    }
  }
  EXPECT_EQ(mismatches, 0);
}

}  // namespace
}  // namespace fp8mla::test
