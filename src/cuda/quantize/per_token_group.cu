// Per-token-group FP8 quantization: one scale per group of 64 or 128 contiguous elements.
//
// Vector variant: kLanes lanes share a group, each with one 16-byte load; the group max is a
// shuffle reduction inside those lanes, then each lane scales and stores its 8 (or 4) bytes and the
// group's first lane writes the scale. Every thread handles kUnroll groups per step so enough
// loads are in flight. Scales go wherever the scale tensor's strides say; packed UE8M0 words are
// written one exponent byte at a time, so no group waits for its three neighbours. Inputs that do
// not allow 16-byte vectors take the scalar variant (one thread per group, two passes).
#include <algorithm>

#include "cuda/common/launch.cuh"
#include "cuda/common/vector_io.cuh"
#include "cuda/quantize/quant_device.cuh"
#include "fp8mla/error.hpp"
#include "ops/quantize_params.hpp"

namespace fp8mla::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

struct GroupArgs {
  const void* input;
  std::int64_t input_row_stride;
  std::uint8_t* out;
  std::int64_t out_row_stride;
  float eps;
  GroupScales scales;
  std::int64_t first_row;  // launches are split so group indices fit in 32 bits
  std::uint32_t groups;    // groups in this launch
  FastDivmod row_of_group;
};

template <typename In, int kGroup>
__global__ void __launch_bounds__(kThreads) group_quant_vector_kernel(GroupArgs a) {
  using Storage = typename In::Storage;
  constexpr int kVec = 16 / sizeof(Storage);
  constexpr int kLanes = kGroup / kVec;  // lanes per group: 8, 16 or 32
  constexpr int kGroupsPerWarp = 32 / kLanes;
  constexpr int kWarps = kThreads / 32;
  pdl_wait();
  const std::uint32_t lane = threadIdx.x % kLanes;
  const std::uint32_t sub = (threadIdx.x % 32) / kLanes;  // which of the warp's groups
  // A warp takes kUnroll * kGroupsPerWarp consecutive groups per step. The loop bound is uniform
  // across the warp, so every lane reaches the shuffles.
  const std::uint32_t step = gridDim.x * kWarps * kGroupsPerWarp * kUnroll;
  for (std::uint32_t warp_base =
           (blockIdx.x * kWarps + threadIdx.x / 32) * kGroupsPerWarp * kUnroll;
       warp_base < a.groups; warp_base += step) {
    float x[kUnroll][kVec];
    std::int64_t rows[kUnroll];
    std::uint32_t cols[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::uint32_t group = warp_base + u * kGroupsPerWarp + sub;
      if (group < a.groups) {
        std::uint32_t row, g;
        a.row_of_group.divmod(group, row, g);
        rows[u] = a.first_row + row;
        cols[u] = g;
        const auto* in = static_cast<const Storage*>(a.input) + rows[u] * a.input_row_stride +
                         std::int64_t(g) * kGroup + lane * kVec;
        load_f32<In, kVec>(in, x[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const bool valid = warp_base + u * kGroupsPerWarp + sub < a.groups;
      float amax = a.eps;
      if (valid) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) amax = fmaxf(amax, fabsf(x[u][i]));
      }
#pragma unroll
      for (int offset = kLanes / 2; offset > 0; offset /= 2) {
        amax = fmaxf(amax, __shfl_xor_sync(~0u, amax, offset, kLanes));
      }
      if (!valid) continue;
      float s;
      std::uint8_t exponent;
      if (group_scale(amax, a.scales.format, s, exponent)) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) x[u][i] = __fdiv_rn(x[u][i], s);
      } else {
        const float inv = group_inverse(exponent);
#pragma unroll
        for (int i = 0; i < kVec; ++i) x[u][i] *= inv;
      }
      store_fp8<kVec>(
          a.out + rows[u] * a.out_row_stride + std::int64_t(cols[u]) * kGroup + lane * kVec, x[u],
          false);
      if (lane == 0) write_group_scale(a.scales, rows[u], cols[u], s, exponent);
    }
  }
  pdl_launch_dependents();
}

