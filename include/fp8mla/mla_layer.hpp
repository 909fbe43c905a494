// One MLA attention layer's prefill (docs/design.md section 5): q_a -> RMSNorm -> q_b (or q_proj),
// kv_a_proj_with_mqa -> RMSNorm on kv_c, kv_b_proj, RoPE, latent cache write, attention over
// each sequence's cached prefix and new tokens (one-shot, or chunked prefix with LSE merge),
// o_proj. The attention backend (fp8mla/attention_backend.hpp) decides the path, both
// first-class: with its prepare_prefill_qkv hook the FP8 path (fused RoPE + e4m3 Q/K/V, FP8
// attention), without it the BF16 path (bf16 RoPE, bf16 attention); the cache is FP8 in both.
//
// Projections: bf16 weights run as bf16 GEMMs (f32 accumulation); e4m3 weights with 128 x 128
// block scales run as FP8 GEMMs whose input is quantized per token and group of 128 (DeepSeek's
// recipe), where the device supports the shape (otherwise that weight is dequantized to bf16 once,
// at construction, and projection_notes() says so). The CPU layer is the reference and computes
// the same steps in f32; the CUDA layer uses cuBLASLt and fp8mla's CUDA ops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fp8mla/attention_backend.hpp"
#include "fp8mla/mla_config.hpp"
#include "fp8mla/mla_parallel.hpp"
#include "fp8mla/mla_weights.hpp"
#include "fp8mla/stream.hpp"
#include "fp8mla/tensor_view.hpp"

