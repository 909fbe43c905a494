// MlaLayer on the CPU, the reference: the dense steps in model/cpu_math, the attention and the
// FP8 transition through the attention backend, the other MLA ops through fp8mla's public ops
// (their CPU implementations), in the order and at the precision the CUDA layer uses.
#include <chrono>
#include <cstring>

#include "fp8mla/attention.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_prep.hpp"
#include "model/cpu_math.hpp"
#include "model/mla_layer_impl.hpp"

namespace fp8mla {
namespace {

using Bits = std::vector<std::uint16_t>;  // bf16 values
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Keys and values of one attention call: [n, H, 192] and [n, H, 128], e4m3 or bf16 bytes.
struct KeysValues {
  std::vector<std::uint8_t> k, v;
  std::int64_t tokens = 0;
};

// A projection as the CPU runs it: f32 weights, and whether its input is quantized per token
// and group of 128 first (e4m3 weights: the FP8 GEMM's input).
struct CpuProjection {
  std::vector<float> w;
  std::int64_t out = 0, in = 0;
  bool fp8_input = false;

  explicit CpuProjection(const MlaProjection& p)
      : w(model::dequantize(p)),
        out(p.weight.size(0)),
        in(p.weight.size(1)),
        fp8_input(p.weight.dtype() == DType::kE4M3) {}
  CpuProjection() = default;

