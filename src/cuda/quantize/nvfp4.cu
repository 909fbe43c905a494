// NVFP4 quantization: one e4m3 scale per block of 16 elements, two e2m1 values per byte.
//
// One thread per block column of four rows: rows r, r + 32, r + 64 and r + 96 of a 128-row tile
// with the 128x4 swizzled scale layout, four consecutive rows with the linear one. The position and
// address arithmetic is done once for the four blocks, and their eight 16-byte loads are all in
// flight before the first block is worked on. Consecutive threads take consecutive blocks of a
// row; with the swizzled layout they walk the scale tensor in its own byte order (a warp's four
// scale stores fill one 128-byte stretch of it), so loads, 8-byte stores and scale stores stay
// coalesced, and the threads on the layout's padding write it as zero.
//
// Per block: the max |x| on the packed bf16 / f16 pairs (NaN-propagating; a max is exact), the
// e4m3 scale and its factor inv, then, where inv is in [+0, FLT_MAX] and amax * inv < 7
// (nvfp4_below7: no product is NaN or reaches 7, and each has its value's sign), the e2m1
// magnitudes by one fp32 addition each (e2m1_magnitude_sum_below7, ops/quant_arith.hpp), gathered
// a byte each by byte permutes, with the signs taken straight from the input's sign bits. Other
// blocks (a NaN or an infinity, a negative or infinite inv, a scale rounded far down) take the
// plain per-value form (cvt_e2m1). Misaligned inputs take the scalar-load variant.
#include "cuda/common/launch.cuh"
#include "cuda/common/vector_io.cuh"
#include "cuda/quantize/quant_device.cuh"
#include "fp8mla/error.hpp"
#include "ops/quantize_params.hpp"

namespace fp8mla::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerThread = 4;

struct Nvfp4Args {
  const void* input;
  std::int64_t input_row_stride;
  std::uint8_t* out;
  std::int64_t out_row_stride;
  const float* global_scale;
  std::uint8_t* scales;
  std::int64_t scale_row_stride;  // linear layout
  bool swizzled;
  std::uint32_t rows;
  std::uint32_t k_blocks;
  std::uint32_t threads;      // block columns to visit
  FastDivmod k_tiles;         // swizzled: 4-block tiles per row
  FastDivmod blocks_per_row;  // linear
};

// A thread's block column: rows row + i * row_step (i < kRowsPerThread) of block `block`, whose
// scales are at scale_at + i * scale_step.
struct Column {
  std::uint32_t row;
  std::uint32_t block;
  std::uint32_t row_step;
  std::int64_t scale_at;
  std::int64_t scale_step;
};

// Thread t's column. Swizzled: t runs over [m_tile, k_tile, 32, 4] (row within 32, block within
// the tile), so its scales are bytes 16 * (t / 4) + 4 * i + t % 4 of the scale tensor, as the
// layout's [m_tile, k_tile, 32, 4, 4] order puts them. Linear: t runs over [rows / 4, K / 16].
__device__ __forceinline__ Column column(const Nvfp4Args& a, std::uint32_t t) {
  if (!a.swizzled) {
    std::uint32_t quad, block;
    a.blocks_per_row.divmod(t, quad, block);
    const std::uint32_t row = quad * kRowsPerThread;
    return {row, block, 1, std::int64_t(row) * a.scale_row_stride + block, a.scale_row_stride};
  }
  std::uint32_t m_tile, k_tile;
  a.k_tiles.divmod(t / 128, m_tile, k_tile);
  return {m_tile * 128 + (t / 4) % 32, k_tile * 4 + t % 4, 32, std::int64_t(t / 4) * 16 + t % 4, 4};
}

template <typename In, bool kVector>
__global__ void __launch_bounds__(kThreads) nvfp4_kernel(Nvfp4Args a) {
  pdl_wait();
  const std::uint32_t t = blockIdx.x * kThreads + threadIdx.x;
  if (t < a.threads) {
    const Column c = column(a, t);
    const float global_scale = *a.global_scale;
    const float inv_global_scale = nvfp4_inv_global_scale(global_scale);
    const std::uint16_t* in = static_cast<const std::uint16_t*>(a.input) +
                              std::int64_t(c.row) * a.input_row_stride + std::int64_t(c.block) * 16;
    const std::int64_t in_step = std::int64_t(c.row_step) * a.input_row_stride;
    bool valid[kRowsPerThread];
    std::uint32_t w[kRowsPerThread][8];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i, in += in_step) {
      valid[i] = c.row + i * c.row_step < a.rows && c.block < a.k_blocks;
      if (valid[i]) load_pairs16<kVector>(in, w[i]);
    }
    std::uint8_t* o = a.out + std::int64_t(c.row) * a.out_row_stride + std::int64_t(c.block) * 8;
    const std::int64_t out_step = std::int64_t(c.row_step) * a.out_row_stride;
    std::uint8_t* scale = a.scales + c.scale_at;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i, o += out_step, scale += c.scale_step) {
      if (!valid[i]) {
        if (a.swizzled) *scale = 0;  // padding of the swizzled layout
        continue;
      }
      uint2 codes;
      *scale = nvfp4_quantize_block<In>(w[i], global_scale, inv_global_scale, codes);
      if constexpr (kVector) {
        *reinterpret_cast<uint2*>(o) = codes;
      } else {
#pragma unroll
        for (int b = 0; b < 8; ++b)
          o[b] = std::uint8_t((b < 4 ? codes.x : codes.y) >> (8 * (b % 4)));
      }
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
  const std::int64_t threads =
      swizzled ? positions / kRowsPerThread
               : (p.input.rows + kRowsPerThread - 1) / kRowsPerThread * k_blocks;
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
                    std::uint32_t(p.input.rows),
                    std::uint32_t(k_blocks),
                    std::uint32_t(threads),
                    FastDivmod(std::uint32_t(k_tiles)),
                    FastDivmod(std::uint32_t(k_blocks))};
  const LaunchConfig config{grid_for(threads, kThreads), dim3(kThreads), 0, stream, true};
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
