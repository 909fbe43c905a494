// The latent-cache kernels of fp8mla/mla_prep.hpp: cache write, gather and prefix K/V pack.
//
// All three are memory-bound and share one shape (as per_tensor.cu): a flat index over (token,
// unit) pairs, each unit 16 elements (16 bytes of FP8, two LDG.128 of bf16/f16), kUnroll units per
// thread with every load issued before the first conversion, one block per kThreads * kUnroll
// units, launches split so indices fit in 32 bits (offsets are 64-bit). Views whose pointers or
// strides do not allow 16-byte vectors take the scalar variant (units of one element).
//   write:  a 576-byte latent row = 36 units (32 of kv_c, 4 of k_pe).
//   gather: 36 units per row, each one 16-byte load and two 16-byte stores of bf16.
//   pack:   per token, 16 units per head (8 of k_nope, 8 of v), then 4 units of k_pe per group of
//           kPeHeads heads: the 16 k_pe bytes are converted once and stored to each head of the
//           group (a split K: 4 units into the token's k_rope_out row). V alone
//           (mla_v_quantize_fp8, p.v_only): 8 units per head, all of v.
// A bad slot (not -1 for the write; any for the gather) cannot throw here: the write skips the
// token, the gather writes zeros, and both set *error_flag = 1 when a flag is given.
#include <algorithm>
#include <cstring>

#include "cuda/common/convert.cuh"
#include "cuda/common/launch.cuh"
#include "cuda/common/vector_io.cuh"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_prep.hpp"
#include "ops/mla_kv_params.hpp"

namespace fp8mla::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWide = 16;    // elements per vector unit
constexpr int kPeHeads = 8;  // heads one converted k_pe unit is stored to

struct Traversal {
  std::int64_t first_token;
  std::uint32_t units;  // tokens in this launch * units_per_token
  FastDivmod units_per_token;
};

// Calls launch_one(traversal, grid) for token ranges whose unit count fits in 32 bits.
template <typename Fn>
void for_each_launch(std::int64_t tokens, std::int64_t units_per_token, int per_thread,
                     Fn launch_one) {
  for_each_32bit_launch(tokens, units_per_token, [&](std::int64_t first, std::int64_t n) {
    const Traversal t{first, std::uint32_t(n * units_per_token),
                      FastDivmod(std::uint32_t(units_per_token))};
    launch_one(t, grid_for(t.units, kThreads * per_thread));
  });
}

bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

// A stride (in bytes) that keeps 16-byte alignment, or one that is never applied.
bool stride_ok(std::int64_t stride_bytes, std::int64_t count) {
  return count <= 1 || stride_bytes % 16 == 0;
}

bool vectors_ok(const TokenHeads& t) {
  const std::int64_t size = dtype_size(t.dtype);
  return aligned16(t.data) && t.dim % kWide == 0 && stride_ok(t.token_stride * size, t.tokens) &&
         stride_ok(t.head_stride * size, t.heads);
}

bool vectors_ok(const LatentCacheParams& c) {
  return aligned16(c.cache) && stride_ok(c.page_stride, c.num_pages) &&
         stride_ok(c.row_stride, c.page_size);
}

template <typename S>
__device__ __forceinline__ S* at(const TokenHeads& t, std::int64_t token, std::int64_t head,
                                 std::int64_t element) {
  return static_cast<S*>(t.data) + token * t.token_stride + head * t.head_stride + element;
}

__device__ __forceinline__ void flag_error(std::int32_t* flag) {
  if (flag != nullptr) *flag = 1;
}

// e4m3 codes of kN values (kN even or 1), converted once.
template <int kN>
struct Fp8Bytes {
  static constexpr int kPairs = kN > 1 ? kN / 2 : 1;
  alignas(16) std::uint16_t pairs[kPairs];
};

template <int kN>
__device__ __forceinline__ Fp8Bytes<kN> to_e4m3(float (&x)[kN], float scale_inv) {
  Fp8Bytes<kN> b;
#pragma unroll
  for (int i = 0; i < kN; ++i) x[i] = __fmul_rn(x[i], scale_inv);
  if constexpr (kN == 1) {
    b.pairs[0] = cvt_e4m3x2(x[0], 0.0f);
  } else {
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) b.pairs[i] = cvt_e4m3x2(x[2 * i], x[2 * i + 1]);
  }
  return b;
}

