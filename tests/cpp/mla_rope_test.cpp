// CPU semantics of make_cos_sin_cache, softmax_mscale and mla_rope_quantize_fp8: values against
// references written here (float64 tables and RoPE accuracy, an fp32 reference of the exact
// arithmetic), every output byte written and nothing else (poison and guard bands), and every bad
// input a clear error that writes nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <numbers>
#include <string>
#include <vector>

#include "buffer_test_util.hpp"
#include "error_test_util.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_prep.hpp"
#include "mla_rope_test_util.hpp"

namespace fp8mla {
namespace {

using test::Data;
using test::HostBuffer;
using test::kPoison;
using test::RopeCase;

// ---- make_cos_sin_cache / softmax_mscale -----------------------------------------------------

// DeepSeek-V3's YaRN inv_freq and magnitude, re-derived here in double.
std::vector<double> expected_inv_freq(const RopeConfig& c, double& m) {
  const int d = c.rope_dim;
  std::vector<double> f(d / 2);
  m = 1.0;
  for (int i = 0; i < d / 2; ++i) f[i] = std::pow(c.theta, -2.0 * i / d);
  if (!c.yarn) return f;
  const YarnScaling& y = *c.yarn;
  const auto dim_of = [&](double r) {
    return d * std::log(double(y.original_max_position) / (r * 2 * std::numbers::pi)) /
           (2 * std::log(c.theta));
  };
  const double low = std::max(std::floor(dim_of(y.beta_fast)), 0.0);
  double high = std::min(std::ceil(dim_of(y.beta_slow)), double(d - 1));
  if (low == high) high += 0.001;
  for (int i = 0; i < d / 2; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double extra = 1.0 / std::pow(c.theta, 2.0 * i / d);
    const double inter = 1.0 / (y.factor * std::pow(c.theta, 2.0 * i / d));
    f[i] = inter * ramp + extra * (1.0 - ramp);
  }
  const auto g = [](double s, double mm) { return s <= 1 ? 1.0 : 0.1 * mm * std::log(s) + 1.0; };
  m = g(y.factor, y.mscale) / g(y.factor, y.mscale_all_dim);
  return f;
}

void expect_table(const RopeConfig& config, std::int64_t max_pos, std::int64_t row_pad) {
  const std::int64_t d = config.rope_dim, stride = d + row_pad;
  std::vector<float> table(std::size_t(max_pos * stride), -7.0f);
  make_cos_sin_cache(TensorView(table.data(), DType::kF32, {max_pos, d}, {stride, 1}), config);
  double m = 1.0;
  const std::vector<double> f = expected_inv_freq(config, m);
  for (std::int64_t p = 0; p < max_pos; ++p) {
    for (std::int64_t i = 0; i < d / 2; ++i) {
      ASSERT_EQ(table[p * stride + i], float(std::cos(double(p) * f[i]) * m)) << p << " " << i;
      ASSERT_EQ(table[p * stride + d / 2 + i], float(std::sin(double(p) * f[i]) * m))
          << p << " " << i;
    }
    for (std::int64_t i = d; i < stride; ++i) ASSERT_EQ(table[p * stride + i], -7.0f);
  }
}

TEST(MlaRopeCosSin, PlainMatchesDouble) {
  RopeConfig c;
  expect_table(c, 300, 0);
  expect_table(c, 17, 5);
  c.rope_dim = 8;
  c.theta = 500.0;
  expect_table(c, 9, 0);
}

TEST(MlaRopeCosSin, YarnMatchesDeepSeekV3) {
  RopeConfig c;
  c.yarn = YarnScaling{};  // DeepSeek-V3: factor 40, 4096, beta 32/1, mscale 1/1
  expect_table(c, 300, 3);
  c.yarn->mscale = 0.707;
  expect_table(c, 50, 0);
  c.yarn->factor = 1.0;  // get_mscale = 1
  expect_table(c, 20, 0);
}

TEST(MlaRopeCosSin, KnownEntries) {
  RopeConfig c;
  c.yarn = YarnScaling{};
  c.yarn->mscale = 0.707;  // m = (0.0707 ln 40 + 1) / (0.1 ln 40 + 1)
  const double m = (0.1 * 0.707 * std::log(40.0) + 1) / (0.1 * std::log(40.0) + 1);
  std::vector<float> t(2 * 64);
  make_cos_sin_cache(TensorView(t.data(), DType::kF32, {2, 64}), c);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(t[i], float(m));   // cos(0) * m
    EXPECT_EQ(t[32 + i], 0.0f);  // sin(0) * m
  }
  // DeepSeek-V3's correction range is [10, 23]: index 0 keeps freq_extra = 1, index 31 is
  // freq_inter = 1 / (40 * 10000^(62/64)).
  EXPECT_EQ(t[64 + 0], float(std::cos(1.0) * m));
  EXPECT_EQ(t[64 + 32 + 31], float(std::sin(1.0 / (40.0 * std::pow(10000.0, 62.0 / 64))) * m));
}

TEST(MlaRopeMscale, Values) {
  RopeConfig c;
  EXPECT_EQ(softmax_mscale(c), 1.0);
  c.yarn = YarnScaling{};
  EXPECT_DOUBLE_EQ(softmax_mscale(c), 0.1 * std::log(40.0) + 1.0);
  c.yarn->mscale_all_dim = 0.707;
  EXPECT_DOUBLE_EQ(softmax_mscale(c), 0.1 * 0.707 * std::log(40.0) + 1.0);
  c.yarn->factor = 1.0;
  EXPECT_EQ(softmax_mscale(c), 1.0);
}

using test::expect_error;

TEST(MlaRopeCosSin, BadArguments) {
  std::vector<float> t(64 * 4);
  RopeConfig c;
  expect_error(
      [&] {
        make_cos_sin_cache(TensorView(t.data(), DType::kF32, {4, 32}), c);
      },
      ErrorCategory::kInvalidArgument, {"make_cos_sin_cache", "`cos_sin`", "64"});
  expect_error(
      [&] {
        make_cos_sin_cache(TensorView(t.data(), DType::kF16, {4, 64}), c);
      },
      ErrorCategory::kInvalidArgument, {"`cos_sin` dtype", "f32"});
  c.rope_dim = 63;
  expect_error(
      [&] {
        make_cos_sin_cache(TensorView(t.data(), DType::kF32, {4, 63}), c);
      },
      ErrorCategory::kInvalidArgument, {"rope_dim", "63"});
  c.rope_dim = 64;
  // Rows on one another (a zero or short row stride) would write one over the other.
  for (std::int64_t row_stride : {0, 32}) {
    const std::vector<float> before = t;
    expect_error(
        [&] {
          make_cos_sin_cache(TensorView(t.data(), DType::kF32, {4, 64}, {row_stride, 1}), c);
        },
        ErrorCategory::kInvalidArgument,
        {"`cos_sin`: expected strides that keep every element apart"});
    EXPECT_EQ(t, before);
  }
  c.rope_dim = 64;
  c.yarn = YarnScaling{};
  c.yarn->factor = -1.0;
  expect_error(
      [&] {
        make_cos_sin_cache(TensorView(t.data(), DType::kF32, {4, 64}), c);
      },
      ErrorCategory::kInvalidArgument, {"factor"});
}

// ---- mla_rope_quantize_fp8 ---------------------------------------------------------------------

// Runs the case on the CPU and compares every byte of every buffer with the reference.
void expect_matches_reference(const RopeCase& c) {
  SCOPED_TRACE(c.describe());
  std::vector<HostBuffer> b = c.buffers();
  c.init(b);
  std::vector<HostBuffer> want = c.buffers();
  for (std::size_t i = 0; i < b.size(); ++i) std::memcpy(want[i].data(), b[i].data(), b[i].bytes());
  test::reference_outputs(c, want);
  c.run(test::host_bases(b), Device::cpu());
  for (std::size_t i = 0; i < b.size(); ++i) {
    ASSERT_TRUE(test::same_bytes(b[i].payload(), want[i].payload(), concat("buffer ", i)));
    ASSERT_TRUE(b[i].guards_intact()) << "buffer " << i;
  }
}

TEST(MlaRopeQuantize, MatrixMatchesReference) {
  for (const RopeCase& c : test::rope_matrix(Data::kRandom)) expect_matches_reference(c);
}

TEST(MlaRopeQuantize, AdversarialMatchesReference) {
  for (RopeCase c : test::rope_matrix(Data::kAdversarial)) {
    if (c.tokens * c.heads > 20000) continue;
    expect_matches_reference(c);
  }
}

TEST(MlaRopeQuantize, EveryTokenCount) {
  for (std::int64_t n = 0; n <= 64; ++n) {
    RopeCase c;
    c.tokens = n;
    c.heads = 3;
    c.strided = n % 2 == 1;
    c.style = n % 3 == 0 ? RopeStyle::kNeox : RopeStyle::kInterleaved;
    c.page_size = 16;
    c.split_k = n % 4 == 1;
    c.no_k_nope = n % 8 >= 5;
    c.seed = std::uint64_t(n) + 100;
    expect_matches_reference(c);
  }
}

// e4m3 spacing at |v| (normal range from 2^-6, subnormal step 2^-9).
double e4m3_ulp(double v) {
  const double a = std::fabs(v);
  if (a < 0x1p-6) return 0x1p-9;
  return std::ldexp(1.0, int(std::floor(std::log2(a))) - 3);
}

// RoPE outputs are within one FP8 rounding of the float64 RoPE of the same inputs and table.
TEST(MlaRopeQuantize, RopeWithinHalfUlpOfFloat64) {
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kNeox}) {
    const RopeCase c{.tokens = 200,
                     .heads = 4,
                     .style = style,
                     .q_scale_inv = 0.8f,
                     .k_scale_inv = 2.5f,
                     .page_size = 16,
                     .cache_scale_inv = 0.5f};
    SCOPED_TRACE(c.describe());
    std::vector<HostBuffer> b = c.buffers();
    c.init(b);
    c.run(test::host_bases(b), Device::cpu());
    const std::vector<test::ViewSpec> v = c.views();
    const auto* cs_base = reinterpret_cast<const float*>(b[test::kCosSin].data());
    std::int64_t checked = 0;
    const auto check = [&](const test::ViewSpec& in, std::int64_t t, std::int64_t h,
                           const std::uint8_t* out, double scale_inv) {
      const std::int64_t pos = c.position(t);
      const float* cs = cs_base + pos * v[test::kCosSin].strides[0];
      const auto x = [&](int i) {
        return double(test::load_f32(b[in.buffer].data() + in.byte_at(t, h, 0), in.dtype, i));
      };
      for (int i = 0; i < 32; ++i) {
        const int a = style == RopeStyle::kInterleaved ? 2 * i : i;
        const int bb = style == RopeStyle::kInterleaved ? 2 * i + 1 : i + 32;
        const double ys[2] = {(x(a) * cs[i] - x(bb) * cs[32 + i]) * scale_inv,
                              (x(bb) * cs[i] + x(a) * cs[32 + i]) * scale_inv};
        const double bound[2] = {
            (std::fabs(x(a) * cs[i]) + std::fabs(x(bb) * cs[32 + i])) * scale_inv * 0x1p-22,
            (std::fabs(x(bb) * cs[i]) + std::fabs(x(a) * cs[32 + i])) * scale_inv * 0x1p-22};
        const int at[2] = {a, bb};
        for (int e = 0; e < 2; ++e) {
          const double got = decode_e4m3(out[at[e]]);
          const double want = std::clamp(ys[e], -448.0, 448.0);
          ASSERT_LE(std::fabs(got - want), 0.5 * e4m3_ulp(want) + bound[e])
              << "token " << t << " head " << h << " element " << at[e];
          ++checked;
        }
      }
    };
    for (std::int64_t t = 0; t < c.tokens; ++t) {
      for (std::int64_t h = 0; h < c.heads; ++h) {
        check(v[test::kQPe], t, h, b[test::kQOut].data() + v[test::kQOut].byte_at(t, h) + 128,
              c.q_scale_inv);
        // k_pe is 2-d: view it at head 0 through a [T, 1, 64] layout.
        test::ViewSpec k = v[test::kKPe];
        k.shape = {c.tokens, 1, 64};
        k.strides = {k.strides[0], 0, 1};
        check(k, t, 0, b[test::kKOut].data() + v[test::kKOut].byte_at(t, h) + 128, c.k_scale_inv);
      }
      const std::int64_t slot = RopeCase::load_index(b[test::kSlots].data(), c.slot_dtype, t);
      if (slot < 0) continue;
      test::ViewSpec k = v[test::kKPe];
      k.shape = {c.tokens, 1, 64};
      k.strides = {k.strides[0], 0, 1};
      check(k, t, 0,
            b[test::kCache].data() +
                v[test::kCache].byte_at(slot / c.page_size, slot % c.page_size) + 512,
            c.cache_scale_inv);
    }
    EXPECT_GT(checked, 0);
  }
}