template <typename In, int kGroup>
__global__ void __launch_bounds__(kThreads) group_quant_scalar_kernel(GroupArgs a) {
  using Storage = typename In::Storage;
  pdl_wait();
  for (std::uint32_t group = blockIdx.x * kThreads + threadIdx.x; group < a.groups;
       group += gridDim.x * kThreads) {
    std::uint32_t row, g;
    a.row_of_group.divmod(group, row, g);
    const std::int64_t r = a.first_row + row;
    const Storage* in =
        static_cast<const Storage*>(a.input) + r * a.input_row_stride + std::int64_t(g) * kGroup;
    float amax = a.eps;
    for (int i = 0; i < kGroup; ++i) amax = fmaxf(amax, fabsf(In::to_f32(in[i])));
    float s;
    std::uint8_t exponent;
    const bool divide = group_scale(amax, a.scales.format, s, exponent);
    const float inv = group_inverse(exponent);
    std::uint8_t* out = a.out + r * a.out_row_stride + std::int64_t(g) * kGroup;
    for (int i = 0; i < kGroup; ++i) {
      const float x = In::to_f32(in[i]);
      out[i] = std::uint8_t(cvt_e4m3x2(divide ? __fdiv_rn(x, s) : x * inv, 0.0f));
    }
    write_group_scale(a.scales, r, g, s, exponent);
  }
  pdl_launch_dependents();
}

template <typename In, int kGroup>
void run(const QuantizeGroupParams& p, CudaStream stream) {
  using Storage = typename In::Storage;
  constexpr int kVec = 16 / sizeof(Storage);
  const bool vector = reinterpret_cast<std::uintptr_t>(p.input.data) % 16 == 0 &&
                      (p.input.row_stride * sizeof(Storage)) % 16 == 0 &&
                      reinterpret_cast<std::uintptr_t>(p.out.data) % kVec == 0 &&
                      p.out.row_stride % kVec == 0;
  const std::int64_t groups_per_row = p.input.cols / kGroup;
  const auto* kernel = vector
                           ? reinterpret_cast<const void*>(group_quant_vector_kernel<In, kGroup>)
                           : reinterpret_cast<const void*>(group_quant_scalar_kernel<In, kGroup>);
  const int max_blocks = resident_blocks(kernel, kThreads);
  for_each_32bit_launch(p.input.rows, groups_per_row, [&](std::int64_t first, std::int64_t rows) {
    const GroupArgs a{p.input.data,
                      p.input.row_stride,
                      static_cast<std::uint8_t*>(p.out.data),
                      p.out.row_stride,
                      p.eps,
                      {p.scales, p.scale_row_stride, p.scale_col_stride, p.scale_format,
                       std::uint32_t(groups_per_row)},
                      first,
                      std::uint32_t(rows * groups_per_row),
                      FastDivmod(std::uint32_t(groups_per_row))};
    const std::int64_t groups_per_block =
        vector ? std::int64_t(kThreads / (kGroup / kVec)) * kUnroll : kThreads;  // per step
    const LaunchConfig config{grid_for(a.groups, groups_per_block, max_blocks), dim3(kThreads), 0,
                              stream, true};
    if (vector) {
      launch("quantize_fp8_per_token_group", group_quant_vector_kernel<In, kGroup>, config, a);
    } else {
      launch("quantize_fp8_per_token_group (scalar)", group_quant_scalar_kernel<In, kGroup>, config,
             a);
    }
  });
}

}  // namespace

void quantize_fp8_per_token_group(const QuantizeGroupParams& p, CudaStream stream) {
  if (p.input.cols > std::int64_t(1) << 31) {
    throw Error(ErrorCategory::kUnsupported,
                concat("quantize_fp8_per_token_group: rows of more than 2^31 elements, got ",
                       p.input.cols));
  }
  dispatch_input_dtype(p.input.dtype, [&]<typename In>() {
    if (p.group_size == 64) {
      run<In, 64>(p, stream);
    } else {
      run<In, 128>(p, stream);
    }
  });
}

}  // namespace fp8mla::cuda