template <int kN>
__device__ __forceinline__ void store_bytes(std::uint8_t* p, const Fp8Bytes<kN>& b) {
  if constexpr (kN == 16) {
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(b.pairs);
  } else {
    static_assert(kN == 1);
    *p = std::uint8_t(b.pairs[0]);
  }
}

// ---- Cache write ---------------------------------------------------------------------------

constexpr int kWriteUnroll = 2;

template <typename In, int kVec>
__global__ void __launch_bounds__(kThreads) write_kernel(MlaKvCacheWriteParams p, Traversal t) {
  using S = typename In::Storage;
  pdl_wait();
  const std::uint32_t stride = gridDim.x * kThreads;
  for (std::uint32_t base = blockIdx.x * kThreads * kWriteUnroll + threadIdx.x; base < t.units;
       base += stride * kWriteUnroll) {
    float x[kWriteUnroll][kVec];
    std::uint8_t* dst[kWriteUnroll];
#pragma unroll
    for (int u = 0; u < kWriteUnroll; ++u) {
      dst[u] = nullptr;
      const std::uint32_t v = base + u * kThreads;
      if (v >= t.units) continue;
      std::uint32_t token, col;
      t.units_per_token.divmod(v, token, col);
      const std::int64_t tok = t.first_token + token;
      const std::int64_t slot = load_slot(p.cache, tok);
      std::uint8_t* row = latent_row(p.cache, slot);
      if (row == nullptr) {
        if (slot != -1 && col == 0) flag_error(p.cache.error_flag);
        continue;
      }
      const std::int64_t e = std::int64_t(col) * kVec;
      const S* src = e < kMlaKvLoraRank ? at<const S>(p.kv_c, tok, 0, e)
                                        : at<const S>(p.k_pe, tok, 0, e - kMlaKvLoraRank);
      load_f32<In, kVec>(src, x[u]);
      dst[u] = row + e;
    }
#pragma unroll
    for (int u = 0; u < kWriteUnroll; ++u) {
      if (dst[u] != nullptr) store_bytes<kVec>(dst[u], to_e4m3<kVec>(x[u], p.cache.scale_inv));
    }
  }
  pdl_launch_dependents();
}

// ---- Gather --------------------------------------------------------------------------------

constexpr int kGatherUnroll = 4;

template <int kVec>
__global__ void __launch_bounds__(kThreads) gather_kernel(MlaKvGatherParams p, Traversal t) {
  pdl_wait();
  const std::uint32_t stride = gridDim.x * kThreads;
  for (std::uint32_t base = blockIdx.x * kThreads * kGatherUnroll + threadIdx.x; base < t.units;
       base += stride * kGatherUnroll) {
    // kVec codes per unit: one 16-byte word, or one byte.
    uint4 words[kGatherUnroll];
    std::uint16_t* dst[kGatherUnroll];
    bool bad[kGatherUnroll];
#pragma unroll
    for (int u = 0; u < kGatherUnroll; ++u) {
      dst[u] = nullptr;
      bad[u] = false;
      words[u] = make_uint4(0, 0, 0, 0);
      const std::uint32_t v = base + u * kThreads;
      if (v >= t.units) continue;
      std::uint32_t token, col;
      t.units_per_token.divmod(v, token, col);
      const std::int64_t tok = t.first_token + token;
      const std::int64_t e = std::int64_t(col) * kVec;
      dst[u] = e < kMlaKvLoraRank ? at<std::uint16_t>(p.kv_c_out, tok, 0, e)
                                  : at<std::uint16_t>(p.k_pe_out, tok, 0, e - kMlaKvLoraRank);
      const std::int64_t slot = load_slot(p.cache, tok);
      const std::uint8_t* row = latent_row(p.cache, slot);
      if (row == nullptr) {
        if (col == 0) flag_error(p.cache.error_flag);
        bad[u] = true;  // its rows are written as zeros
        continue;
      }
      if constexpr (kVec == 16) {
        words[u] = __ldg(reinterpret_cast<const uint4*>(row + e));
      } else {
        words[u].x = __ldg(row + e);
      }
    }
#pragma unroll
    for (int u = 0; u < kGatherUnroll; ++u) {
      if (dst[u] == nullptr) continue;
      const auto* codes = reinterpret_cast<const std::uint16_t*>(&words[u]);
      alignas(16) std::uint16_t out[kVec];
#pragma unroll
      for (int i = 0; i < (kVec + 1) / 2; ++i) {
        const float2 f = cvt_e4m3x2_to_f32x2(codes[i]);
        out[2 * i] = bad[u] ? 0 : cvt_bf16(__fmul_rn(f.x, p.scale));
        if constexpr (kVec > 1) out[2 * i + 1] = bad[u] ? 0 : cvt_bf16(__fmul_rn(f.y, p.scale));
      }
      if constexpr (kVec == 16) {
        reinterpret_cast<uint4*>(dst[u])[0] = reinterpret_cast<const uint4*>(out)[0];
        reinterpret_cast<uint4*>(dst[u])[1] = reinterpret_cast<const uint4*>(out)[1];
      } else {
        dst[u][0] = out[0];
      }
    }
  }
  pdl_launch_dependents();
}

