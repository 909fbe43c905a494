// The MLA layer's CPU executor, the reference: the dense steps in model/cpu_math, the attention
// and the FP8 transition through the attention backend, the other MLA ops through fp8mla's public
// ops (their CPU implementations), in the order and at the precision the CUDA executor uses. Each
// prefill's buffers are host vectors, allocated by the step that fills them.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "fp8mla/attention.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_prep.hpp"
#include "fp8mla/numerics.hpp"
#include "model/cpu_math.hpp"
#include "model/mla_executor.hpp"

namespace fp8mla {
namespace {

using Bits = std::vector<std::uint16_t>;  // bf16 values
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Keys and values of one attention call: [n, H, 192] and [n, H, 128], token-major e4m3 or bf16
// bytes.
struct KeysValues {
  std::vector<std::uint8_t> k, v;
  std::int64_t tokens = 0;
};

// A projection as the CPU runs it: f32 weights, and whether its input is quantized per token
// and group of 128 first (the FP8 GEMM's input: model::quantizes_input).
struct CpuProjection {
  std::vector<float> w;
  std::int64_t out = 0, in = 0;
  bool fp8_weight = false, fp8_input = false;

  explicit CpuProjection(const MlaProjection& p)
      : w(model::dequantize(p)),
        out(p.weight.size(0)),
        in(p.weight.size(1)),
        fp8_weight(p.weight.dtype() == DType::kE4M3),
        fp8_input(model::quantizes_input(p)) {}
  CpuProjection() = default;

  void operator()(std::span<const std::uint16_t> x, std::int64_t rows,
                  std::span<std::uint16_t> y) const {
    model::linear(x, rows, in, w, out, y, fp8_input);
  }
  void operator()(std::span<const std::uint16_t> x, std::int64_t rows,
                  const model::LinearStore& store) const {
    model::linear(x, rows, in, w, out, store, fp8_input);
  }
};

std::string note(const char* name, const CpuProjection& p) {
  return concat(name, " [", p.out, ", ", p.in, "]: ",
                p.fp8_input    ? "fp8 block-scaled GEMM (input quantized per 128-group), f32 math"
                : p.fp8_weight ? "bf16 GEMM on the dequantized e4m3 weight (the FP8 GEMM wants "
                                 "in % 128 == 0 and out % 8 == 0), f32 math"
                               : "bf16 GEMM, f32 math");
}

// The buffers of one prefill.
struct CpuWork {
  Bits q, kv_a, kv_c, kv;            // projections of the extend tokens
  Bits k_pe;                         // the BF16 path's RoPE'd k_pe, [T, 64]
  std::vector<std::uint8_t> q_attn;  // the attention's Q, [T, H, 192]
  KeysValues extend, prefix, one_shot;
  Bits attn, chunk_out;  // [T, H, 128]
  std::vector<float> lse, chunk_lse;
  // The fused path's o_proj input, written by the last attention call or merge: e4m3 [T, H * 128]
  // and its group-128 scales, f32 [T, H] row-major (what linear_fp8 reads).
  std::vector<std::uint8_t> o_proj_x;
  std::vector<float> o_proj_scales;
  std::vector<std::uint8_t> gathered;  // context parallelism: every rank's latent rows
};

class CpuMlaExecutor final : public MlaExecutor {
 public:
  CpuMlaExecutor(const MlaConfig& config, const MlaWeights& weights)
      : c_(config), weights_(weights) {
    if (c_.q_lora_rank > 0) {
      q_a_ = CpuProjection(weights.q_a_proj);
      q_b_ = CpuProjection(weights.q_b_proj);
      notes_.push_back(note("q_a_proj", q_a_));
      notes_.push_back(note("q_b_proj", q_b_));
    } else {
      q_ = CpuProjection(weights.q_proj);
      notes_.push_back(note("q_proj", q_));
    }
    kv_a_ = CpuProjection(weights.kv_a_proj_with_mqa);
    kv_b_ = CpuProjection(weights.kv_b_proj);
    o_ = CpuProjection(weights.o_proj);
    notes_.push_back(note("kv_a_proj_with_mqa", kv_a_));
    notes_.push_back(note("kv_b_proj", kv_b_));
    notes_.push_back(note("o_proj", o_));
    cos_sin_.resize(std::size_t(c_.max_position * kMlaRopeDim));
    make_cos_sin_cache(TensorView(cos_sin_.data(), DType::kF32, {c_.max_position, kMlaRopeDim}),
                       c_.rope);
  }

