// TMA tensor maps (CUtensorMap) built on the host for a kernel parameter. The driver function is
// looked up once through the runtime, so the library links no libcuda.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace fp8mla::cuda {

struct TensorMap3d {
  const void* base = nullptr;      // 16-byte aligned
  int element_bytes = 1;           // 1 (e4m3) or 2 (bf16)
  std::uint64_t dims[3] = {};      // innermost first, in elements
  std::uint64_t strides_bytes[2];  // of dims 1 and 2; multiples of 16
  std::uint32_t box[3] = {};       // elements; box[0] * element_bytes <= swizzle_bytes
  int swizzle_bytes = 128;         // 64 or 128
};

// Encodes `spec` (out-of-bounds elements read as zero). Throws fp8mla::Error on a spec the
// hardware rejects, naming `what`.
CUtensorMap make_tensor_map(const TensorMap3d& spec, const char* what);

}  // namespace fp8mla::cuda
