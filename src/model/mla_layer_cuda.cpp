// The MLA layer's CUDA executor: the projections through cuBLASLt (cuda/model/cublas_linear),
// RMSNorm and the BF16 path's RoPE through the layer's kernels (cuda/model/layer_kernels),
// everything else through fp8mla's ops and the attention backend, in the CPU executor's order, on
// the call's stream. Device memory comes from the caller's workspace (model/mla_workspace), the
// batch's metadata from one host-to-device copy, the stage times from GPU clock stamps
// (cuda/common/stage_timer.hpp: they keep the launch overlap PDL gives the stages).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "cuda/common/device_buffer.hpp"
#include "cuda/common/host_staging.hpp"
#include "cuda/common/runtime.hpp"
#include "cuda/common/stage_timer.hpp"
#include "cuda/model/cublas_linear.hpp"
#include "cuda/model/fp8_block_gemm.hpp"
#include "cuda/model/layer_kernels.hpp"
#include "fp8mla/attention.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/kernel_registry.hpp"
#include "fp8mla/mla_prep.hpp"
#include "fp8mla/numerics.hpp"
#include "fp8mla/quantize.hpp"
#include "model/cpu_math.hpp"
#include "model/mla_executor.hpp"
#include "model/mla_workspace.hpp"

namespace fp8mla {
namespace {

using cuda::check;
using cuda::DeviceBuffer;
using cuda::model::CublasLinear;
using cuda::model::LinearFormat;

// Rows a projection plan accepts (the prefix keys of one attention call pass kv_b too).
constexpr std::int64_t kMaxGemmRows = std::int64_t(1) << 20;

// An e4m3 weight's block scales on the device, each row padded to cuBLASLt's layout
// (linear_scale_columns; DeepSeek's [ceil(out/128), in/128] as it is where in % 512 == 0). The
// padding is never read.
DeviceBuffer padded_scales(const MlaProjection& p) {
  const std::int64_t rows = p.scale_inv.size(0), cols = p.scale_inv.size(1);
  const std::int64_t padded = cuda::model::linear_scale_columns(p.weight.size(1));
  if (padded <= cols) return DeviceBuffer(p.scale_inv.data(), p.scale_inv.numel() * 4);
  std::vector<float> host(std::size_t(rows * padded), 1.0f);
  const auto* from = static_cast<const float*>(p.scale_inv.data());
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memcpy(&host[std::size_t(r * padded)], from + r * cols, std::size_t(cols) * 4);
  }
  return DeviceBuffer(host.data(), std::int64_t(host.size()) * 4);
}

// A projection on the device: e4m3 + block scales through the FP8 GEMM where cuBLASLt takes the
// shape, bf16 otherwise (e4m3 weights then dequantized here, once).
struct Projection {
  DeviceBuffer weight, scale;
  std::unique_ptr<CublasLinear> gemm;
  std::int64_t out = 0, in = 0;
  bool fp8 = false;
  std::string note;

  Projection(cublasLtHandle_t handle, const char* name, const MlaProjection& p)
      : out(p.weight.size(0)), in(p.weight.size(1)) {
    const std::string shape = concat(name, " [", out, ", ", in, "]: ");
    if (p.weight.dtype() == DType::kE4M3) {
      weight = DeviceBuffer(p.weight.data(), out * in);
      scale = padded_scales(p);
      try {
        gemm = std::make_unique<CublasLinear>(
            handle,
            cuda::model::LinearWeight{LinearFormat::kFp8Block, weight.as<void>(), scale.as<float>(),
                                      out, in},
            kMaxGemmRows);
        fp8 = true;
        note = shape + "fp8 block-scaled GEMM (cuBLASLt; input quantized per 128-group)";
        return;
      } catch (const Error& e) {
        if (e.category() != ErrorCategory::kUnsupported) throw;
        note = shape + "bf16 GEMM (cuBLASLt), weight dequantized at load: " + e.message();
      }
    } else {
      note = shape + "bf16 GEMM (cuBLASLt)";
    }
    std::vector<std::uint16_t> bf16(std::size_t(out * in));
    if (p.weight.dtype() == DType::kE4M3) {
      const std::vector<float> f = model::dequantize(p);
      for (std::size_t i = 0; i < f.size(); ++i) bf16[i] = encode_bf16(f[i]);
    } else {
      std::memcpy(bf16.data(), p.weight.data(), bf16.size() * 2);
    }
    weight = DeviceBuffer(bf16.data(), std::int64_t(bf16.size()) * 2);
    gemm = std::make_unique<CublasLinear>(
        handle, cuda::model::LinearWeight{LinearFormat::kBf16, weight.as<void>(), nullptr, out, in},
        kMaxGemmRows);
  }
};

// kv_b_proj with its rows grouped by half: every head's K-nope rows, then every head's V rows
// (the checkpoint interleaves them, [k_nope (128) | v (128)] per head). Each head's half is one
// 128-row scale block, so the block scales regroup with it. The GEMM's output is then [n,
// [K-nope (H * 128) | V (H * 128)]]: K-nope and V are plain strided views of it, and each half of
// the weight is a GEMM of its own (MlaPath::kv_from_projection) without a copy.
struct KvBByHalf {
  std::vector<std::uint8_t> weight;
  std::vector<float> scale_inv;
  MlaProjection view;