// ---- Prefix K/V pack -----------------------------------------------------------------------

constexpr int kPackUnroll = 2;

// The K/V pack's flat units (see the file comment), grid-strided over `blocks` blocks.
template <typename In, int kVec>
__device__ __forceinline__ void pack_units(const MlaKvPackParams& p, const Traversal& t,
                                           std::uint32_t block, std::uint32_t blocks) {
  using S = typename In::Storage;
  constexpr int kNopeUnits = kMlaNopeDim / kVec;  // == kMlaVDim / kVec
  constexpr int kPeUnits = kMlaRopeDim / kVec;
  // A transposed V is written by the transposed-V blocks instead. V alone: no k_nope units (a
  // head's units start at its V), no k_pe units (col < head_units always).
  const std::uint32_t kHeadUnits = p.v_transposed || p.v_only ? kNopeUnits : 2 * kNopeUnits;
  const int v_first = p.v_only ? 0 : kNopeUnits;  // a head's first V unit
  const std::int64_t heads = p.v.heads;
  const std::uint32_t head_units = std::uint32_t(heads) * kHeadUnits;
  const std::uint32_t stride = blocks * kThreads;
  for (std::uint32_t base = block * kThreads * kPackUnroll + threadIdx.x; base < t.units;
       base += stride * kPackUnroll) {
    float x[kPackUnroll][kVec];
    std::uint8_t* dst[kPackUnroll];
    int copies[kPackUnroll];  // heads the unit is stored to (0: none)
    float scale_inv[kPackUnroll];
#pragma unroll
    for (int u = 0; u < kPackUnroll; ++u) {
      copies[u] = 0;
      dst[u] = nullptr;
      scale_inv[u] = p.k_scale_inv;
      const std::uint32_t v = base + u * kThreads;
      if (v >= t.units) continue;
      std::uint32_t token, col;
      t.units_per_token.divmod(v, token, col);
      const std::int64_t tok = t.first_token + token;
      const S* src;
      if (col < head_units) {
        const std::int64_t head = col / kHeadUnits;
        const int sub = int(col % kHeadUnits);
        if (sub < v_first) {
          src = at<const S>(p.k_nope, tok, head, sub * kVec);
          dst[u] = at<std::uint8_t>(p.k_out, tok, head, sub * kVec);
        } else {
          src = at<const S>(p.v, tok, head, (sub - v_first) * kVec);
          dst[u] = at<std::uint8_t>(p.v_out, tok, head, (sub - v_first) * kVec);
          scale_inv[u] = p.v_scale_inv;
        }
        copies[u] = 1;
      } else {
        const std::uint32_t pe = col - head_units;
        const int chunk = int(pe % kPeUnits);
        const std::int64_t first_head = std::int64_t(pe / kPeUnits) * kPeHeads;
        src = at<const S>(p.k_pe, tok, 0, chunk * kVec);
        if (p.k_split) {  // one group: the token's k_rope_out row
          dst[u] = at<std::uint8_t>(p.k_rope_out, tok, 0, chunk * kVec);
          copies[u] = 1;
        } else {
          dst[u] = at<std::uint8_t>(p.k_out, tok, first_head, kMlaNopeDim + chunk * kVec);
          copies[u] = int(std::min<std::int64_t>(kPeHeads, heads - first_head));
        }
      }
      load_f32<In, kVec>(src, x[u]);
    }
#pragma unroll
    for (int u = 0; u < kPackUnroll; ++u) {
      if (copies[u] == 0) continue;
      const Fp8Bytes<kVec> bytes = to_e4m3<kVec>(x[u], scale_inv[u]);
      store_bytes<kVec>(dst[u], bytes);
      for (int h = 1; h < copies[u]; ++h)
        store_bytes<kVec>(dst[u] + h * p.k_out.head_stride, bytes);
    }
  }
}