// ---- Bad inputs: each a clear error, nothing written ------------------------------------------

class MlaRopeBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    c_.tokens = 5;
    c_.heads = 2;
    c_.page_size = 16;
    c_.strided = true;
    buffers_ = c_.buffers();
    c_.init(buffers_);
    snapshot_ = c_.buffers();
    take_snapshot();
    bases_ = test::host_bases(buffers_);
  }
  // What a rejected call must leave: the buffers as they are now (after SetUp, or a valid call).
  void take_snapshot() {
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      std::memcpy(snapshot_[i].data(), buffers_[i].data(), buffers_[i].bytes());
    }
  }
  MlaRopeQuantizeArgs args() const { return c_.args(bases_, Device::cpu()); }
  // The call throws `category` with every needle in the message and leaves every buffer as is.
  void expect_rejected(const MlaRopeQuantizeArgs& a, ErrorCategory category,
                       std::initializer_list<std::string> needles) {
    expect_error([&] { mla_rope_quantize_fp8(a); }, category, needles);
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      EXPECT_TRUE(test::same_bytes(buffers_[i].payload(), snapshot_[i].payload(),
                                   concat("buffer ", i, " after a rejected call")));
    }
  }
  TensorView bf16(std::vector<std::int64_t> shape, int buffer = test::kQNope) const {
    return TensorView(bases_[buffer], DType::kBF16, std::span<const std::int64_t>(shape));
  }

  RopeCase c_;
  std::vector<HostBuffer> buffers_, snapshot_;
  std::vector<void*> bases_;
};

