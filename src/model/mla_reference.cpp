// mla_prefill_reference (fp8mla/mla_layer.hpp): the layer's math in float64, token by token.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/parallel_for.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_layer.hpp"
#include "fp8mla/numerics.hpp"
#include "model/cpu_math.hpp"

namespace fp8mla {
namespace {

using Vec = std::vector<double>;

// x quantized to e4m3 per group of 128 (s = amax / 448, q = e4m3(x / s)) and dequantized: the
// input an e4m3-weight projection sees in DeepSeek's FP8 recipe, part of the model it defines.
Vec quantize_groups(const Vec& x) {
  Vec y(x.size());
  for (std::size_t g = 0; g < x.size(); g += kWeightBlock) {
    const std::size_t end = std::min(x.size(), g + std::size_t(kWeightBlock));
    double amax = 1e-10;
    for (std::size_t i = g; i < end; ++i) amax = std::max(amax, std::fabs(x[i]));
    const double s = amax / 448.0;
    for (std::size_t i = g; i < end; ++i)
      y[i] = double(decode_e4m3(encode_e4m3(float(x[i] / s)))) * s;
  }
  return y;
}

// n rows of `width` zeros.
std::vector<Vec> zero_rows(std::int64_t n, std::int64_t width) {
  return std::vector<Vec>(std::size_t(n), Vec(std::size_t(width), 0.0));
}

struct Matrix {
  std::vector<float> w;  // [out, in]
  std::int64_t out = 0, in = 0;
  bool fp8_input = false;
  // y[t][o] = sum_i w[o, i] x[t][i] for each row t of xs, over i in order, four rows at a time
  // through model::gemm_four_rows (each weight row read once for four rows).
  std::vector<Vec> apply(std::vector<Vec> xs) const {
    const std::int64_t n = std::int64_t(xs.size());
    if (fp8_input) {
      for (Vec& x : xs) x = quantize_groups(x);
    }
    std::vector<Vec> ys = zero_rows(n, out);
    std::vector<double> x(std::size_t(in * 4));  // x[i * 4 + j]
    for (std::int64_t t0 = 0; t0 < n; t0 += 4) {
      const std::int64_t rows = std::min<std::int64_t>(4, n - t0);
      for (std::int64_t j = 0; j < 4; ++j) {
        const Vec& row = xs[std::size_t(t0 + std::min(j, rows - 1))];  // past n: unused
        for (std::int64_t i = 0; i < in; ++i) x[std::size_t(i * 4 + j)] = row[std::size_t(i)];
      }
      model::gemm_four_rows(x.data(), in, w.data(), out, rows,
                            [&](std::int64_t j, std::int64_t o, double v) {
                              ys[std::size_t(t0 + j)][std::size_t(o)] = v;
                            });
    }
    return ys;
  }
};

Matrix matrix(const MlaProjection& p) {
  return {model::dequantize(p), p.weight.size(0), p.weight.size(1), model::quantizes_input(p)};
}

Vec rms_norm(const Vec& x, const TensorView& weight, double eps) {
  double sum = 0.0;
  for (double v : x) sum += v * v;
  const double inv = 1.0 / std::sqrt(sum / double(x.size()) + eps);
  Vec y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    y[i] = x[i] * inv * double(decode_bf16(weight.data_as<std::uint16_t>()[i]));
  }
  return y;
}

// Interleaved RoPE of x[offset .. offset + 64) with the f32 cos/sin row.
void rope(Vec& x, std::size_t offset, const float* cs) {
  constexpr int kHalf = kMlaRopeDim / 2;
  for (int i = 0; i < kHalf; ++i) {
    const double a = x[offset + 2 * i], b = x[offset + 2 * i + 1];
    x[offset + 2 * i] = a * cs[i] - b * cs[kHalf + i];
    x[offset + 2 * i + 1] = b * cs[i] + a * cs[kHalf + i];
  }
}

struct Keys {
  Vec k;  // [H, 192]
  Vec v;  // [H, 128]
};

// Head h of one query over keys[0, score.size()): o[h] += softmax(q k^T * scale) v, exactly.
// The dot products of kKeys keys at once, each summed over the dims in order.
void attend(const Vec& q, const std::vector<Keys>& keys, std::int64_t h, double scale, Vec& score,
            Vec& o) {
  constexpr std::int64_t kKeys = 4;
  const std::int64_t visible = std::int64_t(score.size());
  const double* qh = q.data() + h * kMlaQkDim;
  double m = -INFINITY;
  for (std::int64_t j0 = 0; j0 < visible; j0 += kKeys) {
    const std::int64_t n = std::min(kKeys, visible - j0);
    const double* k[kKeys];
    for (std::int64_t r = 0; r < kKeys; ++r)
      k[r] = keys[std::size_t(j0 + std::min(r, n - 1))].k.data() + h * kMlaQkDim;
    double dot[kKeys] = {};
    for (int d = 0; d < kMlaQkDim; ++d) {
      for (std::int64_t r = 0; r < kKeys; ++r) dot[r] += qh[d] * k[r][d];
    }
    for (std::int64_t r = 0; r < n; ++r) {
      score[std::size_t(j0 + r)] = dot[r] * scale;
      m = std::max(m, score[std::size_t(j0 + r)]);
    }
  }
  double l = 0.0;
  for (double& p : score) l += (p = std::exp(p - m));
  for (std::int64_t j = 0; j < visible; ++j) {
    const double* v = keys[std::size_t(j)].v.data() + h * kMlaVDim;
    for (int d = 0; d < kMlaVDim; ++d)
      o[std::size_t(h * kMlaVDim + d)] += score[std::size_t(j)] / l * v[d];
  }
}

// The layer in float64 for one batch: the keys of each sequence (its prefix from the cache, its
// new tokens from the projections), then each new token's attention and o_proj. Tokens go
// through the projections kGroup at a time (Matrix::apply's rows).
class Reference {
 public:
  static constexpr std::int64_t kGroup = 16;

