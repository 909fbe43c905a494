// merge_attention_states (fp8mla/attention.hpp, op 9): (o_a, lse_a) (+) (o_b, lse_b).
//
// Memory-bound. kLanes threads (8, 16 or 32: the fewest that cover the row's vectors) own one
// (token, head) row: lane 0 reads the lse pair once and broadcasts it, every lane moves 16-byte
// vectors of o_a/o_b (8 bf16 or 4 f32) and stores 16 bytes of out; rows whose pointers, strides or
// width do not allow 16-byte access take the scalar variant (32 lanes, one element each). The math
// is the CPU's (src/cpu/merge_states.cpp) in the same order; only expf/logf differ from
// std::exp/std::log. A side whose weight is exactly 0 is not read. Plain (coherent) loads, since
// out may alias o_a (in place): each lane reads its elements before it writes them, and the lse
// pair is read before lane 0 writes out_lse. With a quantized `out` (p.quant) the
// merge_quant_kernel below writes it instead. With num_tokens (a batch padded for a CUDA graph,
// docs/design.md section 6) the grids still cover every row and the rows past it exit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/attention/merge_math.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/vector_io.cuh"
#include "cuda/quantize/output_quant_target.hpp"
#include "cuda/quantize/quant_device.cuh"
#include "fp8mla/error.hpp"
#include "ops/merge_states_params.hpp"

namespace fp8mla::cuda {
namespace {

constexpr int kThreads = 256;

template <typename S>
struct MergeArgs {
  const S* o_a;
  std::int64_t a_token, a_head;
  const S* o_b;
  std::int64_t b_token, b_head;
  S* out;
  std::int64_t out_token, out_head;
  const float* lse_a;
  std::int64_t la_token, la_head;
  const float* lse_b;
  std::int64_t lb_token, lb_head;
  float* out_lse;
  std::int64_t lo_token, lo_head;
  std::int64_t rows;  // tokens * heads
  std::int64_t heads;
  int vectors;                     // per row
  const std::int32_t* num_tokens;  // optional: the real tokens of a padded batch
};

// The tokens to merge of `tokens`: the first *num_tokens when given (clamped to [0, tokens]).
__device__ __forceinline__ std::int64_t real_tokens(const std::int32_t* num_tokens,
                                                    std::int64_t tokens) {
  if (num_tokens == nullptr) return tokens;
  return min(max(std::int64_t(*num_tokens), std::int64_t(0)), tokens);
}

template <typename In, int kVec>
__device__ __forceinline__ void load_vec(const typename In::Storage* p, float (&x)[kVec]) {
  using S = typename In::Storage;
  if constexpr (kVec * sizeof(S) == 16) {
    const uint4 word = *reinterpret_cast<const uint4*>(p);
    const S* s = reinterpret_cast<const S*>(&word);
#pragma unroll
    for (int i = 0; i < kVec; ++i) x[i] = In::to_f32(s[i]);
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) x[i] = In::to_f32(p[i]);
  }
}

template <typename In, int kVec>
__device__ __forceinline__ void store_vec(typename In::Storage* p, const float (&y)[kVec]) {
  using S = typename In::Storage;
  S s[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    if constexpr (sizeof(S) == 2) {
      s[i] = cvt_bf16(y[i]);
    } else {
      s[i] = y[i];
    }
  }
  if constexpr (kVec * sizeof(S) == 16) {
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(s);
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) p[i] = s[i];
  }
}