// V into the transposed layout ([H][128][>= n] bytes), one tile of tokens of one head a block.
// The tiles take the heads fastest, so that the blocks running together read whole token rows of
// the [n, H, 256] kv_b output (one head's 256-byte slices 64 KiB apart read poorly from DRAM).
//  kVector (16-byte aligned V rows; pitch, head stride and pointer 8-byte aligned): a block owns
//  kVTileTokens tokens x 128 dims of one head, thread t the 8 dims [8c, 8c + 8) (c = t / 16) of
//  the 8 tokens [8g, 8g + 8) (g = t % 16). It loads its 8 rows of 16 bytes (a warp's load: 16
//  tokens x 32 contiguous bytes), converts, and stores each dim's 8 token bytes as one 8-byte word
//  (a warp's store: two dims x 128 contiguous bytes). No shared memory, no barrier.
//  kScalar: 64 tokens x 128 dims through shared memory, element loads, word or byte stores.
enum class VTranspose { kNone, kVector, kScalar };
constexpr int kVTileTokens = 128;
constexpr int kTransposeTokens = 64;

template <typename In>
__device__ __forceinline__ void transpose_v_vector(const MlaKvPackParams& p, std::int64_t head,
                                                   std::int64_t tile) {
  static_assert(kThreads == 16 * (kMlaVDim / 8) && kVTileTokens == 16 * 8);
  using S = typename In::Storage;
  const std::int64_t t0 = tile * kVTileTokens;
  const int n = int(std::min<std::int64_t>(kVTileTokens, p.v.tokens - t0));
  const int dim0 = 8 * (int(threadIdx.x) / 16);
  const int token0 = 8 * (int(threadIdx.x) % 16);  // of the tile
  float x[8][8];                                   // [token][dim]
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    if (token0 + k < n) {
      load_f32<In, 8>(at<const S>(p.v, t0 + token0 + k, head, dim0), x[k]);
    } else {
#pragma unroll
      for (int d = 0; d < 8; ++d) x[k][d] = 0.0f;
    }
  }
  std::uint8_t* out = static_cast<std::uint8_t*>(p.v_out.data) + head * p.v_out.head_stride + t0 +
                      token0 + dim0 * p.v_out_dim_stride;
#pragma unroll
  for (int d = 0; d < 8; ++d) {
    std::uint32_t word[2];
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      const std::uint32_t lo = cvt_e4m3x2(__fmul_rn(x[4 * w][d], p.v_scale_inv),
                                          __fmul_rn(x[4 * w + 1][d], p.v_scale_inv));
      const std::uint32_t hi = cvt_e4m3x2(__fmul_rn(x[4 * w + 2][d], p.v_scale_inv),
                                          __fmul_rn(x[4 * w + 3][d], p.v_scale_inv));
      word[w] = lo | (hi << 16);
    }
    std::uint8_t* row = out + d * p.v_out_dim_stride;
    if (token0 + 8 <= n) {
      *reinterpret_cast<uint2*>(row) = make_uint2(word[0], word[1]);
    } else {
      for (int k = 0; k < n - token0; ++k) row[k] = std::uint8_t(word[k / 4] >> (8 * (k % 4)));
    }
  }
}

