// MlaLayer::calibrate (docs/design.md section 5): a sample batch through the layer's own
// projection and RoPE steps on the BF16 path, the amax of each FP8 input, and the static scales
// that follow from them.
#include <cmath>

#include "fp8mla/error.hpp"
#include "fp8mla/mla_layer.hpp"
#include "fp8mla/numerics.hpp"
#include "fp8mla/quantize.hpp"
#include "model/mla_executor.hpp"

namespace fp8mla {

void MlaCalibration::apply_to(MlaPrefillOptions& options) const {
  options.fp8 = fp8;
  options.cache_scale_inv = cache_scale_inv;
}

float mla_scale_inv_from_amax(float amax, float headroom, std::string_view what) {
  if (!(headroom >= 1.0f) || !std::isfinite(headroom)) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("MlaLayer calibration: expected a finite headroom >= 1, got ", headroom));
  }
  if (!std::isfinite(amax) || amax < 0.0f) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("MlaLayer calibration: expected a finite amax >= 0 of ", what, ", got ",
                       amax, " (the sample batch holds non-finite values)"));
  }
  if (amax == 0.0f) return 1.0f;  // all zeros: every scale represents them
  return 1.0f / std::max(amax * headroom / kE4M3Max, kMinDynamicScale);
}

MlaCalibration mla_calibration_from_amax(const MlaActivationAmax& amax, float headroom) {
  MlaCalibration c;
  c.amax = amax;
  c.headroom = headroom;
  c.fp8.q_scale_inv = mla_scale_inv_from_amax(amax.q, headroom, "Q");
  c.fp8.k_scale_inv = mla_scale_inv_from_amax(amax.k, headroom, "K");
  c.fp8.v_scale_inv = mla_scale_inv_from_amax(amax.v, headroom, "V");
  c.cache_scale_inv = mla_scale_inv_from_amax(amax.cache, headroom, "the latent cache rows");
  return c;
}

MlaActivationAmax run_mla_calibration(MlaExecutor& x, const MlaPrefillCall& call) {
  x.begin(call);
  x.project();
  const MlaActivationAmax amax = x.activation_amax();
  x.finish();
  return amax;
}

MlaCalibration MlaLayer::calibrate(const TensorView& hidden, const MlaBatch& batch,
                                   const MlaCalibrationOptions& options, CudaStream stream) {
  const OneCallAtATime one(*impl_, "MlaLayer::calibrate");
  const std::int64_t T = batch.extend_tokens();
  const auto fail = [](auto&&... what) {
    throw Error(ErrorCategory::kInvalidArgument, concat("MlaLayer::calibrate: ", what...));
  };
  if (!(options.headroom >= 1.0f) || !std::isfinite(options.headroom))
    fail("expected a finite headroom >= 1, got ", options.headroom);
  if (T < 1) fail("expected a sample batch with at least one extend token, got ", T);
  if (hidden.device() != device_ || hidden.dtype() != DType::kBF16 || hidden.ndim() != 2 ||
      hidden.size(0) != T || hidden.size(1) != config_.hidden || !hidden.is_contiguous()) {
    fail("expected `hidden` contiguous bf16 [", T, ", ", config_.hidden, "] on ",
         to_string(device_), " (T = the batch's extend tokens), got ", hidden.describe());
  }
  const MlaPrefillOptions defaults;
  MlaBatchPlan plan;
  plan_mla_batch(config_, batch, defaults, plan, "MlaLayer::calibrate");
  // Only the extend tokens are measured: the plan keeps their positions and drops the prefix keys.
  plan.prefix_rows.clear();
  plan.prefix_attention = PrefixAttention::kNone;
  plan.chunks.clear();
  plan.chunk_first_row.clear();
  plan.cu_k_one_shot = plan.cu_q;
  plan.max_k_one_shot = plan.max_q;
  const MlaPath bf16_path{};
  const TensorView workspace = impl_->executor->calibration_workspace(plan, bf16_path);
  const TensorView none;
  const MlaPrefillCall call{hidden,    plan,      none,    nullptr, defaults, none,
                            workspace, bf16_path, nullptr, stream,  nullptr};
  return mla_calibration_from_amax(run_mla_calibration(*impl_->executor, call), options.headroom);
}

}  // namespace fp8mla
