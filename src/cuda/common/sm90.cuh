// Hopper building blocks for the wgmma/TMA kernels, on top of CUTLASS's arch-level wrappers
// (cute/arch: the wgmma instructions, TMA copies; cutlass/arch: mbarriers, setmaxnreg): shared
// memory descriptors, and the accumulator of an m64nN wgmma (N / 2 f32 a thread) as one array.
#pragma once

#include <cstdint>
#include <utility>

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/arch/mma_sm90_gmma_ext.hpp>  // the N sizes that are not powers of two

namespace fp8mla::cuda::sm90 {

using Barrier = cutlass::arch::ClusterTransactionBarrier;
using cute::SM90::GMMA::Major;
using cute::SM90::GMMA::ScaleOut;

__device__ __forceinline__ std::uint32_t smem_address(const void* ptr) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(ptr));
}

// 16-byte shared-memory load and store by shared-window address (a generic pointer into shared
// memory would compile to the slower generic LD/ST).
__device__ __forceinline__ float4 ld_shared_f4(std::uint32_t address) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(address));
  return v;
}
__device__ __forceinline__ void st_shared_f4(std::uint32_t address, float4 v) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(address), "f"(v.x), "f"(v.y),
               "f"(v.z), "f"(v.w));
}

// ldmatrix / stmatrix of four 8x8 b16 matrices (8 rows of 16 bytes each) by shared-window
// address. Lanes 8m .. 8m + 7 give the addresses of matrix m's rows; register m of lane t holds
// 16-bit elements 2 (t % 4), + 1 of row t / 4 of matrix m (bytes 4 (t % 4) .. + 3). The .trans
// store writes the transpose: half e of register m of lane t goes to row 2 (t % 4) + e, element
// t / 4. ("memory": their order against the other shared-memory accesses is kept.)
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t address, std::uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address)
               : "memory");
}
__device__ __forceinline__ void stmatrix_trans_x4(std::uint32_t address,
                                                  const std::uint32_t (&r)[4]) {
  asm volatile(
      "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(address),
      "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
      : "memory");
}

// Matrix descriptor of a swizzled shared-memory operand (PTX ISA "Matrix Descriptor Format").
//  K-major: rows of swizzle_bytes, 8-row groups `group_stride` bytes apart (leading offset unused).
//  MN-major: 8 K-rows of swizzle_bytes form an atom; `leading` bytes between atoms along MN,
//  `group_stride` bytes between 8-row groups along K.
// The operand must start inside a tile aligned to the 1024-byte swizzle period; stepping along K
// inside a swizzled row is done by adding the byte offset to the start address.
__device__ __forceinline__ std::uint64_t smem_descriptor(std::uint32_t address, int swizzle_bytes,
                                                         std::uint32_t leading,
                                                         std::uint32_t group_stride) {
  // Low word: start address (bits 0-13) and leading byte offset (16-29), both in 16-byte units;
  // high word: stride byte offset (bits 0-13) and the layout (30-31; base offset 0).
  const std::uint32_t layout = swizzle_bytes == 128 ? 1 : swizzle_bytes == 64 ? 2 : 3;
  const std::uint32_t lo = ((address & 0x3FFFF) >> 4) | ((leading >> 4) << 16);
  const std::uint32_t hi = (group_stride >> 4) | (layout << 30);
  return std::uint64_t(hi) << 32 | lo;
}

// `desc` with its start address `bytes` further on (a multiple of 16; the operand stays below the
// 256 KiB the 14-bit field reaches). Only the low word changes: one add, where rebuilding the
// descriptor from the address would take four instructions per wgmma.
__device__ __forceinline__ std::uint64_t advance_descriptor(std::uint64_t desc,
                                                            std::uint32_t bytes) {
  const std::uint32_t lo = std::uint32_t(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

// One m64nNk wgmma, A and B from shared memory, into N / 2 f32 accumulators a thread.
template <typename Op, int R, std::size_t... I>
__device__ __forceinline__ void mma_ss_impl(std::uint64_t a, std::uint64_t b, float (&d)[R],
                                            ScaleOut scale_d, std::index_sequence<I...>) {
  Op::fma(a, b, d[I]..., scale_d);
}
template <typename Op, int R>
__device__ __forceinline__ void mma_ss(std::uint64_t a, std::uint64_t b, float (&d)[R],
                                       bool accumulate) {
  mma_ss_impl<Op>(a, b, d, accumulate ? ScaleOut::One : ScaleOut::Zero,
                  std::make_index_sequence<R>{});
}

// The same with A from registers (4 x 32 bits a thread).
template <typename Op, int R, std::size_t... I>
__device__ __forceinline__ void mma_rs_impl(const std::uint32_t (&a)[4], std::uint64_t b,
                                            float (&d)[R], ScaleOut scale_d,
                                            std::index_sequence<I...>) {
  Op::fma(a[0], a[1], a[2], a[3], b, d[I]..., scale_d);
}
template <typename Op, int R>
__device__ __forceinline__ void mma_rs(const std::uint32_t (&a)[4], std::uint64_t b, float (&d)[R],
                                       bool accumulate) {
  mma_rs_impl<Op>(a, b, d, accumulate ? ScaleOut::One : ScaleOut::Zero,
                  std::make_index_sequence<R>{});
}

// Keeps the compiler from moving accesses of registers across the asynchronous wgmma.
template <typename T, int R>
__device__ __forceinline__ void fence_registers(T (&r)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) cute::warpgroup_fence_operand(r[i]);
}

constexpr std::uint64_t kCacheHintNormal =
    static_cast<std::uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);

// TMA loads of one box (3-d or 5-d map) into shared memory, completing on `barrier` (its
// transaction count must have been raised by the box's bytes).
__device__ __forceinline__ void tma_load_3d(const void* tensor_map, std::uint64_t* barrier,
                                            void* smem, int c0, int c1, int c2) {
  cute::SM90_TMA_LOAD_3D::copy(tensor_map, barrier, kCacheHintNormal, smem, c0, c1, c2);
}
__device__ __forceinline__ void tma_load_5d(const void* tensor_map, std::uint64_t* barrier,
                                            void* smem, int c0, int c1, int c2, int c3, int c4) {
  cute::SM90_TMA_LOAD_5D::copy(tensor_map, barrier, kCacheHintNormal, smem, c0, c1, c2, c3, c4);
}

}  // namespace fp8mla::cuda::sm90
