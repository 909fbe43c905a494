// The CUDA quantization kernels equal the CPU ops bit for bit: each case runs on the CPU and on the
// GPU from identical buffers (outputs poisoned, guard bands around every device buffer) and every
// byte of every buffer must match afterwards. Also: determinism over repeated runs, PDL on/off
// (including kernels that read what the previous op on the stream wrote), and inputs of more
// than 2^31 elements.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "cuda/common/runtime.hpp"
#include "cuda_test_util.hpp"
#include "fp8mla/quantize.hpp"
#include "quantize_test_util.hpp"

namespace fp8mla::test {
namespace {

class Stream {
 public:
  Stream() { cuda::check(cudaStreamCreate(&stream_), "cudaStreamCreate"); }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void sync() const { cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

 private:
  cudaStream_t stream_ = nullptr;
};

// Every byte of every device buffer equals its host counterpart; device guards intact.
void expect_same_buffers(const std::vector<DeviceBuffer>& device,
                         const std::vector<HostBuffer>& host) {
  for (std::size_t i = 0; i < host.size(); ++i) {
    EXPECT_TRUE(test::same_bytes(device[i].download(), host[i].payload(),
                                 concat("buffer ", i, " (0: input; then outputs, scalars)")));
    EXPECT_TRUE(device[i].guards_intact()) << "buffer " << i;
    EXPECT_TRUE(host[i].guards_intact()) << "buffer " << i;
  }
}

// Runs the case on the CPU and on the GPU from identical buffers poisoned with `poison`.
template <typename Case>
void expect_cuda_equals_cpu(const Case& c, std::uint8_t poison = kPoison) {
  SCOPED_TRACE(c.describe() + concat(", poison 0x", std::hex, int(poison)));
  std::vector<HostBuffer> host = test::host_buffers(c, poison);
  const std::vector<DeviceBuffer> device = upload(host);
  test::run_cpu(c, host);
  const Stream stream;
  c.run(device_bases(device), Device::cuda(0), stream.get());
  stream.sync();
  expect_same_buffers(device, host);
}

// NVFP4 packed bytes may be 0xFF or 0x00 legitimately: a byte left unwritten shows under one of
// the two poisons.
void expect_nvfp4_equals_cpu(const Nvfp4Case& c) {
  expect_cuda_equals_cpu(c, 0xFF);
  expect_cuda_equals_cpu(c, 0x00);
}

// ---- Matrices
// -------------------------------------------------------------------------------------

// Misaligned and padded rows on some cases: no vector path may assume them.
std::vector<Fp8Case> fp8_cases() {
  std::vector<Fp8Case> cases;
  std::uint64_t seed = 0;
  for (DType in_dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (DType out_dtype : {DType::kE4M3, DType::kE5M2}) {
      for (std::int64_t cols : {576, 384, 1, 7, 7168}) {
        for (std::int64_t rows : kRows) {
          for (Fp8Scale scale : {Fp8Scale::kValue, Fp8Scale::kMemory, Fp8Scale::kDynamic}) {
            Fp8Case c = test::fp8_sweep_case(in_dtype, out_dtype, rows, cols, scale, ++seed);
            cases.push_back(seed % 2 == 0 ? test::with_padding(c, 13, 5, 3) : c);
          }
        }
      }
    }
  }
  return cases;
}

std::vector<GroupCase> group_cases() {
  struct Width {
    std::int64_t cols;
    int group_size;
  };
  const Width widths[] = {{192, 64}, {896, 128}, {7168, 128}, {7168, 64}, {128, 128}};
  std::vector<GroupCase> cases;
  std::uint64_t seed = 1000;
  for (ScaleLayout layout : test::kAllScaleLayouts) {
    for (const Width& width : widths) {
      for (std::int64_t rows : kRows) {
        GroupCase c = test::group_sweep_case(layout, rows, width.cols, width.group_size, ++seed);
        cases.push_back(seed % 3 == 0 ? test::with_padding(c, 24, 8, 16) : c);
      }
    }
  }
  return cases;
}

std::vector<Nvfp4Case> nvfp4_cases() {
  std::vector<Nvfp4Case> cases;
  std::uint64_t seed = 3000;
  for (Nvfp4Scales layout : test::kAllNvfp4Scales) {
    for (std::int64_t k : {80, 16, 64, 7168}) {
      for (std::int64_t rows : {0, 1, 3, 7, 17, 129, 1025}) {
        Nvfp4Case c = test::nvfp4_sweep_case(layout, rows, k, ++seed);
        cases.push_back(seed % 3 == 0 ? test::with_padding(c, 32, 16, 8) : c);
      }
    }
  }
  return cases;
}

// make(layout, shape, seed) for every layout (or scale mode) and shape, the seeds counting up
// from seed + 1.
template <typename Layouts, typename Make>
auto strided_cases(const Layouts& layouts, std::initializer_list<std::vector<std::int64_t>> shapes,
                   std::uint64_t seed, Make make) {
  std::vector<decltype(make(*std::begin(layouts), *shapes.begin(), seed))> cases;
  for (const auto& layout : layouts) {
    for (const std::vector<std::int64_t>& shape : shapes) {
      cases.push_back(make(layout, shape, ++seed));
    }
  }
  return cases;
}

TEST(QuantizeCuda, PerTensorMatchesCpu) {
  FP8MLA_REQUIRE_HOPPER();
  for (const Fp8Case& c : fp8_cases()) expect_cuda_equals_cpu(c);
}

// N-d views that fold (kv[..., 128:] of [T, H, 256]), 65537 rows, a 1-element row width.
TEST(QuantizeCuda, PerTensorStridedAndManyRows) {
  FP8MLA_REQUIRE_HOPPER();
  const Fp8Scale scales[] = {Fp8Scale::kValue, Fp8Scale::kMemory, Fp8Scale::kDynamic};
  const auto make = [](Fp8Scale scale, const std::vector<std::int64_t>& shape, std::uint64_t seed) {
    const std::int64_t in_pad = shape.back() == 128 ? 128 : 0;
    const Fp8Case c = test::fp8_strided_case(shape, scale, seed);
    return test::with_padding(c, in_pad, in_pad, std::int64_t(seed % 4));
  };
  for (const Fp8Case& c :
       strided_cases(scales, {{9, 3, 128}, {65537, 384}, {65537, 1}, {2, 5, 3, 7}}, 500, make)) {
    expect_cuda_equals_cpu(c);
  }
}

TEST(QuantizeCuda, PerTokenGroupMatchesCpu) {
  FP8MLA_REQUIRE_HOPPER();
  for (const GroupCase& c : group_cases()) expect_cuda_equals_cpu(c);
}

TEST(QuantizeCuda, PerTokenGroupStridedAndManyRows) {
  FP8MLA_REQUIRE_HOPPER();
  const auto make = [](ScaleLayout layout, const std::vector<std::int64_t>& shape,
                       std::uint64_t seed) {
    return test::group_strided_case(layout, shape, 64, seed);
  };
  for (const GroupCase& c :
       strided_cases(test::kAllScaleLayouts, {{7, 3, 128}, {65537, 192}}, 2000, make)) {
    expect_cuda_equals_cpu(c);
  }
}

// The kernels divide by f32 scales through one reciprocal a group where s >= 2^-90 and by IEEE
// division below (and for infinite s): eps at, just above and just below 448 * 2^-90 (groups of
// zeros and subnormals then take s = eps / 448) and far below, every layout and input dtype.
TEST(QuantizeCuda, PerTokenGroupTinyEpsTakesTheDivisionFallback) {
  FP8MLA_REQUIRE_HOPPER();
  const float boundary = 448.0f * 0x1p-90f;
  std::uint64_t seed = 5000;
  for (float eps : {boundary, std::nextafter(boundary, 1.0f), std::nextafter(boundary, 0.0f),
                    1e-30f, 1e-40f, 0x1p-149f}) {
    for (ScaleLayout layout : test::kAllScaleLayouts) {
      GroupCase c = test::group_sweep_case(layout, 67, 896, seed % 2 ? 64 : 128, ++seed);
      c.eps = eps;
      c.data = Data::kAdversarial;
      expect_cuda_equals_cpu(c);
    }
  }
}

TEST(QuantizeCuda, Nvfp4MatchesCpu) {
  FP8MLA_REQUIRE_HOPPER();
  for (const Nvfp4Case& c : nvfp4_cases()) expect_nvfp4_equals_cpu(c);
}

TEST(QuantizeCuda, Nvfp4StridedAndManyRows) {
  FP8MLA_REQUIRE_HOPPER();
  for (const Nvfp4Case& c : strided_cases(test::kAllNvfp4Scales, {{45, 3, 128}, {65537, 80}}, 4000,
                                          test::nvfp4_strided_case)) {
    expect_nvfp4_equals_cpu(c);
  }
}

// ---- Determinism and PDL ------------------------------------------------------------------------

// 20 runs from the same input give the same bytes (a dynamic amax and group scales included).
template <typename Case>
void expect_deterministic(const Case& c) {
  SCOPED_TRACE(c.describe());
  const std::vector<HostBuffer> host = test::host_buffers(c);
  std::vector<DeviceBuffer> device = upload(host);
  const std::vector<void*> bases = device_bases(device);
  const Stream stream;
  std::vector<std::vector<std::uint8_t>> first;
  for (int run = 0; run < 20; ++run) {
    for (std::size_t i = 1; i < device.size(); ++i) device[i].upload(host[i].data());  // re-poison
    c.run(bases, Device::cuda(0), stream.get());
    stream.sync();
    for (std::size_t i = 0; i < device.size(); ++i) {
      std::vector<std::uint8_t> bytes = device[i].download();
      if (run == 0) {
        first.push_back(std::move(bytes));
      } else {
        EXPECT_TRUE(test::same_bytes(bytes, first[i], concat("run ", run, ", buffer ", i)));
      }
    }
  }
}

TEST(QuantizeCuda, DeterministicOverRuns) {
  FP8MLA_REQUIRE_HOPPER();
  expect_deterministic(Fp8Case{
      .shape = {4099, 7168}, .scale = Fp8Scale::kDynamic, .data = Data::kAdversarial, .seed = 77});
  const GroupCase group{.shape = {4099, 7168},
                        .layout = ScaleLayout::kPackedTmaColMajor,
                        .data = Data::kAdversarial,
                        .seed = 78};
  expect_deterministic(group);
  GroupCase group_f32 = group;
  group_f32.layout = ScaleLayout::kF32TmaColMajor;
  group_f32.group_size = 64;
  expect_deterministic(group_f32);
}

// Ops chained on one stream with no sync between them: the dynamic scale one op writes is the
// scale_inv and the global_scale the next ops read, so a kernel that reads before its predecessor
// finished (a misplaced PDL wait) reads the poison. 1025 rows take the dynamic scale's four
// launches, 7 rows its single one.
void expect_chain_equals_cpu(std::int64_t rows) {
  SCOPED_TRACE(concat(rows, " rows"));
  const test::Spec x_spec = test::dense(DType::kBF16, {rows, 576});
  const test::Spec fp8_spec = test::dense(DType::kE4M3, {rows, 576});
  const test::Spec fp4_spec = test::dense(DType::kE2M1x2, {rows, 288});
  const test::Spec sf_spec = test::dense(DType::kE4M3, {(rows + 127) / 128, 9, 32, 4, 4});
  const test::Spec scale_spec = test::dense(DType::kF32, {1});
  std::vector<HostBuffer> host;
  for (const test::Spec* s : {&x_spec, &fp8_spec, &fp8_spec, &fp4_spec, &sf_spec, &scale_spec}) {
    host.emplace_back(s->bytes());
  }
  test::fill_input(host[0].data(), DType::kBF16, x_spec.buffer_elems, Data::kRandom, 99);
  const std::vector<DeviceBuffer> device = upload(host);
  const auto chain = [&](std::span<void* const> b, Device d, CudaStream stream) {
    const TensorView x = x_spec.view(b[0], d), scale = scale_spec.view(b[5], d);
    quantize_fp8_dynamic(x, fp8_spec.view(b[1], d), scale, stream);
    quantize_fp8(x, fp8_spec.view(b[2], d), scale, stream);
    quantize_nvfp4(x, fp4_spec.view(b[3], d), sf_spec.view(b[4], d), scale,
                   Nvfp4ScaleLayout::kSwizzled128x4, stream);
  };
  chain(test::host_bases(host), Device::cpu(), nullptr);
  const Stream stream;
  chain(device_bases(device), Device::cuda(0), stream.get());
  stream.sync();
  expect_same_buffers(device, host);
}

TEST(QuantizeCuda, PdlOnAndOffBitIdentical) {
  FP8MLA_REQUIRE_HOPPER();
  const Fp8Case fp8{
      .shape = {1025, 7168}, .scale = Fp8Scale::kDynamic, .data = Data::kAdversarial, .seed = 11};
  const GroupCase group{.shape = {1025, 896},
                        .layout = ScaleLayout::kPackedTmaColMajor,
                        .data = Data::kAdversarial,
                        .seed = 12};
  const Nvfp4Case nvfp4{
      .shape = {1025, 80}, .global_scale = 42.0f, .data = Data::kAdversarial, .seed = 13};
  for (bool pdl : {false, true}) {
    const PdlScope scope(pdl);
    SCOPED_TRACE(pdl ? "PDL on" : "PDL off");
    expect_cuda_equals_cpu(fp8);
    expect_cuda_equals_cpu(group);
    expect_cuda_equals_cpu(nvfp4);
    expect_chain_equals_cpu(1025);
    expect_chain_equals_cpu(7);
  }
}

// ---- More than 2^31 elements --------------------------------------------------------------------
// The input is generated on the device from a hash of the 64-bit element index (an offset that
// wraps at 2^31 or 2^32 reads different data). The ops are row-independent with static scales, so
// bands of rows (the first, those around element 2^31, the last) are compared with the CPU op run
// on those rows alone.

__host__ __device__ std::uint16_t bf16_pattern(std::uint64_t i) {
  std::uint64_t z = i * 0x9E3779B97F4A7C15ull + 0x1234567ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  // Mostly finite values from 2^-17 to 2^13, one in 64 a raw pattern (NaN, inf, subnormal).
  if ((z >> 40) % 64 == 0) return std::uint16_t(z);
  return std::uint16_t((z & 0x807Fu) | ((110u + std::uint32_t(z >> 8) % 30u) << 7));
}

__global__ void fill_bf16(std::uint16_t* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    out[i] = bf16_pattern(std::uint64_t(i));
  }
}

struct RowBand {
  std::int64_t begin;
  std::int64_t count;
};

std::vector<RowBand> bands(std::int64_t rows, std::int64_t cols, std::int64_t count) {
  const std::int64_t at_2_31 = (std::int64_t{1} << 31) / cols;
  return {{0, count}, {at_2_31 - count / 2, count}, {rows - count, count}};
}

// A device bf16 [rows, cols] input filled by fill_bf16.
DeviceBuffer device_input(std::int64_t rows, std::int64_t cols) {
  DeviceBuffer input(std::size_t(rows * cols) * 2);
  fill_bf16<<<cuda::device_props(0).sm_count * 8, 256>>>(static_cast<std::uint16_t*>(input.data()),
                                                         rows * cols);
  cuda::check_launch("fill_bf16");
  return input;
}

// Host copy of rows [band.begin, band.begin + band.count) of a row-major device buffer.
HostBuffer rows_to_host(const DeviceBuffer& device, RowBand band, std::size_t row_bytes) {
  HostBuffer host(std::size_t(band.count) * row_bytes);
  const std::vector<std::uint8_t> bytes =
      device.download(std::size_t(band.begin) * row_bytes, host.bytes());
  std::memcpy(host.data(), bytes.data(), bytes.size());
  return host;
}

TEST(QuantizeCuda, PerTensorPast2To31Elements) {
  FP8MLA_REQUIRE_HOPPER();
  constexpr std::int64_t kRowsBig = (std::int64_t{1} << 21) + 3, kCols = 1030;
  static_assert(kRowsBig * kCols > (std::int64_t{1} << 31));
  const DeviceBuffer input = device_input(kRowsBig, kCols);
  DeviceBuffer out(std::size_t(kRowsBig * kCols));
  quantize_fp8(TensorView(input.data(), DType::kBF16, {kRowsBig, kCols}, Device::cuda(0)),
               TensorView(out.data(), DType::kE4M3, {kRowsBig, kCols}, Device::cuda(0)), 0.75f);
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  for (const RowBand& band : bands(kRowsBig, kCols, 4)) {
    SCOPED_TRACE(concat("rows ", band.begin, " + ", band.count));
    HostBuffer in_rows = rows_to_host(input, band, kCols * 2),
               want(std::size_t(band.count * kCols));
    quantize_fp8(TensorView(in_rows.data(), DType::kBF16, {band.count, kCols}),
                 TensorView(want.data(), DType::kE4M3, {band.count, kCols}), 0.75f);
    EXPECT_TRUE(test::same_bytes(out.download(std::size_t(band.begin * kCols), want.bytes()),
                                 want.payload(), "out"));
  }
  EXPECT_TRUE(out.guards_intact());
}

TEST(QuantizeCuda, PerTokenGroupPast2To31Elements) {
  FP8MLA_REQUIRE_HOPPER();
  constexpr std::int64_t kRowsBig = (std::int64_t{1} << 21) + 5, kCols = 1024, kGroups = 8;
  static_assert(kRowsBig * kCols > (std::int64_t{1} << 31));
  const std::int64_t ld = test::round_up(kRowsBig, 4);  // TMA-aligned column-major scales
  const DeviceBuffer input = device_input(kRowsBig, kCols);
  DeviceBuffer out(std::size_t(kRowsBig * kCols)), scales(std::size_t(ld * kGroups) * 4);
  const Device gpu = Device::cuda(0);
  quantize_fp8_per_token_group(
      TensorView(input.data(), DType::kBF16, {kRowsBig, kCols}, gpu),
      TensorView(out.data(), DType::kE4M3, {kRowsBig, kCols}, gpu),
      TensorView(scales.data(), DType::kF32, {kRowsBig, kGroups}, {1, ld}, gpu), {128});
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  for (const RowBand& band : bands(kRowsBig, kCols, 4)) {
    SCOPED_TRACE(concat("rows ", band.begin, " + ", band.count));
    HostBuffer in_rows = rows_to_host(input, band, kCols * 2);
    HostBuffer want(std::size_t(band.count * kCols)),
        want_scales(std::size_t(band.count * kGroups) * 4);
    // The CPU op writes the band's scales column-major too, so each group column is contiguous.
    quantize_fp8_per_token_group(
        TensorView(in_rows.data(), DType::kBF16, {band.count, kCols}),
        TensorView(want.data(), DType::kE4M3, {band.count, kCols}),
        TensorView(want_scales.data(), DType::kF32, {band.count, kGroups}, {1, band.count}), {128});
    EXPECT_TRUE(test::same_bytes(out.download(std::size_t(band.begin * kCols), want.bytes()),
                                 want.payload(), "out"));
    for (std::int64_t g = 0; g < kGroups; ++g) {
      const std::size_t column_bytes = std::size_t(band.count) * 4;
      EXPECT_TRUE(test::same_bytes(
          scales.download(std::size_t(g * ld + band.begin) * 4, column_bytes),
          want_scales.payload().subspan(std::size_t(g) * column_bytes, column_bytes),
          concat("scales of group ", g)));
    }
  }
  EXPECT_TRUE(out.guards_intact());
  EXPECT_TRUE(scales.guards_intact());
}

TEST(QuantizeCuda, Nvfp4Past2To31Elements) {
  FP8MLA_REQUIRE_HOPPER();
  constexpr std::int64_t kRowsBig = (std::int64_t{1} << 21) + 7, kCols = 1024;
  static_assert(kRowsBig * kCols > (std::int64_t{1} << 31));
  constexpr std::int64_t kScaleCols = kCols / 16;  // 64 blocks: 16 tiles of 4, no K padding
  const std::int64_t m_tiles = (kRowsBig + 127) / 128;
  const DeviceBuffer input = device_input(kRowsBig, kCols);
  DeviceBuffer out(std::size_t(kRowsBig * kCols / 2)),
      scales(std::size_t(m_tiles * 128 * kScaleCols)), global(4);
  const float global_scale = 448.0f * 6.0f / 4096.0f;
  global.upload(&global_scale);
  const Device gpu = Device::cuda(0);
  quantize_nvfp4(TensorView(input.data(), DType::kBF16, {kRowsBig, kCols}, gpu),
                 TensorView(out.data(), DType::kE2M1x2, {kRowsBig, kCols / 2}, gpu),
                 TensorView(scales.data(), DType::kE4M3, {m_tiles * 128, kScaleCols}, gpu),
                 TensorView(global.data(), DType::kF32, {1}, gpu));
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  // Whole 128-row tiles: the first, the one holding element 2^31 (row 2^21, the last, with its
  // padding rows) and one in the middle (byte 2^31 of the input).
  const std::int64_t last_tile = m_tiles - 1;
  for (std::int64_t tile : {std::int64_t{0}, (std::int64_t{1} << 20) / 128, last_tile}) {
    const RowBand band{tile * 128, std::min<std::int64_t>(128, kRowsBig - tile * 128)};
    SCOPED_TRACE(concat("rows ", band.begin, " + ", band.count));
    HostBuffer in_rows = rows_to_host(input, band, kCols * 2);
    HostBuffer want(std::size_t(band.count * kCols / 2)), want_scales(128 * kScaleCols),
        host_global(4);
    std::memcpy(host_global.data(), &global_scale, 4);
    quantize_nvfp4(TensorView(in_rows.data(), DType::kBF16, {band.count, kCols}),
                   TensorView(want.data(), DType::kE2M1x2, {band.count, kCols / 2}),
                   TensorView(want_scales.data(), DType::kE4M3, {128, kScaleCols}),
                   TensorView(host_global.data(), DType::kF32, {1}));
    EXPECT_TRUE(test::same_bytes(out.download(std::size_t(band.begin * kCols / 2), want.bytes()),
                                 want.payload(), "out"));
    // A tile of the swizzled layout is 128 x kScaleCols contiguous bytes.
    EXPECT_TRUE(
        test::same_bytes(scales.download(std::size_t(tile * 128 * kScaleCols), want_scales.bytes()),
                         want_scales.payload(), "block_scales tile"));
  }
  EXPECT_TRUE(out.guards_intact());
  EXPECT_TRUE(scales.guards_intact());
}

}  // namespace
}  // namespace fp8mla::test