  Reference(const MlaConfig& c, const MlaWeights& w, const TensorView& cache, float cache_scale_inv,
            std::int64_t max_pos)
      : c_(c),
        w_(w),
        q_a_(c.q_lora_rank > 0 ? matrix(w.q_a_proj) : Matrix{}),
        q_b_(c.q_lora_rank > 0 ? matrix(w.q_b_proj) : matrix(w.q_proj)),
        kv_a_(matrix(w.kv_a_proj_with_mqa)),
        kv_b_(matrix(w.kv_b_proj)),
        o_proj_(matrix(w.o_proj)),
        cos_sin_(std::size_t(max_pos * kMlaRopeDim)),
        cache_(cache),
        cache_scale_(1.0 / double(cache_scale_inv)) {
    make_cos_sin_cache(TensorView(cos_sin_.data(), DType::kF32, {max_pos, kMlaRopeDim}), c.rope);
  }

  // Keys g .. g + n of sequence s's prefix, from its cache rows.
  void prefix_keys(const MlaSequence& s, std::int64_t g, std::int64_t n,
                   std::vector<Keys>& keys) const {
    const auto* bytes = cache_.data_as<const std::uint8_t>();
    const std::int64_t page_size = cache_.size(1), lora = c_.kv_lora_rank;
    std::vector<Vec> kv_c = zero_rows(n, lora), k_pe = zero_rows(n, kMlaRopeDim);
    for (std::int64_t r = 0; r < n; ++r) {
      const std::int64_t slot = s.slots[std::size_t(g + r)];
      const std::uint8_t* row =
          bytes + (slot / page_size) * cache_.stride(0) + (slot % page_size) * cache_.stride(1);
      for (std::int64_t d = 0; d < lora; ++d)
        kv_c[std::size_t(r)][std::size_t(d)] = decode_e4m3(row[d]) * cache_scale_;
      for (int d = 0; d < kMlaRopeDim; ++d)
        k_pe[std::size_t(r)][std::size_t(d)] = decode_e4m3(row[lora + d]) * cache_scale_;
    }
    const std::vector<Vec> kv = kv_b_.apply(std::move(kv_c));
    for (std::int64_t r = 0; r < n; ++r)
      keys[std::size_t(g + r)] = keys_of(kv[std::size_t(r)], k_pe[std::size_t(r)]);
  }

  // New tokens g .. g + n of sequence s (hidden rows from row0 + g): their queries and keys.
  void new_tokens(const MlaSequence& s, const TensorView& hidden, std::int64_t row0, std::int64_t g,
                  std::int64_t n, std::vector<Keys>& keys, std::vector<Vec>& queries) const {
    std::vector<Vec> x = zero_rows(n, c_.hidden);
    for (std::int64_t r = 0; r < n; ++r) {
      const auto* xb = hidden.data_as<const std::uint16_t>() + (row0 + g + r) * c_.hidden;
      for (std::int64_t d = 0; d < c_.hidden; ++d)
        x[std::size_t(r)][std::size_t(d)] = decode_bf16(xb[d]);
    }
    std::vector<Vec> q;
    if (c_.q_lora_rank > 0) {
      std::vector<Vec> q_lora = q_a_.apply(x);
      for (Vec& v : q_lora) v = rms_norm(v, w_.q_a_layernorm, c_.rms_norm_eps);
      q = q_b_.apply(std::move(q_lora));
    } else {
      q = q_b_.apply(x);
    }
    const std::vector<Vec> latent = kv_a_.apply(std::move(x));
    std::vector<Vec> kv_c(static_cast<std::size_t>(n)), k_pe(static_cast<std::size_t>(n));
    for (std::int64_t r = 0; r < n; ++r) {
      const float* cs = cos_sin_.data() + (s.prefix + g + r) * kMlaRopeDim;
      for (std::int64_t h = 0; h < c_.heads; ++h)
        rope(q[std::size_t(r)], std::size_t(h * kMlaQkDim + kMlaNopeDim), cs);
      const Vec& l = latent[std::size_t(r)];
      kv_c[std::size_t(r)] =
          rms_norm(Vec(l.begin(), l.begin() + c_.kv_lora_rank), w_.kv_a_layernorm, c_.rms_norm_eps);
      k_pe[std::size_t(r)] = Vec(l.begin() + c_.kv_lora_rank, l.end());
      rope(k_pe[std::size_t(r)], 0, cs);
    }
    const std::vector<Vec> kv = kv_b_.apply(std::move(kv_c));
    for (std::int64_t r = 0; r < n; ++r) {
      keys[std::size_t(s.prefix + g + r)] = keys_of(kv[std::size_t(r)], k_pe[std::size_t(r)]);
      queries[std::size_t(g + r)] = std::move(q[std::size_t(r)]);
    }
  }

