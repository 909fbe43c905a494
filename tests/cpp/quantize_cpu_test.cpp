// CPU semantics of the quantization ops (docs/design.md section 2, ops 1-3): each op against a
// naive reference written here. The reference reads the input through its own stride walk into a
// dense logical copy, computes every output by the documented formula, and writes the expected
// bytes of every output buffer (poison where nothing may be written, zero in swizzle padding), so
// strides, row folding, scale layouts, packing and swizzle are checked, not only the rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "fp8mla/numerics.hpp"
#include "fp8mla/quantize.hpp"
#include "quantize_test_util.hpp"

namespace fp8mla::test {
namespace {

// The expected bytes of one whole buffer.
class Image {
 public:
  explicit Image(const HostBuffer& buffer, std::uint8_t fill = kPoison)
      : base_(buffer.data()), bytes_(buffer.bytes(), fill) {}

  // Writes `value` (one element of v's dtype) at element offset `offset` of view `v`.
  template <typename T>
  void put(const TensorView& v, std::int64_t offset, T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const std::ptrdiff_t at =
        static_cast<const std::uint8_t*>(v.data()) - base_ + offset * std::ptrdiff_t(sizeof(T));
    std::memcpy(bytes_.data() + at, &value, sizeof(T));
  }
  const std::vector<std::uint8_t>& bytes() const { return bytes_; }

 private:
  const std::uint8_t* base_;
  std::vector<std::uint8_t> bytes_;
};

// The elements of `v` in logical row-major order, as fp32.
std::vector<float> logical_values(const TensorView& v) {
  std::vector<float> values(std::size_t(v.numel()));
  test::for_each_element(v, [&](std::int64_t i, std::int64_t offset) {
    values[std::size_t(i)] = test::load_f32(v.data(), v.dtype(), offset);
  });
  return values;
}

// max |x| with NaNs skipped, starting from `floor`.
float amax_of(std::span<const float> x, float floor) {
  float amax = floor;
  for (float v : x) {
    if (!std::isnan(v)) amax = std::max(amax, std::fabs(v));
  }
  return amax;
}

std::uint8_t encode_fp8(float x, DType dtype) {
  return dtype == DType::kE5M2 ? encode_e5m2(x) : encode_e4m3(x);
}

// One CPU run of a case: its buffers, their bytes before the run and the views of its specs;
// `ok` is false (with a failure) when the op threw.
struct CpuRun {
  std::vector<HostBuffer> b;
  std::vector<std::vector<std::uint8_t>> before;
  std::vector<TensorView> views;
  bool ok = false;

