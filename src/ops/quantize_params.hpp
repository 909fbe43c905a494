// Plain parameter structs of the quantization ops: what the argument checks in quantize.cpp
// produce and what both the CPU implementation and the CUDA kernels consume.
#pragma once

#include <cstdint>

#include "fp8mla/dtype.hpp"
#include "fp8mla/numerics.hpp"
#include "fp8mla/quantize.hpp"

namespace fp8mla {

// `rows` rows of `cols` contiguous elements; row r starts at data + r * row_stride elements.
struct Rows {
  void* data = nullptr;
  DType dtype = DType::kF32;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t row_stride = 0;
  friend bool operator==(const Rows&, const Rows&) = default;
};

struct QuantizeFp8Params {
  enum class Scale { kValue, kMemory, kDynamic };
  Rows input;
  Rows out;  // e4m3 or e5m2, same rows and cols as input
  Scale scale = Scale::kValue;
  float scale_inv = 1.0f;                // kValue
  const float* scale_inv_ptr = nullptr;  // kMemory
  float* scale_out = nullptr;            // kDynamic: receives amax / fp8_max (clamped)
  friend bool operator==(const QuantizeFp8Params&, const QuantizeFp8Params&) = default;
};

struct QuantizeGroupParams {
  enum class ScaleFormat {
    kF32,          // s as f32
    kF32Pow2,      // s rounded up to a power of two, as f32
    kUe8m0,        // one exponent byte per group
    kPackedUe8m0,  // four exponent bytes per i32 word along the groups
  };
  Rows input;
  Rows out;  // e4m3, same rows and cols as input
  int group_size = 128;
  float eps = 1e-10f;
  ScaleFormat scale_format = ScaleFormat::kF32;
  void* scales = nullptr;
  // Strides of the [rows, groups] (or [rows, words] when packed) scale tensor, in its elements.
  std::int64_t scale_row_stride = 0;
  std::int64_t scale_col_stride = 0;
  friend bool operator==(const QuantizeGroupParams&, const QuantizeGroupParams&) = default;
};

struct QuantizeNvfp4Params {
  Rows input;  // bf16/f16 [M, K]
  Rows out;    // bytes [M, K/2]
  const float* global_scale = nullptr;
  Nvfp4ScaleLayout layout = Nvfp4ScaleLayout::kSwizzled128x4;
  std::uint8_t* block_scales = nullptr;
  std::int64_t scale_row_stride = 0;  // kLinear: bytes between rows of [M, K/16]
  friend bool operator==(const QuantizeNvfp4Params&, const QuantizeNvfp4Params&) = default;
};

// Byte offset of the block scale of row m, block kb in the 128x4 swizzled layout of a matrix
// with `k_blocks` blocks of 16 per row: [M/128, ceil(k_blocks/4), 32, 4, 4].
FP8MLA_HOST_DEVICE std::int64_t swizzled_scale_offset(std::int64_t m, std::int64_t kb,
                                                      std::int64_t k_blocks) {
  const std::int64_t k_tiles = (k_blocks + 3) / 4;
  return (((m / 128) * k_tiles + kb / 4) * 32 + m % 32) * 16 + ((m % 128) / 32) * 4 + kb % 4;
}

namespace cpu {
void quantize_fp8(const QuantizeFp8Params& p);
void quantize_fp8_per_token_group(const QuantizeGroupParams& p);
void quantize_nvfp4(const QuantizeNvfp4Params& p);
// quantize_nvfp4's rows and their block scales, without the swizzled layout's padding.
void quantize_nvfp4_rows(const QuantizeNvfp4Params& p);
// The padding of the 128x4 swizzled layout of a [rows, K] matrix whose first `written` rows hold
// data: blocks past K / 16 (to the 4-block tile) of those rows, and every block of rows
// rows .. round_up(rows, 128). Rows written .. rows are not touched (a padded batch's rows,
// docs/design.md section 6). quantize_nvfp4 calls it with written = rows.
void zero_swizzled_nvfp4_padding(const QuantizeNvfp4Params& p, std::int64_t rows,
                                 std::int64_t written);
}  // namespace cpu

namespace cuda {
void quantize_fp8(const QuantizeFp8Params& p, CudaStream stream);
void quantize_fp8_per_token_group(const QuantizeGroupParams& p, CudaStream stream);
void quantize_nvfp4(const QuantizeNvfp4Params& p, CudaStream stream);
}  // namespace cuda

}  // namespace fp8mla
