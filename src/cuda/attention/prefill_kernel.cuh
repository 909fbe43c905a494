// The Hopper prefill attention kernel (op 8): warp-specialized, TMA-fed, wgmma for both products.
// The entry composes its roles, each in its own file:
//   prefill_shared_storage.cuh  the CTA's shared memory (tiles, rings, barriers)
//   prefill_scheduler.cuh       which work tiles a CTA runs, longest first (ZigzagTileScheduler)
//   prefill_producer.cuh        warpgroup 0: the TMA loads of Q, K and V (PrefillProducer)
//   prefill_consumer.cuh        warpgroups 1, 2: S, softmax and O, ping-ponging (PrefillConsumer)
//   prefill_epilogue.cuh        the store of a finished tile (OutputEpilogue), quantized by
//                               prefill_output_quant.cuh
// prefill_traits.cuh gives the tile shapes; prefill_mma.cuh and prefill_softmax.cuh the consumer's
// steps.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/attention/prefill_consumer.cuh"
#include "cuda/attention/prefill_epilogue.cuh"
#include "cuda/attention/prefill_kernel_params.hpp"
#include "cuda/attention/prefill_producer.cuh"
#include "cuda/attention/prefill_scheduler.cuh"
#include "cuda/attention/prefill_shared_storage.cuh"
#include "cuda/attention/prefill_traits.cuh"
#include "cuda/common/launch.cuh"

namespace fp8mla::cuda::attention {

// The kernel's two seams: which work tiles a CTA runs (the scheduler also sets the launch grid,
// prefill_launch.cuh), and what is done with a finished one (the epilogue, handed each consumer
// warpgroup's rows).
template <typename Traits>
using PrefillScheduler = ZigzagTileScheduler<Traits>;
template <typename Traits>
using PrefillEpilogue = OutputEpilogue<Traits>;

// Registers after the split: the producer needs few, the consumers hold S, O and P.
constexpr int kProducerRegisters = 24;
constexpr int kConsumerRegisters = 240;

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    prefill_attention_kernel(const __grid_constant__ PrefillKernelParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ std::uint8_t shared_raw[];
  SharedStorage<Traits>& smem = SharedStorage<Traits>::at(shared_raw);
  smem.init_ones_rows();
  if (threadIdx.x == 0) smem.init_barriers(p.v_token_major);
  __syncthreads();

  pdl_wait();  // cu_seqlens, q, k, v may come from the previous kernel
  PrefillEpilogue<Traits>::write_untiled(p);
  using Scheduler = PrefillScheduler<Traits>;
  if (!Scheduler::has_rows(p)) return;

  // Read through a shuffle from lane 0, which the compiler knows to be warp-uniform: values
  // derived from it (the consumers' Q descriptors) then live in uniform registers.
  const int warpgroup = __shfl_sync(0xffffffff, int(threadIdx.x / 128), 0);
  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters>();
    // Warp 0's thread 0 loads; warps 1..3 transpose token-major e4m3 V tiles (warp-uniform, as
    // above).
    const int warp = __shfl_sync(0xffffffff, int(threadIdx.x / 32), 0);
    const PrefillProducer<Traits> producer(p, smem);
    if (warp == 0) {
      if (threadIdx.x != 0) return;
      producer.prefetch_maps();
      PipelineState<Traits> state;
      Scheduler::for_each_tile(p, [&](const TileWork& w) { producer.load(w, state); });
    } else if (Traits::kFp8 && p.v_token_major) {
      // Each transposing warp runs its own unrolled steps (a template argument).
      const auto transpose = [&](auto warp_index) {
        Stage<Traits> stage;
        Scheduler::for_each_tile(p, [&](const TileWork& w) {
          producer.template transpose_v<decltype(warp_index)::value>(w, stage);
        });
      };
      if (warp == 1) transpose(std::integral_constant<int, 0>{});
      if (warp == 2) transpose(std::integral_constant<int, 1>{});
      if (warp == 3) transpose(std::integral_constant<int, 2>{});
    }
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<kConsumerRegisters>();
  const PrefillEpilogue<Traits> epilogue(p);
  PipelineState<Traits> state;
  if constexpr (Traits::kFp8 && !Traits::kFoldsPrior) {
    if (p.lse == nullptr) {
      const PrefillConsumer<Traits, false> consumer(p, smem, warpgroup);
      Scheduler::for_each_tile(p, [&](const TileWork& w) { consumer.run(w, epilogue, state); });
      return;
    }
  }
  const PrefillConsumer<Traits, true> consumer(p, smem, warpgroup);
  Scheduler::for_each_tile(p, [&](const TileWork& w) { consumer.run(w, epilogue, state); });
#endif
}

}  // namespace fp8mla::cuda::attention
