#include "cuda/common/tensor_map.hpp"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "cuda/common/runtime.hpp"
#include "fp8mla/error.hpp"

namespace fp8mla::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_function() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found{};
    check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault,
                                           &found),
          "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
    if (found != cudaDriverEntryPointSuccess || ptr == nullptr) {
      throw Error(ErrorCategory::kCuda, "the CUDA driver has no cuTensorMapEncodeTiled");
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

}  // namespace

CUtensorMap make_tensor_map(const TensorMap3d& spec, const char* what) {
  CUtensorMap map{};
  const cuuint64_t dims[3] = {spec.dims[0], spec.dims[1], spec.dims[2]};
  const cuuint64_t strides[2] = {spec.strides_bytes[0], spec.strides_bytes[1]};
  const cuuint32_t box[3] = {spec.box[0], spec.box[1], spec.box[2]};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult result = encode_function()(
      &map,
      spec.element_bytes == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3,
      const_cast<void*>(spec.base), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE,
      spec.swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("TMA descriptor of `", what, "` rejected by the driver (CUresult ",
                       int(result), "): dims ", spec.dims[0], "x", spec.dims[1], "x", spec.dims[2],
                       ", byte strides ", spec.strides_bytes[0], ", ", spec.strides_bytes[1]));
  }
  return map;
}

}  // namespace fp8mla::cuda