  const std::vector<std::string>& projection_notes() const override { return notes_; }
  std::size_t workspace_bytes(const MlaWorkspaceLimits&, const MlaPrefillOptions&,
                              MlaPath) const override {
    return 0;
  }
  std::size_t workspace_bytes(const MlaBatchPlan&, MlaPath) const override { return 0; }
  MlaVLayoutNeed fp8_v_layout() const override {
    return {VLayout::kTokenMajor, "the CPU layer concatenates token-major V"};
  }
  bool fp8_o_proj() const override { return o_.fp8_input; }
  bool e4m3_kv_projection() const override { return kv_b_.fp8_input; }

  void check_batch(const MlaPrefillCall&) override {}  // the CPU ops check every slot themselves
  void begin(const MlaPrefillCall& call) override {
    call_ = &call;
    const std::int64_t T = call.plan.tokens, H = c_.heads;
    w_ = {};
    w_.attn.resize(std::size_t(T * H * kMlaVDim));
    w_.lse.resize(std::size_t(T * H));
    if (call.plan.prefix_attention == PrefixAttention::kChunked && !call.path.fold_chunks) {
      w_.chunk_out.resize(w_.attn.size());
      w_.chunk_lse.resize(w_.lse.size());
    }
    if (fused()) {
      w_.o_proj_x.resize(w_.attn.size());
      w_.o_proj_scales.resize(w_.lse.size());
    }
    const MlaFp8Scales& scales = call.options.fp8;
    descales_[0] = 1.0f / scales.q_scale_inv;
    descales_[1] = 1.0f / scales.k_scale_inv;
    descales_[2] = 1.0f / scales.v_scale_inv;
  }
  void project() override;
  void prep() override;
  TensorView pack_latent_rows() override;
  void unpack_latent_rows() override;
  void prefix_keys(std::int64_t first_row, std::int64_t rows) override;
  void assemble_one_shot() override;
  void attend(const MlaAttendStep& step) override;
  void merge(bool o_proj_input) override {
    const std::int64_t T = call_->plan.tokens, H = c_.heads;
    const TensorView attn(w_.attn.data(), DType::kBF16, {T, H, kMlaVDim});
    const TensorView lse(w_.lse.data(), DType::kF32, {T, H});
    const TensorView chunk_out(w_.chunk_out.data(), DType::kBF16, {T, H, kMlaVDim});
    const TensorView chunk_lse(w_.chunk_lse.data(), DType::kF32, {T, H});
    if (o_proj_input && fused()) {
      merge_attention_states(attn, lse, chunk_out, chunk_lse, o_proj_x_view(), lse, {},
                             o_proj_scales_view());
      return;
    }
    merge_attention_states_inplace(attn, lse, chunk_out, chunk_lse);
  }
  void output() override {
    const std::int64_t T = call_->plan.tokens;
    const std::span<std::uint16_t> y(call_->out.data_as<std::uint16_t>(),
                                     std::size_t(T * c_.hidden));
    if (fused()) {
      model::linear_fp8(w_.o_proj_x, w_.o_proj_scales, T, o_.in, o_.w, o_.out, y);
      return;
    }
    o_(w_.attn, T, y);
  }
  void finish() override { w_ = {}; }  // the buffers live for one prefill
  TensorView calibration_workspace(const MlaBatchPlan&, MlaPath) override { return {}; }
  MlaActivationAmax activation_amax() override;
  // Wall time.
  void start_stage(double* stage) override {
    stage_ = stage;
    stage_start_ = Clock::now();
  }
  void stop_stage() override { *stage_ += ms_since(stage_start_); }

