// The consumers of the prefill kernel (warpgroups 1..kConsumerWarpgroups, 64 query rows each):
// S = Q K^T and O += P V with wgmma (prefill_mma.cuh), the online softmax between them
// (prefill_softmax.cuh); P comes from registers. Key tiles are visited last to first, so the
// tiles that need masking come first. Each finished work tile goes to the epilogue, and the
// consumers go on to the CTA's next one.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/attention/prefill_epilogue.cuh"
#include "cuda/attention/prefill_kernel_params.hpp"
#include "cuda/attention/prefill_mma.cuh"
#include "cuda/attention/prefill_scheduler.cuh"
#include "cuda/attention/prefill_shared_storage.cuh"
#include "cuda/attention/prefill_softmax.cuh"
#include "cuda/common/sm90.cuh"

namespace fp8mla::cuda::attention {

// O's f32 partial sums (e4m3, see PrefillTraits::kPromoteTiles): partial = partial * pending + o
// at each promotion, where `pending` is the product of the softmax corrections since the last one
// (per row half); the final O is partial * pending + o. Each thread's slots are its own (no
// barrier), zeroed once so that every promotion is the same branch-free read-modify-write.
template <typename Traits>
struct OutputPartial {
  std::uint32_t slots;  // shared address of this thread's float4 0; float4 j is 2 KiB further
  float pending[2];

  static constexpr std::uint32_t kSlotStride = 128 * sizeof(float4);

  __device__ void init(const SharedStorage<Traits>& smem, int cw) {
    slots = sm90::smem_address(smem.o_partial.of(cw) + threadIdx.x % 128);
#pragma unroll
    for (int j = 0; j < Traits::kORegs / 4; ++j) {
      sm90::st_shared_f4(slots + j * kSlotStride, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
    }
    pending[0] = pending[1] = 1.0f;
  }
  __device__ void rescale(const float (&correction)[2]) {
    pending[0] = __fmul_rn(pending[0], correction[0]);
    pending[1] = __fmul_rn(pending[1], correction[1]);
  }
  // o[4j + 2h + e] is row half h: float4 j holds (h0, h0, h1, h1).
  __device__ float4 combined(int j, const float (&o)[Traits::kORegs]) const {
    float4 v = sm90::ld_shared_f4(slots + j * kSlotStride);
    v.x = fmaf(v.x, pending[0], o[4 * j]);
    v.y = fmaf(v.y, pending[0], o[4 * j + 1]);
    v.z = fmaf(v.z, pending[1], o[4 * j + 2]);
    v.w = fmaf(v.w, pending[1], o[4 * j + 3]);
    return v;
  }
  __device__ void add(const float (&o)[Traits::kORegs]) {
#pragma unroll
    for (int j = 0; j < Traits::kORegs / 4; ++j) {
      sm90::st_shared_f4(slots + j * kSlotStride, combined(j, o));
    }
    pending[0] = pending[1] = 1.0f;
  }
  __device__ void fold_into(float (&o)[Traits::kORegs]) const {
#pragma unroll
    for (int j = 0; j < Traits::kORegs / 4; ++j) {
      const float4 v = combined(j, o);
      o[4 * j] = v.x;
      o[4 * j + 1] = v.y;
      o[4 * j + 2] = v.z;
      o[4 * j + 3] = v.w;
    }
  }
};

// Named barriers of the consumer warpgroups' turns (ids after CUTLASS's reserved ones).
constexpr int kTurnBarrier = 0;

// One consumer warpgroup. kRowSum: whether the softmax keeps the f32 row sum of P, which the LSE
// needs (and bf16's O / l); e4m3 normalizes O by the ones columns, so without an LSE it skips
// those 64 adds a tile.
//
// The two consumer warpgroups take turns on the tensor cores (ping-pong): in its turn one issues
// S = Q K^T of its next tile and P V of its previous one and passes the turn; its softmax then
// runs while its own P V and the other one's products do. (With an e4m3 LSE, S takes three
// promoted runs: the first two are waited for and added within the turn, the third is issued
// with P V.) Warpgroup 0 goes first; each pass is matched by one wait of the other warpgroup
// (warpgroup 1 skips the pass after its last turn, and passes before the first turn of each
// work tile: the turns alternate without a break from one work tile to the next).
template <typename Traits, bool kRowSum>
class PrefillConsumer {
 public:
  __device__ PrefillConsumer(const PrefillKernelParams& p, SharedStorage<Traits>& smem,
                             int warpgroup)
      : p_(p), smem_(smem), cw_(warpgroup - 1), row0_((warpgroup - 1) * 64) {}

