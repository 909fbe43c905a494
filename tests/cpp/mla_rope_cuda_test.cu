// The CUDA mla_rope_quantize_fp8 kernel equals the CPU op bit for bit: each case runs on the CPU
// and on the GPU from identical buffers (outputs and cache poisoned, guard bands around every
// device buffer) and every byte of every buffer must match. Also: adversarial values, bad
// positions and slots (error_flag set, zero rows, no stray write), PDL on/off, and
// make_cos_sin_cache into device memory.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "buffer_test_util.hpp"
#include "cuda/common/runtime.hpp"
#include "cuda_test_util.hpp"
#include "fp8mla/mla_prep.hpp"
#include "mla_rope_test_util.hpp"

namespace fp8mla {
namespace {

using test::Data;
using test::DeviceBuffer;
using test::HostBuffer;
using test::RopeCase;

using test::device_bases;
using test::PdlScope;
using test::upload;

// Runs the case on the GPU (on a fresh stream) from the initial buffers `initial`.
std::vector<DeviceBuffer> run_cuda(const RopeCase& c, const std::vector<HostBuffer>& initial) {
  std::vector<DeviceBuffer> device = upload(initial);
  cudaStream_t stream = nullptr;
  cuda::check(cudaStreamCreate(&stream), "cudaStreamCreate");
  c.run(device_bases(device), Device::cuda(0), stream);
  cuda::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  cudaStreamDestroy(stream);
  return device;
}

void expect_same(const std::vector<DeviceBuffer>& device, const std::vector<HostBuffer>& host) {
  for (std::size_t i = 0; i < host.size(); ++i) {
    EXPECT_TRUE(test::same_bytes(device[i].download(), host[i].payload(), concat("buffer ", i)));
    EXPECT_TRUE(device[i].guards_intact()) << "buffer " << i;
  }
}

std::vector<HostBuffer> initial_buffers(const RopeCase& c) {
  std::vector<HostBuffer> b = c.buffers();
  c.init(b);
  return b;
}

void expect_cuda_equals_cpu(const RopeCase& c) {
  SCOPED_TRACE(c.describe());
  std::vector<HostBuffer> host = initial_buffers(c);
  const std::vector<DeviceBuffer> device = run_cuda(c, host);
  c.run(test::host_bases(host), Device::cpu());
  expect_same(device, host);
}

TEST(MlaRopeCuda, MatrixEqualsCpu) {
  FP8MLA_REQUIRE_HOPPER();
  for (const RopeCase& c : test::rope_matrix(Data::kRandom)) expect_cuda_equals_cpu(c);
}

TEST(MlaRopeCuda, AdversarialEqualsCpu) {
  FP8MLA_REQUIRE_HOPPER();
  for (const RopeCase& c : test::rope_matrix(Data::kAdversarial)) expect_cuda_equals_cpu(c);
}

TEST(MlaRopeCuda, EveryTokenCountEqualsCpu) {
  FP8MLA_REQUIRE_HOPPER();
  for (std::int64_t n = 0; n <= 64; ++n) {
    for (bool misaligned : {false, true}) {
      RopeCase c;
      c.tokens = n;
      c.heads = n % 2 ? 33 : 3;  // 33: a second head group of one head
      c.strided = n % 2 == 1;
      c.misaligned = misaligned;
      c.style = n % 3 == 0 ? RopeStyle::kNeox : RopeStyle::kInterleaved;
      c.in_dtype = n % 4 < 2 ? DType::kBF16 : DType::kF16;
      c.page_size = 16;
      c.data = n % 2 ? Data::kAdversarial : Data::kRandom;
      c.seed = std::uint64_t(n) + 100;
      expect_cuda_equals_cpu(c);
    }
  }
}

TEST(MlaRopeCuda, PdlOnOffIdentical) {
  FP8MLA_REQUIRE_HOPPER();
  RopeCase c;
  c.tokens = 1000;
  c.heads = 128;
  c.page_size = 64;
  c.data = Data::kAdversarial;
  const std::vector<HostBuffer> host = initial_buffers(c);
  std::vector<std::vector<std::uint8_t>> results[2];
  for (bool pdl : {false, true}) {
    const PdlScope scope(pdl);
    const std::vector<DeviceBuffer> device = run_cuda(c, host);
    for (const DeviceBuffer& d : device) results[pdl].push_back(d.download());
  }
  for (std::size_t i = 0; i < results[0].size(); ++i) {
    EXPECT_TRUE(
        test::same_bytes(results[1][i], results[0][i], concat("PDL on vs off, buffer ", i)));
  }
}

// A bad position: that token's q_out/k_out rows are zeros, its cache row is skipped and the error
// flag is set; a bad slot: the cache row is skipped and the flag set. Nothing else changes.
TEST(MlaRopeCuda, BadPositionAndSlot) {
  FP8MLA_REQUIRE_HOPPER();
  for (bool misaligned : {false, true}) {
    for (int what = 0; what < 4; ++what) {
      RopeCase c;
      c.tokens = 17;
      c.heads = 40;
      c.page_size = 16;
      c.misaligned = misaligned;
      c.position_dtype = what % 2 ? DType::kI32 : DType::kI64;
      c.split_k = what % 2 == 1;  // 40 heads: two head groups, the first writes k_rope_out
      c.no_k_nope = what < 2 && misaligned;  // bad positions: only K's RoPE part to zero
      SCOPED_TRACE(c.describe() + concat(", bad kind ", what));
      std::vector<HostBuffer> host = initial_buffers(c);
      const std::int64_t t = 6;  // t % 5 != 4: has a slot
      std::vector<std::int64_t> bad_positions;
      if (what < 2) {
        RopeCase::store_index(host[test::kPositions].data(), c.position_dtype, t,
                              what == 0 ? -5 : c.max_pos);
        bad_positions.push_back(t);
      } else {
        RopeCase::store_index(host[test::kSlots].data(), c.slot_dtype, t,
                              what == 2 ? -2 : c.num_pages() * c.page_size);
      }
      const std::vector<DeviceBuffer> device = run_cuda(c, host);
      // Expected: the reference with the bad token's cache row skipped.
      std::vector<HostBuffer> want = c.buffers();
      for (std::size_t i = 0; i < host.size(); ++i) {
        std::memcpy(want[i].data(), host[i].data(), host[i].bytes());
      }
      if (what < 2) RopeCase::store_index(want[test::kPositions].data(), c.position_dtype, t, 0);
      RopeCase::store_index(want[test::kSlots].data(), c.slot_dtype, t, -1);
      test::reference_outputs(c, want, bad_positions);
      std::memcpy(want[test::kPositions].data(), host[test::kPositions].data(),
                  host[test::kPositions].bytes());
      std::memcpy(want[test::kSlots].data(), host[test::kSlots].data(), host[test::kSlots].bytes());
      const std::int32_t one = 1;
      std::memcpy(want[test::kErrorFlag].data(), &one, 4);
      expect_same(device, want);
    }
  }
}

TEST(MlaRopeCuda, CosSinCacheOnDevice) {
  FP8MLA_REQUIRE_HOPPER();
  for (bool yarn : {false, true}) {
    RopeConfig config;
    if (yarn) config.yarn = YarnScaling{};
    const std::int64_t rows = 5000, stride = 68;
    HostBuffer host(std::size_t(rows * stride * 4));
    DeviceBuffer device(std::size_t(rows * stride * 4));
    make_cos_sin_cache(TensorView(host.data(), DType::kF32, {rows, 64}, {stride, 1}), config);
    make_cos_sin_cache(
        TensorView(device.data(), DType::kF32, {rows, 64}, {stride, 1}, Device::cuda(0)), config);
    EXPECT_TRUE(test::same_bytes(device.download(), host.payload(), "cos_sin"));
    EXPECT_TRUE(device.guards_intact());
  }
}

}  // namespace
}  // namespace fp8mla