 private:
  int element_bytes() const { return call_->path.fp8 ? 1 : 2; }
  bool fused() const { return call_->path.output_quant == MlaOutputQuant::kFused; }
  TensorView o_proj_x_view() {
    return TensorView(w_.o_proj_x.data(), DType::kE4M3, {call_->plan.tokens, c_.heads * kMlaVDim});
  }
  TensorView o_proj_scales_view() {
    return TensorView(w_.o_proj_scales.data(), DType::kF32, {call_->plan.tokens, c_.heads});
  }
  // Views of the [n, H, 128] k_nope and v inside a [n, H, 256] kv_b output.
  TensorView k_nope_of(Bits& kvb, std::int64_t n) const {
    return TensorView(kvb.data(), DType::kBF16, {n, c_.heads, kMlaNopeDim},
                      {c_.heads * 256, 256, 1});
  }
  TensorView v_of(Bits& kvb, std::int64_t n) const {
    return TensorView(kvb.data() + kMlaNopeDim, DType::kBF16, {n, c_.heads, kMlaVDim},
                      {c_.heads * 256, 256, 1});
  }
  void size_extend_qkv();  // the attention's Q and the extend K/V in the path's dtype
  std::uint8_t* cache_row(std::int64_t slot) const;
  void prep_fp8(const LatentCacheWrite& write);
  void assemble_bf16();

  MlaConfig c_;
  MlaWeights weights_;  // the norms are read from here
  CpuProjection q_a_, q_b_, q_, kv_a_, kv_b_, o_;
  std::vector<float> cos_sin_;  // [max_position, 64]
  std::vector<std::string> notes_;
  const MlaPrefillCall* call_ = nullptr;  // of the prefill between begin() and finish()
  float descales_[3] = {1, 1, 1};         // q, k, v
  CpuWork w_;
  double* stage_ = nullptr;
  Clock::time_point stage_start_;
};

void CpuMlaExecutor::project() {
  const std::int64_t T = call_->plan.tokens;
  const std::int64_t qw = c_.q_width(), kvw = c_.kv_b_width(), latent = kMlaLatentDim;
  w_.q.resize(std::size_t(T * qw));
  w_.kv_a.resize(std::size_t(T * latent));
  w_.kv_c.resize(std::size_t(T * c_.kv_lora_rank));
  w_.kv.resize(std::size_t(T * kvw));
  const std::span<const std::uint16_t> xs(call_->hidden.data_as<const std::uint16_t>(),
                                          std::size_t(T * c_.hidden));
  if (c_.q_lora_rank > 0) {
    Bits qa(std::size_t(T * c_.q_lora_rank)), qa_n(qa.size());
    q_a_(xs, T, qa);
    model::rms_norm(qa.data(), T, c_.q_lora_rank, c_.q_lora_rank, weights_.q_a_layernorm,
                    c_.rms_norm_eps, qa_n.data());
    q_b_(qa_n, T, w_.q);
  } else {
    q_(xs, T, w_.q);
  }
  kv_a_(xs, T, w_.kv_a);
  model::rms_norm(w_.kv_a.data(), T, c_.kv_lora_rank, latent, weights_.kv_a_layernorm,
                  c_.rms_norm_eps, w_.kv_c.data());
  if (!call_->path.kv_from_projection) {
    kv_b_(w_.kv_c, T, w_.kv);
    return;
  }
  // MlaPath::kv_from_projection: K-nope and V rounded once from kv_b's f32 sums to e4m3, into
  // the extend K (nope part of each head's [T, H, 192] row) and V (token-major, the CPU hook's
  // layout); the hook adds K's RoPE part.
  size_extend_qkv();
  const MlaFp8Scales& scales = call_->options.fp8;
  kv_b_(w_.kv_c, T, [&](std::int64_t t, std::int64_t o, float sum) {
    const std::int64_t h = o / 256, j = o % 256;
    if (j < kMlaNopeDim) {
      w_.extend.k[std::size_t((t * c_.heads + h) * kMlaQkDim + j)] =
          encode_e4m3(sum * scales.k_scale_inv);
    } else {
      w_.extend.v[std::size_t((t * c_.heads + h) * kMlaVDim + j - kMlaNopeDim)] =
          encode_e4m3(sum * scales.v_scale_inv);
    }
  });
}

void CpuMlaExecutor::size_extend_qkv() {
  const std::int64_t T = call_->plan.tokens, H = c_.heads;
  const int eb = element_bytes();
  w_.q_attn.resize(std::size_t(T * H * kMlaQkDim * eb));
  w_.extend.tokens = T;
  w_.extend.k.resize(std::size_t(T * H * kMlaQkDim * eb));
  w_.extend.v.resize(std::size_t(T * H * kMlaVDim * eb));
}

void CpuMlaExecutor::prep() {
  const std::int64_t T = call_->plan.tokens;
  size_extend_qkv();
  LatentCacheWrite write;
  write.cache = call_->cache;
  write.slot_mapping =
      TensorView(const_cast<std::int64_t*>(call_->plan.slots.data()), DType::kI64, {T});
  write.scale_inv = call_->options.cache_scale_inv;
  if (call_->path.fp8) {
    prep_fp8(write);
    return;
  }
  assemble_bf16();
  mla_kv_cache_write(TensorView(w_.kv_c.data(), DType::kBF16, {T, c_.kv_lora_rank}),
                     TensorView(w_.k_pe.data(), DType::kBF16, {T, kMlaRopeDim}), write);
}

// The cache row of `slot`, checked: the CUDA executor checks every slot before it runs.
std::uint8_t* CpuMlaExecutor::cache_row(std::int64_t slot) const {
  const TensorView& cache = call_->cache;
  const std::int64_t page_size = cache.size(1), rows = cache.size(0) * page_size;
  if (slot < 0 || slot >= rows) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("MlaLayer::prefill_context_parallel: slot ", slot,
                       " is outside the cache's ", rows, " rows"));
  }
  return cache.data_as<std::uint8_t>() + (slot / page_size) * cache.stride(0) +
         (slot % page_size) * cache.stride(1);
}

