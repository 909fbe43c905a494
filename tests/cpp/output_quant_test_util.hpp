// Shared cases of the fused output quantization tests (CPU and CUDA): every key and scale layout
// as the geometry of a quantized `out` and its scale tensor, with the standalone op whose bytes
// the fused op must give; the reference run of that op on host buffers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "buffer_test_util.hpp"
#include "fp8mla/output_quant.hpp"
#include "fp8mla/quantize.hpp"
#include "ops/quantize_params.hpp"

namespace fp8mla::test {

inline constexpr float kStaticScale = 150.0f;  // o * 150 saturates the largest outputs (|o| < 4)
inline constexpr float kGlobalScale = 500.0f;

// One quantized output: `out` and the scale tensor as they are given to the op, the standalone
// op's scale view over the first `rows` rows, and the call of that op.
struct QuantCase {
  std::string name;
  OutputQuantKey key = OutputQuantKey::kFp8Static;
  Spec out;               // e4m3 or e2m1x2: [T, H, Dv] (Dv / 2 bytes) or [T, W] (W / 2 bytes)
  Spec scale;             // output_block_scale (or output_scale for kFp8Static)
  bool swizzled = false;  // NVFP4 scales in the 128x4 layout
  // The standalone op on bf16 [rows, W] rows, `out` as rows and the scales it writes.
  std::function<void(const TensorView& bf16, const TensorView& out, const TensorView& scales,
                     const TensorView& global)>
      standalone;
  // The part of the scale tensor the standalone op is given for `rows` rows (the first rows or
  // tiles).
  std::function<TensorView(const TensorView& scales, std::int64_t rows)> used =
      [](const TensorView& s, std::int64_t) { return s; };
};

inline Spec strided(DType dtype, std::vector<std::int64_t> shape, std::vector<std::int64_t> strides,
                    std::int64_t elems, std::int64_t offset = 0) {
  return {dtype, std::move(shape), std::move(strides), offset, elems + offset};
}

// `out` views: dense [T, H, Dv]; [T, W] rows 48 bytes apart and 16 bytes in (the aligned rows of
// vector stores); [T, W] rows 3 bytes apart and 1 byte in (no vector store lines up).
enum class OutLayout { kDense3d, kPadded2d, kOdd2d };

inline Spec out_spec(DType dtype, std::int64_t tokens, std::int64_t heads, std::int64_t dim,
                     OutLayout layout) {
  const std::int64_t d = dtype == DType::kE2M1x2 ? dim / 2 : dim;
  if (layout == OutLayout::kDense3d) return dense(dtype, {tokens, heads, d});
  return layout == OutLayout::kPadded2d ? padded(dtype, {tokens, heads * d}, 48, 16)
                                        : padded(dtype, {tokens, heads * d}, 3, 1);
}

inline const char* out_layout_name(OutLayout layout) {
  const char* names[] = {", out [T, H, Dv]", "", ", out rows misaligned"};
  return names[int(layout)];
}

inline std::vector<QuantCase> group_cases(std::int64_t t, std::int64_t heads, std::int64_t dim) {
  std::vector<QuantCase> cases;
  const DType f32 = DType::kF32, ue8m0 = DType::kUE8M0, i32 = DType::kI32;
  const std::int64_t width = heads * dim;
  for (int group : {128, 64}) {
    if (width % group != 0) continue;
    const std::int64_t g = width / group, w = (g + 3) / 4, t4 = round_up(t, 4), r = t + 6;
    // Packed words that also fit the other group size cannot tell them apart (an error).
    const std::int64_t other = width % (192 - group) == 0 ? (width / (192 - group) + 3) / 4 : 0;
    const OutputQuantKey key =
        group == 128 ? OutputQuantKey::kFp8Group128 : OutputQuantKey::kFp8Group64;
    std::vector<std::pair<std::string, Spec>> layouts = {
        {"f32 row-major", dense(f32, {t, g})},
        {"f32 column-major", strided(f32, {t, g}, {1, t}, g * t)},
        {"f32 TMA-aligned column-major", strided(f32, {t, g}, {1, t4}, g * t4)},
        {"f32 padded rows (CUDA graph)", strided(f32, {r, g}, {1, r}, g * r)},
        {"ue8m0 row-major", dense(ue8m0, {t, g})},
        {"ue8m0 column-major", strided(ue8m0, {t, g}, {1, t}, g * t, 3)},
    };
    if (other != w) {
      layouts.push_back(
          {"packed i32 TMA-aligned column-major", strided(i32, {t, w}, {1, t4}, w * t4)});
      layouts.push_back({"packed i32 row-major", dense(i32, {t, w})});
    }
    for (const auto& [name, scale] : layouts) {
      for (OutLayout out : {OutLayout::kPadded2d, OutLayout::kDense3d, OutLayout::kOdd2d}) {
        QuantCase c;
        c.name = concat("group ", group, ", ", name, out_layout_name(out));
        c.key = key;
        c.out = out_spec(DType::kE4M3, t, heads, dim, out);
        c.scale = scale;
        c.standalone = [group](const TensorView& x, const TensorView& o, const TensorView& s,
                               const TensorView&) {
          quantize_fp8_per_token_group(x, o, s, {group, 1e-10f, false});
        };
        c.used = [](const TensorView& s, std::int64_t rows) { return s.narrow(0, 0, rows); };
        cases.push_back(std::move(c));
      }
    }
  }
  return cases;
}

inline std::vector<QuantCase> nvfp4_cases(std::int64_t t, std::int64_t heads, std::int64_t dim) {
  std::vector<QuantCase> cases;
  const std::int64_t width = heads * dim;
  if (width % 16 != 0) return cases;
  const std::int64_t blocks = width / 16, padded_blocks = round_up(blocks, 4);
  const std::int64_t tiles = (t + 127) / 128, rows = tiles * 128;
  const DType e4m3 = DType::kE4M3;
  const Nvfp4ScaleLayout swizzled = Nvfp4ScaleLayout::kSwizzled128x4;
  const Nvfp4ScaleLayout linear = Nvfp4ScaleLayout::kLinear;
  struct Layout {
    std::string name;
    Spec scale;
    Nvfp4ScaleLayout layout;
    bool five_d;
  };
  const std::vector<Layout> layouts = {
      {"swizzled 2-d", dense(e4m3, {rows, padded_blocks}), swizzled, false},
      {"swizzled 5-d", dense(e4m3, {tiles, padded_blocks / 4, 32, 4, 4}), swizzled, true},
      {"swizzled 2-d, a spare tile", dense(e4m3, {rows + 128, padded_blocks}), swizzled, false},
      {"linear", dense(e4m3, {t, blocks}), linear, false},
      {"linear, padded row stride and spare rows",
       strided(e4m3, {t + 3, blocks}, {blocks + 40, 1}, (blocks + 40) * (t + 3)), linear, false},
  };
  for (const Layout& l : layouts) {
    for (OutLayout out : {OutLayout::kPadded2d, OutLayout::kDense3d, OutLayout::kOdd2d}) {
      QuantCase c;
      c.name = concat("nvfp4 ", l.name, out_layout_name(out));
      c.key = OutputQuantKey::kNvfp4;
      c.out = out_spec(DType::kE2M1x2, t, heads, dim, out);
      c.scale = l.scale;
      c.swizzled = l.layout == swizzled;
      c.standalone = [layout = l.layout](const TensorView& x, const TensorView& o,
                                         const TensorView& s, const TensorView& global) {
        quantize_nvfp4(x, o, s, global, layout);
      };
      c.used = [layout = l.layout, five_d = l.five_d](const TensorView& s, std::int64_t n) {
        if (layout == Nvfp4ScaleLayout::kLinear) return s.narrow(0, 0, n);
        return s.narrow(0, 0, five_d ? (n + 127) / 128 : round_up(n, 128));
      };
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

// Every key and layout that applies to a row of heads x dim values.
inline std::vector<QuantCase> quant_cases(std::int64_t t, std::int64_t heads, std::int64_t dim) {
  std::vector<QuantCase> cases = group_cases(t, heads, dim);
  for (OutLayout out : {OutLayout::kPadded2d, OutLayout::kDense3d, OutLayout::kOdd2d}) {
    QuantCase c;
    c.name = concat("static", out_layout_name(out));
    c.out = out_spec(DType::kE4M3, t, heads, dim, out);
    c.scale = dense(DType::kF32, {1});
    c.standalone = [](const TensorView& x, const TensorView& o, const TensorView& scale,
                      const TensorView&) { quantize_fp8(x, o, scale); };
    cases.push_back(std::move(c));
  }
  for (QuantCase& c : nvfp4_cases(t, heads, dim)) cases.push_back(std::move(c));
  return cases;
}

// The cases a CUDA test walks: all of them, or with FP8MLA_QUANT_CASES=keys the first of each key.
// scripts/sanitize.sh sets it for racecheck and synccheck, whose checks (shared memory, barriers)
// cannot depend on the scale layout or the output's strides: those change global stores only.
inline std::vector<QuantCase> walked(std::vector<QuantCase> cases) {
  const char* env = std::getenv("FP8MLA_QUANT_CASES");
  if (env == nullptr || std::string_view(env) != "keys") return cases;
  std::vector<QuantCase> first;
  for (QuantCase& c : cases) {
    if (std::none_of(first.begin(), first.end(),
                     [&](const QuantCase& f) { return f.key == c.key; })) {
      first.push_back(std::move(c));
    }
  }
  return first;
}

// `out` as the [T, cols] rows the standalone op takes (a 3-d view's heads are contiguous).
inline TensorView as_rows(const TensorView& out) {
  if (out.ndim() == 2) return out;
  return TensorView(out.data(), out.dtype(), {out.size(0), out.size(1) * out.size(2)},
                    {out.stride(0), 1});
}

// The host buffers of one quantized call: out, scale tensor, and the global scale of NVFP4, all
// poisoned alike, with the one-element scale set.
struct QuantBuffers {
  HostBuffer out, scale, global;
  QuantBuffers(const QuantCase& c, std::uint8_t poison)
      : out(c.out.bytes(), poison), scale(c.scale.bytes(), poison), global(4, poison) {
    const float one_scale = c.key == OutputQuantKey::kNvfp4 ? kGlobalScale : kStaticScale;
    std::memcpy(c.key == OutputQuantKey::kFp8Static ? scale.data() : global.data(), &one_scale, 4);
  }
};

// (output_scale, output_block_scale) of the fused call over (out, scale, global) buffers.
inline std::pair<TensorView, TensorView> op_scales(const QuantCase& c, void* scale, void* global,
                                                   Device device = Device::cpu()) {
  const TensorView s = c.scale.view(scale, device);
  const TensorView g(global, DType::kF32, {1}, device);
  if (c.key == OutputQuantKey::kFp8Static) return {s, {}};
  if (c.key == OutputQuantKey::kNvfp4) return {g, s};
  return {{}, s};
}

// The standalone op of c over the first `rows` rows of bf16 [rows, W], into `want`.
inline void run_standalone(const QuantCase& c, const TensorView& bf16, QuantBuffers& want) {
  const std::int64_t rows = bf16.size(0);
  const TensorView out = as_rows(c.out.view(want.out.data())).narrow(0, 0, rows);
  const TensorView global(want.global.data(), DType::kF32, {1});
  c.standalone(bf16, out, c.used(c.scale.view(want.scale.data()), rows), global);
}

// The standalone op's bytes where a padded fused call's differ by design (`real` rows of the
// `rows` the output holds, docs/design.md section 6): the swizzled NVFP4 scales of rows
// real .. rows keep their poison and rows .. round_up(rows, 128) are the padding zeros.
inline void pad_swizzled(const QuantCase& c, QuantBuffers& want, std::int64_t real,
                         std::int64_t rows, std::int64_t width, std::uint8_t poison) {
  if (!c.swizzled) return;
  const std::int64_t blocks = width / 16, padded = round_up(blocks, 4);
  std::uint8_t* scales = want.scale.data() + c.scale.offset;
  for (std::int64_t m = real; m < round_up(rows, 128); ++m) {
    for (std::int64_t b = 0; b < padded; ++b) {
      scales[swizzled_scale_offset(m, b, blocks)] = m < rows ? poison : 0;
    }
  }
}

}  // namespace fp8mla::test
