// MlaLayer: the checks every prefill gets, the batch plan and the path, and the driver that runs
// the prefill's steps on the CPU or CUDA executor (mla_layer_cpu.cpp, mla_layer_cuda.cpp).
#include "fp8mla/mla_layer.hpp"

#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>

#include "fp8mla/error.hpp"
#include "model/mla_executor.hpp"
#include "model/mla_weight_specs.hpp"

namespace fp8mla {

std::int64_t MlaBatch::extend_tokens() const {
  std::int64_t n = 0;
  for (const MlaSequence& s : sequences) n += s.extend;
  return n;
}

void plan_mla_batch(const MlaConfig& config, const MlaBatch& batch,
                    const MlaPrefillOptions& options, MlaBatchPlan& p, std::string_view caller) {
  p.sequences = std::int64_t(batch.sequences.size());
  for (auto* v : {&p.positions, &p.slots, &p.prefix_lens, &p.prefix_rows, &p.chunk_first_row,
                  &p.pack_rows, &p.unpack_rows})
    v->clear();
  p.gather_rank = 0;
  p.gather_ranks = 1;
  p.gather_rows_per_rank = 0;
  p.device = nullptr;
  p.cu_q.assign(1, 0);
  p.cu_k_one_shot.assign(1, 0);
  p.max_q = p.max_k_one_shot = 0;
  for (std::int64_t b = 0; b < p.sequences; ++b) {
    const MlaSequence& s = batch.sequences[std::size_t(b)];
    if (s.prefix < 0 || s.extend < 0 || std::int64_t(s.slots.size()) != s.prefix + s.extend ||
        s.prefix + s.extend > config.max_position) {
      throw Error(ErrorCategory::kInvalidArgument,
                  concat(caller, ": sequence ", b,
                         ": expected prefix, extend >= 0, prefix + extend <= ", config.max_position,
                         " and that many slots; got prefix ", s.prefix, ", extend ", s.extend, ", ",
                         s.slots.size(), " slots"));
    }
    for (std::int64_t i = 0; i < s.extend; ++i) {
      p.positions.push_back(s.prefix + i);
      p.slots.push_back(s.slots[std::size_t(s.prefix + i)]);
    }
    p.prefix_rows.insert(p.prefix_rows.end(), s.slots.begin(), s.slots.begin() + s.prefix);
    p.cu_q.push_back(p.cu_q.back() + std::int32_t(s.extend));
    p.cu_k_one_shot.push_back(p.cu_k_one_shot.back() + std::int32_t(s.prefix + s.extend));
    p.max_q = std::max(p.max_q, std::int32_t(s.extend));
    p.max_k_one_shot = std::max(p.max_k_one_shot, std::int32_t(s.prefix + s.extend));
    p.prefix_lens.push_back(s.prefix);
  }
  p.tokens = p.cu_q.back();
  const std::int64_t prefix_keys = std::int64_t(p.prefix_rows.size());
  p.prefix_attention = prefix_keys > options.one_shot_max_prefix ? PrefixAttention::kChunked
                       : prefix_keys > 0                         ? PrefixAttention::kOneShot
                                                                 : PrefixAttention::kNone;
  if (p.prefix_attention != PrefixAttention::kChunked) {
    p.chunks.clear();
    return;
  }
  plan_prefix_chunks(p.prefix_lens, options.chunk_capacity, p.chunks);
  std::int64_t row = 0;
  for (const PrefixChunk& c : p.chunks) {
    p.chunk_first_row.push_back(row);
    row += c.keys();
  }
}

std::string_view to_string(MlaOutputQuant mode) {
  switch (mode) {
    case MlaOutputQuant::kNone:
      return "none";
    case MlaOutputQuant::kSeparate:
      return "separate";
    case MlaOutputQuant::kFused:
      return "fused";
  }
  return "unknown";
}

MlaOutputQuantPlan mla_output_quant_plan(const BackendCapabilities& caps,
                                         const MlaPrefillOptions& options, bool fp8_o_proj) {
  if (!fp8_o_proj) return {MlaOutputQuant::kNone, "o_proj input: bf16 (o_proj is a bf16 GEMM)"};
  const std::string_view key = to_string(kMlaOutputQuantKey);
  const auto separate = [&](auto&&... why) {
    return MlaOutputQuantPlan{
        MlaOutputQuant::kSeparate,
        concat("o_proj input: quantize_fp8_per_token_group after the attention (", why..., ")")};
  };
  if (!caps.prepare_prefill_qkv) return separate("the BF16 path does not fuse it");
  if (!options.fuse_output_quant) return separate("fuse_output_quant is off");
  const auto& keys = caps.output_quant;
  if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
    return separate("attention backend '", caps.name, "' does not fuse ", key);
  }
  return {MlaOutputQuant::kFused,
          concat("o_proj input: fused ", key, ", written by the last attention call or merge")};
}