template <typename In, int kVec, int kLanes>
__global__ void __launch_bounds__(kThreads) merge_kernel(MergeArgs<typename In::Storage> a) {
  using S = typename In::Storage;
  pdl_wait();
  constexpr int kRowsPerBlock = kThreads / kLanes;
  const int lane = threadIdx.x % kLanes;
  const std::int64_t r = std::int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kLanes;
  const std::int64_t rows = real_tokens(a.num_tokens, a.rows / a.heads) * a.heads;
  if (r < rows) {  // uniform over the kLanes threads of a row
    const std::int64_t t = r / a.heads, h = r % a.heads;
    const unsigned mask =
        kLanes == 32 ? ~0u : ((1u << kLanes) - 1u) << (threadIdx.x % 32 / kLanes * kLanes);
    float la = 0.0f, lb = 0.0f;
    if (lane == 0) {
      la = a.lse_a[t * a.la_token + h * a.la_head];
      lb = a.lse_b[t * a.lb_token + h * a.lb_head];
    }
    la = __shfl_sync(mask, la, 0, kLanes);
    lb = __shfl_sync(mask, lb, 0, kLanes);
    const S* pa = a.o_a + t * a.a_token + h * a.a_head;
    const S* pb = a.o_b + t * a.b_token + h * a.b_head;
    S* po = a.out + t * a.out_token + h * a.out_head;
    const MergeWeights w = merge_weights(la, lb);
    for (int v = lane; v < a.vectors; v += kLanes) {
      float y[kVec];
      merge_values<kVec>(
          w, [&](float(&x)[kVec]) { load_vec<In, kVec>(pa + v * kVec, x); },
          [&](float(&x)[kVec]) { load_vec<In, kVec>(pb + v * kVec, x); }, y);
      store_vec<In, kVec>(po + v * kVec, y);
    }
    if (lane == 0) a.out_lse[t * a.lo_token + h * a.lo_head] = merged_lse(w);
  }
  pdl_launch_dependents();
}

template <typename S>
MergeArgs<S> merge_args(const MergeStatesParams& p, int vectors) {
  return {static_cast<const S*>(p.o_a.data),
          p.o_a.token_stride,
          p.o_a.head_stride,
          static_cast<const S*>(p.o_b.data),
          p.o_b.token_stride,
          p.o_b.head_stride,
          static_cast<S*>(p.out.data),
          p.out.token_stride,
          p.out.head_stride,
          p.lse_a.data,
          p.lse_a.token_stride,
          p.lse_a.head_stride,
          p.lse_b.data,
          p.lse_b.token_stride,
          p.lse_b.head_stride,
          p.out_lse.data,
          p.out_lse.token_stride,
          p.out_lse.head_stride,
          p.tokens * p.heads,
          p.heads,
          vectors,
          p.num_tokens};
}

template <typename In>
void run(const MergeStatesParams& p, CudaStream stream) {
  using S = typename In::Storage;
  constexpr int kWide = 16 / sizeof(S);
  const auto aligned16 = [](const void* ptr) {
    return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0;
  };
  const bool wide = aligned16(p.o_a.data) && aligned16(p.o_b.data) && aligned16(p.out.data) &&
                    p.dim % kWide == 0 && p.o_a.token_stride % kWide == 0 &&
                    p.o_a.head_stride % kWide == 0 && p.o_b.token_stride % kWide == 0 &&
                    p.o_b.head_stride % kWide == 0 && p.out.token_stride % kWide == 0 &&
                    p.out.head_stride % kWide == 0;
  const int vec = wide ? kWide : 1;
  if (p.dim / vec > (std::int64_t(1) << 30)) {
    throw Error(ErrorCategory::kUnsupported,
                concat("merge_attention_states: head dim too large, got ", p.dim));
  }
  const MergeArgs<S> args = merge_args<S>(p, int(p.dim / vec));
  auto launch_with = [&]<int kVec, int kLanes>() {
    constexpr int kRowsPerBlock = kThreads / kLanes;
    const std::int64_t blocks = (args.rows + kRowsPerBlock - 1) / kRowsPerBlock;
    if (blocks > 0x7FFFFFFF) {
      throw Error(ErrorCategory::kUnsupported,
                  concat("merge_attention_states: too many rows, got ", args.rows));
    }
    launch("merge_attention_states", merge_kernel<In, kVec, kLanes>,
           {dim3(unsigned(blocks)), dim3(kThreads), 0, stream, true}, args);
  };
  if (!wide) {
    launch_with.template operator()<1, 32>();
  } else if (args.vectors <= 8) {
    launch_with.template operator()<kWide, 8>();
  } else if (args.vectors <= 16) {
    launch_with.template operator()<kWide, 16>();
  } else {
    launch_with.template operator()<kWide, 32>();
  }
}

