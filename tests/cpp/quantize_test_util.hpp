// The test cases of the three quantization ops and the sweeps the CPU and CUDA tests share.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "buffer_test_util.hpp"
#include "fp8mla/quantize.hpp"

namespace fp8mla::test {

// ---- Test cases of the three ops ---------------------------------------------------------------
// Each case lists its buffers (specs()[0] is the input, the rest outputs or scalar inputs), writes
// its inputs into host buffers (init) and runs its op on views over given buffers (run), so that
// the CPU and CUDA tests build identical calls.

enum class Fp8Scale { kValue, kMemory, kDynamic };

struct Fp8Case {
  DType in_dtype = DType::kBF16;
  DType out_dtype = DType::kE4M3;
  std::vector<std::int64_t> shape;  // of input and out
  std::int64_t in_pad = 0;          // the input's allocation is in_pad columns wider
  std::int64_t in_offset = 0;       // and the view starts in_offset columns in
  std::int64_t out_pad = 0;         // out rows are cols + out_pad apart
  Fp8Scale scale = Fp8Scale::kValue;
  float scale_inv = 1.0f;  // kValue and kMemory
  Data data = Data::kRandom;
  std::uint64_t seed = 1;

  // input, out, and the f32 scalar (scale_inv read, or dynamic scale written; shape [] or [1]).
  std::vector<Spec> specs() const {
    return {
        padded(in_dtype, shape, in_pad, in_offset), padded(out_dtype, shape, out_pad),
        dense(DType::kF32, seed % 2 ? std::vector<std::int64_t>{1} : std::vector<std::int64_t>{})};
  }
  void init(std::vector<HostBuffer>& buffers) const {
    fill_input(buffers[0].data(), in_dtype, specs()[0].buffer_elems, data, seed);
    if (scale == Fp8Scale::kMemory) std::memcpy(buffers[2].data(), &scale_inv, sizeof(float));
  }
  void run(std::span<void* const> bases, Device device, CudaStream stream = nullptr) const {
    const std::vector<Spec> s = specs();
    const TensorView in = s[0].view(bases[0], device), out = s[1].view(bases[1], device);
    const TensorView scalar = s[2].view(bases[2], device);
    switch (scale) {
      case Fp8Scale::kValue:
        quantize_fp8(in, out, scale_inv, stream);
        break;
      case Fp8Scale::kMemory:
        quantize_fp8(in, out, scalar, stream);
        break;
      case Fp8Scale::kDynamic:
        quantize_fp8_dynamic(in, out, scalar, stream);
        break;
    }
  }
  std::string describe() const {
    const char* scales[] = {"static by value", "static from memory", "dynamic"};
    return concat("quantize_fp8 ", dtype_name(in_dtype), shape_string(shape), " (pad ", in_pad,
                  ", offset ", in_offset, ") -> ", dtype_name(out_dtype), " (pad ", out_pad, "), ",
                  scales[int(scale)], " scale_inv ", scale_inv, ", ", data_name(data), " seed ",
                  seed);
  }
};

enum class ScaleLayout {
  kF32RowMajor,         // (G, 1)
  kF32ColMajor,         // (1, M)
  kF32TmaColMajor,      // (1, round_up(M, 4))
  kF32Pow2RowMajor,     // round_scale_to_pow2
  kF32Pow2TmaColMajor,  // round_scale_to_pow2
  kUe8m0RowMajor,
  kUe8m0ColMajor,
  kPackedRowMajor,     // i32 [M, ceil(G / 4)]
  kPackedTmaColMajor,  // i32 with strides (1, round_up(M, 4))
};

inline constexpr ScaleLayout kAllScaleLayouts[] = {
    ScaleLayout::kF32RowMajor,        ScaleLayout::kF32ColMajor,
    ScaleLayout::kF32TmaColMajor,     ScaleLayout::kF32Pow2RowMajor,
    ScaleLayout::kF32Pow2TmaColMajor, ScaleLayout::kUe8m0RowMajor,
    ScaleLayout::kUe8m0ColMajor,      ScaleLayout::kPackedRowMajor,
    ScaleLayout::kPackedTmaColMajor};

inline const char* layout_name(ScaleLayout layout) {
  const char* names[] = {
      "f32 row-major",      "f32 column-major",          "f32 TMA column-major",
      "f32 pow2 row-major", "f32 pow2 TMA column-major", "ue8m0 row-major",
      "ue8m0 column-major", "packed i32 row-major",      "packed i32 TMA column-major"};
  return names[int(layout)];
}

struct GroupCase {
  DType in_dtype = DType::kBF16;
  std::vector<std::int64_t> shape;  // of input and out
  std::int64_t in_pad = 0;
  std::int64_t in_offset = 0;
  std::int64_t out_pad = 0;
  int group_size = 128;
  ScaleLayout layout = ScaleLayout::kF32RowMajor;
  float eps = 1e-10f;
  Data data = Data::kRandom;
  std::uint64_t seed = 1;

