// Every fp32 bit pattern (2^32) through each fp32 encoder, against the integer-only reference.
// Labelled `long`: it sweeps the non-negative patterns in increasing order on every core, so the
// reference advances through its midpoints instead of searching, and checks -x beside each x.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fp8mla/numerics.hpp"
#include "numerics_reference.hpp"

namespace fp8mla {
namespace {

struct Mismatch {
  std::uint32_t input, got, expected;
};

// Runs check(lo, hi, mismatches) over [0, 2^31) in chunks on every hardware thread.
template <typename Check>
std::vector<Mismatch> sweep(Check check) {
  constexpr std::uint64_t kChunk = 1ull << 22, kEnd = 1ull << 31;
  std::atomic<std::uint64_t> next{0};
  std::mutex mutex;
  std::vector<Mismatch> all;
  auto worker = [&] {
    std::vector<Mismatch> local;
    for (std::uint64_t lo; (lo = next.fetch_add(kChunk)) < kEnd;) {
      check(std::uint32_t(lo), std::uint32_t(std::min(lo + kChunk, kEnd) - 1), local);
    }
    std::lock_guard lock(mutex);
    all.insert(all.end(), local.begin(), local.end());
  };
  std::vector<std::thread> threads(std::max(1u, std::thread::hardware_concurrency()));
  for (auto& t : threads) t = std::thread(worker);
  for (auto& t : threads) t.join();
  return all;
}

void report(const std::string& name, const std::vector<Mismatch>& mismatches) {
  for (std::size_t i = 0; i < std::min<std::size_t>(mismatches.size(), 5); ++i) {
    const Mismatch& m = mismatches[i];
    ADD_FAILURE() << name << ": fp32 0x" << std::hex << m.input << " -> 0x" << m.got
                  << ", expected 0x" << m.expected;
  }
  EXPECT_EQ(mismatches.size(), 0u) << name << " mismatches";
}

// Encoder `encode` against reference::Format `f` over [lo, hi] and the negated patterns.
template <typename Encode>
void check_format(const reference::Format& f, Encode encode, std::uint32_t lo, std::uint32_t hi,
                  std::vector<Mismatch>& out) {
  std::size_t below = std::size_t(std::lower_bound(f.midpoints().begin(), f.midpoints().end(), lo) -
                                  f.midpoints().begin());
  for (std::uint32_t a = lo;; ++a) {
    std::uint32_t expected = a > 0x7F800000u ? f.nan_code() : f.encode_magnitude(a, below);
    const std::uint32_t got = encode(float_from_bits(a));
    if (got != expected) out.push_back({a, got, expected});
    if (a <= 0x7F800000u) expected |= f.sign_bit();  // NaN ignores the sign
    const std::uint32_t got_neg = encode(float_from_bits(a | 0x80000000u));
    if (got_neg != expected) out.push_back({a | 0x80000000u, got_neg, expected});
    if (out.size() > 100 || a == hi) break;
  }
}

// Every fp32 pattern through `encode`, against reference::Format `f`.
template <typename Encode>
void check_every_pattern(const std::string& name, const reference::Format& f, Encode encode) {
  report(name, sweep([&](std::uint32_t lo, std::uint32_t hi, std::vector<Mismatch>& out) {
           check_format(f, encode, lo, hi, out);
         }));
}

TEST(NumericsExhaustiveF32, E4M3) {
  check_every_pattern("e4m3", reference::e4m3(), encode_e4m3);
}

TEST(NumericsExhaustiveF32, E5M2) {
  check_every_pattern("e5m2", reference::e5m2(), encode_e5m2);
}

TEST(NumericsExhaustiveF32, E2M1) {
  check_every_pattern("e2m1", reference::e2m1(), encode_e2m1);
}

TEST(NumericsExhaustiveF32, Bf16) {
  check_every_pattern("bf16", reference::bf16(), encode_bf16);
}

TEST(NumericsExhaustiveF32, F16) {
  check_every_pattern("f16", reference::f16(), encode_f16);
}

TEST(NumericsExhaustiveF32, Ue8m0) {
  report("ue8m0", sweep([](std::uint32_t lo, std::uint32_t hi, std::vector<Mismatch>& out) {
           const reference::Ue8m0& ref = reference::ue8m0();
           std::size_t below =
               std::size_t(std::lower_bound(ref.powers().begin(), ref.powers().end(), lo) -
                           ref.powers().begin());
           for (std::uint32_t a = lo;; ++a) {
             const std::uint32_t expected = a > 0x7F800000u ? 0xFF : ref.encode_magnitude(a, below);
             for (const std::uint32_t x : {a, a | 0x80000000u}) {  // the sign is ignored
               const std::uint32_t got = encode_ue8m0(float_from_bits(x));
               if (got != expected) out.push_back({x, got, expected});
             }
             if (out.size() > 100 || a == hi) break;
           }
         }));
}

}  // namespace
}  // namespace fp8mla