MlaPath mla_path(const AttentionBackend& backend, const MlaPrefillOptions& options,
                 const MlaExecutor& executor) {
  const BackendCapabilities& caps = backend.capabilities();
  MlaPath path;
  path.fp8 = caps.prepare_prefill_qkv;
  path.attention_dtype = path.fp8 ? DType::kE4M3 : DType::kBF16;
  path.output_quant = mla_output_quant_plan(caps, options, executor.fp8_o_proj()).mode;
  path.fold_chunks = caps.fold_prior_state && options.fold_chunks;
  path.kv_from_projection =
      path.fp8 && options.fp8_kv_from_projection && executor.e4m3_kv_projection();
  return path;
}

PrefillAttentionArgs mla_attention_args(const MlaConfig& config, const MlaBatchPlan& plan,
                                        MlaPath path, const MlaAttendStep& step,
                                        const MlaAttentionTensors& t, Device d) {
  const std::int64_t T = plan.tokens, B = plan.sequences, H = config.heads;
  PrefillAttentionArgs a;
  a.q = t.q;
  a.k = t.k;
  a.k_rope = t.k_rope;
  a.v = t.v;
  a.cu_seqlens_q = TensorView(const_cast<std::int32_t*>(t.cu_q), DType::kI32, {B + 1}, d);
  a.cu_seqlens_k = TensorView(const_cast<std::int32_t*>(t.cu_k), DType::kI32, {B + 1}, d);
  a.max_seqlen_q = plan.max_q;
  a.max_seqlen_k = step.max_seqlen_k;
  a.softmax_scale = float(config.softmax_scale());
  a.causal = step.causal;
  if (path.fp8) {
    float* descales = const_cast<float*>(t.descales);
    a.q_descale = TensorView(descales, DType::kF32, {1}, d);
    a.k_descale = TensorView(descales + 1, DType::kF32, {1}, d);
    a.v_descale = TensorView(descales + 2, DType::kF32, {1}, d);
  }
  if (t.out_scales.ndim() == 0) {  // not given
    a.out = TensorView(t.out, DType::kBF16, {T, H, kMlaVDim}, d);
  } else {
    a.out = TensorView(t.out, DType::kE4M3, {T, H * kMlaVDim}, d);
    a.output_block_scale = t.out_scales;
  }
  if (t.lse != nullptr) a.lse = TensorView(t.lse, DType::kF32, {T, H}, d);
  if (t.prior_out != nullptr) {
    a.prior_out =
        TensorView(const_cast<std::uint16_t*>(t.prior_out), DType::kBF16, {T, H, kMlaVDim}, d);
    a.prior_lse = TensorView(const_cast<float*>(t.prior_lse), DType::kF32, {T, H}, d);
  }
  return a;
}