TEST_F(MlaRopeBadInput, ValidCallWorks) {
  EXPECT_NO_THROW(mla_rope_quantize_fp8(args()));
}

TEST_F(MlaRopeBadInput, QNopeDtype) {
  MlaRopeQuantizeArgs a = args();
  a.q_nope = TensorView(bases_[0], DType::kF32, {5, 2, 128});
  expect_rejected(a, ErrorCategory::kInvalidArgument,
                  {"mla_rope_quantize_fp8", "`q_nope` dtype", "bf16, f16", "f32"});
}

TEST_F(MlaRopeBadInput, MixedInputDtypes) {
  MlaRopeQuantizeArgs a = args();
  a.k_nope = TensorView(bases_[test::kKNope], DType::kF16, {5, 2, 128});
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`k_nope` dtype", "bf16", "f16"});
}

TEST_F(MlaRopeBadInput, QNopeWidth) {
  MlaRopeQuantizeArgs a = args();
  a.q_nope = bf16({5, 2, 64});
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`q_nope`", "[T, H, 128]", "[5, 2, 64]"});
}

TEST_F(MlaRopeBadInput, QPeHeads) {
  MlaRopeQuantizeArgs a = args();
  a.q_pe = bf16({5, 3, 64});
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`q_pe`", "[5, 2, 64]", "[5, 3, 64]"});
}

