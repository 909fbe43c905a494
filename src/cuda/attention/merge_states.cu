// merge_attention_states (fp8mla/attention.hpp, op 9): (o_a, lse_a) (+) (o_b, lse_b).
//
// Memory-bound. kLanes threads (8, 16 or 32: the fewest that cover the row's vectors) own one
// (token, head) row: lane 0 reads the lse pair once and broadcasts it, every lane moves 16-byte
// vectors of o_a/o_b (8 bf16 or 4 f32) and stores 16 bytes of out; rows whose pointers, strides or
// width do not allow 16-byte access take the scalar variant (32 lanes, one element each). The math
// is the CPU's (src/cpu/merge_states.cpp) in the same order; only expf/logf differ from
// std::exp/std::log. A side whose weight is exactly 0 is not read. Plain (coherent) loads, since
// out may alias o_a (in place): each lane reads its elements before it writes them, and the lse
// pair is read before lane 0 writes out_lse.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/launch.cuh"
#include "cuda/common/vector_io.cuh"
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
  int vectors;  // per row
};

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
  pdl_wait();
  constexpr int kRowsPerBlock = kThreads / kLanes;
  const int lane = threadIdx.x % kLanes;
  const std::int64_t r = std::int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kLanes;
  if (r < a.rows) {  // uniform over the kLanes threads of a row
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
    const auto* pa = a.o_a + t * a.a_token + h * a.a_head;
    const auto* pb = a.o_b + t * a.b_token + h * a.b_head;
    auto* po = a.out + t * a.out_token + h * a.out_head;
    const bool empty = la == -INFINITY && lb == -INFINITY;
    const float m = la > lb ? la : lb;
    const float w_a = empty ? 0.0f : expf(la - m), w_b = empty ? 0.0f : expf(lb - m);
    const float s = w_a + w_b;
    for (int v = lane; v < a.vectors; v += kLanes) {
      float y[kVec];
      if (empty) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) y[i] = 0.0f;
      } else if (w_b == 0.0f) {
        float xa[kVec];
        load_vec<In, kVec>(pa + v * kVec, xa);
#pragma unroll
        for (int i = 0; i < kVec; ++i) y[i] = (w_a * xa[i]) / s;
      } else if (w_a == 0.0f) {
        float xb[kVec];
        load_vec<In, kVec>(pb + v * kVec, xb);
#pragma unroll
        for (int i = 0; i < kVec; ++i) y[i] = (w_b * xb[i]) / s;
      } else {
        float xa[kVec], xb[kVec];
        load_vec<In, kVec>(pa + v * kVec, xa);
        load_vec<In, kVec>(pb + v * kVec, xb);
#pragma unroll
        for (int i = 0; i < kVec; ++i) y[i] = (w_a * xa[i] + w_b * xb[i]) / s;
      }
      store_vec<In, kVec>(po + v * kVec, y);
    }
    if (lane == 0) a.out_lse[t * a.lo_token + h * a.lo_head] = empty ? -INFINITY : m + logf(s);
  }
  pdl_launch_dependents();
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
  const MergeArgs<S> args{static_cast<const S*>(p.o_a.data),
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
                          int(p.dim / vec)};
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

}  // namespace

void merge_attention_states(const MergeStatesParams& p, CudaStream stream) {
  if (p.dtype == DType::kBF16) {
    run<Bf16In>(p, stream);
  } else {
    run<F32In>(p, stream);
  }
}

}  // namespace fp8mla::cuda