// ---- The merge with a fused output quantization (docs/design.md section 6)
//
// One CTA per token row of W = H * D values at a time (grid-stride over the rows), kN consecutive
// values a thread: kChunk for the FP8 keys (an e4m3 group of 128 (64) is 16 (8) neighbouring
// lanes), kNvfp4Chunk for NVFP4 (a block a lane, so each lane computes one block scale and
// encodes its block with the standalone kernel's block function). The values are merged as above,
// rounded to bf16 (the unquantized output) and quantized with the standalone ops' arithmetic
// (cuda/quantize/quant_device.cuh). Every thread computes the weights of its values' heads
// itself; the row's lse are written after a barrier, once every thread of the CTA has read them
// (out_lse may be lse_a). The vector variant needs D a multiple of kN (a thread's values in one
// head) and aligned rows; the other merges value by value.
// Non-coherent loads: a quantized out never aliases the states.

constexpr int kChunk = 8;
constexpr int kNvfp4Chunk = 16;

struct QuantRows {
  std::int64_t tokens;
  int heads;
  int width;       // W
  FastDivmod dim;  // D: a row's column to (head, dim)
};

template <typename S>
__device__ __forceinline__ MergeWeights weights_of(const MergeArgs<S>& a, std::int64_t t,
                                                   std::uint32_t h) {
  return merge_weights(a.lse_a[t * a.la_token + h * a.la_head],
                       a.lse_b[t * a.lb_token + h * a.lb_head]);
}

// The n values of row t from column col on (zeros past them), merged and rounded to bf16.
template <typename In, bool kVector, int kN>
__device__ __forceinline__ void load_merged(const MergeArgs<typename In::Storage>& a,
                                            const QuantRows& r, std::int64_t t, int col, int n,
                                            float (&y)[kN]) {
  using S = typename In::Storage;
  if constexpr (kVector) {
    std::uint32_t h, d;
    r.dim.divmod(std::uint32_t(col), h, d);
    if (n > 0) {
      merge_values<kN>(
          weights_of(a, t, h),
          [&](float(&x)[kN]) { load_f32<In, kN>(a.o_a + t * a.a_token + h * a.a_head + d, x); },
          [&](float(&x)[kN]) { load_f32<In, kN>(a.o_b + t * a.b_token + h * a.b_head + d, x); }, y);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      if (i >= n) continue;
      std::uint32_t h, d;
      r.dim.divmod(std::uint32_t(col + i), h, d);
      float x[1];
      merge_values<1>(
          weights_of(a, t, h),
          [&](float(&v)[1]) { v[0] = In::to_f32(__ldg(a.o_a + t * a.a_token + h * a.a_head + d)); },
          [&](float(&v)[1]) { v[0] = In::to_f32(__ldg(a.o_b + t * a.b_token + h * a.b_head + d)); },
          x);
      y[i] = x[0];
    }
  }
#pragma unroll
  for (int i = 0; i < kN; ++i) y[i] = i < n ? decode_bf16(cvt_bf16(y[i])) : 0.0f;
}

// The first n of y as e4m3 bytes at p: one 8-byte store in the vector variant.
template <bool kVector>
__device__ __forceinline__ void store_e4m3(std::uint8_t* p, const float (&y)[kChunk], int n) {
  if constexpr (kVector) {
    store_fp8<kChunk>(p, y, false);
  } else {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      if (i < n) p[i] = std::uint8_t(cvt_e4m3x2(y[i], 0.0f));
    }
  }
}

