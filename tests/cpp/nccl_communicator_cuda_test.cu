// The NCCL communicators (fp8mla/mla_parallel.hpp): one rank on one GPU through the NCCL path
// (sums of one rank, in place and into a shard, plain and captured in a CUDA graph; its
// all-gather, out of place and in place), the argument errors, and, where the machine has two
// GPUs or more, a sum and an all-gather over ranks on their own threads.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda_test_util.hpp"
#include "device_case_util.cuh"
#include "error_test_util.hpp"
#include "fp8mla/mla_parallel.hpp"
#include "fp8mla/numerics.hpp"

namespace fp8mla {
namespace {

using test::DeviceBuffer;
using test::TestStream;

// n bf16 values of rank `rank`: small integers, so that any sum order is exact.
std::vector<std::uint16_t> rank_values(std::int64_t n, int rank) {
  std::vector<std::uint16_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[std::size_t(i)] = encode_bf16(float((i * 7 + rank) % 13 - 6));
  return v;
}

std::vector<std::uint8_t> bytes(const std::vector<std::uint16_t>& v) {
  std::vector<std::uint8_t> b(v.size() * 2);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TensorView bf16_view(const DeviceBuffer& b, std::vector<std::int64_t> shape, int device = 0) {
  return TensorView(b.data(), DType::kBF16, shape, Device::cuda(device));
}

// n bytes of rank `rank` (any bit pattern: an all-gather copies bytes).
std::vector<std::uint8_t> rank_bytes(std::size_t n, int rank) {
  std::vector<std::uint8_t> b(n);
  for (std::size_t i = 0; i < n; ++i)
    b[i] = std::uint8_t((std::size_t(rank) * 37 + i * 11 + 1) & 0xFF);
  return b;
}

// `shape` of `dtype` at byte `offset` of b, on cuda:device.
TensorView view_at(const DeviceBuffer& b, DType dtype, std::vector<std::int64_t> shape,
                   std::size_t offset = 0, int device = 0) {
  return TensorView(static_cast<std::uint8_t*>(b.data()) + offset, dtype, shape,
                    Device::cuda(device));
}

TEST(NcclCuda, OneRankAllReduceKeepsEveryValue) {
  FP8MLA_REQUIRE_HOPPER();
  auto group = make_nccl_communicators({0});
  ASSERT_EQ(group.size(), 1u);
  EXPECT_EQ(group[0]->rank(), 0);
  EXPECT_EQ(group[0]->size(), 1);
  const std::int64_t rows = 37, cols = 7168;
  const std::vector<std::uint16_t> host = rank_values(rows * cols, 3);
  DeviceBuffer buf(host.size() * 2);
  buf.upload(host.data());
  TestStream stream;
  group[0]->all_reduce_sum(bf16_view(buf, {rows, cols}), stream.get());
  stream.sync();
  EXPECT_TRUE(test::same_bytes(buf.download(), bytes(host), "all-reduced bf16"));
  EXPECT_TRUE(buf.guards_intact());

  std::vector<float> f(1000);
  for (std::size_t i = 0; i < f.size(); ++i) f[i] = 0.25f * float(i) - 7.0f;
  DeviceBuffer fbuf(f.size() * 4);
  fbuf.upload(f.data());
  group[0]->all_reduce_sum(TensorView(fbuf.data(), DType::kF32, {1000}, Device::cuda(0)),
                           stream.get());
  stream.sync();
  EXPECT_EQ(fbuf.download_as<float>(), f);
}

TEST(NcclCuda, OneRankReduceScatterCopiesIntoTheShard) {
  FP8MLA_REQUIRE_HOPPER();
  auto group = make_nccl_communicators({0});
  const std::int64_t rows = 16, cols = 512;
  const std::vector<std::uint16_t> host = rank_values(rows * cols, 1);
  DeviceBuffer in(host.size() * 2), out(host.size() * 2);
  in.upload(host.data());
  TestStream stream;
  group[0]->reduce_scatter_sum(bf16_view(in, {rows, cols}), bf16_view(out, {rows, cols}),
                               stream.get());
  stream.sync();
  EXPECT_TRUE(test::same_bytes(out.download(), in.download(), "reduce-scattered shard"));
  EXPECT_TRUE(out.guards_intact());
}

// One rank's all-gather is a copy of its rows: out of place (bf16, and e4m3 latent cache rows as
// bytes) and in place (in is all of out).
TEST(NcclCuda, OneRankAllGatherCopiesTheRows) {
  FP8MLA_REQUIRE_HOPPER();
  auto group = make_nccl_communicators({0});
  const std::int64_t rows = 37, cols = 7168;
  const std::vector<std::uint16_t> host = rank_values(rows * cols, 2);
  DeviceBuffer in(host.size() * 2), out(host.size() * 2);
  in.upload(host.data());
  TestStream stream;
  group[0]->all_gather(bf16_view(in, {rows, cols}), bf16_view(out, {rows, cols}), stream.get());
  stream.sync();
  EXPECT_TRUE(test::same_bytes(out.download(), bytes(host), "all-gathered bf16"));
  EXPECT_TRUE(out.guards_intact());

  const std::int64_t latent_rows = 300, latent = 576;
  const std::vector<std::uint8_t> cache = rank_bytes(std::size_t(latent_rows * latent), 0);
  DeviceBuffer fp8_in(cache.size()), fp8_out(cache.size());
  fp8_in.upload(cache.data());
  group[0]->all_gather(view_at(fp8_in, DType::kE4M3, {latent_rows, latent}),
                       view_at(fp8_out, DType::kE4M3, {latent_rows, latent}), stream.get());
  stream.sync();
  EXPECT_TRUE(test::same_bytes(fp8_out.download(), cache, "all-gathered e4m3"));
  EXPECT_TRUE(fp8_out.guards_intact());

  group[0]->all_gather(view_at(fp8_in, DType::kE4M3, {latent_rows, latent}),
                       view_at(fp8_in, DType::kE4M3, {latent_rows, latent}), stream.get());
  stream.sync();
  EXPECT_TRUE(test::same_bytes(fp8_in.download(), cache, "all-gathered e4m3 in place"));
  EXPECT_TRUE(fp8_in.guards_intact());
}

// Captured once, replayed on new contents: the layer's prefill may be captured with its
// all-reduce.
TEST(NcclCuda, AllReduceCapturedInAGraph) {
  FP8MLA_REQUIRE_HOPPER();
  auto group = make_nccl_communicators({0});
  const std::int64_t n = 4096;
  DeviceBuffer buf(std::size_t(n) * 2);
  TestStream stream;
  const test::CapturedGraph graph(
      stream.get(), [&] { group[0]->all_reduce_sum(bf16_view(buf, {n}), stream.get()); });
  for (int round = 0; round < 3; ++round) {
    const std::vector<std::uint16_t> host = rank_values(n, round);
    buf.upload(host.data());
    graph.launch(stream.get());
    stream.sync();
    EXPECT_TRUE(test::same_bytes(buf.download(), bytes(host), "replayed all-reduce"));
  }
}

TEST(NcclCuda, RejectsWhatNcclCannotTake) {
  FP8MLA_REQUIRE_HOPPER();
  auto group = make_nccl_communicators({0});
  MlaCommunicator& c = *group[0];
  std::vector<std::uint16_t> host(64);
  const TensorView on_host(host.data(), DType::kBF16, {64}, Device::cpu());
  test::expect_error([&] { c.all_reduce_sum(on_host, nullptr); }, ErrorCategory::kInvalidArgument,
                     {"all_reduce_sum", "cuda:0", "got bf16[64]"});
  DeviceBuffer buf(256);
  const TensorView f16(buf.data(), DType::kF16, {64}, Device::cuda(0));
  test::expect_error([&] { c.all_reduce_sum(f16, nullptr); }, ErrorCategory::kInvalidArgument,
                     {"expected a bf16 or f32 tensor"});
  const TensorView strided(buf.data(), DType::kBF16, {8, 4}, {16, 1}, Device::cuda(0));
  test::expect_error([&] { c.all_reduce_sum(strided, nullptr); }, ErrorCategory::kInvalidArgument,
                     {"expected a contiguous tensor"});
  DeviceBuffer small(128);
  test::expect_error(
      [&] {
        c.reduce_scatter_sum(bf16_view(buf, {8, 16}), bf16_view(small, {4, 16}), nullptr);
      },
      ErrorCategory::kInvalidArgument, {"1/1 of its rows"});
  test::expect_error([&] { c.all_gather(on_host, bf16_view(buf, {64}), nullptr); },
                     ErrorCategory::kInvalidArgument,
                     {"all_gather", "`in`", "cuda:0", "got bf16[64]"});
  test::expect_error(
      [&] {
        c.all_gather(bf16_view(small, {4, 16}), bf16_view(buf, {8, 16}), nullptr);
      },
      ErrorCategory::kInvalidArgument, {"all_gather over 1 ranks", "1 times its rows"});
  test::expect_error(
      [&] {
        c.all_gather(bf16_view(small, {4, 16}), view_at(buf, DType::kF16, {4, 16}), nullptr);
      },
      ErrorCategory::kInvalidArgument, {"`in`'s dtype", "f16[4, 16]"});
  test::expect_error(
      [&] {
        c.all_gather(view_at(buf, DType::kE4M3, {4, 16}, 16), view_at(buf, DType::kE4M3, {4, 16}),
                     nullptr);
      },
      ErrorCategory::kInvalidArgument, {"exactly rank 0's rows", "byte 16"});
  test::expect_error([] { make_nccl_communicator(nullptr); }, ErrorCategory::kInvalidArgument,
                     {"ncclComm_t"});
  test::expect_error([] { make_nccl_communicators({}); }, ErrorCategory::kInvalidArgument,
                     {"1 to 8 devices, got 0"});
}

// Two ranks on two GPUs, each on its own thread: the exact sum in both buffers, then both ranks'
// e4m3 rows gathered, out of place and in place, on both.
TEST(NcclCuda, TwoRanksSumAndGatherOnEveryRank) {
  FP8MLA_REQUIRE_HOPPER();
  int count = 0;
  cuda::check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (count < 2) GTEST_SKIP() << "needs 2 GPUs, this machine has " << count;
  auto group = make_nccl_communicators({0, 1});
  const std::int64_t n = 1 << 20;
  const std::int64_t latent_rows = 129, latent = 576;
  const std::size_t slice = std::size_t(latent_rows * latent);
  std::vector<std::vector<std::uint8_t>> results(2), gathered(2), gathered_in_place(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      cuda::check(cudaSetDevice(r), "cudaSetDevice");
      const std::vector<std::uint16_t> host = rank_values(n, r);
      DeviceBuffer buf(std::size_t(n) * 2);
      buf.upload(host.data());
      TestStream stream;
      group[std::size_t(r)]->all_reduce_sum(bf16_view(buf, {n}, r), stream.get());
      stream.sync();
      results[std::size_t(r)] = buf.download();

      const std::vector<std::uint8_t> mine = rank_bytes(slice, r);
      DeviceBuffer in(slice), out(2 * slice);
      in.upload(mine.data());
      group[std::size_t(r)]->all_gather(view_at(in, DType::kE4M3, {latent_rows, latent}, 0, r),
                                        view_at(out, DType::kE4M3, {2 * latent_rows, latent}, 0, r),
                                        stream.get());
      stream.sync();
      gathered[std::size_t(r)] = out.download();
      EXPECT_TRUE(out.guards_intact());
      out.fill(0);
      cuda::check(cudaMemcpy(static_cast<std::uint8_t*>(out.data()) + std::size_t(r) * slice,
                             mine.data(), slice, cudaMemcpyHostToDevice),
                  "cudaMemcpy");
      group[std::size_t(r)]->all_gather(
          view_at(out, DType::kE4M3, {latent_rows, latent}, std::size_t(r) * slice, r),
          view_at(out, DType::kE4M3, {2 * latent_rows, latent}, 0, r), stream.get());
      stream.sync();
      gathered_in_place[std::size_t(r)] = out.download();
    });
  }
  for (std::thread& t : ranks) t.join();
  const std::vector<std::uint16_t> a = rank_values(n, 0), b = rank_values(n, 1);
  std::vector<std::uint16_t> sum(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < sum.size(); ++i)
    sum[i] = encode_bf16(decode_bf16(a[i]) + decode_bf16(b[i]));
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(test::same_bytes(results[std::size_t(r)], bytes(sum), concat("rank ", r)));
  }
  std::vector<std::uint8_t> both = rank_bytes(slice, 0);
  const std::vector<std::uint8_t> second = rank_bytes(slice, 1);
  both.insert(both.end(), second.begin(), second.end());
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(test::same_bytes(gathered[std::size_t(r)], both, concat("rank ", r, " gathered")));
    EXPECT_TRUE(test::same_bytes(gathered_in_place[std::size_t(r)], both,
                                 concat("rank ", r, " gathered in place")));
  }
}

}  // namespace
}  // namespace fp8mla
