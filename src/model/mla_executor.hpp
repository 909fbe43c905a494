// The MLA layer's prefill as one driver over an executor (docs/design.md section 5). The driver
// (run_mla_prefill, mla_layer.cpp) takes the batch's plan, which chooses the prefix attention, and
// the backend's path, and calls the executor's steps in order. An executor runs each step on its
// device: the CPU one (mla_layer_cpu.cpp) in host memory with the reference math, the CUDA one
// (mla_layer_cuda.cpp) in the caller's workspace on a stream, with the batch's metadata uploaded
// in one copy and GPU clock stamps as stage timers (cuda/common/stage_timer.hpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fp8mla/error.hpp"
#include "fp8mla/mla_layer.hpp"
#include "fp8mla/output_quant.hpp"
#include "model/prefix_chunks.hpp"

namespace fp8mla {

// How the extend tokens attend to the cached prefixes: no prefix in the batch; prefix and extend
// keys together (one-shot); or the extend keys causally, then each prefix chunk, merged by LSE.
enum class PrefixAttention { kNone, kOneShot, kChunked };

// A batch as the layer's steps see it.
struct MlaBatchPlan {
  std::int64_t tokens = 0;                     // T: extend tokens
  std::int64_t sequences = 0;                  // B
  std::vector<std::int64_t> positions, slots;  // [T]: position and cache slot of each extend token
  std::vector<std::int32_t> cu_q;              // [B + 1]: query offsets, also the extend keys'
  std::int32_t max_q = 0;
  std::vector<std::int64_t> prefix_lens;  // [B]
  std::vector<std::int64_t> prefix_rows;  // cache slots of every prefix token, in sequence order
  PrefixAttention prefix_attention = PrefixAttention::kNone;
  // One-shot: each sequence's keys are its prefix, then its extend tokens.
  std::vector<std::int32_t> cu_k_one_shot;  // [B + 1]
  std::int32_t max_k_one_shot = 0;
  // Chunked: chunk c holds prefix_rows[chunk_first_row[c], + chunks[c].keys()).
  std::vector<PrefixChunk> chunks;
  std::vector<std::int64_t> chunk_first_row;
  // Context parallelism: the all-gather of gather_ranks * gather_rows_per_rank latent rows (0:
  // none). This rank's block is filled from the cache rows pack_rows ([rows_per_rank], -1: a
  // padding row of zeros); after the all-gather row j goes to cache slot unpack_rows[j] (-1:
  // this rank's own rows, already in its cache, and padding).
  int gather_rank = 0, gather_ranks = 1;
  std::int64_t gather_rows_per_rank = 0;
  std::vector<std::int64_t> pack_rows, unpack_rows;
  std::int64_t gathered_rows() const { return gather_rows_per_rank * gather_ranks; }
  // A batch described on the device (CUDA only): its cu_seqlens_q, positions and slots are read
  // there; positions, slots and cu_q above stay empty, tokens counts the padded rows.
  const MlaDeviceBatch* device = nullptr;
};

// Checks the batch against `config` (lengths, slot counts, positions) and plans it into `plan`,
// whose vectors keep their capacity from one batch to the next; the prefix attention is chosen
// here (chunked above options.one_shot_max_prefix prefix keys). Errors name `caller`.
void plan_mla_batch(const MlaConfig& config, const MlaBatch& batch,
                    const MlaPrefillOptions& options, MlaBatchPlan& plan,
                    std::string_view caller = "MlaLayer::prefill");
// The all-gather of a context-parallel rank's batch into `plan` (planned from batch.batch);
// without it a plan gathers nothing.
void plan_mla_gather(const MlaContextParallelBatch& batch, MlaBatchPlan& plan);
// The plan of a device-described batch (mla_device_batch.cpp): checked for its dtypes, shapes and
// device; a CUDA batch's metadata stay on the device (plan.device points at them), a CPU batch's
// are host memory, copied into the plan and checked as a host batch's.
void plan_mla_device_batch(const MlaConfig& config, const MlaDeviceBatch& batch, Device device,
                           MlaBatchPlan& plan);

// The path a backend runs: its prepare_prefill_qkv hook decides; and how o_proj gets its input
// (fused: the last writer of the attention output writes it, the FP8 path only).
struct MlaPath {
  bool fp8 = false;
  DType attention_dtype = DType::kBF16;
  MlaOutputQuant output_quant = MlaOutputQuant::kNone;
  // Chunked prefixes: each chunk's attention call folds its result into the layer's output and
  // LSE (the backend folds prior states), instead of a merge after it.
  bool fold_chunks = false;
  // FP8 path: kv_b_proj's V half is a GEMM of its own that writes V in e4m3 where attention
  // reads it, rounded once from its f32 sums; the hook then does Q and K alone.
  bool kv_from_projection = false;
};
// The output quantization key the fused path asks the backend for.
inline constexpr OutputQuantKey kMlaOutputQuantKey = OutputQuantKey::kFp8Group128;
MlaOutputQuantPlan mla_output_quant_plan(const BackendCapabilities& caps,
                                         const MlaPrefillOptions& options, bool fp8_o_proj);
class MlaExecutor;
MlaPath mla_path(const AttentionBackend& backend, const MlaPrefillOptions& options,
                 const MlaExecutor& executor);

// Everything prefill gets, checked by MlaLayer::prefill before the driver sees it. A calibration
// call (run_mla_calibration) has the BF16 path, no backend and empty cache and out views.
struct MlaPrefillCall {
  const TensorView& hidden;
  const MlaBatchPlan& plan;
  const TensorView& cache;
  const AttentionBackend* backend;
  const MlaPrefillOptions& options;
  const TensorView& out;
  const TensorView& workspace;
  MlaPath path;
  MlaStageTimes* times;
  CudaStream stream;
  // Tensor parallelism: sums the ranks' partial `out` after o_proj; null: none (or the caller's).
  MlaCommunicator* communicator;
  // Context parallelism: all-gathers the plan's latent rows (the plan gathers some).
  MlaCommunicator* gather_communicator = nullptr;
};

// The keys of one attention call: the extend tokens' (cu_seqlens_k = the plan's cu_q), each
// sequence's prefix then extend keys (cu_k_one_shot), or the prefix keys prefix_keys() built last
// (the chunk's cu_seqlens_k; the call writes the chunk's output and LSE, which merge() folds in).
enum class MlaKeys { kExtend, kOneShot, kPrefix };

struct MlaAttendStep {
  MlaKeys keys = MlaKeys::kExtend;
  std::size_t chunk = 0;  // kPrefix: the chunk of the plan
  std::int32_t max_seqlen_k = 0;
  bool causal = true;
  bool lse = false;  // kExtend: the layer's output with its LSE, for the chunks to merge into
  // The last writer of the attention output (no chunks, or the last folded chunk): on a fused
  // path it writes o_proj's FP8 input and scales instead of bf16.
  bool o_proj_input = false;
  // kPrefix on a folding path: the call reads the layer's output and LSE as its prior state and
  // writes the merged state there (in place), or with o_proj_input into o_proj's input.
  bool fold = false;
};

// The tensors of one attention call as an executor lays them out: q, k, v views; cu_q, cu_k,
// descales (q, k, v; read on the FP8 path), out and lse f32 [T, H] (or null) in the executor's
// memory. out is bf16 [T, H, 128], or with out_scales (f32 [T, H], the group-128 scales in the
// layout the executor's o_proj reads; a default view: none) o_proj's e4m3 input [T, H * 128].
struct MlaAttentionTensors {
  TensorView q, k, v;
  TensorView k_rope;  // a split K's RoPE part (prefill_attention's k_rope), or none
  const std::int32_t *cu_q, *cu_k;
  const float* descales;
  void* out;
  float* lse;
  TensorView out_scales;
  // A folded chunk's prior state: the layer's bf16 output [T, H, 128] and LSE; null: none.
  const std::uint16_t* prior_out = nullptr;
  const float* prior_lse = nullptr;
};
// The attention call's arguments: the tensors above on `device`, the plan's sizes, the step's.
PrefillAttentionArgs mla_attention_args(const MlaConfig& config, const MlaBatchPlan& plan,
                                        MlaPath path, const MlaAttendStep& step,
                                        const MlaAttentionTensors& tensors, Device device);

// The FP8 V layout an executor's attention reads, and why (for the error when a backend packs
// V another way).
struct MlaVLayoutNeed {
  VLayout layout;
  const char* reason;
};

// A device's implementation of the prefill's steps, called by run_mla_prefill in this order:
// check_batch, begin, project, prep, (with context parallelism) pack_latent_rows and
// unpack_latent_rows around the all-gather, then per the plan's prefix attention prefix_keys,
// assemble_one_shot, attend and merge, then output and finish; each step between start_stage
// and stop_stage of the stage it counts to.
class MlaExecutor {
 public:
  virtual ~MlaExecutor() = default;
  virtual const std::vector<std::string>& projection_notes() const = 0;
  virtual std::size_t workspace_bytes(const MlaWorkspaceLimits& limits,
                                      const MlaPrefillOptions& options, MlaPath path) const = 0;
  virtual std::size_t workspace_bytes(const MlaBatchPlan& plan, MlaPath path) const = 0;
  virtual MlaVLayoutNeed fp8_v_layout() const = 0;
  virtual bool fp8_o_proj() const = 0;  // o_proj runs as an FP8 GEMM on e4m3 input
  // kv_b_proj runs as an FP8 GEMM whose V half can write e4m3 V itself (MlaPath).
  virtual bool e4m3_kv_projection() const = 0;

