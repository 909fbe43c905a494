// Checks shared by quant_arith_test.cpp and quant_arith_exhaustive_test.cpp: the kernels' group
// scale and scaled values (ops/quant_arith.hpp) against the CPU ops' plain arithmetic.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "fp8mla/numerics.hpp"
#include "ops/quant_arith.hpp"

namespace fp8mla::test {

// group_scale(amax, pow2) against s = amax / 448 (rounded up to a power of two when pow2) and its
// UE8M0 byte; the values then scale by the reciprocal of s exactly when that form covers s.
inline bool group_scale_matches(float amax, bool pow2) {
  const GroupScale g = group_scale(amax, pow2);
  float s = amax / kE4M3Max;
  const std::uint8_t exponent = encode_ue8m0(s);
  if (pow2) s = decode_ue8m0(exponent);
  if (float_bits(g.s) != float_bits(s) || g.exponent != exponent) return false;
  if (pow2) {
    return g.apply == GroupScale::Apply::kMultiply &&
           float_bits(g.factor) == float_bits(decode_ue8m0(std::uint8_t(254 - exponent)));
  }
  if (division_by_reciprocal_exact(s)) {
    return g.apply == GroupScale::Apply::kReciprocal &&
           float_bits(g.factor) == float_bits(1.0f / s);
  }
  return g.apply == GroupScale::Apply::kDivide;
}

// scale_value(group_scale(amax, pow2), x) against x / s: the e4m3 bytes always, and the f32
// quotient itself where the reciprocal form claims RN(x / s) and the quotient can reach e4m3
// (|x / s| >= 2^-11).
class DivisionCheck {
 public:
  void value(float x, float amax) {
    for (bool pow2 : {false, true}) {
      const GroupScale g = group_scale(amax, pow2);
      float s = amax / kE4M3Max;
      if (pow2) s = decode_ue8m0(encode_ue8m0(s));
      const float expected = x / s, got = scale_value(g, x);
      const bool reciprocal = g.apply == GroupScale::Apply::kReciprocal;
      ++(reciprocal ? fast_ : fallback_);
      const bool f32_claimed = reciprocal && std::fabs(expected) >= 0x1p-11f;
      if (encode_e4m3(got) != encode_e4m3(expected) ||
          (f32_claimed && float_bits(got) != float_bits(expected))) {
        if (++mismatches_ <= 5) {
          std::ostringstream m;
          m << std::hexfloat << "x " << x << " amax " << amax << (pow2 ? " (pow2)" : " (f32)")
            << ": got " << got << ", x / s = " << expected;
          first_.push_back(m.str());
        }
      }
    }
  }
  void expect_clean() const {
    for (const std::string& m : first_) ADD_FAILURE() << m;
    EXPECT_EQ(mismatches_, 0) << "of " << fast_ + fallback_ << " values";
  }
  long long fast_path() const { return fast_; }
  long long fallback() const { return fallback_; }

 private:
  long long fast_ = 0, fallback_ = 0, mismatches_ = 0;
  std::vector<std::string> first_;
};

}  // namespace fp8mla::test
