// The device path equals the software codec: every fp32 bit pattern through the hardware cvt
// conversions the kernels use, every 16-bit pattern through the f16x2 and decode paths, and the
// software codec compiled for the device against the same codec compiled for the host.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/common/convert.cuh"
#include "cuda/common/runtime.hpp"
#include "cuda_test_util.hpp"
#include "fp8mla/numerics.hpp"

namespace fp8mla {
namespace {

enum Check : int {
  kE4M3FromF32,
  kE5M2FromF32,
  kBf16FromF32,
  kF16FromF32,
  kE2M1FromF32,
  kE4M3FromF16x2,
  kE5M2FromF16x2,
  kF32FromF16,
  kF32FromE4M3,
  kF32FromE5M2,
  kNumChecks
};
const char* const kCheckNames[kNumChecks] = {"f32->e4m3 (cvt.rn.satfinite.e4m3x2.f32)",
                                             "f32->e5m2 (cvt.rn.satfinite.e5m2x2.f32)",
                                             "f32->bf16 (cvt.rn.bf16.f32)",
                                             "f32->f16 (cvt.rn.f16.f32)",
                                             "f16->e4m3 (cvt.rn.satfinite.e4m3x2.f16x2)",
                                             "f16->e5m2 (cvt.rn.satfinite.e5m2x2.f16x2)",
                                             "f16->f32 (cvt.f32.f16)",
                                             "e4m3->f32 (cvt.rn.f16x2.e4m3x2)",
                                             "e5m2->f32 (cvt.rn.f16x2.e5m2x2)"};

struct Mismatches {
  unsigned long long count[kNumChecks];
  unsigned int first_input[kNumChecks];
};

__device__ void expect_equal(Mismatches* m, int check, std::uint32_t input, std::uint32_t hw,
                             std::uint32_t sw) {
  if (hw == sw) return;
  atomicAdd(&m->count[check], 1ull);
  atomicMin(&m->first_input[check], input);
}

// Decoders widen to fp32; a NaN's payload never reaches storage (every encoder canonicalises it),
// so decoded NaNs are compared as a class.
__device__ void expect_same_f32(Mismatches* m, int check, std::uint32_t input, float hw, float sw) {
  if (isnan(hw) && isnan(sw)) return;
  expect_equal(m, check, input, float_bits(hw), float_bits(sw));
}

__global__ void every_f32_pattern(Mismatches* m) {
  const std::uint64_t stride = std::uint64_t(gridDim.x) * blockDim.x;
  for (std::uint64_t pair = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x;
       pair < (1ull << 31); pair += stride) {
    const std::uint32_t u0 = std::uint32_t(pair * 2), u1 = u0 + 1;
    const float x0 = float_from_bits(u0), x1 = float_from_bits(u1);
    const std::uint16_t e4m3 = cuda::cvt_e4m3x2(x0, x1);
    expect_equal(m, kE4M3FromF32, u0, e4m3 & 0xFF, encode_e4m3(x0));
    expect_equal(m, kE4M3FromF32, u1, e4m3 >> 8, encode_e4m3(x1));
    const std::uint16_t e5m2 = cuda::cvt_e5m2x2(x0, x1);
    expect_equal(m, kE5M2FromF32, u0, e5m2 & 0xFF, encode_e5m2(x0));
    expect_equal(m, kE5M2FromF32, u1, e5m2 >> 8, encode_e5m2(x1));
    expect_equal(m, kBf16FromF32, u0, cuda::cvt_bf16(x0), encode_bf16(x0));
    expect_equal(m, kBf16FromF32, u1, cuda::cvt_bf16(x1), encode_bf16(x1));
    expect_equal(m, kF16FromF32, u0, cuda::cvt_f16(x0), encode_f16(x0));
    expect_equal(m, kF16FromF32, u1, cuda::cvt_f16(x1), encode_f16(x1));
    expect_equal(m, kE2M1FromF32, u0, cuda::cvt_e2m1(x0), encode_e2m1(x0));
    expect_equal(m, kE2M1FromF32, u1, cuda::cvt_e2m1(x1), encode_e2m1(x1));
  }
}

__global__ void every_16bit_pattern(Mismatches* m) {
  const std::uint32_t h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h >= 0x10000) return;
  const float from_f16 = decode_f16(std::uint16_t(h));
  const std::uint32_t f16x2 = h | (h << 16);
  expect_equal(m, kE4M3FromF16x2, h, cuda::cvt_e4m3x2_from_f16x2(f16x2) & 0xFF,
               encode_e4m3(from_f16));
  expect_equal(m, kE5M2FromF16x2, h, cuda::cvt_e5m2x2_from_f16x2(f16x2) >> 8,
               encode_e5m2(from_f16));
  expect_same_f32(m, kF32FromF16, h, cuda::cvt_f16_to_f32(std::uint16_t(h)), from_f16);
  if (h < 0x100) {
    const std::uint16_t pair = std::uint16_t(h | (h << 8));
    expect_same_f32(m, kF32FromE4M3, h, cuda::cvt_e4m3x2_to_f32x2(pair).x,
                    decode_e4m3(std::uint8_t(h)));
    expect_same_f32(m, kF32FromE5M2, h, cuda::cvt_e5m2x2_to_f32x2(pair).y,
                    decode_e5m2(std::uint8_t(h)));
  }
}

// Pseudo-random fp32 patterns (a bijective hash of the index), covering every binade.
__host__ __device__ std::uint32_t sample_pattern(std::uint32_t i) {
  return i * 0x9E3779B1u;
}

// The software codec compiled for the device, for comparison with the host build.
__global__ void software_codec_on_device(std::uint32_t n, std::uint32_t* out) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = float_from_bits(sample_pattern(i));
  out[i] = encode_e4m3(x) | (encode_e5m2(x) << 8) | (encode_e2m1(x) << 16) |
           (std::uint32_t(encode_ue8m0(x)) << 24);
}