  KvBByHalf(const MlaProjection& kv_b, std::int64_t heads) {
    const TensorView& w = kv_b.weight;
    const std::int64_t in = w.size(1);
    weight.resize(std::size_t(w.size(0) * in) * dtype_size(w.dtype()));
    regroup(w.data_as<const std::uint8_t>(), weight.data(), weight.size(), heads);
    view.weight = TensorView(weight.data(), w.dtype(), {w.size(0), in});
    if (w.dtype() != DType::kE4M3) return;
    scale_inv.resize(std::size_t(kv_b.scale_inv.numel()));  // one row per 128-row block
    regroup(kv_b.scale_inv.data_as<const std::uint8_t>(),
            reinterpret_cast<std::uint8_t*>(scale_inv.data()), scale_inv.size() * 4, heads);
    view.scale_inv = TensorView(scale_inv.data(), DType::kF32, kv_b.scale_inv.shape());
  }

  // `bytes` of 2 * heads equal blocks from (head h, half) order to (half, head h) order.
  static void regroup(const std::uint8_t* from, std::uint8_t* to, std::size_t bytes,
                      std::int64_t heads) {
    const std::size_t block = bytes / std::size_t(2 * heads);
    for (std::int64_t h = 0; h < heads; ++h) {
      for (int half = 0; half < 2; ++half) {
        std::memcpy(to + std::size_t(half * heads + h) * block,
                    from + std::size_t(2 * h + half) * block, block);
      }
    }
  }
};

// Keys and values of one attention call, as the kernel reads them.
// FP8: K split as prefill_attention's k_rope reads it, k [n, H, 128] with k_rope [n, 64] after it
// in the same buffer (K's RoPE part once per key, not once per head: 64 of 192 bytes a head).
struct KeysValues {
  TensorView k, v;
  std::int64_t v_pitch = 0;  // FP8: bytes between the dims of the transposed V
  TensorView k_rope;         // FP8 only
};

class CudaMlaExecutor final : public MlaExecutor {
 public:
  CudaMlaExecutor(const MlaConfig& config, const MlaWeights& weights, Device device)
      : c_(config), device_(device) {
    // The q_a RMSNorm kernel reads rows in 16-byte words (layer_kernels.hpp).
    if (c_.q_lora_rank > 0 && (c_.q_lora_rank % 8 != 0 || c_.q_lora_rank > 8192)) {
      throw Error(ErrorCategory::kUnsupported,
                  concat("MlaLayer on ", to_string(device), ": config '", c_.name,
                         "': expected q_lora_rank a multiple of 8 and at most 8192 (the q_a "
                         "RMSNorm kernel's rows), got ",
                         c_.q_lora_rank));
    }
    check(cudaSetDevice(device.index), "cudaSetDevice(MlaLayer)");
    const auto add = [&](std::optional<Projection>& slot, const char* name,
                         const MlaProjection& p) {
      slot.emplace(handle_.get(), name, p);
      notes_.push_back(slot->note);
    };
    if (c_.q_lora_rank > 0) {
      add(q_a_, "q_a_proj", weights.q_a_proj);
      add(q_b_, "q_b_proj", weights.q_b_proj);
      q_a_norm_ = DeviceBuffer(weights.q_a_layernorm.data(), c_.q_lora_rank * 2);
    } else {
      add(q_b_, "q_proj", weights.q_proj);
    }
    add(kv_a_, "kv_a_proj_with_mqa", weights.kv_a_proj_with_mqa);
    add(kv_b_, "kv_b_proj", KvBByHalf(weights.kv_b_proj, c_.heads).view);
    if (kv_b_->fp8 && cuda::current_device_props().arch == 90) {
      kv_b_e4m3_ = true;
      notes_.push_back(
          concat("kv_b_proj on the FP8 path with fp8_kv_from_projection: its K-nope "
                 "and V halves [",
                 c_.heads * kMlaVDim, ", ", c_.kv_lora_rank,
                 "] each an fp8 block-scaled GEMM with e4m3 output (fp8mla's own, "
                 "CUTLASS)"));
    }
    add(o_, "o_proj", weights.o_proj);
    kv_a_norm_ = DeviceBuffer(weights.kv_a_layernorm.data(), c_.kv_lora_rank * 2);
    std::vector<float> cos_sin(std::size_t(c_.max_position * kMlaRopeDim));
    make_cos_sin_cache(TensorView(cos_sin.data(), DType::kF32, {c_.max_position, kMlaRopeDim}),
                       c_.rope);
    cos_sin_ = DeviceBuffer(cos_sin.data(), std::int64_t(cos_sin.size()) * 4);
    // Every attention variant either path can ask for, checked and set up now, not mid-request.
    AttentionNeeds needs{{DType::kE4M3, DType::kBF16}};
    needs.non_causal_fold = true;  // the prefix chunks fold into the output (shipped backends)
    warm_up_attention(needs);
  }

  const std::vector<std::string>& projection_notes() const override { return notes_; }
  std::size_t workspace_bytes(const MlaWorkspaceLimits& limits, const MlaPrefillOptions& options,
                              MlaPath path) const override {
    return mla_workspace_bytes(c_, work_sizes(limits, options, path));
  }
  std::size_t workspace_bytes(const MlaBatchPlan& plan, MlaPath path) const override {
    return mla_workspace_bytes(c_, work_sizes(plan, path));
  }
  MlaVLayoutNeed fp8_v_layout() const override {
    return {VLayout::kTransposed, "FP8 attention on Hopper reads it transposed"};
  }
  bool fp8_o_proj() const override { return o_->fp8; }
  bool e4m3_kv_projection() const override { return kv_b_e4m3_; }

