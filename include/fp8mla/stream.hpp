// The CUDA stream type of the public API, without including CUDA headers: this is exactly
// cudaStream_t (`struct CUstream_st*`), so engines pass their streams through unchanged.
#pragma once

struct CUstream_st;

namespace fp8mla {

using CudaStream = CUstream_st*;

}  // namespace fp8mla