namespace {

// The check that `backend` serves `path` on `device` with the cache's page size, and packs the
// FP8 path's V as the executor's attention reads it.
void check_mla_backend(const AttentionBackend& backend, MlaPath path, const TensorView& cache,
                       Device device, MlaVLayoutNeed v) {
  const BackendCapabilities& caps = backend.capabilities();
  BackendRequirements required;
  required.attention_dtype = path.attention_dtype;
  required.page_size = int(cache.ndim() == 3 ? cache.size(1) : 0);
  required.prepare_prefill_qkv = path.fp8;
  required.pack_prefix_chunk_kv = path.fp8;
  if (path.output_quant == MlaOutputQuant::kFused)
    required.output_quant = std::string(to_string(kMlaOutputQuantKey));
  check_backend(caps, required, device);
  if (path.fp8 && caps.v_layout != v.layout) {
    throw Error(ErrorCategory::kUnsupported,
                concat("MlaLayer::prefill: backend '", caps.name, "' packs V ",
                       caps.v_layout == VLayout::kTransposed ? "transposed" : "token-major", "; ",
                       v.reason));
  }
}

// Runs `step` as (part of) `stage`, timed by the executor.
template <typename Step>
void timed(MlaExecutor& x, double* stage, Step&& step) {
  x.start_stage(stage);
  step();
  x.stop_stage();
}

// The attention of the extend tokens over their sequences' prefix and extend keys, as the plan
// chose it; chunks folded in their attention calls or merged after them, as the path says.
void attend_batch(MlaExecutor& x, const MlaBatchPlan& p, MlaPath path, MlaStageTimes& t) {
  switch (p.prefix_attention) {
    case PrefixAttention::kNone:
      timed(x, &t.attention, [&] { x.attend({MlaKeys::kExtend, 0, p.max_q, true, false, true}); });
      return;
    case PrefixAttention::kOneShot:
      timed(x, &t.prefix, [&] {
        x.prefix_keys(0, std::int64_t(p.prefix_rows.size()));
        x.assemble_one_shot();
      });
      timed(x, &t.attention, [&] {
        x.attend({MlaKeys::kOneShot, 0, p.max_k_one_shot, true, false, true});
      });
      return;
    case PrefixAttention::kChunked:
      timed(x, &t.attention, [&] { x.attend({MlaKeys::kExtend, 0, p.max_q, true, true}); });
      for (std::size_t i = 0; i < p.chunks.size(); ++i) {
        const PrefixChunk& chunk = p.chunks[i];
        const bool last = i + 1 == p.chunks.size();
        timed(x, &t.prefix, [&] { x.prefix_keys(p.chunk_first_row[i], chunk.keys()); });
        timed(x, &t.attention, [&] {
          x.attend({MlaKeys::kPrefix, i, chunk.max_seqlen_k, false, false, path.fold_chunks && last,
                    path.fold_chunks});
        });
        if (!path.fold_chunks) timed(x, &t.merge, [&] { x.merge(last); });
      }
      return;
  }
}

// The config's shapes are ones the ops serve, and every weight is the contiguous host tensor of
// the dtype and shape the config gives it: a view of another shape would be read past its end.
void check_layer_inputs(const MlaConfig& c, const MlaWeights& w) {
  if (c.hidden < 1 || c.heads < 1 || c.q_lora_rank < 0 || c.max_position < 1 ||
      c.kv_lora_rank != kMlaKvLoraRank) {
    throw Error(
        ErrorCategory::kInvalidArgument,
        concat("MlaLayer: config '", c.name, "': expected hidden, heads, max_position >= 1, ",
               "q_lora_rank >= 0 and kv_lora_rank ", kMlaKvLoraRank, "; got hidden ", c.hidden,
               ", heads ", c.heads, ", max_position ", c.max_position, ", q_lora_rank ",
               c.q_lora_rank, ", kv_lora_rank ", c.kv_lora_rank));
  }
  const auto expect = [&](const TensorView& t, std::string_view name, DType dtype,
                          std::initializer_list<std::int64_t> shape) {
    bool ok = t.data() != nullptr && t.dtype() == dtype && t.ndim() == int(shape.size()) &&
              t.is_contiguous() && !t.device().is_cuda();
    int d = 0;
    for (auto it = shape.begin(); ok && it != shape.end(); ++it, ++d) ok = t.size(d) == *it;
    if (ok) return;
    std::string expected;
    for (std::int64_t s : shape) expected += concat(expected.empty() ? "" : ", ", s);
    throw Error(ErrorCategory::kInvalidArgument,
                concat("MlaLayer: weight '", name, "': expected contiguous ", dtype_name(dtype),
                       " [", expected, "] on the host (config '", c.name, "'), got ",
                       t.data() == nullptr ? "no data: " : "", t.describe()));
  };
  const bool fp8 = w.format == WeightFormat::kFp8Block;
  for (const model::ProjectionSpec& p : model::projections(c)) {
    const MlaProjection& proj = w.*(p.member);
    expect(proj.weight, concat(p.name, ".weight"), fp8 ? DType::kE4M3 : DType::kBF16,
           {p.out, p.in});
    if (fp8) {
      expect(proj.scale_inv, concat(p.name, ".weight_scale_inv"), DType::kF32,
             {model::weight_blocks(p.out), model::weight_blocks(p.in)});
    }
  }
  for (const model::NormSpec& n : model::norms(c)) {
    expect(w.*(n.member), concat(n.name, ".weight"), DType::kBF16, {n.size});
  }
}

}  // namespace

