// CPU reference of prefill_attention (fp8mla/attention.hpp): fp32 math with a numerically stable
// softmax, exact over each row's visible keys, threaded over blocks of rows of one (sequence,
// head).
//   s_j = softmax_scale * sum_d q[d] k_j[d]    (fp32 accumulation; q, k dequantized per element)
//   m = max_j s_j, p_j = exp(s_j - m), l = sum_j p_j, O = (sum_j p_j v_j) / l, LSE = m + log(l)
// Every sum runs over j (or d) in order, one term at a time. A row with no visible key writes
// O = 0 and LSE = -inf.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/parallel_for.hpp"
#include "fp8mla/numerics.hpp"
#include "ops/prefill_attention_params.hpp"

namespace fp8mla::cpu {
namespace {

// decode_e4m3 of every code, looked up.
const std::array<float, 256>& e4m3_values() {
  static const std::array<float, 256> values = [] {
    std::array<float, 256> v{};
    for (int code = 0; code < 256; ++code) v[std::size_t(code)] = decode_e4m3(std::uint8_t(code));
    return v;
  }();
  return values;
}

// Element `offset` of an e4m3 or bf16 array, dequantized (e4m3: by `e4m3`, e4m3_values()).
inline float load(const void* base, DType dtype, std::int64_t offset, float descale,
                  const float* e4m3) {
  if (dtype == DType::kE4M3) return e4m3[static_cast<const std::uint8_t*>(base)[offset]] * descale;
  return decode_bf16(static_cast<const std::uint16_t*>(base)[offset]);
}

// Query rows [begin, end) of sequence b, head h: one unit of work. Its rows share the keys, which
// are dequantized once for all of them, kKeyBlock at a time (memory bounded for long sequences).
struct Task {
  std::int64_t b, h, begin, end;
};
constexpr std::int64_t kTaskRows = 8, kKeyBlock = 1024;

class TaskRunner {
 public:
  TaskRunner(const PrefillAttentionParams& p, const float* e4m3) : p_(p), e4m3_(e4m3) {}

  void run(const Task& task) {
    const std::int64_t q_start = p_.cu_seqlens_q[task.b];
    const std::int64_t q_len = p_.cu_seqlens_q[task.b + 1] - q_start;
    k_start_ = p_.cu_seqlens_k[task.b];
    const std::int64_t k_len = p_.cu_seqlens_k[task.b + 1] - k_start_;
    const std::int64_t rows = task.end - task.begin;
    visible_.assign(std::size_t(rows), 0);
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t i = task.begin + r;
      visible_[std::size_t(r)] =
          p_.causal ? std::clamp<std::int64_t>(i + k_len - q_len + 1, 0, k_len) : k_len;
    }
    keys_ = *std::max_element(visible_.begin(), visible_.end());
    q_.resize(std::size_t(rows * p_.dqk));
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t at =
          (q_start + task.begin + r) * p_.q_token_stride + task.h * p_.q_head_stride;
      for (int d = 0; d < p_.dqk; ++d)
        q_[std::size_t(r * p_.dqk + d)] = load(p_.q, p_.dtype, at + d, p_.q_descale_value, e4m3_);
    }
    s_.resize(std::size_t(rows * keys_));
    m_.assign(std::size_t(rows), -std::numeric_limits<float>::infinity());
    l_.assign(std::size_t(rows), 0.0f);
    o_.assign(std::size_t(rows * p_.dv), 0.0f);
    for (std::int64_t j0 = 0; j0 < keys_; j0 += kKeyBlock)
      scores(task.h, j0, std::min(keys_, j0 + kKeyBlock));
    for (std::int64_t j0 = 0; j0 < keys_; j0 += kKeyBlock)
      values(task.h, j0, std::min(keys_, j0 + kKeyBlock));
    for (std::int64_t r = 0; r < rows; ++r) write(q_start + task.begin + r, task.h, r);
  }