  void operator()(std::span<const std::uint16_t> x, std::int64_t rows,
                  std::span<std::uint16_t> y) const {
    model::linear(x, rows, in, w, out, y, fp8_input);
  }
};

std::string note(const char* name, const CpuProjection& p) {
  return concat(name, " [", p.out, ", ", p.in, "]: ",
                p.fp8_input ? "fp8 block-scaled GEMM (input quantized per 128-group), f32 math"
                            : "bf16 GEMM, f32 math");
}

class CpuMlaLayer final : public MlaLayer::Impl {
 public:
  CpuMlaLayer(const MlaConfig& config, const MlaWeights& weights) : c_(config), weights_(weights) {
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
  void prefill(const MlaPrefillCall& call) override;

 private:
  MlaConfig c_;
  MlaWeights weights_;  // the norms are read from here
  CpuProjection q_a_, q_b_, q_, kv_a_, kv_b_, o_;
  std::vector<float> cos_sin_;  // [max_position, 64]
  std::vector<std::string> notes_;
};

void CpuMlaLayer::prefill(const MlaPrefillCall& call) {
  const MlaBatchPlan& plan = call.plan;
  const AttentionBackend& backend = call.backend;
  const MlaPrefillOptions& options = call.options;
  const std::int64_t T = plan.tokens, H = c_.heads, B = plan.sequences;
  const bool fp8 = call.path.fp8;
  if (fp8 && backend.capabilities().v_layout != VLayout::kTokenMajor) {
    throw Error(ErrorCategory::kUnsupported,
                concat("MlaLayer::prefill: backend '", backend.capabilities().name,
                       "' packs V transposed; the CPU layer concatenates token-major V"));
  }
  MlaStageTimes t{};
  auto start = Clock::now();

  // ---- projections of the extend tokens ----
  const std::int64_t qw = c_.q_width(), kvw = c_.kv_b_width(), latent = kMlaLatentDim;
  Bits q(std::size_t(T * qw)), kv_a(std::size_t(T * latent)),
      kv_c(std::size_t(T * c_.kv_lora_rank)), kv(std::size_t(T * kvw));
  const std::span<const std::uint16_t> xs(call.hidden.data_as<const std::uint16_t>(),
                                          std::size_t(T * c_.hidden));
  if (c_.q_lora_rank > 0) {
    Bits qa(std::size_t(T * c_.q_lora_rank)), qa_n(qa.size());
    q_a_(xs, T, qa);
    model::rms_norm(qa.data(), T, c_.q_lora_rank, c_.q_lora_rank, weights_.q_a_layernorm,
                    c_.rms_norm_eps, qa_n.data());
    q_b_(qa_n, T, q);
  } else {
    q_(xs, T, q);
  }
  kv_a_(xs, T, kv_a);
  model::rms_norm(kv_a.data(), T, c_.kv_lora_rank, latent, weights_.kv_a_layernorm, c_.rms_norm_eps,
                  kv_c.data());
  kv_b_(kv_c, T, kv);
  t.projections = ms_since(start);

  const DType attn_dtype = call.path.attention_dtype;
  const int eb = fp8 ? 1 : 2;
  const float cache_scale = 1.0f / options.cache_scale_inv;
  const MlaFp8Scales& scales = options.fp8;

  // Views into the [n, H, 256] kv_b output.
  auto kv_views = [&](Bits& kvb, std::int64_t n, TensorView& k_nope, TensorView& v) {
    k_nope = TensorView(kvb.data(), DType::kBF16, {n, H, kMlaNopeDim}, {H * 256, 256, 1});
    v = TensorView(kvb.data() + kMlaNopeDim, DType::kBF16, {n, H, kMlaVDim}, {H * 256, 256, 1});
  };
  // Prefix keys of cache `rows`: gathered, through kv_b, then e4m3 (pack) or kept bf16.
  auto prefix_keys = [&](std::span<const std::int64_t> rows) {
    KeysValues kvp;
    const std::int64_t n = std::int64_t(rows.size());
    kvp.tokens = n;
    kvp.k.resize(std::size_t(n * H * kMlaQkDim * eb));
    kvp.v.resize(std::size_t(n * H * kMlaVDim * eb));
    if (n == 0) return kvp;
    Bits c_rows(std::size_t(n * c_.kv_lora_rank)), pe(std::size_t(n * kMlaRopeDim)),
        kvb(std::size_t(n * kvw));
    mla_kv_gather(call.cache, TensorView(const_cast<std::int64_t*>(rows.data()), DType::kI64, {n}),
                  cache_scale, TensorView(c_rows.data(), DType::kBF16, {n, c_.kv_lora_rank}),
                  TensorView(pe.data(), DType::kBF16, {n, kMlaRopeDim}));
    kv_b_(c_rows, n, kvb);
    TensorView k_nope, v;
    kv_views(kvb, n, k_nope, v);
    if (fp8) {
      MlaKvPackArgs a;
      a.k_nope = k_nope;
      a.k_pe = TensorView(pe.data(), DType::kBF16, {n, kMlaRopeDim});
      a.v = v;
      a.k_scale_inv = scales.k_scale_inv;
      a.v_scale_inv = scales.v_scale_inv;
      a.k_out = TensorView(kvp.k.data(), DType::kE4M3, {n, H, kMlaQkDim});
      a.v_out = TensorView(kvp.v.data(), DType::kE4M3, {n, H, kMlaVDim});
      backend.pack_prefix_chunk_kv(a);
      return kvp;
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
    return kvp;
  };

  // ---- prep: RoPE, FP8 Q/K/V (FP8 path) or bf16 RoPE (BF16 path), latent cache write ----
  start = Clock::now();
  std::vector<std::uint8_t> q_attn(std::size_t(T * H * kMlaQkDim * eb));
  KeysValues extend;
  extend.tokens = T;
  extend.k.resize(std::size_t(T * H * kMlaQkDim * eb));
  extend.v.resize(std::size_t(T * H * kMlaVDim * eb));
  TensorView k_nope, v;
  kv_views(kv, T, k_nope, v);
  const TensorView kv_c_view(kv_c.data(), DType::kBF16, {T, c_.kv_lora_rank});
  LatentCacheWrite write;
  write.cache = call.cache;
  write.slot_mapping = TensorView(const_cast<std::int64_t*>(plan.slots.data()), DType::kI64, {T});
  write.scale_inv = options.cache_scale_inv;
  if (fp8) {
    MlaRopeQuantizeArgs a;
    a.q_nope = TensorView(q.data(), DType::kBF16, {T, H, kMlaNopeDim}, {qw, kMlaQkDim, 1});
    a.q_pe =
        TensorView(q.data() + kMlaNopeDim, DType::kBF16, {T, H, kMlaRopeDim}, {qw, kMlaQkDim, 1});
    a.k_nope = k_nope;
    a.k_pe = TensorView(kv_a.data() + c_.kv_lora_rank, DType::kBF16, {T, kMlaRopeDim}, {latent, 1});
    a.positions = TensorView(const_cast<std::int64_t*>(plan.positions.data()), DType::kI64, {T});
    a.cos_sin = TensorView(cos_sin_.data(), DType::kF32, {c_.max_position, kMlaRopeDim});
    a.q_scale_inv = scales.q_scale_inv;
    a.k_scale_inv = scales.k_scale_inv;
    a.q_out = TensorView(q_attn.data(), DType::kE4M3, {T, H, kMlaQkDim});
    a.k_out = TensorView(extend.k.data(), DType::kE4M3, {T, H, kMlaQkDim});
    a.cache_write = write;
    a.kv_c = kv_c_view;
    PrepareQkvArgs hook;
    hook.qk = a;
    hook.v = v;
    hook.v_scale_inv = scales.v_scale_inv;
    hook.v_out = TensorView(extend.v.data(), DType::kE4M3, {T, H, kMlaVDim});
    backend.prepare_prefill_qkv(hook);
  } else {
    Bits k_pe(std::size_t(T * kMlaRopeDim));
    auto* qb = reinterpret_cast<std::uint16_t*>(q_attn.data());
    auto* kb = reinterpret_cast<std::uint16_t*>(extend.k.data());
    auto* vb = reinterpret_cast<std::uint16_t*>(extend.v.data());
    for (std::int64_t r = 0; r < T; ++r) {
      const float* cs = cos_sin_.data() + plan.positions[std::size_t(r)] * kMlaRopeDim;
      std::memcpy(k_pe.data() + r * kMlaRopeDim, kv_a.data() + r * latent + c_.kv_lora_rank,
                  2 * kMlaRopeDim);
      model::rope_bf16(k_pe.data() + r * kMlaRopeDim, cs);
      for (std::int64_t h = 0; h < H; ++h) {
        std::uint16_t* qr = qb + (r * H + h) * kMlaQkDim;
        std::memcpy(qr, q.data() + r * qw + h * kMlaQkDim, 2 * kMlaQkDim);
        model::rope_bf16(qr + kMlaNopeDim, cs);
        std::uint16_t* kr = kb + (r * H + h) * kMlaQkDim;
        std::memcpy(kr, kv.data() + (r * H + h) * 256, 2 * kMlaNopeDim);
        std::memcpy(kr + kMlaNopeDim, k_pe.data() + r * kMlaRopeDim, 2 * kMlaRopeDim);
        std::memcpy(vb + (r * H + h) * kMlaVDim, kv.data() + (r * H + h) * 256 + kMlaNopeDim,
                    2 * kMlaVDim);
      }
    }
    mla_kv_cache_write(kv_c_view, TensorView(k_pe.data(), DType::kBF16, {T, kMlaRopeDim}), write);
  }
  t.prep = ms_since(start);

  // ---- attention ----
  Bits attn(std::size_t(T * H * kMlaVDim));
  std::vector<float> lse(std::size_t(T * H));
  float descales[3] = {1.0f / scales.q_scale_inv, 1.0f / scales.k_scale_inv,
                       1.0f / scales.v_scale_inv};
  // One call: the queries against keys `kvs` laid out per cu_k.
  auto attend = [&](const KeysValues& kvs, const std::vector<std::int32_t>& cu_k,
                    std::int32_t max_k, bool causal, Bits& o, std::vector<float>* lse_out) {
    PrefillAttentionArgs a;
    a.q = TensorView(q_attn.data(), attn_dtype, {T, H, kMlaQkDim});
    a.k =
        TensorView(const_cast<std::uint8_t*>(kvs.k.data()), attn_dtype, {kvs.tokens, H, kMlaQkDim});
    a.v =
        TensorView(const_cast<std::uint8_t*>(kvs.v.data()), attn_dtype, {kvs.tokens, H, kMlaVDim});
    a.cu_seqlens_q = TensorView(const_cast<std::int32_t*>(plan.cu_q.data()), DType::kI32, {B + 1});
    a.cu_seqlens_k = TensorView(const_cast<std::int32_t*>(cu_k.data()), DType::kI32, {B + 1});
    a.max_seqlen_q = plan.max_q;
    a.max_seqlen_k = max_k;
    a.softmax_scale = float(c_.softmax_scale());
    a.causal = causal;
    if (fp8) {
      a.q_descale = TensorView(&descales[0], DType::kF32, {1});
      a.k_descale = TensorView(&descales[1], DType::kF32, {1});
      a.v_descale = TensorView(&descales[2], DType::kF32, {1});
    }
    a.out = TensorView(o.data(), DType::kBF16, {T, H, kMlaVDim});
    if (lse_out != nullptr) a.lse = TensorView(lse_out->data(), DType::kF32, {T, H});
    backend.prefill_attention(a);
  };
  if (!plan.chunked) {
    start = Clock::now();
    const KeysValues prefix = prefix_keys(plan.prefix_rows);
    t.prefix = ms_since(start);
    start = Clock::now();
    // Per sequence: its prefix keys, then its extend keys.
    KeysValues all;
    all.tokens = prefix.tokens + T;
    all.k.resize(std::size_t(all.tokens * H * kMlaQkDim * eb));
    all.v.resize(std::size_t(all.tokens * H * kMlaVDim * eb));
    const std::int64_t krow = H * kMlaQkDim * eb, vrow = H * kMlaVDim * eb;
    std::int64_t at = 0, p_at = 0, e_at = 0;
    // Copies `rows` key/value rows of `from`, starting at row `from_at`, to row `at` of `all`.
    auto append = [&](const KeysValues& from, std::int64_t& from_at, std::int64_t rows) {
      std::memcpy(all.k.data() + at * krow, from.k.data() + from_at * krow,
                  std::size_t(rows * krow));
      std::memcpy(all.v.data() + at * vrow, from.v.data() + from_at * vrow,
                  std::size_t(rows * vrow));
      at += rows;
      from_at += rows;
    };
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t e = plan.cu_q[std::size_t(b + 1)] - plan.cu_q[std::size_t(b)];
      append(prefix, p_at,
             plan.cu_k_one_shot[std::size_t(b + 1)] - plan.cu_k_one_shot[std::size_t(b)] - e);
      append(extend, e_at, e);
    }
    attend(all, plan.cu_k_one_shot, plan.max_k_one_shot, true, attn, nullptr);
    t.attention = ms_since(start);
  } else {
    start = Clock::now();
    attend(extend, plan.cu_q, plan.max_q, true, attn, &lse);
    t.attention = ms_since(start);
    Bits chunk_out(attn.size());
    std::vector<float> chunk_lse(lse.size());
    for (std::size_t i = 0; i < plan.chunks.size(); ++i) {
      const PrefixChunk& chunk = plan.chunks[i];
      start = Clock::now();
      const KeysValues keys = prefix_keys(
          std::span(plan.prefix_rows)
              .subspan(std::size_t(plan.chunk_first_row[i]), std::size_t(chunk.keys())));
      t.prefix += ms_since(start);
      start = Clock::now();
      attend(keys, chunk.cu_seqlens_k, chunk.max_seqlen_k, false, chunk_out, &chunk_lse);
      t.attention += ms_since(start);
      start = Clock::now();
      merge_attention_states_inplace(TensorView(attn.data(), DType::kBF16, {T, H, kMlaVDim}),
                                     TensorView(lse.data(), DType::kF32, {T, H}),
                                     TensorView(chunk_out.data(), DType::kBF16, {T, H, kMlaVDim}),
                                     TensorView(chunk_lse.data(), DType::kF32, {T, H}));
      t.merge += ms_since(start);
    }
  }

  // ---- o_proj ----
  start = Clock::now();
  o_(attn, T,
     std::span<std::uint16_t>(call.out.data_as<std::uint16_t>(), std::size_t(T * c_.hidden)));
  t.output = ms_since(start);
  if (call.times != nullptr) *call.times = t;
}

}  // namespace

std::unique_ptr<MlaLayer::Impl> make_cpu_mla_layer(const MlaConfig& config,
                                                   const MlaWeights& weights) {
  return std::make_unique<CpuMlaLayer>(config, weights);
}

}  // namespace fp8mla
