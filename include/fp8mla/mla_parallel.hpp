// Tensor parallelism of the MLA layer over heads (docs/parallelism.md). Rank r of N keeps heads
// [r * H / N, (r + 1) * H / N): the rows of q_b_proj (or q_proj) and kv_b_proj that produce them
// (column-parallel) and the columns of o_proj that read their attention output (row-parallel).
// The latent projections, the RMSNorm weights and the latent cache are replicated. A rank's layer
// is an MLA layer of H / N heads whose o_proj writes a partial sum of the full output; the sum of
// the N partials is the output, made by an all-reduce through an MlaCommunicator.
#pragma once

#include <memory>
#include <vector>

#include "fp8mla/mla_config.hpp"
#include "fp8mla/mla_weights.hpp"
#include "fp8mla/stream.hpp"
#include "fp8mla/tensor_view.hpp"

namespace fp8mla {

// MlaTensorParallel (the rank and group size) is in fp8mla/mla_config.hpp.

// The checks of `tp` for `config`'s full head count and the weights' format: size in {1, 2, 4,
// 8} dividing config.heads, 0 <= rank < size, and for kFp8Block weights, every shard boundary of
// q_b_proj / q_proj (heads / size * 192 rows per rank) on a 128-row block of their
// weight_scale_inv (kv_b_proj's 256 rows and o_proj's 128 columns per head always are). Each is
// an ErrorCategory::kInvalidArgument error naming the values.
void check_mla_tensor_parallel(const MlaConfig& config, MlaTensorParallel tp, WeightFormat format);

// The config of one rank's layer: `config` with heads / tp.size heads (the rest is unchanged:
// hidden, ranks, RoPE, the softmax scale). Checks `tp` as above.
MlaConfig mla_rank_config(const MlaConfig& config, MlaTensorParallel tp, WeightFormat format);

// Rank tp.rank's shard of the full weights `full` of `config` (the full head count), checked as
// above and against the config's shapes: q_b_proj (or q_proj) and kv_b_proj keep the output rows
// of the rank's heads and the matching rows of their block scales, as views into `full`; o_proj
// keeps the input columns of the rank's heads and the matching scale columns, copied into the
// shard's storage (a column slice is not contiguous); the rest are views of `full`'s tensors. The
// shard keeps `full`'s storage alive; weights loaded from a file still need the file. For size 1
// the shard views every tensor of `full` unchanged.
MlaWeights shard_mla_weights(const MlaWeights& full, const MlaConfig& config, MlaTensorParallel tp);

// The collective the layer calls after o_proj when its tensor-parallel size is above 1: each
// rank's output buffer holds a partial sum, and all_reduce_sum leaves the sum of the N partials
// in every rank's buffer. The layer calls it on its own stream, once per prefill, on its `out`
// (bf16 [T, hidden], contiguous, on the layer's device), and allocates and synchronizes nothing
// around it.
//
// An NCCL implementation: ncclAllReduce(out, out, T * hidden, ncclBfloat16, ncclSum, comm,
// stream) in place on the layer's stream, enqueued only (no stream or device synchronize, no
// allocation per call: a registered or persistent buffer if it wants one), usable inside CUDA
// graph capture; rank() and size() as the NCCL communicator's, equal to the layer's
// MlaTensorParallel. Its sum order is NCCL's (ring or tree, possibly rounding between steps), so
// outputs are not bit-identical to the CPU implementation's rank-order sum; docs/parallelism.md
// gives the bound for each.
class MlaCommunicator {
 public:
  virtual ~MlaCommunicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // inout: the same dtype (bf16 or f32) and shape on every rank, contiguous. In place: the sum
  // of every rank's inout, rounded once to the dtype, in every rank's inout.
  virtual void all_reduce_sum(const TensorView& inout, CudaStream stream) = 0;
  // in: [rows, ...] the same on every rank, rows divisible by size(); out: [rows / size(), ...]
  // of in's dtype, contiguous: rows [rank * rows / size(), (rank + 1) * rows / size()) of the
  // sum (sequence-sharded output, a reduce-scatter over tokens).
  virtual void reduce_scatter_sum(const TensorView& in, const TensorView& out,
                                  CudaStream stream) = 0;
  // in: [rows, ...] of any dtype, the same dtype and shape on every rank, contiguous; out:
  // [size() * rows, ...] of in's dtype, contiguous: every rank's `in`, rank q's at rows
  // [q * rows, (q + 1) * rows). Bytes are copied, not converted. In place when `in` is rank()'s
  // rows of `out` (how context parallelism gathers the FP8 latent cache rows).
  virtual void all_gather(const TensorView& in, const TensorView& out, CudaStream stream) = 0;
};

// `size` communicators of one in-process group, rank i at index i, for host tensors: each call is
// a rendezvous (every rank's call blocks until all `size` ranks have made it, so ranks run on
// their own threads); the last to arrive sums every rank's buffer in f32 in rank order 0..N-1,
// then each buffer gets the sum rounded once to its dtype, so the result is deterministic and the
// same on every rank. A call whose tensors differ between ranks (dtype, shape) or are not
// contiguous host bf16 / f32 tensors is a kInvalidArgument error on every rank. size in 1..8.
std::vector<std::unique_ptr<MlaCommunicator>> make_cpu_communicators(int size);

// NCCL communicators, for CUDA tensors. fp8mla loads NCCL when first asked (libnccl.so.2, as the
// nvidia-nccl-cu13 wheel or a system package installs it; in a process that already loaded NCCL,
// that copy), so a build with NCCL links nothing more. A build without NCCL's header, or a process
// that cannot load the library, gets an ErrorCategory::kUnsupported error saying which. Calls are
// enqueued on the given stream only (ncclAllReduce in place, ncclReduceScatter), allocate and
// synchronize nothing, and may be captured in a CUDA graph; tensors must be contiguous bf16 or
// f32 on the communicator's device (else kInvalidArgument), and an NCCL failure is a kCuda error.
//
// `nccl_comm`: the caller's initialized ncclComm_t (an engine has one), borrowed: it must outlive
// the communicator, which never destroys it. rank() and size() are the NCCL communicator's.
std::unique_ptr<MlaCommunicator> make_nccl_communicator(void* nccl_comm);

// A group over `devices` (1 to 8 CUDA ordinals) of this process, made by ncclCommInitAll: rank i
// on devices[i], each owning its NCCL communicator. One process driving several GPUs calls each
// rank from its own thread (NCCL's rule without group calls), as with make_cpu_communicators.
std::vector<std::unique_ptr<MlaCommunicator>> make_nccl_communicators(
    const std::vector<int>& devices);

}  // namespace fp8mla