  template <typename Case>
  explicit CpuRun(const Case& c, std::uint8_t poison = kPoison) : b(test::host_buffers(c, poison)) {
    for (const HostBuffer& buffer : b)
      before.emplace_back(buffer.payload().begin(), buffer.payload().end());
    const std::vector<test::Spec> specs = c.specs();
    for (std::size_t i = 0; i < specs.size(); ++i) views.push_back(specs[i].view(b[i].data()));
    try {
      test::run_cpu(c, b);
      ok = true;
    } catch (const Error& e) {
      ADD_FAILURE() << "the op threw: " << e.what();
    }
  }
};

// What buffer i must hold after the run: `image`, or its bytes before the run when null.
struct Expected {
  const char* name;
  const Image* image = nullptr;
};

// Every buffer of the run holds what `expected` (one entry per buffer) says; guards intact.
void expect_buffers(const CpuRun& run, std::initializer_list<Expected> expected) {
  std::size_t i = 0;
  for (const Expected& e : expected) {
    if (e.image != nullptr) {
      EXPECT_TRUE(test::same_bytes(run.b[i].payload(), e.image->bytes(), e.name));
    } else {
      EXPECT_TRUE(test::same_bytes(run.b[i].payload(), run.before[i],
                                   concat(e.name, " (must not change)")));
    }
    ++i;
  }
  for (std::size_t k = 0; k < run.b.size(); ++k) {
    EXPECT_TRUE(run.b[k].guards_intact()) << "buffer " << k;
  }
}

// ---- Per-tensor FP8
// ------------------------------------------------------------------------------

// Expected `out` of fp8(x * scale_inv) for every element of the views.
void put_fp8(Image& image, const TensorView& in, const TensorView& out, float scale_inv) {
  const std::vector<float> x = logical_values(in);
  test::for_each_element(out, [&](std::int64_t i, std::int64_t offset) {
    image.put(out, offset, encode_fp8(x[std::size_t(i)] * scale_inv, out.dtype()));
  });
}

void check_fp8(const Fp8Case& c) {
  SCOPED_TRACE(c.describe());
  const CpuRun run(c);
  if (!run.ok) return;
  const TensorView &in = run.views[0], &out = run.views[1], &scalar = run.views[2];

  float scale_inv = c.scale_inv;
  Image scalar_image(run.b[2]);
  if (c.scale == Fp8Scale::kMemory) scalar_image.put(scalar, 0, c.scale_inv);
  if (c.scale == Fp8Scale::kDynamic) {
    const float fp8_max = c.out_dtype == DType::kE5M2 ? kE5M2Max : kE4M3Max;
    const float scale = std::max(amax_of(logical_values(in), 0.0f) / fp8_max, kMinDynamicScale);
    scale_inv = 1.0f / scale;
    scalar_image.put(scalar, 0, scale);
  }
  Image out_image(run.b[1]);
  put_fp8(out_image, in, out, scale_inv);
  expect_buffers(run, {{"input"}, {"out", &out_image}, {"scale scalar", &scalar_image}});
}

// Every row count with every odd row width, dtype pair and scale mode.
TEST(QuantizeFp8Cpu, ShapesDtypesAndScaleModes) {
  std::uint64_t seed = 0;
  for (DType in_dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (DType out_dtype : {DType::kE4M3, DType::kE5M2}) {
      for (std::int64_t cols : {576, 384, 1, 7168}) {
        for (std::int64_t rows : kRows) {
          ++seed;
          check_fp8(
              test::fp8_sweep_case(in_dtype, out_dtype, rows, cols, Fp8Scale(seed % 3), seed));
        }
      }
    }
  }
}

// Strided views: padded input rows read from an offset, out with its own row stride, N-d views.
TEST(QuantizeFp8Cpu, StridedAndNdViews) {
  std::uint64_t seed = 100;
  for (Fp8Scale scale : {Fp8Scale::kValue, Fp8Scale::kMemory, Fp8Scale::kDynamic}) {
    for (std::vector<std::int64_t> shape :
         {std::vector<std::int64_t>{7, 3, 128}, std::vector<std::int64_t>{17, 576},
          std::vector<std::int64_t>{2, 5, 3, 7}}) {
      check_fp8(test::with_padding(test::fp8_strided_case(shape, scale, ++seed), 13, 5, 3));
    }
  }
}

// kv[..., 128:] of a [T, H, 256] bf16 tensor (TensorView::narrow) into an out whose rows are 160
// apart; also 0-d views and size-1 dims with arbitrary strides, which fold.
TEST(QuantizeFp8Cpu, NarrowedKvViewAndOddViews) {
  constexpr std::int64_t kT = 9, kH = 3;
  HostBuffer kv_buffer(kT * kH * 256 * 2), out_buffer(kT * kH * 160);
  test::fill_input(kv_buffer.data(), DType::kBF16, kT * kH * 256, Data::kAdversarial, 7);
  const TensorView kv(kv_buffer.data(), DType::kBF16, {kT, kH, 256});
  const TensorView k_rope = kv.narrow(-1, 128, 128);
  const TensorView out =
      TensorView(out_buffer.data(), DType::kE4M3, {kT, kH, 160}).narrow(-1, 0, 128);
  quantize_fp8(k_rope, out, 0.5f);
  Image want(out_buffer);
  put_fp8(want, k_rope, out, 0.5f);
  EXPECT_TRUE(test::same_bytes(out_buffer.payload(), want.bytes(), "out of kv[..., 128:]"));

  HostBuffer scalar_in(4), scalar_out(1);
  test::store_f32(scalar_in.data(), DType::kF32, 0, -3.5f);
  quantize_fp8(TensorView(scalar_in.data(), DType::kF32, {}),
               TensorView(scalar_out.data(), DType::kE4M3, {}), 2.0f);
  EXPECT_EQ(scalar_out.data()[0], encode_e4m3(-7.0f));

  // [3, 1, 4, 96] with a junk stride on the size-1 dim: 12 rows of 96, row stride 100.
  HostBuffer in_buffer(3 * 4 * 100 * 4), out4_buffer(3 * 4 * 96);
  test::fill_input(in_buffer.data(), DType::kF32, 3 * 4 * 100, Data::kRandom, 8);
  const TensorView in4(in_buffer.data(), DType::kF32, {3, 1, 4, 96}, {400, 12345, 100, 1});
  const TensorView out4(out4_buffer.data(), DType::kE5M2, {3, 1, 4, 96}, {384, 7, 96, 1});
  quantize_fp8(in4, out4, 1.5f);
  Image want4(out4_buffer);
  put_fp8(want4, in4, out4, 1.5f);
  EXPECT_TRUE(test::same_bytes(out4_buffer.payload(), want4.bytes(), "out of a 4-d view"));
  for (const HostBuffer* b :
       {&kv_buffer, &out_buffer, &scalar_in, &scalar_out, &in_buffer, &out4_buffer}) {
    EXPECT_TRUE(b->guards_intact());
  }
}

// 65537 rows (past the 65535 limit of a CUDA grid's y and z dims).
TEST(QuantizeFp8Cpu, ManyRowsDynamic) {
  check_fp8({.shape = {65537, 384},
             .scale = Fp8Scale::kDynamic,
             .data = Data::kAdversarial,
             .seed = 65537});
}

// Exact codes: nearest-even, saturation past the format's max and for +-inf, NaN to 0x7F.
TEST(QuantizeFp8Cpu, KnownCodes) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {1.0f,    448.0f, 449.0f,   1e6f,     -inf, std::nanf(""), -0.0f,
                                0x1p-9f, 0.5f,   57344.0f, 61440.0f, inf,  -1e6f,         3.0f};
  HostBuffer in_buffer(x.size() * 4), e4m3(x.size()), e5m2(x.size());
  std::memcpy(in_buffer.data(), x.data(), x.size() * 4);
  const std::int64_t n = std::int64_t(x.size());
  const TensorView in(in_buffer.data(), DType::kF32, {n});
  quantize_fp8(in, TensorView(e4m3.data(), DType::kE4M3, {n}), 1.0f);
  quantize_fp8(in, TensorView(e5m2.data(), DType::kE5M2, {n}), 1.0f);
  const std::vector<std::uint8_t> want_e4m3 = {0x38, 0x7E, 0x7E, 0x7E, 0xFE, 0x7F, 0x80,
                                               0x01, 0x30, 0x7E, 0x7E, 0x7E, 0xFE, 0x44};
  const std::vector<std::uint8_t> want_e5m2 = {0x3C, 0x5F, 0x5F, 0x7B, 0xFB, 0x7F, 0x80,
                                               0x18, 0x38, 0x7B, 0x7B, 0x7B, 0xFB, 0x42};
  EXPECT_TRUE(test::same_bytes(e4m3.payload(), want_e4m3, "e4m3"));
  EXPECT_TRUE(test::same_bytes(e5m2.payload(), want_e5m2, "e5m2"));
}

// Dynamic scale = max(amax / fp8_max, kMinDynamicScale), NaNs ignored in amax.
TEST(QuantizeFp8Cpu, DynamicScaleValues) {
  const float nan = std::nanf("");
  HostBuffer in_buffer(8 * 4), out(8), scale(4);
  const TensorView in(in_buffer.data(), DType::kF32, {2, 4});
  const TensorView scale_view(scale.data(), DType::kF32, {1});
  float got = 0.0f;

  const float with_nans[8] = {nan, 100.0f, -200.0f, nan, 1.0f, -nan, 3.0f, 0.0f};
  std::memcpy(in_buffer.data(), with_nans, sizeof with_nans);
  quantize_fp8_dynamic(in, TensorView(out.data(), DType::kE4M3, {2, 4}), scale_view);
  std::memcpy(&got, scale.data(), 4);
  EXPECT_EQ(got, 200.0f / 448.0f);
  EXPECT_EQ(out.data()[0], 0x7F);  // NaN stays NaN
  EXPECT_EQ(out.data()[2], 0xFE);  // -amax maps to -448
  quantize_fp8_dynamic(in, TensorView(out.data(), DType::kE5M2, {2, 4}), scale_view);
  std::memcpy(&got, scale.data(), 4);
  EXPECT_EQ(got, 200.0f / 57344.0f);
  EXPECT_EQ(out.data()[2], 0xFB);  // -57344

  // All zero: the floor scale, and every output +-0.
  const float zeros[8] = {0.0f, -0.0f, 0.0f, 0.0f, 0.0f, 0.0f, -0.0f, 0.0f};
  std::memcpy(in_buffer.data(), zeros, sizeof zeros);
  out.fill(kPoison);
  quantize_fp8_dynamic(in, TensorView(out.data(), DType::kE4M3, {2, 4}), scale_view);
  std::memcpy(&got, scale.data(), 4);
  EXPECT_EQ(got, kMinDynamicScale);
  const std::vector<std::uint8_t> want = {0x00, 0x80, 0x00, 0x00, 0x00, 0x00, 0x80, 0x00};
  EXPECT_TRUE(test::same_bytes(out.payload(), want, "all-zero input"));
}

// A signaling NaN is a NaN like any other: bf16 keeps its payload when widened (0x7F81 is an fp32
// sNaN), and amax must still skip it rather than lose the maximum seen before it.
constexpr std::uint16_t kBf16SignalingNan = 0x7F81;

TEST(QuantizeFp8Cpu, SignalingNanIgnoredInAmax) {
  HostBuffer in(4 * 2), out(4), scale(4);
  const std::uint16_t x[4] = {encode_bf16(100.0f), kBf16SignalingNan, encode_bf16(1.0f), 0};
  std::memcpy(in.data(), x, sizeof x);
  quantize_fp8_dynamic(TensorView(in.data(), DType::kBF16, {1, 4}),
                       TensorView(out.data(), DType::kE4M3, {1, 4}),
                       TensorView(scale.data(), DType::kF32, {}));
  float got = 0.0f;
  std::memcpy(&got, scale.data(), 4);
  EXPECT_EQ(got, 100.0f / 448.0f);
  EXPECT_EQ(out.data()[1], 0x7F);
}

// ---- Per-token-group FP8
// ---------------------------------------------------------------------------

// The UE8M0 rounding of s > 2^-127: the exponent byte of the smallest 2^k >= s (2^127 at most).
std::uint8_t ue8m0_byte(float s) {
  if (!(s < 0x1p127f)) return 254;
  int e = 0;
  const float m = std::frexp(s, &e);  // s = m * 2^e, m in [0.5, 1)
  return std::uint8_t((m == 0.5f ? e - 1 : e) + 127);
}

void check_group(const GroupCase& c) {
  SCOPED_TRACE(c.describe());
  const CpuRun run(c);
  if (!run.ok) return;
  const TensorView &in = run.views[0], &out = run.views[1], &scales = run.views[2];
  const std::int64_t rows = c.rows(), cols = c.shape.back(), groups = c.groups();

  const std::vector<float> x = logical_values(in);
  std::vector<std::uint8_t> q(x.size()), exponents(std::size_t(rows * groups));
  std::vector<float> scale_values(exponents.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::span<const float> group(x.data() + r * cols + g * c.group_size,
                                         std::size_t(c.group_size));
      float scale = amax_of(group, c.eps) / 448.0f;
      const std::uint8_t exponent = ue8m0_byte(scale);
      if (c.pow2()) scale = std::ldexp(1.0f, exponent - 127);
      for (int i = 0; i < c.group_size; ++i) {
        q[std::size_t(r * cols + g * c.group_size + i)] =
            encode_e4m3(group[std::size_t(i)] / scale);
      }
      exponents[std::size_t(r * groups + g)] = exponent;
      scale_values[std::size_t(r * groups + g)] = scale;
    }
  }
  Image out_image(run.b[1]), scale_image(run.b[2]);
  test::for_each_element(out, [&](std::int64_t i, std::int64_t offset) {
    out_image.put(out, offset, q[std::size_t(i)]);
  });
  const std::int64_t width = scales.size(1);
  test::for_each_element(scales, [&](std::int64_t i, std::int64_t offset) {
    const std::int64_t r = i / width, w = i % width;
    switch (scales.dtype()) {
      case DType::kF32:
        scale_image.put(scales, offset, scale_values[std::size_t(r * groups + w)]);
        break;
      case DType::kUE8M0:
        scale_image.put(scales, offset, exponents[std::size_t(r * groups + w)]);
        break;
      default: {  // packed: group 4w + j in byte j, zero past the last group
        std::array<std::uint8_t, 4> word = {};
        for (std::int64_t j = 0; j < 4 && 4 * w + j < groups; ++j) {
          word[std::size_t(j)] = exponents[std::size_t(r * groups + 4 * w + j)];
        }
        scale_image.put(scales, offset, word);
      }
    }
  });
  expect_buffers(run, {{"input"}, {"out", &out_image}, {"scales", &scale_image}});
}

