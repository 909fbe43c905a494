// Which of the layer's projections run as DeepSeek's FP8 GEMM: e4m3 weights with 128 x 128 block
// scales, the input quantized per token and group of 128. Both layers decide by this rule (the
// CUDA layer's cuBLASLt plan and the CPU layer, its reference), so that they quantize the same
// inputs; other e4m3 weights run as a bf16 GEMM on the dequantized weight.
#pragma once

#include <cstdint>

#include "fp8mla/mla_weights.hpp"

namespace fp8mla::model {

// cuBLASLt's fp8 kernels write 16-byte aligned bf16 output rows (cuBLAS docs 3.4.17).
inline constexpr std::int64_t kFp8GemmOutMultiple = 8;

inline bool fp8_gemm_shape(std::int64_t out, std::int64_t in) {
  return in % kWeightBlock == 0 && out % kFp8GemmOutMultiple == 0;
}

}  // namespace fp8mla::model