TEST_F(MlaRopeBadInput, KNopeTokens) {
  MlaRopeQuantizeArgs a = args();
  a.k_nope = bf16({4, 2, 128}, test::kKNope);
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`k_nope`", "[5, 2, 128]", "[4, 2, 128]"});
}

TEST_F(MlaRopeBadInput, KPeNotShared) {
  MlaRopeQuantizeArgs a = args();
  a.k_pe = bf16({5, 2, 64}, test::kKPe);
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`k_pe`", "[T, 64] or [T, 1, 64]"});
}

TEST_F(MlaRopeBadInput, NonContiguousLastDim) {
  MlaRopeQuantizeArgs a = args();
  a.q_pe = TensorView(bases_[0], DType::kBF16, {5, 2, 64}, {2 * 256, 256, 2});
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`q_pe`", "contiguous last dim"});
}

TEST_F(MlaRopeBadInput, MisalignedInput) {
  MlaRopeQuantizeArgs a = args();
  a.q_nope = TensorView(static_cast<char*>(bases_[0]) + 1, DType::kBF16, {5, 2, 128});
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`q_nope`", "2-byte aligned"});
}

TEST_F(MlaRopeBadInput, PositionsDtypeAndShape) {
  MlaRopeQuantizeArgs a = args();
  a.positions = TensorView(bases_[test::kPositions], DType::kF32, {5});
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`positions` dtype", "i32, i64", "f32"});
  a = args();
  a.positions = TensorView(bases_[test::kPositions], DType::kI64, {4});
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`positions`", "[5]", "[4]"});
}