// Every scale layout with widths that are not powers of two and every row count.
TEST(QuantizeGroupCpu, EveryScaleLayout) {
  struct Width {
    std::int64_t cols;
    int group_size;
  };
  const Width widths[] = {{192, 64}, {896, 128}, {7168, 128}, {7168, 64}};
  std::uint64_t seed = 1000;
  for (ScaleLayout layout : test::kAllScaleLayouts) {
    for (const Width& width : widths) {
      for (std::int64_t rows : kRows) {
        // Wide rows with one large count per layout keep the run short.
        if (width.cols == 7168 && rows == 1025 && layout != ScaleLayout::kPackedTmaColMajor) {
          continue;
        }
        check_group(test::group_sweep_case(layout, rows, width.cols, width.group_size, ++seed));
      }
    }
  }
}

// Strided and N-d inputs (kv[..., 128:] of [T, H, 256]), out with its own row stride.
TEST(QuantizeGroupCpu, StridedAndNdViews) {
  std::uint64_t seed = 2000;
  for (ScaleLayout layout : test::kAllScaleLayouts) {
    for (int group_size : {64, 128}) {
      check_group(test::group_strided_case(layout, {7, 3, 128}, group_size, ++seed));
    }
  }
}

TEST(QuantizeGroupCpu, ManyRowsPacked) {
  check_group({.shape = {65537, 192},
               .group_size = 64,
               .layout = ScaleLayout::kPackedTmaColMajor,
               .data = Data::kAdversarial,
               .seed = 65537});
}

