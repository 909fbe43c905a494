// What the random-shape agreement tests share: the case count and base seed (FP8MLA_RANDOM_CASES,
// FP8MLA_RANDOM_SEED), the seeded draws a case's parameters come from (std::mt19937_64 of
// seed = base + case index, reduced by modulo so that a seed draws the same case everywhere), the
// loop that runs an op's cases and names the failing seeds with the command that reruns one, and
// the bit-exact comparison of a case run on the CPU and on the GPU from identical poisoned
// buffers.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "buffer_test_util.hpp"
#include "cuda/common/runtime.hpp"
#include "cuda_test_util.hpp"
#include "fp8mla/error.hpp"

namespace fp8mla::test {

// FP8MLA_RANDOM_CASES, when set, is every op's case count (at least 1); else `default_cases`.
inline int random_case_count(int default_cases) {
  const char* env = std::getenv("FP8MLA_RANDOM_CASES");
  if (env == nullptr || *env == '\0') return default_cases;
  return int(std::max(std::strtol(env, nullptr, 10), 1L));
}

// FP8MLA_RANDOM_SEED, when set, is the seed of case 0; else 1. Case i has seed base + i.
inline std::uint64_t random_base_seed() {
  const char* env = std::getenv("FP8MLA_RANDOM_SEED");
  if (env == nullptr || *env == '\0') return 1;
  return std::strtoull(env, nullptr, 10);
}

// The draws of one case, all from one std::mt19937_64.
class Draw {
 public:
  explicit Draw(std::uint64_t seed) : rng_(seed) {}
  std::uint64_t bits() { return rng_(); }
  // Uniform in [lo, hi] (inclusive).
  std::int64_t range(std::int64_t lo, std::int64_t hi) {
    return lo + std::int64_t(rng_() % std::uint64_t(hi - lo + 1));
  }
  bool chance(double p) { return double(rng_() >> 11) * 0x1p-53 < p; }
  template <typename T>
  T pick(std::initializer_list<T> items) {
    return items.begin()[range(0, std::int64_t(items.size()) - 1)];
  }
  // Log-uniform in [lo, hi].
  float log_uniform(float lo, float hi) {
    const double u = double(rng_() >> 11) * 0x1p-53;
    return float(
        std::exp(std::log(double(lo)) + u * (std::log(double(hi)) - std::log(double(lo)))));
  }
  // A scale: 1 on one case in four, else log-uniform over [lo, hi].
  float scale(float lo, float hi) { return chance(0.25) ? 1.0f : log_uniform(lo, hi); }
  // A token (row) count up to `max`: 0 and 1 often, short and long counts otherwise.
  std::int64_t tokens(std::int64_t max) {
    const std::int64_t kind = range(0, 9);
    if (kind == 0 || max < 1) return 0;
    if (kind == 1 || max < 2) return 1;
    if (kind < 6) return range(2, std::min<std::int64_t>(max, 70));
    return range(2, max);
  }
  // Padding in elements: none on half the cases, else up to `max`.
  std::int64_t pad(std::int64_t max) { return chance(0.5) ? 0 : range(1, max); }
  Data data() { return chance(0.5) ? Data::kAdversarial : Data::kRandom; }

 private:
  std::mt19937_64 rng_;
};

// The gtest filter of the running test.
inline std::string current_test_filter() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return info == nullptr ? "" : concat(info->test_suite_name(), ".", info->name());
}

// The failures the running test has reported so far.
inline int failure_count() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (info == nullptr) return 0;
  const ::testing::TestResult* result = info->result();
  int n = 0;
  for (int i = 0; i < result->total_part_count(); ++i) n += result->GetTestPartResult(i).failed();
  return n;
}

// Runs `cases` (default) random cases of one op, or FP8MLA_RANDOM_CASES of them: case i is
// make(Draw(base + i)) (a case type with describe()), checked by check(c). A failure names the op,
// the seed, the drawn case and the command that reruns it alone; an fp8mla::Error from the op is a
// failure too (the generator draws valid arguments only). Stops after 5 failing seeds.
template <typename Make, typename Check>
void for_each_random_case(const char* op, int cases, Make make, Check check) {
  const std::uint64_t base = random_base_seed();
  const int n = random_case_count(cases);
  int failing = 0;
  for (int i = 0; i < n && failing < 5; ++i) {
    const std::uint64_t seed = base + std::uint64_t(i);
    Draw draw(seed);
    const auto c = make(draw);
    const std::string what =
        concat(op, ", seed ", seed, ": ", c.describe(), "\n  rerun: FP8MLA_RANDOM_SEED=", seed,
               " FP8MLA_RANDOM_CASES=1 random_agreement_cuda_test "
               "--gtest_filter=",
               current_test_filter());
    const int failures_before = failure_count();
    {
      SCOPED_TRACE(what);
      try {
        check(c);
      } catch (const Error& e) {
        ADD_FAILURE() << "the op rejected a drawn case: " << e.what();
      }
    }
    failing += failure_count() > failures_before;
  }
  std::printf("[ random   ] %s: %d cases from seed %llu\n", op, n,
              static_cast<unsigned long long>(base));
}

// A case's buffers with outputs poisoned with `poison` and inputs written (cases list specs(), or
// buffers(poison) for the RoPE case).
template <typename Case>
std::vector<HostBuffer> initial_buffers(const Case& c, std::uint8_t poison) {
  if constexpr (requires { c.buffers(poison); }) {
    std::vector<HostBuffer> b = c.buffers(poison);
    c.init(b);
    return b;
  } else {
    return host_buffers(c, poison);
  }
}

// The case on the CPU and on the GPU (its own stream) from identical buffers poisoned with each
// of `poisons`: every byte of every buffer equal afterwards, host and device guards intact.
template <typename Case>
void expect_bit_exact(const Case& c, std::initializer_list<std::uint8_t> poisons = {kPoison}) {
  for (std::uint8_t poison : poisons) {
    SCOPED_TRACE(concat("poison 0x", std::hex, int(poison)));
    std::vector<HostBuffer> host = initial_buffers(c, poison);
    const std::vector<DeviceBuffer> device = upload(host);
    c.run(host_bases(host), Device::cpu());
    cudaStream_t stream = nullptr;
    cuda::check(cudaStreamCreate(&stream), "cudaStreamCreate");
    c.run(device_bases(device), Device::cuda(0), stream);
    cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    cudaStreamDestroy(stream);
    for (std::size_t i = 0; i < host.size(); ++i) {
      EXPECT_TRUE(same_bytes(device[i].download(), host[i].payload(), concat("buffer ", i)));
      EXPECT_TRUE(device[i].guards_intact()) << "device buffer " << i;
      EXPECT_TRUE(host[i].guards_intact()) << "host buffer " << i;
    }
  }
}

}  // namespace fp8mla::test