// A thread's part of a group of kLanes * kChunk values (whole groups: W is a multiple of the
// group size, so `valid` is the same over a group's lanes; every lane takes part in the shuffles).
template <bool kVector, int kLanes>
__device__ __forceinline__ void quantize_group(const OutputQuantTarget& q, std::int64_t t, int col,
                                               bool valid, float (&y)[kChunk]) {
  float amax = q.eps;
  if (valid) {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) amax = fmaxf(amax, fabsf(y[i]));
  }
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(~0u, amax, offset, kLanes));
  }
  if (!valid) return;
  const GroupScale scale = group_scale(amax, q.group.format);
  scale_group(y, scale);
  store_e4m3<kVector>(q.out + t * q.out_row_stride + col, y, kChunk);
  if (threadIdx.x % kLanes == 0) {
    write_group_scale(q.group, t, std::uint32_t(col / (kLanes * kChunk)), scale);
  }
}

// One NVFP4 block a lane: its 8 bytes of e2m1 pairs and its scale, from the block's bf16 values.
template <bool kVector>
__device__ __forceinline__ void quantize_nvfp4(const OutputQuantTarget& q, float global_scale,
                                               float inv_global_scale, std::int64_t t, int col,
                                               const float (&y)[kNvfp4Chunk]) {
  std::uint32_t w[8];  // the bf16 pairs, as the standalone op reads them
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    w[i] = __byte_perm(__float_as_uint(y[2 * i]), __float_as_uint(y[2 * i + 1]), 0x7632);
  }
  uint2 codes;
  const std::uint8_t sf = nvfp4_quantize_block<Bf16In>(w, global_scale, inv_global_scale, codes);
  std::uint8_t* out = q.out + t * q.out_row_stride + col / 2;
  if constexpr (kVector) {
    *reinterpret_cast<uint2*>(out) = codes;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = std::uint8_t((i < 4 ? codes.x : codes.y) >> (8 * (i % 4)));
  }
  q.block_scales[nvfp4_scale_at(q, t, col / 16)] = sf;
}

// A thread's kChunk values in an FP8 key.
template <bool kVector>
__device__ __forceinline__ void quantize_fp8(const OutputQuantTarget& q, float scale_inv,
                                             std::int64_t t, int col, bool valid, int n,
                                             float (&y)[kChunk]) {
  switch (q.key) {
    case OutputQuantKey::kFp8Static:
#pragma unroll
      for (int i = 0; i < kChunk; ++i) y[i] *= scale_inv;
      if (valid) store_e4m3<kVector>(q.out + t * q.out_row_stride + col, y, n);
      break;
    case OutputQuantKey::kFp8Group128:
      quantize_group<kVector, 128 / kChunk>(q, t, col, valid, y);
      break;
    case OutputQuantKey::kFp8Group64:
      quantize_group<kVector, 64 / kChunk>(q, t, col, valid, y);
      break;
    case OutputQuantKey::kNvfp4:  // merge_quant_kernel's kNvfp4Chunk instance
    case OutputQuantKey::kNone:
      break;
  }
}

template <typename In, bool kVector, int kN>
__global__ void __launch_bounds__(kThreads)
    merge_quant_kernel(MergeArgs<typename In::Storage> a, QuantRows r, OutputQuantTarget q) {
  pdl_wait();
  const float scale = q.scale != nullptr ? *q.scale : 1.0f;  // static scale_inv, NVFP4 global
  const float inv_global_scale = nvfp4_inv_global_scale(scale);
  const std::int64_t visit = q.swizzled ? (r.tokens + 127) / 128 * 128 : r.tokens;
  const std::int64_t real = real_tokens(a.num_tokens, r.tokens);
  for (std::int64_t t = blockIdx.x; t < visit; t += gridDim.x) {
    if (t >= real && t < r.tokens) continue;  // a padded batch's rows: left as they are
    if (t >= r.tokens) {                      // the swizzled layout's padding rows
      zero_nvfp4_padding(q, t, int(threadIdx.x), int(blockDim.x));
      continue;
    }
    // The bound is warp-uniform: every lane reaches the shuffles.
    for (int base = int(threadIdx.x / 32) * 32 * kN; base < r.width; base += int(blockDim.x) * kN) {
      const int col = base + int(threadIdx.x % 32) * kN;
      const bool valid = col < r.width;
      const int n = valid ? min(kN, r.width - col) : 0;
      float y[kN];
      load_merged<In, kVector, kN>(a, r, t, col, n, y);
      if constexpr (kN == kNvfp4Chunk) {  // W is a multiple of 16: whole blocks
        if (valid) quantize_nvfp4<kVector>(q, scale, inv_global_scale, t, col, y);
      } else {
        quantize_fp8<kVector>(q, scale, t, col, valid, n, y);
      }
    }
    if (q.swizzled && threadIdx.x == 0) zero_nvfp4_padding(q, t, 0, 1);
    __syncthreads();  // every lse of row t is read
    for (int h = int(threadIdx.x); h < r.heads; h += int(blockDim.x)) {
      a.out_lse[t * a.lo_token + h * a.lo_head] = merged_lse(weights_of(a, t, std::uint32_t(h)));
    }
  }
  pdl_launch_dependents();
}