// Worked examples with their codes spelled out.
TEST(QuantizeGroupCpu, KnownValues) {
  // Row 0: an all-zero group then a group whose amax is 672 = 1.5 * 448; 64 columns each.
  std::vector<float> x(128, 0.0f);
  x[64] = 672.0f;
  x[65] = -672.0f;
  x[66] = 1.0f;
  HostBuffer in_buffer(128 * 4);
  std::memcpy(in_buffer.data(), x.data(), x.size() * 4);
  const TensorView in(in_buffer.data(), DType::kF32, {1, 128});
  HostBuffer out(128), f32_scales(8), byte_scales(2), packed(4);
  const TensorView out_view(out.data(), DType::kE4M3, {1, 128});

  // f32 scales: s = amax / 448 unrounded; 672 / 1.5 = 448 exactly, 1 / 1.5 rounds to 0.6875.
  quantize_fp8_per_token_group(in, out_view, TensorView(f32_scales.data(), DType::kF32, {1, 2}),
                               {64, 1e-10f, false});
  float s[2];
  std::memcpy(s, f32_scales.data(), 8);
  EXPECT_EQ(s[0], 1e-10f / 448.0f);
  EXPECT_EQ(s[1], 1.5f);
  EXPECT_EQ(out.data()[0], 0x00);
  EXPECT_EQ(out.data()[64], 0x7E);  // 448
  EXPECT_EQ(out.data()[65], 0xFE);  // -448
  EXPECT_EQ(out.data()[66], 0x33);  // 0.6875

  // UE8M0: the zero group's s = 1e-10 / 448 in (2^-43, 2^-42] gives byte 85; 1.5 rounds up to 2,
  // so 672 becomes 336, a tie between 320 and 352 that rounds to even 320 (0x7A).
  out.fill(kPoison);
  quantize_fp8_per_token_group(in, out_view, TensorView(byte_scales.data(), DType::kUE8M0, {1, 2}),
                               {64, 1e-10f, false});
  EXPECT_EQ(byte_scales.data()[0], 85);
  EXPECT_EQ(byte_scales.data()[1], 128);
  EXPECT_EQ(out.data()[64], 0x7A);
  EXPECT_EQ(decode_e4m3(out.data()[64]), 320.0f);
  EXPECT_EQ(out.data()[65], 0xFA);
  EXPECT_EQ(out.data()[66], 0x30);  // 0.5

  // round_scale_to_pow2 with f32 scales: the same powers of two as values.
  quantize_fp8_per_token_group(in, out_view, TensorView(f32_scales.data(), DType::kF32, {1, 2}),
                               {64, 1e-10f, true});
  std::memcpy(s, f32_scales.data(), 8);
  EXPECT_EQ(s[0], 0x1p-42f);
  EXPECT_EQ(s[1], 2.0f);
  EXPECT_EQ(out.data()[64], 0x7A);

  // Packed: two groups in bytes 0 and 1 of one word, bytes 2 and 3 zero.
  quantize_fp8_per_token_group(in, out_view, TensorView(packed.data(), DType::kI32, {1, 1}),
                               {64, 1e-10f, false});
  const std::vector<std::uint8_t> want_word = {85, 128, 0, 0};
  EXPECT_TRUE(test::same_bytes(packed.payload(), want_word, "packed word"));
  for (const HostBuffer* b : {&in_buffer, &out, &f32_scales, &byte_scales, &packed}) {
    EXPECT_TRUE(b->guards_intact());
  }
}