  void check_batch(const MlaPrefillCall& call) override;
  void begin(const MlaPrefillCall& call) override;
  void start_stage(double* stage) override { timer_.start(stream_, stage); }
  void stop_stage() override { timer_.stop(stream_); }
  void project() override;
  void prep() override;
  TensorView pack_latent_rows() override;
  void unpack_latent_rows() override;
  void prefix_keys(std::int64_t first_row, std::int64_t rows) override;
  void assemble_one_shot() override;
  void attend(const MlaAttendStep& step) override;
  void merge(bool o_proj_input) override;
  void output() override;
  void finish() override { timer_.finish(); }
  TensorView calibration_workspace(const MlaBatchPlan& plan, MlaPath path) override;
  MlaActivationAmax activation_amax() override;

 private:
  // y = x W^T for `rows` rows of x (bf16, contiguous); FP8 projections quantize x first.
  void project(Projection& p, const std::uint16_t* x, std::int64_t rows, std::uint16_t* y) {
    if (rows == 0) return;
    if (!p.fp8) {
      p.gemm->run(x, nullptr, rows, y, b_.cublas, b_.cublas_bytes, stream_);
      return;
    }
    quantize_fp8_per_token_group(
        TensorView(const_cast<std::uint16_t*>(x), DType::kBF16, {rows, p.in}, device_),
        TensorView(b_.gemm_x, DType::kE4M3, {rows, p.in}, device_), gemm_x_scales(rows, p.in),
        GroupQuantOptions{.group_size = int(kWeightBlock)}, stream_);
    p.gemm->run(b_.gemm_x, b_.gemm_x_scales, rows, y, b_.cublas, b_.cublas_bytes, stream_);
  }
  // The FP8 GEMM input's scales as the GEMM reads them: f32, column-major.
  TensorView gemm_x_scales(std::int64_t rows, std::int64_t in) const {
    return TensorView(b_.gemm_x_scales, DType::kF32, {rows, in / kWeightBlock}, {1, rows}, device_);
  }
  // The fused path: the last attention call or merge writes o_proj's input into the GEMM's.
  bool fused() const { return call_->path.output_quant == MlaOutputQuant::kFused; }

  void rms_norm(const std::uint16_t* x, std::int64_t x_stride, const DeviceBuffer& weight,
                int width, std::int64_t rows, std::uint16_t* y) const {
    cuda::model::rms_norm(
        {x, x_stride, weight.as<std::uint16_t>(), y, width, rows, width, float(c_.rms_norm_eps)},
        stream_);
  }

  // Views: [n, H, 128] k_nope and v inside an [n, [K-nope (H * 128) | V (H * 128)]] kv_b output
  // (KvBByHalf); a transposed e4m3 V.
  TensorView k_nope_of(std::uint16_t* kv, std::int64_t n) const {
    return TensorView(kv, DType::kBF16, {n, c_.heads, kMlaNopeDim},
                      {c_.heads * 2 * kMlaNopeDim, kMlaNopeDim, 1}, device_);
  }
  TensorView v_of(std::uint16_t* kv, std::int64_t n) const {
    return TensorView(kv + c_.heads * kMlaNopeDim, DType::kBF16, {n, c_.heads, kMlaVDim},
                      {c_.heads * 2 * kMlaNopeDim, kMlaVDim, 1}, device_);
  }
  TensorView v8_of(std::uint8_t* v, std::int64_t n, std::int64_t pitch) const {
    return transposed_v_view(v, n, c_.heads, pitch, device_);
  }
  TensorView rows_of(void* data, DType dtype, std::int64_t n, std::int64_t width) const {
    return TensorView(data, dtype, {n, c_.heads, width}, device_);
  }
  // The FP8 path's split K in a buffer of n keys: k_nope's rows, then the k_rope rows.
  TensorView k8_nope_of(std::uint8_t* k, std::int64_t n) const {
    return rows_of(k, DType::kE4M3, n, kMlaNopeDim);
  }
  TensorView k8_rope_of(std::uint8_t* k, std::int64_t n) const {
    return TensorView(k + n * c_.heads * kMlaNopeDim, DType::kE4M3, {n, kMlaRopeDim}, device_);
  }

  // The BF16 path's K = [k_nope | k_pe] per head, from a kv_b output (k_nope_of) and k_pe rows
  // shared by the heads (RoPE'd when the caller adds positions).
  cuda::model::RopeAssembleParams k_assembly(const std::uint16_t* kv, std::int64_t n,
                                             const std::uint16_t* k_pe, std::int64_t k_pe_stride,
                                             std::uint16_t* k_out) const {
    cuda::model::RopeAssembleParams r;
    r.tokens = n;
    r.heads = c_.heads;
    r.k_nope = kv;
    r.k_nope_token_stride = c_.heads * 2 * kMlaNopeDim;
    r.k_nope_head_stride = kMlaNopeDim;
    r.k_pe = k_pe;
    r.k_pe_stride = k_pe_stride;
    r.k_out = k_out;
    return r;
  }
  void project_kv_b_split();
  void prep_fp8(const LatentCacheWrite& write, const TensorView& kv_c);
  void assemble_bf16();
  void copy_latent_rows(const std::int64_t* slots, std::int64_t count, std::uint8_t* rows,
                        bool to_cache);
  void prep_bf16(const LatentCacheWrite& write, const TensorView& kv_c);