// This rank's rows from its cache (written by prep) into its block, padding as zeros.
TensorView CpuMlaExecutor::pack_latent_rows() {
  const MlaBatchPlan& p = call_->plan;
  const std::int64_t n = p.gathered_rows();
  w_.gathered.resize(std::size_t(n * kMlaLatentDim));
  std::uint8_t* block = w_.gathered.data() + p.gather_rank * p.gather_rows_per_rank * kMlaLatentDim;
  for (std::size_t i = 0; i < p.pack_rows.size(); ++i) {
    std::uint8_t* to = block + std::int64_t(i) * kMlaLatentDim;
    if (p.pack_rows[i] < 0) {
      std::memset(to, 0, kMlaLatentDim);
    } else {
      std::memcpy(to, cache_row(p.pack_rows[i]), kMlaLatentDim);
    }
  }
  return TensorView(w_.gathered.data(), DType::kE4M3, {n, kMlaLatentDim});
}

void CpuMlaExecutor::unpack_latent_rows() {
  const MlaBatchPlan& p = call_->plan;
  for (std::size_t j = 0; j < p.unpack_rows.size(); ++j) {
    if (p.unpack_rows[j] >= 0)
      std::memcpy(cache_row(p.unpack_rows[j]), w_.gathered.data() + j * kMlaLatentDim,
                  kMlaLatentDim);
  }
}

