// Every code of each narrow format decodes to its value and re-encodes to itself (NaN aside).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "fp8mla/numerics.hpp"
#include "numerics_reference.hpp"

namespace fp8mla {
namespace {

struct Codec {
  const char* name;
  std::uint8_t (*encode)(float);
  float (*decode)(std::uint8_t);
  const reference::Format& (*format)();
  std::uint32_t codes;          // number of codes, sign included
  std::uint32_t inf_magnitude;  // magnitude code of infinity; `codes` if none
  int nan_codes;                // NaN codes, both signs: every magnitude past the last finite
};

const Codec kCodecs[] = {
    {"e4m3", encode_e4m3, decode_e4m3, reference::e4m3, 256, 256, 2},
    {"e5m2", encode_e5m2, decode_e5m2, reference::e5m2, 256, 0x7C, 6},
    {"e2m1", encode_e2m1, decode_e2m1, reference::e2m1, 16, 16, 0},
};

TEST(NumericsDecode, EveryCodeDecodesAndReencodes) {
  for (const Codec& c : kCodecs) {
    const reference::Format& f = c.format();
    int nan_codes = 0;
    for (std::uint32_t code = 0; code < c.codes; ++code) {
      const float value = c.decode(std::uint8_t(code));
      const std::uint32_t magnitude = code & (f.sign_bit() - 1);
      const std::uint32_t sign = (code & f.sign_bit()) ? 0x80000000u : 0u;
      if (magnitude > f.max_code() && magnitude != c.inf_magnitude) {
        EXPECT_EQ(float_bits(value), codec::kCanonicalNanF32) << c.name << " code " << code;
        EXPECT_EQ(c.encode(value), f.nan_code()) << c.name << " code " << code;
        ++nan_codes;
        continue;
      }
      if (magnitude == c.inf_magnitude) {
        EXPECT_EQ(float_bits(value), sign | 0x7F800000u) << c.name << " code " << code;
        continue;
      }
      EXPECT_EQ(float_bits(value), sign | f.value_bits(magnitude)) << c.name << " code " << code;
      EXPECT_EQ(c.encode(value), code) << c.name << " code " << code;
    }
    EXPECT_EQ(nan_codes, c.nan_codes) << c.name;
  }
}

TEST(NumericsDecode, Ue8m0EveryCode) {
  for (std::uint32_t code = 0; code < 255; ++code) {
    const float value = decode_ue8m0(std::uint8_t(code));
    EXPECT_EQ(float_bits(value), reference::ue8m0().value_bits(code)) << code;
    EXPECT_EQ(std::ldexp(1.0, int(code) - 127), double(value)) << code;
    EXPECT_EQ(encode_ue8m0(value), code) << code;
  }
  EXPECT_TRUE(std::isnan(decode_ue8m0(0xFF)));
  EXPECT_EQ(encode_ue8m0(decode_ue8m0(0xFF)), 0xFF);
}

TEST(NumericsDecode, KnownValues) {
  EXPECT_EQ(decode_e4m3(0x7E), 448.0f);
  EXPECT_EQ(decode_e4m3(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(decode_e4m3(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(decode_e4m3(0x38), 1.0f);
  EXPECT_EQ(decode_e5m2(0x7B), 57344.0f);
  EXPECT_EQ(decode_e5m2(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(decode_e5m2(0x3C), 1.0f);
  const float e2m1_values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int code = 0; code < 8; ++code) {
    EXPECT_EQ(decode_e2m1(std::uint8_t(code)), e2m1_values[code]);
    EXPECT_EQ(decode_e2m1(std::uint8_t(code | 8)), -e2m1_values[code]);
  }
}

}  // namespace
}  // namespace fp8mla