TEST_F(MlaRopeBadInput, CosSinShapeAndDtype) {
  MlaRopeQuantizeArgs a = args();
  a.cos_sin = TensorView(bases_[test::kCosSin], DType::kF32, {100, 32});
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`cos_sin`", "[max_pos, 64]", "[100, 32]"});
  a = args();
  a.cos_sin = TensorView(bases_[test::kCosSin], DType::kBF16, {100, 64});
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`cos_sin` dtype", "f32", "bf16"});
}

TEST_F(MlaRopeBadInput, SplitK) {
  MlaRopeQuantizeArgs a = args();  // k_out keeps its 192 dims though k_rope_out takes 64
  a.k_rope_out = TensorView(bases_[test::kKRopeOut], DType::kE4M3, {5, 64});
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`k_out`", "[5, 2, 128]", "[5, 2, 192]"});
  a.k_out = TensorView(bases_[test::kKOut], DType::kE4M3, {5, 2, 128}, {2 * 192, 192, 1});
  a.k_rope_out = TensorView(bases_[test::kKRopeOut], DType::kBF16, {5, 64});
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`k_rope_out` dtype", "e4m3", "bf16"});
  a.k_rope_out = TensorView(bases_[test::kKRopeOut], DType::kE4M3, {5, 2, 64});
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`k_rope_out`", "[T, 64] or [T, 1, 64]"});
  a.k_rope_out = TensorView(bases_[test::kKRopeOut], DType::kE4M3, {4, 64});
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`k_rope_out`", "T = 5"});
  a.k_rope_out = TensorView(bases_[test::kKRopeOut], DType::kE4M3, {5, 64});
  EXPECT_NO_THROW(mla_rope_quantize_fp8(a));
  take_snapshot();
  // K's nope part left out (k_nope empty): a split K then has no k_out, an unsplit one needs it
  // for its RoPE part.
  const MlaRopeQuantizeArgs split = a;
  a.k_out = TensorView();
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`k_out`"});
  a = split;
  a.k_nope = TensorView();
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`k_out`: expected none without k_nope"});
  a.k_out = TensorView();
  EXPECT_NO_THROW(mla_rope_quantize_fp8(a));
  take_snapshot();
  a.k_rope_out = TensorView();
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`k_out`"});
}

// No tokens with a split K: torch's empty tensors have no data, and are given all the same.
TEST_F(MlaRopeBadInput, SplitKOfNoTokens) {
  MlaRopeQuantizeArgs a = args();
  a.q_nope = TensorView(nullptr, DType::kBF16, {0, 2, 128});
  a.q_pe = TensorView(nullptr, DType::kBF16, {0, 2, 64});
  a.k_nope = TensorView(nullptr, DType::kBF16, {0, 2, 128});
  a.k_pe = TensorView(nullptr, DType::kBF16, {0, 64});
  a.positions = TensorView(nullptr, DType::kI64, {0});
  a.q_out = TensorView(nullptr, DType::kE4M3, {0, 2, 192});
  a.k_out = TensorView(nullptr, DType::kE4M3, {0, 2, 128});
  a.k_rope_out = TensorView(nullptr, DType::kE4M3, {0, 64});
  a.cache_write.reset();
  a.kv_c = {};
  EXPECT_NO_THROW(mla_rope_quantize_fp8(a));
  a.k_out = TensorView(nullptr, DType::kE4M3, {0, 2, 192});  // the split's k_out is 128 wide
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`k_out`", "[0, 2, 128]"});
}

