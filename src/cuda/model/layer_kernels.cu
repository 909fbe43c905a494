#include "cuda/model/layer_kernels.hpp"

#include <algorithm>

#include "cuda/common/convert.cuh"
#include "cuda/common/launch.cuh"
#include "fp8mla/mla_prep.hpp"
#include "fp8mla/numerics.hpp"

namespace fp8mla::cuda::model {
namespace {

constexpr int kThreads = 256;
constexpr int kNope = 128, kRope = 64, kQk = 192;

// Eight bf16 values of one 16-byte word.
__device__ __forceinline__ void unpack8(const uint4& w, float (&x)[8]) {
  const auto* h = reinterpret_cast<const std::uint16_t*>(&w);
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = decode_bf16(h[i]);
}

// One block per row: 16-byte loads, an f32 sum of squares reduced over the block.
__global__ void __launch_bounds__(kThreads) rms_norm_kernel(RmsNormParams p) {
  __shared__ float warp_sums[kThreads / 32];
  __shared__ float inv_rms;
  const std::int64_t row = blockIdx.x;
  const uint4* x = reinterpret_cast<const uint4*>(p.x + row * p.x_stride);
  const int words = p.width / 8;
  pdl_wait();
  float sum = 0.0f;
  for (int w = threadIdx.x; w < words; w += kThreads) {
    float v[8];
    unpack8(x[w], v);
#pragma unroll
    for (int i = 0; i < 8; ++i) sum = fmaf(v[i], v[i], sum);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(~0u, sum, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int i = 0; i < kThreads / 32; ++i) total += warp_sums[i];
    inv_rms = 1.0f / sqrtf(total / float(p.width) + p.eps);
  }
  __syncthreads();
  const float inv = inv_rms;
  const uint4* weight = reinterpret_cast<const uint4*>(p.weight);
  uint4* y = reinterpret_cast<uint4*>(p.y + row * p.y_stride);
  for (int w = threadIdx.x; w < words; w += kThreads) {
    float v[8], g[8];
    unpack8(x[w], v);
    unpack8(weight[w], g);
    uint4 out;
    auto* h = reinterpret_cast<std::uint16_t*>(&out);
#pragma unroll
    for (int i = 0; i < 8; ++i) h[i] = cvt_bf16(__fmul_rn(__fmul_rn(v[i], inv), g[i]));
    y[w] = out;
  }
  pdl_launch_dependents();
}

// RoPE of an interleaved pair, as model::rope_bf16 computes it (products rounded before the fma).
__device__ __forceinline__ void rope_pair(float a, float b, float c, float s, std::uint16_t& ya,
                                          std::uint16_t& yb) {
  ya = cvt_bf16(__fmaf_rn(a, c, -__fmul_rn(b, s)));
  yb = cvt_bf16(__fmaf_rn(b, c, __fmul_rn(a, s)));
}

// One block per token.
__global__ void __launch_bounds__(kThreads) rope_assemble_kernel(RopeAssembleParams p) {
  __shared__ __align__(16) std::uint16_t k_pe[kRope];
  const std::int64_t t = blockIdx.x;
  pdl_wait();
  const float* cs = p.positions != nullptr ? p.cos_sin + p.positions[t] * kRope : nullptr;
  const std::uint16_t* pe = p.k_pe + t * p.k_pe_stride;
  if (threadIdx.x < kRope / 2) {
    const int i = threadIdx.x;
    if (cs != nullptr) {
      rope_pair(decode_bf16(pe[2 * i]), decode_bf16(pe[2 * i + 1]), cs[i], cs[kRope / 2 + i],
                k_pe[2 * i], k_pe[2 * i + 1]);
    } else {
      k_pe[2 * i] = pe[2 * i];
      k_pe[2 * i + 1] = pe[2 * i + 1];
    }
  }
  __syncthreads();
  if (p.k_pe_out != nullptr && threadIdx.x < kRope / 8) {
    reinterpret_cast<uint4*>(p.k_pe_out + t * kRope)[threadIdx.x] =
        reinterpret_cast<const uint4*>(k_pe)[threadIdx.x];
  }
  // K: 24 words per head, 16 of k_nope then 8 of k_pe.
  constexpr int kWords = kQk / 8, kNopeWords = kNope / 8;
  uint4* k_out = reinterpret_cast<uint4*>(p.k_out + t * p.heads * kQk);
  for (std::int64_t u = threadIdx.x; u < p.heads * kWords; u += kThreads) {
    const std::int64_t h = u / kWords;
    const int w = int(u % kWords);
    k_out[u] = w < kNopeWords
                   ? reinterpret_cast<const uint4*>(p.k_nope + t * p.k_nope_token_stride +
                                                    h * p.k_nope_head_stride)[w]
                   : reinterpret_cast<const uint4*>(k_pe)[w - kNopeWords];
  }
  if (p.q_pe != nullptr && cs != nullptr) {
    for (std::int64_t u = threadIdx.x; u < p.heads * (kRope / 2); u += kThreads) {
      const std::int64_t h = u / (kRope / 2);
      const int i = int(u % (kRope / 2));
      std::uint16_t* q = p.q_pe + t * p.q_token_stride + h * p.q_head_stride + 2 * i;
      rope_pair(decode_bf16(q[0]), decode_bf16(q[1]), cs[i], cs[kRope / 2 + i], q[0], q[1]);
    }
  }
  pdl_launch_dependents();
}

// Grid-stride over (row, column) pairs; one atomicMax per block.
__global__ void __launch_bounds__(kThreads) amax_kernel(AmaxParams p) {
  __shared__ unsigned int warp_max[kThreads / 32];
  pdl_wait();
  unsigned int m = 0;
  const std::int64_t n = p.rows * p.cols;
  for (std::int64_t i = blockIdx.x * std::int64_t(kThreads) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * kThreads) {
    m = max(m, unsigned(p.x[(i / p.cols) * p.row_stride + i % p.cols] & 0x7fffu));
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) m = max(m, __shfl_xor_sync(~0u, m, offset));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < kThreads / 32; ++i) m = max(m, warp_max[i]);
    atomicMax(p.amax_bits, m);
  }
  pdl_launch_dependents();
}

