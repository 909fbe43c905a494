// The Hopper prefill attention kernel (op 8): warp-specialized, TMA-fed, wgmma for both products.
// See prefill_traits.cuh for the tile shapes and shared memory, prefill_mainloop.cuh for the
// producer/consumer loop, prefill_softmax.cuh and prefill_epilogue.cuh for the rest.
#pragma once

#include <cstdint>

#include "cuda/attention/prefill_epilogue.cuh"
#include "cuda/attention/prefill_kernel_params.hpp"
#include "cuda/attention/prefill_mainloop.cuh"
#include "cuda/attention/prefill_scheduler.cuh"
#include "cuda/attention/prefill_softmax.cuh"
#include "cuda/attention/prefill_traits.cuh"
#include "cuda/common/launch.cuh"

namespace fp8mla::cuda::attention {

// Registers after the split: the producer needs few, the consumers hold S, O and P.
constexpr int kProducerRegisters = 24;
constexpr int kConsumerRegisters = 240;
// Named barriers of the consumer warpgroups' turns (ids after CUTLASS's reserved ones).
constexpr int kTurnBarrier = 0;

// One consumer warpgroup's work on its 64 rows of the tile. kRowSum: whether the softmax keeps the
// f32 row sum of P, which the LSE needs (and bf16's O / l); e4m3 normalizes O by the ones columns,
// so without an LSE it skips those 64 adds a tile.
template <typename Traits, bool kRowSum>
__device__ __forceinline__ void consume(const PrefillKernelParams& p,
                                        const SharedStorage<Traits>& smem, const TileWork& w,
                                        int warpgroup) {
  const int row0 = (warpgroup - 1) * 64;  // the warpgroup's rows within the block
  const int thread = threadIdx.x % 128;
  // Sequence-local query row of this thread's row half 0.
  const int row = w.m_block * Traits::kBlockM + row0 + 16 * (thread / 32) + (thread % 32) / 4;
  float scale_log2 = p.scale_log2;
  float v_scale = 1.0f;
  if constexpr (Traits::kFp8) {
    scale_log2 *= *p.q_descale * *p.k_descale;
    v_scale = *p.v_descale;
  }

  // Q K^T's promotions (see compute_qk): the e4m3 LSE needs three, O alone none.
  constexpr int kQkParts = Traits::kFp8 && kRowSum ? 3 : 1;
  OnlineSoftmax<Traits, kRowSum> softmax;
  softmax.init(scale_log2);
  // O is defined by the first P V (which overwrites it): no other instruction writes it before
  // the loop, or ptxas would serialize the wgmmas.
  float o[Traits::kORegs];
  float s[64];
  std::uint32_t p_regs[Traits::kBlockN / Traits::kMmaK][4];

  // The two consumer warpgroups take turns on the tensor cores (ping-pong): in its turn one issues
  // S = Q K^T of its next tile and P V of its previous one and passes the turn; its softmax then
  // runs while its own P V and the other one's products do. (With an e4m3 LSE, S takes three
  // promoted runs, which wait for every wgmma of the warpgroup: there P V goes first and the
  // softmax overlaps only the other's products.) Warpgroup 0 goes first; each pass is matched by
  // one wait of the other warpgroup (warpgroup 1 skips the pass after its last turn).
  const int cw = warpgroup - 1;
  const auto wait_turn = [&] { cutlass::arch::NamedBarrier::sync(256, kTurnBarrier + cw); };
  const auto pass_turn = [&](bool last) {
    if (!(last && cw == 1)) cutlass::arch::NamedBarrier::arrive(256, kTurnBarrier + 1 - cw);
  };
  // Tile `it` of the loop is key tile n_blocks - 1 - it.
  OutputPartial<Traits> partial;
  if constexpr (Traits::kPromoteTiles > 0) partial.init(smem, cw);
  const auto needs_mask = [&](int it) { return tile_needs_mask<Traits>(w, w.n_blocks - 1 - it); };
  const auto mask = [&](int it) { softmax.mask(s, w, w.n_blocks - 1 - it, row); };
  // Whether the P V of turn `it` (tile it - 1) starts O afresh: the first one, and (e4m3) the
  // first after each promotion.
  const auto restarts_o = [](int it) {
    if constexpr (Traits::kPromoteTiles > 0) return (it - 1) % Traits::kPromoteTiles == 0;
    return it == 1;
  };
  const auto release = [&](std::uint64_t* empty) {
    if (threadIdx.x % 32 == 0) cutlass::arch::ClusterBarrier::arrive(empty);
  };
  if (w.n_blocks > 0) {
    sm90::Barrier::wait(smem.q_full(), 0);
    if (cw == 1) cutlass::arch::NamedBarrier::arrive(256, kTurnBarrier);
    // First turn: S of tile 0.
    Stage<Traits> st;  // the ring position of tile it
    sm90::Barrier::wait(smem.k_full(st.index), st.phase);
    wait_turn();
    compute_qk<Traits, kQkParts>(smem, st.index, row0, s, [&] { pass_turn(false); });
    release(smem.k_empty(st.index));
    if (needs_mask(0)) mask(0);
    softmax.update(s);
    p_to_operand<Traits>(s, p_regs);
    // Middle turns: P V of tile it - 1, S of tile it.
    for (int it = 1; it < w.n_blocks; ++it) {
      const Stage<Traits> prev = st;
      st = st.next();
      sm90::Barrier::wait(smem.k_full(st.index), st.phase);
      sm90::Barrier::wait(smem.v_full(prev.index), prev.phase);
      wait_turn();
      // P V of tile it - 1 is complete: O may be read (and promoted) again.
      const auto pv_done = [&] {
        sm90::fence_registers(o);
        release(smem.v_empty(prev.index));
        if constexpr (Traits::kPromoteTiles > 0) {
          if (restarts_o(it + 1)) partial.add(o);
        }
      };
      if constexpr (kQkParts == 1) {
        // S first, then P V: the softmax of tile it runs while this warpgroup's P V does.
        issue_qk_steps<Traits, 0, Traits::kQkSteps>(smem, st.index, row0, s);
        issue_pv<Traits>(smem, prev.index, p_regs, o, /*accumulate=*/!restarts_o(it));
        pass_turn(false);
        cute::warpgroup_wait<1>();
        sm90::fence_registers(s);
        release(smem.k_empty(st.index));
        // The update sits in both arms: ptxas waits for the warpgroup's wgmmas where the arms
        // join, which must come after the exp2s for them to overlap P V.
        if (needs_mask(it)) {
          mask(it);
          softmax.update(s);
        } else {
          softmax.update(s);
        }
        sm90::fence_registers(s);  // P before the wait: else the compiler moves the exp2s below it
        cute::warpgroup_wait<0>();
        pv_done();
        if constexpr (Traits::kPromoteTiles > 0) partial.rescale(softmax.correction);
        softmax.rescale(o);
      } else {
        issue_pv<Traits>(smem, prev.index, p_regs, o, /*accumulate=*/!restarts_o(it));
        compute_qk<Traits, kQkParts>(smem, st.index, row0, s, [&] { pass_turn(false); });
        release(smem.k_empty(st.index));
        pv_done();
        if (needs_mask(it)) mask(it);
        // O is rescaled even right after a promotion (the next P V overwrites it): a branch here
        // would split the softmax and keep ptxas from interleaving the rescale with the exp2s.
        softmax.update(s, o);
        if constexpr (Traits::kPromoteTiles > 0) partial.rescale(softmax.correction);
      }
      p_to_operand<Traits>(s, p_regs);
    }
    // Last turn: P V of the last tile.
    sm90::Barrier::wait(smem.v_full(st.index), st.phase);
    wait_turn();
    issue_pv<Traits>(smem, st.index, p_regs, o, /*accumulate=*/!restarts_o(w.n_blocks));
    pass_turn(true);
    cute::warpgroup_wait<0>();
    sm90::fence_registers(o);
    release(smem.v_empty(st.index));
    if constexpr (Traits::kPromoteTiles > 0) partial.fold_into(o);
  }
  if (w.n_blocks == 0) {
#pragma unroll
    for (int i = 0; i < Traits::kORegs; ++i) o[i] = 0.0f;
  }
  softmax.finish();
  store_output(p, w, row, softmax, v_scale, o);
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    prefill_attention_kernel(const __grid_constant__ PrefillKernelParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ std::uint8_t shared_raw[];
  const SharedStorage<Traits> smem{reinterpret_cast<std::uint8_t*>(
      (reinterpret_cast<std::uintptr_t>(shared_raw) + Traits::kSharedAlign - 1) &
      ~std::uintptr_t(Traits::kSharedAlign - 1))};
  smem.init_ones_rows();
  if (threadIdx.x == 0) smem.init_barriers();
  __syncthreads();

  pdl_wait();  // cu_seqlens, q, k, v may come from the previous kernel
  const TileWork w = schedule_tile<Traits>(p.cu_seqlens_q, p.cu_seqlens_k);
  if (!w.has_rows) return;

  // Read through a shuffle from lane 0, which the compiler knows to be warp-uniform: values
  // derived from it (the consumers' Q descriptors) then live in uniform registers.
  const int warpgroup = __shfl_sync(0xffffffff, int(threadIdx.x / 128), 0);
  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters>();
    if (threadIdx.x == 0 && w.n_blocks > 0) produce<Traits>(p, smem, w);
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<kConsumerRegisters>();
  if constexpr (Traits::kFp8) {
    if (p.lse == nullptr) {
      consume<Traits, false>(p, smem, w, warpgroup);
      return;
    }
  }
  consume<Traits, true>(p, smem, w, warpgroup);
#endif
}

}  // namespace fp8mla::cuda::attention
