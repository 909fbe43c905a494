// Runs the catalogue of bad inputs (bad_inputs_*_test.cpp): every entry is rejected with a clear
// error and leaves every buffer as it was; the calls they break succeed; and prefill_attention
// over a scan of head dims either matches a float64 reference or says the dims are unsupported.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "bad_inputs_catalogue.hpp"
#include "fp8mla/attention.hpp"
#include "fp8mla/numerics.hpp"

namespace fp8mla::test {
namespace {

std::size_t walk(const char* part, const std::vector<BadInput>& entries) {
  for (const BadInput& entry : entries) {
    EXPECT_FALSE(entry.needles.empty()) << entry.name << ": checks no message";
    expect_rejected(entry);
  }
  std::printf("bad inputs catalogue: %zu entries (%s)\n", entries.size(), part);
  return entries.size();
}

TEST(BadInputs, Quantize) {
  EXPECT_GE(walk("quantize", quantize_bad_inputs()), 30u);
}
TEST(BadInputs, MlaPrep) {
  EXPECT_GE(walk("mla prep", mla_prep_bad_inputs()), 40u);
}
TEST(BadInputs, Attention) {
  EXPECT_GE(walk("attention", attention_bad_inputs()), 50u);
}
TEST(BadInputs, Model) {
  EXPECT_GE(walk("backends and layer", model_bad_inputs()), 30u);
}

TEST(BadInputs, EntriesAreDistinct) {
  std::set<std::string> names;
  std::size_t total = 0;
  for (const auto& part :
       {quantize_bad_inputs(), mla_prep_bad_inputs(), attention_bad_inputs(), model_bad_inputs()}) {
    for (const BadInput& entry : part) {
      EXPECT_TRUE(names.insert(entry.name).second) << "two entries named " << entry.name;
      ++total;
    }
  }
  std::printf("bad inputs catalogue: %zu entries in all\n", total);
  EXPECT_GE(total, 60u);
}

// The calls the entries break, unbroken, succeed (on the same kind of buffers).
TEST(BadInputs, ValidCallsSucceed) {
  for (const auto& part : {quantize_valid_calls(), mla_prep_valid_calls(), attention_valid_calls(),
                           model_valid_calls()}) {
    for (const ValidCall& valid : part) {
      Arena arena;
      EXPECT_NO_THROW(valid.call(arena)) << valid.name;
    }
  }
}

// ---- Head-dim scan ------------------------------------------------------------------------------

struct ScanInputs {
  std::vector<std::uint8_t> q, k, v;  // bf16 (2 bytes an element) or e4m3 (1)
  std::vector<double> qd, kd, vd;     // the values the op sees, dequantized
};

// Random values in [-1, 1), stored as `dtype` and read back as the op reads them.
void fill(std::vector<std::uint8_t>& bytes, std::vector<double>& values, DType dtype,
          std::int64_t n, float descale, Rng& rng) {
  bytes.assign(std::size_t(n * dtype_size(dtype)), 0);
  values.resize(std::size_t(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = 2.0f * rng.uniform() - 1.0f;
    if (dtype == DType::kBF16) {
      const std::uint16_t b = encode_bf16(x);
      std::memcpy(bytes.data() + 2 * i, &b, 2);
      values[std::size_t(i)] = decode_bf16(b);
    } else {
      bytes[std::size_t(i)] = encode_e4m3(x / descale);
      values[std::size_t(i)] = double(decode_e4m3(bytes[std::size_t(i)]) * descale);
    }
  }
}

// The float64 attention of one sequence: bottom-right causal over tk keys for tq queries.
void reference(const ScanInputs& in, std::int64_t tq, std::int64_t tk, std::int64_t heads,
               std::int64_t dqk, std::int64_t dv, double scale, std::vector<double>& out,
               std::vector<double>& lse) {
  out.assign(std::size_t(tq * heads * dv), 0.0);
  lse.assign(std::size_t(tq * heads), -INFINITY);
  for (std::int64_t i = 0; i < tq; ++i) {
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t visible = std::min(tk, i + tk - tq + 1);
      std::vector<double> s(static_cast<std::size_t>(visible));
      double m = -INFINITY;
      for (std::int64_t j = 0; j < visible; ++j) {
        double dot = 0;
        for (std::int64_t d = 0; d < dqk; ++d) {
          dot += in.qd[std::size_t((i * heads + h) * dqk + d)] *
                 in.kd[std::size_t((j * heads + h) * dqk + d)];
        }
        s[std::size_t(j)] = scale * dot;
        m = std::max(m, s[std::size_t(j)]);
      }
      double l = 0;
      for (std::int64_t j = 0; j < visible; ++j) {
        const double p = std::exp(s[std::size_t(j)] - m);
        l += p;
        for (std::int64_t d = 0; d < dv; ++d) {
          out[std::size_t((i * heads + h) * dv + d)] +=
              p * in.vd[std::size_t((j * heads + h) * dv + d)];
        }
      }
      for (std::int64_t d = 0; d < dv; ++d) out[std::size_t((i * heads + h) * dv + d)] /= l;
      lse[std::size_t(i * heads + h)] = m + std::log(l);
    }
  }
}

// prefill_attention at (dqk, dv): true when it ran and matched the reference, false when it
// rejected the dims with a clear kUnsupported error; any other outcome is a test failure.
bool scan_one(DType dtype, std::int64_t dqk, std::int64_t dv) {
  constexpr std::int64_t tq = 3, tk = 5, heads = 2;
  constexpr float descale = 0.5f;
  const double scale = 1.0 / std::sqrt(double(dqk));
  Rng rng(std::uint64_t(dqk * 1000 + dv));
  ScanInputs in;
  const float d = dtype == DType::kE4M3 ? descale : 1.0f;
  fill(in.q, in.qd, dtype, tq * heads * dqk, d, rng);
  fill(in.k, in.kd, dtype, tk * heads * dqk, d, rng);
  fill(in.v, in.vd, dtype, tk * heads * dv, d, rng);
  std::vector<std::int32_t> cu_q = {0, tq}, cu_k = {0, tk};
  float descales[3] = {descale, descale, descale};
  HostBuffer out(std::size_t(tq * heads * dv * 2)), lse(std::size_t(tq * heads * 4));

  PrefillAttentionArgs a;
  a.q = TensorView(in.q.data(), dtype, {tq, heads, dqk});
  a.k = TensorView(in.k.data(), dtype, {tk, heads, dqk});
  a.v = TensorView(in.v.data(), dtype, {tk, heads, dv});
  a.cu_seqlens_q = TensorView(cu_q.data(), DType::kI32, {2});
  a.cu_seqlens_k = TensorView(cu_k.data(), DType::kI32, {2});
  a.max_seqlen_q = int(tq);
  a.max_seqlen_k = int(tk);
  a.softmax_scale = float(scale);
  if (dtype == DType::kE4M3) {
    a.q_descale = TensorView(&descales[0], DType::kF32, {1});
    a.k_descale = TensorView(&descales[1], DType::kF32, {1});
    a.v_descale = TensorView(&descales[2], DType::kF32, {1});
  }
  a.out = TensorView(out.data(), DType::kBF16, {tq, heads, dv});
  a.lse = TensorView(lse.data(), DType::kF32, {tq, heads});
  const std::string where = concat(dtype_name(dtype), " Dqk ", dqk, " Dv ", dv);
  try {
    prefill_attention(a);
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kUnsupported) << where << ": " << e.what();
    const std::int64_t bad = e.message().find("`q`") != std::string::npos ? dqk : dv;
    EXPECT_NE(e.message().find("expected a head dim of"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find(concat(", ", bad, "]")), std::string::npos)
        << where << ": the message does not give the head dim: " << e.message();
    EXPECT_TRUE(out.guards_intact() && lse.guards_intact()) << where;
    return false;
  }
  std::vector<double> want_out, want_lse;
  reference(in, tq, tk, heads, dqk, dv, scale, want_out, want_lse);
  const auto* got = reinterpret_cast<const std::uint16_t*>(out.data());
  for (std::size_t i = 0; i < want_out.size(); ++i) {
    const double o = decode_bf16(got[i]);
    EXPECT_NEAR(o, want_out[i], 0x1p-8 * std::abs(want_out[i]) + 1e-4) << where << " out " << i;
  }
  const auto* got_lse = reinterpret_cast<const float*>(lse.data());
  for (std::size_t i = 0; i < want_lse.size(); ++i) {
    EXPECT_NEAR(got_lse[i], want_lse[i], 1e-4) << where << " lse " << i;
  }
  EXPECT_TRUE(out.guards_intact() && lse.guards_intact()) << where;
  return true;
}

TEST(BadInputs, HeadDimScanIsCorrectOrRejected) {
  const std::int64_t dqks[] = {32, 64, 96, 128, 160, 192, 256, 512, 576};
  const std::int64_t dvs[] = {32, 64, 96, 128, 192, 256, 512};
  for (DType dtype : {DType::kBF16, DType::kE4M3}) {
    std::string ran;
    for (std::int64_t dqk : dqks) {
      for (std::int64_t dv : dvs) {
        if (scan_one(dtype, dqk, dv)) ran += concat(" ", dqk, "/", dv);
      }
    }
    std::printf("head-dim scan, %s: matched the reference at%s; the rest rejected\n",
                std::string(dtype_name(dtype)).c_str(), ran.c_str());
    // MLA's dims must run: a scan that rejected everything would prove nothing.
    EXPECT_NE(ran.find(" 192/128"), std::string::npos) << dtype_name(dtype);
  }
}

}  // namespace
}  // namespace fp8mla::test
