// Per-token-group FP8 quantization: one scale per group of 64 or 128 contiguous elements.
//
// Vector variant: kGroup / 16 lanes share a group, each holding 16 of its elements (16-byte
// loads); the group max is a shuffle reduction inside those lanes, then each lane scales its
// values and stores their 16 e4m3 bytes with one 16-byte store, and the group's first lane writes
// the scale. f32 scales divide through one reciprocal per group (ops/quant_arith.hpp: RN(x / s)
// in a multiply and two fmas, IEEE division only for scales below 2^-90). Every thread takes
// kUnroll groups per step, 64 input bytes in flight. Scales go wherever the scale tensor's strides
// say; packed UE8M0 words are written one exponent byte at a time, so no group waits for its three
// neighbours. Inputs that do not allow 16-byte vectors take the scalar variant (one thread per
// group, two passes).
#include <algorithm>

#include "cuda/common/launch.cuh"
#include "cuda/common/vector_io.cuh"
#include "cuda/quantize/quant_device.cuh"
#include "fp8mla/error.hpp"
#include "ops/quantize_params.hpp"

namespace fp8mla::cuda {
namespace {

constexpr int kThreads = 256;

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

// Elements a lane of the vector variant holds: one 16-byte store of e4m3 bytes.
constexpr int kLaneElements = 16;

// Groups a thread of the vector variant takes per step: 64 input bytes in flight.
template <typename In>
constexpr int kUnroll = 64 / (kLaneElements * int(sizeof(typename In::Storage)));

template <typename In, int kGroup>
__global__ void __launch_bounds__(kThreads) group_quant_vector_kernel(GroupArgs a) {
  using Storage = typename In::Storage;
  constexpr int kVec = kLaneElements;
  constexpr int kLanes = kGroup / kVec;  // lanes per group: 4 or 8
  constexpr int kGroupsPerWarp = 32 / kLanes;
  constexpr int kWarps = kThreads / 32;
  constexpr int kGroupsPerThread = kUnroll<In>;
  pdl_wait();
  const std::uint32_t lane = threadIdx.x % kLanes;
  const std::uint32_t sub = (threadIdx.x % 32) / kLanes;  // which of the warp's groups
  // A warp takes kGroupsPerThread * kGroupsPerWarp consecutive groups per step. The loop bound is
  // uniform across the warp, so every lane reaches the shuffles.
  const std::uint32_t step = gridDim.x * kWarps * kGroupsPerWarp * kGroupsPerThread;
  for (std::uint32_t warp_base =
           (blockIdx.x * kWarps + threadIdx.x / 32) * kGroupsPerWarp * kGroupsPerThread;
       warp_base < a.groups; warp_base += step) {
    float x[kGroupsPerThread][kVec];
    std::int64_t rows[kGroupsPerThread];
    std::uint32_t cols[kGroupsPerThread];
#pragma unroll
    for (int u = 0; u < kGroupsPerThread; ++u) {
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
    for (int u = 0; u < kGroupsPerThread; ++u) {
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
      const GroupScale scale = group_scale(amax, a.scales.format);
      scale_group(x[u], scale);
      store_fp8<kVec>(
          a.out + rows[u] * a.out_row_stride + std::int64_t(cols[u]) * kGroup + lane * kVec, x[u],
          false);
      if (lane == 0) write_group_scale(a.scales, rows[u], cols[u], scale);
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
    const GroupScale scale = group_scale(amax, a.scales.format);
    std::uint8_t* out = a.out + r * a.out_row_stride + std::int64_t(g) * kGroup;
    for (int i = 0; i < kGroup; ++i) {
      out[i] = std::uint8_t(cvt_e4m3x2(scale_value(scale, In::to_f32(in[i])), 0.0f));
    }
    write_group_scale(a.scales, r, g, scale);
  }
  pdl_launch_dependents();
}

template <typename In, int kGroup>
void run(const QuantizeGroupParams& p, CudaStream stream) {
  using Storage = typename In::Storage;
  const bool vector = reinterpret_cast<std::uintptr_t>(p.input.data) % 16 == 0 &&
                      (p.input.row_stride * sizeof(Storage)) % 16 == 0 &&
                      reinterpret_cast<std::uintptr_t>(p.out.data) % 16 == 0 &&
                      p.out.row_stride % 16 == 0;
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
        vector ? std::int64_t(kThreads / (kGroup / kLaneElements)) * kUnroll<In> : kThreads;
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
