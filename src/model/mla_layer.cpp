// MlaLayer on the CPU: the dense steps in model/cpu_math, the attention and the FP8 transition
// through the attention backend, the other MLA ops through fp8mla's public ops (their CPU
// implementations), in the order and at the precision the GPU path will use.
#include "fp8mla/mla_layer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "fp8mla/attention.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_prep.hpp"
#include "fp8mla/numerics.hpp"
#include "model/cpu_math.hpp"
#include "model/prefix_chunks.hpp"

namespace fp8mla {
namespace {

using Bits = std::vector<std::uint16_t>;  // bf16 values
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// The per-tensor scale_inv that maps amax to the top of e4m3 (1 for an all-zero tensor).
float scale_inv_for(float amax) {
  return amax > 0.0f ? 448.0f / amax : 1.0f;
}

float amax_bf16(const std::uint16_t* x, std::int64_t rows, std::int64_t width,
                std::int64_t stride) {
  float m = 0.0f;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t i = 0; i < width; ++i)
      m = std::max(m, std::fabs(decode_bf16(x[r * stride + i])));
  }
  return m;
}

// Keys and values of one attention call: [n, H, 192] and [n, H, 128], e4m3 or bf16 bytes, with
// their descales (1 for bf16).
struct KeysValues {
  std::vector<std::uint8_t> k, v;
  float k_descale = 1.0f, v_descale = 1.0f;
  std::int64_t tokens = 0;
};

}  // namespace

std::int64_t MlaBatch::extend_tokens() const {
  std::int64_t n = 0;
  for (const MlaSequence& s : sequences) n += s.extend;
  return n;
}

struct MlaLayer::Impl {
  MlaWeights weights;  // the norms are read from here
  std::vector<float> q_a, q_b, q, kv_a, kv_b, o;
  std::vector<float> cos_sin;  // [max_position, 64]
};

MlaLayer::MlaLayer(MlaConfig config, const MlaWeights& weights)
    : config_(std::move(config)), impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.weights = weights;
  if (config_.q_lora_rank > 0) {
    m.q_a = model::dequantize(weights.q_a_proj);
    m.q_b = model::dequantize(weights.q_b_proj);
  } else {
    m.q = model::dequantize(weights.q_proj);
  }
  m.kv_a = model::dequantize(weights.kv_a_proj_with_mqa);
  m.kv_b = model::dequantize(weights.kv_b_proj);
  m.o = model::dequantize(weights.o_proj);
  m.cos_sin.resize(std::size_t(config_.max_position * kMlaRopeDim));
  make_cos_sin_cache(TensorView(m.cos_sin.data(), DType::kF32, {config_.max_position, kMlaRopeDim}),
                     config_.rope);
}

MlaLayer::~MlaLayer() = default;
MlaLayer::MlaLayer(MlaLayer&&) noexcept = default;
MlaLayer& MlaLayer::operator=(MlaLayer&&) noexcept = default;