// RoPE and e4m3 Q/K, e4m3 V and the cache write: the backend's hook.
void CpuMlaExecutor::prep_fp8(const LatentCacheWrite& write) {
  const MlaBatchPlan& plan = call_->plan;
  const MlaFp8Scales& scales = call_->options.fp8;
  const std::int64_t T = plan.tokens, H = c_.heads, qw = c_.q_width();
  MlaRopeQuantizeArgs a;
  a.q_nope = TensorView(w_.q.data(), DType::kBF16, {T, H, kMlaNopeDim}, {qw, kMlaQkDim, 1});
  a.q_pe =
      TensorView(w_.q.data() + kMlaNopeDim, DType::kBF16, {T, H, kMlaRopeDim}, {qw, kMlaQkDim, 1});
  if (!call_->path.kv_from_projection) a.k_nope = k_nope_of(w_.kv, T);  // else project() wrote it
  a.k_pe = TensorView(w_.kv_a.data() + c_.kv_lora_rank, DType::kBF16, {T, kMlaRopeDim},
                      {kMlaLatentDim, 1});
  a.positions = TensorView(const_cast<std::int64_t*>(plan.positions.data()), DType::kI64, {T});
  a.cos_sin = TensorView(cos_sin_.data(), DType::kF32, {c_.max_position, kMlaRopeDim});
  a.q_scale_inv = scales.q_scale_inv;
  a.k_scale_inv = scales.k_scale_inv;
  a.q_out = TensorView(w_.q_attn.data(), DType::kE4M3, {T, H, kMlaQkDim});
  a.k_out = TensorView(w_.extend.k.data(), DType::kE4M3, {T, H, kMlaQkDim});
  a.cache_write = write;
  a.kv_c = TensorView(w_.kv_c.data(), DType::kBF16, {T, c_.kv_lora_rank});
  PrepareQkvArgs hook;
  hook.qk = a;
  if (!call_->path.kv_from_projection) {
    hook.v = v_of(w_.kv, T);
    hook.v_scale_inv = scales.v_scale_inv;
    hook.v_out = TensorView(w_.extend.v.data(), DType::kE4M3, {T, H, kMlaVDim});
  }
  call_->backend->prepare_prefill_qkv(hook);
}

// The BF16 path's bf16 RoPE of q_pe and k_pe (into w_.k_pe), K = [k_nope | k_pe] and V per head.
void CpuMlaExecutor::assemble_bf16() {
  const MlaBatchPlan& plan = call_->plan;
  const std::int64_t T = plan.tokens, H = c_.heads, qw = c_.q_width(), latent = kMlaLatentDim;
  Bits& k_pe = w_.k_pe;
  k_pe.resize(std::size_t(T * kMlaRopeDim));
  auto* qb = reinterpret_cast<std::uint16_t*>(w_.q_attn.data());
  auto* kb = reinterpret_cast<std::uint16_t*>(w_.extend.k.data());
  auto* vb = reinterpret_cast<std::uint16_t*>(w_.extend.v.data());
  const std::uint16_t* kv = w_.kv.data();
  for (std::int64_t r = 0; r < T; ++r) {
    const float* cs = cos_sin_.data() + plan.positions[std::size_t(r)] * kMlaRopeDim;
    std::memcpy(k_pe.data() + r * kMlaRopeDim, w_.kv_a.data() + r * latent + c_.kv_lora_rank,
                2 * kMlaRopeDim);
    model::rope_bf16(k_pe.data() + r * kMlaRopeDim, cs);
    for (std::int64_t h = 0; h < H; ++h) {
      std::uint16_t* qr = qb + (r * H + h) * kMlaQkDim;
      std::memcpy(qr, w_.q.data() + r * qw + h * kMlaQkDim, 2 * kMlaQkDim);
      model::rope_bf16(qr + kMlaNopeDim, cs);
      std::uint16_t* kr = kb + (r * H + h) * kMlaQkDim;
      std::memcpy(kr, kv + (r * H + h) * 256, 2 * kMlaNopeDim);
      std::memcpy(kr + kMlaNopeDim, k_pe.data() + r * kMlaRopeDim, 2 * kMlaRopeDim);
      std::memcpy(vb + (r * H + h) * kMlaVDim, kv + (r * H + h) * 256 + kMlaNopeDim, 2 * kMlaVDim);
    }
  }
}