void run_mla_prefill(MlaExecutor& x, const MlaPrefillCall& call) {
  x.check_batch(call);
  const MlaBatchPlan& p = call.plan;
  // No extend token: no query to attend and no cache row to write, except that a
  // context-parallel rank without tokens still takes its part in the all-gather.
  if (p.tokens == 0 && p.gathered_rows() == 0) {
    if (call.times != nullptr) *call.times = {.output_quant = call.path.output_quant};
    return;
  }
  x.begin(call);
  MlaStageTimes t{};
  t.output_quant = call.path.output_quant;
  if (p.tokens > 0) {
    timed(x, &t.projections, [&] { x.project(); });
    timed(x, &t.prep, [&] { x.prep(); });
  }
  if (p.gathered_rows() > 0) {
    timed(x, &t.gather, [&] {
      const TensorView all = x.pack_latent_rows();
      const std::int64_t R = p.gather_rows_per_rank;
      const TensorView mine(
          static_cast<std::uint8_t*>(all.data()) + std::int64_t(p.gather_rank) * R * kMlaLatentDim,
          DType::kE4M3, {R, kMlaLatentDim}, all.device());
      call.gather_communicator->all_gather(mine, all, call.stream);
      x.unpack_latent_rows();
    });
  }
  if (p.tokens == 0) {
    x.finish();
    if (call.times != nullptr) *call.times = t;
    return;
  }
  attend_batch(x, call.plan, call.path, t);
  timed(x, &t.output, [&] { x.output(); });
  // o_proj has no bias, so each rank's partial sum is its heads' share of the output and the sum
  // over ranks is the output; the reduction runs on the call's stream, in place.
  if (call.communicator != nullptr) {
    timed(x, &t.reduce, [&] { call.communicator->all_reduce_sum(call.out, call.stream); });
  }
  x.finish();
  if (call.times != nullptr) *call.times = t;
}

MlaLayer::MlaLayer(MlaConfig config, const MlaWeights& weights, Device device, MlaTensorParallel tp,
                   MlaCommunicator* communicator)
    : config_(mla_rank_config(config, tp, weights.format)), device_(device), tp_(tp) {
  if (communicator != nullptr &&
      (communicator->rank() != tp.rank || communicator->size() != tp.size)) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("MlaLayer: the communicator is rank ", communicator->rank(), " of ",
                       communicator->size(), "; the layer's tensor parallel is rank ", tp.rank,
                       " of ", tp.size));
  }
  check_layer_inputs(config_, weights);
  impl_ = std::make_unique<Impl>();
  // One rank alone has nothing to reduce.
  impl_->communicator = tp.size > 1 ? communicator : nullptr;
  if (!device.is_cuda()) {
    impl_->executor = make_cpu_mla_executor(config_, weights);
    return;
  }
#ifdef FP8MLA_WITH_CUDA
  impl_->executor = make_cuda_mla_executor(config_, weights, device);
#else
  throw Error(
      ErrorCategory::kUnsupported,
      concat("MlaLayer: this build has no CUDA; cannot run the layer on ", to_string(device)));
