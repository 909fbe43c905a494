// Parameter pieces shared by the MLA prep ops (fp8mla/mla_prep.hpp): a [tokens, heads, dim] view
// and the latent-cache destination. Each op's own struct lives beside its checks
// (mla_rope_params.hpp, mla_kv_params.hpp).
#pragma once

#include <cstdint>

#include "fp8mla/dtype.hpp"
#include "fp8mla/numerics.hpp"

namespace fp8mla {

// [tokens, heads, dim] with a contiguous last dim; strides in elements. A [T, dim] or
// [T, 1, dim] tensor shared by all heads has heads == 1 and head_stride == 0.
struct TokenHeads {
  void* data = nullptr;
  DType dtype = DType::kBF16;
  std::int64_t tokens = 0;
  std::int64_t heads = 0;
  std::int64_t dim = 0;
  std::int64_t token_stride = 0;
  std::int64_t head_stride = 0;
};

// The paged FP8 latent cache [num_pages, page_size, 576] and where each token's row goes.
struct LatentCacheParams {
  std::uint8_t* cache = nullptr;
  std::int64_t num_pages = 0;
  std::int64_t page_size = 0;
  std::int64_t page_stride = 0;  // bytes (e4m3 elements) between pages
  std::int64_t row_stride = 0;   // bytes between rows of a page
  const void* slots = nullptr;   // i32 or i64 [T]
  DType slot_dtype = DType::kI64;
  float scale_inv = 1.0f;              // write: q = e4m3(x * scale_inv)
  std::int32_t* error_flag = nullptr;  // CUDA path: set to 1 on a bad slot (may be null)
};

FP8MLA_HOST_DEVICE std::int64_t load_slot(const LatentCacheParams& c, std::int64_t token) {
  return c.slot_dtype == DType::kI32
             ? std::int64_t(static_cast<const std::int32_t*>(c.slots)[token])
             : static_cast<const std::int64_t*>(c.slots)[token];
}

// The cache row of `slot`, or nullptr when the slot is outside [0, num_pages * page_size).
FP8MLA_HOST_DEVICE std::uint8_t* latent_row(const LatentCacheParams& c, std::int64_t slot) {
  if (slot < 0 || slot >= c.num_pages * c.page_size) return nullptr;
  return c.cache + (slot / c.page_size) * c.page_stride + (slot % c.page_size) * c.row_stride;
}

}  // namespace fp8mla
