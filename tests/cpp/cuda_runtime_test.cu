// CUDA runtime helpers: device properties, errors as fp8mla::Error, the PDL launch helper, the
// tensor-map cache.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cuda/common/launch.cuh"
#include "cuda/common/runtime.hpp"
#include "cuda/common/tensor_map.hpp"
#include "cuda_test_util.hpp"
#include "fp8mla/error.hpp"

namespace fp8mla {
namespace {

__global__ void fill_kernel(std::uint32_t* out, std::uint32_t n, std::uint32_t seed) {
  cuda::pdl_wait();
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += gridDim.x * blockDim.x) {
    out[i] = i * 2654435761u + seed;
  }
  cuda::pdl_launch_dependents();
}

// Reads what the previous kernel wrote: correct only if pdl_wait() orders it after that kernel.
__global__ void add_kernel(const std::uint32_t* in, std::uint32_t* out, std::uint32_t n) {
  cuda::pdl_wait();
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += gridDim.x * blockDim.x) {
    out[i] = in[i] + 7u;
  }
  cuda::pdl_launch_dependents();
}

std::vector<std::uint32_t> run_chain(bool pdl) {
  constexpr std::uint32_t kN = 1u << 24;
  const test::DeviceBuffer a(kN * 4), b(kN * 4, 0xFF);  // b poisoned
  const cuda::LaunchConfig config{dim3(264), dim3(256), 0, nullptr, pdl};
  for (std::uint32_t round = 0; round < 4; ++round) {
    cuda::launch("fill_kernel", fill_kernel, config, a.as<std::uint32_t>(), kN, round);
    cuda::launch("add_kernel", add_kernel, config, a.as<const std::uint32_t>(),
                 b.as<std::uint32_t>(), kN);
  }
  std::vector<std::uint32_t> out = b.download_as<std::uint32_t>();
  return out;
}

TEST(CudaRuntime, DevicePropertiesAreCached) {
  FP8MLA_REQUIRE_HOPPER();
  const cuda::DeviceProps& props = cuda::device_props(0);
  EXPECT_GE(props.arch, 90);
  EXPECT_GT(props.sm_count, 0);
  EXPECT_GT(props.l2_bytes, 0);
  EXPECT_GE(props.max_shared_memory_per_block_optin, 227 * 1024);
  EXPECT_EQ(&props, &cuda::device_props(0));
  EXPECT_EQ(&props, &cuda::current_device_props());
}

TEST(CudaRuntime, BadOrdinalIsAnError) {
  FP8MLA_REQUIRE_HOPPER();
  try {
    cuda::device_props(1000);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kOutOfRange);
    EXPECT_NE(e.message().find("got 1000"), std::string::npos) << e.message();
  }
}

TEST(CudaRuntime, LaunchErrorBecomesFp8mlaError) {
  FP8MLA_REQUIRE_HOPPER();
  const test::DeviceBuffer a(4);
  const cuda::LaunchConfig too_many_threads{dim3(1), dim3(4096), 0, nullptr, false};
  try {
    cuda::launch("fill_kernel", fill_kernel, too_many_threads, a.as<std::uint32_t>(), 1u, 0u);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kCuda);
    EXPECT_NE(e.message().find("fill_kernel"), std::string::npos) << e.message();
  }
  cudaGetLastError();
}

TEST(CudaRuntime, PdlLaunchIsBitIdenticalToPlainLaunch) {
  FP8MLA_REQUIRE_HOPPER();
  const std::vector<std::uint32_t> plain = run_chain(false);
  const std::vector<std::uint32_t> pdl = run_chain(true);
  ASSERT_EQ(plain.size(), pdl.size());
  for (std::uint32_t i = 0; i < plain.size(); ++i) {
    ASSERT_EQ(plain[i], i * 2654435761u + 3u + 7u) << i;
    ASSERT_EQ(pdl[i], plain[i]) << i;
  }
}

struct ThreeWords {
  std::uint32_t a, b, c;
};

// Stores what it was given, so that a test sees each argument as the kernel received it.
__global__ void store_arguments(std::int64_t* out, std::int64_t wide, double real, const float f,
                                ThreeWords words, unsigned char byte) {
  out[0] = wide;
  out[1] = std::int64_t(real * 4.0);
  out[2] = std::int64_t(f * 8.0f);
  out[3] = std::int64_t(words.a) + 10 * std::int64_t(words.b) + 100 * std::int64_t(words.c);
  out[4] = byte;
}

// Arguments reach the kernel converted to its parameter types as a call converts them (an int to
// int64_t and to double, a double to a const float, a struct by value).
TEST(CudaRuntime, LaunchConvertsArgumentsAsACallDoes) {
  FP8MLA_REQUIRE_HOPPER();
  const test::DeviceBuffer out(5 * 8, 0xFF);
  const int negative = -3;
  cuda::launch("store_arguments", store_arguments, {dim3(1), dim3(1), 0, nullptr, true},
               out.as<std::int64_t>(), negative, 5, 0.375, ThreeWords{1, 2, 3},
               static_cast<unsigned char>(250));
  const std::vector<std::int64_t> got = out.download_as<std::int64_t>();
  EXPECT_EQ(got, (std::vector<std::int64_t>{-3, 20, 3, 321, 250}));
}

