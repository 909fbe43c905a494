// The CPU backend's parallel_for: every chunk runs once, an exception from a chunk reaches the
// caller, and a thread that cannot be made (a process limit) leaves its chunks to the caller.
#include "cpu/parallel_for.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

namespace fp8mla::cpu {
namespace {

// Counts how often each of n items was visited.
struct Visits {
  explicit Visits(std::int64_t n) : count(std::size_t(n)) {}
  void operator()(std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) ++count[std::size_t(i)];
  }
  bool each_once() const {
    for (const std::atomic<int>& c : count) {
      if (c != 1) return false;
    }
    return true;
  }
  std::vector<std::atomic<int>> count;
};

// Makes threads until the `fail_at`-th, which fails as std::thread does at a process limit.
struct FailingSpawn {
  int fail_at;
  int* made;
  template <typename Task>
  std::thread operator()(Task task) const {
    if (*made == fail_at)
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
    ++*made;
    return std::thread(std::move(task));
  }
};

TEST(ParallelFor, EveryItemOnce) {
  for (std::int64_t n : {1, 7, 64, 1000, 4099}) {
    Visits v(n);
    parallel_for(n, 3, [&](std::int64_t b, std::int64_t e) { v(b, e); });
    EXPECT_TRUE(v.each_once()) << n;
  }
}

TEST(ParallelFor, ThreadsThatCannotBeMadeLeaveTheirChunksToTheCaller) {
  for (int fail_at : {0, 1, 3}) {
    SCOPED_TRACE(fail_at);
    int made = 0;
    Visits v(1000);
    auto fn = [&](std::int64_t b, std::int64_t e) { v(b, e); };
    parallel_chunks(1000, 8, FailingSpawn{fail_at, &made}, fn);
    EXPECT_EQ(made, fail_at);
    EXPECT_TRUE(v.each_once());
  }
}

TEST(ParallelFor, AChunksExceptionReachesTheCaller) {
  int made = 0;
  auto fn = [](std::int64_t b, std::int64_t) {
    if (b == 0) throw std::runtime_error("chunk 0");
  };
  EXPECT_THROW(parallel_chunks(100, 4, FailingSpawn{2, &made}, fn), std::runtime_error);
  EXPECT_THROW(parallel_for(100, 1, fn), std::runtime_error);
}

}  // namespace
}  // namespace fp8mla::cpu