  std::int64_t rows() const { return rows_of(shape); }
  std::int64_t groups() const { return shape.back() / group_size; }
  bool packed() const {
    return layout == ScaleLayout::kPackedRowMajor || layout == ScaleLayout::kPackedTmaColMajor;
  }
  DType scale_dtype() const {
    if (packed()) return DType::kI32;
    return layout == ScaleLayout::kUe8m0RowMajor || layout == ScaleLayout::kUe8m0ColMajor
               ? DType::kUE8M0
               : DType::kF32;
  }
  bool f32_pow2() const {
    return layout == ScaleLayout::kF32Pow2RowMajor || layout == ScaleLayout::kF32Pow2TmaColMajor;
  }
  // Scales rounded up to powers of two: UE8M0 storage, or f32 with round_scale_to_pow2.
  bool pow2() const { return scale_dtype() != DType::kF32 || f32_pow2(); }
  GroupQuantOptions options() const { return {group_size, eps, f32_pow2()}; }
  Spec scales() const {
    const std::int64_t m = rows(), width = packed() ? (groups() + 3) / 4 : groups();
    // With 0 rows the column stride is 1, as torch strides an empty dim (stride 0 is the separate
    // QuantizeArgs.ZeroRowsColumnMajorScales case).
    switch (layout) {
      case ScaleLayout::kF32ColMajor:
      case ScaleLayout::kUe8m0ColMajor:
        return {scale_dtype(), {m, width}, {1, std::max<std::int64_t>(m, 1)}, 0, m * width};
      case ScaleLayout::kF32TmaColMajor:
      case ScaleLayout::kF32Pow2TmaColMajor:
      case ScaleLayout::kPackedTmaColMajor: {
        const std::int64_t ld = round_up(m, 4);  // 16-byte aligned columns
        return {scale_dtype(), {m, width}, {1, std::max<std::int64_t>(ld, 1)}, 0, ld * width};
      }
      default:
        return dense(scale_dtype(), {m, width});
    }
  }

  std::vector<Spec> specs() const {
    return {padded(in_dtype, shape, in_pad, in_offset), padded(DType::kE4M3, shape, out_pad),
            scales()};
  }
  void init(std::vector<HostBuffer>& buffers) const {
    fill_input(buffers[0].data(), in_dtype, specs()[0].buffer_elems, data, seed);
  }
  void run(std::span<void* const> bases, Device device, CudaStream stream = nullptr) const {
    const std::vector<Spec> s = specs();
    quantize_fp8_per_token_group(s[0].view(bases[0], device), s[1].view(bases[1], device),
                                 s[2].view(bases[2], device), options(), stream);
  }
  std::string describe() const {
    return concat("quantize_fp8_per_token_group ", dtype_name(in_dtype), shape_string(shape),
                  " (pad ", in_pad, ", offset ", in_offset, ") -> out pad ", out_pad, ", group ",
                  group_size, ", scales ", layout_name(layout), ", eps ", eps, ", ",
                  data_name(data), " seed ", seed);
  }
};

enum class Nvfp4Scales { kSwizzled5d, kSwizzled2d, kLinear };

struct Nvfp4Case {
  DType in_dtype = DType::kBF16;
  std::vector<std::int64_t> shape;  // of the input; out has the last dim halved
  std::int64_t in_pad = 0;
  std::int64_t in_offset = 0;
  std::int64_t out_pad = 0;
  Nvfp4Scales scales = Nvfp4Scales::kSwizzled5d;
  std::int64_t scale_pad = 0;  // kLinear: scale rows are K/16 + scale_pad apart
  float global_scale = 1.0f;
  Data data = Data::kRandom;
  std::uint64_t seed = 1;

