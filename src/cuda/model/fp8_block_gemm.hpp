// A 128-block-scaled FP8 GEMM with an e4m3 output, for the projections whose output attention
// reads in e4m3 (kv_b_proj's K-nope and V): y = e4m3(scale * sum_k x[r, k] W[o, k]), the sum in
// f32 with the block scales applied per 128 of k (DeepSeek's format, as CublasLinear's fp8 block
// GEMM: W e4m3 with one f32 scale per 128 x 128 block, x e4m3 with one f32 scale per row and 128
// elements), rounded once to e4m3 (nearest-even, saturating). cuBLASLt's block-scaled GEMM writes
// only 16/32-bit outputs on Hopper, so this one is fp8mla's own: CUTLASS's sm90 blockwise-scaled
// mainloop (TMA, wgmma, promotion to f32 every 128 of k) with an epilogue that scales, rounds and
// stores y token-major ([rows, out], row pitch >= out) or transposed ([out, rows], pitch >= rows:
// the key-contiguous V that FP8 prefill attention reads). sm_90a only. No allocation, no
// synchronization; the host builds the TMA descriptors per call.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace fp8mla::cuda::model {

struct Fp8BlockGemmParams {
  const void* x = nullptr;          // e4m3 [rows, in] row-major, rows 16-byte aligned
  const float* x_scales = nullptr;  // f32, scale of row r and group g at x_scales[g * pitch + r]
  std::int64_t x_scale_pitch = 0;   // >= rows, a multiple of 4 (TMA reads the scales)
  const void* weight = nullptr;     // e4m3 [out, in] row-major
  const float* weight_scales = nullptr;    // f32 [out / 128][weight_scale_pitch] row-major
  std::int64_t weight_scale_pitch = 0;     // >= in / 128
  std::int64_t rows = 0, out = 0, in = 0;  // out % 128 == 0, in % 128 == 0
  float scale = 1.0f;                      // y = e4m3(acc * scale)
  void* y = nullptr;                       // e4m3, 16-byte aligned
  std::int64_t y_pitch = 0;  // token-major: >= out; transposed: >= rows; a multiple of 16
  bool transposed = false;   // false: y[r * y_pitch + o]; true: y[o * y_pitch + r]
};

// Bytes of device workspace fp8_block_gemm may use (the caller passes at least this much).
inline constexpr std::size_t kFp8BlockGemmWorkspaceBytes = std::size_t(1) << 20;

// Runs the GEMM on `stream`. Throws ErrorCategory::kInvalidArgument naming the parameter for
// shapes, pitches or alignments outside the above, kUnsupported where CUTLASS cannot run it or
// the build has no sm_90a code. rows == 0 does nothing.
void fp8_block_gemm(const Fp8BlockGemmParams& p, void* workspace, std::size_t workspace_bytes,
                    cudaStream_t stream);

}  // namespace fp8mla::cuda::model