  // What the executor checks on the host before anything runs (also for a batch with no extend
  // tokens, which then ends here).
  virtual void check_batch(const MlaPrefillCall& call) = 0;
  // Takes the call's memory and metadata; the steps below work on it until finish().
  virtual void begin(const MlaPrefillCall& call) = 0;
  virtual void start_stage(double* stage) = 0;  // the step(s) until stop_stage add to *stage
  virtual void stop_stage() = 0;
  virtual void project() = 0;  // q, kv_a, RMSNorm, kv_b of the extend tokens
  virtual void prep() = 0;     // RoPE, FP8 Q/K/V (the hook) or bf16 RoPE, latent cache write
  // Context parallelism, after prep: this rank's latent rows packed into its block of the
  // all-gather's buffer, which is returned ([gathered rows, 576] e4m3); once the rows are
  // gathered, unpack_latent_rows writes the other ranks' into the cache.
  virtual TensorView pack_latent_rows() = 0;
  virtual void unpack_latent_rows() = 0;
  // The attention keys of prefix_rows[first_row, + rows): gathered, kv_b, packed or assembled.
  virtual void prefix_keys(std::int64_t first_row, std::int64_t rows) = 0;
  // Each sequence's prefix keys (from prefix_keys over all of them), then its extend keys.
  virtual void assemble_one_shot() = 0;
  virtual void attend(const MlaAttendStep& step) = 0;
  // The last chunk's output into the layer's, by LSE (a path that does not fold the chunks);
  // with o_proj_input (the last merge) on a fused path, into o_proj's FP8 input and scales.
  virtual void merge(bool o_proj_input) = 0;
  virtual void output() = 0;  // o_proj into the call's `out`
  virtual void finish() = 0;  // the stage times are in place after it

