// Reading input elements as fp32 and writing FP8 codes, by runtime dtype, for the CPU ops.
#pragma once

#include <cmath>
#include <cstdint>

#include "fp8mla/dtype.hpp"
#include "fp8mla/numerics.hpp"

namespace fp8mla::cpu {

// Element i of a bf16, f16 or f32 array, exactly as fp32.
inline float load_f32(const void* data, DType dtype, std::int64_t i) {
  switch (dtype) {
    case DType::kBF16:
      return decode_bf16(static_cast<const std::uint16_t*>(data)[i]);
    case DType::kF16:
      return decode_f16(static_cast<const std::uint16_t*>(data)[i]);
    default:
      return static_cast<const float*>(data)[i];
  }
}

inline std::uint8_t encode_fp8(float x, DType dtype) {
  return dtype == DType::kE5M2 ? encode_e5m2(x) : encode_e4m3(x);
}

// max(running, |x|) ignoring NaN, quiet or signalling (std::fmax returns NaN for a signalling
// one), as the GPU's fmaxf does. `running` is never NaN.
inline float max_magnitude(float running, float x) {
  const float a = std::fabs(x);
  return a > running ? a : running;
}

inline float fp8_max(DType dtype) {
  return dtype == DType::kE5M2 ? kE5M2Max : kE4M3Max;
}

}  // namespace fp8mla::cpu
