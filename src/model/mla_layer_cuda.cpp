// MlaLayer on a CUDA device: the projections through cuBLASLt (cuda/model/cublas_linear), RMSNorm
// and the BF16 path's RoPE through the layer's kernels (cuda/model/layer_kernels), everything else
// through fp8mla's ops and the attention backend, in the CPU layer's order. Device memory comes
// from the caller's workspace (model/mla_workspace).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "cuda/common/device_buffer.hpp"
#include "cuda/common/runtime.hpp"
#include "cuda/common/stage_timer.hpp"
#include "cuda/model/cublas_linear.hpp"
#include "cuda/model/layer_kernels.hpp"
#include "fp8mla/attention.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/kernel_registry.hpp"
#include "fp8mla/mla_prep.hpp"
#include "fp8mla/numerics.hpp"
#include "fp8mla/quantize.hpp"
#include "model/cpu_math.hpp"
#include "model/mla_layer_impl.hpp"
#include "model/mla_workspace.hpp"

namespace fp8mla {
namespace {

using cuda::check;
using cuda::DeviceBuffer;
using cuda::model::CublasLinear;
using cuda::model::LinearFormat;

// Rows a projection plan accepts (the prefix keys of one attention call pass kv_b too).
constexpr std::int64_t kMaxGemmRows = std::int64_t(1) << 20;

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
      scale = DeviceBuffer(p.scale_inv.data(), p.scale_inv.numel() * 4);
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

class CudaMlaLayer final : public MlaLayer::Impl {
 public:
  CudaMlaLayer(const MlaConfig& config, const MlaWeights& weights, Device device)
      : c_(config), device_(device) {
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
    add(kv_b_, "kv_b_proj", weights.kv_b_proj);
    add(o_, "o_proj", weights.o_proj);
    kv_a_norm_ = DeviceBuffer(weights.kv_a_layernorm.data(), c_.kv_lora_rank * 2);
    std::vector<float> cos_sin(std::size_t(c_.max_position * kMlaRopeDim));
    make_cos_sin_cache(TensorView(cos_sin.data(), DType::kF32, {c_.max_position, kMlaRopeDim}),
                       c_.rope);
    cos_sin_ = DeviceBuffer(cos_sin.data(), std::int64_t(cos_sin.size()) * 4);
    // Every attention variant either path can ask for, checked and set up now, not mid-request.
    warm_up_attention(AttentionNeeds{{DType::kE4M3, DType::kBF16}});
  }

  const std::vector<std::string>& projection_notes() const override { return notes_; }

  std::size_t workspace_bytes(const MlaWorkspaceLimits& limits, const MlaPrefillOptions& options,
                              MlaPath path) const override {
    return mla_workspace_bytes(c_, work_sizes(limits, options, path.fp8));
  }

  void prefill(const MlaPrefillCall& call) override;

 private:
  // y = x W^T for `rows` rows of x (bf16, contiguous); FP8 projections quantize x first.
  void project(Projection& p, const std::uint16_t* x, std::int64_t rows, std::uint16_t* y,
               const MlaBuffers& b, cudaStream_t stream) {
    if (rows == 0) return;
    if (!p.fp8) {
      p.gemm->run(x, nullptr, rows, y, b.cublas, b.cublas_bytes, stream);
      return;
    }
    const Device d = device_;
    quantize_fp8_per_token_group(
        TensorView(const_cast<std::uint16_t*>(x), DType::kBF16, {rows, p.in}, d),
        TensorView(b.gemm_x, DType::kE4M3, {rows, p.in}, d),
        TensorView(b.gemm_x_scales, DType::kF32, {rows, p.in / kWeightBlock}, {1, rows}, d),
        GroupQuantOptions{.group_size = int(kWeightBlock)}, stream);
    p.gemm->run(b.gemm_x, b.gemm_x_scales, rows, y, b.cublas, b.cublas_bytes, stream);
  }

