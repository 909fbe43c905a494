// The dense math of the MLA layer's CPU backend: f32 GEMM with bf16 output (as a BF16 GEMM with
// f32 accumulation rounds it), RMSNorm, and the bf16 RoPE of the BF16 attention path. Threaded
// over rows; inputs and outputs are contiguous row-major bf16 bits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <vector>

#include "fp8mla/mla_weights.hpp"
#include "model/fp8_gemm_rule.hpp"

namespace fp8mla::model {

// A projection's weight as f32 [out, in]: bf16 widened, or e4m3 times its block scale.
std::vector<float> dequantize(const MlaProjection& projection);

// Whether a projection runs as DeepSeek's FP8 GEMM, its input quantized per token and group of
// 128 (fp8_gemm_rule.hpp: the CUDA layer's rule too). Other e4m3 weights (small test configs)
// run as a bf16 GEMM on the dequantized weight.
inline bool quantizes_input(const MlaProjection& projection) {
  return projection.weight.dtype() == DType::kE4M3 &&
         fp8_gemm_shape(projection.weight.size(0), projection.weight.size(1));
}

// For four rows of x stored interleaved (x[i * 4 + j], T float or double) and w f32 [out, in]:
// store(j, o, sum_i x[j][i] * w[o, i]) for the first `rows` rows. Each sum runs over i in order,
// one product added at a time, so the bytes do not depend on the blocking: 32 / sizeof(T)
// outputs of the four rows at once, each weight value multiplying the four rows as one vector
// (GCC's and Clang's vector type, whose arithmetic is per element) while the adds of the
// independent sums overlap.
template <typename T, typename Store>
void gemm_four_rows(const T* x, std::int64_t in, const float* w, std::int64_t out,
                    std::int64_t rows, const Store& store) {
  typedef T Four
      __attribute__((vector_size(4 * sizeof(T))));  // (`using` drops it for a dependent T)
  constexpr std::int64_t kOutputs = 32 / sizeof(T);
  for (std::int64_t o0 = 0; o0 < out; o0 += kOutputs) {
    const std::int64_t outputs = std::min(kOutputs, out - o0);
    const float* wr[kOutputs];
    for (std::int64_t k = 0; k < kOutputs; ++k)
      wr[k] = w + (o0 + std::min(k, outputs - 1)) * in;  // past out: a row again, unused
    Four acc[kOutputs] = {};
    for (std::int64_t i = 0; i < in; ++i) {
      Four xi;
      std::memcpy(&xi, x + i * 4, sizeof xi);
      for (std::int64_t k = 0; k < kOutputs; ++k) acc[k] += xi * T(wr[k][i]);
    }
    for (std::int64_t j = 0; j < rows; ++j) {
      for (std::int64_t k = 0; k < outputs; ++k) store(j, o0 + k, acc[k][j]);
    }
  }
}

// y[t, o] = bf16(sum_i x[t, i] * w[o, i]); x bf16 [rows, in], w f32 [out, in]. With fp8_input,
// x is first quantized to e4m3 per token and group of 128 (in % 128 == 0) and used dequantized,
// as the FP8 GEMM of e4m3 weights sees it.
void linear(std::span<const std::uint16_t> x, std::int64_t rows, std::int64_t in,
            std::span<const float> w, std::int64_t out, std::span<std::uint16_t> y,
            bool fp8_input = false);

// The same with each f32 sum handed to store(t, o, sum) instead of rounded to bf16 (outputs in
// other formats or layouts; called from several threads, each (t, o) once).
using LinearStore = std::function<void(std::int64_t t, std::int64_t o, float sum)>;
void linear(std::span<const std::uint16_t> x, std::int64_t rows, std::int64_t in,
            std::span<const float> w, std::int64_t out, const LinearStore& store,
            bool fp8_input = false);

// The same on an input quantized already: x = e4m3 xq [rows, in] times its group-128 scales
// xs f32 [rows, in / 128] (row-major), as linear(fp8_input) uses its own quantization.
void linear_fp8(std::span<const std::uint8_t> xq, std::span<const float> xs, std::int64_t rows,
                std::int64_t in, std::span<const float> w, std::int64_t out,
                std::span<std::uint16_t> y);

// y = bf16(x / sqrt(mean(x^2) + eps) * w) per row of `width` elements, rows `stride` apart in x.
void rms_norm(const std::uint16_t* x, std::int64_t rows, std::int64_t width, std::int64_t stride,
              const TensorView& weight, double eps, std::uint16_t* y);

// In place on bf16 rows of kMlaRopeDim elements: interleaved RoPE with cos_sin row `position`
// (f32 [max_pos, 64], fp8mla::make_cos_sin_cache), computed as mla_rope_quantize_fp8 does, then
// rounded to bf16.
void rope_bf16(std::uint16_t* x, const float* cos_sin_row);

// max |x| over `rows` rows of `cols` bf16 elements, rows `stride` apart; NaN when one is NaN (the
// magnitude bits order like the values and a NaN's lie above infinity's, so the max is taken on
// the bits, as the CUDA layer's amax kernel does); 0 for no element.
float amax_bf16(const std::uint16_t* x, std::int64_t rows, std::int64_t cols, std::int64_t stride);

}  // namespace fp8mla::model