namespace fp8mla {

// A batch: per sequence, the tokens already in the latent cache (prefix) and the new ones
// (extend), and the cache slots of all of them, prefix first.
struct MlaSequence {
  std::int64_t prefix = 0;
  std::int64_t extend = 0;
  std::vector<std::int64_t> slots;  // prefix + extend slots
};

struct MlaBatch {
  std::vector<MlaSequence> sequences;
  std::int64_t extend_tokens() const;
};

// A batch whose metadata is already on the layer's device, as an engine holds it (docs/design.md
// section 5): prefill reads it there, so a prefill needs no host copy and can be captured in a
// CUDA graph for a padded shape (the counts and bounds below) and replayed for any batch of that
// shape. Rows past cu_seqlens_q[B] up to `tokens` are padding: they take their slot_mapping
// entry, -1 (no cache write), their position (any in [0, max_position)), and their output rows
// hold whatever the projections make of their hidden rows. Positions are taken as given (a
// sequence with a cached prefix of P tokens has its new tokens at P, P + 1, ...).
//
// Cached prefixes (optional: an empty cu_seqlens_prefix means none): sequence b's prefix keys are
// the cache rows prefix_slots[cu_seqlens_prefix[b], cu_seqlens_prefix[b + 1]); entries past
// cu_seqlens_prefix[B] up to prefix_tokens are padding (gathered, never attended; -1 reads
// zeros). The new tokens attend their sequence's new keys causally, then all prefix keys in one
// pass, merged by LSE: the host batch's chunked path with a single chunk (the options'
// one_shot_max_prefix and chunk_capacity do not apply).
struct MlaDeviceBatch {
  TensorView cu_seqlens_q;         // i32 [B + 1], contiguous: each sequence's first row; [0] = 0
  TensorView positions;            // i64 [tokens], contiguous: each row's position
  TensorView slot_mapping;         // i64 [tokens], contiguous: each row's cache slot, -1: none
  std::int64_t tokens = 0;         // rows of hidden and out, padding included
  std::int32_t max_seqlen_q = 0;   // >= every sequence's new tokens (the attention grid's bound)
  TensorView cu_seqlens_prefix;    // i32 [B + 1], contiguous, or empty: no prefixes
  TensorView prefix_slots;         // i64 [prefix_tokens], contiguous
  std::int64_t prefix_tokens = 0;  // entries of prefix_slots, padding included
  std::int32_t max_seqlen_prefix = 0;  // >= every sequence's prefix tokens
  bool has_prefix() const { return cu_seqlens_prefix.data() != nullptr; }
};

// Static per-tensor scales of the FP8 path's attention inputs: e4m3 = x * scale_inv, as an engine
// calibrates them per layer; 1 is the unit scale. Prefix chunks use the same scales.
struct MlaFp8Scales {
  float q_scale_inv = 1.0f;
  float k_scale_inv = 1.0f;
  float v_scale_inv = 1.0f;
};

struct MlaPrefillOptions {
  // Up to this many prefix keys in the batch, prefix and extend keys are attended together
  // (one-shot). Above it the extend tokens attend causally among themselves, then each chunk of
  // at most chunk_capacity prefix keys non-causally, its call folding it into the running
  // output by LSE (or a merge after the call, for a backend that does not fold); the chunks
  // bound the memory the prefix keys take.
  std::int64_t one_shot_max_prefix = 8192;
  std::int64_t chunk_capacity = 8192;
  float cache_scale_inv = 1.0f;  // the latent cache holds e4m3(x * cache_scale_inv)
  MlaFp8Scales fp8;
  // On the FP8 path with an FP8 o_proj, the last writer of the attention output (the attention
  // call; with chunked prefixes the last chunk's call or merge) writes o_proj's e4m3 input and
  // its scales itself, when the backend fuses fp8_group128. false: a separate quantization, for
  // A/B runs.
  bool fuse_output_quant = true;
  // With a backend that folds prior states (BackendCapabilities::fold_prior_state), each prefix
  // chunk's attention call folds the chunk into the output. false: a merge after each call
  // (the same bytes), for A/B runs.
  bool fold_chunks = true;
  // On the FP8 path with an FP8 kv_b_proj, kv_b's V half runs as a GEMM of its own that writes
  // V in e4m3, in the layout attention reads, rounded once from its f32 sums (e4m3(sum *
  // v_scale_inv)): no bf16 V is written and read back. false: bf16 V quantized by the backend's
  // hook, for A/B runs.
  bool fp8_kv_from_projection = false;
};

// How o_proj gets its input (docs/design.md section 5).
enum class MlaOutputQuant : std::uint8_t {
  kNone,      // o_proj is a bf16 GEMM: it reads the attention's bf16 output
  kSeparate,  // quantize_fp8_per_token_group of the attention's bf16 output, then the FP8 GEMM
  kFused,     // the last attention call (or merge) writes the FP8 GEMM's input and scales
};
// "none", "separate", "fused".
std::string_view to_string(MlaOutputQuant mode);

// What a prefill with a backend and options will do for o_proj's input, and a line saying why.
struct MlaOutputQuantPlan {
  MlaOutputQuant mode = MlaOutputQuant::kNone;
  std::string note;
};

// Calibration of the static scales (docs/design.md section 5): the largest magnitude of each FP8
// input over a sample batch, as the BF16 path computes it (projections, bf16 RoPE), and the
// scales that map it to kE4M3Max / headroom.
struct MlaActivationAmax {
  float q = 0;      // the attention's Q, [T, H, 192] after RoPE
  float k = 0;      // K = [k_nope | RoPE'd k_pe], [T, H, 192]
  float v = 0;      // [T, H, 128]
  float cache = 0;  // the latent cache rows [kv_c | RoPE'd k_pe], [T, 576]
};

// The default headroom: the sample's amax lands at 448 / 2 = 224, so that a later batch may
// reach twice the sample's magnitude before it saturates; e4m3's relative precision is the same
// in every binade, so the only cost is one binade less of range at the small end.
inline constexpr float kMlaCalibrationHeadroom = 2.0f;

struct MlaCalibrationOptions {
  float headroom = kMlaCalibrationHeadroom;  // >= 1
};

struct MlaCalibration {
  MlaActivationAmax amax;
  float headroom = kMlaCalibrationHeadroom;
  MlaFp8Scales fp8;
  float cache_scale_inv = 1.0f;
  // Sets options.fp8 and options.cache_scale_inv to these scales.
  void apply_to(MlaPrefillOptions& options) const;
};

// The scale_inv of one tensor of magnitude `amax`: 1 / max(amax * headroom / 448,
// kMinDynamicScale) (fp8mla/quantize.hpp), so e4m3 = x * scale_inv keeps amax at 448 / headroom;
// 1 (the unit scale) for amax 0, which any scale represents. A NaN or infinite amax (a sample
// with non-finite values), a negative one or headroom < 1 is an error naming `what`.
float mla_scale_inv_from_amax(float amax, float headroom, std::string_view what);
// The four scales of `amax`, each as above.
MlaCalibration mla_calibration_from_amax(const MlaActivationAmax& amax,
                                         float headroom = kMlaCalibrationHeadroom);

// What a CUDA layer's workspace must hold: the largest batch it will be given.
struct MlaWorkspaceLimits {
  std::int64_t max_tokens = 0;  // extend tokens
  std::int64_t max_sequences = 0;
  std::int64_t max_prefix_tokens = 0;  // prefix tokens of all sequences together
  // Context parallelism: the latent rows of one all-gather, size * rows_per_rank
  // (MlaContextParallelBatch::workspace_limits gives all four for a rank's batch).
  std::int64_t max_gathered_rows = 0;
};

// Time of each stage of the last prefill, in milliseconds (wall time on the CPU, CUDA events on
// the GPU).
struct MlaStageTimes {
  double projections = 0;  // q, kv_a, RMSNorm, kv_b of the extend tokens
  double prep = 0;         // RoPE, FP8 conversion, cache write
  double prefix = 0;       // gather, kv_b and packing of the prefix keys
  double attention = 0;
  double merge = 0;   // chunks merged after their calls (a backend that does not fold them)
  double output = 0;  // o_proj
  double reduce = 0;  // the all-reduce of o_proj's partial sums (tensor parallelism)
  // Context parallelism: the rank's latent rows packed, all-gathered, the others' written to
  // the cache.
  double gather = 0;
  MlaOutputQuant output_quant = MlaOutputQuant::kNone;  // how o_proj's input was made
  double total() const {
    return projections + prep + gather + prefix + attention + merge + output + reduce;
  }
};

// Context parallelism (docs/parallelism.md): rank r of N of a batch split over the tokens. Each
// sequence's extend tokens are cut into 2N chunks of equal length (to a token), and rank r takes
// chunks r and 2N - 1 - r, so that every rank gets the same causal work (an early chunk has
// few keys, its mirror many); rank N - 1's two chunks are adjacent and make one. A rank's chunk
// is a sequence of the rank's batch whose prefix is everything before it: the sequence's own
// prefix and the chunks before, whoever computes them. The rank projects its own tokens and
// writes their latent rows to its cache; prefill_context_parallel all-gathers every rank's rows
// and writes the others' into the rank's cache, then attends as a prefill of the rank's batch.
// Rank q's rows go into the all-gather in its batch's token order, padded to rows_per_rank.
struct MlaContextParallelBatch {
  MlaContextParallel cp;
  MlaBatch batch;  // this rank's chunks, in the full batch's sequence order
  // [batch.extend_tokens()]: each of this rank's tokens as a row of the full batch (its index
  // among the full batch's extend tokens): the rank's `hidden` and `out` rows.
  std::vector<std::int64_t> tokens;
  std::int64_t rows_per_rank = 0;  // the most tokens any rank has
  // [cp.size * rows_per_rank]: the cache slot of each row of the all-gather, rank by rank; -1
  // past a rank's tokens.
  std::vector<std::int64_t> gathered_slots;
  // The workspace limits of this rank's prefill_context_parallel on this batch.
  MlaWorkspaceLimits workspace_limits() const;
};

// Rank cp.rank's share of `full` (every rank passes the same batch and gets its own share). A
// size below 1, a rank outside [0, size) or a sequence whose slots are not prefix + extend is an
// ErrorCategory::kInvalidArgument error naming the values. Sequences without new tokens are left
// out (they attend nothing); size 1 keeps every other sequence whole.
MlaContextParallelBatch mla_context_parallel_batch(const MlaBatch& full, MlaContextParallel cp);

class MlaLayer {
 public:
  // Keeps `weights` (and what they point into) for the layer's lifetime. On the CPU e4m3 weights
  // are dequantized with their block scales once, here. On a CUDA device the weights are copied
  // to it and the projections planned (cuBLASLt algorithm checks): the one-time work, done here.
  // A config the ops cannot serve (kv_lora_rank other than 512, no heads) or a weight that is not
  // the contiguous host tensor of the dtype and shape the config gives it is an error.
  //
  // Tensor parallelism (fp8mla/mla_parallel.hpp, docs/parallelism.md): `config` is the full
  // model's, `weights` rank tp.rank's shard (shard_mla_weights), shaped as
  // mla_rank_config(config, tp) gives them; config() is that rank config. o_proj writes the
  // rank's partial sum into prefill's `out`; with a `communicator` (rank and size equal to tp's;
  // it must outlive the layer) prefill then calls communicator->all_reduce_sum(out, stream), so
  // `out` holds the full output on every rank; without one `out` keeps the partial sum, for the
  // caller to reduce (or reduce-scatter). A bad `tp` is check_mla_tensor_parallel's error.
  MlaLayer(MlaConfig config, const MlaWeights& weights, Device device = Device::cpu(),
           MlaTensorParallel tp = {}, MlaCommunicator* communicator = nullptr);
  ~MlaLayer();
  MlaLayer(MlaLayer&&) noexcept;
  MlaLayer& operator=(MlaLayer&&) noexcept;

