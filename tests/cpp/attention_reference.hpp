// The float64 reference of prefill_attention and the BF16 attention of the error rule
// (docs/design.md section 8), on a ragged batch's dequantized inputs: what
// prefill_attention_cuda_test.cu and the random-shape agreement test hold the kernels to.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "fp8mla/numerics.hpp"

namespace fp8mla::test {

inline constexpr int kRefDqk = 192, kRefDv = 128;

inline double bf16_round(double x) {
  return double(decode_bf16(encode_bf16(float(x))));
}

// A ragged batch's inputs as float64 values (FP8 codes times their descale), logical [T, H, D]
// row-major: q and k of kRefDqk, v of kRefDv per head.
struct AttentionInputs {
  std::vector<std::int32_t> cu_q{0}, cu_k{0};
  std::int64_t tq = 0, tk = 0;
  int heads = 1;
  bool causal = true;
  double softmax_scale = double(float(1.0 / std::sqrt(double(kRefDqk))));
  std::vector<double> q, k, v;
};

// Rows to compare with the reference: every row of problems of at most `all_rows_work` (rows x
// heads x keys); otherwise boundary rows of each sequence and random ones.
inline std::vector<std::pair<std::int64_t, int>> rows_to_check(
    const AttentionInputs& p, std::mt19937& rng,
    std::int64_t all_rows_work = std::int64_t{1} << 22) {
  std::vector<std::pair<std::int64_t, int>> rows;
  const std::int64_t all_work = p.tq * p.heads * std::max<std::int64_t>(p.tk, 1);
  std::vector<int> heads(std::size_t(p.heads));
  std::iota(heads.begin(), heads.end(), 0);
  if (p.heads > 8) heads = {0, 1, p.heads / 2, p.heads - 1};
  for (std::size_t b = 0; b + 1 < p.cu_q.size(); ++b) {
    const int q_len = p.cu_q[b + 1] - p.cu_q[b];
    std::set<int> local;
    if (all_work <= all_rows_work) {
      for (int i = 0; i < q_len; ++i) local.insert(i);
    } else {
      for (int i : {0, 1, 2, 63, 64, 65, 127, 128, 129, 255, 256}) local.insert(i);
      for (int i = 1; i <= 3; ++i) local.insert(q_len - i);
      std::uniform_int_distribution<int> pick(0, std::max(q_len - 1, 0));
      for (int i = 0; i < 24; ++i) local.insert(pick(rng));
    }
    for (int i : local) {
      if (i < 0 || i >= q_len) continue;
      for (int h : heads) rows.emplace_back(p.cu_q[b] + i, h);
    }
  }
  return rows;
}

struct RowRef {
  std::vector<double> o;     // float64 attention
  std::vector<double> o_bf;  // the BF16 attention of the error rule
  double lse;
};

inline RowRef reference_row(const AttentionInputs& p, std::int64_t t, int h) {
  const auto it = std::upper_bound(p.cu_q.begin(), p.cu_q.end(), std::int32_t(t));
  const std::size_t b = std::size_t(it - p.cu_q.begin()) - 1;
  const std::int64_t q_len = p.cu_q[b + 1] - p.cu_q[b], i = t - p.cu_q[b];
  const std::int64_t k0 = p.cu_k[b], k_len = p.cu_k[b + 1] - k0;
  const std::int64_t visible =
      p.causal ? std::clamp<std::int64_t>(i + k_len - q_len + 1, 0, k_len) : k_len;
  const int H = p.heads;
  const double scale = p.softmax_scale;
  RowRef r{std::vector<double>(kRefDv, 0.0), std::vector<double>(kRefDv, 0.0),
           -std::numeric_limits<double>::infinity()};
  if (visible == 0) return r;
  std::vector<double> s(static_cast<std::size_t>(visible)), s_bf(s.size());
  const double* q = &p.q[std::size_t((t * H + h) * kRefDqk)];
  for (std::int64_t j = 0; j < visible; ++j) {
    const double* k = &p.k[std::size_t(((k0 + j) * H + h) * kRefDqk)];
    double dot = 0.0, dot_bf = 0.0;
    for (int d = 0; d < kRefDqk; ++d) {
      dot += q[d] * k[d];
      dot_bf += bf16_round(q[d]) * bf16_round(k[d]);
    }
    s[std::size_t(j)] = dot * scale;
    s_bf[std::size_t(j)] = bf16_round(bf16_round(dot_bf) * double(float(scale)));
  }
  const double m = *std::max_element(s.begin(), s.end());
  const double m_bf = *std::max_element(s_bf.begin(), s_bf.end());
  double l = 0.0, l_bf = 0.0;
  for (std::int64_t j = 0; j < visible; ++j) {
    l += std::exp(s[std::size_t(j)] - m);
    l_bf += double(std::exp(float(s_bf[std::size_t(j)] - m_bf)));
  }
  for (std::int64_t j = 0; j < visible; ++j) {
    const double w = std::exp(s[std::size_t(j)] - m) / l;
    const double w_bf = bf16_round(double(std::exp(float(s_bf[std::size_t(j)] - m_bf))) / l_bf);
    const double* v = &p.v[std::size_t(((k0 + j) * H + h) * kRefDv)];
    for (int d = 0; d < kRefDv; ++d) {
      r.o[std::size_t(d)] += w * v[d];
      r.o_bf[std::size_t(d)] += w_bf * bf16_round(v[d]);
    }
  }
  for (double& x : r.o_bf) x = bf16_round(x);
  r.lse = m + std::log(l);
  return r;
}

}  // namespace fp8mla::test