 private:
  // s[r][j] = softmax_scale * (q_r . k_j) for keys [j0, j1) each row sees; the running row max.
  void scores(std::int64_t h, std::int64_t j0, std::int64_t j1) {
    const int dqk = p_.dqk, k_dims = p_.dqk - p_.k_rope_dim;  // of k; the rest from k_rope
    block_.resize(std::size_t((j1 - j0) * dqk));
    for (std::int64_t j = j0; j < j1; ++j) {
      float* kf = block_.data() + (j - j0) * dqk;
      const std::int64_t at = (k_start_ + j) * p_.k_token_stride + h * p_.k_head_stride;
      const std::int64_t rope_at = (k_start_ + j) * p_.k_rope_token_stride - k_dims;
      for (int d = 0; d < k_dims; ++d)
        kf[d] = load(p_.k, p_.dtype, at + d, p_.k_descale_value, e4m3_);
      for (int d = k_dims; d < dqk; ++d)
        kf[d] = load(p_.k_rope, p_.dtype, rope_at + d, p_.k_descale_value, e4m3_);
    }
    for (std::size_t r = 0; r < m_.size(); ++r) {
      const float* q = q_.data() + r * std::size_t(dqk);
      const std::int64_t end = std::min(j1, visible_[r]);
      for (std::int64_t j = j0; j < end; ++j) {
        const float* kf = block_.data() + (j - j0) * dqk;
        float dot = 0.0f;
        for (int d = 0; d < dqk; ++d) dot += q[d] * kf[d];
        float& s = s_[r * std::size_t(keys_) + std::size_t(j)];
        s = p_.softmax_scale * dot;
        m_[r] = std::max(m_[r], s);
      }
    }
  }

  // p = exp(s - m) of keys [j0, j1): the row sums and O's sums.
  void values(std::int64_t h, std::int64_t j0, std::int64_t j1) {
    const int dv = p_.dv;
    block_.resize(std::size_t((j1 - j0) * dv));
    for (std::int64_t j = j0; j < j1; ++j) {
      float* vf = block_.data() + (j - j0) * dv;
      const std::int64_t at = (k_start_ + j) * p_.v_token_stride + h * p_.v_head_stride;
      for (int d = 0; d < dv; ++d)
        vf[d] = load(p_.v, p_.dtype, at + d * p_.v_dim_stride, p_.v_descale_value, e4m3_);
    }
    for (std::size_t r = 0; r < m_.size(); ++r) {
      float* o = o_.data() + r * std::size_t(dv);
      const std::int64_t end = std::min(j1, visible_[r]);
      for (std::int64_t j = j0; j < end; ++j) {
        const float pj = std::exp(s_[r * std::size_t(keys_) + std::size_t(j)] - m_[r]);
        l_[r] += pj;
        const float* vf = block_.data() + (j - j0) * dv;
        for (int d = 0; d < dv; ++d) o[d] += pj * vf[d];
      }
    }
  }

  void write(std::int64_t t, std::int64_t h, std::int64_t r) {
    float* o = o_.data() + r * p_.dv;
    float lse = -std::numeric_limits<float>::infinity();
    if (visible_[std::size_t(r)] > 0) {
      for (int d = 0; d < p_.dv; ++d) o[d] /= l_[std::size_t(r)];
      lse = m_[std::size_t(r)] + std::log(l_[std::size_t(r)]);
    }
    std::uint16_t* out = p_.out + t * p_.out_token_stride + h * p_.out_head_stride;
    for (int d = 0; d < p_.dv; ++d) out[d] = encode_bf16(o[d]);
    if (p_.lse != nullptr) p_.lse[t * p_.lse_token_stride + h * p_.lse_head_stride] = lse;
  }

  const PrefillAttentionParams& p_;
  const float* e4m3_;
  std::int64_t k_start_ = 0;
  std::int64_t keys_ = 0;  // keys the task's rows see: the row pitch of s_
  std::vector<std::int64_t> visible_;
  std::vector<float> q_, s_, m_, l_, o_, block_;
};

}  // namespace

void prefill_attention(const PrefillAttentionParams& p) {
  std::vector<Task> tasks;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t q_len = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    for (std::int64_t h = 0; h < p.heads; ++h) {
      for (std::int64_t i = 0; i < q_len; i += kTaskRows)
        tasks.push_back({b, h, i, std::min(q_len, i + kTaskRows)});
    }
  }
  const float* e4m3 = e4m3_values().data();
  parallel_for(std::int64_t(tasks.size()), 1, [&](std::int64_t begin, std::int64_t end) {
    TaskRunner runner(p, e4m3);
    for (std::int64_t t = begin; t < end; ++t) runner.run(tasks[std::size_t(t)]);
  });
}

}  // namespace fp8mla::cpu