TEST(NumericsCuda, HardwareConversionsEqualSoftwareCodec) {
  FP8MLA_REQUIRE_HOPPER();
  test::DeviceBuffer d_m(sizeof(Mismatches));
  Mismatches init{};
  for (unsigned int& f : init.first_input) f = 0xFFFFFFFFu;
  d_m.upload(&init);
  const int sms = cuda::device_props(0).sm_count;
  every_f32_pattern<<<sms * 8, 256>>>(d_m.as<Mismatches>());
  cuda::check_launch("every_f32_pattern");
  every_16bit_pattern<<<256, 256>>>(d_m.as<Mismatches>());
  cuda::check_launch("every_16bit_pattern");
  const Mismatches got = d_m.download_as<Mismatches>()[0];
  for (int c = 0; c < kNumChecks; ++c) {
    EXPECT_EQ(got.count[c], 0ull) << kCheckNames[c] << ": first differing input 0x" << std::hex
                                  << got.first_input[c];
  }
}

TEST(NumericsCuda, DeviceSoftwareCodecEqualsHost) {
  FP8MLA_REQUIRE_HOPPER();
  constexpr std::uint32_t kN = 1u << 24;
  const test::DeviceBuffer d_out(kN * sizeof(std::uint32_t));
  software_codec_on_device<<<kN / 256, 256>>>(kN, d_out.as<std::uint32_t>());
  cuda::check_launch("software_codec_on_device");
  const std::vector<std::uint32_t> got = d_out.download_as<std::uint32_t>();
  std::uint32_t mismatches = 0;
  for (std::uint32_t i = 0; i < kN; ++i) {
    const float x = float_from_bits(sample_pattern(i));
    const std::uint32_t expected = encode_e4m3(x) | (encode_e5m2(x) << 8) | (encode_e2m1(x) << 16) |
                                   (std::uint32_t(encode_ue8m0(x)) << 24);
    if (got[i] != expected && ++mismatches <= 5) {
      ADD_FAILURE() << "fp32 0x" << std::hex << sample_pattern(i) << ": device 0x" << got[i]
                    << ", host 0x" << expected;
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

}  // namespace
}  // namespace fp8mla
