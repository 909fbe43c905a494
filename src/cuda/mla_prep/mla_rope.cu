// Fused RoPE + FP8 quantization of MLA's Q and K (mla_rope_quantize_fp8), optionally also writing
// the latent cache row [kv_c | rope(k_pe)] of each token.
//
// Memory-bound, one pass over the inputs. A block of kThreads threads owns one token and up to
// kMaxHeadsPerBlock heads; its work is a list of items of 16 elements (two 16-byte loads of
// bf16/f16 in, one 16-byte e4m3 store out):
//   phase 1: per head 8 q_nope items and 8 k_nope items (several a thread, loads first), then per
//            head 4 q_pe RoPE items (8 pairs each: in the interleaved style one contiguous
//            16-element slice, in the NeoX style elements [8j, 8j + 8) and [32 + 8j, 32 + 8j + 8),
//            stored as two 8-byte halves); the first head group of a token also quantizes kv_c
//            into the cache row (32 items).
//   phase 2: the RoPE'd k_pe, computed once per block by 4 threads into shared memory while the
//            others run phase 1, quantized into every head's k_out[..., 128:] (a split K:
//            k_rope_out's row, by the first head group) and the cache row.
// cos/sin values are read as float4 from the token's row. Views whose pointers or strides do not
// allow 16-byte accesses take the scalar variant (same items, element accesses).
// A position outside [0, max_pos) makes the block write its q_out/k_out rows as zeros, skip the
// cache row and set cache_write's error_flag; a bad slot skips the cache row and sets the flag.
#include <algorithm>
#include <climits>

#include "cuda/common/launch.cuh"
#include "cuda/common/vector_io.cuh"
#include "fp8mla/error.hpp"
#include "ops/mla_rope_params.hpp"

namespace fp8mla::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxHeadsPerBlock = 32;
constexpr int kNopeItems = kMlaNopeDim / 16;  // 8
constexpr int kRopeItems = kMlaRopeDim / 16;  // 4 items of 8 pairs
constexpr int kNopeUnroll = 2;
constexpr int kKvcItems = kMlaKvLoraRank / 16;  // 32
constexpr int kRowChunks = kMlaQkDim / 16;      // 12 chunks of 16 bytes per out row

template <typename In>
__device__ __forceinline__ const typename In::Storage* in_row(const TokenHeads& t,
                                                              std::int64_t token,
                                                              std::int64_t head) {
  return static_cast<const typename In::Storage*>(t.data) + token * t.token_stride +
         head * t.head_stride;
}

__device__ __forceinline__ std::uint8_t* out_row(const TokenHeads& t, std::int64_t token,
                                                 std::int64_t head) {
  return static_cast<std::uint8_t*>(t.data) + token * t.token_stride + head * t.head_stride;
}

template <typename In, int kN, bool kVec>
__device__ __forceinline__ void load_in(const typename In::Storage* p, float (&x)[kN]) {
  if constexpr (kVec) {
    load_f32<In, kN>(p, x);
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) x[i] = In::to_f32(__ldg(p + i));
  }
}

// p[i] = e4m3(x[i] * scale_inv).
template <int kN, bool kVec>
__device__ __forceinline__ void store_scaled(std::uint8_t* p, float (&x)[kN], float scale_inv) {
#pragma unroll
  for (int i = 0; i < kN; ++i) x[i] = __fmul_rn(x[i], scale_inv);
  if constexpr (kVec) {
    store_fp8<kN>(p, x, false);
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) p[i] = std::uint8_t(cvt_e4m3x2(x[i], 0.0f));
  }
}

template <bool kVec>
__device__ __forceinline__ void store_zero16(std::uint8_t* p) {
  if constexpr (kVec) {
    *reinterpret_cast<uint4*>(p) = make_uint4(0, 0, 0, 0);
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) p[i] = 0;
  }
}

