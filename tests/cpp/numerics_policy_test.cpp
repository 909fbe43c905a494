// One test per cell of the numerics policy table (docs/design.md section 2, fp8mla/numerics.hpp).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "fp8mla/numerics.hpp"

namespace fp8mla {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();
const float kNegNan = -std::numeric_limits<float>::quiet_NaN();
const float kSignalingNan = float_from_bits(0x7F800001u);

// --- e4m3fn ---
TEST(PolicyE4M3, RoundsNearestEven) {
  EXPECT_EQ(encode_e4m3(1.0625f), 0x38);  // tie between 1 (0x38) and 1.125 (0x39): even
  EXPECT_EQ(encode_e4m3(1.1875f), 0x3A);  // tie between 1.125 and 1.25: even is 1.25
  EXPECT_EQ(encode_e4m3(1.0626f), 0x39);  // just past the tie
  EXPECT_EQ(encode_e4m3(-3.3f), 0xC5);    // -3.25
}
TEST(PolicyE4M3, SaturatesPastMax) {
  EXPECT_EQ(encode_e4m3(448.0f), 0x7E);
  EXPECT_EQ(encode_e4m3(464.0f), 0x7E);  // halfway to the next binade step
  EXPECT_EQ(encode_e4m3(1e30f), 0x7E);
  EXPECT_EQ(encode_e4m3(-500.0f), 0xFE);
}
TEST(PolicyE4M3, InfinitySaturates) {
  EXPECT_EQ(encode_e4m3(kInf), 0x7E);
  EXPECT_EQ(encode_e4m3(-kInf), 0xFE);
}
TEST(PolicyE4M3, NanIsCanonical) {
  EXPECT_EQ(encode_e4m3(kNan), 0x7F);
  EXPECT_EQ(encode_e4m3(kNegNan), 0x7F);
  EXPECT_EQ(encode_e4m3(kSignalingNan), 0x7F);
  EXPECT_TRUE(std::isnan(decode_e4m3(0x7F)));
  EXPECT_TRUE(std::isnan(decode_e4m3(0xFF)));
}
TEST(PolicyE4M3, Subnormals) {
  EXPECT_EQ(encode_e4m3(std::ldexp(1.0f, -9)), 0x01);   // smallest subnormal
  EXPECT_EQ(encode_e4m3(std::ldexp(1.0f, -10)), 0x00);  // tie with 0: even
  EXPECT_EQ(encode_e4m3(std::ldexp(1.5f, -10)), 0x01);
  EXPECT_EQ(encode_e4m3(std::ldexp(7.0f, -9)), 0x07);  // largest subnormal
  EXPECT_EQ(encode_e4m3(std::ldexp(7.5f, -9)), 0x08);  // tie rounds up into the normals
  EXPECT_EQ(encode_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(encode_e4m3(-std::ldexp(1.0f, -9)), 0x81);
}
TEST(PolicyE4M3, NegativeZero) {
  EXPECT_EQ(encode_e4m3(-0.0f), 0x80);
  EXPECT_EQ(encode_e4m3(-std::ldexp(1.0f, -12)), 0x80);  // rounds to -0
  EXPECT_EQ(float_bits(decode_e4m3(0x80)), 0x80000000u);
}

// --- e5m2 ---
TEST(PolicyE5M2, RoundsNearestEven) {
  EXPECT_EQ(encode_e5m2(1.125f), 0x3C);  // tie between 1 and 1.25: even
  EXPECT_EQ(encode_e5m2(1.375f), 0x3E);  // tie between 1.25 and 1.5: even is 1.5
}
TEST(PolicyE5M2, SaturatesPastMax) {
  EXPECT_EQ(encode_e5m2(57344.0f), 0x7B);
  EXPECT_EQ(encode_e5m2(61440.0f), 0x7B);
  EXPECT_EQ(encode_e5m2(1e30f), 0x7B);
  EXPECT_EQ(encode_e5m2(-1e30f), 0xFB);
}
TEST(PolicyE5M2, InfinitySaturates) {
  EXPECT_EQ(encode_e5m2(kInf), 0x7B);
  EXPECT_EQ(encode_e5m2(-kInf), 0xFB);
  EXPECT_EQ(decode_e5m2(0x7C), kInf);  // the format has infinities; they decode
}
TEST(PolicyE5M2, NanIsCanonical) {
  EXPECT_EQ(encode_e5m2(kNan), 0x7F);
  EXPECT_EQ(encode_e5m2(kNegNan), 0x7F);
  EXPECT_TRUE(std::isnan(decode_e5m2(0x7D)));
  EXPECT_TRUE(std::isnan(decode_e5m2(0xFE)));
}
TEST(PolicyE5M2, Subnormals) {
  EXPECT_EQ(encode_e5m2(std::ldexp(1.0f, -16)), 0x01);
  EXPECT_EQ(encode_e5m2(std::ldexp(1.0f, -17)), 0x00);
  EXPECT_EQ(encode_e5m2(std::ldexp(3.0f, -17)), 0x02);  // tie between 1 and 2 quanta: even
}
TEST(PolicyE5M2, NegativeZero) {
  EXPECT_EQ(encode_e5m2(-0.0f), 0x80);
  EXPECT_EQ(float_bits(decode_e5m2(0x80)), 0x80000000u);
}

// --- ue8m0 ---
TEST(PolicyUe8m0, RoundsUpToPowerOfTwo) {
  EXPECT_EQ(encode_ue8m0(1.0f), 127);
  EXPECT_EQ(encode_ue8m0(1.0000001f), 128);
  EXPECT_EQ(encode_ue8m0(3.0f), 129);
  EXPECT_EQ(encode_ue8m0(672.0f / 448.0f), 128);  // 1.5 -> 2: the group-quant UE8M0 case
  EXPECT_EQ(encode_ue8m0(1e-10f / 448.0f), 85);   // all-zero group: eps / 448 -> 2^-42
  EXPECT_EQ(encode_ue8m0(-3.0f), 129);            // a magnitude: the sign is ignored
}
TEST(PolicyUe8m0, ClampsPastMax) {
  EXPECT_EQ(encode_ue8m0(std::ldexp(1.0f, 127)), 254);
  EXPECT_EQ(encode_ue8m0(std::ldexp(1.5f, 127)), 254);
  EXPECT_EQ(encode_ue8m0(std::numeric_limits<float>::max()), 254);
}
TEST(PolicyUe8m0, InfinityClamps) {
  EXPECT_EQ(encode_ue8m0(kInf), 254);
}
TEST(PolicyUe8m0, NanIsFF) {
  EXPECT_EQ(encode_ue8m0(kNan), 0xFF);
  EXPECT_EQ(encode_ue8m0(kNegNan), 0xFF);
}
TEST(PolicyUe8m0, SubnormalsAndZero) {
  EXPECT_EQ(encode_ue8m0(0.0f), 0);  // smallest scale, 2^-127
  EXPECT_EQ(encode_ue8m0(-0.0f), 0);
  EXPECT_EQ(encode_ue8m0(std::ldexp(1.0f, -127)), 0);
  EXPECT_EQ(encode_ue8m0(std::ldexp(1.0f, -140)), 0);
  EXPECT_EQ(encode_ue8m0(std::ldexp(1.5f, -127)), 1);  // -> 2^-126
  EXPECT_EQ(encode_ue8m0(std::ldexp(1.0f, -126)), 1);
}

// --- e2m1 (NVFP4 values) ---
TEST(PolicyE2M1, RoundsNearestEven) {
  EXPECT_EQ(encode_e2m1(0.25f), 0x0);  // tie between 0 and 0.5: even
  EXPECT_EQ(encode_e2m1(0.75f), 0x2);  // tie between 0.5 and 1: even is 1
  EXPECT_EQ(encode_e2m1(2.5f), 0x4);   // tie between 2 and 3: even is 2
  EXPECT_EQ(encode_e2m1(5.0f), 0x6);   // tie between 4 and 6: even is 4
  EXPECT_EQ(encode_e2m1(-1.3f), 0xB);  // -1.5
}
TEST(PolicyE2M1, SaturatesPastMax) {
  EXPECT_EQ(encode_e2m1(7.0f), 0x7);
  EXPECT_EQ(encode_e2m1(-100.0f), 0xF);
}
TEST(PolicyE2M1, InfinitySaturates) {
  EXPECT_EQ(encode_e2m1(kInf), 0x7);
  EXPECT_EQ(encode_e2m1(-kInf), 0xF);
}
TEST(PolicyE2M1, NanIsPositiveMax) {
  EXPECT_EQ(encode_e2m1(kNan), 0x7);
  EXPECT_EQ(encode_e2m1(kNegNan), 0x7);
}
TEST(PolicyE2M1, SmallValuesAndNegativeZero) {
  EXPECT_EQ(encode_e2m1(0.2f), 0x0);
  EXPECT_EQ(encode_e2m1(-0.2f), 0x8);
  EXPECT_EQ(encode_e2m1(-0.0f), 0x8);
}

// --- bf16 / f16 (IEEE overflow) ---
TEST(PolicyBf16F16, RoundsNearestEven) {
  EXPECT_EQ(encode_bf16(float_from_bits(0x3F808000u)), 0x3F80);  // tie: even
  EXPECT_EQ(encode_bf16(float_from_bits(0x3F818000u)), 0x3F82);  // tie: even
  EXPECT_EQ(encode_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(encode_f16(1.0f + std::ldexp(3.0f, -11)), 0x3C02);
}
TEST(PolicyBf16F16, OverflowGoesToInfinity) {
  EXPECT_EQ(encode_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(encode_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(encode_f16(65520.0f), 0x7C00);  // tie between max and 2^16: even is inf
  EXPECT_EQ(encode_f16(-1e6f), 0xFC00);
  EXPECT_EQ(encode_bf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(encode_bf16(kInf), 0x7F80);
  EXPECT_EQ(encode_bf16(-kInf), 0xFF80);
}
TEST(PolicyBf16F16, NanIsCanonical) {
  EXPECT_EQ(encode_bf16(kNan), 0x7FFF);
  EXPECT_EQ(encode_bf16(kNegNan), 0x7FFF);
  EXPECT_EQ(encode_f16(kSignalingNan), 0x7FFF);
}
TEST(PolicyBf16F16, SubnormalsAndNegativeZero) {
  EXPECT_EQ(encode_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(encode_f16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(encode_f16(-0.0f), 0x8000);
  EXPECT_EQ(encode_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(encode_bf16(float_from_bits(0x00018000u)), 0x0002);  // tie among fp32 subnormals
  EXPECT_EQ(encode_bf16(-0.0f), 0x8000);
}

}  // namespace
}  // namespace fp8mla