TEST_F(MlaRopeBadInput, OutputDtypeAndShape) {
  MlaRopeQuantizeArgs a = args();
  a.q_out = TensorView(bases_[test::kQOut], DType::kE5M2, {5, 2, 192});
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`q_out` dtype", "e4m3", "e5m2"});
  a = args();
  a.k_out = TensorView(bases_[test::kKOut], DType::kE4M3, {5, 2, 128});
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`k_out`", "[5, 2, 192]", "[5, 2, 128]"});
}

TEST_F(MlaRopeBadInput, CacheWriteNeedsKvC) {
  MlaRopeQuantizeArgs a = args();
  a.kv_c = TensorView();
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`kv_c`", "required with cache_write"});
}

TEST_F(MlaRopeBadInput, CacheShape) {
  MlaRopeQuantizeArgs a = args();
  a.cache_write->cache = TensorView(bases_[test::kCache], DType::kE4M3, {2, 256, 576});
  expect_rejected(a, ErrorCategory::kUnsupported, {"`cache`", "page size from 1 to 128"});
  a = args();
  a.cache_write->cache = TensorView(bases_[test::kCache], DType::kE4M3, {2, 16, 512});
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`cache`", "576", "[2, 16, 512]"});
  a = args();
  a.cache_write->cache = TensorView(bases_[test::kCache], DType::kBF16, {2, 16, 576});
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`cache` dtype", "e4m3"});
}

TEST_F(MlaRopeBadInput, SlotMappingAndErrorFlag) {
  MlaRopeQuantizeArgs a = args();
  a.cache_write->slot_mapping = TensorView(bases_[test::kSlots], DType::kI64, {6});
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`slot_mapping`", "[5]", "[6]"});
  a = args();
  a.cache_write->error_flag = TensorView(bases_[test::kErrorFlag], DType::kI64, {1});
  expect_rejected(a, ErrorCategory::kInvalidArgument, {"`error_flag` dtype", "i32", "i64"});
}

TEST_F(MlaRopeBadInput, DeviceMismatch) {
  MlaRopeQuantizeArgs a = args();
  a.k_out = TensorView(bases_[test::kKOut], DType::kE4M3, {5, 2, 192}, Device::cuda(0));
  expect_error([&] { mla_rope_quantize_fp8(a); }, ErrorCategory::kInvalidArgument, {"`k_out`"});
}

TEST_F(MlaRopeBadInput, PositionOutOfRange) {
  for (std::int64_t bad : {std::int64_t(-1), c_.max_pos, std::int64_t(1) << 40}) {
    RopeCase::store_index(buffers_[test::kPositions].data(), c_.position_dtype, 3, bad);
    std::memcpy(snapshot_[test::kPositions].data(), buffers_[test::kPositions].data(), 5 * 8);
    expect_rejected(args(), ErrorCategory::kOutOfRange,
                    {"`positions`[3]", concat(bad), "[0, 4096)"});
  }
}

TEST_F(MlaRopeBadInput, SlotOutOfRange) {
  const std::int64_t slots = c_.num_pages() * c_.page_size;
  for (std::int64_t bad : {std::int64_t(-2), slots}) {
    RopeCase::store_index(buffers_[test::kSlots].data(), c_.slot_dtype, 4, bad);
    std::memcpy(snapshot_[test::kSlots].data(), buffers_[test::kSlots].data(), 5 * 8);
    expect_rejected(args(), ErrorCategory::kOutOfRange, {"`slot_mapping`[4]", concat(bad)});
  }
}

}  // namespace
}  // namespace fp8mla
