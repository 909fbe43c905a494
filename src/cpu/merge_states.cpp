// CPU merge_attention_states (fp8mla/attention.hpp, op 9), fp32 math. The CUDA kernel does the
// same operations in the same order; only exp/log differ (std::exp/std::log on float here, expf/
// logf there), so the two agree within a few ulp, and exactly on empty and one-sided rows.
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu/element_io.hpp"
#include "cpu/parallel_for.hpp"
#include "fp8mla/numerics.hpp"
#include "ops/merge_states_params.hpp"

namespace fp8mla::cpu {

void merge_attention_states(const MergeStatesParams& p) {
  const std::size_t esize = dtype_size(p.dtype);
  const auto row = [&](const MergeStatesParams::States& s, std::int64_t t, std::int64_t h) {
    return static_cast<char*>(s.data) + (t * s.token_stride + h * s.head_stride) * esize;
  };
  const auto at = [](const MergeStatesParams::Lse& l, std::int64_t t, std::int64_t h) {
    return l.data + t * l.token_stride + h * l.head_stride;
  };
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  // +inf is how FlashAttention-3 reports a row without keys: an empty state, as -inf.
  const auto state_lse = [](float lse) { return std::isinf(lse) ? kNegInf : lse; };
  parallel_for(p.tokens * p.heads, 64, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t r = begin; r < end; ++r) {
      const std::int64_t t = r / p.heads, h = r % p.heads;
      const float la = state_lse(*at(p.lse_a, t, h)), lb = state_lse(*at(p.lse_b, t, h));
      const char* a = row(p.o_a, t, h);
      const char* b = row(p.o_b, t, h);
      char* o = row(p.out, t, h);
      const auto store = [&](std::int64_t c, float y) {
        if (p.dtype == DType::kBF16) {
          reinterpret_cast<std::uint16_t*>(o)[c] = encode_bf16(y);
        } else {
          reinterpret_cast<float*>(o)[c] = y;
        }
      };
      float lse;
      if (la == kNegInf && lb == kNegInf) {  // two empty states: (0, -inf)
        for (std::int64_t c = 0; c < p.dim; ++c) store(c, 0.0f);
        lse = kNegInf;
      } else {
        const float m = la > lb ? la : lb;  // a NaN lse_a reaches the output through w_a
        const float w_a = std::exp(la - m), w_b = std::exp(lb - m);
        const float s = w_a + w_b;
        // A zero weight drops its side entirely (its o is not read), so one empty state passes
        // the other through unchanged.
        for (std::int64_t c = 0; c < p.dim; ++c) {
          const float acc = w_b == 0.0f ? w_a * load_f32(a, p.dtype, c)
                            : w_a == 0.0f
                                ? w_b * load_f32(b, p.dtype, c)
                                : w_a * load_f32(a, p.dtype, c) + w_b * load_f32(b, p.dtype, c);
          store(c, acc / s);
        }
        lse = m + std::log(s);
      }
      *at(p.out_lse, t, h) = lse;
    }
  });
}

}  // namespace fp8mla::cpu