MlaActivationAmax CpuMlaExecutor::activation_amax() {
  const std::int64_t T = call_->plan.tokens, H = c_.heads;
  size_extend_qkv();
  assemble_bf16();
  const auto amax = [](const auto& bytes, std::int64_t rows, std::int64_t cols,
                       std::int64_t stride) {
    return model::amax_bf16(reinterpret_cast<const std::uint16_t*>(bytes.data()), rows, cols,
                            stride);
  };
  MlaActivationAmax a;
  a.q = amax(w_.q_attn, T * H, kMlaQkDim, kMlaQkDim);
  a.k = amax(w_.extend.k, T * H, kMlaQkDim, kMlaQkDim);
  a.v = amax(w_.extend.v, T * H, kMlaVDim, kMlaVDim);
  const float kv_c = amax(w_.kv_c, T, c_.kv_lora_rank, c_.kv_lora_rank);
  const float k_pe = amax(w_.k_pe, T, kMlaRopeDim, kMlaRopeDim);
  a.cache = std::isnan(k_pe) ? k_pe : std::max(kv_c, k_pe);  // a NaN in either stays
  return a;
}

// Gathered from the cache, through kv_b, then e4m3 (the backend's pack) or kept bf16.
void CpuMlaExecutor::prefix_keys(std::int64_t first_row, std::int64_t n) {
  const std::span<const std::int64_t> rows =
      std::span(call_->plan.prefix_rows).subspan(std::size_t(first_row), std::size_t(n));
  const std::int64_t H = c_.heads, eb = element_bytes();
  KeysValues& kvp = w_.prefix;
  kvp = {};
  kvp.tokens = n;
  kvp.k.resize(std::size_t(n * H * kMlaQkDim * eb));
  kvp.v.resize(std::size_t(n * H * kMlaVDim * eb));
  if (n == 0) return;
  Bits c_rows(std::size_t(n * c_.kv_lora_rank)), pe(std::size_t(n * kMlaRopeDim)),
      kvb(std::size_t(n * c_.kv_b_width()));
  mla_kv_gather(call_->cache, TensorView(const_cast<std::int64_t*>(rows.data()), DType::kI64, {n}),
                1.0f / call_->options.cache_scale_inv,
                TensorView(c_rows.data(), DType::kBF16, {n, c_.kv_lora_rank}),
                TensorView(pe.data(), DType::kBF16, {n, kMlaRopeDim}));
  kv_b_(c_rows, n, kvb);
  if (call_->path.fp8) {
    MlaKvPackArgs a;
    a.k_nope = k_nope_of(kvb, n);
    a.k_pe = TensorView(pe.data(), DType::kBF16, {n, kMlaRopeDim});
    a.v = v_of(kvb, n);
    a.k_scale_inv = call_->options.fp8.k_scale_inv;
    a.v_scale_inv = call_->options.fp8.v_scale_inv;
    a.k_out = TensorView(kvp.k.data(), DType::kE4M3, {n, H, kMlaQkDim});
    a.v_out = TensorView(kvp.v.data(), DType::kE4M3, {n, H, kMlaVDim});
    call_->backend->pack_prefix_chunk_kv(a);
    return;
  }
  auto* k = reinterpret_cast<std::uint16_t*>(kvp.k.data());
  auto* vv = reinterpret_cast<std::uint16_t*>(kvp.v.data());
  for (std::int64_t r = 0; r < n; ++r) {
    for (std::int64_t h = 0; h < H; ++h) {
      const std::uint16_t* src = kvb.data() + (r * H + h) * 256;
      std::memcpy(k + (r * H + h) * kMlaQkDim, src, 2 * kMlaNopeDim);
      std::memcpy(k + (r * H + h) * kMlaQkDim + kMlaNopeDim, pe.data() + r * kMlaRopeDim,
                  2 * kMlaRopeDim);
      std::memcpy(vv + (r * H + h) * kMlaVDim, src + kMlaNopeDim, 2 * kMlaVDim);
    }
  }
}

