// An independent, integer-only reference for rounding fp32 inputs to the library's storage formats.
//
// It shares nothing with fp8mla/numerics.hpp: each format's values are built from its definition
// as integers N * 2^k, turned into fp32 bit patterns by integer arithmetic, and an input is rounded
// by locating its bit pattern (monotonic in value for non-negative floats) among the exact
// midpoints of neighbouring values, ties going to the even code.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace fp8mla::reference {

// fp32 bit pattern of the exact value n * 2^k (n >= 0); throws if it is not representable.
inline std::uint32_t f32_bits_of(std::uint64_t n, int k) {
  if (n == 0) return 0;
  while (n < (1ull << 23)) n <<= 1, --k;
  while (n >= (1ull << 24)) {
    if (n & 1) throw std::logic_error("value needs more than 24 significant bits");
    n >>= 1, ++k;
  }
  const int biased = k + 23 + 127;
  if (biased >= 255) throw std::logic_error("value overflows fp32");
  if (biased >= 1) return (std::uint32_t(biased) << 23) | std::uint32_t(n - (1ull << 23));
  const int shift = 1 - biased;  // fp32 subnormal
  if (shift > 24 || (n & ((1ull << shift) - 1))) throw std::logic_error("value underflows fp32");
  return std::uint32_t(n >> shift);
}

struct Exact {  // n * 2^k
  std::uint64_t n;
  int k;
};

inline Exact midpoint(Exact a, Exact b) {
  const int k = std::min(a.k, b.k);
  return {(a.n << (a.k - k)) + (b.n << (b.k - k)), k - 1};
}

// A sign-magnitude format whose positive codes 0, 1, 2, ... are its values in increasing order.
class Format {
 public:
  // exp_bits/man_bits/bias define the values. `finite_codes` positive codes are finite. With
  // `ieee_overflow`, values past max + half an ulp round to the code after max (+inf); otherwise
  // everything past max saturates to max. `nan_code` is what any NaN must encode to.
  Format(std::string name, int exp_bits, int man_bits, int bias, std::uint32_t finite_codes,
         bool ieee_overflow, std::uint32_t nan_code)
      : name_(std::move(name)),
        sign_shift_(exp_bits + man_bits),
        ieee_overflow_(ieee_overflow),
        nan_code_(nan_code) {
    std::vector<Exact> values;
    for (std::uint32_t code = 0; code < finite_codes; ++code) {
      const std::uint64_t e = code >> man_bits, m = code & ((1u << man_bits) - 1);
      values.push_back(e == 0 ? Exact{m, 1 - bias - man_bits}
                              : Exact{(1ull << man_bits) + m, int(e) - bias - man_bits});
    }
    for (const Exact& v : values) value_bits_.push_back(f32_bits_of(v.n, v.k));
    if (ieee_overflow) {  // +inf rounds like the next power of two past max (maybe not an fp32)
      values.push_back({1, int(finite_codes >> man_bits) - bias});
    }
    for (std::size_t i = 0; i + 1 < values.size(); ++i) {
      const Exact mid = midpoint(values[i], values[i + 1]);
      mid_bits_.push_back(f32_bits_of(mid.n, mid.k));
    }
    max_code_ = finite_codes - 1;
  }

  const std::string& name() const { return name_; }
  // fp32 bits of the value of positive code `code` (finite codes only).
  std::uint32_t value_bits(std::uint32_t code) const { return value_bits_.at(code); }
  std::uint32_t max_code() const { return max_code_; }
  std::uint32_t nan_code() const { return nan_code_; }
  std::uint32_t sign_bit() const { return 1u << sign_shift_; }
  const std::vector<std::uint32_t>& midpoints() const { return mid_bits_; }

  // Code of the non-negative magnitude `a` (fp32 bits, not NaN) when the first `start`
  // midpoints are known to lie below `a`; returns the number of midpoints below `a` in `below`.
  std::uint32_t encode_magnitude(std::uint32_t a, std::size_t& below) const {
    if (!ieee_overflow_ && a >= value_bits_[max_code_]) return max_code_;
    while (below < mid_bits_.size() && mid_bits_[below] < a) ++below;
    std::uint32_t code = std::uint32_t(below);
    if (below < mid_bits_.size() && mid_bits_[below] == a && (code & 1u)) ++code;  // tie: even
    return code;
  }

  std::uint32_t encode(std::uint32_t f32) const {
    const std::uint32_t a = f32 & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return nan_code_;
    std::size_t below =
        std::size_t(std::lower_bound(mid_bits_.begin(), mid_bits_.end(), a) - mid_bits_.begin());
    return ((f32 >> 31) << sign_shift_) | encode_magnitude(a, below);
  }

 private:
  std::string name_;
  int sign_shift_;
  bool ieee_overflow_;
  std::uint32_t nan_code_;
  std::uint32_t max_code_ = 0;
  std::vector<std::uint32_t> value_bits_;
  std::vector<std::uint32_t> mid_bits_;
};

inline const Format& e4m3() {
  static const Format f("e4m3fn", 4, 3, 7, 0x7F, false, 0x7F);  // 0x7F itself is NaN
  return f;
}
inline const Format& e5m2() {
  static const Format f("e5m2", 5, 2, 15, 0x7C, false, 0x7F);
  return f;
}
inline const Format& e2m1() {
  static const Format f("e2m1", 2, 1, 1, 0x8, false, 0x7);
  return f;
}
inline const Format& bf16() {
  static const Format f("bf16", 8, 7, 127, 0x7F80, true, 0x7FFF);
  return f;
}
inline const Format& f16() {
  static const Format f("f16", 5, 10, 15, 0x7C00, true, 0x7FFF);
  return f;
}

// ue8m0: the smallest power of two 2^(c - 127) >= |x|, c clamped to [0, 254]; NaN -> 0xFF.
class Ue8m0 {
 public:
  Ue8m0() {
    for (int c = 0; c <= 254; ++c) powers_.push_back(f32_bits_of(1, c - 127));
  }
  // As Format::encode_magnitude: `below` counts the powers known to lie below `a`.
  std::uint32_t encode_magnitude(std::uint32_t a, std::size_t& below) const {
    while (below < powers_.size() && powers_[below] < a) ++below;
    return std::min<std::uint32_t>(std::uint32_t(below), 254);
  }
  std::uint32_t encode(std::uint32_t f32) const {
    const std::uint32_t a = f32 & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return 0xFF;
    std::size_t below = 0;
    return encode_magnitude(a, below);
  }
  const std::vector<std::uint32_t>& powers() const { return powers_; }
  std::uint32_t value_bits(std::uint32_t code) const { return powers_.at(code); }

 private:
  std::vector<std::uint32_t> powers_;
};

inline const Ue8m0& ue8m0() {
  static const Ue8m0 f;
  return f;
}

// fp16 bits to fp32 bits, exactly, by integer arithmetic (NaN -> canonical NaN).
inline std::uint32_t f16_to_f32_bits(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h >> 15) << 31;
  const std::uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
  if (e == 0x1F) return m ? 0x7FFFFFFFu : (sign | 0x7F800000u);
  return sign | (e == 0 ? f32_bits_of(m, -24) : f32_bits_of(0x400 + m, int(e) - 25));
}

}  // namespace fp8mla::reference