  std::int64_t rows() const { return rows_of(shape); }
  std::int64_t k_blocks() const { return shape.back() / 16; }
  Nvfp4ScaleLayout layout() const {
    return scales == Nvfp4Scales::kLinear ? Nvfp4ScaleLayout::kLinear
                                          : Nvfp4ScaleLayout::kSwizzled128x4;
  }

  // input, out, block_scales, global_scale.
  std::vector<Spec> specs() const {
    const std::int64_t m_tiles = (rows() + 127) / 128, k_tiles = (k_blocks() + 3) / 4;
    Spec block_scales = scales == Nvfp4Scales::kSwizzled5d
                            ? dense(DType::kE4M3, {m_tiles, k_tiles, 32, 4, 4})
                        : scales == Nvfp4Scales::kSwizzled2d
                            ? dense(DType::kE4M3, {m_tiles * 128, k_tiles * 4})
                            : padded(DType::kE4M3, {rows(), k_blocks()}, scale_pad);
    return {
        padded(in_dtype, shape, in_pad, in_offset),
        padded(DType::kE2M1x2, with_last(shape, shape.back() / 2), out_pad),
        std::move(block_scales),
        dense(DType::kF32, seed % 2 ? std::vector<std::int64_t>{1} : std::vector<std::int64_t>{})};
  }
  void init(std::vector<HostBuffer>& buffers) const {
    fill_input(buffers[0].data(), in_dtype, specs()[0].buffer_elems, data, seed);
    std::memcpy(buffers[3].data(), &global_scale, sizeof(float));
  }
  void run(std::span<void* const> bases, Device device, CudaStream stream = nullptr) const {
    const std::vector<Spec> s = specs();
    quantize_nvfp4(s[0].view(bases[0], device), s[1].view(bases[1], device),
                   s[2].view(bases[2], device), s[3].view(bases[3], device), layout(), stream);
  }
  std::string describe() const {
    const char* names[] = {"swizzled 5-d", "swizzled 2-d", "linear"};
    return concat("quantize_nvfp4 ", dtype_name(in_dtype), shape_string(shape), " (pad ", in_pad,
                  ", offset ", in_offset, ") -> out pad ", out_pad, ", scales ", names[int(scales)],
                  " (pad ", scale_pad, "), global_scale ", global_scale, ", ", data_name(data),
                  " seed ", seed);
  }
};

// ---- The sweeps the CPU and CUDA tests share --------------------------------------------------

// The row counts of the sweeps: none, one, odd counts, and past 1024.
inline constexpr std::int64_t kRows[] = {0, 1, 3, 7, 17, 1025};

// `c` with its input rows `in_pad` elements wider and read from `in_offset` in, and its out rows
// `out_pad` elements wider.
template <typename Case>
Case with_padding(Case c, std::int64_t in_pad, std::int64_t in_offset, std::int64_t out_pad) {
  c.in_pad = in_pad;
  c.in_offset = in_offset;
  c.out_pad = out_pad;
  return c;
}

// A per-tensor case of the dtype, shape and scale-mode sweep.
inline Fp8Case fp8_sweep_case(DType in_dtype, DType out_dtype, std::int64_t rows, std::int64_t cols,
                              Fp8Scale scale, std::uint64_t seed) {
  const float scale_invs[] = {1.0f, 0.37f, 3.0f, 1.0f / 1024.0f, 300.0f};
  Fp8Case c;
  c.in_dtype = in_dtype;
  c.out_dtype = out_dtype;
  c.shape = {rows, cols};
  c.scale = scale;
  c.scale_inv = scale_invs[seed % 5];
  c.data = seed % 2 ? Data::kAdversarial : Data::kRandom;
  c.seed = seed;
  return c;
}

// A per-tensor case over an N-d `shape` of adversarial data (the caller pads its rows).
inline Fp8Case fp8_strided_case(std::vector<std::int64_t> shape, Fp8Scale scale,
                                std::uint64_t seed) {
  Fp8Case c;
  c.in_dtype = DType(seed % 3);  // bf16, f16, f32 in turn
  c.out_dtype = seed % 2 ? DType::kE5M2 : DType::kE4M3;
  c.shape = std::move(shape);
  c.scale = scale;
  c.scale_inv = 0.75f;
  c.data = Data::kAdversarial;
  c.seed = seed;
  return c;
}

// A per-token-group case of the scale-layout and width sweep.
inline GroupCase group_sweep_case(ScaleLayout layout, std::int64_t rows, std::int64_t cols,
                                  int group_size, std::uint64_t seed) {
  GroupCase c;
  c.in_dtype = DType(seed % 3);  // bf16, f16, f32 in turn
  c.shape = {rows, cols};
  c.group_size = group_size;
  c.layout = layout;
  c.eps = seed % 5 == 0 ? 1e-4f : 1e-10f;
  c.data = seed % 2 ? Data::kAdversarial : Data::kRandom;
  c.seed = seed;
  return c;
}

// A per-token-group case over `shape` of adversarial data; a 3-d shape is kv[..., 128:] of
// [T, H, 256]; out rows 16 elements wider.
inline GroupCase group_strided_case(ScaleLayout layout, std::vector<std::int64_t> shape,
                                    int group_size, std::uint64_t seed) {
  const std::int64_t in_pad = shape.size() == 3 ? 128 : 0;
  GroupCase c = with_padding(GroupCase{}, in_pad, in_pad, 16);
  c.in_dtype = DType(seed % 3);
  c.shape = std::move(shape);
  c.group_size = group_size;
  c.layout = layout;
  c.data = Data::kAdversarial;
  c.seed = seed;
  return c;
}

inline constexpr Nvfp4Scales kAllNvfp4Scales[] = {Nvfp4Scales::kSwizzled5d,
                                                  Nvfp4Scales::kSwizzled2d, Nvfp4Scales::kLinear};

// An NVFP4 case of the scale-layout and shape sweep.
inline Nvfp4Case nvfp4_sweep_case(Nvfp4Scales layout, std::int64_t rows, std::int64_t k,
                                  std::uint64_t seed) {
  const float global_scales[] = {1.0f, 2688.0f / 64.0f, 0.01f, 448.0f * 6.0f / 1000.0f};
  Nvfp4Case c;
  c.in_dtype = seed % 2 ? DType::kF16 : DType::kBF16;
  c.shape = {rows, k};
  c.scales = layout;
  c.scale_pad = layout == Nvfp4Scales::kLinear ? 3 : 0;
  c.global_scale = global_scales[seed % 4];
  c.data = seed % 3 ? Data::kAdversarial : Data::kRandom;
  c.seed = seed;
  return c;
}

// An NVFP4 case over `shape` of adversarial data; a 3-d shape is kv[..., 128:] of [T, H, 256];
// out and scale rows padded.
inline Nvfp4Case nvfp4_strided_case(Nvfp4Scales layout, std::vector<std::int64_t> shape,
                                    std::uint64_t seed) {
  const std::int64_t in_pad = shape.size() == 3 ? 128 : 0;
  Nvfp4Case c = with_padding(Nvfp4Case{}, in_pad, in_pad, 8);
  c.in_dtype = seed % 2 ? DType::kF16 : DType::kBF16;
  c.shape = std::move(shape);
  c.scales = layout;
  c.scale_pad = 5;
  c.global_scale = 3.0f;
  c.data = Data::kAdversarial;
  c.seed = seed;
  return c;
}

}  // namespace fp8mla::test