template <bool kVec>
__device__ __forceinline__ void load8_f32(const float* p, float (&x)[8]) {
  if constexpr (kVec) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p));
    const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
    x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = __ldg(p + i);
  }
}

// RoPE item j (pairs i in [8j, 8j + 8)) of the 64-element row `x_row` with cos/sin row `cs`:
// y in item order (interleaved: elements [16j, 16j + 16); NeoX: [8j, 8j + 8) then
// [32 + 8j, 32 + 8j + 8)). The arithmetic of fp8mla/mla_prep.hpp, with no contraction.
template <typename In, bool kVec>
__device__ __forceinline__ void rope_item(const typename In::Storage* x_row, const float* cs,
                                          bool neox, int j, float (&y)[16]) {
  float c[8], s[8], x0[8], x1[8];
  load8_f32<kVec>(cs + 8 * j, c);
  load8_f32<kVec>(cs + kMlaRopeDim / 2 + 8 * j, s);
  if (neox) {
    load_in<In, 8, kVec>(x_row + 8 * j, x0);
    load_in<In, 8, kVec>(x_row + kMlaRopeDim / 2 + 8 * j, x1);
  } else {
    float x[16];
    load_in<In, 16, kVec>(x_row + 16 * j, x);
#pragma unroll
    for (int i = 0; i < 8; ++i) x0[i] = x[2 * i], x1[i] = x[2 * i + 1];
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float y0 = __fmaf_rn(x0[i], c[i], -__fmul_rn(x1[i], s[i]));
    const float y1 = __fmaf_rn(x1[i], c[i], __fmul_rn(x0[i], s[i]));
    if (neox) {
      y[i] = y0, y[8 + i] = y1;
    } else {
      y[2 * i] = y0, y[2 * i + 1] = y1;
    }
  }
}

// Stores RoPE item j (item order as above) into the 64-byte rope part `out`.
template <bool kVec>
__device__ __forceinline__ void store_rope_item(std::uint8_t* out, bool neox, int j, float (&y)[16],
                                                float scale_inv) {
  if (neox) {
    float a[8], b[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) a[i] = y[i], b[i] = y[8 + i];
    store_scaled<8, kVec>(out + 8 * j, a, scale_inv);
    store_scaled<8, kVec>(out + kMlaRopeDim / 2 + 8 * j, b, scale_inv);
  } else {
    store_scaled<16, kVec>(out + 16 * j, y, scale_inv);
  }
}

