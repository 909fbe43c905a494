// Shared cases of the merge_attention_states tests (CPU and CUDA): buffers with differing layouts
// per argument, random states with empty (-inf) rows, a float64 reference read through each
// view's own strides, and the checks of an output against it.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "buffer_test_util.hpp"
#include "fp8mla/attention.hpp"

namespace fp8mla::test {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Buffers: 0 o_a, 1 lse_a, 2 o_b, 3 lse_b, 4 out, 5 out_lse.
// o_a token-major contiguous; o_b a strided slice of a [T, H+1, D+24] buffer (offset 8 elements,
// or 1 with `misalign`); lse_a [T, H] contiguous; lse_b the transpose of an [H, T] buffer; out
// head-major ([H, T, D] memory); out_lse rows padded by 3.
struct MergeCase {
  DType dtype = DType::kBF16;
  std::int64_t tokens = 7, heads = 16, dim = 128;
  enum class Form { kGeneral, kInplace, kGeneralAliased } form = Form::kGeneral;
  bool misalign = false;
  int empty_a_percent = 20, empty_b_percent = 20;
  bool empty_as_pos_inf = false;  // empty states as FlashAttention-3 writes them (+inf)
  std::uint64_t seed = 1;

  std::vector<Spec> specs() const {
    const std::int64_t t = tokens, h = heads, d = dim, t1 = std::max<std::int64_t>(t, 1);
    const std::int64_t b_row = d + 24, b_off = misalign ? 1 : 8;
    return {
        dense(dtype, {t, h, d}),
        dense(DType::kF32, {t, h}),
        {dtype, {t, h, d}, {(h + 1) * b_row, b_row, 1}, b_off, t * (h + 1) * b_row + b_off},
        {DType::kF32, {t, h}, {1, t1}, 0, t * h},
        {dtype, {t, h, d}, {d, t1 * d, 1}, 0, t * h * d},
        padded(DType::kF32, {t, h}, 3),
    };
  }
  void init(std::vector<HostBuffer>& buffers) const {
    const std::vector<Spec> s = specs();
    Rng rng(seed);
    for (int i : {0, 2}) {
      for (std::int64_t e = 0; e < s[i].buffer_elems; ++e) {
        store_f32(buffers[i].data(), dtype, e, (rng.uniform() * 2.0f - 1.0f) * 4.0f);
      }
    }
    for (int i : {1, 3}) {
      const int empty = i == 1 ? empty_a_percent : empty_b_percent;
      for (std::int64_t e = 0; e < s[i].buffer_elems; ++e) {
        const float v = int(rng.below(100)) < empty ? (empty_as_pos_inf ? -kNegInf : kNegInf)
                                                    : (rng.uniform() * 2.0f - 1.0f) * 20;
        std::memcpy(buffers[i].data() + e * 4, &v, 4);
      }
    }
  }
  // The views the op writes: (out, out_lse) or (o_a, lse_a).
  int out_index() const { return form == Form::kGeneral ? 4 : 0; }
  int lse_index() const { return form == Form::kGeneral ? 5 : 1; }
  void run(std::span<void* const> bases, Device device, CudaStream stream = nullptr) const {
    const std::vector<Spec> s = specs();
    const auto v = [&](int i) { return s[std::size_t(i)].view(bases[std::size_t(i)], device); };
    if (form == Form::kInplace) {
      merge_attention_states_inplace(v(0), v(1), v(2), v(3), stream);
    } else {
      merge_attention_states(v(0), v(1), v(2), v(3), v(out_index()), v(lse_index()), stream);
    }
  }
  std::string describe() const {
    const char* forms[] = {"general", "in place", "general with out == o_a"};
    return concat("merge ", dtype_name(dtype), " T ", tokens, " H ", heads, " D ", dim, ", ",
                  forms[int(form)], misalign ? ", misaligned o_b" : "", ", empty ", empty_a_percent,
                  "%/", empty_b_percent, "%, seed ", seed);
  }
};

// Inputs of one row and the float64 merge.
struct MergeRef {
  std::vector<float> a, b;  // o_a, o_b rows, [T * H * D]
  std::vector<float> la, lb;
  std::vector<double> o, lse;
};

inline float elem(const TensorView& v, std::int64_t t, std::int64_t h, std::int64_t c = 0) {
  std::int64_t off = t * v.stride(0) + h * v.stride(1) + (v.ndim() == 3 ? c * v.stride(2) : 0);
  return load_f32(v.data(), v.dtype(), off);
}

// Computed from the host buffers before the run (the in-place form overwrites its inputs).
inline MergeRef merge_reference(const MergeCase& c, std::span<void* const> bases) {
  const std::vector<Spec> s = c.specs();
  const TensorView oa = s[0].view(bases[0]), la = s[1].view(bases[1]), ob = s[2].view(bases[2]),
                   lb = s[3].view(bases[3]);
  MergeRef r;
  const std::int64_t rows = c.tokens * c.heads;
  r.a.resize(rows * c.dim);
  r.b.resize(rows * c.dim);
  r.o.resize(rows * c.dim);
  r.la.resize(rows);
  r.lb.resize(rows);
  r.lse.resize(rows);
  for (std::int64_t t = 0; t < c.tokens; ++t) {
    for (std::int64_t h = 0; h < c.heads; ++h) {
      const std::int64_t row = t * c.heads + h;
      // An lse of +inf is an empty state, as -inf.
      const auto state = [](float v) { return std::isinf(v) ? kNegInf : v; };
      const double x = r.la[row] = state(elem(la, t, h)), y = r.lb[row] = state(elem(lb, t, h));
      const bool empty = std::isinf(x) && std::isinf(y);
      const double m = std::max(x, y);
      const double wa = empty ? 0 : std::exp(x - m), wb = empty ? 0 : std::exp(y - m);
      r.lse[row] = empty ? -INFINITY : m + std::log(wa + wb);
      for (std::int64_t d = 0; d < c.dim; ++d) {
        const double p = r.a[row * c.dim + d] = elem(oa, t, h, d);
        const double q = r.b[row * c.dim + d] = elem(ob, t, h, d);
        r.o[row * c.dim + d] = empty ? 0.0 : (wa * p + wb * q) / (wa + wb);
      }
    }
  }
  return r;
}

// Every output against the float64 reference: (0, -inf) exactly for two empty states, the other
// state exactly when one is empty, otherwise within `o_rel` of |o_a| + |o_b| and 1e-6 + 2^-21
// relative on lse. No NaN anywhere.
inline void expect_matches_reference(const MergeCase& c, std::span<void* const> bases,
                                     const MergeRef& r) {
  const std::vector<Spec> s = c.specs();
  const TensorView out = s[c.out_index()].view(bases[c.out_index()]);
  const TensorView lse = s[c.lse_index()].view(bases[c.lse_index()]);
  const double o_rel = c.dtype == DType::kBF16 ? 0x1p-8 : 0x1p-18;
  int failures = 0, nans = 0;
  for (std::int64_t t = 0; t < c.tokens; ++t) {
    for (std::int64_t h = 0; h < c.heads; ++h) {
      const std::int64_t row = t * c.heads + h;
      const float got_lse = elem(lse, t, h);
      nans += std::isnan(got_lse);
      const bool ea = r.la[row] == kNegInf, eb = r.lb[row] == kNegInf;
      bool ok = true;
      if (ea && eb) {
        ok = got_lse == kNegInf;
      } else if (ea || eb) {
        ok = got_lse == (ea ? r.lb[row] : r.la[row]);
      } else {
        ok = std::fabs(got_lse - r.lse[row]) <= 1e-6 + std::fabs(r.lse[row]) * 0x1p-21;
      }
      for (std::int64_t d = 0; d < c.dim; ++d) {
        const std::size_t i = std::size_t(row * c.dim + d);
        const float got = elem(out, t, h, d);
        nans += std::isnan(got);
        if (ea && eb) {
          ok = ok && got == 0.0f && !std::signbit(got);
        } else if (ea || eb) {
          ok = ok && got == (ea ? r.b[i] : r.a[i]);
        } else {
          ok = ok &&
               std::fabs(got - r.o[i]) <= o_rel * (std::fabs(r.a[i]) + std::fabs(r.b[i])) + 1e-30;
        }
      }
      if (!ok && ++failures <= 5) {
        ADD_FAILURE() << "row (" << t << ", " << h << "): lse_a " << r.la[row] << ", lse_b "
                      << r.lb[row] << ", got lse " << got_lse << ", want " << r.lse[row]
                      << ", o[0] " << elem(out, t, h, 0) << " want " << r.o[row * c.dim];
      }
    }
  }
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(nans, 0);
}

// Bytes outside the written views are unchanged (inputs, padding, the unused out buffers of the
// in-place form); guards intact.
inline void expect_rest_unchanged(const MergeCase& c, const std::vector<HostBuffer>& before,
                                  const std::vector<std::vector<std::uint8_t>>& after,
                                  std::span<void* const> bases) {
  const std::vector<Spec> s = c.specs();
  for (int i = 0; i < 6; ++i) {
    std::vector<std::uint8_t> want(before[i].payload().begin(), before[i].payload().end());
    std::vector<std::uint8_t> got = after[i];
    if (i == c.out_index() || i == c.lse_index()) {
      const TensorView v = s[i].view(bases[i]);
      const std::size_t es = dtype_size(v.dtype());
      const auto base = static_cast<const std::uint8_t*>(bases[i]);
      for_each_element(v, [&](std::int64_t, std::int64_t off) {
        const std::size_t at =
            std::size_t(static_cast<const std::uint8_t*>(v.data()) - base) + std::size_t(off) * es;
        std::memset(want.data() + at, 0, es);
        std::memset(got.data() + at, 0, es);
      });
    }
    EXPECT_TRUE(same_bytes(got, want, concat("buffer ", i, " outside the written view")));
  }
}

// The GPU's outputs (viewed through host buffers at gpu_bases) against the CPU's (cpu_bases):
// within a few ulp on o (a bf16 ulp more for bf16) and 1e-6 + 2^-21 relative on lse (expf/logf
// against std::exp/std::log), exactly on empty and one-sided rows.
inline void expect_near_cpu(const MergeCase& c, const MergeRef& ref,
                            std::span<void* const> cpu_bases, std::span<void* const> gpu_bases) {
  const std::vector<Spec> s = c.specs();
  const TensorView co = s[c.out_index()].view(cpu_bases[c.out_index()]);
  const TensorView go = s[c.out_index()].view(gpu_bases[c.out_index()]);
  const TensorView cl = s[c.lse_index()].view(cpu_bases[c.lse_index()]);
  const TensorView gl = s[c.lse_index()].view(gpu_bases[c.lse_index()]);
  const double o_rel = c.dtype == DType::kBF16 ? 0x1p-8 : 0x1p-20;
  int failures = 0;
  for (std::int64_t t = 0; t < c.tokens; ++t) {
    for (std::int64_t h = 0; h < c.heads; ++h) {
      const std::int64_t row = t * c.heads + h;
      const float a = elem(cl, t, h), b = elem(gl, t, h);
      const bool one_sided = ref.la[row] == kNegInf || ref.lb[row] == kNegInf;
      bool ok = one_sided ? a == b : std::fabs(a - b) <= 1e-6 + std::fabs(a) * 0x1p-21;
      for (std::int64_t d = 0; d < c.dim; ++d) {
        const std::size_t i = std::size_t(row * c.dim + d);
        const float x = elem(co, t, h, d), y = elem(go, t, h, d);
        // exp/log a few ulp apart can move a bf16 result across a rounding boundary: one ulp.
        const double rounding =
            c.dtype == DType::kBF16 && x != 0.0f
                ? std::ldexp(1.0, std::ilogb(std::max(std::fabs(x), std::fabs(y))) - 7)
                : 0.0;
        ok = ok &&
             (one_sided ? x == y
                        : std::fabs(x - y) <= o_rel * (std::fabs(ref.a[i]) + std::fabs(ref.b[i])) +
                                                  rounding + 1e-30);
      }
      if (!ok && ++failures <= 5) {
        ADD_FAILURE() << "row (" << t << ", " << h << "): cpu lse " << a << ", cuda lse " << b;
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

// Calls fn(c) for each case of the dtype, shape and form sweep (seeds from 1) whose tokens * heads
// is at most max_rows.
template <typename Fn>
void for_each_sweep_case(std::int64_t max_rows, Fn fn) {
  std::uint64_t seed = 1;
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (std::int64_t t : {0, 1, 7, 1000}) {
      for (std::int64_t h : {1, 16, 128}) {
        if (t * h > max_rows) continue;
        for (std::int64_t d : {128, 64}) {
          for (auto form : {MergeCase::Form::kGeneral, MergeCase::Form::kInplace,
                            MergeCase::Form::kGeneralAliased}) {
            MergeCase c;
            c.dtype = dtype;
            c.tokens = t;
            c.heads = h;
            c.dim = d;
            c.form = form;
            c.seed = seed++;
            fn(c);
          }
        }
      }
    }
  }
}

}  // namespace fp8mla::test