  // Calibration, called by run_mla_calibration: begin, project, activation_amax, finish.
  // The workspace a calibration call of `plan` on `path` runs in (CUDA: the executor's own,
  // allocated or grown here; CPU: none).
  virtual TensorView calibration_workspace(const MlaBatchPlan& plan, MlaPath path) = 0;
  // After project(), on the BF16 path: RoPE and K assembled as prep() does, without the cache
  // write, and the amax of Q, K, V and the latent cache rows. CUDA waits for the stream here.
  virtual MlaActivationAmax activation_amax() = 0;
};

// The layer's prefill: the executor's steps for the planned call; *call.times when given.
void run_mla_prefill(MlaExecutor& executor, const MlaPrefillCall& call);
// The amax of the FP8 inputs over a calibration call's extend tokens (at least one).
MlaActivationAmax run_mla_calibration(MlaExecutor& executor, const MlaPrefillCall& call);

std::unique_ptr<MlaExecutor> make_cpu_mla_executor(const MlaConfig& config,
                                                   const MlaWeights& weights);
#ifdef FP8MLA_WITH_CUDA
std::unique_ptr<MlaExecutor> make_cuda_mla_executor(const MlaConfig& config,
                                                    const MlaWeights& weights, Device device);
#endif

// The layer's state behind the public class: the plan of the current prefill (reused so that
// planning allocates nothing) and the executor of the layer's device.
class MlaLayer::Impl {
 public:
  MlaBatchPlan plan;
  std::unique_ptr<MlaExecutor> executor;
  MlaCommunicator* communicator = nullptr;
  std::atomic<bool> busy{false};  // a prefill or calibration is running (OneCallAtATime)
};

// Held for a prefill or calibration: the plan, the executor's buffers and the layer's staging are
// one call's, so a second call of the same layer from another thread meanwhile is an error (it
// would overwrite them under the first) instead of corrupted memory.
class OneCallAtATime {
 public:
  OneCallAtATime(MlaLayer::Impl& impl, std::string_view caller) : busy_(impl.busy) {
    if (busy_.exchange(true, std::memory_order_acquire)) {
      throw Error(ErrorCategory::kInvalidArgument,
                  concat(caller,
                         ": another prefill or calibration of this layer is running (one call at "
                         "a time per layer: give each thread its own MlaLayer)"));
    }
  }
  ~OneCallAtATime() { busy_.store(false, std::memory_order_release); }
  OneCallAtATime(const OneCallAtATime&) = delete;
  OneCallAtATime& operator=(const OneCallAtATime&) = delete;

 private:
  std::atomic<bool>& busy_;
};

}  // namespace fp8mla