template <typename In, bool kVec>
__global__ void __launch_bounds__(kThreads)
    rope_quantize_kernel(const MlaRopeQuantizeParams p, int heads_per_block) {
  __shared__ float k_rope[kRopeItems][16];
  const std::int64_t t = blockIdx.x;
  const std::int64_t h0 = std::int64_t(blockIdx.y) * heads_per_block;
  const int nh = int(min(std::int64_t(heads_per_block), p.heads - h0));
  const bool neox = p.style == RopeStyle::kNeox;
  const bool first_group = blockIdx.y == 0;

  pdl_wait();
  const std::int64_t pos = load_position(p, t);
  if (pos < 0 || pos >= p.max_pos) {  // uniform over the block
    // Per head the q row's chunks, then those of the k row this call writes: from its nope
    // part's first (or, without k_nope, its RoPE part's), to its end (k_nope's alone for a split
    // K).
    const int k_first = p.k_nope_part ? 0 : kNopeItems;
    const int k_end = p.k_split ? kNopeItems : kRowChunks;
    const int head_chunks = kRowChunks + max(0, k_end - k_first);
    for (int k = threadIdx.x; k < nh * head_chunks; k += kThreads) {
      const std::int64_t h = h0 + k / head_chunks;
      const int r = k % head_chunks;
      std::uint8_t* row = r < kRowChunks ? out_row(p.q_out, t, h) + 16 * r
                                         : out_row(p.k_out, t, h) + 16 * (k_first + r - kRowChunks);
      store_zero16<kVec>(row);
    }
    if (p.k_split && first_group && threadIdx.x < kRopeItems) {
      store_zero16<kVec>(out_row(p.k_rope_out, t, 0) + 16 * threadIdx.x);
    }
    if (threadIdx.x == 0 && first_group && p.cache.error_flag != nullptr) *p.cache.error_flag = 1;
    pdl_launch_dependents();
    return;
  }
  const float* cs = p.cos_sin + pos * p.cos_sin_row_stride;
  if (threadIdx.x < kRopeItems) {  // k_pe's RoPE, once per block
    float y[16];
    rope_item<In, kVec>(in_row<In>(p.k_pe, t, 0), cs, neox, threadIdx.x, y);
#pragma unroll
    for (int i = 0; i < 16; ++i) k_rope[threadIdx.x][i] = y[i];
  }
  std::uint8_t* cache_row = nullptr;
  if (p.cache_write && first_group) {
    const std::int64_t slot = load_slot(p.cache, t);
    cache_row = latent_row(p.cache, slot);
    if (slot != -1 && cache_row == nullptr && threadIdx.x == 0 && p.cache.error_flag != nullptr) {
      *p.cache.error_flag = 1;
    }
  }

  // q_nope and k_nope, 16 items a head (8 without K's nope part): kNopeUnroll items a thread with
  // every load issued before the first store. (Four a thread ran slower than two: fewer blocks
  // fit an SM.)
  const int head_items = p.k_nope_part ? 2 * kNopeItems : kNopeItems;
  const int nope_items = nh * head_items;
  const auto nope_row = [&](const TokenHeads& t_heads, int k) {
    return in_row<In>(t_heads, t, h0 + k / head_items) + 16 * (k % kNopeItems);
  };
  for (int k0 = threadIdx.x; k0 < nope_items; k0 += kThreads * kNopeUnroll) {
    float x[kNopeUnroll][16];
#pragma unroll
    for (int u = 0; u < kNopeUnroll; ++u) {
      const int k = k0 + u * kThreads;
      const bool is_k = k % head_items >= kNopeItems;
      if (k < nope_items) load_in<In, 16, kVec>(nope_row(is_k ? p.k_nope : p.q_nope, k), x[u]);
    }
#pragma unroll
    for (int u = 0; u < kNopeUnroll; ++u) {
      const int k = k0 + u * kThreads;
      if (k >= nope_items) continue;
      const bool is_k = k % head_items >= kNopeItems;
      std::uint8_t* out =
          out_row(is_k ? p.k_out : p.q_out, t, h0 + k / head_items) + 16 * (k % kNopeItems);
      store_scaled<16, kVec>(out, x[u], is_k ? p.k_scale_inv : p.q_scale_inv);
    }
  }
  // q_pe's RoPE items, then the cache row's kv_c.
  const int rope_items = nh * kRopeItems;
  const int items = rope_items + (cache_row != nullptr ? kKvcItems : 0);
  for (int k = threadIdx.x; k < items; k += kThreads) {
    if (k < rope_items) {
      const std::int64_t h = h0 + k / kRopeItems;
      const int j = k % kRopeItems;
      float y[16];
      rope_item<In, kVec>(in_row<In>(p.q_pe, t, h), cs, neox, j, y);
      store_rope_item<kVec>(out_row(p.q_out, t, h) + kMlaNopeDim, neox, j, y, p.q_scale_inv);
    } else {
      const int c = 16 * (k - rope_items);
      float x[16];
      load_in<In, 16, kVec>(in_row<In>(p.kv_c, t, 0) + c, x);
      store_scaled<16, kVec>(cache_row + c, x, p.cache.scale_inv);
    }
  }
  __syncthreads();
  // K's RoPE part into every head's row, or once into k_rope_out's (split K).
  const int k_rows = p.k_split ? (first_group ? 1 : 0) : nh;
  const int copies = (k_rows + (cache_row != nullptr ? 1 : 0)) * kRopeItems;
  for (int k = threadIdx.x; k < copies; k += kThreads) {
    const int j = k % kRopeItems;
    float y[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) y[i] = k_rope[j][i];
    if (k < k_rows * kRopeItems) {
      std::uint8_t* row = p.k_split ? out_row(p.k_rope_out, t, 0)
                                    : out_row(p.k_out, t, h0 + k / kRopeItems) + kMlaNopeDim;
      store_rope_item<kVec>(row, neox, j, y, p.k_scale_inv);
    } else {
      store_rope_item<kVec>(cache_row + kMlaKvLoraRank, neox, j, y, p.cache.scale_inv);
    }
  }
  pdl_launch_dependents();
}

bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

// 16-byte accesses at every row start of `t`.
bool vector_ok(const TokenHeads& t) {
  const std::int64_t size = std::int64_t(dtype_size(t.dtype));
  return aligned16(t.data) && (t.tokens <= 1 || (t.token_stride * size) % 16 == 0) &&
         (t.heads <= 1 || (t.head_stride * size) % 16 == 0);
}

bool vector_ok(const MlaRopeQuantizeParams& p) {
  bool ok = vector_ok(p.q_nope) && vector_ok(p.q_pe) && vector_ok(p.k_nope) && vector_ok(p.k_pe) &&
            vector_ok(p.q_out) && vector_ok(p.k_out) && aligned16(p.cos_sin) &&
            (p.max_pos <= 1 || p.cos_sin_row_stride % 4 == 0) &&
            (!p.k_split || vector_ok(p.k_rope_out));
  if (p.cache_write) {
    ok = ok && vector_ok(p.kv_c) && aligned16(p.cache.cache) &&
         (p.cache.num_pages <= 1 || p.cache.page_stride % 16 == 0) &&
         (p.cache.page_size <= 1 || p.cache.row_stride % 16 == 0);
  }
  return ok;
}

template <typename In>
void run(const MlaRopeQuantizeParams& p, CudaStream stream) {
  if (p.tokens > INT_MAX) {
    throw Error(ErrorCategory::kUnsupported,
                concat("mla_rope_quantize_fp8: at most ", INT_MAX, " tokens, got ", p.tokens));
  }
  const int heads_per_block = int(std::min<std::int64_t>(p.heads, kMaxHeadsPerBlock));
  const std::int64_t groups = (p.heads + heads_per_block - 1) / heads_per_block;
  if (groups > 65535) {
    throw Error(ErrorCategory::kUnsupported,
                concat("mla_rope_quantize_fp8: at most ", 65535 * kMaxHeadsPerBlock, " heads, got ",
                       p.heads));
  }
  const LaunchConfig config{dim3(unsigned(p.tokens), unsigned(groups)), dim3(kThreads), 0, stream,
                            true};
  if (vector_ok(p)) {
    launch("mla_rope_quantize_fp8", rope_quantize_kernel<In, true>, config, p, heads_per_block);
  } else {
    launch("mla_rope_quantize_fp8 (scalar)", rope_quantize_kernel<In, false>, config, p,
           heads_per_block);
  }
}

}  // namespace

void mla_rope_quantize_fp8(const MlaRopeQuantizeParams& p, CudaStream stream) {
  dispatch_16bit(p.q_nope.dtype, [&]<typename In>() { run<In>(p, stream); });
}

void copy_f32_rows_to_device(float* dst, std::int64_t dst_row_stride, const float* src,
                             std::int64_t rows, std::int64_t cols) {
  const std::size_t row_bytes = std::size_t(cols) * sizeof(float);
  check(cudaMemcpy2D(dst, std::size_t(dst_row_stride) * sizeof(float), src, row_bytes, row_bytes,
                     std::size_t(rows), cudaMemcpyHostToDevice),
        "cudaMemcpy2D (make_cos_sin_cache)");
}

}  // namespace fp8mla::cuda