  // Outputs of queries g .. g + n of a sequence with `prefix` cached keys: causal attention over
  // the keys, then o_proj, into out rows g .. g + n.
  void outputs(std::int64_t prefix, const std::vector<Keys>& keys, const std::vector<Vec>& queries,
               std::int64_t g, std::int64_t n, double* out) const {
    const double scale = c_.softmax_scale();
    std::vector<Vec> o = zero_rows(n, c_.heads * kMlaVDim);
    for (std::int64_t r = 0; r < n; ++r) {
      Vec score(static_cast<std::size_t>(prefix + g + r + 1));  // the keys query g + r sees
      for (std::int64_t h = 0; h < c_.heads; ++h)
        attend(queries[std::size_t(g + r)], keys, h, scale, score, o[std::size_t(r)]);
    }
    const std::vector<Vec> y = o_proj_.apply(std::move(o));
    for (std::int64_t r = 0; r < n; ++r)
      std::copy(y[std::size_t(r)].begin(), y[std::size_t(r)].end(), out + (g + r) * c_.hidden);
  }

 private:
  // Per-head keys from a latent row's kv_b_proj output kv [H * 256] and its RoPE'd k_pe [64].
  Keys keys_of(const Vec& kv, const Vec& k_pe) const {
    const std::int64_t H = c_.heads;
    Keys k{Vec(std::size_t(H * kMlaQkDim)), Vec(std::size_t(H * kMlaVDim))};
    for (std::int64_t h = 0; h < H; ++h) {
      for (int d = 0; d < kMlaNopeDim; ++d)
        k.k[std::size_t(h * kMlaQkDim + d)] = kv[std::size_t(h * 256 + d)];
      for (int d = 0; d < kMlaRopeDim; ++d)
        k.k[std::size_t(h * kMlaQkDim + kMlaNopeDim + d)] = k_pe[std::size_t(d)];
      for (int d = 0; d < kMlaVDim; ++d)
        k.v[std::size_t(h * kMlaVDim + d)] = kv[std::size_t(h * 256 + kMlaNopeDim + d)];
    }
    return k;
  }

  const MlaConfig& c_;
  const MlaWeights& w_;
  Matrix q_a_, q_b_, kv_a_, kv_b_, o_proj_;
  std::vector<float> cos_sin_;
  const TensorView& cache_;
  double cache_scale_;
};

// Runs fn(g, n) for groups of at most Reference::kGroup of [0, count), over the threads.
template <typename Fn>
void for_groups(std::int64_t count, const Fn& fn) {
  cpu::parallel_for(count, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t g = begin; g < end; g += Reference::kGroup)
      fn(g, std::min(Reference::kGroup, end - g));
  });
}

}  // namespace

void mla_prefill_reference(const MlaConfig& c, const MlaWeights& weights, const TensorView& hidden,
                           const MlaBatch& batch, const TensorView& cache, float cache_scale_inv,
                           double* out) {
  std::int64_t max_pos = 1;
  for (const MlaSequence& s : batch.sequences) max_pos = std::max(max_pos, s.prefix + s.extend);
  const Reference reference(c, weights, cache, cache_scale_inv, max_pos);
  std::int64_t row0 = 0;
  for (const MlaSequence& s : batch.sequences) {
    // Keys: prefix (from the cache), then extend; one query per extend token.
    std::vector<Keys> keys(std::size_t(s.prefix + s.extend));
    std::vector<Vec> queries(std::size_t(s.extend));
    for_groups(s.prefix,
               [&](std::int64_t g, std::int64_t n) { reference.prefix_keys(s, g, n, keys); });
    for_groups(s.extend, [&](std::int64_t g, std::int64_t n) {
      reference.new_tokens(s, hidden, row0, g, n, keys, queries);
    });
    for_groups(s.extend, [&](std::int64_t g, std::int64_t n) {
      reference.outputs(s.prefix, keys, queries, g, n, out + row0 * c.hidden);
    });
    row0 += s.extend;
  }
}

}  // namespace fp8mla
