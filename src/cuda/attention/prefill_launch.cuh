// Definition of launch_prefill<Traits> (see prefill_launch.hpp): the TMA maps of q, k and v, the
// kernel parameters and the launch. Allocates nothing and never synchronizes.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda/attention/prefill_kernel.cuh"
#include "cuda/attention/prefill_launch.hpp"
#include "cuda/common/launch.cuh"
#include "cuda/common/runtime.hpp"
#include "cuda/common/tensor_map.hpp"

namespace fp8mla::cuda::attention {

namespace detail {

// A stride for TMA: the dim's stride in bytes, or (for a dim of size 1, whose stride the view may
// leave arbitrary) any valid one.
inline std::uint64_t tma_stride(std::int64_t size, std::int64_t stride, int element_bytes,
                                std::uint64_t fallback) {
  return size > 1 ? std::uint64_t(stride) * element_bytes : fallback;
}

// q, k or k_rope: [heads][tokens][row] (row: elements a token holds, Dqk but for a split K) in
// boxes of 64 elements x kBlockM (= kBlockN) tokens; with key_step 2, boxes of 16 tokens taken
// every second one (the e4m3 tail map of k).
template <typename Traits>
CUtensorMap qk_map(const void* base, std::int64_t row, std::int64_t tokens, std::int64_t heads,
                   std::int64_t token_stride, std::int64_t head_stride, const char* what,
                   std::uint32_t key_step = 1) {
  TensorMapSpec spec;
  spec.base = base;
  spec.element_bytes = Traits::kElementBytes;
  spec.dims[0] = std::uint64_t(row);
  spec.dims[1] = std::uint64_t(tokens);
  spec.dims[2] = std::uint64_t(heads);
  const std::uint64_t row_bytes = std::uint64_t(row) * Traits::kElementBytes;
  spec.strides_bytes[0] = tma_stride(tokens, token_stride, Traits::kElementBytes, row_bytes);
  spec.strides_bytes[1] =
      tma_stride(heads, head_stride, Traits::kElementBytes, spec.strides_bytes[0] * tokens);
  spec.box[0] = Traits::kChunkElems;
  spec.box[1] = key_step == 1 ? Traits::kBlockM : 16;
  spec.box[2] = 1;
  spec.element_strides[1] = key_step;
  spec.swizzle_bytes = int(Traits::kQkSwizzle);
  return make_tensor_map(spec, what);
}

// e4m3 k (or k_rope) over its complete 16-key groups, each walked even keys first: dims
// (element, r, odd, group, head) with key 16 * group + 2 * r + odd; one box is a kBlockN-key tile.
template <typename Traits>
CUtensorMap k_even_odd_map(const void* base, std::int64_t row, std::int64_t tokens,
                           std::int64_t heads, std::int64_t token_stride, std::int64_t head_stride,
                           const char* what) {
  TensorMapSpec spec;
  spec.base = base;
  spec.element_bytes = 1;
  spec.rank = 5;
  const std::uint64_t key = tma_stride(tokens, token_stride, 1, std::uint64_t(row));
  spec.dims[0] = std::uint64_t(row);
  spec.dims[1] = 8;
  spec.dims[2] = 2;
  spec.dims[3] = std::uint64_t(std::max<std::int64_t>(tokens / 16, 1));  // unused below 16 keys
  spec.dims[4] = std::uint64_t(heads);
  spec.strides_bytes[0] = 2 * key;
  spec.strides_bytes[1] = key;
  spec.strides_bytes[2] = 16 * key;
  spec.strides_bytes[3] = tma_stride(heads, head_stride, 1, key * tokens);
  spec.box[0] = Traits::kChunkElems;
  spec.box[1] = 8;
  spec.box[2] = 2;
  spec.box[3] = Traits::kBlockN / 16;
  spec.box[4] = 1;
  spec.swizzle_bytes = int(Traits::kQkSwizzle);
  return make_tensor_map(spec, what);
}

// k's maps (and k_rope's with a split K): k_map, k_tail_map (e4m3), k_full_groups.
template <typename Traits>
void set_k_maps(PrefillKernelParams& kp, const PrefillAttentionParams& p) {
  const std::int64_t row = Traits::kDqk - p.k_rope_dim;
  kp.k_rope_split = p.k_rope_dim > 0;
  if constexpr (Traits::kEvenOddKeys) {
    kp.k_map =
        k_even_odd_map<Traits>(p.k, row, p.tk, p.heads, p.k_token_stride, p.k_head_stride, "k");
    kp.k_tail_map = qk_map<Traits>(p.k, row, p.tk, p.heads, p.k_token_stride, p.k_head_stride, "k",
                                   /*key_step=*/2);
    kp.k_full_groups = int(p.tk / 16);
    if (kp.k_rope_split) {
      kp.k_rope_map = k_even_odd_map<Traits>(p.k_rope, p.k_rope_dim, p.tk, 1, p.k_rope_token_stride,
                                             0, "k_rope");
      kp.k_rope_tail_map = qk_map<Traits>(p.k_rope, p.k_rope_dim, p.tk, 1, p.k_rope_token_stride, 0,
                                          "k_rope", /*key_step=*/2);
    }
  } else {
    kp.k_map = qk_map<Traits>(p.k, row, p.tk, p.heads, p.k_token_stride, p.k_head_stride, "k");
    if (kp.k_rope_split) {
      kp.k_rope_map =
          qk_map<Traits>(p.k_rope, p.k_rope_dim, p.tk, 1, p.k_rope_token_stride, 0, "k_rope");
    }
  }
}

}  // namespace detail

template <typename Traits>
void prepare_prefill() {
  prepare_kernel("prefill_attention_kernel",
                 reinterpret_cast<const void*>(prefill_attention_kernel<Traits>),
                 shared_launch_bytes<Traits>());
}

namespace detail {

// The kernel parameters of `p` on a device of `sm_count` SMs.
template <typename Traits>
PrefillKernelParams kernel_params(const PrefillAttentionParams& p, int sm_count) {
  PrefillKernelParams kp{};
  kp.q_map = detail::qk_map<Traits>(p.q, Traits::kDqk, p.tq, p.heads, p.q_token_stride,
                                    p.q_head_stride, "q");
  if (p.tk > 0) {
    detail::set_k_maps<Traits>(kp, p);
    TensorMapSpec v;
    v.base = p.v;
    v.element_bytes = Traits::kElementBytes;
    v.swizzle_bytes = 128;
    // e4m3 V given token-major (contiguous dims; the op accepts either layout): loaded as it is,
    // rows of 128 dims, and transposed in shared memory (prefill_producer.cuh). The transposed
    // layout is the fast path: its tile lands as wgmma reads it.
    kp.v_token_major = Traits::kFp8 && p.v_dim_stride == 1;
    if (kp.v_token_major) {
      v.dims[0] = Traits::kDv;
      v.dims[1] = std::uint64_t(p.tk);
      v.dims[2] = std::uint64_t(p.heads);
      v.strides_bytes[0] = detail::tma_stride(p.tk, p.v_token_stride, 1, Traits::kDv);
      v.strides_bytes[1] =
          detail::tma_stride(p.heads, p.v_head_stride, 1, v.strides_bytes[0] * p.tk);
      v.box[0] = Traits::kDv;
      v.box[1] = Traits::kBlockN;
    } else if constexpr (Traits::kFp8) {
      // Transposed: keys innermost, then dims, then heads.
      v.dims[0] = std::uint64_t(p.tk);
      v.dims[1] = Traits::kDv;
      v.dims[2] = std::uint64_t(p.heads);
      v.strides_bytes[0] = std::uint64_t(p.v_dim_stride);
      v.strides_bytes[1] =
          detail::tma_stride(p.heads, p.v_head_stride, 1, v.strides_bytes[0] * Traits::kDv);
      v.box[0] = Traits::kBlockN;
      v.box[1] = Traits::kDv;
    } else {
      v.dims[0] = Traits::kDv;
      v.dims[1] = std::uint64_t(p.tk);
      v.dims[2] = std::uint64_t(p.heads);
      v.strides_bytes[0] = detail::tma_stride(p.tk, p.v_token_stride, 2, Traits::kDv * 2);
      v.strides_bytes[1] =
          detail::tma_stride(p.heads, p.v_head_stride, 2, v.strides_bytes[0] * p.tk);
      v.box[0] = 64;
      v.box[1] = Traits::kBlockN;
    }
    v.box[2] = 1;
    kp.v_map = make_tensor_map(v, "v");
  }
  kp.cu_seqlens_q = p.cu_seqlens_q;
  kp.cu_seqlens_k = p.cu_seqlens_k;
  kp.q_descale = p.q_descale;
  kp.k_descale = p.k_descale;
  kp.v_descale = p.v_descale;
  kp.scale_log2 = float(double(p.softmax_scale) * 1.4426950408889634);
  kp.out = p.out;
  kp.out_token_stride = p.out_token_stride;
  kp.out_head_stride = p.out_head_stride;
  kp.quant = output_quant_target(p.quant);
  if (kp.quant.key == OutputQuantKey::kNone) {
    kp.out_vectors = reinterpret_cast<std::uintptr_t>(p.out) % 8 == 0 &&
                     (p.out_token_stride % 4 == 0 || p.tq <= 1) &&
                     (p.out_head_stride % 4 == 0 || p.heads <= 1);
  } else {
    const int bytes = kp.quant.key == OutputQuantKey::kNvfp4 ? 16 : 8;
    kp.out_vectors = reinterpret_cast<std::uintptr_t>(kp.quant.out) % bytes == 0 &&
                     (kp.quant.out_row_stride % bytes == 0 || p.tq <= 1);
  }
  kp.lse = p.lse;
  kp.lse_token_stride = p.lse_token_stride;
  kp.lse_head_stride = p.lse_head_stride;
  kp.prior_out = p.prior_out;
  kp.prior_out_token_stride = p.prior_out_token_stride;
  kp.prior_out_head_stride = p.prior_out_head_stride;
  kp.prior_lse = p.prior_lse;
  kp.prior_lse_token_stride = p.prior_lse_token_stride;
  kp.prior_lse_head_stride = p.prior_lse_head_stride;
  kp.order = PrefillScheduler<Traits>::order(p, sm_count);
  return kp;
}

}  // namespace detail

template <typename Traits>
void launch_prefill(const PrefillAttentionParams& p, cudaStream_t stream) {
  const DeviceProps& device = current_device_props();
  const dim3 grid = PrefillScheduler<Traits>::grid(p, device.sm_count);
  if (p.tq == 0 || p.heads == 0 || p.batch == 0 || grid.x == 0) return;

  // The last call's parameters, per thread and variant: an engine calls with the same buffers and
  // shapes layer after layer (only cu_seqlens' contents change between steps), and building the
  // tensor maps and the tile order again costs ~0.4 us of host time a call (H200 host,
  // bench/RESULTS_host.md, 2026-12-05).
  thread_local struct {
    bool filled = false;
    int device = -1;
    PrefillAttentionParams p;
    PrefillKernelParams kp;
  } last;
  if (!last.filled || last.device != device.ordinal || !(last.p == p)) {
    last.kp = detail::kernel_params<Traits>(p, device.sm_count);  // throws before `last` changes
    last.p = p;
    last.device = device.ordinal;
    last.filled = true;
  }

  LaunchConfig config;
  config.grid = grid;
  config.block = dim3(Traits::kThreads);
  config.shared_bytes = shared_launch_bytes<Traits>();
  config.stream = stream;
  config.pdl = true;
  launch("prefill_attention_kernel", prefill_attention_kernel<Traits>, config, last.kp);
}

}  // namespace fp8mla::cuda::attention
