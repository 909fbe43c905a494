// MlaLayer::calibrate on the CPU (tiny preset; docs/design.md section 5): the amax of Q, K, V and
// the latent cache rows equals a float64 computation of the same quantities from the weights;
// the scales follow the documented rule; on a layer whose activations sit far from 1 (Q x 128,
// the latent rows and so K and V / 128) the FP8 path with the unit scales loses its accuracy and
// with scales calibrated on another sample batch gets it back; bad inputs are clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "error_test_util.hpp"
#include "fp8mla/attention_backend.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_layer.hpp"
#include "fp8mla/mla_prep.hpp"
#include "fp8mla/numerics.hpp"
#include "fp8mla/quantize.hpp"
#include "mla_layer_test_util.hpp"

namespace fp8mla {
namespace {

using test::expect_error;

// Multiplies a bf16 tensor's elements by a power of two (exact).
void scale_bf16(const TensorView& t, float gain) {
  auto* p = t.data_as<std::uint16_t>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = encode_bf16(decode_bf16(p[i]) * gain);
}

// Moves the layer's activations away from 1 without changing its function up to the output's
// scale: Q x q_gain (the q_a norm's weight), the latent rows kv_c and k_pe x kv_gain (the kv_a
// norm's weight and the hidden states; q is normalized before q_b, so it does not see the
// latter), so that the logits are unchanged with q_gain * kv_gain = 1 and V, and the output,
// scale by kv_gain.
void move_activations(MlaWeights& w, Fixture& f, float q_gain, float kv_gain) {
  scale_bf16(w.q_a_layernorm, q_gain);
  scale_bf16(w.kv_a_layernorm, kv_gain);
  scale_bf16(f.hidden_view(), kv_gain);
}

// The BF16-path quantities of the batch's extend tokens in float64 from bf16 weights (the
// layer's steps without its bf16 roundings), and their amax.
MlaActivationAmax amax_in_float64(const MlaConfig& c, const MlaWeights& w, const Fixture& f) {
  const auto matvec = [](const TensorView& weight, const std::vector<double>& x) {
    const auto* m = weight.data_as<const std::uint16_t>();
    std::vector<double> y(std::size_t(weight.size(0)), 0.0);
    for (std::int64_t o = 0; o < weight.size(0); ++o) {
      for (std::int64_t i = 0; i < weight.size(1); ++i)
        y[std::size_t(o)] += decode_bf16(m[o * weight.size(1) + i]) * x[std::size_t(i)];
    }
    return y;
  };
  const auto rms_norm = [&](std::vector<double> x, const TensorView& g) {
    double sum = 0.0;
    for (double v : x) sum += v * v;
    const double inv = 1.0 / std::sqrt(sum / double(x.size()) + c.rms_norm_eps);
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] *= inv * decode_bf16(g.data_as<const std::uint16_t>()[i]);
    return x;
  };
  std::vector<float> cos_sin(std::size_t(c.max_position * kMlaRopeDim));
  make_cos_sin_cache(TensorView(cos_sin.data(), DType::kF32, {c.max_position, kMlaRopeDim}),
                     c.rope);
  const auto rope = [&](double* x, std::int64_t position) {
    const float* cs = cos_sin.data() + position * kMlaRopeDim;
    for (int i = 0; i < kMlaRopeDim / 2; ++i) {
      const double a = x[2 * i], b = x[2 * i + 1];
      x[2 * i] = a * cs[i] - b * cs[kMlaRopeDim / 2 + i];
      x[2 * i + 1] = b * cs[i] + a * cs[kMlaRopeDim / 2 + i];
    }
  };
  double q = 0, k = 0, v = 0, cache = 0;
  const auto at_most = [](double& m, double x) { m = std::max(m, std::abs(x)); };
  std::int64_t row = 0;
  for (const MlaSequence& s : f.batch.sequences) {
    for (std::int64_t i = 0; i < s.extend; ++i, ++row) {
      std::vector<double> x(std::size_t(c.hidden));
      for (std::int64_t d = 0; d < c.hidden; ++d)
        x[std::size_t(d)] = decode_bf16(f.hidden[std::size_t(row * c.hidden + d)]);
      std::vector<double> qr =
          matvec(w.q_b_proj.weight, rms_norm(matvec(w.q_a_proj.weight, x), w.q_a_layernorm));
      const std::vector<double> latent = matvec(w.kv_a_proj_with_mqa.weight, x);
      const std::vector<double> kv_c =
          rms_norm({latent.begin(), latent.begin() + c.kv_lora_rank}, w.kv_a_layernorm);
      std::vector<double> k_pe(latent.begin() + c.kv_lora_rank, latent.end());
      rope(k_pe.data(), s.prefix + i);
      const std::vector<double> kv = matvec(w.kv_b_proj.weight, kv_c);
      for (std::int64_t h = 0; h < c.heads; ++h) {
        rope(qr.data() + h * kMlaQkDim + kMlaNopeDim, s.prefix + i);
        for (int d = 0; d < kMlaNopeDim; ++d) at_most(k, kv[std::size_t(h * 256 + d)]);
        for (int d = 0; d < kMlaVDim; ++d) at_most(v, kv[std::size_t(h * 256 + kMlaNopeDim + d)]);
      }
      for (double e : qr) at_most(q, e);
      for (double e : k_pe) at_most(k, e), at_most(cache, e);
      for (double e : kv_c) at_most(cache, e);
    }
  }
  return {float(q), float(k), float(v), float(cache)};
}

// 1 / max(amax * headroom / 448, kMinDynamicScale), or 1 for amax 0, in double.
double expected_scale_inv(double amax, double headroom) {
  if (amax == 0) return 1.0;
  return 1.0 / std::max(amax * headroom / 448.0, double(kMinDynamicScale));
}

void expect_scales_follow_amax(const MlaCalibration& c, double headroom) {
  EXPECT_EQ(c.headroom, float(headroom));
  EXPECT_NEAR(c.fp8.q_scale_inv, expected_scale_inv(c.amax.q, headroom), 1e-6 * c.fp8.q_scale_inv);
  EXPECT_NEAR(c.fp8.k_scale_inv, expected_scale_inv(c.amax.k, headroom), 1e-6 * c.fp8.k_scale_inv);
  EXPECT_NEAR(c.fp8.v_scale_inv, expected_scale_inv(c.amax.v, headroom), 1e-6 * c.fp8.v_scale_inv);
  EXPECT_NEAR(c.cache_scale_inv, expected_scale_inv(c.amax.cache, headroom),
              1e-6 * c.cache_scale_inv);
}

TEST(MlaCalibrationCpu, AmaxMatchesFloat64AndScalesFollowTheRule) {
  Fixture f({{0, 20}, {300, 7}, {5, 0}, {17, 9}}, 11);
  MlaWeights w = generate_mla_weights(f.config, WeightFormat::kBf16, 5);
  for (const auto [q_gain, kv_gain] : {std::pair{1.0f, 1.0f}, std::pair{128.0f, 1.0f / 128}}) {
    SCOPED_TRACE(::testing::Message() << "q x " << q_gain << ", latent x " << kv_gain);
    move_activations(w, f, q_gain, kv_gain);
    MlaLayer layer(f.config, w);
    const MlaActivationAmax ref = amax_in_float64(f.config, w, f);
    for (const float headroom : {1.0f, kMlaCalibrationHeadroom, 3.0f}) {
      const MlaCalibration c = layer.calibrate(f.hidden_view(), f.batch, {headroom});
      std::printf(
          "[ calib    ] amax q %.4g k %.4g v %.4g cache %.4g (float64 %.4g %.4g %.4g %.4g)\n",
          c.amax.q, c.amax.k, c.amax.v, c.amax.cache, ref.q, ref.k, ref.v, ref.cache);
      // The layer's quantities are bf16 (and its sums f32): within a few bf16 steps of float64.
      const float got[] = {c.amax.q, c.amax.k, c.amax.v, c.amax.cache};
      const float want[] = {ref.q, ref.k, ref.v, ref.cache};
      for (int i = 0; i < 4; ++i) {
        EXPECT_GT(want[i], 0.0f);
        EXPECT_NEAR(got[i], want[i], 0.02 * want[i]) << "quantity " << i << " (q, k, v, cache)";
      }
      expect_scales_follow_amax(c, headroom);
    }
    move_activations(w, f, 1.0f / q_gain, 1.0f / kv_gain);
  }
}

// One sequence in two prefills, as an engine runs it: the first `prefix` tokens (writing their
// latent rows to the cache with the options' cache scale), then the others over them. Returns
// the second prefill's output, [N - prefix, hidden].
std::vector<std::uint16_t> prefill_in_two(MlaLayer& layer, Fixture& f, std::int64_t prefix,
                                          const AttentionBackend& backend,
                                          const MlaPrefillOptions& o) {
  const MlaSequence& all = f.batch.sequences.at(0);
  const std::int64_t H = f.config.hidden, rest = all.extend - prefix;
  MlaBatch first{{{0, prefix, {all.slots.begin(), all.slots.begin() + prefix}}}};
  MlaBatch second{{{prefix, rest, all.slots}}};
  std::vector<std::uint16_t> out_first(std::size_t(prefix * H)), out(std::size_t(rest * H));
  layer.prefill(TensorView(f.hidden.data(), DType::kBF16, {prefix, H}), first, f.cache_view(),
                backend, o, TensorView(out_first.data(), DType::kBF16, {prefix, H}));
  layer.prefill(TensorView(f.hidden.data() + prefix * H, DType::kBF16, {rest, H}), second,
                f.cache_view(), backend, o, TensorView(out.data(), DType::kBF16, {rest, H}));
  return out;
}

class MlaCalibrationAccuracy : public ::testing::TestWithParam<WeightFormat> {};

// Q x 512 saturates e4m3 at the unit scale, the latent rows and K, V / 512 sink into its
// subnormals (the cache and the attention inputs alike): the FP8 path's cosine against float64
// falls far (0.79 measured); with the scales calibrated on another batch of the same layer it is
// back at the FP8 path's accuracy on the unscaled layer with the unit scales (0.9994 with bf16
// weights, 0.9983 with FP8 weights, LayerAccuracy's bounds), within 2e-4 of it.
TEST_P(MlaCalibrationAccuracy, CalibratedScalesRecoverTheFp8Path) {
  constexpr std::int64_t kTokens = 160, kPrefix = 96;
  constexpr float kGain = 512;
  const std::unique_ptr<AttentionBackend> fp8 = make_attention_backend("cpu");
  // The layer's FP8-path cosine against float64 over the tokens after kPrefix, run in two.
  const auto accuracy = [&](MlaWeights& w, Fixture& f, const MlaPrefillOptions& o) {
    std::vector<double> ref(f.hidden.size());
    mla_prefill_reference(f.config, w, f.hidden_view(), f.batch, f.cache_view(), 1.0f, ref.data());
    MlaLayer layer(f.config, w);
    return compare(prefill_in_two(layer, f, kPrefix, *fp8, o),
                   {ref.begin() + kPrefix * f.config.hidden, ref.end()})
        .cosine;
  };
  Fixture f({{0, kTokens}}, 21);
  MlaWeights w = generate_mla_weights(f.config, GetParam(), 8);
  const double unscaled = accuracy(w, f, {});
  move_activations(w, f, kGain, 1.0f / kGain);
  Fixture sample({{0, 50}, {200, 30}}, 22);
  scale_bf16(sample.hidden_view(), 1.0f / kGain);
  const MlaCalibration cal = MlaLayer(f.config, w).calibrate(sample.hidden_view(), sample.batch);
  std::printf(
      "[ calib    ] amax q %.4g k %.4g v %.4g cache %.4g; scale_inv q %.4g k %.4g v %.4g "
      "cache %.4g\n",
      cal.amax.q, cal.amax.k, cal.amax.v, cal.amax.cache, cal.fp8.q_scale_inv, cal.fp8.k_scale_inv,
      cal.fp8.v_scale_inv, cal.cache_scale_inv);
  MlaPrefillOptions calibrated;
  cal.apply_to(calibrated);
  EXPECT_EQ(calibrated.fp8.q_scale_inv, cal.fp8.q_scale_inv);
  EXPECT_EQ(calibrated.fp8.v_scale_inv, cal.fp8.v_scale_inv);
  EXPECT_EQ(calibrated.cache_scale_inv, cal.cache_scale_inv);
  const double unit = accuracy(w, f, {}), tuned = accuracy(w, f, calibrated);
  std::printf(
      "[ calib    ] fp8 path cosine: unscaled layer %.6f; scaled layer, unit scales %.6f, "
      "calibrated %.6f\n",
      unscaled, unit, tuned);
  EXPECT_LT(unit, 0.9);
  const std::vector<double> no_reference;
  EXPECT_GE(tuned, LayerAccuracy(GetParam(), no_reference).min_cosine(true));
  EXPECT_GE(tuned, unscaled - 2e-4);
}

INSTANTIATE_TEST_SUITE_P(Weights, MlaCalibrationAccuracy,
                         ::testing::Values(WeightFormat::kBf16, WeightFormat::kFp8Block),
                         [](const auto& info) {
                           return info.param == WeightFormat::kBf16 ? "bf16" : "fp8_block";
                         });

TEST(MlaCalibrationCpu, ZeroAmaxKeepsTheUnitScaleAndBadInputsAreClearErrors) {
  const MlaCalibration zero = mla_calibration_from_amax({0, 2, 0, 1e-30f});
  EXPECT_EQ(zero.fp8.q_scale_inv, 1.0f);
  EXPECT_EQ(zero.fp8.v_scale_inv, 1.0f);
  EXPECT_FLOAT_EQ(zero.fp8.k_scale_inv, 112.0f);                   // 448 / (2 * 2)
  EXPECT_FLOAT_EQ(zero.cache_scale_inv, 1.0f / kMinDynamicScale);  // the floor
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  expect_error(
      [&] {
        mla_calibration_from_amax({1, nan, 1, 1});
      },
      ErrorCategory::kInvalidArgument, {"finite amax >= 0 of K", "non-finite"});
  expect_error(
      [&] {
        mla_calibration_from_amax({1, 1, 1, inf});
      },
      ErrorCategory::kInvalidArgument, {"of the latent cache rows"});
  expect_error(
      [&] {
        mla_calibration_from_amax({1, 1, 1, 1}, 0.5f);
      },
      ErrorCategory::kInvalidArgument, {"headroom >= 1, got 0.5"});

  Fixture f({{4, 3}, {0, 2}}, 2);
  MlaLayer layer(f.config, generate_mla_weights(f.config, WeightFormat::kBf16, 1));
  expect_error([&] { layer.calibrate(f.hidden_view(), f.batch, {0.0f}); },
               ErrorCategory::kInvalidArgument, {"MlaLayer::calibrate", "headroom >= 1"});
  MlaBatch empty{{{4, 0, {0, 1, 2, 3}}}};
  expect_error(
      [&] {
        layer.calibrate(TensorView(f.hidden.data(), DType::kBF16, {0, 512}), empty);
      },
      ErrorCategory::kInvalidArgument, {"at least one extend token, got 0"});
  expect_error(
      [&] {
        layer.calibrate(TensorView(f.hidden.data(), DType::kBF16, {f.tokens, 256}), f.batch);
      },
      ErrorCategory::kInvalidArgument, {"expected `hidden` contiguous bf16 [5, 512]"});
  expect_error(
      [&] {
        layer.calibrate(test::fake(DType::kBF16, {5, 512}, Device::cuda(0)), f.batch);
      },
      ErrorCategory::kInvalidArgument, {"on cpu"});
  MlaBatch short_slots = f.batch;
  short_slots.sequences[0].slots.pop_back();
  expect_error([&] { layer.calibrate(f.hidden_view(), short_slots); },
               ErrorCategory::kInvalidArgument,
               {"MlaLayer::calibrate: sequence 0: expected prefix, extend >= 0"});
  f.hidden[7] = encode_bf16(nan);
  expect_error([&] { layer.calibrate(f.hidden_view(), f.batch); }, ErrorCategory::kInvalidArgument,
               {"non-finite"});
}

}  // namespace
}  // namespace fp8mla