TEST(QuantizeGroupCpu, SignalingNanIgnoredInAmax) {
  HostBuffer in(64 * 2), out(64), scales(1);
  std::vector<std::uint16_t> x(64, 0);
  x[0] = encode_bf16(672.0f);
  x[1] = kBf16SignalingNan;
  x[2] = encode_bf16(1.0f);
  std::memcpy(in.data(), x.data(), 64 * 2);
  quantize_fp8_per_token_group(TensorView(in.data(), DType::kBF16, {1, 64}),
                               TensorView(out.data(), DType::kE4M3, {1, 64}),
                               TensorView(scales.data(), DType::kUE8M0, {1, 1}), {64});
  EXPECT_EQ(scales.data()[0], 128);  // amax 672: s = 1.5 rounds up to 2
  EXPECT_EQ(out.data()[0], 0x7A);
}

// ---- NVFP4
// -----------------------------------------------------------------------------------------

void check_nvfp4(const Nvfp4Case& c, std::uint8_t poison) {
  SCOPED_TRACE(c.describe() + concat(", poison 0x", std::hex, int(poison)));
  const CpuRun run(c, poison);
  if (!run.ok) return;
  const TensorView &in = run.views[0], &out = run.views[1], &scales = run.views[2];
  const std::int64_t rows = c.rows(), k = c.shape.back(), k_blocks = c.k_blocks();
  const float gs = c.global_scale;

  const std::vector<float> x = logical_values(in);
  std::vector<std::uint8_t> packed(x.size() / 2), sf(std::size_t(rows * k_blocks));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t kb = 0; kb < k_blocks; ++kb) {
      const float* block = x.data() + r * k + kb * 16;
      const std::uint8_t code = encode_e4m3(gs * (amax_of({block, 16}, 0.0f) / 6.0f));
      const float value = decode_e4m3(code);
      const float inv = value == 0.0f ? 0.0f : 1.0f / (value * (1.0f / gs));
      for (int i = 0; i < 16; i += 2) {
        packed[std::size_t((r * k + kb * 16 + i) / 2)] =
            std::uint8_t(encode_e2m1(block[i] * inv) | encode_e2m1(block[i + 1] * inv) << 4);
      }
      sf[std::size_t(r * k_blocks + kb)] = code;
    }
  }
  Image out_image(run.b[1], poison), scale_image(run.b[2], poison);
  test::for_each_element(out, [&](std::int64_t i, std::int64_t offset) {
    out_image.put(out, offset, packed[std::size_t(i)]);
  });
  if (c.scales == Nvfp4Scales::kLinear) {
    test::for_each_element(scales, [&](std::int64_t i, std::int64_t offset) {
      scale_image.put(scales, offset, sf[std::size_t(i)]);
    });
  } else {
    // Both views hold the 5-d tile layout [M/128, K/64, 32, 4, 4]: row 32 * i4 + i32 of an
    // M tile, block j4 of a K tile; every padding byte is zero.
    const std::int64_t m_tiles = (rows + 127) / 128, k_tiles = (k_blocks + 3) / 4;
    const TensorView tiles(scales.data(), DType::kE4M3, {m_tiles, k_tiles, 32, 4, 4});
    test::for_each_element(tiles, [&](std::int64_t i, std::int64_t offset) {
      const std::int64_t j4 = i % 4, i4 = i / 4 % 4, i32 = i / 16 % 32, kt = i / 512 % k_tiles,
                         mt = i / (512 * k_tiles);
      const std::int64_t r = mt * 128 + i4 * 32 + i32, kb = kt * 4 + j4;
      scale_image.put(
          tiles, offset,
          r < rows && kb < k_blocks ? sf[std::size_t(r * k_blocks + kb)] : std::uint8_t{0});
    });
  }
  expect_buffers(
      run, {{"input"}, {"out", &out_image}, {"block_scales", &scale_image}, {"global_scale"}});
}

