// The MLA layer's own small kernels on the GPU (the ops of fp8mla/mla_prep.hpp do the rest):
// RMSNorm, and the BF16 path's RoPE with the assembly of per-head K = [k_nope | k_pe]. Each
// matches its CPU counterpart in model/cpu_math.hpp: RoPE bit for bit, RMSNorm up to the order
// of its f32 sum. Plain parameter structs; the launches allocate nothing and never synchronize.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fp8mla::cuda::model {

// y[r] = bf16(x[r] / sqrt(mean(x[r]^2) + eps) * weight), rows of `width` bf16 elements.
struct RmsNormParams {
  const std::uint16_t* x = nullptr;
  std::int64_t x_stride = 0;  // elements between rows
  const std::uint16_t* weight = nullptr;
  std::uint16_t* y = nullptr;
  std::int64_t y_stride = 0;
  std::int64_t rows = 0;
  int width = 0;  // a multiple of 8, at most 8192
  float eps = 0;
};
void rms_norm(const RmsNormParams& p, cudaStream_t stream);

// Per token t: k_pe' = rope(k_pe[t], positions[t]) (or k_pe[t] itself without positions), each
// element rounded to bf16; k_out[t, h] = [k_nope[t, h] | k_pe'] for every head; k_pe_out[t] =
// k_pe' when given; and, when q_pe is given, q_pe[t, h] = rope(q_pe[t, h], positions[t]) in place.
// All bf16; 16-byte aligned rows (strides in elements are multiples of 8).
struct RopeAssembleParams {
  std::int64_t tokens = 0, heads = 0;
  const std::uint16_t* k_nope = nullptr;  // [T, H, 128]
  std::int64_t k_nope_token_stride = 0, k_nope_head_stride = 0;
  const std::uint16_t* k_pe = nullptr;  // [T, 64]
  std::int64_t k_pe_stride = 0;
  std::uint16_t* k_out = nullptr;     // [T, H, 192] contiguous
  std::uint16_t* k_pe_out = nullptr;  // optional [T, 64] contiguous
  std::uint16_t* q_pe = nullptr;      // optional [T, H, 64], in place
  std::int64_t q_token_stride = 0, q_head_stride = 0;
  const std::int64_t* positions = nullptr;  // optional [T]: no RoPE without it
  const float* cos_sin = nullptr;           // [max_pos, 64] = [cos(32) | sin(32)]
};
void rope_assemble_bf16(const RopeAssembleParams& p, cudaStream_t stream);

// *amax_bits = max(*amax_bits, bits of max |x|) over `rows` rows of `cols` bf16 elements, a NaN
// counting above every number (as in model::amax_bf16): the bf16 magnitude bits order like the
// values, so the max is an integer max, exact in any order. The cell is zeroed by the caller.
struct AmaxParams {
  const std::uint16_t* x = nullptr;
  std::int64_t rows = 0, cols = 0, row_stride = 0;  // in elements
  unsigned int* amax_bits = nullptr;
};
void amax_bf16(const AmaxParams& p, cudaStream_t stream);

// Latent cache rows (576 e4m3 bytes) to or from a contiguous buffer of `count` rows, by slot:
// to_cache false (pack): buffer row i = the cache row of slots[i], zeros where slots[i] < 0;
// to_cache true (unpack): the cache row of slots[i] = buffer row i, none where slots[i] < 0.
// Slots are in the cache (the caller checks). 16-byte words where the cache's base and strides
// allow them, bytes otherwise.
struct LatentRowsParams {
  std::uint8_t* cache = nullptr;
  std::int64_t page_size = 0, page_stride = 0, row_stride = 0;  // strides in bytes
  std::uint8_t* rows = nullptr;                                 // [count, 576] contiguous
  const std::int64_t* slots = nullptr;                          // [count]
  std::int64_t count = 0;
  bool to_cache = false;
};
void copy_latent_rows(const LatentRowsParams& p, cudaStream_t stream);

// dst[i] = values[i] for i < count (at most 4): small constants written on the stream rather than
// copied from the host, so that a CUDA graph holds them.
struct FillParams {
  float* dst = nullptr;
  float values[4] = {};
  int count = 0;
};
void fill_f32(const FillParams& p, cudaStream_t stream);

}  // namespace fp8mla::cuda::model
