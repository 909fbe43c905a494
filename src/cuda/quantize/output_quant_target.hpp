// Where a fused output quantization writes, as the CUDA kernels that fuse it read it (the merge of
// attention states and the prefill epilogue): the o_proj input rows [T, W] and their scales, built
// on the host from the op's OutputQuantParams (ops/output_quant_params.hpp). Plain data, passed
// by value in kernel parameters.
#pragma once

#include <cstdint>

#include "fp8mla/output_quant.hpp"
#include "ops/output_quant_params.hpp"

namespace fp8mla::cuda {

// A per-token-group scale tensor, [rows, groups] ([rows, words] when packed): strides in its
// elements.
struct GroupScales {
  void* data = nullptr;
  std::int64_t row_stride = 0, col_stride = 0;
  QuantizeGroupParams::ScaleFormat format = QuantizeGroupParams::ScaleFormat::kF32;
  std::uint32_t groups_per_row = 0;
};

struct OutputQuantTarget {
  OutputQuantKey key = OutputQuantKey::kNone;
  std::uint8_t* out = nullptr;      // e4m3 bytes, or e2m1x2 bytes (two values each)
  std::int64_t out_row_stride = 0;  // bytes between rows
  std::int64_t rows = 0;            // T
  std::int64_t width = 0;           // W, values a row
  const float* scale = nullptr;     // fp8_static: the scale_inv; nvfp4: the global scale
  GroupScales group;                // fp8_group128, fp8_group64
  int group_size = 128;
  float eps = 0.0f;
  std::uint8_t* block_scales = nullptr;     // nvfp4
  std::int64_t block_scale_row_stride = 0;  // nvfp4 linear layout
  bool swizzled = false;  // nvfp4 128x4 layout: rows T .. round_up(T, 128) are padding
};

inline OutputQuantTarget output_quant_target(const OutputQuantParams& p) {
  OutputQuantTarget t;
  t.key = p.key;
  switch (p.key) {
    case OutputQuantKey::kNone:
      return t;
    case OutputQuantKey::kFp8Static:
      t.out = static_cast<std::uint8_t*>(p.fp8.out.data);
      t.out_row_stride = p.fp8.out.row_stride;
      t.rows = p.fp8.out.rows;
      t.width = p.fp8.out.cols;
      t.scale = p.fp8.scale_inv_ptr;
      return t;
    case OutputQuantKey::kFp8Group128:
    case OutputQuantKey::kFp8Group64:
      t.out = static_cast<std::uint8_t*>(p.group.out.data);
      t.out_row_stride = p.group.out.row_stride;
      t.rows = p.group.out.rows;
      t.width = p.group.out.cols;
      t.group = {p.group.scales, p.group.scale_row_stride, p.group.scale_col_stride,
                 p.group.scale_format, std::uint32_t(t.width / p.group.group_size)};
      t.group_size = p.group.group_size;
      t.eps = p.group.eps;
      return t;
    case OutputQuantKey::kNvfp4:
      t.out = static_cast<std::uint8_t*>(p.nvfp4.out.data);
      t.out_row_stride = p.nvfp4.out.row_stride;
      t.rows = p.nvfp4.out.rows;
      t.width = p.nvfp4.out.cols * 2;
      t.scale = p.nvfp4.global_scale;
      t.block_scales = p.nvfp4.block_scales;
      t.block_scale_row_stride = p.nvfp4.scale_row_stride;
      t.swizzled = p.nvfp4.layout == Nvfp4ScaleLayout::kSwizzled128x4;
      return t;
  }
  return t;
}

}  // namespace fp8mla::cuda
