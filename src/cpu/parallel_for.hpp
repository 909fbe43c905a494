// Splits [0, n) into contiguous chunks over the machine's threads (the CPU reference backend is
// threaded so that checks on realistic shapes finish quickly).
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace fp8mla::cpu {

// Calls fn(begin, end) on disjoint chunks covering [0, n). Chunks hold at least `grain` items.
// An exception from any chunk is rethrown on the calling thread.
template <typename Fn>
void parallel_for(std::int64_t n, std::int64_t grain, Fn fn) {
  if (n <= 0) return;
  const std::int64_t hw = std::max<unsigned>(1, std::thread::hardware_concurrency());
  const std::int64_t workers =
      std::clamp<std::int64_t>(n / std::max<std::int64_t>(grain, 1), 1, hw);
  if (workers == 1) {
    fn(std::int64_t{0}, n);
    return;
  }
  std::exception_ptr error;
  std::mutex mutex;
  std::vector<std::thread> threads;
  const std::int64_t chunk = (n + workers - 1) / workers;
  for (std::int64_t begin = 0; begin < n; begin += chunk) {
    threads.emplace_back([&, begin] {
      try {
        fn(begin, std::min(begin + chunk, n));
      } catch (...) {
        std::lock_guard lock(mutex);
        if (!error) error = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace fp8mla::cpu
