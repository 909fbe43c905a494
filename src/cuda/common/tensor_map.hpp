// TMA tensor maps (CUtensorMap) built on the host for a kernel parameter. The driver function is
// looked up once through the runtime, so the library links no libcuda.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace fp8mla::cuda {

// A tiled map of rank 1-5. The dims' strides need not grow or be disjoint: a map may walk the same
// rows in another order (see the e4m3 K map of the attention kernel).
struct TensorMapSpec {
  static constexpr int kMaxRank = 5;
  const void* base = nullptr;  // 16-byte aligned
  int element_bytes = 1;       // 1 (e4m3) or 2 (bf16)
  int rank = 3;
  std::uint64_t dims[kMaxRank] = {};               // innermost first, in elements
  std::uint64_t strides_bytes[kMaxRank - 1] = {};  // of dims 1..rank-1; multiples of 16
  std::uint32_t box[kMaxRank] = {};  // elements; box[0] * element_bytes <= swizzle_bytes
  // Box traversal steps: a dim with step s loads every s-th element of its box (box / s of them).
  std::uint32_t element_strides[kMaxRank] = {1, 1, 1, 1, 1};
  int swizzle_bytes = 128;  // 64 or 128

  friend bool operator==(const TensorMapSpec&, const TensorMapSpec&) = default;
};

// The map of `spec` (out-of-bounds elements read as zero). Throws fp8mla::Error on a spec the
// hardware rejects, naming `what`. Served from a per-thread cache of recently encoded specs: an
// attention launch needs four maps, an engine launches with the same buffers and shapes layer
// after layer, and a lookup costs a third of an encode (40 ns against 117 ns on an H200 host,
// 2026-12-02). A map is a function of its spec alone, so a cached one is the one the driver
// would encode again.
CUtensorMap make_tensor_map(const TensorMapSpec& spec, const char* what);

// The driver's encoding of `spec`, uncached (what make_tensor_map returns on a miss).
CUtensorMap encode_tensor_map(const TensorMapSpec& spec, const char* what);

}  // namespace fp8mla::cuda