  const MlaConfig& config() const { return config_; }  // heads: this rank's
  Device device() const { return device_; }
  MlaTensorParallel tensor_parallel() const { return tp_; }
  // One line per projection: how it runs ("q_a_proj [1536, 7168]: fp8 block-scaled GEMM", or
  // "...: bf16 GEMM, dequantized at load because ...").
  const std::vector<std::string>& projection_notes() const;
  // How prefill with `backend` and `options` makes o_proj's input: fused into the attention's
  // output, a separate quantization (and why: the BF16 path, the option, or a backend that does
  // not fuse fp8_group128), or none (a bf16 o_proj). MlaStageTimes::output_quant says what ran.
  MlaOutputQuantPlan output_quant_plan(const AttentionBackend& backend,
                                       const MlaPrefillOptions& options) const;

  // Bytes of device workspace prefill needs for batches within `limits` with `backend` (which
  // decides the path) and `options`; 0 on the CPU.
  std::size_t workspace_bytes(const MlaWorkspaceLimits& limits, const MlaPrefillOptions& options,
                              const AttentionBackend& backend) const;

  // hidden: bf16 [T, config.hidden] with T = batch.extend_tokens(), rows in sequence order;
  // cache: e4m3 [pages, page_size, 576] (the prefix rows are read, the extend rows written);
  // out: bf16 [T, config.hidden], written in full (a partial sum under tensor parallelism without
  // a communicator, see the constructor). All on the layer's device.
  // workspace (CUDA only): a 1-d contiguous view (any dtype) of >= workspace_bytes(...) bytes on
  // the device, 256-byte aligned, for a batch within the limits it was sized for; nothing in it
  // is read before it is written. The CUDA path runs on `stream`,
  // allocates nothing and synchronizes nothing, except that it copies the batch's metadata from
  // the layer's pinned host buffer (first waiting for this layer's previous copy from it to have
  // run) and, when `times` is given, waits for its events to read them. For that copy a host
  // batch cannot be captured in a CUDA graph (an error; capture the MlaDeviceBatch form).
  // A backend lacking what the path needs is an error (check_backend). One prefill or
  // calibration at a time per layer: one entering from another thread meanwhile is
  // kInvalidArgument.
  void prefill(const TensorView& hidden, const MlaBatch& batch, const TensorView& cache,
               const AttentionBackend& backend, const MlaPrefillOptions& options,
               const TensorView& out, const TensorView& workspace = {},
               MlaStageTimes* times = nullptr, CudaStream stream = nullptr);

