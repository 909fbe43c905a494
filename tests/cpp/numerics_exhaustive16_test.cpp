// Every bf16 and every fp16 input through the fp8 encoders, against the integer-only reference.
#include <gtest/gtest.h>

#include <cstdint>

#include "fp8mla/numerics.hpp"
#include "numerics_reference.hpp"

namespace fp8mla {
namespace {

using EncodeFn = std::uint8_t (*)(float);

struct Case {
  const char* name;
  EncodeFn encode;
  const reference::Format& (*format)();
};

const Case kFp8Encoders[] = {
    {"e4m3", encode_e4m3, reference::e4m3},
    {"e5m2", encode_e5m2, reference::e5m2},
};

TEST(NumericsExhaustive16, EveryBf16ToFp8) {
  for (const Case& c : kFp8Encoders) {
    int mismatches = 0;
    for (std::uint32_t b = 0; b < 0x10000; ++b) {
      const std::uint32_t expected = c.format().encode(b << 16);
      const std::uint32_t got = c.encode(decode_bf16(std::uint16_t(b)));
      if (got != expected && ++mismatches <= 5) {
        ADD_FAILURE() << c.name << ": bf16 0x" << std::hex << b << " -> 0x" << got
                      << ", expected 0x" << expected;
      }
    }
    EXPECT_EQ(mismatches, 0) << c.name;
  }
}

TEST(NumericsExhaustive16, EveryF16ToFp8) {
  for (const Case& c : kFp8Encoders) {
    int mismatches = 0;
    for (std::uint32_t h = 0; h < 0x10000; ++h) {
      const std::uint32_t expected =
          c.format().encode(reference::f16_to_f32_bits(std::uint16_t(h)));
      const std::uint32_t got = c.encode(decode_f16(std::uint16_t(h)));
      if (got != expected && ++mismatches <= 5) {
        ADD_FAILURE() << c.name << ": f16 0x" << std::hex << h << " -> 0x" << got << ", expected 0x"
                      << expected;
      }
    }
    EXPECT_EQ(mismatches, 0) << c.name;
  }
}

TEST(NumericsExhaustive16, Bf16AndF16DecodeExactly) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    ASSERT_EQ(float_bits(decode_bf16(std::uint16_t(b))), b << 16) << std::hex << b;
  }
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    ASSERT_EQ(float_bits(decode_f16(std::uint16_t(h))),
              reference::f16_to_f32_bits(std::uint16_t(h)))
        << std::hex << h;
  }
}

TEST(NumericsExhaustive16, Bf16AndF16RoundTrip) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const bool nan = (b & 0x7FFF) > 0x7F80;
    const std::uint16_t back = encode_bf16(decode_bf16(std::uint16_t(b)));
    ASSERT_EQ(back, nan ? 0x7FFF : b) << std::hex << b;
  }
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const bool nan = (h & 0x7FFF) > 0x7C00;
    const std::uint16_t back = encode_f16(decode_f16(std::uint16_t(h)));
    ASSERT_EQ(back, nan ? 0x7FFF : h) << std::hex << h;
  }
}

}  // namespace
}  // namespace fp8mla