// Grid-stride over the words of the rows; Word is uint4 or a byte.
template <typename Word>
__global__ void __launch_bounds__(kThreads) latent_rows_kernel(LatentRowsParams p) {
  constexpr std::int64_t kWords = kMlaLatentDim / sizeof(Word);
  pdl_wait();
  for (std::int64_t i = blockIdx.x * std::int64_t(kThreads) + threadIdx.x; i < p.count * kWords;
       i += std::int64_t(gridDim.x) * kThreads) {
    const std::int64_t r = i / kWords, w = i % kWords, slot = p.slots[r];
    Word* row = reinterpret_cast<Word*>(p.rows + r * kMlaLatentDim) + w;
    Word* cached = slot < 0
                       ? nullptr
                       : reinterpret_cast<Word*>(p.cache + (slot / p.page_size) * p.page_stride +
                                                 (slot % p.page_size) * p.row_stride) +
                             w;
    if (p.to_cache) {
      if (cached != nullptr) *cached = *row;
    } else {
      *row = cached != nullptr ? *cached : Word{};
    }
  }
  pdl_launch_dependents();
}

__global__ void fill_kernel(FillParams p) {
  pdl_wait();  // an earlier kernel may still read the cells
  if (int(threadIdx.x) < p.count) p.dst[threadIdx.x] = p.values[threadIdx.x];
  pdl_launch_dependents();
}

}  // namespace

void fill_f32(const FillParams& p, cudaStream_t stream) {
  if (p.count == 0) return;
  launch("fill_f32", fill_kernel, {dim3(1), dim3(32), 0, stream, true}, p);
}

void copy_latent_rows(const LatentRowsParams& p, cudaStream_t stream) {
  if (p.count == 0) return;
  const bool wide = reinterpret_cast<std::uintptr_t>(p.cache) % 16 == 0 &&
                    p.page_stride % 16 == 0 && p.row_stride % 16 == 0;
  const LaunchConfig config{grid_for(p.count * kMlaLatentDim, kThreads * 16, 1024), dim3(kThreads),
                            0, stream, true};
  if (wide) {
    launch("copy_latent_rows", latent_rows_kernel<uint4>, config, p);
  } else {
    launch("copy_latent_rows", latent_rows_kernel<std::uint8_t>, config, p);
  }
}

void amax_bf16(const AmaxParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return;
  launch("amax_bf16", amax_kernel,
         {grid_for(p.rows * p.cols, kThreads * 8, 1024), dim3(kThreads), 0, stream, true}, p);
}

void rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  if (p.rows == 0) return;
  launch("rms_norm", rms_norm_kernel, {dim3(unsigned(p.rows)), dim3(kThreads), 0, stream, true}, p);
}

void rope_assemble_bf16(const RopeAssembleParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  launch("rope_assemble_bf16", rope_assemble_kernel,
         {dim3(unsigned(p.tokens)), dim3(kThreads), 0, stream, true}, p);
}

}  // namespace fp8mla::cuda::model
