#include "cuda/common/tensor_map.hpp"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <string>

#include "cuda/common/runtime.hpp"
#include "fp8mla/error.hpp"

namespace fp8mla::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_function() {
  static const auto fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(
      driver_entry_point("cuTensorMapEncodeTiled", 12000));
  return fn;
}

// FNV-1a over the spec's fields (not its bytes: the struct has padding), then MurmurHash3's
// finalizer: the slot index is the low bits, which FNV's multiplications leave depending on the
// inputs' low bits only (zero in aligned base addresses).
std::size_t spec_hash(const TensorMapSpec& spec) {
  std::uint64_t h = 14695981039346656037ull;
  const auto mix = [&h](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  mix(reinterpret_cast<std::uintptr_t>(spec.base));
  mix(std::uint64_t(spec.element_bytes) << 32 | std::uint32_t(spec.rank));
  mix(std::uint64_t(spec.swizzle_bytes));
  for (int i = 0; i < TensorMapSpec::kMaxRank; ++i) {
    mix(spec.dims[i]);
    mix(std::uint64_t(spec.box[i]) << 32 | spec.element_strides[i]);
    if (i + 1 < TensorMapSpec::kMaxRank) mix(spec.strides_bytes[i]);
  }
  h = (h ^ (h >> 33)) * 0xff51afd7ed558ccdull;
  h = (h ^ (h >> 33)) * 0xc4ceb9fe1a85ec53ull;
  return std::size_t(h ^ (h >> 33));
}

// Direct-mapped: a slot holds the last spec that hashed to it, so a lookup is one comparison.
// 64 slots hold the maps of a model's layers' few distinct buffers with room for collisions.
class TensorMapCache {
 public:
  CUtensorMap get(const TensorMapSpec& spec, const char* what) {
    Slot& slot = slots_[spec_hash(spec) % slots_.size()];
    if (!slot.filled || !(slot.spec == spec)) {
      slot.map = encode_tensor_map(spec, what);  // throws before the slot changes
      slot.spec = spec;
      slot.filled = true;
    }
    return slot.map;
  }

 private:
  struct Slot {
    CUtensorMap map{};
    TensorMapSpec spec;
    bool filled = false;
  };
  std::array<Slot, 64> slots_{};
};

}  // namespace

CUtensorMap make_tensor_map(const TensorMapSpec& spec, const char* what) {
  thread_local TensorMapCache cache;
  return cache.get(spec, what);
}

CUtensorMap encode_tensor_map(const TensorMapSpec& spec, const char* what) {
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