  // Bytes of device workspace prefill needs for device batches of `batch`'s padded shape (its
  // counts and bounds; the views' contents are not read); 0 on the CPU.
  std::size_t workspace_bytes(const MlaDeviceBatch& batch, const MlaPrefillOptions& options,
                              const AttentionBackend& backend) const;

  // prefill of a batch described on the device (MlaDeviceBatch), the same steps and bytes for its
  // rows as the host MlaBatch of the same sequences (with prefixes: the host batch's chunked path
  // with one chunk). hidden and out: bf16 [batch.tokens, config.hidden]; the workspace must hold
  // workspace_bytes(batch, ...). The CUDA path
  // copies nothing from the host, allocates and synchronizes nothing (without `times`), and may
  // be captured in a CUDA graph; the metadata are not read on the host, so a slot outside the
  // cache is skipped by the cache write, not reported. On the CPU the views are host memory,
  // read and checked as the host batch's.
  void prefill(const TensorView& hidden, const MlaDeviceBatch& batch, const TensorView& cache,
               const AttentionBackend& backend, const MlaPrefillOptions& options,
               const TensorView& out, const TensorView& workspace = {},
               MlaStageTimes* times = nullptr, CudaStream stream = nullptr);

  // prefill for rank batch.cp.rank of a context-parallel group (MlaContextParallelBatch):
  // hidden and out hold the rank's tokens (batch.tokens: [T_rank, config.hidden]); cache is the
  // rank's own copy, holding every sequence's prefix rows. After the rank's projections and
  // cache write, `communicator` (rank and size equal to batch.cp's; every rank of the group calls
  // this, with its share of the same full batch) all-gathers every rank's FP8 latent rows in
  // place in the workspace, on `stream`, and the other ranks' are written to the cache, which then
  // holds every row of the full batch as one rank's prefill would write it; the attention is
  // then a prefill of batch.batch. A rank without tokens still takes part in the all-gather.
  // The workspace must hold workspace_bytes(batch.workspace_limits(), ...); the rest is as
  // prefill's, including tensor parallelism (the layer's own communicator reduces o_proj).
  void prefill_context_parallel(const TensorView& hidden, const MlaContextParallelBatch& batch,
                                MlaCommunicator& communicator, const TensorView& cache,
                                const AttentionBackend& backend, const MlaPrefillOptions& options,
                                const TensorView& out, const TensorView& workspace = {},
                                MlaStageTimes* times = nullptr, CudaStream stream = nullptr);