#endif
}

MlaLayer::~MlaLayer() = default;
MlaLayer::MlaLayer(MlaLayer&&) noexcept = default;
MlaLayer& MlaLayer::operator=(MlaLayer&&) noexcept = default;

const std::vector<std::string>& MlaLayer::projection_notes() const {
  return impl_->executor->projection_notes();
}

std::size_t MlaLayer::workspace_bytes(const MlaWorkspaceLimits& limits,
                                      const MlaPrefillOptions& options,
                                      const AttentionBackend& backend) const {
  if (limits.max_tokens < 0 || limits.max_sequences < 0 || limits.max_prefix_tokens < 0) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("MlaLayer::workspace_bytes: expected limits >= 0, got max_tokens ",
                       limits.max_tokens, ", max_sequences ", limits.max_sequences,
                       ", max_prefix_tokens ", limits.max_prefix_tokens));
  }
  return impl_->executor->workspace_bytes(limits, options,
                                          mla_path(backend, options, *impl_->executor));
}

MlaOutputQuantPlan MlaLayer::output_quant_plan(const AttentionBackend& backend,
                                               const MlaPrefillOptions& options) const {
  return mla_output_quant_plan(backend.capabilities(), options, impl_->executor->fp8_o_proj());
}

void MlaLayer::prefill(const TensorView& hidden, const MlaBatch& batch, const TensorView& cache,
                       const AttentionBackend& backend, const MlaPrefillOptions& options,
                       const TensorView& out, const TensorView& workspace, MlaStageTimes* times,
                       CudaStream stream) {
  const OneCallAtATime one(*impl_, "MlaLayer::prefill");
  check_prefill(hidden, batch.extend_tokens(), cache, options, out, "MlaLayer::prefill");
  plan_mla_batch(config_, batch, options, impl_->plan);
  const MlaPath path = mla_path(backend, options, *impl_->executor);
  check_mla_backend(backend, path, cache, device_, impl_->executor->fp8_v_layout());
  run_mla_prefill(*impl_->executor, {hidden, impl_->plan, cache, &backend, options, out, workspace,
                                     path, times, stream, impl_->communicator});
}

std::size_t MlaLayer::workspace_bytes(const MlaDeviceBatch& batch, const MlaPrefillOptions& options,
                                      const AttentionBackend& backend) const {
  if (!device_.is_cuda()) return 0;
  MlaBatchPlan plan;  // not the hot path: a plan of its own
  plan_mla_device_batch(config_, batch, device_, plan);
  return impl_->executor->workspace_bytes(plan, mla_path(backend, options, *impl_->executor));
}

void MlaLayer::prefill(const TensorView& hidden, const MlaDeviceBatch& batch,
                       const TensorView& cache, const AttentionBackend& backend,
                       const MlaPrefillOptions& options, const TensorView& out,
                       const TensorView& workspace, MlaStageTimes* times, CudaStream stream) {
  const OneCallAtATime one(*impl_, "MlaLayer::prefill (device batch)");
  plan_mla_device_batch(config_, batch, device_, impl_->plan);
  check_prefill(hidden, batch.tokens, cache, options, out, "MlaLayer::prefill (device batch)");
  const MlaPath path = mla_path(backend, options, *impl_->executor);
  check_mla_backend(backend, path, cache, device_, impl_->executor->fp8_v_layout());
  run_mla_prefill(*impl_->executor, {hidden, impl_->plan, cache, &backend, options, out, workspace,
                                     path, times, stream, impl_->communicator});
}