  // The main loop of work tile w, then the epilogue's store of the warpgroup's rows. `state`:
  // where the tile's loads start in the pipelines, stepped past them.
  template <typename Epilogue>
  __device__ __forceinline__ void run(const TileWork& w, const Epilogue& epilogue,
                                      PipelineState<Traits>& state) const {
    const int thread = threadIdx.x % 128;
    // Sequence-local query row of this thread's row half 0.
    const int row = w.m_block * Traits::kBlockM + row0_ + 16 * (thread / 32) + (thread % 32) / 4;
    float scale_log2 = p_.scale_log2;
    float v_scale = 1.0f;
    if constexpr (Traits::kFp8) {
      scale_log2 *= *p_.q_descale * *p_.k_descale;
      v_scale = *p_.v_descale;
    }
    OnlineSoftmax<Traits, kRowSum> softmax;
    softmax.init(scale_log2);
    // O is defined by the first P V (which overwrites it): no other instruction writes it before
    // the loop, or ptxas would serialize the wgmmas.
    float o[Traits::kORegs];
    float s[64];                                          // S, then P
    std::uint32_t p[Traits::kBlockN / Traits::kMmaK][4];  // P as the A operand of P V
    OutputPartial<Traits> partial;
    if constexpr (Traits::kPromoteTiles > 0) partial.init(smem_, cw_);
    QOperand q;
    Tile t(w, row, softmax, o, s, p, q, partial, state.stage);
    if (w.n_blocks > 0) {
      first_turn(t, state.q_phase);
      middle_turns(t);
      last_turn(t);
      state.stage = t.stage.next();
      state.q_phase ^= 1;
    }
    if (w.n_blocks == 0) {
#pragma unroll
      for (int i = 0; i < Traits::kORegs; ++i) o[i] = 0.0f;
    }
    softmax.finish();
    epilogue.store(w, row, softmax, v_scale, o);
  }

 private:
  // Q K^T's promotions (see compute_qk): the e4m3 LSE needs three, O alone none.
  static constexpr int kQkParts = Traits::kFp8 && kRowSum ? 3 : 1;
  // Where S's wgmmas read Q (prefill_mma.cuh): from registers where they fit beside S, P and O
  // (with three parts, the second accumulator of S leaves no room: 144 bytes of spills).
  using QOperand = std::conditional_t<kQkParts == 1, QInRegisters<Traits>, QInShared<Traits>>;

  // The main loop's state for one work tile: references to run()'s registers and partial sums
  // (made members of this struct, they came out of ptxas scheduled differently) and the ring
  // position. Turn `it` scores key tile n_blocks - 1 - it.
  struct Tile {
    __device__ Tile(const TileWork& work, int r, OnlineSoftmax<Traits, kRowSum>& sm,
                    float (&acc)[Traits::kORegs], float (&scores)[64],
                    std::uint32_t (&operand)[Traits::kBlockN / Traits::kMmaK][4], QOperand& qa,
                    OutputPartial<Traits>& sums, Stage<Traits> first)
        : w(work),
          row(r),
          softmax(sm),
          o(acc),
          s(scores),
          p(operand),
          q(qa),
          partial(sums),
          stage(first) {}
    const TileWork& w;
    const int row;
    OnlineSoftmax<Traits, kRowSum>& softmax;
    float (&o)[Traits::kORegs];
    float (&s)[64];
    std::uint32_t (&p)[Traits::kBlockN / Traits::kMmaK][4];
    QOperand& q;
    OutputPartial<Traits>& partial;
    Stage<Traits> stage;  // the ring position of the tile scored last
  };

  __device__ __forceinline__ void wait_turn() const {
    cutlass::arch::NamedBarrier::sync(256, kTurnBarrier + cw_);
  }
  __device__ __forceinline__ void pass_turn(bool last) const {
    if (!(last && cw_ == 1)) cutlass::arch::NamedBarrier::arrive(256, kTurnBarrier + 1 - cw_);
  }
  __device__ __forceinline__ static void release(std::uint64_t* empty) {
    if (threadIdx.x % 32 == 0) cutlass::arch::ClusterBarrier::arrive(empty);
  }
  __device__ __forceinline__ static bool needs_mask(const Tile& t, int it) {
    return tile_needs_mask<Traits>(t.w, t.w.n_blocks - 1 - it);
  }
  __device__ __forceinline__ static void mask(Tile& t, int it) {
    t.softmax.mask(t.s, t.w, t.w.n_blocks - 1 - it, t.row);
  }
  // Whether the P V of turn `it` (tile it - 1) starts O afresh: the first one, and (e4m3) the
  // first after each promotion.
  __device__ __forceinline__ static bool restarts_o(int it) {
    if constexpr (Traits::kPromoteTiles > 0) return (it - 1) % Traits::kPromoteTiles == 0;
    return it == 1;
  }

