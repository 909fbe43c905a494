// Per-tensor FP8 quantization: out = fp8(x * scale_inv), static or dynamic scale.
//
// Memory-bound: each thread moves kUnroll vectors of 32 input bytes (two LDG.128 in, one 16-byte
// store out for 16-bit inputs), all loads issued before the first conversion, over (row, vector)
// pairs so any row stride works; one block per kThreads * kUnroll vectors (measured faster on the
// H200 than a grid-stride loop over resident blocks). Rows whose width or alignment does not allow
// the vectors take the scalar variant.
// The dynamic scale takes three more small steps: the scale cell doubles as the amax accumulator
// (zeroed, then atomicMax of each block's max), the quantize kernel derives scale_inv from it, and
// a one-thread kernel finally turns it into the scale. Inputs of at most kOneBlockElements take a
// single launch instead: one block finds the amax, quantizes (its second read hits L1) and writes
// the scale, since below that size the three extra launches cost more host and GPU time than one
// SM's traversal.
#include <algorithm>

#include "cuda/common/launch.cuh"
#include "cuda/common/vector_io.cuh"
#include "fp8mla/error.hpp"
#include "ops/quantize_params.hpp"

namespace fp8mla::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 2;
constexpr int kOneBlockThreads = 1024;
constexpr std::int64_t kOneBlockElements = std::int64_t(1) << 16;

// The traversal shared by the amax and quantize kernels: `rows` rows of vectors_per_row vectors of
// kVec elements each, starting at `first_row` (launches are split so indices fit in 32 bits).
struct Traversal {
  std::int64_t first_row;
  std::uint32_t vectors;  // rows in this launch * vectors_per_row
  FastDivmod vectors_per_row;
};

template <typename In>
struct QuantizeArgs {
  const typename In::Storage* input;
  std::int64_t input_row_stride;
  std::uint8_t* out;
  std::int64_t out_row_stride;
  bool e5m2;
  float scale_inv;        // static by value
  const float* scale_in;  // static from memory, or the amax cell (dynamic)
  bool dynamic;
  float fp8_max;
};

__device__ __forceinline__ float dynamic_scale(float amax, float fp8_max) {
  return fmaxf(amax / fp8_max, kMinDynamicScale);
}

template <typename In, int kVec>
__global__ void __launch_bounds__(kThreads) quantize_kernel(QuantizeArgs<In> a, Traversal t) {
  pdl_wait();
  float scale_inv = a.scale_inv;
  if (a.scale_in != nullptr) {
    scale_inv = a.dynamic ? __frcp_rn(dynamic_scale(*a.scale_in, a.fp8_max)) : *a.scale_in;
  }
  const std::uint32_t stride = gridDim.x * kThreads;
  for (std::uint32_t base = blockIdx.x * kThreads * kUnroll + threadIdx.x; base < t.vectors;
       base += stride * kUnroll) {
    float x[kUnroll][kVec];
    std::int64_t out_offset[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::uint32_t v = base + u * kThreads;
      if (v < t.vectors) {
        std::uint32_t row, col;
        t.vectors_per_row.divmod(v, row, col);
        const std::int64_t r = t.first_row + row;
        load_f32<In, kVec>(a.input + r * a.input_row_stride + std::int64_t(col) * kVec, x[u]);
        out_offset[u] = r * a.out_row_stride + std::int64_t(col) * kVec;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * kThreads < t.vectors) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) x[u][i] *= scale_inv;
        store_fp8<kVec>(a.out + out_offset[u], x[u], a.e5m2);
      }
    }
  }
  pdl_launch_dependents();
}

template <typename In, int kVec>
__global__ void __launch_bounds__(kThreads)
    amax_kernel(const typename In::Storage* input, std::int64_t row_stride, Traversal t,
                float* amax_cell) {
  pdl_wait();
  float amax = 0.0f;
  const std::uint32_t stride = gridDim.x * kThreads;
  for (std::uint32_t v = blockIdx.x * kThreads + threadIdx.x; v < t.vectors; v += stride) {
    std::uint32_t row, col;
    t.vectors_per_row.divmod(v, row, col);
    float x[kVec];
    load_f32<In, kVec>(input + (t.first_row + row) * row_stride + std::int64_t(col) * kVec, x);
#pragma unroll
    for (int i = 0; i < kVec; ++i) amax = fmaxf(amax, fabsf(x[i]));  // fmaxf drops NaN
  }
  amax = block_max<kThreads>(amax);
  // Non-negative floats order like their bit patterns, so an integer max is a float max.
  if (threadIdx.x == 0)
    atomicMax(reinterpret_cast<unsigned int*>(amax_cell), __float_as_uint(amax));
  pdl_launch_dependents();
}

// Vector v of a one-launch traversal (first_row 0) into x; returns its offset in the output.
template <typename In, int kVec>
__device__ __forceinline__ std::int64_t load_vector(const QuantizeArgs<In>& a, const Traversal& t,
                                                    std::uint32_t v, float (&x)[kVec]) {
  std::uint32_t row, col;
  t.vectors_per_row.divmod(v, row, col);
  load_f32<In, kVec>(a.input + std::int64_t(row) * a.input_row_stride + std::int64_t(col) * kVec,
                     x);
  return std::int64_t(row) * a.out_row_stride + std::int64_t(col) * kVec;
}