  // The static scales for `batch` (docs/design.md section 5): the amax of each FP8 input over
  // its extend tokens, computed with the layer's own steps as the BF16 path runs them (the
  // projections, bf16 RoPE at each token's position; a sequence's prefix sets the positions,
  // its cached keys are not read), and mla_calibration_from_amax of them. hidden: bf16
  // [T, config.hidden] on the layer's device as for prefill, T = batch.extend_tokens() >= 1; the
  // slots are not used beyond prefill's count check and no cache is written. Not a hot-path
  // call: on a CUDA device it allocates its own workspace (kept for the next calibration) and
  // waits for `stream` to return the host numbers.
  MlaCalibration calibrate(const TensorView& hidden, const MlaBatch& batch,
                           const MlaCalibrationOptions& options = {}, CudaStream stream = nullptr);

  class Impl;

 private:
  // prefill's checks of its arguments against the layer for `tokens` rows; errors name `caller`.
  void check_prefill(const TensorView& hidden, std::int64_t tokens, const TensorView& cache,
                     const MlaPrefillOptions& options, const TensorView& out,
                     std::string_view caller) const;

  MlaConfig config_;
  Device device_;
  MlaTensorParallel tp_;
  std::unique_ptr<Impl> impl_;
};

// The float64 reference of MlaLayer::prefill on the same inputs: dequantized weights, no
// intermediate rounding, exact softmax over every prefix key (from the cache, dequantized) and
// the sequence's extend keys up to the query's position. e4m3 weights see their input quantized
// per 128-group (DeepSeek's FP8 recipe defines the model that way), in float64 otherwise.
// out: f64 [T, hidden], contiguous.
void mla_prefill_reference(const MlaConfig& config, const MlaWeights& weights,
                           const TensorView& hidden, const MlaBatch& batch, const TensorView& cache,
                           float cache_scale_inv, double* out);

}  // namespace fp8mla