void MlaLayer::prefill(const TensorView& hidden, const MlaBatch& batch, const TensorView& cache,
                       const AttentionBackend& backend, const MlaPrefillOptions& options,
                       const TensorView& out, MlaStageTimes* times) const {
  const MlaConfig& c = config_;
  const Impl& m = *impl_;
  const std::int64_t T = batch.extend_tokens(), H = c.heads,
                     B = std::int64_t(batch.sequences.size());
  const auto require = [](bool ok, const std::string& what) {
    if (!ok) throw Error(ErrorCategory::kInvalidArgument, concat("MlaLayer::prefill: ", what));
  };
  for (const TensorView* t : {&hidden, &cache, &out}) {
    if (t->device().is_cuda()) {
      throw Error(ErrorCategory::kUnsupported,
                  concat("MlaLayer::prefill: this build runs the layer on the CPU only; got ",
                         t->describe()));
    }
  }
  require(hidden.dtype() == DType::kBF16 && hidden.ndim() == 2 && hidden.size(0) == T &&
              hidden.size(1) == c.hidden && hidden.is_contiguous(),
          concat("expected `hidden` contiguous bf16 [", T, ", ", c.hidden, "] (T = the batch's ",
                 "extend tokens), got ", hidden.describe()));
  require(out.dtype() == DType::kBF16 && out.ndim() == 2 && out.size(0) == T &&
              out.size(1) == c.hidden && out.is_contiguous(),
          concat("expected `out` contiguous bf16 [", T, ", ", c.hidden, "], got ", out.describe()));
  for (std::int64_t b = 0; b < B; ++b) {
    const MlaSequence& s = batch.sequences[std::size_t(b)];
    require(s.prefix >= 0 && s.extend >= 0 && std::int64_t(s.slots.size()) == s.prefix + s.extend &&
                s.prefix + s.extend <= c.max_position,
            concat("sequence ", b, ": expected prefix, extend >= 0, prefix + extend <= ",
                   c.max_position, " and that many slots; got prefix ", s.prefix, ", extend ",
                   s.extend, ", ", s.slots.size(), " slots"));
  }
  MlaStageTimes t{};
  auto start = Clock::now();

  // ---- projections of the extend tokens ----
  const auto* x = hidden.data_as<const std::uint16_t>();
  const std::int64_t qw = c.q_width(), kvw = c.kv_b_width(), latent = kMlaLatentDim;
  Bits q(std::size_t(T * qw)), kv_a(std::size_t(T * latent)), kv_c(std::size_t(T * c.kv_lora_rank)),
      kv(std::size_t(T * kvw));
  const std::span<const std::uint16_t> xs(x, std::size_t(T * c.hidden));
  if (c.q_lora_rank > 0) {
    Bits qa(std::size_t(T * c.q_lora_rank)), qa_n(qa.size());
    model::linear(xs, T, c.hidden, m.q_a, c.q_lora_rank, qa);
    model::rms_norm(qa.data(), T, c.q_lora_rank, c.q_lora_rank, m.weights.q_a_layernorm,
                    c.rms_norm_eps, qa_n.data());
    model::linear(qa_n, T, c.q_lora_rank, m.q_b, qw, q);
  } else {
    model::linear(xs, T, c.hidden, m.q, qw, q);
  }
  model::linear(xs, T, c.hidden, m.kv_a, latent, kv_a);
  model::rms_norm(kv_a.data(), T, c.kv_lora_rank, latent, m.weights.kv_a_layernorm, c.rms_norm_eps,
                  kv_c.data());
  model::linear(kv_c, T, c.kv_lora_rank, m.kv_b, kvw, kv);
  t.projections = ms_since(start);

  // Positions and slots of the extend tokens; offsets of queries.
  std::vector<std::int64_t> positions, slots;
  std::vector<std::int32_t> cu_q{0};  // the queries' offsets, also the extend keys' offsets
  std::vector<std::int64_t> prefix_lens;
  for (const MlaSequence& s : batch.sequences) {
    for (std::int64_t i = 0; i < s.extend; ++i) {
      positions.push_back(s.prefix + i);
      slots.push_back(s.slots[std::size_t(s.prefix + i)]);
    }
    cu_q.push_back(cu_q.back() + std::int32_t(s.extend));
    prefix_lens.push_back(s.prefix);
  }
  const TensorView positions_view(positions.data(), DType::kI64, {T});
  const TensorView cos_sin(const_cast<float*>(m.cos_sin.data()), DType::kF32,
                           {c.max_position, kMlaRopeDim});
  // The backend decides the path; it must serve everything the path asks of it.
  const BackendCapabilities& caps = backend.capabilities();
  const bool fp8 = caps.prepare_prefill_qkv;
  BackendRequirements required;
  required.attention_dtype = fp8 ? DType::kE4M3 : DType::kBF16;
  required.page_size = int(cache.ndim() == 3 ? cache.size(1) : 0);
  required.prepare_prefill_qkv = fp8;
  required.pack_prefix_chunk_kv = fp8;
  check_backend(caps, required, hidden.device());
  if (fp8 && caps.v_layout != VLayout::kTokenMajor) {
    throw Error(ErrorCategory::kUnsupported,
                concat("MlaLayer::prefill: backend '", caps.name,
                       "' packs V transposed; this version of the layer concatenates token-major "
                       "V"));
  }
  const DType attn_dtype = fp8 ? DType::kE4M3 : DType::kBF16;
  const int eb = fp8 ? 1 : 2;
  const float cache_scale = 1.0f / options.cache_scale_inv;

  // Views into the [T, H, 256] kv_b output and the [T, 576] latent.
  auto kv_views = [&](Bits& kvb, std::int64_t n, TensorView& k_nope, TensorView& v) {
    k_nope = TensorView(kvb.data(), DType::kBF16, {n, H, kMlaNopeDim}, {H * 256, 256, 1});
    v = TensorView(kvb.data() + kMlaNopeDim, DType::kBF16, {n, H, kMlaVDim}, {H * 256, 256, 1});
  };
  // Prefix keys: latent rows gathered from the cache, through kv_b (bf16), then e4m3 with the
  // given scales (pack) or kept bf16.
  struct PrefixRows {
    Bits kvb, pe;  // [n, H * 256], [n, 64]
    std::int64_t n = 0, heads = 0;
    float k_amax() const {
      return std::max(amax_bf16(kvb.data(), n * heads, kMlaNopeDim, 256),
                      amax_bf16(pe.data(), n, kMlaRopeDim, kMlaRopeDim));
    }
    float v_amax() const { return amax_bf16(kvb.data() + kMlaNopeDim, n * heads, kMlaVDim, 256); }
  };
  auto gather_prefix = [&](std::vector<std::int64_t> rows) {
    PrefixRows p;
    p.n = std::int64_t(rows.size());
    p.heads = H;
    p.kvb.resize(std::size_t(p.n * kvw));
    p.pe.resize(std::size_t(p.n * kMlaRopeDim));
    if (p.n == 0) return p;
    Bits c_rows(std::size_t(p.n * c.kv_lora_rank));
    mla_kv_gather(cache, TensorView(rows.data(), DType::kI64, {p.n}), cache_scale,
                  TensorView(c_rows.data(), DType::kBF16, {p.n, c.kv_lora_rank}),
                  TensorView(p.pe.data(), DType::kBF16, {p.n, kMlaRopeDim}));
    model::linear(c_rows, p.n, c.kv_lora_rank, m.kv_b, kvw, p.kvb);
    return p;
  };
  auto prefix_keys = [&](PrefixRows& p, float k_scale_inv, float v_scale_inv) {
    KeysValues kvp;
    const std::int64_t n = p.n;
    kvp.tokens = n;
    kvp.k.resize(std::size_t(n * H * kMlaQkDim * eb));
    kvp.v.resize(std::size_t(n * H * kMlaVDim * eb));
    if (n == 0) return kvp;
    if (fp8) {
      TensorView k_nope, v;
      kv_views(p.kvb, n, k_nope, v);
      MlaKvPackArgs a;
      a.k_nope = k_nope;
      a.k_pe = TensorView(p.pe.data(), DType::kBF16, {n, kMlaRopeDim});
      a.v = v;
      a.k_scale_inv = k_scale_inv;
      a.v_scale_inv = v_scale_inv;
      a.k_out = TensorView(kvp.k.data(), DType::kE4M3, {n, H, kMlaQkDim});
      a.v_out = TensorView(kvp.v.data(), DType::kE4M3, {n, H, kMlaVDim});
      backend.pack_prefix_chunk_kv(a);
      kvp.k_descale = 1.0f / k_scale_inv;
      kvp.v_descale = 1.0f / v_scale_inv;
      return kvp;
    }
    auto* k = reinterpret_cast<std::uint16_t*>(kvp.k.data());
    auto* vv = reinterpret_cast<std::uint16_t*>(kvp.v.data());
    for (std::int64_t r = 0; r < n; ++r) {
      for (std::int64_t h = 0; h < H; ++h) {
        const std::uint16_t* src = p.kvb.data() + (r * H + h) * 256;
        std::memcpy(k + (r * H + h) * kMlaQkDim, src, 2 * kMlaNopeDim);
        std::memcpy(k + (r * H + h) * kMlaQkDim + kMlaNopeDim, p.pe.data() + r * kMlaRopeDim,
                    2 * kMlaRopeDim);
        std::memcpy(vv + (r * H + h) * kMlaVDim, src + kMlaNopeDim, 2 * kMlaVDim);
      }
    }
    return kvp;
  };

  // ---- prefix rows, one-shot: every prefix row, in sequence order ----
  start = Clock::now();
  std::vector<std::int64_t> all_prefix_rows;
  for (const MlaSequence& s : batch.sequences) {
    all_prefix_rows.insert(all_prefix_rows.end(), s.slots.begin(), s.slots.begin() + s.prefix);
  }
  const bool chunked = std::int64_t(all_prefix_rows.size()) > options.one_shot_max_prefix;
  PrefixRows one_shot_rows = chunked ? PrefixRows{} : gather_prefix(all_prefix_rows);
  t.prefix = ms_since(start);

  // ---- prep: RoPE, FP8 Q/K/V (FP8 path) or bf16 RoPE (BF16 path), latent cache write ----
  start = Clock::now();
  std::vector<std::uint8_t> q_attn(std::size_t(T * H * kMlaQkDim * eb));
  KeysValues extend;
  extend.tokens = T;
  extend.k.resize(std::size_t(T * H * kMlaQkDim * eb));
  extend.v.resize(std::size_t(T * H * kMlaVDim * eb));
  float q_descale = 1.0f;
  TensorView k_nope, v;
  kv_views(kv, T, k_nope, v);
  const TensorView q_nope(q.data(), DType::kBF16, {T, H, kMlaNopeDim}, {qw, kMlaQkDim, 1});
  const TensorView q_pe(q.data() + kMlaNopeDim, DType::kBF16, {T, H, kMlaRopeDim},
                        {qw, kMlaQkDim, 1});
  const TensorView kv_c_view(kv_c.data(), DType::kBF16, {T, c.kv_lora_rank});
  const TensorView k_pe_raw(kv_a.data() + c.kv_lora_rank, DType::kBF16, {T, kMlaRopeDim},
                            {latent, 1});
  LatentCacheWrite write;
  write.cache = cache;
  write.slot_mapping = TensorView(slots.data(), DType::kI64, {T});
  write.scale_inv = options.cache_scale_inv;
  if (fp8) {
    // Per-tensor scales over what each attention call reads (RoPE keeps a pair's norm, so a
    // rotated element is at most sqrt(2) x the pair's larger one).
    const float q_amax = amax_bf16(q.data(), T, qw, qw) * std::sqrt(2.0f);
    float k_amax =
        std::max(amax_bf16(kv.data(), T * H, kMlaNopeDim, 256),
                 amax_bf16(kv_a.data() + c.kv_lora_rank, T, kMlaRopeDim, latent) * std::sqrt(2.0f));
    float v_amax = amax_bf16(kv.data() + kMlaNopeDim, T * H, kMlaVDim, 256);
    if (!chunked) {  // one-shot: extend and prefix keys are one tensor, with one scale each
      k_amax = std::max(k_amax, one_shot_rows.k_amax());
      v_amax = std::max(v_amax, one_shot_rows.v_amax());
    }
    MlaRopeQuantizeArgs a;
    a.q_nope = q_nope;
    a.q_pe = q_pe;
    a.k_nope = k_nope;
    a.k_pe = k_pe_raw;
    a.positions = positions_view;
    a.cos_sin = cos_sin;
    a.q_scale_inv = scale_inv_for(q_amax);
    a.k_scale_inv = scale_inv_for(k_amax);
    a.q_out = TensorView(q_attn.data(), DType::kE4M3, {T, H, kMlaQkDim});
    a.k_out = TensorView(extend.k.data(), DType::kE4M3, {T, H, kMlaQkDim});
    a.cache_write = write;
    a.kv_c = kv_c_view;
    PrepareQkvArgs hook;
    hook.qk = a;
    hook.v = v;
    hook.v_scale_inv = scale_inv_for(v_amax);
    hook.v_out = TensorView(extend.v.data(), DType::kE4M3, {T, H, kMlaVDim});
    backend.prepare_prefill_qkv(hook);
    q_descale = 1.0f / a.q_scale_inv;
    extend.k_descale = 1.0f / a.k_scale_inv;
    extend.v_descale = 1.0f / hook.v_scale_inv;
  } else {
    Bits k_pe(std::size_t(T * kMlaRopeDim));
    auto* qb = reinterpret_cast<std::uint16_t*>(q_attn.data());
    auto* kb = reinterpret_cast<std::uint16_t*>(extend.k.data());
    auto* vb = reinterpret_cast<std::uint16_t*>(extend.v.data());
    for (std::int64_t r = 0; r < T; ++r) {
      const float* cs = m.cos_sin.data() + positions[std::size_t(r)] * kMlaRopeDim;
      std::memcpy(k_pe.data() + r * kMlaRopeDim, kv_a.data() + r * latent + c.kv_lora_rank,
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
  start = Clock::now();
  const KeysValues prefix =
      prefix_keys(one_shot_rows, 1.0f / extend.k_descale, 1.0f / extend.v_descale);
  t.prefix += ms_since(start);

  // ---- attention ----
  Bits attn(std::size_t(T * H * kMlaVDim));
  std::vector<float> lse(std::size_t(T * H));
  const TensorView cu_q_view(cu_q.data(), DType::kI32, {B + 1});
  std::int32_t max_q = 0;
  for (const MlaSequence& s : batch.sequences) max_q = std::max(max_q, std::int32_t(s.extend));
  const float q_descale_value = q_descale;
  // One call: queries against keys `kvs` laid out per cu_k.
  auto attend = [&](const KeysValues& kvs, const std::vector<std::int32_t>& cu_k, bool causal,
                    Bits& o, std::vector<float>* lse_out) {
    std::int32_t max_k = 0;
    for (std::size_t b = 0; b + 1 < cu_k.size(); ++b)
      max_k = std::max(max_k, cu_k[b + 1] - cu_k[b]);
    float descales[3] = {q_descale_value, kvs.k_descale, kvs.v_descale};
    PrefillAttentionArgs a;
    a.q = TensorView(q_attn.data(), attn_dtype, {T, H, kMlaQkDim});
    a.k =
        TensorView(const_cast<std::uint8_t*>(kvs.k.data()), attn_dtype, {kvs.tokens, H, kMlaQkDim});
    a.v =
        TensorView(const_cast<std::uint8_t*>(kvs.v.data()), attn_dtype, {kvs.tokens, H, kMlaVDim});
    a.cu_seqlens_q = cu_q_view;
    a.cu_seqlens_k = TensorView(const_cast<std::int32_t*>(cu_k.data()), DType::kI32, {B + 1});
    a.max_seqlen_q = max_q;
    a.max_seqlen_k = max_k;
    a.softmax_scale = float(c.softmax_scale());
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
  start = Clock::now();
  if (!chunked) {
    // Per sequence: its prefix keys, then its extend keys.
    KeysValues all;
    all.tokens = prefix.tokens + T;
    all.k.resize(std::size_t(all.tokens * H * kMlaQkDim * eb));
    all.v.resize(std::size_t(all.tokens * H * kMlaVDim * eb));
    all.k_descale = extend.k_descale;
    all.v_descale = extend.v_descale;
    std::vector<std::int32_t> cu_k{0};
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
    for (const MlaSequence& s : batch.sequences) {
      append(prefix, p_at, s.prefix);
      append(extend, e_at, s.extend);
      cu_k.push_back(std::int32_t(at));
    }
    attend(all, cu_k, true, attn, nullptr);
    t.attention = ms_since(start);
  } else {
    attend(extend, cu_q, true, attn, &lse);
    t.attention = ms_since(start);
    Bits chunk_out(attn.size());
    std::vector<float> chunk_lse(lse.size());
    for (const PrefixChunk& chunk : plan_prefix_chunks(prefix_lens, options.chunk_capacity)) {
      start = Clock::now();
      std::vector<std::int64_t> rows;
      for (std::int64_t b = 0; b < B; ++b) {
        const MlaSequence& s = batch.sequences[std::size_t(b)];
        const std::int64_t n =
            chunk.cu_seqlens_k[std::size_t(b + 1)] - chunk.cu_seqlens_k[std::size_t(b)];
        const auto first = s.slots.begin() + chunk.first_token[std::size_t(b)];
        rows.insert(rows.end(), first, first + n);
      }
      PrefixRows chunk_rows = gather_prefix(rows);
      const KeysValues keys = prefix_keys(chunk_rows, scale_inv_for(chunk_rows.k_amax()),
                                          scale_inv_for(chunk_rows.v_amax()));
      t.prefix += ms_since(start);
      start = Clock::now();
      attend(keys, chunk.cu_seqlens_k, false, chunk_out, &chunk_lse);
      t.attention += ms_since(start);
      start = Clock::now();
      const TensorView o(attn.data(), DType::kBF16, {T, H, kMlaVDim});
      const TensorView l(lse.data(), DType::kF32, {T, H});
      merge_attention_states_inplace(o, l,
                                     TensorView(chunk_out.data(), DType::kBF16, {T, H, kMlaVDim}),
                                     TensorView(chunk_lse.data(), DType::kF32, {T, H}));
      t.merge += ms_since(start);
    }
  }

  // ---- o_proj ----
  start = Clock::now();
  model::linear(attn, T, c.o_width(), m.o, c.hidden,
                std::span<std::uint16_t>(out.data_as<std::uint16_t>(), std::size_t(T * c.hidden)));
  t.output = ms_since(start);
  if (times != nullptr) *times = t;
}

}  // namespace fp8mla
