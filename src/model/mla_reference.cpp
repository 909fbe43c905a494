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

struct Matrix {
  std::vector<float> w;  // [out, in]
  std::int64_t out = 0, in = 0;
  bool fp8_input = false;
  // y[o] = sum_i w[o, i] x[i], over i in order; kRows outputs at once, so that their
  // independent adds overlap (the same sums as one output at a time).
  Vec apply(const Vec& x_in) const {
    constexpr std::int64_t kRows = 8;
    const Vec x = fp8_input ? quantize_groups(x_in) : x_in;
    Vec y(std::size_t(out), 0.0);
    for (std::int64_t o0 = 0; o0 < out; o0 += kRows) {
      const std::int64_t rows = std::min(kRows, out - o0);
      const float* wr[kRows];
      for (std::int64_t r = 0; r < kRows; ++r)
        wr[r] = w.data() + (o0 + std::min(r, rows - 1)) * in;  // past out: a row again, unused
      double acc[kRows] = {};
      for (std::int64_t i = 0; i < in; ++i) {
        for (std::int64_t r = 0; r < kRows; ++r) acc[r] += double(wr[r][i]) * x[std::size_t(i)];
      }
      for (std::int64_t r = 0; r < rows; ++r) y[std::size_t(o0 + r)] = acc[r];
    }
    return y;
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

}  // namespace

void mla_prefill_reference(const MlaConfig& c, const MlaWeights& weights, const TensorView& hidden,
                           const MlaBatch& batch, const TensorView& cache, float cache_scale_inv,
                           double* out) {
  const std::int64_t H = c.heads;
  std::int64_t max_pos = 1;
  for (const MlaSequence& s : batch.sequences) max_pos = std::max(max_pos, s.prefix + s.extend);
  std::vector<float> cos_sin(std::size_t(max_pos * kMlaRopeDim));
  make_cos_sin_cache(TensorView(cos_sin.data(), DType::kF32, {max_pos, kMlaRopeDim}), c.rope);
  const Matrix q_a = c.q_lora_rank > 0 ? matrix(weights.q_a_proj) : Matrix{};
  const Matrix q_b = c.q_lora_rank > 0 ? matrix(weights.q_b_proj) : matrix(weights.q_proj);
  const Matrix kv_a = matrix(weights.kv_a_proj_with_mqa), kv_b = matrix(weights.kv_b_proj);
  const Matrix o_proj = matrix(weights.o_proj);
  const auto* cache_bytes = cache.data_as<const std::uint8_t>();
  const std::int64_t page_size = cache.size(1);
  const double cache_scale = 1.0 / double(cache_scale_inv);

  // Per-head keys from a latent row: kv_c [512] and the RoPE'd k_pe [64].
  auto keys_of = [&](const Vec& kv_c, const Vec& k_pe) {
    const Vec kv = kv_b.apply(kv_c);
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
  };

  std::int64_t row0 = 0;
  for (const MlaSequence& s : batch.sequences) {
    // Keys: prefix (from the cache), then extend; one query per extend token.
    std::vector<Keys> keys(std::size_t(s.prefix + s.extend));
    std::vector<Vec> queries(std::size_t(s.extend));
    cpu::parallel_for(s.prefix, 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        const std::int64_t slot = s.slots[std::size_t(i)];
        const std::uint8_t* row = cache_bytes + (slot / page_size) * cache.stride(0) +
                                  (slot % page_size) * cache.stride(1);
        Vec kv_c(std::size_t(c.kv_lora_rank)), k_pe(kMlaRopeDim);
        for (std::int64_t d = 0; d < c.kv_lora_rank; ++d)
          kv_c[std::size_t(d)] = decode_e4m3(row[d]) * cache_scale;
        for (int d = 0; d < kMlaRopeDim; ++d)
          k_pe[std::size_t(d)] = decode_e4m3(row[c.kv_lora_rank + d]) * cache_scale;
        keys[std::size_t(i)] = keys_of(kv_c, k_pe);
      }
    });
    cpu::parallel_for(s.extend, 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        const auto* xb = hidden.data_as<const std::uint16_t>() + (row0 + i) * c.hidden;
        Vec x(std::size_t(c.hidden));
        for (std::int64_t d = 0; d < c.hidden; ++d) x[std::size_t(d)] = decode_bf16(xb[d]);
        const float* cs = cos_sin.data() + (s.prefix + i) * kMlaRopeDim;
        Vec q = c.q_lora_rank > 0
                    ? q_b.apply(rms_norm(q_a.apply(x), weights.q_a_layernorm, c.rms_norm_eps))
                    : q_b.apply(x);
        for (std::int64_t h = 0; h < H; ++h) rope(q, std::size_t(h * kMlaQkDim + kMlaNopeDim), cs);
        const Vec latent = kv_a.apply(x);
        const Vec kv_c = rms_norm(Vec(latent.begin(), latent.begin() + c.kv_lora_rank),
                                  weights.kv_a_layernorm, c.rms_norm_eps);
        Vec k_pe(latent.begin() + c.kv_lora_rank, latent.end());
        rope(k_pe, 0, cs);
        keys[std::size_t(s.prefix + i)] = keys_of(kv_c, k_pe);
        queries[std::size_t(i)] = std::move(q);
      }
    });
    const double scale = c.softmax_scale();
    cpu::parallel_for(s.extend, 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        const std::int64_t visible = s.prefix + i + 1;
        Vec o(static_cast<std::size_t>(H * kMlaVDim), 0.0),
            score(static_cast<std::size_t>(visible));
        for (std::int64_t h = 0; h < H; ++h)
          attend(queries[std::size_t(i)], keys, h, scale, score, o);
        const Vec y = o_proj.apply(o);
        std::copy(y.begin(), y.end(), out + (row0 + i) * c.hidden);
      }
    });
    row0 += s.extend;
  }
}

}  // namespace fp8mla