  // First turn: S of tile 0.
  __device__ __forceinline__ void first_turn(Tile& t, std::uint32_t q_phase) const {
    PipelineBarriers<Traits::kStages>& bar = smem_.barriers;
    const bool half = sees_first_half<Traits>(t.w, t.w.n_blocks - 1, row0_);
    sm90::Barrier::wait(bar.q_full(), q_phase);
    t.q.load(smem_, row0_);
    if constexpr (QOperand::kInRegisters) {
      __syncwarp();  // every lane has read its Q before the warp releases it
      release(bar.q_empty());
    }
    if (cw_ == 1) cutlass::arch::NamedBarrier::arrive(256, kTurnBarrier);  // 0 goes first
    sm90::Barrier::wait(bar.k_full(t.stage.index), t.stage.phase);
    wait_turn();
    if (half) {
      first_scores<true>(t);
    } else {
      first_scores<false>(t);
    }
  }

  // The first turn's S, softmax and P. kHalf: S of the tile's first 64 keys only, whose P are
  // the only ones exponentiated; the others are masked for every row (see sees_first_half) and
  // their P made 0 from the mask's -inf (P V still reads every key: a branch around its last
  // k-steps, or P registers that are constants, costs ptxas the wgmma pipeline's registers and it
  // serializes the wgmmas).
  template <bool kHalf>
  __device__ __forceinline__ void first_scores(Tile& t) const {
    compute_qk<Traits, kQkParts, kHalf>(smem_, t.stage.index, t.q, t.s, [&] { pass_turn(false); });
    release(smem_.barriers.k_empty(t.stage.index));
    if (kHalf || needs_mask(t, 0)) mask(t, 0);
    t.softmax.template update<kHalf ? 8 : 16>(t.s);
    if constexpr (kHalf) {
#pragma unroll
      for (int i = 32; i < 64; ++i) t.s[i] = fmaxf(t.s[i], 0.0f);  // -inf: P = 0
    }
    p_to_operand<Traits>(t.s, t.p);
  }

  // Turns 1 .. n_blocks - 1. e4m3 runs them in chunks of kPromoteTiles, each followed by O's
  // promotion, so that no turn carries the promotion's branch (inside the turn, after P V's
  // wait, it cost 3 % on the H200). The promotion then comes after the turn's rescale of O and of
  // the pending factors, which gives the same sum.
  __device__ __forceinline__ void middle_turns(Tile& t) const {
    const int n = t.w.n_blocks;
    if constexpr (Traits::kPromoteTiles > 0) {
      for (int it = 1; it < n;) {
        const int end = min(n, it + Traits::kPromoteTiles);
        for (; it < end; ++it) middle_turn(t, it);
        if (restarts_o(it)) t.partial.add(t.o);  // the next P V (maybe the last turn's) restarts O
      }
    } else {
      for (int it = 1; it < n; ++it) middle_turn(t, it);
    }
  }

  // Middle turn `it`: P V of tile it - 1, S of tile it.
  __device__ __forceinline__ void middle_turn(Tile& t, int it) const {
    PipelineBarriers<Traits::kStages>& bar = smem_.barriers;
    const Stage<Traits> prev = t.stage;
    t.stage = t.stage.next();
    sm90::Barrier::wait(bar.k_full(t.stage.index), t.stage.phase);
    sm90::Barrier::wait(bar.v_full(prev.index), prev.phase);
    wait_turn();
    if constexpr (kQkParts == 1) {
      scores_then_pv(t, it, prev);
    } else {
      parts_then_pv(t, it, prev);
    }
    p_to_operand<Traits>(t.s, t.p);
  }

  // S first, then P V: the softmax of tile it runs while this warpgroup's P V does.
  __device__ __forceinline__ void scores_then_pv(Tile& t, int it, Stage<Traits> prev) const {
    issue_qk_steps<Traits, 0, Traits::kQkSteps>(smem_, t.stage.index, t.q, t.s);
    issue_pv<Traits>(smem_, prev.index, t.p, t.o, /*accumulate=*/!restarts_o(it));
    pass_turn(false);
    cute::warpgroup_wait<1>();
    sm90::fence_registers(t.s);
    softmax_under_pv(t, it, prev);
  }

