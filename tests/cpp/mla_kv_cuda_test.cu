// The CUDA latent-cache kernels equal the CPU ops bit for bit: each case runs on the CPU and on
// the GPU from identical buffers (outputs poisoned, the cache filled with random bytes, guard bands
// around every device buffer) and every byte of every buffer must match (mla_v_quantize_fp8 too).
// Also: bad slots on the GPU (flag set, nothing written out of bounds, gather rows zeroed), PDL
// on/off, and a cache of more than 2^31 bytes (64-bit addressing).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <span>
#include <vector>

#include "buffer_test_util.hpp"
#include "cuda/common/runtime.hpp"
#include "cuda_test_util.hpp"
#include "error_test_util.hpp"
#include "fp8mla/mla_prep.hpp"
#include "mla_kv_test_util.hpp"

namespace fp8mla {
namespace {

using test::Data;
using test::DeviceBuffer;
using test::HostBuffer;
using test::KvGatherCase;
using test::KvPackCase;
using test::KvWriteCase;

using test::device_bases;
using test::PdlScope;
using test::upload;

void run_gpu(const auto& c, const std::vector<DeviceBuffer>& device) {
  cudaStream_t stream;
  cuda::check(cudaStreamCreate(&stream), "cudaStreamCreate");
  c.run(device_bases(device), Device::cuda(0), stream);
  cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  cudaStreamDestroy(stream);
}

// `host` copied into fresh guarded device buffers and `c` run on them.
std::vector<DeviceBuffer> run_gpu_on(const auto& c, const std::vector<HostBuffer>& host) {
  std::vector<DeviceBuffer> device = upload(host);
  run_gpu(c, device);
  return device;
}

void expect_same_buffers(const std::vector<DeviceBuffer>& device,
                         const std::vector<HostBuffer>& host) {
  for (std::size_t i = 0; i < host.size(); ++i) {
    EXPECT_TRUE(test::same_bytes(device[i].download(), host[i].payload(), concat("buffer ", i)));
    EXPECT_TRUE(device[i].guards_intact()) << "buffer " << i;
  }
}

// CPU and GPU from identical buffers; every byte equal, with PDL on and off.
template <typename Case>
void expect_cuda_equals_cpu(const Case& c) {
  SCOPED_TRACE(c.describe());
  std::vector<HostBuffer> host = test::host_buffers(c);
  const std::vector<HostBuffer> initial = test::host_buffers(c);
  test::run_cpu(c, host);
  for (bool pdl : {true, false}) {
    SCOPED_TRACE(pdl ? "PDL on" : "PDL off");
    const PdlScope scope(pdl);
    expect_same_buffers(run_gpu_on(c, initial), host);
  }
}

std::int32_t flag_of(const DeviceBuffer& b) {
  std::int32_t flag;
  const std::vector<std::uint8_t> bytes = b.download(0, 4);
  std::memcpy(&flag, bytes.data(), 4);
  return flag;
}

// A run over bad slots: the error flag (buffer 4) set and no guard hit.
void expect_flag_set(const std::vector<DeviceBuffer>& device) {
  EXPECT_EQ(flag_of(device[4]), 1);
  for (const DeviceBuffer& d : device) EXPECT_TRUE(d.guards_intact());
}

// The cache sweep of one op (make: write_sweep_case or gather_sweep_case, given `pages`) on the
// CPU and the GPU; every other case also asks for the error flag.
template <typename Case>
void expect_sweep_equals_cpu(Case (*make)(std::int64_t, std::int64_t, int, std::uint64_t,
                                          std::int64_t),
                             std::initializer_list<std::int64_t> token_counts, int layouts,
                             std::uint64_t first_seed, std::int64_t pages) {
  test::for_each_cache_layout(
      token_counts, layouts, first_seed,
      [&](std::int64_t page_size, std::int64_t tokens, int layout, std::uint64_t seed) {
        Case c = make(page_size, tokens, layout, seed, pages);
        c.with_flag = seed % 2 == 0;
        expect_cuda_equals_cpu(c);
      });
}

TEST(MlaKvCuda, WriteMatchesCpu) {
  FP8MLA_REQUIRE_HOPPER();
  expect_sweep_equals_cpu(test::write_sweep_case, {0, 1, 3, 5, 7, 64, 1000}, 4, 0, 2);
}

TEST(MlaKvCuda, GatherMatchesCpu) {
  FP8MLA_REQUIRE_HOPPER();
  expect_sweep_equals_cpu(test::gather_sweep_case, {0, 1, 3, 7, 65, 3000}, 3, 100, 5);
}

TEST(MlaKvCuda, PackMatchesCpuForEveryTokenCount) {
  FP8MLA_REQUIRE_HOPPER();
  for (std::int64_t n = 0; n <= 64; ++n) {
    for (std::int64_t heads : {1, 16, 128}) {
      KvPackCase c = test::pack_sweep_case(n, heads, std::uint64_t(n * 1000 + heads));
      c.in_pad = n % 7 == 0 ? 3 : 8;  // 3: scalar path
      c.k_pe_3d = n % 4 == 1;
      c.out_pad = n % 5 == 0 ? 16 : n % 5 == 1 ? 1 : 0;
      c.k_scale_inv = 0.5f;
      c.split_k = n % 3 == 1;
      expect_cuda_equals_cpu(c);
      c.v_transposed = true;  // the layout FP8 attention reads; odd pitches take the byte stores
      c.v_pitch_pad = n % 3 == 0 ? 16 - n % 16 : n % 3;
      expect_cuda_equals_cpu(c);
    }
  }
}

TEST(MlaKvCuda, PackMatchesCpuLarge) {
  FP8MLA_REQUIRE_HOPPER();
  for (std::int64_t heads : {1, 16, 128}) {
    for (std::int64_t n : {4097, 16384}) {
      KvPackCase c;
      c.tokens = n;
      c.heads = heads;
      c.data = Data::kAdversarial;
      c.seed = std::uint64_t(n + heads);
      expect_cuda_equals_cpu(c);
      if (heads > 16) continue;  // the CPU side of H = 128 takes most of a minute
      // V transposed: 33 to 2048 tiles of 128 tokens (H = 16 x 16384: the pack and the tiles in
      // two launches), then an odd pitch (64-token tiles: 4096 of them at H = 16 x 16384).
      c.v_transposed = true;
      c.v_pitch_pad = 16 - n % 16;
      expect_cuda_equals_cpu(c);
      c.v_pitch_pad += 1;
      expect_cuda_equals_cpu(c);
    }
  }
}

// mla_v_quantize_fp8 (V alone) in both layouts: GPU equals CPU byte for byte (k_out, allocated
// but not an argument, stays poisoned on both; the transposed pitch's padding stays poisoned),
// vector and scalar paths, odd pitches, PDL on and off.
TEST(MlaKvCuda, VQuantizeMatchesCpu) {
  FP8MLA_REQUIRE_HOPPER();
  std::uint64_t seed = 2000;
  for (bool transposed : {false, true}) {
    for (std::int64_t n : {1, 63, 64, 65, 4097}) {
      for (std::int64_t heads : {1, 16, 128}) {
        if (heads == 128 && n > 1000) continue;  // the CPU side would take most of the time
        for (int layout = 0; layout < 3; ++layout) {
          ++seed;
          KvPackCase c;
          c.v_only = true;
          c.dtype = seed % 2 ? DType::kF16 : DType::kBF16;
          c.tokens = n;
          c.heads = heads;
          c.fused = layout != 2;                      // v a slice of [n, H, 256], or its own rows
          c.in_pad = layout == 2 ? 3 : 8;             // 3: unaligned rows, the scalar path
          c.out_pad = layout == 1 ? 1 : 16 * layout;  // 1: scalar stores
          c.v_transposed = transposed;
          c.v_pitch_pad = layout == 0 ? 16 - n % 16 : layout == 1 ? 1 : 3;  // odd pitches: bytes
          c.v_scale_inv = layout == 1 ? 300.0f : 3.0f;
          c.data = layout == 1 ? Data::kAdversarial : Data::kRandom;
          c.seed = seed;
          expect_cuda_equals_cpu(c);
        }
      }
    }
  }
}

// V alone on the GPU writes what the full pack writes on the GPU.
TEST(MlaKvCuda, VQuantizeEqualsPackV) {
  FP8MLA_REQUIRE_HOPPER();
  for (bool transposed : {false, true}) {
    KvPackCase c{.tokens = 777,
                 .heads = 16,
                 .v_transposed = transposed,
                 .v_pitch_pad = 7,
                 .v_scale_inv = 2.0f,
                 .data = Data::kAdversarial,
                 .seed = 4242,
                 .v_only = true};
    SCOPED_TRACE(c.describe());
    const std::vector<HostBuffer> initial = test::host_buffers(c);
    const std::vector<DeviceBuffer> alone = run_gpu_on(c, initial);
    c.v_only = false;
    const std::vector<DeviceBuffer> packed = run_gpu_on(c, initial);
    EXPECT_TRUE(test::same_bytes(alone[4].download(), packed[4].download(), "v_out"));
    EXPECT_TRUE(test::same_bytes(alone[3].download(), initial[3].payload(), "k_out (untouched)"));
    for (const DeviceBuffer& d : alone) EXPECT_TRUE(d.guards_intact());
  }
}

// Out-of-range slots on the GPU: the write skips them and sets the flag; nothing outside the
// cache is touched (guards); the other rows are as the CPU writes them without the bad tokens.
TEST(MlaKvCuda, WriteBadSlotsSetFlag) {
  FP8MLA_REQUIRE_HOPPER();
  for (int layout = 0; layout < 2; ++layout) {
    KvWriteCase c;
    c.tokens = 40;
    c.cache = {3, 16, 0, layout ? 3 : 0};
    c.skip_every = 5;
    c.bad = {0, 7, 39};
    c.seed = 17 + layout;
    SCOPED_TRACE(c.describe());
    const std::vector<HostBuffer> host = test::host_buffers(c);
    const std::vector<DeviceBuffer> device = run_gpu_on(c, host);
    EXPECT_TRUE(test::same_bytes(device[3].download(), c.expected_cache(host), "cache"));
    expect_flag_set(device);
  }
}

TEST(MlaKvCuda, GatherBadSlotsWriteZerosAndSetFlag) {
  FP8MLA_REQUIRE_HOPPER();
  for (int layout = 0; layout < 2; ++layout) {
    KvGatherCase c;
    c.tokens = 50;
    c.cache = {2, 32, 0, 0};
    c.kv_pad = layout ? 3 : 0;
    c.bad = {0, 1, 25, 49};
    // Outputs start poisoned; a huge scale turns any stale non-zero byte scaled into inf, so the
    // zeros must be written.
    c.scale = std::numeric_limits<float>::max();
    c.seed = 31 + layout;
    SCOPED_TRACE(c.describe());
    const std::vector<HostBuffer> host = test::host_buffers(c);
    const auto want = c.expected_outputs(host);
    const std::vector<DeviceBuffer> device = run_gpu_on(c, host);
    EXPECT_TRUE(test::same_bytes(device[2].download(), want[0], "kv_c_out"));
    EXPECT_TRUE(test::same_bytes(device[3].download(), want[1], "k_pe_out"));
    expect_flag_set(device);
  }
}

// A cache of more than 2^31 bytes, written and gathered at slots near its end.
TEST(MlaKvCuda, CacheBeyond2GiB) {
  FP8MLA_REQUIRE_HOPPER();
  const std::int64_t page_size = 64;
  const std::int64_t num_pages = ((std::int64_t(1) << 31) / (page_size * 576)) + 64;
  const std::int64_t capacity = num_pages * page_size;
  ASSERT_GT(num_pages * page_size * 576, std::int64_t(1) << 31);
  KvWriteCase w;
  w.tokens = 6;
  w.cache = {num_pages, page_size, 0, 0};
  w.explicit_slots = {capacity - 1, capacity - 64, 5, capacity - 65, -1, capacity - 2000};
  w.scale_inv = 2.0f;
  w.seed = 3;
  std::vector<HostBuffer> host = test::host_buffers(w);  // 2.1 GB of host memory
  std::vector<DeviceBuffer> device = run_gpu_on(w, host);
  test::run_cpu(w, host);
  for (std::int64_t slot : w.explicit_slots) {
    if (slot < 0) continue;
    const std::size_t at = std::size_t(w.cache.row_offset(slot));
    EXPECT_TRUE(test::same_bytes(device[3].download(at, 576), std::span(host[3].data() + at, 576),
                                 concat("slot ", slot)));
  }
  EXPECT_TRUE(device[3].guards_intact());

  KvGatherCase g;
  g.tokens = 5;
  g.cache = w.cache;
  g.explicit_slots = {capacity - 1, capacity - 64, 5, capacity - 65, capacity - 2000};
  g.scale = 0.5f;
  // The gather reads the cache the write left (on both sides); its other buffers are fresh.
  std::vector<HostBuffer> gh;
  for (const test::Spec& s : g.specs()) gh.emplace_back(gh.empty() ? 0 : s.bytes());
  g.init(gh);
  gh[0] = std::move(host[3]);
  std::vector<DeviceBuffer> gd;
  gd.push_back(std::move(device[3]));
  for (std::size_t i = 1; i < gh.size(); ++i) {
    gd.emplace_back(gh[i].bytes());
    gd.back().upload(gh[i].data());
  }
  run_gpu(g, gd);
  test::run_cpu(g, gh);
  EXPECT_TRUE(test::same_bytes(gd[2].download(), gh[2].payload(), "kv_c_out"));
  EXPECT_TRUE(test::same_bytes(gd[3].download(), gh[3].payload(), "k_pe_out"));
  EXPECT_EQ(flag_of(gd[4]), 0);
  for (const DeviceBuffer& d : gd) EXPECT_TRUE(d.guards_intact());
}

// One block per transposed-V tile (128 tokens of one head), the grid at most 2^31 - 1 blocks:
// more is a clear error before any launch (the views only describe memory; nothing is read).
// 2^20 heads of 2^18 tokens make 2^31 tiles.
TEST(MlaKvCuda, TransposedVTileLimit) {
  FP8MLA_REQUIRE_HOPPER();
  const std::int64_t heads = std::int64_t(1) << 20, n = std::int64_t(1) << 18;
  // Never dereferenced: the call is rejected first. The two views lie apart, so that the check
  // that fires is the tile limit, not the overlap of an output with its input.
  void* const fake_v = reinterpret_cast<void*>(std::uintptr_t{0x10000});
  void* const fake_out = reinterpret_cast<void*>(std::uintptr_t{1} << 47);
  const TensorView v(fake_v, DType::kBF16, {n, heads, kMlaVDim}, Device::cuda(0));
  const TensorView v_out(fake_out, DType::kE4M3, {n, heads, kMlaVDim}, {1, kMlaVDim * n, n},
                         Device::cuda(0));
  test::expect_error(
      [&] { mla_v_quantize_fp8(v, v_out, 1.0f, VLayout::kTransposed); },
      ErrorCategory::kUnsupported,
      {"mla_v_quantize_fp8: at most 2147483647 transposed-V tiles (heads x tokens / 128)",
       "got 2147483648"});
}
}  // namespace
}  // namespace fp8mla
