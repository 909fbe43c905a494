// fp8_block_gemm's transposed output: y[o * y_pitch + r] (CUTLASS's column-major D).
#include "cuda/model/fp8_block_gemm.cuh"

namespace fp8mla::cuda::model::detail {

void run_fp8_block_gemm_transposed(const Fp8BlockGemmParams& p, void* workspace,
                                   std::size_t workspace_bytes, cudaStream_t stream) {
  run_fp8_block_gemm<cutlass::layout::ColumnMajor>(p, workspace, workspace_bytes, stream);
}

}  // namespace fp8mla::cuda::model::detail