template <typename In>
void run_quantized(const MergeStatesParams& p, CudaStream stream) {
  using S = typename In::Storage;
  const OutputQuantTarget q = output_quant_target(p.quant);
  const std::int64_t width = p.heads * p.dim;
  if (width > (std::int64_t(1) << 30)) {
    throw Error(ErrorCategory::kUnsupported,
                concat("merge_attention_states: rows of more than 2^30 values, got ", width));
  }
  const auto aligned = [](const void* ptr, int bytes) {
    return reinterpret_cast<std::uintptr_t>(ptr) % bytes == 0;
  };
  const bool nvfp4 = q.key == OutputQuantKey::kNvfp4;
  const int chunk = nvfp4 ? kNvfp4Chunk : kChunk;
  const int out_bytes = nvfp4 ? kNvfp4Chunk / 2 : kChunk;
  // 16-byte loads of kChunk-aligned values (a chunk of 16 is two of them).
  const bool vector = p.dim % chunk == 0 && aligned(p.o_a.data, 16) && aligned(p.o_b.data, 16) &&
                      p.o_a.token_stride % kChunk == 0 && p.o_a.head_stride % kChunk == 0 &&
                      p.o_b.token_stride % kChunk == 0 && p.o_b.head_stride % kChunk == 0 &&
                      aligned(q.out, out_bytes) && q.out_row_stride % out_bytes == 0;
  const QuantRows rows{p.tokens, int(p.heads), int(width), FastDivmod(std::uint32_t(p.dim))};
  // Threads for the row's chunks, a whole number of warps, at most kThreads.
  const int threads =
      int(std::clamp<std::int64_t>((width + chunk * 32 - 1) / (chunk * 32) * 32, 32, kThreads));
  const std::int64_t visit = q.swizzled ? (p.tokens + 127) / 128 * 128 : p.tokens;
  const auto launch_with = [&]<bool kVector, int kN>() {
    auto* const kernel = merge_quant_kernel<In, kVector, kN>;
    const int resident = resident_blocks(reinterpret_cast<const void*>(kernel), threads);
    launch("merge_attention_states (output quantization)", kernel,
           {grid_for(visit, 1, resident), dim3(threads), 0, stream, true}, merge_args<S>(p, 0),
           rows, q);
  };
  if (nvfp4) {
    vector ? launch_with.template operator()<true, kNvfp4Chunk>()
           : launch_with.template operator()<false, kNvfp4Chunk>();
  } else {
    vector ? launch_with.template operator()<true, kChunk>()
           : launch_with.template operator()<false, kChunk>();
  }
}

}  // namespace

void merge_attention_states(const MergeStatesParams& p, CudaStream stream) {
  const bool quantized = p.quant.key != OutputQuantKey::kNone;
  if (p.dtype == DType::kBF16) {
    quantized ? run_quantized<Bf16In>(p, stream) : run<Bf16In>(p, stream);
  } else {
    quantized ? run_quantized<F32In>(p, stream) : run<F32In>(p, stream);
  }
}

}  // namespace fp8mla::cuda