  MlaConfig c_;
  Device device_;
  cuda::model::CublasLtHandle handle_;
  std::optional<Projection> q_a_, q_b_, kv_a_, kv_b_, o_;
  // kv_b's halves run as e4m3-output GEMMs (MlaPath::kv_from_projection): an FP8 kv_b on sm_90.
  bool kv_b_e4m3_ = false;
  DeviceBuffer q_a_norm_, kv_a_norm_, cos_sin_;
  std::vector<std::string> notes_;
  cuda::HostStaging staging_;  // pinned host image of the batch metadata
  // Calibration's own memory: its workspace and the amax cells of Q, K, V and the latent rows.
  static constexpr int kAmaxCells = 4;
  DeviceBuffer calibration_workspace_, amax_cells_;
  cuda::StageTimer timer_;
  // The prefill between begin() and finish(): its call, stream, workspace pieces and the keys of
  // its attention calls.
  const MlaPrefillCall* call_ = nullptr;
  cudaStream_t stream_ = nullptr;
  MlaBuffers b_{};
  KeysValues extend_, prefix_, one_shot_;
};

// Every slot in the cache: the CUDA ops would skip a bad one without telling the host.
void CudaMlaExecutor::check_batch(const MlaPrefillCall& call) {
  const std::int64_t cache_rows = call.cache.size(0) * call.cache.size(1);
  const MlaBatchPlan& p = call.plan;
  for (const std::vector<std::int64_t>* slots :
       {&p.slots, &p.prefix_rows, &p.pack_rows, &p.unpack_rows}) {
    const bool gathered = slots == &p.pack_rows || slots == &p.unpack_rows;
    for (std::int64_t s : *slots) {
      if (gathered && s == -1) continue;  // a padding row, or (unpack) this rank's own
      if (s < 0 || s >= cache_rows) {
        throw Error(
            ErrorCategory::kInvalidArgument,
            concat("MlaLayer::prefill: slot ", s, " is outside the cache's ", cache_rows, " rows"));
      }
    }
  }
}

void CudaMlaExecutor::begin(const MlaPrefillCall& call) {
  const MlaBatchPlan& plan = call.plan;
  const std::int64_t T = plan.tokens, B = plan.sequences;
  const Device d = device_;
  call_ = &call;
  stream_ = reinterpret_cast<cudaStream_t>(call.stream);
  const WorkSizes s = work_sizes(plan, call.path);
  const TensorView& ws = call.workspace;
  const std::size_t needed = mla_workspace_bytes(c_, s);
  const std::size_t ws_bytes = std::size_t(ws.numel()) * std::size_t(dtype_size(ws.dtype()));
  if (ws.ndim() != 1 || ws.stride(0) != 1 || ws.device() != d || ws_bytes < needed ||
      reinterpret_cast<std::uintptr_t>(ws.data()) % kMlaWorkspaceAlign != 0) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("MlaLayer::prefill: expected `workspace` 1-d contiguous, >= ", needed,
                       " bytes on ", to_string(d), ", 256-byte aligned (what this batch needs: ", T,
                       " tokens, ", B, " sequences, ", s.prefix_rows, " prefix tokens, ",
                       s.gathered_rows, " gathered latent rows); got ", ws.describe()));
  }
  check(cudaSetDevice(d.index), "cudaSetDevice(MlaLayer)");
  b_ = carve_mla_workspace(static_cast<std::byte*>(ws.data()), c_, s);
  timer_.begin(call.times != nullptr);
  const MlaFp8Scales& scales = call.options.fp8;
  const float descales[3] = {1.0f / scales.q_scale_inv, 1.0f / scales.k_scale_inv,
                             1.0f / scales.v_scale_inv};
  if (plan.device != nullptr) {
    // The caller's metadata in place of the workspace's; only the descales are written, by a
    // kernel, so that nothing is copied from the host.
    b_.positions = plan.device->positions.data_as<std::int64_t>();
    b_.slots = plan.device->slot_mapping.data_as<std::int64_t>();
    b_.cu_q = plan.device->cu_seqlens_q.data_as<std::int32_t>();
    if (plan.device->has_prefix()) {  // the one chunk of every prefix key
      b_.prefix_rows = plan.device->prefix_slots.data_as<std::int64_t>();
      b_.chunk_cu_k = plan.device->cu_seqlens_prefix.data_as<std::int32_t>();
    }
    cuda::model::fill_f32({b_.descales, {descales[0], descales[1], descales[2]}, 3}, stream_);
    return;
  }

  // The batch's metadata: one copy from pinned host memory, queued without waiting for the
  // stream. Every piece is written below; the alignment gaps between them are never read.
  const std::size_t meta_bytes = std::size_t(b_.meta_end - b_.meta_begin);
  std::byte* image = staging_.acquire(meta_bytes, stream_, "MlaLayer::prefill");
  const auto stage = [&](void* device_at, const void* host, std::size_t bytes) {
    if (bytes > 0)
      std::memcpy(image + (static_cast<std::byte*>(device_at) - b_.meta_begin), host, bytes);
  };
  stage(b_.positions, plan.positions.data(), plan.positions.size() * 8);
  stage(b_.slots, plan.slots.data(), plan.slots.size() * 8);
  stage(b_.prefix_rows, plan.prefix_rows.data(), plan.prefix_rows.size() * 8);
  stage(b_.cu_q, plan.cu_q.data(), plan.cu_q.size() * 4);
  stage(b_.cu_k_one_shot, plan.cu_k_one_shot.data(), plan.cu_k_one_shot.size() * 4);
  for (std::size_t i = 0; i < plan.chunks.size(); ++i) {
    stage(b_.chunk_cu_k + i * std::size_t(B + 1), plan.chunks[i].cu_seqlens_k.data(),
          std::size_t(B + 1) * 4);
  }
  stage(b_.descales, descales, sizeof(descales));
  stage(b_.pack_rows, plan.pack_rows.data(), plan.pack_rows.size() * 8);
  stage(b_.unpack_rows, plan.unpack_rows.data(), plan.unpack_rows.size() * 8);
  staging_.copy_to(b_.meta_begin, meta_bytes, stream_, "cudaMemcpyAsync(MlaLayer batch metadata)");
}