// Both poisons: a packed byte may legitimately be 0xFF (-6, -6) or 0x00, so a byte only passes as
// written when it matches under each.
void check_nvfp4(const Nvfp4Case& c) {
  check_nvfp4(c, 0xFF);
  check_nvfp4(c, 0x00);
}

// K = 80 (5 blocks: the swizzle pads to 8) and 7168, M not a multiple of 128, every layout.
TEST(QuantizeNvfp4Cpu, EveryLayout) {
  std::uint64_t seed = 3000;
  for (Nvfp4Scales layout : test::kAllNvfp4Scales) {
    for (std::int64_t k : {80, 16, 7168}) {
      for (std::int64_t rows : {0, 1, 3, 7, 17, 129, 1025}) {
        if (k == 7168 && rows > 129) continue;  // one wide case per row count is enough here
        check_nvfp4(test::nvfp4_sweep_case(layout, rows, k, ++seed));
      }
    }
  }
}

TEST(QuantizeNvfp4Cpu, StridedAndNdViews) {
  std::uint64_t seed = 4000;
  for (Nvfp4Scales layout : test::kAllNvfp4Scales) {
    // kv[..., 128:] of [45, 3, 256]: 135 rows, two M tiles
    check_nvfp4(test::nvfp4_strided_case(layout, {45, 3, 128}, ++seed));
  }
}

