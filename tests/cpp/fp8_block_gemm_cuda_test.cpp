// fp8_block_gemm (the e4m3-output block-scaled GEMM) against a float64 host reference: every
// output byte checked, token-major and transposed outputs bit-identical to each other, padding
// and guard bands untouched, ragged row counts; the errors of bad parameters.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/model/fp8_block_gemm.hpp"
#include "cuda_test_util.hpp"
#include "error_test_util.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/numerics.hpp"

namespace fp8mla::cuda::model {
namespace {

using test::DeviceBuffer;
constexpr std::uint8_t kPoisonByte = 0x7F;  // e4m3 NaN: an output left unwritten shows

// Operand values and scales whose products the GPU sums exactly within a 128-element block (see
// bound()): {0, +-0.5, +-1, +-1.5}, scales 2^e (1 + m/8), e in [-3, 3].
struct Rng {
  std::uint64_t state;
  std::uint32_t below(std::uint32_t n) {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return std::uint32_t(((state * 0x2545F4914F6CDD1Dull) >> 32) % n);
  }
  float value() {
    static constexpr float kValues[] = {0.0f, 0.5f, -0.5f, 1.0f, -1.0f, 1.5f, -1.5f};
    return kValues[below(7)];
  }
  float scale() { return std::ldexp(1.0f + float(below(8)) / 8.0f, int(below(7)) - 3); }
};

struct Problem {
  std::int64_t rows, out, in;
  std::int64_t x_scale_pitch, weight_scale_pitch;
  float scale;
  std::vector<std::uint8_t> x, w;         // e4m3 [rows, in], [out, in]
  std::vector<float> x_scales, w_scales;  // [in/128][x_scale_pitch], [out/128][w pitch]
};

Problem make_problem(std::int64_t rows, std::int64_t out, std::int64_t in, float scale,
                     std::uint64_t seed) {
  Problem p{rows, out, in, (rows + 3) / 4 * 4 + 4, in / 128 + 1, scale, {}, {}, {}, {}};
  Rng rng{seed * 0x9E3779B97F4A7C15ull + 1};
  p.x.resize(std::size_t(rows * in));
  p.w.resize(std::size_t(out * in));
  for (auto& b : p.x) b = encode_e4m3(rng.value());
  for (auto& b : p.w) b = encode_e4m3(rng.value());
  // Pitch padding NaN: a scale read from it shows as a NaN output.
  p.x_scales.assign(std::size_t(in / 128 * p.x_scale_pitch), std::nanf(""));
  p.w_scales.assign(std::size_t(out / 128 * p.weight_scale_pitch), std::nanf(""));
  for (std::int64_t g = 0; g < in / 128; ++g) {
    for (std::int64_t r = 0; r < rows; ++r)
      p.x_scales[std::size_t(g * p.x_scale_pitch + r)] = rng.scale();
    for (std::int64_t b = 0; b < out / 128; ++b) {
      p.w_scales[std::size_t(b * p.weight_scale_pitch + g)] = rng.scale();
    }
  }
  return p;
}

// The e4m3 codes y[r, o] may take: each 128-element block sum of the products is a multiple of
// 1/4 below 2^9, exact in the fp8 MMA's accumulator; the f32 scaling and summing of in/128 block
// results adds at most (2L + 8) roundings of 2^-23 of sum |block terms|. y is e4m3 of some value
// within that of ref * scale; e4m3 rounding is monotone, so y lies between the codes of the two
// ends.
struct Expected {
  float low, high;
};
Expected expected(const Problem& p, std::int64_t r, std::int64_t o) {
  const std::int64_t groups = p.in / 128;
  double sum = 0, magnitude = 0;
  for (std::int64_t g = 0; g < groups; ++g) {
    double block = 0;
    for (std::int64_t k = g * 128; k < (g + 1) * 128; ++k) {
      block += double(decode_e4m3(p.x[std::size_t(r * p.in + k)])) *
               double(decode_e4m3(p.w[std::size_t(o * p.in + k)]));
    }
    const double term = block * p.x_scales[std::size_t(g * p.x_scale_pitch + r)] *
                        p.w_scales[std::size_t((o / 128) * p.weight_scale_pitch + g)];
    sum += term;
    magnitude += std::abs(term);
  }
  const double slack = double(2 * groups + 8) * std::ldexp(1.0, -23) * magnitude;
  const auto code = [&](double v) { return decode_e4m3(encode_e4m3(float(v * p.scale))); };
  return {code(sum - slack), code(sum + slack)};
}

struct Outputs {
  std::vector<std::uint8_t> token_major, transposed;  // [rows][pitch], [out][pitch]
  std::int64_t token_pitch, transposed_pitch;
};

Outputs run(const Problem& p) {
  DeviceBuffer x(p.x.size()), w(p.w.size()), xs(p.x_scales.size() * 4), ws(p.w_scales.size() * 4),
      work(kFp8BlockGemmWorkspaceBytes);
  x.upload(p.x.data());
  w.upload(p.w.data());
  xs.upload(p.x_scales.data());
  ws.upload(p.w_scales.data());
  Outputs o;
  o.token_pitch = p.out + 16;
  o.transposed_pitch = (p.rows + 15) / 16 * 16 + 16;
  const DeviceBuffer y(std::size_t(p.rows * o.token_pitch), kPoisonByte),
      yt(std::size_t(p.out * o.transposed_pitch), kPoisonByte);
  Fp8BlockGemmParams params;
  params.x = x.data();
  params.x_scales = xs.as<const float>();
  params.x_scale_pitch = p.x_scale_pitch;
  params.weight = w.data();
  params.weight_scales = ws.as<const float>();
  params.weight_scale_pitch = p.weight_scale_pitch;
  params.rows = p.rows;
  params.out = p.out;
  params.in = p.in;
  params.scale = p.scale;
  params.y = y.data();
  params.y_pitch = o.token_pitch;
  fp8_block_gemm(params, work.data(), work.bytes(), nullptr);
  params.transposed = true;
  params.y = yt.data();
  params.y_pitch = o.transposed_pitch;
  fp8_block_gemm(params, work.data(), work.bytes(), nullptr);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  EXPECT_TRUE(y.guards_intact());
  EXPECT_TRUE(yt.guards_intact());
  o.token_major = y.download();
  o.transposed = yt.download();
  return o;
}

void check_problem(const Problem& p) {
  const Outputs o = run(p);
  std::int64_t wrong = 0, mismatched = 0, padding = 0;
  for (std::int64_t r = 0; r < p.rows; ++r) {
    for (std::int64_t c = p.out; c < o.token_pitch; ++c) {
      padding += o.token_major[std::size_t(r * o.token_pitch + c)] != kPoisonByte;
    }
    for (std::int64_t c = 0; c < p.out; ++c) {
      const std::uint8_t code = o.token_major[std::size_t(r * o.token_pitch + c)];
      const Expected e = expected(p, r, c);
      const float value = decode_e4m3(code);
      if (!(value >= e.low && value <= e.high) && ++wrong <= 3) {
        ADD_FAILURE() << "y[" << r << ", " << c << "] is " << value << ", expected within ["
                      << e.low << ", " << e.high << "]";
      }
      mismatched += o.transposed[std::size_t(c * o.transposed_pitch + r)] != code;
    }
  }
  for (std::int64_t c = 0; c < p.out; ++c) {
    for (std::int64_t r = p.rows; r < o.transposed_pitch; ++r) {
      padding += o.transposed[std::size_t(c * o.transposed_pitch + r)] != kPoisonByte;
    }
  }
  EXPECT_EQ(wrong, 0) << "rows " << p.rows << ", out " << p.out << ", in " << p.in;
  EXPECT_EQ(mismatched, 0) << "transposed output differs from the token-major one";
  EXPECT_EQ(padding, 0) << "bytes written past the rows into the pitch padding";
}

TEST(Fp8BlockGemmCuda, KvBHalvesOfDeepSeekShapes) {
  FP8MLA_REQUIRE_HOPPER();
  // kv_b's K-nope or V half for 16 heads (out 2048, in 512), q_b-like in = 1536; row counts
  // around the 128-row tiles, odd ones included.
  const std::int64_t shapes[][3] = {{1, 2048, 512},   {5, 2048, 512},    {127, 256, 512},
                                    {130, 2048, 512}, {1000, 384, 1536}, {4099, 2048, 512}};
  std::uint64_t seed = 1;
  for (const auto& s : shapes) {
    check_problem(make_problem(s[0], s[1], s[2], 0.75f, seed++));
  }
}

TEST(Fp8BlockGemmCuda, SaturatesAtTheE4m3Max) {
  FP8MLA_REQUIRE_HOPPER();
  // A scale that pushes most outputs past 448: they saturate (satfinite), as e4m3 quantization
  // does everywhere in fp8mla.
  check_problem(make_problem(64, 256, 512, 512.0f, 7));
}

// The checks run on the host before anything touches the device (or the pointers): no GPU
// needed, and nothing can have been written.
TEST(Fp8BlockGemmCuda, RejectsBadParameters) {
  auto* base = static_cast<std::uint8_t*>(test::kFake);
  const auto good = [&] {
    Fp8BlockGemmParams p;
    p.x = base;
    p.x_scales = reinterpret_cast<const float*>(base + 65536);
    p.x_scale_pitch = 16;
    p.weight = base + 131072;
    p.weight_scales = reinterpret_cast<const float*>(base + 262144);
    p.weight_scale_pitch = 4;
    p.rows = 16;
    p.out = 256;
    p.in = 512;
    p.y = base + 393216;
    p.y_pitch = 256;
    return p;
  };
  struct Bad {
    void (*edit)(Fp8BlockGemmParams&);
    const char* needle;
  };
  const Bad cases[] = {
      {[](Fp8BlockGemmParams& p) { p.in = 500; }, "multiples of 128"},
      {[](Fp8BlockGemmParams& p) { p.out = 200; }, "multiples of 128"},
      {[](Fp8BlockGemmParams& p) { p.x_scale_pitch = 18; }, "x_scale_pitch"},
      {[](Fp8BlockGemmParams& p) { p.x_scale_pitch = 12; }, "x_scale_pitch"},
      {[](Fp8BlockGemmParams& p) { p.weight_scale_pitch = 3; }, "weight_scale_pitch"},
      {[](Fp8BlockGemmParams& p) { p.y_pitch = 240; }, "y_pitch"},
      {[](Fp8BlockGemmParams& p) { p.transposed = true, p.y_pitch = 8; }, "y_pitch"},
      {[](Fp8BlockGemmParams& p) { p.scale = std::nanf(""); }, "output scale"},
      {[](Fp8BlockGemmParams& p) { p.scale = 0.0f; }, "output scale"},
      {[](Fp8BlockGemmParams& p) { p.y = static_cast<std::uint8_t*>(p.y) + 1; }, "for y"},
      {[](Fp8BlockGemmParams& p) { p.x_scales = nullptr; }, "for x_scales"},
      {[](Fp8BlockGemmParams& p) { p.rows = -1; }, "rows >= 0"},
  };
  for (const Bad& bad : cases) {
    Fp8BlockGemmParams p = good();
    bad.edit(p);
    test::expect_error([&] { fp8_block_gemm(p, nullptr, 0, nullptr); },
                       ErrorCategory::kInvalidArgument, {"fp8_block_gemm", bad.needle});
  }
}

}  // namespace
}  // namespace fp8mla::cuda::model