void CudaMlaExecutor::project() {
  const std::int64_t T = call_->plan.tokens;
  const auto* hidden = call_->hidden.data_as<const std::uint16_t>();
  if (c_.q_lora_rank > 0) {
    project(*q_a_, hidden, T, b_.q_a);
    rms_norm(b_.q_a, c_.q_lora_rank, q_a_norm_, int(c_.q_lora_rank), T, b_.q_a_norm);
    project(*q_b_, b_.q_a_norm, T, b_.q);
  } else {
    project(*q_b_, hidden, T, b_.q);
  }
  project(*kv_a_, hidden, T, b_.kv_a);
  rms_norm(b_.kv_a, kMlaLatentDim, kv_a_norm_, int(c_.kv_lora_rank), T, b_.kv_c);
  if (call_->path.kv_from_projection) {
    project_kv_b_split();
  } else {
    project(*kv_b_, b_.kv_c, T, b_.kv);
  }
}

// MlaPath::kv_from_projection: kv_c quantized once (its scales at a pitch of T rounded up to 4,
// as the GEMM's TMA reads them), then kv_b's halves through fp8_block_gemm, rounded once from
// their f32 sums: K-nope e4m3 [T, H, 128] into b_.k8 (the split K's nope rows) at k_scale_inv, V
// e4m3 transposed into b_.v8 at v_scale_inv.
void CudaMlaExecutor::project_kv_b_split() {
  const std::int64_t T = call_->plan.tokens, in = c_.kv_lora_rank;
  if (T == 0) return;
  const std::int64_t pitch = (T + 3) / 4 * 4;
  quantize_fp8_per_token_group(
      TensorView(b_.kv_c, DType::kBF16, {T, in}, device_),
      TensorView(b_.gemm_x, DType::kE4M3, {T, in}, device_),
      TensorView(b_.gemm_x_scales, DType::kF32, {T, in / kWeightBlock}, {1, pitch}, device_),
      GroupQuantOptions{.group_size = int(kWeightBlock)}, stream_);
  const MlaFp8Scales& scales = call_->options.fp8;
  for (int half : {0, 1}) {
    cuda::model::Fp8BlockGemmParams g;
    g.x = b_.gemm_x;
    g.x_scales = b_.gemm_x_scales;
    g.x_scale_pitch = pitch;
    // The half's rows of the grouped kv_b (KvBByHalf) and their scale rows.
    const std::int64_t rows = c_.heads * kMlaVDim,
                       scale_pitch = cuda::model::linear_scale_columns(in);
    g.weight = kv_b_->weight.as<std::uint8_t>() + half * rows * in;
    g.weight_scales = kv_b_->scale.as<float>() + half * c_.heads * scale_pitch;
    g.weight_scale_pitch = scale_pitch;
    g.rows = T;
    g.out = c_.heads * kMlaVDim;
    g.in = in;
    g.scale = half == 0 ? scales.k_scale_inv : scales.v_scale_inv;
    g.y = half == 0 ? static_cast<void*>(b_.k8) : static_cast<void*>(b_.v8);
    g.y_pitch = half == 0 ? c_.heads * kMlaNopeDim : transposed_v_pitch(T);
    g.transposed = half == 1;
    cuda::model::fp8_block_gemm(g, b_.cublas, b_.cublas_bytes, stream_);
  }
}

void CudaMlaExecutor::prep() {
  const std::int64_t T = call_->plan.tokens;
  const DType adt = call_->path.attention_dtype;
  LatentCacheWrite write;
  write.cache = call_->cache;
  write.slot_mapping = TensorView(b_.slots, DType::kI64, {T}, device_);
  write.scale_inv = call_->options.cache_scale_inv;
  const TensorView kv_c(b_.kv_c, DType::kBF16, {T, c_.kv_lora_rank}, device_);
  if (call_->path.fp8) {
    prep_fp8(write, kv_c);
    extend_ = {k8_nope_of(b_.k8, T), v8_of(b_.v8, T, transposed_v_pitch(T)), transposed_v_pitch(T),
               k8_rope_of(b_.k8, T)};
  } else {
    prep_bf16(write, kv_c);
    extend_ = {rows_of(b_.k16, adt, T, kMlaQkDim), v_of(b_.kv, T), 0, {}};
  }
}

