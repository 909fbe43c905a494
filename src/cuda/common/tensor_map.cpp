#include "cuda/common/tensor_map.hpp"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <string>

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

CUtensorMap make_tensor_map(const TensorMapSpec& spec, const char* what) {
  constexpr int kMax = TensorMapSpec::kMaxRank;
  cuuint64_t dims[kMax], strides[kMax - 1];
  cuuint32_t box[kMax], element_strides[kMax];
  for (int i = 0; i < kMax; ++i) {
    dims[i] = spec.dims[i];
    box[i] = spec.box[i];
    element_strides[i] = spec.element_strides[i];
    if (i + 1 < kMax) strides[i] = spec.strides_bytes[i];
  }
  CUtensorMap map{};
  const CUresult result = encode_function()(
      &map,
      spec.element_bytes == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
      cuuint32_t(spec.rank), const_cast<void*>(spec.base), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE,
      spec.swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    std::string shape, steps;
    for (int i = 0; i < spec.rank; ++i) {
      shape += concat(i ? "x" : "", spec.dims[i]);
      if (i > 0) steps += concat(i > 1 ? ", " : "", spec.strides_bytes[i - 1]);
    }
    throw Error(ErrorCategory::kInvalidArgument,
                concat("TMA descriptor of `", what, "` rejected by the driver (CUresult ",
                       int(result), "): dims ", shape, ", byte strides ", steps));
  }
  return map;
}

}  // namespace fp8mla::cuda
