// CPU implementations of the quantization ops: the reference the CUDA kernels must equal bit for
// bit. Each mirrors the arithmetic of fp8mla/quantize.hpp exactly in fp32.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "cpu/element_io.hpp"
#include "cpu/parallel_for.hpp"
#include "ops/quantize_params.hpp"

namespace fp8mla::cpu {
namespace {

constexpr std::int64_t kRowGrain = 256;

const char* row_ptr(const Rows& r, std::int64_t row) {
  return static_cast<const char*>(r.data) + row * r.row_stride * dtype_size(r.dtype);
}
char* row_ptr_mut(const Rows& r, std::int64_t row) {
  return static_cast<char*>(r.data) + row * r.row_stride * dtype_size(r.dtype);
}

// max |x| over the input, NaNs ignored.
float input_amax(const Rows& in) {
  std::mutex mutex;
  float amax = 0.0f;
  parallel_for(in.rows, kRowGrain, [&](std::int64_t begin, std::int64_t end) {
    float local = 0.0f;
    for (std::int64_t r = begin; r < end; ++r) {
      const char* row = row_ptr(in, r);
      for (std::int64_t c = 0; c < in.cols; ++c)
        local = max_magnitude(local, load_f32(row, in.dtype, c));
    }
    std::lock_guard lock(mutex);
    amax = max_magnitude(amax, local);
  });
  return amax;
}

}  // namespace

void quantize_fp8(const QuantizeFp8Params& p) {
  float scale_inv = p.scale_inv;
  if (p.scale == QuantizeFp8Params::Scale::kMemory) scale_inv = *p.scale_inv_ptr;
  if (p.scale == QuantizeFp8Params::Scale::kDynamic) {
    const float scale = std::fmax(input_amax(p.input) / fp8_max(p.out.dtype), kMinDynamicScale);
    scale_inv = 1.0f / scale;
    *p.scale_out = scale;
  }
  parallel_for(p.input.rows, kRowGrain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t r = begin; r < end; ++r) {
      const char* in = row_ptr(p.input, r);
      auto* out = reinterpret_cast<std::uint8_t*>(row_ptr_mut(p.out, r));
      for (std::int64_t c = 0; c < p.input.cols; ++c) {
        out[c] = encode_fp8(load_f32(in, p.input.dtype, c) * scale_inv, p.out.dtype);
      }
    }
  });
}

void quantize_fp8_per_token_group(const QuantizeGroupParams& p) {
  using Format = QuantizeGroupParams::ScaleFormat;
  const std::int64_t groups = p.input.cols / p.group_size;
  parallel_for(p.input.rows, kRowGrain / 4, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t r = begin; r < end; ++r) {
      const char* in = row_ptr(p.input, r);
      auto* out = reinterpret_cast<std::uint8_t*>(row_ptr_mut(p.out, r));
      std::uint32_t packed_word = 0;
      for (std::int64_t g = 0; g < groups; ++g) {
        const std::int64_t c0 = g * p.group_size;
        float amax = p.eps;
        for (int i = 0; i < p.group_size; ++i) {
          amax = max_magnitude(amax, load_f32(in, p.input.dtype, c0 + i));
        }
        float s = amax / kE4M3Max;
        const std::uint8_t exponent = encode_ue8m0(s);
        if (p.scale_format != Format::kF32) s = decode_ue8m0(exponent);
        for (int i = 0; i < p.group_size; ++i) {
          out[c0 + i] = encode_e4m3(load_f32(in, p.input.dtype, c0 + i) / s);
        }
        const std::int64_t at = r * p.scale_row_stride;
        switch (p.scale_format) {
          case Format::kF32:
          case Format::kF32Pow2:
            static_cast<float*>(p.scales)[at + g * p.scale_col_stride] = s;
            break;
          case Format::kUe8m0:
            static_cast<std::uint8_t*>(p.scales)[at + g * p.scale_col_stride] = exponent;
            break;
          case Format::kPackedUe8m0:
            packed_word |= std::uint32_t(exponent) << (8 * (g % 4));
            if (g % 4 == 3 || g + 1 == groups) {  // last group of the word: bytes past it stay 0
              static_cast<std::uint32_t*>(p.scales)[at + (g / 4) * p.scale_col_stride] =
                  packed_word;
              packed_word = 0;
            }
            break;
        }
      }
    }
  });
}

void quantize_nvfp4_rows(const QuantizeNvfp4Params& p) {
  const std::int64_t k_blocks = p.input.cols / 16;
  const float global_scale = *p.global_scale;
  const float inv_global_scale = 1.0f / global_scale;
  parallel_for(p.input.rows, kRowGrain / 4, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t r = begin; r < end; ++r) {
      const char* in = row_ptr(p.input, r);
      auto* out = reinterpret_cast<std::uint8_t*>(row_ptr_mut(p.out, r));
      for (std::int64_t kb = 0; kb < k_blocks; ++kb) {
        float x[16];
        float amax = 0.0f;
        for (int i = 0; i < 16; ++i) {
          x[i] = load_f32(in, p.input.dtype, kb * 16 + i);
          amax = max_magnitude(amax, x[i]);
        }
        const std::uint8_t sf = encode_e4m3(global_scale * (amax / kE2M1Max));
        const float sf_value = decode_e4m3(sf);
        const float inv = sf_value == 0.0f ? 0.0f : 1.0f / (sf_value * inv_global_scale);
        for (int i = 0; i < 16; i += 2) {
          out[kb * 8 + i / 2] =
              std::uint8_t(encode_e2m1(x[i] * inv) | (encode_e2m1(x[i + 1] * inv) << 4));
        }
        const std::int64_t at = p.layout == Nvfp4ScaleLayout::kLinear
                                    ? r * p.scale_row_stride + kb
                                    : swizzled_scale_offset(r, kb, k_blocks);
        p.block_scales[at] = sf;
      }
    }
  });
}

void quantize_nvfp4(const QuantizeNvfp4Params& p) {
  quantize_nvfp4_rows(p);
  if (p.layout == Nvfp4ScaleLayout::kSwizzled128x4) {
    zero_swizzled_nvfp4_padding(p, p.input.rows, p.input.rows);
  }
}

void zero_swizzled_nvfp4_padding(const QuantizeNvfp4Params& p, std::int64_t rows,
                                 std::int64_t written) {
  const std::int64_t k_blocks = p.input.cols / 16;
  const std::int64_t padded_rows = (rows + 127) / 128 * 128;
  const std::int64_t padded_blocks = (k_blocks + 3) / 4 * 4;
  const auto zero = [&](std::int64_t r, std::int64_t from_block) {
    for (std::int64_t kb = from_block; kb < padded_blocks; ++kb) {
      p.block_scales[swizzled_scale_offset(r, kb, k_blocks)] = 0;
    }
  };
  for (std::int64_t r = 0; r < written; ++r) zero(r, k_blocks);
  for (std::int64_t r = rows; r < padded_rows; ++r) zero(r, 0);
}

}  // namespace fp8mla::cpu