// RoPE and e4m3 Q/K, e4m3 V transposed and the cache write: the backend's hook.
void CudaMlaExecutor::prep_fp8(const LatentCacheWrite& write, const TensorView& kv_c) {
  const std::int64_t T = call_->plan.tokens, H = c_.heads, qw = c_.q_width();
  const Device d = device_;
  const MlaFp8Scales& scales = call_->options.fp8;
  PrepareQkvArgs hook;
  MlaRopeQuantizeArgs& a = hook.qk;
  a.q_nope = TensorView(b_.q, DType::kBF16, {T, H, kMlaNopeDim}, {qw, kMlaQkDim, 1}, d);
  a.q_pe = TensorView(b_.q + kMlaNopeDim, DType::kBF16, {T, H, kMlaRopeDim}, {qw, kMlaQkDim, 1}, d);
  const bool kv_written = call_->path.kv_from_projection;  // K-nope and V by project()
  a.k_pe =
      TensorView(b_.kv_a + c_.kv_lora_rank, DType::kBF16, {T, kMlaRopeDim}, {kMlaLatentDim, 1}, d);
  a.positions = TensorView(b_.positions, DType::kI64, {T}, d);
  a.cos_sin = TensorView(cos_sin_.as<float>(), DType::kF32, {c_.max_position, kMlaRopeDim}, d);
  a.q_scale_inv = scales.q_scale_inv;
  a.k_scale_inv = scales.k_scale_inv;
  a.q_out = rows_of(b_.q8, DType::kE4M3, T, kMlaQkDim);
  if (!kv_written) {
    a.k_nope = k_nope_of(b_.kv, T);
    a.k_out = k8_nope_of(b_.k8, T);
  }
  a.k_rope_out = k8_rope_of(b_.k8, T);
  a.cache_write = write;
  a.kv_c = kv_c;
  if (!kv_written) {
    hook.v = v_of(b_.kv, T);
    hook.v_scale_inv = scales.v_scale_inv;
    hook.v_out = v8_of(b_.v8, T, transposed_v_pitch(T));
  }
  call_->backend->prepare_prefill_qkv(hook, call_->stream);
}

// bf16 RoPE of q_pe (in place) and k_pe (into k_pe16), K = [k_nope | k_pe] per head.
void CudaMlaExecutor::assemble_bf16() {
  const std::int64_t T = call_->plan.tokens;
  cuda::model::RopeAssembleParams r =
      k_assembly(b_.kv, T, b_.kv_a + c_.kv_lora_rank, kMlaLatentDim, b_.k16);
  r.k_pe_out = b_.k_pe16;
  r.q_pe = b_.q + kMlaNopeDim;
  r.q_token_stride = c_.q_width();
  r.q_head_stride = kMlaQkDim;
  r.positions = b_.positions;
  r.cos_sin = cos_sin_.as<float>();
  cuda::model::rope_assemble_bf16(r, stream_);
}

// The BF16 path's RoPE and K, then the cache write.
void CudaMlaExecutor::prep_bf16(const LatentCacheWrite& write, const TensorView& kv_c) {
  const std::int64_t T = call_->plan.tokens;
  assemble_bf16();
  mla_kv_cache_write(kv_c, TensorView(b_.k_pe16, DType::kBF16, {T, kMlaRopeDim}, device_), write,
                     call_->stream);
}

void CudaMlaExecutor::copy_latent_rows(const std::int64_t* slots, std::int64_t count,
                                       std::uint8_t* rows, bool to_cache) {
  const TensorView& cache = call_->cache;
  cuda::model::copy_latent_rows({cache.data_as<std::uint8_t>(), cache.size(1), cache.stride(0),
                                 cache.stride(1), rows, slots, count, to_cache},
                                stream_);
}

// This rank's rows from its cache (written by prep) into its block, padding as zeros.
TensorView CudaMlaExecutor::pack_latent_rows() {
  const MlaBatchPlan& p = call_->plan;
  const std::int64_t R = p.gather_rows_per_rank;
  copy_latent_rows(b_.pack_rows, R, b_.gathered + p.gather_rank * R * kMlaLatentDim, false);
  return TensorView(b_.gathered, DType::kE4M3, {p.gathered_rows(), kMlaLatentDim}, device_);
}

void CudaMlaExecutor::unpack_latent_rows() {
  copy_latent_rows(b_.unpack_rows, call_->plan.gathered_rows(), b_.gathered, true);
}

TensorView CudaMlaExecutor::calibration_workspace(const MlaBatchPlan& plan, MlaPath path) {
  const std::size_t bytes = mla_workspace_bytes(c_, work_sizes(plan, path));
  check(cudaSetDevice(device_.index), "cudaSetDevice(MlaLayer)");
  if (calibration_workspace_.bytes() < std::int64_t(bytes))
    calibration_workspace_ = DeviceBuffer(std::int64_t(bytes));  // cudaMalloc: 256-byte aligned
  if (amax_cells_.bytes() == 0) amax_cells_ = DeviceBuffer(kAmaxCells * sizeof(unsigned));
  return TensorView(calibration_workspace_.data(), DType::kE4M3, {std::int64_t(bytes)}, device_);
}

