// Quantization ops (docs/design.md section 2 and section 3, ops 1-3).
//
// Every op reads and writes caller memory through TensorViews, on the CPU or on one CUDA device
// (all tensors of a call on the same device; the CUDA path runs on `stream` and never syncs).
// Rows: N-d inputs are seen as rows of their last dim; leading dims must fold onto one row stride
// (fp8mla::fold_rows), the last dim must have stride 1. Outputs are fully written; nothing outside
// them is touched. 0 rows is a valid, empty call. Bad arguments throw fp8mla::Error, among them a
// scale given by value that is not finite and > 0, and an output whose memory (first to last
// element) overlaps an input's. The CPU path also rejects a scale read from memory (scale_inv,
// global_scale) that is not finite and > 0; the CUDA kernels read it on the device, unchecked.
#pragma once

#include "fp8mla/stream.hpp"
#include "fp8mla/tensor_view.hpp"

namespace fp8mla {

// ---- 1. Per-tensor FP8 -------------------------------------------------------------------------
// out = fp8(x * scale_inv), nearest-even, saturating (numerics.hpp). `input` bf16, f16 or f32;
// `out` e4m3fn or e5m2 with the input's shape (its own row stride allowed).

// Static scale given by value.
void quantize_fp8(const TensorView& input, const TensorView& out, float scale_inv,
                  CudaStream stream = nullptr);

// Static scale read from memory: `scale_inv` is one f32 (shape [] or [1]) on the input's device,
// so a captured CUDA graph can change it between replays.
void quantize_fp8(const TensorView& input, const TensorView& out, const TensorView& scale_inv,
                  CudaStream stream = nullptr);

// Smallest scale dynamic quantization produces (an all-zero input still gets a finite scale_inv).
inline constexpr float kMinDynamicScale = 1.0f / (448.0f * 512.0f);

// Dynamic: amax = max |x| over the whole input (NaNs ignored); scale = max(amax / fp8_max,
// kMinDynamicScale); out = fp8(x * (1 / scale)). `scale` (one f32 on the input's device) receives
// the scale. Deterministic: max is exact in any order.
void quantize_fp8_dynamic(const TensorView& input, const TensorView& out, const TensorView& scale,
                          CudaStream stream = nullptr);

// ---- 2. Per-token-group FP8 --------------------------------------------------------------------
// For each group of `group_size` contiguous elements of a row: amax = max(eps, max |x|),
// s = amax / 448, rounded up to a power of two with UE8M0 scales; out = e4m3(x / s).
//
// `scales` is 2-d [rows, groups] where rows is the folded row count of `input` (for an input of
// width 0, the product of its leading dims) and groups = cols / group_size; its dtype and strides
// choose the layout:
//   f32 (any strides): row-major (G, 1), column-major (1, rows), TMA-aligned column-major
//     (1, round_up(rows, 4)), ... Values are s (powers of two when round_scale_to_pow2).
//   ue8m0 (any strides): one exponent byte per group.
//   i32 [rows, ceil(groups / 4)] (any strides, e.g. TMA-aligned column-major): packed UE8M0,
//     group g in byte g % 4 of word g / 4 (little-endian); bytes past the last group are zero.
struct GroupQuantOptions {
  int group_size = 128;  // 64 or 128
  float eps = 1e-10f;  // finite, > 0
  bool round_scale_to_pow2 = false;  // UE8M0 rounding for f32 scales; implied by ue8m0 and i32
};

void quantize_fp8_per_token_group(const TensorView& input, const TensorView& out,
                                  const TensorView& scales, const GroupQuantOptions& options = {},
                                  CudaStream stream = nullptr);

// ---- 3. NVFP4 ----------------------------------------------------------------------------------
// `input` [M, K] bf16/f16 (N-d folds as above), K a multiple of 16. For each block of 16 along K:
// sf = e4m3(global_scale * (amax / 6)); inv = sf == 0 ? 0 : 1 / (decode(sf) * (1 / global_scale));
// out = e2m1(x * inv), two values per byte, even element in the low nibble: `out` e2m1x2 [M, K/2].
// `global_scale` is one f32 on the input's device.
enum class Nvfp4ScaleLayout {
  // The 128x4 tile layout tensor cores read: [round_up(M,128)/128, round_up(K/16,4)/4, 32, 4, 4]
  // e4m3, contiguous, given as that 5-d view or as 2-d [round_up(M,128), round_up(K/16,4)].
  // Padding bytes are written as zero.
  kSwizzled128x4,
  // Plain [M, K/16] e4m3, any row stride.
  kLinear,
};

void quantize_nvfp4(const TensorView& input, const TensorView& out, const TensorView& block_scales,
                    const TensorView& global_scale,
                    Nvfp4ScaleLayout layout = Nvfp4ScaleLayout::kSwizzled128x4,
                    CudaStream stream = nullptr);

}  // namespace fp8mla
