#include "model/cpu_math.hpp"

#include <algorithm>
#include <cmath>

#include "cpu/parallel_for.hpp"
#include "fp8mla/numerics.hpp"
#include "fp8mla/quantize.hpp"

namespace fp8mla::model {

std::vector<float> dequantize(const MlaProjection& projection) {
  const TensorView& w = projection.weight;
  const std::int64_t out = w.size(0), in = w.size(1);
  std::vector<float> f(std::size_t(out * in));
  if (w.dtype() == DType::kBF16) {
    for (std::int64_t i = 0; i < out * in; ++i)
      f[std::size_t(i)] = decode_bf16(w.data_as<std::uint16_t>()[i]);
    return f;
  }
  const TensorView& s = projection.scale_inv;
  for (std::int64_t r = 0; r < out; ++r) {
    for (std::int64_t c = 0; c < in; ++c) {
      const float scale = s.data_as<float>()[(r / kWeightBlock) * s.size(1) + c / kWeightBlock];
      f[std::size_t(r * in + c)] = decode_e4m3(w.data_as<std::uint8_t>()[r * in + c]) * scale;
    }
  }
  return f;
}

namespace {

// store(t, o, sum_i x[t, i] * w[o, i]), row t of x given in f32 by load(t, row); four rows at a
// time through gemm_four_rows.
template <typename LoadRow>
void linear_rows(std::int64_t rows, std::int64_t in, std::span<const float> w, std::int64_t out,
                 const LinearStore& store, const LoadRow& load) {
  cpu::parallel_for((rows + 3) / 4, 1, [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> row(static_cast<std::size_t>(in));
    std::vector<float> x(static_cast<std::size_t>(in * 4));  // x[i * 4 + j]
    for (std::int64_t b = begin; b < end; ++b) {
      const std::int64_t t0 = b * 4, tokens = std::min<std::int64_t>(4, rows - t0);
      for (std::int64_t j = 0; j < 4; ++j) {
        if (j < tokens) load(t0 + j, row.data());  // past the rows: the last row again, unused
        for (std::int64_t i = 0; i < in; ++i) x[std::size_t(i * 4 + j)] = row[std::size_t(i)];
      }
      gemm_four_rows(x.data(), in, w.data(), out, tokens,
                     [&](std::int64_t j, std::int64_t o, float v) { store(t0 + j, o, v); });
    }
  });
}

LinearStore bf16_rows(std::span<std::uint16_t> y, std::int64_t out) {
  return [y, out](std::int64_t t, std::int64_t o, float v) {
    y[std::size_t(t * out + o)] = encode_bf16(v);
  };
}

// store(t, o, sum) of e4m3 xq [rows, in] times its group-128 scales xs [rows, in / 128].
void linear_e4m3_input(std::span<const std::uint8_t> xq, std::span<const float> xs,
                       std::int64_t rows, std::int64_t in, std::span<const float> w,
                       std::int64_t out, const LinearStore& store) {
  const std::int64_t groups = in / kWeightBlock;
  linear_rows(rows, in, w, out, store, [&](std::int64_t t, float* xf) {
    for (std::int64_t i = 0; i < in; ++i) {
      xf[i] =
          decode_e4m3(xq[std::size_t(t * in + i)]) * xs[std::size_t(t * groups + i / kWeightBlock)];
    }
  });
}

}  // namespace

void linear(std::span<const std::uint16_t> x, std::int64_t rows, std::int64_t in,
            std::span<const float> w, std::int64_t out, std::span<std::uint16_t> y,
            bool fp8_input) {
  linear(x, rows, in, w, out, bf16_rows(y, out), fp8_input);
}

void linear(std::span<const std::uint16_t> x, std::int64_t rows, std::int64_t in,
            std::span<const float> w, std::int64_t out, const LinearStore& store, bool fp8_input) {
  if (!fp8_input) {
    linear_rows(rows, in, w, out, store, [&](std::int64_t t, float* xf) {
      for (std::int64_t i = 0; i < in; ++i) xf[i] = decode_bf16(x[std::size_t(t * in + i)]);
    });
    return;
  }
  if (rows == 0) return;
  // An FP8 GEMM's input: e4m3 per token and group of 128 (the op the CUDA layer runs).
  std::vector<std::uint8_t> xq(std::size_t(rows * in));
  std::vector<float> xs(std::size_t(rows * (in / kWeightBlock)));
  quantize_fp8_per_token_group(
      TensorView(const_cast<std::uint16_t*>(x.data()), DType::kBF16, {rows, in}),
      TensorView(xq.data(), DType::kE4M3, {rows, in}),
      TensorView(xs.data(), DType::kF32, {rows, in / kWeightBlock}),
      GroupQuantOptions{.group_size = int(kWeightBlock)});
  linear_e4m3_input(xq, xs, rows, in, w, out, store);
}

void linear_fp8(std::span<const std::uint8_t> xq, std::span<const float> xs, std::int64_t rows,
                std::int64_t in, std::span<const float> w, std::int64_t out,
                std::span<std::uint16_t> y) {
  linear_e4m3_input(xq, xs, rows, in, w, out, bf16_rows(y, out));
}

void rms_norm(const std::uint16_t* x, std::int64_t rows, std::int64_t width, std::int64_t stride,
              const TensorView& weight, double eps, std::uint16_t* y) {
  for (std::int64_t t = 0; t < rows; ++t) {
    const std::uint16_t* row = x + t * stride;
    float sum = 0.0f;
    for (std::int64_t i = 0; i < width; ++i) sum += decode_bf16(row[i]) * decode_bf16(row[i]);
    const float inv = 1.0f / std::sqrt(sum / float(width) + float(eps));
    for (std::int64_t i = 0; i < width; ++i) {
      y[t * width + i] =
          encode_bf16(decode_bf16(row[i]) * inv * decode_bf16(weight.data_as<std::uint16_t>()[i]));
    }
  }
}

void rope_bf16(std::uint16_t* x, const float* cos_sin_row) {
  constexpr int kHalf = kMlaRopeDim / 2;
  for (int i = 0; i < kHalf; ++i) {
    const float a = decode_bf16(x[2 * i]), b = decode_bf16(x[2 * i + 1]);
    const float c = cos_sin_row[i], s = cos_sin_row[kHalf + i];
    x[2 * i] = encode_bf16(std::fma(a, c, -(b * s)));
    x[2 * i + 1] = encode_bf16(std::fma(b, c, a * s));
  }
}

float amax_bf16(const std::uint16_t* x, std::int64_t rows, std::int64_t cols, std::int64_t stride) {
  std::uint16_t bits = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c)
      bits = std::max(bits, std::uint16_t(x[r * stride + c] & 0x7fffu));
  }
  return decode_bf16(bits);
}

}  // namespace fp8mla::model
