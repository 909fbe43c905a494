// CUDA merge_attention_states against the CPU op on identical buffers: within a few ulp on o (a
// bf16 ulp for bf16) and 1e-6 + 2^-21 relative on lse (expf/logf against std::exp/std::log),
// exactly on empty and one-sided rows, identical bytes outside the written views, guard bytes,
// the in-place forms, the scalar fallback and PDL on/off.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/common/runtime.hpp"
#include "cuda_test_util.hpp"
#include "merge_states_test_util.hpp"

namespace fp8mla {
namespace {

using test::DeviceBuffer;
using test::HostBuffer;
using test::MergeCase;

// Runs `c` on the GPU from buffers equal to `host` (before its CPU run); returns the payloads.
std::vector<std::vector<std::uint8_t>> run_cuda(const MergeCase& c,
                                                const std::vector<HostBuffer>& inputs) {
  const std::vector<DeviceBuffer> device = test::upload(inputs);
  c.run(test::device_bases(device), Device::cuda(0), nullptr);
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<std::vector<std::uint8_t>> out;
  for (const DeviceBuffer& d : device) {
    EXPECT_TRUE(d.guards_intact());
    out.push_back(d.download());
  }
  return out;
}

// CPU and CUDA outputs of one case: both against the float64 reference, then each other.
void expect_cuda_matches_cpu(const MergeCase& c) {
  SCOPED_TRACE(c.describe());
  const std::vector<HostBuffer> before = test::host_buffers(c);
  std::vector<HostBuffer> cpu = test::host_buffers(c);
  const std::vector<void*> cpu_bases = test::host_bases(cpu);
  const test::MergeRef ref = test::merge_reference(c, cpu_bases);
  c.run(cpu_bases, Device::cpu());
  const std::vector<std::vector<std::uint8_t>> gpu = run_cuda(c, before);

  // The GPU payloads viewed through host copies with the same geometry.
  std::vector<HostBuffer> gpu_host = test::host_buffers(c);
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    std::memcpy(gpu_host[i].data(), gpu[i].data(), gpu[i].size());
  }
  const std::vector<void*> gpu_bases = test::host_bases(gpu_host);
  test::expect_matches_reference(c, gpu_bases, ref);
  test::expect_rest_unchanged(c, before, gpu, gpu_bases);

  test::expect_near_cpu(c, ref, cpu_bases, gpu_bases);
}

TEST(MergeStatesCuda, MatchesCpu) {
  FP8MLA_REQUIRE_HOPPER();
  test::for_each_sweep_case(std::numeric_limits<std::int64_t>::max(),
                            [](const MergeCase& c) { expect_cuda_matches_cpu(c); });
}

TEST(MergeStatesCuda, EmptyRowsScalarFallbackOddDims) {
  FP8MLA_REQUIRE_HOPPER();
  std::uint64_t seed = 100;
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (std::int64_t d : {1, 3, 64, 72, 128, 512}) {
      for (bool misalign : {false, true}) {
        for (int empty : {0, 50, 100}) {
          MergeCase c;
          c.dtype = dtype;
          c.tokens = 33;
          c.heads = 5;
          c.dim = d;
          c.misalign = misalign;
          c.empty_a_percent = empty;
          c.empty_b_percent = 100 - empty / 2;
          c.seed = seed++;
          expect_cuda_matches_cpu(c);
        }
      }
    }
  }
}

TEST(MergeStatesCuda, PositiveInfinityIsAnEmptyState) {
  FP8MLA_REQUIRE_HOPPER();
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (int empty : {30, 100}) {
      MergeCase c;
      c.dtype = dtype;
      c.empty_as_pos_inf = true;
      c.empty_a_percent = empty;
      c.empty_b_percent = 40;
      expect_cuda_matches_cpu(c);
    }
  }
}

TEST(MergeStatesCuda, PdlOnOffIdenticalBytes) {
  FP8MLA_REQUIRE_HOPPER();
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (auto form : {MergeCase::Form::kGeneral, MergeCase::Form::kInplace}) {
      MergeCase c;
      c.dtype = dtype;
      c.tokens = 1000;
      c.heads = 16;
      c.form = form;
      SCOPED_TRACE(c.describe());
      const std::vector<HostBuffer> inputs = test::host_buffers(c);
      std::vector<std::vector<std::uint8_t>> on, off;
      {
        const test::PdlScope pdl(true);
        on = run_cuda(c, inputs);
      }
      {
        const test::PdlScope pdl(false);
        off = run_cuda(c, inputs);
      }
      for (std::size_t i = 0; i < on.size(); ++i) {
        EXPECT_TRUE(test::same_bytes(on[i], off[i], concat("buffer ", i)));
      }
    }
  }
}

}  // namespace
}  // namespace fp8mla