  // The e4m3 LSE's turn: S's first two promoted parts (their wait holds the turn), then its third
  // with P V, so that the softmax overlaps P V as in scores_then_pv; the same sums as compute_qk.
  __device__ __forceinline__ void parts_then_pv(Tile& t, int it, Stage<Traits> prev) const {
    constexpr int kPart = Traits::kQkSteps / kQkParts;
    float u[64];
    issue_qk_steps<Traits, 0, kPart>(smem_, t.stage.index, t.q, t.s);
    issue_qk_steps<Traits, kPart, kPart>(smem_, t.stage.index, t.q, u);
    add_promoted_part<0>(t.s, u);
    issue_qk_steps<Traits, 2 * kPart, kPart>(smem_, t.stage.index, t.q, u);
    issue_pv<Traits>(smem_, prev.index, t.p, t.o, /*accumulate=*/!restarts_o(it));
    pass_turn(false);
    add_promoted_part<1>(t.s, u);
    softmax_under_pv(t, it, prev);
  }

  // S of tile it is complete and the previous tile's P V in flight: the softmax around its wait.
  __device__ __forceinline__ void softmax_under_pv(Tile& t, int it, Stage<Traits> prev) const {
    release(smem_.barriers.k_empty(t.stage.index));
    // Both maxima and row half 0's exp2s overlap P V; half 1's follow its wait, where ptxas can
    // interleave them with O's rescale and P's conversion (64 exp2s in a row issue 8 cycles
    // apart, the XU's rate, with nothing between them). They sit in both arms: ptxas waits for
    // the warpgroup's wgmmas where the arms join, which must come after those exp2s.
    if (needs_mask(t, it)) {
      mask(t, it);
      first_steps(t);
    } else {
      first_steps(t);
    }
    fence_half(t.s, 0);  // half 0's P before the wait: else the compiler moves its exp2s below it
    cute::warpgroup_wait<0>();
    pv_done(t, prev);
    t.softmax.exp2_scores(t.s, 1);
    if constexpr (Traits::kPromoteTiles > 0) t.partial.rescale(t.softmax.correction);
    t.softmax.rescale(t.o);
  }

  // The softmax's steps before P V's wait: both row halves' maxima, half 0's P, half 1's exponents.
  __device__ __forceinline__ static void first_steps(Tile& t) {
    t.softmax.fold_max(t.s, 0);
    t.softmax.fold_max(t.s, 1);
    t.softmax.exponentiate(t.s, 0);
    t.softmax.scale_scores(t.s, 1);
  }

  // The registers of S's row half h (columns 4j + 2h, 4j + 2h + 1).
  __device__ __forceinline__ static void fence_half(float (&s)[64], int h) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      cute::warpgroup_fence_operand(s[4 * j + 2 * h]);
      cute::warpgroup_fence_operand(s[4 * j + 2 * h + 1]);
    }
  }

  // The previous tile's P V (in stage prev) is complete: O may be read again.
  __device__ __forceinline__ void pv_done(Tile& t, Stage<Traits> prev) const {
    sm90::fence_registers(t.o);
    release(smem_.barriers.v_empty(prev.index));
  }

  // Last turn: P V of the last tile. Every product with Q has completed (the turns before waited
  // for their S), so Q, where S read it from shared memory, is released to the next work tile's
  // load first.
  __device__ __forceinline__ void last_turn(Tile& t) const {
    PipelineBarriers<Traits::kStages>& bar = smem_.barriers;
    if constexpr (!QOperand::kInRegisters) release(bar.q_empty());
    sm90::Barrier::wait(bar.v_full(t.stage.index), t.stage.phase);
    wait_turn();
    issue_pv<Traits>(smem_, t.stage.index, t.p, t.o,
                     /*accumulate=*/!restarts_o(t.w.n_blocks));
    pass_turn(true);
    cute::warpgroup_wait<0>();
    sm90::fence_registers(t.o);
    release(bar.v_empty(t.stage.index));
    if constexpr (Traits::kPromoteTiles > 0) t.partial.fold_into(t.o);
  }

  const PrefillKernelParams& p_;
  SharedStorage<Traits>& smem_;
  int cw_;    // consumer warpgroup: 0 or 1
  int row0_;  // its rows within the block
};

}  // namespace fp8mla::cuda::attention
