// fp8_block_gemm: the checks, and the token-major instantiation (y[r * y_pitch + o]: CUTLASS's
// row-major D).
#include <cmath>

#include "cuda/model/fp8_block_gemm.cuh"

namespace fp8mla::cuda::model {

namespace detail {
void run_fp8_block_gemm_transposed(const Fp8BlockGemmParams& p, void* workspace,
                                   std::size_t workspace_bytes, cudaStream_t stream);
}  // namespace detail

namespace {

bool aligned16(const void* p) {
  return p != nullptr && reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

void check_params(const Fp8BlockGemmParams& p) {
  const auto fail = [](auto&&... what) {
    throw Error(ErrorCategory::kInvalidArgument, concat("fp8_block_gemm: ", what...));
  };
  if (p.out <= 0 || p.out % 128 != 0 || p.in <= 0 || p.in % 128 != 0) {
    fail("expected out and in positive multiples of 128 (whole 128 x 128 weight blocks), got out ",
         p.out, ", in ", p.in);
  }
  const std::int64_t k_blocks = p.in / 128;
  const std::int64_t y_min_pitch = p.transposed ? p.rows : p.out;
  if (p.x_scale_pitch < p.rows || p.x_scale_pitch % 4 != 0) {
    fail("expected x_scale_pitch >= rows (", p.rows, ") and a multiple of 4, got ",
         p.x_scale_pitch);
  }
  if (p.weight_scale_pitch < k_blocks) {
    fail("expected weight_scale_pitch >= in / 128 (", k_blocks, "), got ", p.weight_scale_pitch);
  }
  if (p.y_pitch < y_min_pitch || p.y_pitch % 16 != 0) {
    fail("expected y_pitch >= ", p.transposed ? "rows (" : "out (", y_min_pitch,
         ") and a multiple of 16, got ", p.y_pitch);
  }
  // CUTLASS takes the problem shape and the scale layouts in 32-bit integers.
  constexpr std::int64_t kMax = std::int64_t(1) << 31;
  if (p.rows >= kMax || p.x_scale_pitch * k_blocks >= kMax ||
      p.weight_scale_pitch * (p.out / 128) >= kMax) {
    fail("expected rows and the scale tensors' sizes below 2^31, got rows ", p.rows,
         ", x_scale_pitch ", p.x_scale_pitch, ", weight_scale_pitch ", p.weight_scale_pitch);
  }
  if (!(std::isfinite(p.scale) && p.scale > 0.0f)) {
    fail("expected a finite positive output scale, got ", p.scale);
  }
  const std::pair<const void*, const char*> pointers[] = {{p.x, "x"},
                                                          {p.x_scales, "x_scales"},
                                                          {p.weight, "weight"},
                                                          {p.weight_scales, "weight_scales"},
                                                          {p.y, "y"}};
  for (const auto& [ptr, name] : pointers) {
    if (!aligned16(ptr))
      fail("expected a 16-byte aligned device pointer for ", name, ", got ", ptr);
  }
}

}  // namespace

void fp8_block_gemm(const Fp8BlockGemmParams& p, void* workspace, std::size_t workspace_bytes,
                    cudaStream_t stream) {
  if (p.rows < 0) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("fp8_block_gemm: expected rows >= 0, got ", p.rows));
  }
  if (p.rows == 0) return;
  check_params(p);
  if (current_device_props().arch != 90) {
    throw Error(ErrorCategory::kUnsupported,
                concat("fp8_block_gemm: needs an sm_90 device (its code is built for sm_90a), got "
                       "sm_",
                       current_device_props().arch));
  }
  if (p.transposed) {
    detail::run_fp8_block_gemm_transposed(p, workspace, workspace_bytes, stream);
  } else {
    detail::run_fp8_block_gemm<cutlass::layout::RowMajor>(p, workspace, workspace_bytes, stream);
  }
}

}  // namespace fp8mla::cuda::model
