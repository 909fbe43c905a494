// NVFP4 quantization: one e4m3 scale per block of 16 elements, two e2m1 values per byte.
//
// One thread per block of 16: two 16-byte loads, the block max, the e4m3 scale, 16 e2m1 encodes
// (cuda::cvt_e2m1: the rounding is one fp32 addition, ops/quant_arith.hpp) and one 8-byte store. Threads walk the scale tensor in its own
// byte order, so scale writes are coalesced; with the 128x4 swizzled layout that order also covers
// the padding, which the same pass writes as zero. One block per kThreads positions (measured
// faster than a grid-stride loop). Misaligned inputs take the scalar-load variant.
#include <algorithm>

#include "cuda/common/launch.cuh"
#include "cuda/common/vector_io.cuh"
#include "cuda/quantize/quant_device.cuh"
#include "fp8mla/error.hpp"
#include "ops/quantize_params.hpp"

namespace fp8mla::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 1;

struct Nvfp4Args {
  const void* input;
  std::int64_t input_row_stride;
  std::uint8_t* out;
  std::int64_t out_row_stride;
  const float* global_scale;
  std::uint8_t* scales;
  std::int64_t scale_row_stride;  // linear layout
  bool swizzled;
  std::int64_t rows;
  std::uint32_t k_blocks;
  std::uint64_t positions;    // scale bytes to visit (padded count when swizzled)
  FastDivmod k_tiles;         // swizzled: 4-block tiles per row
  FastDivmod blocks_per_row;  // linear
};

// (row, block) of scale position f; swizzled order is [m_tile, k_tile, 32, 4, 4].
__device__ __forceinline__ void position(const Nvfp4Args& a, std::uint32_t f, std::int64_t& row,
                                         std::uint32_t& block) {
  if (!a.swizzled) {
    std::uint32_t r;
    a.blocks_per_row.divmod(f, r, block);
    row = r;
    return;
  }
  std::uint32_t m_tile, k_tile;
  a.k_tiles.divmod(f / 512, m_tile, k_tile);
  row = std::int64_t(m_tile) * 128 + ((f / 4) % 4) * 32 + (f / 16) % 32;
  block = k_tile * 4 + f % 4;
}

template <typename In, bool kVector>
__global__ void __launch_bounds__(kThreads) nvfp4_kernel(Nvfp4Args a) {
  using Storage = typename In::Storage;
  constexpr int kLoad = kVector ? 8 : 1;  // elements per load
  pdl_wait();
  const float global_scale = *a.global_scale;
  const float inv_global_scale = nvfp4_inv_global_scale(global_scale);
  const std::uint32_t step = gridDim.x * kThreads * kUnroll;
  for (std::uint32_t base = blockIdx.x * kThreads * kUnroll + threadIdx.x; base < a.positions;
       base += step) {
    float x[kUnroll][16];
    std::int64_t rows[kUnroll];
    std::uint32_t blocks[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::uint32_t f = base + u * kThreads;
      rows[u] = a.rows;  // marks "nothing to quantize" unless set below
      if (f < a.positions) {
        position(a, f, rows[u], blocks[u]);
        if (rows[u] < a.rows && blocks[u] < a.k_blocks) {
          const Storage* in = static_cast<const Storage*>(a.input) + rows[u] * a.input_row_stride +
                              std::int64_t(blocks[u]) * 16;
#pragma unroll
          for (int i = 0; i < 16; i += kLoad) {
            load_f32<In, kLoad>(in + i, *reinterpret_cast<float(*)[kLoad]>(&x[u][i]));
          }
        } else {
          rows[u] = a.rows;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::uint32_t f = base + u * kThreads;
      if (f >= a.positions) continue;
      if (rows[u] == a.rows) {  // padding of the swizzled layout
        a.scales[f] = 0;
        continue;
      }
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(x[u][i]));
      float inv;
      const std::uint8_t sf = nvfp4_block_scale(amax, global_scale, inv_global_scale, inv);
      std::uint32_t packed[2] = {0, 0};
#pragma unroll
      for (int i = 0; i < 16; ++i) packed[i / 8] |= cvt_e2m1(x[u][i] * inv) << (4 * (i % 8));
      std::uint8_t* out = a.out + rows[u] * a.out_row_stride + std::int64_t(blocks[u]) * 8;
      if constexpr (kVector) {
        *reinterpret_cast<uint2*>(out) = make_uint2(packed[0], packed[1]);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = std::uint8_t(packed[i / 4] >> (8 * (i % 4)));
      }
      a.scales[a.swizzled ? f : rows[u] * a.scale_row_stride + blocks[u]] = sf;
    }
  }
  pdl_launch_dependents();
}

template <typename In>
void run(const QuantizeNvfp4Params& p, CudaStream stream) {
  using Storage = typename In::Storage;
  const std::int64_t k_blocks = p.input.cols / 16;
  const bool swizzled = p.layout == Nvfp4ScaleLayout::kSwizzled128x4;
  const std::int64_t k_tiles = (k_blocks + 3) / 4;
  const std::int64_t positions =
      swizzled ? (p.input.rows + 127) / 128 * 128 * k_tiles * 4 : p.input.rows * k_blocks;
  if (positions >= std::int64_t(1) << 31) {
    throw Error(ErrorCategory::kUnsupported,
                concat("quantize_nvfp4: expected fewer than 2^31 scale blocks, got ", positions));
  }
  const bool vector = reinterpret_cast<std::uintptr_t>(p.input.data) % 16 == 0 &&
                      (p.input.row_stride * sizeof(Storage)) % 16 == 0 &&
                      reinterpret_cast<std::uintptr_t>(p.out.data) % 8 == 0 &&
                      p.out.row_stride % 8 == 0;
  const Nvfp4Args a{p.input.data,
                    p.input.row_stride,
                    static_cast<std::uint8_t*>(p.out.data),
                    p.out.row_stride,
                    p.global_scale,
                    p.block_scales,
                    p.scale_row_stride,
                    swizzled,
                    p.input.rows,
                    std::uint32_t(k_blocks),
                    std::uint64_t(positions),
                    FastDivmod(std::uint32_t(k_tiles)),
                    FastDivmod(std::uint32_t(k_blocks))};
  const LaunchConfig config{grid_for(positions, kThreads * kUnroll), dim3(kThreads), 0, stream,
                            true};
  if (vector) {
    launch("quantize_nvfp4", nvfp4_kernel<In, true>, config, a);
  } else {
    launch("quantize_nvfp4 (scalar)", nvfp4_kernel<In, false>, config, a);
  }
}

}  // namespace

void quantize_nvfp4(const QuantizeNvfp4Params& p, CudaStream stream) {
  dispatch_16bit(p.input.dtype, [&]<typename In>() { run<In>(p, stream); });
}

}  // namespace fp8mla::cuda
