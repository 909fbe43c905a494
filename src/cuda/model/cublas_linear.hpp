// The MLA layer's projections on the GPU through cuBLASLt:
// y[rows, out] = x[rows, in] . W[out, in]^T with a bf16 row-major y. Two formats:
//  - bf16: x and W bf16, f32 accumulation;
//  - fp8 block: W e4m3 with one f32 scale per 128 x 128 block (DeepSeek's weight_scale_inv,
//    row-major [ceil(out / 128), in / 128], its rows padded to linear_scale_columns(in)) and x
//    e4m3 with one f32 scale per 128 elements of a
//    row (quantize_fp8_per_token_group, group 128), stored column-major: scale of row r, group g
//    at x_scales[g * rows + r]. cuBLASLt's BLK128x128 / VEC128 scale modes (CUDA >= 12.9, sm_90).
// A plan is made once per weight (descriptors, and a check that cuBLASLt has an algorithm for it);
// run() only updates the row count, asks cuBLASLt's heuristic when the row count changed, and
// launches. It allocates no device memory and never synchronizes. A plan is not thread-safe.
// cuBLASLt's block-scaled fp8 GEMM needs a row count (its N) that is a multiple of 4 (cuBLAS docs,
// "Scaling factors layouts"): fp8 runs with other row counts go through the workspace (the x
// scales repacked for rows rounded down to a multiple of 4, the last rows % 4 rows as a padded
// 4-row GEMM).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace fp8mla::cuda::model {

enum class LinearFormat { kBf16, kFp8Block };

struct LinearWeight {
  LinearFormat format = LinearFormat::kBf16;
  const void* weight = nullptr;  // device, [out, in] row-major, bf16 or e4m3
  // device, fp8 block only: [ceil(out/128), linear_scale_columns(in)] row-major, the first in/128
  // columns of each row DeepSeek's scales
  const float* scale_inv = nullptr;
  std::int64_t out = 0, in = 0;
};

// Floats per row of an fp8 block weight's scales: cuBLASLt's BLK128x128 scales are K-major with
// a row stride of in/128 rounded up to a multiple of 4 (cuBLAS docs 3.1.4.5.1), which DeepSeek's
// unpadded [ceil(out/128), in/128] has where in % 512 == 0.
inline std::int64_t linear_scale_columns(std::int64_t in) {
  return (in / 128 + 3) / 4 * 4;
}

// Bytes of cuBLASLt workspace a plan may use (the caller provides it with each run).
inline constexpr std::size_t kLinearWorkspaceBytes = std::size_t(32) << 20;

class CublasLinear {
 public:
  // Builds the plan for `weight` and rows up to `max_rows`. Throws ErrorCategory::kUnsupported
  // (naming the format, the shape and the reason) when the format cannot run on this device:
  // fp8 block needs model::fp8_gemm_shape (in % 128 == 0, out % 8 == 0), sm_90, cuBLASLt >= 12.9,
  // and an algorithm from cuBLASLt's heuristic for max_rows. weight and scale_inv must be 16-byte
  // aligned (kInvalidArgument otherwise).
  CublasLinear(cublasLtHandle_t handle, const LinearWeight& weight, std::int64_t max_rows);
  ~CublasLinear();
  CublasLinear(const CublasLinear&) = delete;
  CublasLinear& operator=(const CublasLinear&) = delete;

  const LinearWeight& weight() const { return weight_; }

  // x: device [rows, in] row-major (bf16, or e4m3 with x_scales f32 [in / 128][rows]);
  // y: device bf16 [rows, out] row-major, written in full. 0 rows does nothing.
  // x, y and x_scales must be 16-byte aligned, the workspace 256-byte aligned and
  // kLinearWorkspaceBytes + linear_scratch_bytes(weight, rows) large. rows > max_rows is an
  // ErrorCategory::kInvalidArgument error.
  void run(const void* x, const float* x_scales, std::int64_t rows, void* y, void* workspace,
           std::size_t workspace_bytes, cudaStream_t stream);

 private:
  struct Descriptors;
  LinearWeight weight_;
  std::int64_t max_rows_;
  cublasLtHandle_t handle_;
  Descriptors* desc_;  // cuBLASLt descriptors, the row count they describe and its algorithm
};

// Workspace run() needs beyond kLinearWorkspaceBytes for `rows` rows: the repacked scales and
// padded tail of an fp8 row count that is not a multiple of 4; 0 otherwise.
std::size_t linear_scratch_bytes(const LinearWeight& weight, std::int64_t rows);

// A cuBLASLt handle as an owning value (cublasLtCreate / cublasLtDestroy).
class CublasLtHandle {
 public:
  CublasLtHandle();
  ~CublasLtHandle();
  CublasLtHandle(const CublasLtHandle&) = delete;
  CublasLtHandle& operator=(const CublasLtHandle&) = delete;
  cublasLtHandle_t get() const { return handle_; }

 private:
  cublasLtHandle_t handle_ = nullptr;
};

}  // namespace fp8mla::cuda::model