  void rms_norm(const std::uint16_t* x, std::int64_t x_stride, const DeviceBuffer& weight,
                int width, std::int64_t rows, std::uint16_t* y, cudaStream_t stream) const {
    cuda::model::rms_norm(
        {x, x_stride, weight.as<std::uint16_t>(), y, width, rows, width, float(c_.rms_norm_eps)},
        stream);
  }

  MlaConfig c_;
  Device device_;
  cuda::model::CublasLtHandle handle_;
  std::optional<Projection> q_a_, q_b_, kv_a_, kv_b_, o_;
  DeviceBuffer q_a_norm_, kv_a_norm_, cos_sin_;
  std::vector<std::string> notes_;
  std::vector<std::byte> staging_;  // host image of the batch metadata
  cuda::StageTimer timer_;
};

void CudaMlaLayer::prefill(const MlaPrefillCall& call) {
  const MlaBatchPlan& plan = call.plan;
  const AttentionBackend& backend = call.backend;
  const MlaPrefillOptions& options = call.options;
  const bool fp8 = call.path.fp8;
  const std::int64_t T = plan.tokens, B = plan.sequences, H = c_.heads;
  const Device d = device_;
  const auto stream = reinterpret_cast<cudaStream_t>(call.stream);
  if (fp8 && backend.capabilities().v_layout != VLayout::kTransposed) {
    throw Error(ErrorCategory::kUnsupported,
                concat("MlaLayer::prefill: backend '", backend.capabilities().name,
                       "' packs V token-major; FP8 attention on Hopper reads it transposed"));
  }
  // Every slot in the cache: the CUDA ops would skip a bad one without telling the host.
  const std::int64_t cache_rows = call.cache.size(0) * call.cache.size(1);
  for (const std::vector<std::int64_t>* slots : {&plan.slots, &plan.prefix_rows}) {
    for (std::int64_t s : *slots) {
      if (s < 0 || s >= cache_rows) {
        throw Error(
            ErrorCategory::kInvalidArgument,
            concat("MlaLayer::prefill: slot ", s, " is outside the cache's ", cache_rows, " rows"));
      }
    }
  }
  if (T == 0) {
    if (call.times != nullptr) *call.times = {};
    return;
  }
  const WorkSizes s = work_sizes(plan, fp8);
  const TensorView& ws = call.workspace;
  const std::size_t needed = mla_workspace_bytes(c_, s);
  const std::size_t ws_bytes = std::size_t(ws.numel()) * std::size_t(dtype_size(ws.dtype()));
  if (ws.ndim() != 1 || ws.stride(0) != 1 || ws.device() != d || ws_bytes < needed ||
      reinterpret_cast<std::uintptr_t>(ws.data()) % kMlaWorkspaceAlign != 0) {
    throw Error(
        ErrorCategory::kInvalidArgument,
        concat("MlaLayer::prefill: expected `workspace` 1-d contiguous, >= ", needed, " bytes on ",
               to_string(d), ", 256-byte aligned (what this batch needs: ", T, " tokens, ", B,
               " sequences, ", s.prefix_rows, " prefix tokens); got ", ws.describe()));
  }
  check(cudaSetDevice(d.index), "cudaSetDevice(MlaLayer)");
  const MlaBuffers b = carve_mla_workspace(static_cast<std::byte*>(ws.data()), c_, s);

  // ---- the batch's metadata: one copy from the host ----
  // Every piece is written below; the alignment gaps between them are never read.
  staging_.resize(std::size_t(b.meta_end - b.meta_begin));
  const auto stage = [&](void* device_at, const void* host, std::size_t bytes) {
    if (bytes > 0)
      std::memcpy(staging_.data() + (static_cast<std::byte*>(device_at) - b.meta_begin), host,
                  bytes);
  };
  stage(b.positions, plan.positions.data(), plan.positions.size() * 8);
  stage(b.slots, plan.slots.data(), plan.slots.size() * 8);
  stage(b.prefix_rows, plan.prefix_rows.data(), plan.prefix_rows.size() * 8);
  stage(b.cu_q, plan.cu_q.data(), plan.cu_q.size() * 4);
  stage(b.cu_k_one_shot, plan.cu_k_one_shot.data(), plan.cu_k_one_shot.size() * 4);
  for (std::size_t i = 0; i < plan.chunks.size(); ++i) {
    stage(b.chunk_cu_k + i * std::size_t(B + 1), plan.chunks[i].cu_seqlens_k.data(),
          std::size_t(B + 1) * 4);
  }
  const float descales[3] = {1.0f / options.fp8.q_scale_inv, 1.0f / options.fp8.k_scale_inv,
                             1.0f / options.fp8.v_scale_inv};
  stage(b.descales, descales, sizeof(descales));
  check(cudaMemcpyAsync(b.meta_begin, staging_.data(), staging_.size(), cudaMemcpyHostToDevice,
                        stream),
        "cudaMemcpyAsync(MlaLayer batch metadata)");

  MlaStageTimes t{};
  timer_.begin(call.times != nullptr);

  // ---- projections of the extend tokens ----
  timer_.start(stream, &t.projections);
  const auto* hidden = call.hidden.data_as<const std::uint16_t>();
  if (c_.q_lora_rank > 0) {
    project(*q_a_, hidden, T, b.q_a, b, stream);
    rms_norm(b.q_a, c_.q_lora_rank, q_a_norm_, int(c_.q_lora_rank), T, b.q_a_norm, stream);
    project(*q_b_, b.q_a_norm, T, b.q, b, stream);
  } else {
    project(*q_b_, hidden, T, b.q, b, stream);
  }
  project(*kv_a_, hidden, T, b.kv_a, b, stream);
  rms_norm(b.kv_a, kMlaLatentDim, kv_a_norm_, int(c_.kv_lora_rank), T, b.kv_c, stream);
  project(*kv_b_, b.kv_c, T, b.kv, b, stream);
  timer_.stop(stream);

  // Views: [n, H, 128] k_nope and v inside a [n, H, 256] kv_b output; a transposed e4m3 V.
  const auto k_nope_of = [&](std::uint16_t* kv, std::int64_t n) {
    return TensorView(kv, DType::kBF16, {n, H, kMlaNopeDim}, {H * 256, 256, 1}, d);
  };
  const auto v_of = [&](std::uint16_t* kv, std::int64_t n) {
    return TensorView(kv + kMlaNopeDim, DType::kBF16, {n, H, kMlaVDim}, {H * 256, 256, 1}, d);
  };
  const auto v8_of = [&](std::uint8_t* v, std::int64_t n, std::int64_t pitch) {
    return TensorView(v, DType::kE4M3, {n, H, kMlaVDim}, {1, kMlaVDim * pitch, pitch}, d);
  };
  const auto rows_of = [&](void* data, DType dtype, std::int64_t n, std::int64_t width) {
    return TensorView(data, dtype, {n, H, width}, d);
  };

  // The BF16 path's K = [k_nope | k_pe] per head, from a [n, H, 256] kv_b output and k_pe rows
  // shared by the heads (RoPE'd when the caller adds positions).
  const auto k_assembly = [&](const std::uint16_t* kv, std::int64_t n, const std::uint16_t* k_pe,
                              std::int64_t k_pe_stride, std::uint16_t* k_out) {
    cuda::model::RopeAssembleParams r;
    r.tokens = n;
    r.heads = H;
    r.k_nope = kv;
    r.k_nope_token_stride = H * 256;
    r.k_nope_head_stride = 256;
    r.k_pe = k_pe;
    r.k_pe_stride = k_pe_stride;
    r.k_out = k_out;
    return r;
  };

  // ---- prep: RoPE, FP8 Q/K/V (hook) or bf16 RoPE, latent cache write ----
  timer_.start(stream, &t.prep);
  LatentCacheWrite write;
  write.cache = call.cache;
  write.slot_mapping = TensorView(b.slots, DType::kI64, {T}, d);
  write.scale_inv = options.cache_scale_inv;
  const TensorView kv_c_view(b.kv_c, DType::kBF16, {T, c_.kv_lora_rank}, d);
  const TensorView k_pe_raw(b.kv_a + c_.kv_lora_rank, DType::kBF16, {T, kMlaRopeDim},
                            {kMlaLatentDim, 1}, d);
  const TensorView positions(b.positions, DType::kI64, {T}, d);
  const TensorView cos_sin(cos_sin_.as<float>(), DType::kF32, {c_.max_position, kMlaRopeDim}, d);
  const std::int64_t qw = c_.q_width();
  if (fp8) {
    PrepareQkvArgs hook;
    MlaRopeQuantizeArgs& a = hook.qk;
    a.q_nope = TensorView(b.q, DType::kBF16, {T, H, kMlaNopeDim}, {qw, kMlaQkDim, 1}, d);
    a.q_pe =
        TensorView(b.q + kMlaNopeDim, DType::kBF16, {T, H, kMlaRopeDim}, {qw, kMlaQkDim, 1}, d);
    a.k_nope = k_nope_of(b.kv, T);
    a.k_pe = k_pe_raw;
    a.positions = positions;
    a.cos_sin = cos_sin;
    a.q_scale_inv = options.fp8.q_scale_inv;
    a.k_scale_inv = options.fp8.k_scale_inv;
    a.q_out = rows_of(b.q8, DType::kE4M3, T, kMlaQkDim);
    a.k_out = rows_of(b.k8, DType::kE4M3, T, kMlaQkDim);
    a.cache_write = write;
    a.kv_c = kv_c_view;
    hook.v = v_of(b.kv, T);
    hook.v_scale_inv = options.fp8.v_scale_inv;
    hook.v_out = v8_of(b.v8, T, v_pitch(T));
    backend.prepare_prefill_qkv(hook, call.stream);
  } else {
    cuda::model::RopeAssembleParams r =
        k_assembly(b.kv, T, b.kv_a + c_.kv_lora_rank, kMlaLatentDim, b.k16);
    r.k_pe_out = b.k_pe16;
    r.q_pe = b.q + kMlaNopeDim;
    r.q_token_stride = qw;
    r.q_head_stride = kMlaQkDim;
    r.positions = b.positions;
    r.cos_sin = cos_sin_.as<float>();
    cuda::model::rope_assemble_bf16(r, stream);
    mla_kv_cache_write(kv_c_view, TensorView(b.k_pe16, DType::kBF16, {T, kMlaRopeDim}, d), write,
                       call.stream);
  }
  timer_.stop(stream);

  // Keys and values of one attention call, as the kernel reads them.
  struct KeysValues {
    TensorView k, v;
    std::int64_t v_pitch = 0;  // FP8: bytes between the dims of the transposed V
  };
  const DType adt = call.path.attention_dtype;
  const KeysValues extend =
      fp8 ? KeysValues{rows_of(b.k8, adt, T, kMlaQkDim), v8_of(b.v8, T, v_pitch(T)), v_pitch(T)}
          : KeysValues{rows_of(b.k16, adt, T, kMlaQkDim), v_of(b.kv, T), 0};
  // The prefix keys of cache `rows` (device i64, n of them): gather, kv_b, pack or assemble.
  const auto prefix_keys = [&](const std::int64_t* rows, std::int64_t n) {
    mla_kv_gather(call.cache, TensorView(const_cast<std::int64_t*>(rows), DType::kI64, {n}, d),
                  1.0f / options.cache_scale_inv,
                  TensorView(b.prefix_c, DType::kBF16, {n, c_.kv_lora_rank}, d),
                  TensorView(b.prefix_pe, DType::kBF16, {n, kMlaRopeDim}, d), {}, call.stream);
    project(*kv_b_, b.prefix_c, n, b.prefix_kv, b, stream);
    if (fp8) {
      MlaKvPackArgs a;
      a.k_nope = k_nope_of(b.prefix_kv, n);
      a.k_pe = TensorView(b.prefix_pe, DType::kBF16, {n, kMlaRopeDim}, d);
      a.v = v_of(b.prefix_kv, n);
      a.k_scale_inv = options.fp8.k_scale_inv;
      a.v_scale_inv = options.fp8.v_scale_inv;
      a.k_out = rows_of(b.prefix_k8, adt, n, kMlaQkDim);
      a.v_out = v8_of(b.prefix_v8, n, v_pitch(n));
      a.v_layout = VLayout::kTransposed;
      backend.pack_prefix_chunk_kv(a, call.stream);
      return KeysValues{a.k_out, a.v_out, v_pitch(n)};
    }
    cuda::model::rope_assemble_bf16(
        k_assembly(b.prefix_kv, n, b.prefix_pe, kMlaRopeDim, b.prefix_k16), stream);
    return KeysValues{rows_of(b.prefix_k16, adt, n, kMlaQkDim), v_of(b.prefix_kv, n), 0};
  };
  const TensorView q_view =
      fp8 ? rows_of(b.q8, adt, T, kMlaQkDim) : rows_of(b.q, adt, T, kMlaQkDim);
  const auto attend = [&](const KeysValues& kv, const std::int32_t* cu_k, std::int32_t max_k,
                          bool causal, std::uint16_t* out, float* lse) {
    PrefillAttentionArgs a;
    a.q = q_view;
    a.k = kv.k;
    a.v = kv.v;
    a.cu_seqlens_q = TensorView(b.cu_q, DType::kI32, {B + 1}, d);
    a.cu_seqlens_k = TensorView(const_cast<std::int32_t*>(cu_k), DType::kI32, {B + 1}, d);
    a.max_seqlen_q = plan.max_q;
    a.max_seqlen_k = max_k;
    a.softmax_scale = float(c_.softmax_scale());
    a.causal = causal;
    if (fp8) {
      a.q_descale = TensorView(b.descales, DType::kF32, {1}, d);
      a.k_descale = TensorView(b.descales + 1, DType::kF32, {1}, d);
      a.v_descale = TensorView(b.descales + 2, DType::kF32, {1}, d);
    }
    a.out = rows_of(out, DType::kBF16, T, kMlaVDim);
    if (lse != nullptr) a.lse = TensorView(lse, DType::kF32, {T, H}, d);
    backend.prefill_attention(a, call.stream);
  };

  if (!plan.chunked && plan.prefix_rows.empty()) {
    timer_.start(stream, &t.attention);
    attend(extend, b.cu_q, plan.max_q, true, b.attn, nullptr);
    timer_.stop(stream);
  } else if (!plan.chunked) {
    timer_.start(stream, &t.prefix);
    const std::int64_t P = std::int64_t(plan.prefix_rows.size());
    const KeysValues prefix = prefix_keys(b.prefix_rows, P);
    // Each sequence's prefix keys, then its extend keys, one copy per run of rows.
    const std::int64_t n = P + T, pitch = v_pitch(n), eb = fp8 ? 1 : 2;
    const std::int64_t k_row = H * kMlaQkDim * eb;
    const auto copy_rows = [&](const KeysValues& from, std::int64_t from_row, std::int64_t to_row,
                               std::int64_t rows) {
      if (rows == 0) return;
      check(cudaMemcpyAsync(b.one_shot_k + to_row * k_row,
                            static_cast<const std::uint8_t*>(from.k.data()) + from_row * k_row,
                            std::size_t(rows * k_row), cudaMemcpyDeviceToDevice, stream),
            "cudaMemcpyAsync(one-shot K)");
      const auto* v = static_cast<const std::uint8_t*>(from.v.data());
      if (fp8) {  // [H * 128][pitch] bytes: a column range of every row
        check(cudaMemcpy2DAsync(b.one_shot_v + to_row, std::size_t(pitch), v + from_row,
                                std::size_t(from.v_pitch), std::size_t(rows),
                                std::size_t(H * kMlaVDim), cudaMemcpyDeviceToDevice, stream),
              "cudaMemcpy2DAsync(one-shot V)");
      } else {  // token-major rows of 128 bf16, 256 apart in the kv_b output
        check(cudaMemcpy2DAsync(b.one_shot_v + to_row * H * kMlaVDim * 2, kMlaVDim * 2,
                                v + from_row * from.v.stride(0) * 2,
                                std::size_t(from.v.stride(1) * 2), kMlaVDim * 2,
                                std::size_t(rows * H), cudaMemcpyDeviceToDevice, stream),
              "cudaMemcpy2DAsync(one-shot V)");
      }
    };
    std::int64_t prefix_at = 0;
    for (std::int64_t i = 0; i < B; ++i) {
      const std::int64_t k0 = plan.cu_k_one_shot[std::size_t(i)];
      const std::int64_t q0 = plan.cu_q[std::size_t(i)], e = plan.cu_q[std::size_t(i + 1)] - q0;
      const std::int64_t p = plan.cu_k_one_shot[std::size_t(i + 1)] - k0 - e;
      copy_rows(prefix, prefix_at, k0, p);
      copy_rows(extend, q0, k0 + p, e);
      prefix_at += p;
    }
    timer_.stop(stream);
    timer_.start(stream, &t.attention);
    const KeysValues all = fp8 ? KeysValues{rows_of(b.one_shot_k, adt, n, kMlaQkDim),
                                            v8_of(b.one_shot_v, n, pitch), pitch}
                               : KeysValues{rows_of(b.one_shot_k, adt, n, kMlaQkDim),
                                            rows_of(b.one_shot_v, adt, n, kMlaVDim), 0};
    attend(all, b.cu_k_one_shot, plan.max_k_one_shot, true, b.attn, nullptr);
    timer_.stop(stream);
  } else {
    timer_.start(stream, &t.attention);
    attend(extend, b.cu_q, plan.max_q, true, b.attn, b.lse);
    timer_.stop(stream);
    for (std::size_t i = 0; i < plan.chunks.size(); ++i) {
      const PrefixChunk& chunk = plan.chunks[i];
      timer_.start(stream, &t.prefix);
      const KeysValues keys = prefix_keys(b.prefix_rows + plan.chunk_first_row[i], chunk.keys());
      timer_.stop(stream);
      timer_.start(stream, &t.attention);
      attend(keys, b.chunk_cu_k + i * std::size_t(B + 1), chunk.max_seqlen_k, false, b.chunk_out,
             b.chunk_lse);
      timer_.stop(stream);
      timer_.start(stream, &t.merge);
      merge_attention_states_inplace(rows_of(b.attn, DType::kBF16, T, kMlaVDim),
                                     TensorView(b.lse, DType::kF32, {T, H}, d),
                                     rows_of(b.chunk_out, DType::kBF16, T, kMlaVDim),
                                     TensorView(b.chunk_lse, DType::kF32, {T, H}, d), call.stream);
      timer_.stop(stream);
    }
  }

  // ---- o_proj ----
  timer_.start(stream, &t.output);
  project(*o_, b.attn, T, call.out.data_as<std::uint16_t>(), b, stream);
  timer_.stop(stream);
  timer_.finish();
  if (call.times != nullptr) *call.times = t;
}

}  // namespace

std::unique_ptr<MlaLayer::Impl> make_cuda_mla_layer(const MlaConfig& config,
                                                    const MlaWeights& weights, Device device) {
  return std::make_unique<CudaMlaLayer>(config, weights, device);
}

}  // namespace fp8mla