template <typename In>
__device__ __forceinline__ void transpose_v_scalar(const MlaKvPackParams& p, std::int64_t head,
                                                   std::int64_t tile) {
  using S = typename In::Storage;
  __shared__ std::uint8_t staged[kMlaVDim][kTransposeTokens + 4];
  const std::int64_t t0 = tile * kTransposeTokens;
  const int n = int(std::min<std::int64_t>(kTransposeTokens, p.v.tokens - t0));
  for (int e = threadIdx.x; e < n * kMlaVDim; e += kThreads) {
    const int token = e / kMlaVDim, d = e % kMlaVDim;
    float x[1];
    load_f32<In, 1>(at<const S>(p.v, t0 + token, head, d), x);
    staged[d][token] = std::uint8_t(cvt_e4m3x2(__fmul_rn(x[0], p.v_scale_inv), 0.0f));
  }
  __syncthreads();
  std::uint8_t* out = static_cast<std::uint8_t*>(p.v_out.data) + head * p.v_out.head_stride + t0;
  const bool words = n == kTransposeTokens && p.v_out_dim_stride % 4 == 0 &&
                     reinterpret_cast<std::uintptr_t>(out) % 4 == 0;
  if (words) {
    for (int e = threadIdx.x; e < kMlaVDim * kTransposeTokens / 4; e += kThreads) {
      const int d = e / (kTransposeTokens / 4), w = e % (kTransposeTokens / 4);
      std::uint32_t word;
      std::memcpy(&word, &staged[d][4 * w], 4);
      *reinterpret_cast<std::uint32_t*>(out + d * p.v_out_dim_stride + 4 * w) = word;
    }
  } else {
    for (int e = threadIdx.x; e < kMlaVDim * n; e += kThreads) {
      const int d = e / n, token = e % n;
      out[d * p.v_out_dim_stride + token] = staged[d][token];
    }
  }
}

// The blocks of one pack launch: the first `pack_blocks` pack the flat units of `t`; the rest
// (kMode != kNone) each write one transposed-V tile of one head, the head fastest. One launch
// for both halves of mla_kv_pack_quantize_fp8: the second launch cost as much host time as the
// whole op otherwise.
template <typename In, int kVec, VTranspose kMode>
__global__ void __launch_bounds__(kThreads)
    pack_kernel(MlaKvPackParams p, Traversal t, std::uint32_t pack_blocks, FastDivmod heads) {
  pdl_wait();
  if (blockIdx.x < pack_blocks) {
    pack_units<In, kVec>(p, t, blockIdx.x, pack_blocks);
  } else if constexpr (kMode != VTranspose::kNone) {
    std::uint32_t tile, head;
    heads.divmod(blockIdx.x - pack_blocks, tile, head);
    if constexpr (kMode == VTranspose::kVector) {
      transpose_v_vector<In>(p, head, tile);
    } else {
      transpose_v_scalar<In>(p, head, tile);
    }
  }
  pdl_launch_dependents();
}

}  // namespace

void mla_kv_cache_write(const MlaKvCacheWriteParams& p, CudaStream stream) {
  const bool wide = vectors_ok(p.kv_c) && vectors_ok(p.k_pe) && vectors_ok(p.cache);
  dispatch_16bit(p.kv_c.dtype, [&]<typename In>() {
    auto run = [&]<int kVec>() {
      for_each_launch(p.kv_c.tokens, kMlaLatentDim / kVec, kWriteUnroll,
                      [&](const Traversal& t, dim3 grid) {
                        launch("mla_kv_cache_write", write_kernel<In, kVec>,
                               {grid, dim3(kThreads), 0, stream, true}, p, t);
                      });
    };
    dispatch_vector_width<kWide>(wide, run);
  });
}

void mla_kv_gather(const MlaKvGatherParams& p, CudaStream stream) {
  const bool wide = vectors_ok(p.kv_c_out) && vectors_ok(p.k_pe_out) && vectors_ok(p.cache);
  auto run = [&]<int kVec>() {
    for_each_launch(p.kv_c_out.tokens, kMlaLatentDim / kVec, kGatherUnroll,
                    [&](const Traversal& t, dim3 grid) {
                      launch("mla_kv_gather", gather_kernel<kVec>,
                             {grid, dim3(kThreads), 0, stream, true}, p, t);
                    });
  };
  dispatch_vector_width<kWide>(wide, run);
}