template <typename In, int kVec>
__global__ void __launch_bounds__(kOneBlockThreads)
    quantize_dynamic_one_block_kernel(QuantizeArgs<In> a, Traversal t, float* scale_out) {
  pdl_wait();
  __shared__ float scale_inv_shared;
  float amax = 0.0f;
  for (std::uint32_t v = threadIdx.x; v < t.vectors; v += kOneBlockThreads) {
    float x[kVec];
    load_vector(a, t, v, x);
#pragma unroll
    for (int i = 0; i < kVec; ++i) amax = fmaxf(amax, fabsf(x[i]));  // fmaxf drops NaN
  }
  amax = block_max<kOneBlockThreads>(amax);
  if (threadIdx.x == 0) {
    const float scale = dynamic_scale(amax, a.fp8_max);
    *scale_out = scale;
    scale_inv_shared = __frcp_rn(scale);  // as quantize_kernel derives it from the amax cell
  }
  __syncthreads();
  const float scale_inv = scale_inv_shared;
  for (std::uint32_t v = threadIdx.x; v < t.vectors; v += kOneBlockThreads) {
    float x[kVec];
    const std::int64_t out_offset = load_vector(a, t, v, x);
#pragma unroll
    for (int i = 0; i < kVec; ++i) x[i] *= scale_inv;
    store_fp8<kVec>(a.out + out_offset, x, a.e5m2);
  }
  pdl_launch_dependents();
}

__global__ void finalize_scale_kernel(float* cell, float fp8_max) {
  pdl_wait();
  *cell = dynamic_scale(*cell, fp8_max);
}

// The largest vector width (16 bytes of input, or 1) that every row start allows.
template <typename In>
int vector_width(const QuantizeFp8Params& p) {
  constexpr int kWide = 32 / sizeof(typename In::Storage);
  const bool aligned = reinterpret_cast<std::uintptr_t>(p.input.data) % 16 == 0 &&
                       reinterpret_cast<std::uintptr_t>(p.out.data) % kWide == 0 &&
                       p.input.cols % kWide == 0 && p.input.row_stride % kWide == 0 &&
                       p.out.row_stride % kWide == 0;
  return aligned ? kWide : 1;
}

// Calls launch_one(traversal, grid) for row ranges whose vector count fits in 32 bits. `kernel`
// given: a grid of its resident blocks (grid-stride); null: one block per kThreads * per_thread
// vectors.
template <typename LaunchOne>
void for_each_launch(const Rows& rows, int vec, int per_thread, const void* kernel,
                     LaunchOne launch_one) {
  const std::int64_t vectors_per_row = rows.cols / vec;
  const int max_blocks = kernel ? resident_blocks(kernel, kThreads) : (1 << 30);
  for_each_32bit_launch(rows.rows, vectors_per_row, [&](std::int64_t first, std::int64_t n) {
    const Traversal t{first, std::uint32_t(n * vectors_per_row),
                      FastDivmod(std::uint32_t(vectors_per_row))};
    launch_one(t, grid_for(t.vectors, kThreads * per_thread, max_blocks));
  });
}

template <typename In>
void run(const QuantizeFp8Params& p, CudaStream stream) {
  using Storage = typename In::Storage;
  const auto* input = static_cast<const Storage*>(p.input.data);
  const bool dynamic = p.scale == QuantizeFp8Params::Scale::kDynamic;
  const float fp8_max = p.out.dtype == DType::kE5M2 ? kE5M2Max : kE4M3Max;
  if (p.input.cols > std::int64_t(1) << 31) {
    throw Error(ErrorCategory::kUnsupported,
                concat("quantize_fp8: rows of more than 2^31 elements, got ", p.input.cols));
  }
  const bool one_block = dynamic && p.input.rows * p.input.cols <= kOneBlockElements;
  if (dynamic && !one_block) {
    check(cudaMemsetAsync(p.scale_out, 0, sizeof(float), stream), "cudaMemsetAsync");
  }
  const QuantizeArgs<In> args{input,
                              p.input.row_stride,
                              static_cast<std::uint8_t*>(p.out.data),
                              p.out.row_stride,
                              p.out.dtype == DType::kE5M2,
                              p.scale_inv,
                              dynamic ? p.scale_out : p.scale_inv_ptr,
                              dynamic,
                              fp8_max};
  constexpr int kWide = 32 / sizeof(Storage);
  const int vec = p.input.rows == 0 ? 1 : vector_width<In>(p);
  auto launch_all = [&]<int kVec>() {
    if (one_block) {
      const std::uint32_t vectors_per_row = std::uint32_t(p.input.cols / kVec);
      const Traversal t{0, std::uint32_t(p.input.rows) * vectors_per_row,
                        FastDivmod(std::max(vectors_per_row, 1u))};
      launch("quantize_fp8 one block", quantize_dynamic_one_block_kernel<In, kVec>,
             {dim3(1), dim3(kOneBlockThreads), 0, stream, true}, args, t, p.scale_out);
      return;
    }
    if (dynamic) {
      const void* amax = reinterpret_cast<const void*>(amax_kernel<In, kVec>);
      for_each_launch(p.input, kVec, 1, amax, [&](const Traversal& t, dim3 grid) {
        launch("quantize_fp8 amax", amax_kernel<In, kVec>, {grid, dim3(kThreads), 0, stream, true},
               input, p.input.row_stride, t, p.scale_out);
      });
    }
    for_each_launch(p.input, kVec, kUnroll, nullptr, [&](const Traversal& t, dim3 grid) {
      launch("quantize_fp8", quantize_kernel<In, kVec>, {grid, dim3(kThreads), 0, stream, true},
             args, t);
    });
  };
  dispatch_vector_width<kWide>(vec == kWide, launch_all);
  if (dynamic && !one_block) {
    launch("quantize_fp8 finalize", finalize_scale_kernel, {dim3(1), dim3(1), 0, stream, true},
           p.scale_out, fp8_max);
  }
}

}  // namespace

void quantize_fp8(const QuantizeFp8Params& p, CudaStream stream) {
  dispatch_input_dtype(p.input.dtype, [&]<typename In>() { run<In>(p, stream); });
}

}  // namespace fp8mla::cuda