void MlaLayer::prefill_context_parallel(
    const TensorView& hidden, const MlaContextParallelBatch& batch, MlaCommunicator& communicator,
    const TensorView& cache, const AttentionBackend& backend, const MlaPrefillOptions& options,
    const TensorView& out, const TensorView& workspace, MlaStageTimes* times, CudaStream stream) {
  constexpr std::string_view kCaller = "MlaLayer::prefill_context_parallel";
  const OneCallAtATime one(*impl_, kCaller);
  const MlaContextParallel cp = batch.cp;
  if (communicator.rank() != cp.rank || communicator.size() != cp.size ||
      std::int64_t(batch.gathered_slots.size()) != cp.size * batch.rows_per_rank ||
      std::int64_t(batch.tokens.size()) != batch.batch.extend_tokens()) {
    throw Error(
        ErrorCategory::kInvalidArgument,
        concat(kCaller, ": the communicator is rank ", communicator.rank(), " of ",
               communicator.size(), "; expected the batch's rank ", cp.rank, " of ", cp.size,
               ", with ", cp.size, " x ", batch.rows_per_rank,
               " gathered slots and a row per token (", batch.batch.extend_tokens(), "); got ",
               batch.gathered_slots.size(), " slots and ", batch.tokens.size(), " rows"));
  }
  check_prefill(hidden, batch.batch.extend_tokens(), cache, options, out, kCaller);
  plan_mla_batch(config_, batch.batch, options, impl_->plan, kCaller);
  plan_mla_gather(batch, impl_->plan);
  const MlaPath path = mla_path(backend, options, *impl_->executor);
  check_mla_backend(backend, path, cache, device_, impl_->executor->fp8_v_layout());
  MlaPrefillCall call{hidden, impl_->plan, cache,  &backend,           options, out, workspace,
                      path,   times,       stream, impl_->communicator};
  call.gather_communicator = &communicator;
  run_mla_prefill(*impl_->executor, call);
}

void MlaLayer::check_prefill(const TensorView& hidden, std::int64_t tokens, const TensorView& cache,
                             const MlaPrefillOptions& options, const TensorView& out,
                             std::string_view caller) const {
  const MlaConfig& c = config_;
  // The message is built only when the check fails.
  const auto require = [caller](bool ok, auto&& what) {
    if (!ok) throw Error(ErrorCategory::kInvalidArgument, concat(caller, ": ", what()));
  };
  for (const auto& [t, name] : {std::pair{&hidden, "hidden"}, {&cache, "cache"}, {&out, "out"}}) {
    require(t->device() == device_, [&] {
      return concat("expected `", name, "` on the layer's device ", to_string(device_), ", got ",
                    t->describe());
    });
  }
  require(options.one_shot_max_prefix >= 0 && options.chunk_capacity >= 1 &&
              options.cache_scale_inv > 0 && options.fp8.q_scale_inv > 0 &&
              options.fp8.k_scale_inv > 0 && options.fp8.v_scale_inv > 0,
          [&] {
            return concat(
                "expected options one_shot_max_prefix >= 0, chunk_capacity >= 1 and scales > 0; "
                "got ",
                options.one_shot_max_prefix, ", ", options.chunk_capacity, ", cache_scale_inv ",
                options.cache_scale_inv, ", fp8 scale_inv q/k/v ", options.fp8.q_scale_inv, "/",
                options.fp8.k_scale_inv, "/", options.fp8.v_scale_inv);
          });
  const std::int64_t T = tokens;
  require(hidden.dtype() == DType::kBF16 && hidden.ndim() == 2 && hidden.size(0) == T &&
              hidden.size(1) == c.hidden && hidden.is_contiguous(),
          [&] {
            return concat("expected `hidden` contiguous bf16 [", T, ", ", c.hidden,
                          "] (T = the batch's ", "extend tokens), got ", hidden.describe());
          });
  require(out.dtype() == DType::kBF16 && out.ndim() == 2 && out.size(0) == T &&
              out.size(1) == c.hidden && out.is_contiguous(),
          [&] {
            return concat("expected `out` contiguous bf16 [", T, ", ", c.hidden, "], got ",
                          out.describe());
          });
  require(cache.dtype() == DType::kE4M3 && cache.ndim() == 3 && cache.size(2) == kMlaLatentDim &&
              cache.stride(2) == 1,
          [&] {
            return concat("expected `cache` e4m3 [pages, page_size, ", kMlaLatentDim,
                          "] with contiguous rows, got ", cache.describe());
          });
}

}  // namespace fp8mla