// One amax reduction per tensor into its cell (the latent rows' two parts into one), then one
// copy back and the wait for it.
MlaActivationAmax CudaMlaExecutor::activation_amax() {
  const std::int64_t T = call_->plan.tokens, H = c_.heads;
  assemble_bf16();
  auto* cells = amax_cells_.as<unsigned>();
  check(cudaMemsetAsync(cells, 0, kAmaxCells * sizeof(unsigned), stream_),
        "cudaMemsetAsync(MlaLayer amax)");
  const auto amax = [&](const std::uint16_t* x, std::int64_t rows, std::int64_t cols,
                        std::int64_t stride, int cell) {
    cuda::model::amax_bf16({x, rows, cols, stride, cells + cell}, stream_);
  };
  amax(b_.q, T, H * kMlaQkDim, c_.q_width(), 0);
  amax(b_.k16, T * H, kMlaQkDim, kMlaQkDim, 1);
  amax(b_.kv + H * kMlaNopeDim, T, H * kMlaVDim, 2 * H * kMlaNopeDim, 2);  // V rows (v_of)
  amax(b_.kv_c, T, c_.kv_lora_rank, c_.kv_lora_rank, 3);
  amax(b_.k_pe16, T, kMlaRopeDim, kMlaRopeDim, 3);
  unsigned bits[kAmaxCells];
  check(cudaMemcpyAsync(bits, cells, sizeof(bits), cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync(MlaLayer amax)");
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(MlaLayer::calibrate)");
  const auto value = [&](int cell) { return decode_bf16(std::uint16_t(bits[cell])); };
  return {value(0), value(1), value(2), value(3)};
}

// Gathered from the cache, through kv_b, then packed to e4m3 (V transposed) or assembled bf16.
void CudaMlaExecutor::prefix_keys(std::int64_t first_row, std::int64_t n) {
  const Device d = device_;
  const DType adt = call_->path.attention_dtype;
  mla_kv_gather(call_->cache, TensorView(b_.prefix_rows + first_row, DType::kI64, {n}, d),
                1.0f / call_->options.cache_scale_inv,
                TensorView(b_.prefix_c, DType::kBF16, {n, c_.kv_lora_rank}, d),
                TensorView(b_.prefix_pe, DType::kBF16, {n, kMlaRopeDim}, d), {}, call_->stream);
  project(*kv_b_, b_.prefix_c, n, b_.prefix_kv);
  if (call_->path.fp8) {
    MlaKvPackArgs a;
    a.k_nope = k_nope_of(b_.prefix_kv, n);
    a.k_pe = TensorView(b_.prefix_pe, DType::kBF16, {n, kMlaRopeDim}, d);
    a.v = v_of(b_.prefix_kv, n);
    a.k_scale_inv = call_->options.fp8.k_scale_inv;
    a.v_scale_inv = call_->options.fp8.v_scale_inv;
    a.k_out = k8_nope_of(b_.prefix_k8, n);
    a.v_out = v8_of(b_.prefix_v8, n, transposed_v_pitch(n));
    a.v_layout = VLayout::kTransposed;
    a.k_rope_out = k8_rope_of(b_.prefix_k8, n);
    call_->backend->pack_prefix_chunk_kv(a, call_->stream);
    prefix_ = {a.k_out, a.v_out, transposed_v_pitch(n), a.k_rope_out};
    return;
  }
  cuda::model::rope_assemble_bf16(
      k_assembly(b_.prefix_kv, n, b_.prefix_pe, kMlaRopeDim, b_.prefix_k16), stream_);
  prefix_ = {rows_of(b_.prefix_k16, adt, n, kMlaQkDim), v_of(b_.prefix_kv, n), 0, {}};
}

// One copy per run of rows: each sequence's prefix keys, then its extend keys.
void CudaMlaExecutor::assemble_one_shot() {
  const MlaBatchPlan& plan = call_->plan;
  const bool fp8 = call_->path.fp8;
  const DType adt = call_->path.attention_dtype;
  const std::int64_t T = plan.tokens, H = c_.heads, P = std::int64_t(plan.prefix_rows.size());
  const std::int64_t n = P + T, pitch = transposed_v_pitch(n), eb = fp8 ? 1 : 2;
  const std::int64_t k_row = H * (fp8 ? kMlaNopeDim : kMlaQkDim) * eb;  // FP8: and its k_rope row
  std::uint8_t* one_shot_rope = fp8 ? b_.one_shot_k + n * k_row : nullptr;
  const auto copy_rows = [&](const KeysValues& from, std::int64_t from_row, std::int64_t to_row,
                             std::int64_t rows) {
    if (rows == 0) return;
    check(cudaMemcpyAsync(b_.one_shot_k + to_row * k_row,
                          static_cast<const std::uint8_t*>(from.k.data()) + from_row * k_row,
                          std::size_t(rows * k_row), cudaMemcpyDeviceToDevice, stream_),
          "cudaMemcpyAsync(one-shot K)");
    if (fp8) {
      check(cudaMemcpyAsync(
                one_shot_rope + to_row * kMlaRopeDim,
                static_cast<const std::uint8_t*>(from.k_rope.data()) + from_row * kMlaRopeDim,
                std::size_t(rows * kMlaRopeDim), cudaMemcpyDeviceToDevice, stream_),
            "cudaMemcpyAsync(one-shot K's RoPE part)");
    }
    const auto* v = static_cast<const std::uint8_t*>(from.v.data());
    if (fp8) {  // [H * 128][pitch] bytes: a column range of every row
      check(cudaMemcpy2DAsync(b_.one_shot_v + to_row, std::size_t(pitch), v + from_row,
                              std::size_t(from.v_pitch), std::size_t(rows),
                              std::size_t(H * kMlaVDim), cudaMemcpyDeviceToDevice, stream_),
            "cudaMemcpy2DAsync(one-shot V)");
    } else {  // a token's H * 128 bf16 contiguous, tokens v.stride(0) apart (v_of)
      const std::size_t row_bytes = std::size_t(H * kMlaVDim * 2);
      check(
          cudaMemcpy2DAsync(b_.one_shot_v + to_row * std::int64_t(row_bytes), row_bytes,
                            v + from_row * from.v.stride(0) * 2, std::size_t(from.v.stride(0) * 2),
                            row_bytes, std::size_t(rows), cudaMemcpyDeviceToDevice, stream_),
          "cudaMemcpy2DAsync(one-shot V)");
    }
  };
  std::int64_t prefix_at = 0;
  for (std::int64_t i = 0; i < plan.sequences; ++i) {
    const std::int64_t k0 = plan.cu_k_one_shot[std::size_t(i)];
    const std::int64_t q0 = plan.cu_q[std::size_t(i)], e = plan.cu_q[std::size_t(i + 1)] - q0;
    const std::int64_t p = plan.cu_k_one_shot[std::size_t(i + 1)] - k0 - e;
    copy_rows(prefix_, prefix_at, k0, p);
    copy_rows(extend_, q0, k0 + p, e);
    prefix_at += p;
  }
  one_shot_ = fp8 ? KeysValues{k8_nope_of(b_.one_shot_k, n), v8_of(b_.one_shot_v, n, pitch), pitch,
                               k8_rope_of(b_.one_shot_k, n)}
                  : KeysValues{rows_of(b_.one_shot_k, adt, n, kMlaQkDim),
                               rows_of(b_.one_shot_v, adt, n, kMlaVDim),
                               0,
                               {}};
}

void CudaMlaExecutor::attend(const MlaAttendStep& step) {
  const MlaBatchPlan& plan = call_->plan;
  const std::int64_t T = plan.tokens;
  const DType adt = call_->path.attention_dtype;
  const bool chunk = step.keys == MlaKeys::kPrefix;
  const KeysValues& kv = step.keys == MlaKeys::kExtend ? extend_ : chunk ? prefix_ : one_shot_;
  MlaAttentionTensors t;
  t.q = call_->path.fp8 ? rows_of(b_.q8, adt, T, kMlaQkDim) : rows_of(b_.q, adt, T, kMlaQkDim);
  t.k = kv.k;
  t.k_rope = kv.k_rope;
  t.v = kv.v;
  t.cu_q = b_.cu_q;
  t.cu_k = step.keys == MlaKeys::kExtend ? b_.cu_q
           : chunk ? b_.chunk_cu_k + step.chunk * std::size_t(plan.sequences + 1)
                   : b_.cu_k_one_shot;
  t.descales = b_.descales;
  const bool separate_chunk = chunk && !step.fold;
  t.out = separate_chunk ? b_.chunk_out : b_.attn;
  t.lse = separate_chunk                                  ? b_.chunk_lse
          : step.lse || (step.fold && !step.o_proj_input) ? b_.lse
                                                          : nullptr;
  if (step.fold) {
    t.prior_out = b_.attn;
    t.prior_lse = b_.lse;
  }
  if (step.o_proj_input && fused()) {
    t.out = b_.gemm_x;
    t.out_scales = gemm_x_scales(T, o_->in);
  }
  call_->backend->prefill_attention(mla_attention_args(c_, plan, call_->path, step, t, device_),
                                    call_->stream);
}

void CudaMlaExecutor::merge(bool o_proj_input) {
  const std::int64_t T = call_->plan.tokens, H = c_.heads;
  const TensorView attn = rows_of(b_.attn, DType::kBF16, T, kMlaVDim);
  const TensorView lse(b_.lse, DType::kF32, {T, H}, device_);
  const TensorView chunk_out = rows_of(b_.chunk_out, DType::kBF16, T, kMlaVDim);
  const TensorView chunk_lse(b_.chunk_lse, DType::kF32, {T, H}, device_);
  if (o_proj_input && fused()) {
    merge_attention_states(attn, lse, chunk_out, chunk_lse,
                           TensorView(b_.gemm_x, DType::kE4M3, {T, o_->in}, device_), lse, {},
                           gemm_x_scales(T, o_->in), {}, call_->stream);
    return;
  }
  merge_attention_states_inplace(attn, lse, chunk_out, chunk_lse, call_->stream);
}

// With the fused path the input is in the GEMM's buffers already: no quantization here.
void CudaMlaExecutor::output() {
  const std::int64_t T = call_->plan.tokens;
  auto* y = call_->out.data_as<std::uint16_t>();
  if (fused()) {
    o_->gemm->run(b_.gemm_x, b_.gemm_x_scales, T, y, b_.cublas, b_.cublas_bytes, stream_);
    return;
  }
  project(*o_, b_.attn, T, y);
}

}  // namespace

std::unique_ptr<MlaExecutor> make_cuda_mla_executor(const MlaConfig& config,
                                                    const MlaWeights& weights, Device device) {
  return std::make_unique<CudaMlaExecutor>(config, weights, device);
}

}  // namespace fp8mla