// Also mla_v_quantize_fp8 (p.v_only): pack units of V only (token-major V), or transposed-V
// tiles only (transposed V). Below kSplitTiles tiles they ride in the first pack launch
// (launches split only past 2^31 units); from it on, the tiles are a launch of their own after
// the pack's.
//
// Why both: one kernel takes the registers of its heaviest blocks (the transposing ones: 80,
// the pack's 64), which made the pack 6-7 % slower at 8k and 64k tokens x 128 heads
// (bench/RESULTS_prep.md, 2026-12-03); below that size the second launch's host time (about
// 3 us) is the larger cost.
constexpr std::int64_t kSplitTiles = 2048;
void mla_kv_pack_quantize_fp8(const MlaKvPackParams& p, CudaStream stream) {
  const char* op = p.v_only ? "mla_v_quantize_fp8" : "mla_kv_pack_quantize_fp8";
  const bool v_wide = vectors_ok(p.v) && (p.v_transposed || vectors_ok(p.v_out));
  const bool wide =
      v_wide && (p.v_only || (vectors_ok(p.k_nope) && vectors_ok(p.k_pe) && vectors_ok(p.k_out) &&
                              (!p.k_split || vectors_ok(p.k_rope_out))));
  const std::int64_t heads = p.v.heads;
  // k_pe units: one set per group of kPeHeads heads, or one set for a split K's k_rope_out.
  const std::int64_t groups = p.v_only ? 0 : p.k_split ? 1 : (heads + kPeHeads - 1) / kPeHeads;
  if (heads > (std::int64_t(1) << 20)) {
    throw Error(ErrorCategory::kUnsupported, concat(op, ": more than 2^20 heads, got ", heads));
  }
  // The transposed V's tiles: kVTileTokens tokens on the vector path, kTransposeTokens otherwise.
  const bool v_vector = p.v_transposed && vectors_ok(p.v) &&
                        reinterpret_cast<std::uintptr_t>(p.v_out.data) % 8 == 0 &&
                        p.v_out_dim_stride % 8 == 0 && (p.v_out.head_stride % 8 == 0 || heads == 1);
  const std::int64_t tile_tokens = v_vector ? kVTileTokens : kTransposeTokens;
  const std::int64_t v_blocks =
      p.v_transposed ? heads * ((p.v.tokens + tile_tokens - 1) / tile_tokens) : 0;
  // Per head: k_nope units unless V alone, V units unless a transposed V.
  const int unit_sets = (p.v_only ? 0 : 1) + (p.v_transposed ? 0 : 1);
  constexpr std::int64_t kMaxBlocks = (std::int64_t(1) << 31) - 1;
  dispatch_16bit(p.v.dtype, [&]<typename In>() {
    auto run = [&]<int kVec, VTranspose kMode>() {
      const std::int64_t units =
          heads * unit_sets * (kMlaNopeDim / kVec) + groups * (kMlaRopeDim / kVec);
      std::int64_t tiles_left = v_blocks;
      auto launch_blocks = [&](const Traversal& t, std::uint32_t pack_blocks) {
        const std::int64_t blocks = pack_blocks + tiles_left;
        if (blocks > kMaxBlocks) {
          throw Error(
              ErrorCategory::kUnsupported,
              concat(op, ": at most ", kMaxBlocks - pack_blocks,
                     " transposed-V tiles (heads x tokens / ", tile_tokens, "), got ", tiles_left));
        }
        launch(op, pack_kernel<In, kVec, kMode>,
               {dim3(unsigned(blocks)), dim3(kThreads), 0, stream, true}, p, t, pack_blocks,
               FastDivmod(std::uint32_t(heads)));
        tiles_left = 0;
      };
      if (units == 0) {
        launch_blocks(Traversal{0, 0, FastDivmod(1)}, 0);
        return;
      }
      if (kMode != VTranspose::kNone && v_blocks >= kSplitTiles) {
        // The pack at its own registers, then the tiles alone.
        for_each_launch(p.v.tokens, units, kPackUnroll, [&](const Traversal& t, dim3 grid) {
          launch(op, pack_kernel<In, kVec, VTranspose::kNone>,
                 {grid, dim3(kThreads), 0, stream, true}, p, t, grid.x,
                 FastDivmod(std::uint32_t(heads)));
        });
        launch_blocks(Traversal{0, 0, FastDivmod(1)}, 0);
        return;
      }
      for_each_launch(p.v.tokens, units, kPackUnroll,
                      [&](const Traversal& t, dim3 grid) { launch_blocks(t, grid.x); });
    };
    auto with_width = [&]<VTranspose kMode>() {
      dispatch_vector_width<kWide>(wide,
                                   [&]<int kVec>() { run.template operator()<kVec, kMode>(); });
    };
    if (!p.v_transposed) {
      with_width.template operator()<VTranspose::kNone>();
    } else if (v_vector) {
      with_width.template operator()<VTranspose::kVector>();
    } else {
      with_width.template operator()<VTranspose::kScalar>();
    }
  });
}

}  // namespace fp8mla::cuda
