// The sweeps behind src/ops/quant_arith.hpp, labelled `long`: e2m1_code against encode_e2m1 on
// every fp32 pattern, and e2m1_magnitude_sum_below7 with p's sign against e2m1_code on every
// |p| < 7; the group scale against amax / 448 and the NVFP4 block quotient against amax / 6 on
// every amax; and divide_by_reciprocal against IEEE division for every divisor mantissa with every
// bf16 and every f16 dividend mantissa. Quotients scale with powers of two as long as nothing underflows or
// overflows, which the covered range guarantees, so s in [1, 2) and x in [0.5, 2) stand for
// every exponent pair.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "fp8mla/numerics.hpp"
#include "ops/quant_arith.hpp"
#include "quant_arith_test_util.hpp"

namespace fp8mla::test {
namespace {

// Runs check(i) for i in [0, n) on every hardware thread; returns how many returned false and the
// first such i (n if none).
template <typename Check>
std::pair<std::uint64_t, std::uint64_t> count_failures(std::uint64_t n, Check check) {
  constexpr std::uint64_t kChunk = 1ull << 20;
  std::atomic<std::uint64_t> next{0}, failures{0}, first{n};
  auto worker = [&] {
    for (std::uint64_t lo; (lo = next.fetch_add(kChunk)) < n;) {
      for (std::uint64_t i = lo; i < std::min(lo + kChunk, n); ++i) {
        if (check(i)) continue;
        ++failures;
        for (std::uint64_t f = first; i < f && !first.compare_exchange_weak(f, i);) {
        }
      }
    }
  };
  std::vector<std::thread> threads(std::max(1u, std::thread::hardware_concurrency()));
  for (auto& t : threads) t = std::thread(worker);
  for (auto& t : threads) t.join();
  return {failures.load(), first.load()};
}

TEST(QuantArithExhaustive, E2m1CodeEqualsEncodeE2m1OnEveryF32) {
  const auto [failures, first] = count_failures(1ull << 32, [](std::uint64_t i) {
    const float p = float_from_bits(std::uint32_t(i));
    return e2m1_code(p) == encode_e2m1(p);
  });
  EXPECT_EQ(failures, 0u) << "first at fp32 0x" << std::hex << first;
}

TEST(QuantArithExhaustive, E2m1MagnitudeSumAndSignEqualE2m1CodeBelow7) {
  const auto [failures, first] = count_failures(1ull << 32, [](std::uint64_t i) {
    const float p = float_from_bits(std::uint32_t(i));
    if (!(p > -7.0f && p < 7.0f)) return true;  // outside the function's range, NaN included
    const std::uint32_t sum = e2m1_magnitude_sum_below7(p);
    const std::uint32_t code = (sum & 0xFFu) | ((std::uint32_t(i) >> 28) & 0x8u);
    return (sum & 0xF8u) == 0 && code == e2m1_code(p);
  });
  EXPECT_EQ(failures, 0u) << "first at fp32 0x" << std::hex << first;
}

TEST(QuantArithExhaustive, GroupScaleEqualsIeeeOnEveryPositiveAmax) {
  const auto [failures, first] = count_failures(0x7F800000ull, [](std::uint64_t i) {
    const float amax = float_from_bits(std::uint32_t(i + 1));  // 2^-149 .. +inf
    return group_scale_matches(amax, false) && group_scale_matches(amax, true);
  });
  EXPECT_EQ(failures, 0u) << "first at amax bits 0x" << std::hex << first + 1;
}

TEST(QuantArithExhaustive, Nvfp4BlockQuotientEqualsIeeeOnEveryAmax) {
  const auto [failures, first] = count_failures(0x7F800001ull, [](std::uint64_t i) {
    const float amax = float_from_bits(std::uint32_t(i));  // +0 .. +inf
    return float_bits(nvfp4_block_quotient(amax)) == float_bits(amax / kE2M1Max);
  });
  EXPECT_EQ(failures, 0u) << "first at amax bits 0x" << std::hex << first;
}

// x in [0.5, 2) with `bits` mantissa bits against every s in [1, 2).
void expect_division_exact(int bits) {
  const std::uint64_t dividends = 2ull << bits;  // two binades
  const auto [failures, first] = count_failures(dividends << 23, [&](std::uint64_t i) {
    const float s = float_from_bits(0x3F800000u | std::uint32_t(i & 0x7FFFFFu));
    const std::uint64_t d = i >> 23;
    const float x = float_from_bits(((126u + std::uint32_t(d >> bits)) << 23) |
                                    (std::uint32_t(d & ((1u << bits) - 1)) << (23 - bits)));
    return float_bits(divide_by_reciprocal(x, s, reciprocal_rn(s))) == float_bits(x / s);
  });
  EXPECT_EQ(failures, 0u) << bits << "-bit dividends, first at case " << first;
}

TEST(QuantArithExhaustive, DivisionEqualsIeeeForBf16Dividends) {
  expect_division_exact(7);
}

TEST(QuantArithExhaustive, DivisionEqualsIeeeForF16Dividends) {
  expect_division_exact(10);
}

}  // namespace
}  // namespace fp8mla::test
