// Splits [0, n) into contiguous chunks over the machine's threads (the CPU reference backend is
// threaded so that checks on realistic shapes finish quickly).
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace fp8mla::cpu {

// parallel_for's work over `workers` chunks, each thread made by spawn(task) (std::thread's
// constructor; a test passes one that fails). Where no thread can be had (a process or container
// limit: std::system_error), the calling thread runs the chunks left, so the call still
// completes instead of ending the process.
template <typename Spawn, typename Fn>
void parallel_chunks(std::int64_t n, std::int64_t workers, Spawn spawn, Fn& fn) {
  std::exception_ptr error;
  std::mutex mutex;
  const std::int64_t chunk = (n + workers - 1) / workers;
  const auto run = [&](std::int64_t begin) {
    try {
      fn(begin, std::min(begin + chunk, n));
    } catch (...) {
      std::lock_guard lock(mutex);
      if (!error) error = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(std::size_t(workers));
  std::int64_t begin = 0;
  for (; begin < n; begin += chunk) {
    try {
      threads.push_back(spawn([&run, begin] { run(begin); }));
    } catch (const std::system_error&) {
      break;
    }
  }
  for (; begin < n; begin += chunk) run(begin);
  for (std::thread& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

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
  parallel_chunks(
      n, workers, [](auto task) { return std::thread(std::move(task)); }, fn);
}

}  // namespace fp8mla::cpu