// Threads of their own (each starts without a current context, and each keeps its own cache of
// kernel handles) launch correctly, many times each.
TEST(CudaRuntime, LaunchFromFreshThreads) {
  FP8MLA_REQUIRE_HOPPER();
  constexpr std::uint32_t kN = 1u << 12;
  constexpr int kThreads = 6;
  std::vector<std::unique_ptr<test::DeviceBuffer>> buffers;
  for (int t = 0; t < kThreads; ++t)
    buffers.push_back(std::make_unique<test::DeviceBuffer>(kN * 4));
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        const cuda::LaunchConfig config{dim3(4), dim3(128), 0, nullptr, t % 2 == 0};
        for (std::uint32_t round = 0; round < 50; ++round) {
          cuda::launch("fill_kernel", fill_kernel, config, buffers[t]->as<std::uint32_t>(), kN,
                       std::uint32_t(t) * 1000u + round);
        }
        cuda::check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
      } catch (const Error& e) {
        errors[t] = e.message();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(errors[t], "") << "thread " << t;
    const std::vector<std::uint32_t> got = buffers[t]->download_as<std::uint32_t>();
    for (std::uint32_t i = 0; i < kN; ++i) {
      ASSERT_EQ(got[i], i * 2654435761u + std::uint32_t(t) * 1000u + 49u) << t << " " << i;
    }
  }
}

// cudaDeviceReset destroys the primary context whose kernel handles the launch caches; the next
// call makes a new one (often at the same address, where a cached handle would be stale). A
// launch after it still runs the kernel, on the first try and after.
TEST(CudaRuntime, LaunchAfterTheContextIsRecreated) {
  FP8MLA_REQUIRE_HOPPER();
  constexpr std::uint32_t kN = 1u << 12;
  const cuda::LaunchConfig config{dim3(4), dim3(128), 0, nullptr, true};
  for (int life = 0; life < 3; ++life) {
    {
      const test::DeviceBuffer out(kN * 4);
      for (std::uint32_t round = 0; round < 3; ++round) {
        cuda::launch("fill_kernel", fill_kernel, config, out.as<std::uint32_t>(), kN,
                     std::uint32_t(life) * 100u + round);
      }
      const std::vector<std::uint32_t> got = out.download_as<std::uint32_t>();
      for (std::uint32_t i = 0; i < kN; ++i) {
        ASSERT_EQ(got[i], i * 2654435761u + std::uint32_t(life) * 100u + 2u) << life << " " << i;
      }
    }
    cuda::check(cudaDeviceReset(), "cudaDeviceReset");
  }
}

bool same_bytes(const CUtensorMap& a, const CUtensorMap& b) {
  return std::memcmp(&a, &b, sizeof(CUtensorMap)) == 0;
}

// Far more specs than the cache has slots, differing in one field at a time (base, a dim, a
// stride, the box, the swizzle), walked three times: every map the cache serves, hit or miss,
// is the driver's encoding of that very spec.
TEST(CudaRuntime, CachedTensorMapsAreTheDriversEncoding) {
  FP8MLA_REQUIRE_HOPPER();
  const test::DeviceBuffer buffer(std::size_t(1) << 22);
  std::vector<cuda::TensorMapSpec> specs;
  for (int i = 0; i < 400; ++i) {
    cuda::TensorMapSpec spec;
    spec.base = buffer.as<std::uint8_t>() + 128 * (i % 7);
    spec.element_bytes = i % 5 == 0 ? 2 : 1;
    spec.dims[0] = 128;
    spec.dims[1] = 64 + std::uint64_t(i / 7 % 9);
    spec.dims[2] = 1 + std::uint64_t(i % 3);
    spec.strides_bytes[0] = 256 * (1 + std::uint64_t(i % 2));
    spec.strides_bytes[1] = spec.strides_bytes[0] * 80;
    spec.box[0] = 64 / spec.element_bytes;
    spec.box[1] = i % 11 < 6 ? 64 : 32;
    spec.box[2] = 1;
    spec.swizzle_bytes = i % 13 < 9 ? 128 : 64;
    specs.push_back(spec);
  }
  int distinct = 0;
  for (int pass = 0; pass < 3; ++pass) {
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const CUtensorMap cached = cuda::make_tensor_map(specs[i], "cache test");
      const CUtensorMap encoded = cuda::encode_tensor_map(specs[i], "cache test");
      ASSERT_TRUE(same_bytes(cached, encoded)) << "spec " << i << ", pass " << pass;
      if (pass == 0 && i > 0) {
        distinct += !same_bytes(encoded, cuda::encode_tensor_map(specs[i - 1], "cache test"));
      }
    }
  }
  // The specs do differ where it counts: neighbours encode differently.
  EXPECT_GT(distinct, 350);
}

TEST(CudaRuntime, RejectedTensorMapIsAnErrorAndNotCached) {
  FP8MLA_REQUIRE_HOPPER();
  const test::DeviceBuffer buffer(1 << 16);
  cuda::TensorMapSpec spec;
  spec.base = buffer.as<std::uint8_t>();
  spec.dims[0] = 128;
  spec.dims[1] = 16;
  spec.dims[2] = 1;
  spec.strides_bytes[0] = 100;  // not a multiple of 16
  spec.strides_bytes[1] = 1600;
  spec.box[0] = 64;
  spec.box[1] = 16;
  spec.box[2] = 1;
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      cuda::make_tensor_map(spec, "bad map");
      FAIL() << "expected an error, attempt " << attempt;
    } catch (const Error& e) {
      EXPECT_EQ(e.category(), ErrorCategory::kInvalidArgument);
      EXPECT_NE(e.message().find("bad map"), std::string::npos) << e.message();
    }
  }
}

}  // namespace
}  // namespace fp8mla