void CpuMlaExecutor::assemble_one_shot() {
  const MlaBatchPlan& plan = call_->plan;
  const std::int64_t H = c_.heads, eb = element_bytes();
  const KeysValues &prefix = w_.prefix, &extend = w_.extend;
  KeysValues& all = w_.one_shot;
  all.tokens = prefix.tokens + plan.tokens;
  all.k.resize(std::size_t(all.tokens * H * kMlaQkDim * eb));
  all.v.resize(std::size_t(all.tokens * H * kMlaVDim * eb));
  const std::int64_t krow = H * kMlaQkDim * eb, vrow = H * kMlaVDim * eb;
  std::int64_t at = 0, p_at = 0, e_at = 0;
  // Copies `rows` key/value rows of `from`, starting at row `from_at`, to row `at` of `all`.
  auto append = [&](const KeysValues& from, std::int64_t& from_at, std::int64_t rows) {
    std::memcpy(all.k.data() + at * krow, from.k.data() + from_at * krow, std::size_t(rows * krow));
    std::memcpy(all.v.data() + at * vrow, from.v.data() + from_at * vrow, std::size_t(rows * vrow));
    at += rows;
    from_at += rows;
  };
  for (std::int64_t b = 0; b < plan.sequences; ++b) {
    const std::int64_t e = plan.cu_q[std::size_t(b + 1)] - plan.cu_q[std::size_t(b)];
    append(prefix, p_at,
           plan.cu_k_one_shot[std::size_t(b + 1)] - plan.cu_k_one_shot[std::size_t(b)] - e);
    append(extend, e_at, e);
  }
}

void CpuMlaExecutor::attend(const MlaAttendStep& step) {
  const MlaBatchPlan& plan = call_->plan;
  const std::int64_t T = plan.tokens, H = c_.heads;
  const DType adt = call_->path.attention_dtype;
  const bool chunk = step.keys == MlaKeys::kPrefix;
  const KeysValues& kvs = step.keys == MlaKeys::kExtend ? w_.extend
                          : chunk                       ? w_.prefix
                                                        : w_.one_shot;
  const std::vector<std::int32_t>& cu_k = step.keys == MlaKeys::kExtend ? plan.cu_q
                                          : chunk ? plan.chunks[step.chunk].cu_seqlens_k
                                                  : plan.cu_k_one_shot;
  MlaAttentionTensors t;
  t.q = TensorView(w_.q_attn.data(), adt, {T, H, kMlaQkDim});
  t.k = TensorView(const_cast<std::uint8_t*>(kvs.k.data()), adt, {kvs.tokens, H, kMlaQkDim});
  t.v = TensorView(const_cast<std::uint8_t*>(kvs.v.data()), adt, {kvs.tokens, H, kMlaVDim});
  t.cu_q = plan.cu_q.data();
  t.cu_k = cu_k.data();
  t.descales = descales_;
  const bool separate_chunk = chunk && !step.fold;
  t.out = separate_chunk ? w_.chunk_out.data() : w_.attn.data();
  t.lse = separate_chunk                                  ? w_.chunk_lse.data()
          : step.lse || (step.fold && !step.o_proj_input) ? w_.lse.data()
                                                          : nullptr;
  if (step.fold) {
    t.prior_out = w_.attn.data();
    t.prior_lse = w_.lse.data();
  }
  if (step.o_proj_input && fused()) {
    t.out = w_.o_proj_x.data();
    t.out_scales = o_proj_scales_view();
  }
  call_->backend->prefill_attention(
      mla_attention_args(c_, plan, call_->path, step, t, Device::cpu()));
}

}  // namespace

std::unique_ptr<MlaExecutor> make_cpu_mla_executor(const MlaConfig& config,
                                                   const MlaWeights& weights) {
  return std::make_unique<CpuMlaExecutor>(config, weights);
}

}  // namespace fp8mla