TEST(QuantizeNvfp4Cpu, KnownValues) {
  const float block[16] = {0.0f,  0.5f,  1.0f, 1.5f, 2.0f,  3.0f,  4.0f,  6.0f,
                           -6.0f, -4.0f, 2.5f, 5.0f, 0.25f, 0.75f, -0.0f, -0.5f};
  HostBuffer in_buffer(33 * 32 * 2), out(33 * 16), scales(128 * 4), global(4);
  std::vector<float> x(33 * 32, 0.0f);
  for (int i = 0; i < 16; ++i) {
    x[std::size_t(i)] = block[i];                   // row 0, block 0: amax 6
    x[std::size_t(32 + 16 + i)] = block[i] * 2.0f;  // row 1, block 1: amax 12
    x[std::size_t(32 * 32 + i)] = block[i] / 4.0f;  // row 32, block 0: amax 1.5
  }
  for (std::size_t i = 0; i < x.size(); ++i) {
    test::store_f32(in_buffer.data(), DType::kBF16, std::int64_t(i), x[i]);
  }
  test::store_f32(global.data(), DType::kF32, 0, 1.0f);
  quantize_nvfp4(TensorView(in_buffer.data(), DType::kBF16, {33, 32}),
                 TensorView(out.data(), DType::kE2M1x2, {33, 16}),
                 TensorView(scales.data(), DType::kE4M3, {128, 4}),
                 TensorView(global.data(), DType::kF32, {}));
  // sf = e4m3(amax / 6): 1.0 = 0x38, 2.0 = 0x40, 0.25 = 0x28; all-zero blocks give 0.
  EXPECT_EQ(scales.data()[0], 0x38);   // row 0, block 0
  EXPECT_EQ(scales.data()[1], 0x00);   // row 0, block 1
  EXPECT_EQ(scales.data()[17], 0x40);  // row 1, block 1: (m % 32) * 16 + kb
  EXPECT_EQ(scales.data()[4], 0x28);   // row 32, block 0: ((m % 128) / 32) * 4
  EXPECT_EQ(scales.data()[2], 0x00);   // padding block 2 of row 0
  EXPECT_EQ(scales.data()[20], 0x00);  // padding row 33, block 0
  EXPECT_EQ(scales.data()[8], 0x00);   // padding row 64, block 0
  // e2m1 codes 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6; sign in bit 3; even element in the low nibble;
  // ties to even: 2.5 -> 2, 5 -> 4, 0.25 -> 0, 0.75 -> 1.
  const std::vector<std::uint8_t> want_row0 = {0x10, 0x32, 0x54, 0x76, 0xEF, 0x64, 0x20, 0x98};
  for (std::int64_t row : {0, 1, 32}) {
    const std::size_t at = std::size_t(row * 16 + (row == 1 ? 8 : 0));
    EXPECT_TRUE(test::same_bytes({out.data() + at, 8}, want_row0, concat("row ", row)));
  }
  for (const HostBuffer* b : {&in_buffer, &out, &scales, &global}) {
    EXPECT_TRUE(b->guards_intact());
  }
}

TEST(QuantizeNvfp4Cpu, SignalingNanIgnoredInAmax) {
  HostBuffer in(16 * 2), out(8), scales(512), global(4);
  std::vector<std::uint16_t> x(16, 0);
  x[0] = encode_bf16(6.0f);
  x[1] = kBf16SignalingNan;
  x[2] = encode_bf16(1.0f);
  std::memcpy(in.data(), x.data(), 16 * 2);
  test::store_f32(global.data(), DType::kF32, 0, 1.0f);
  quantize_nvfp4(TensorView(in.data(), DType::kBF16, {1, 16}),
                 TensorView(out.data(), DType::kE2M1x2, {1, 8}),
                 TensorView(scales.data(), DType::kE4M3, {1, 1, 32, 4, 4}),
                 TensorView(global.data(), DType::kF32, {1}));
  EXPECT_EQ(scales.data()[0], 0x38);  // amax 6: sf = 1.0
  EXPECT_EQ(out.data()[0], 0x77);     // 6, then NaN as +6
  EXPECT_EQ(out.data()[1], 0x02);     // 1, 0
}

}  // namespace
}  // namespace fp8mla::test
