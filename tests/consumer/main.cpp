#include <cstdio>

#include <fp8mla/numerics.hpp>
#include <fp8mla/runtime_info.hpp>
#include <fp8mla/tensor_view.hpp>
#include <fp8mla/version.hpp>
#if defined(CONSUMER_WITH_MODEL)
#include <fp8mla/mla_config.hpp>
#include <fp8mla/mla_layer.hpp>
#endif

int main() {
  const fp8mla::TensorView q(nullptr, fp8mla::DType::kE4M3, {8, 128, 192});
  bool ok = q.numel() == 8 * 128 * 192 && fp8mla::encode_e4m3(448.0f) == 0x7E &&
            fp8mla::build_info().version == fp8mla::kVersionString;
#if defined(CONSUMER_WITH_MODEL)
  const fp8mla::MlaConfig config = fp8mla::mla_preset("tiny");
  const fp8mla::MlaLayer layer(
      config, fp8mla::generate_mla_weights(config, fp8mla::WeightFormat::kBf16, 1));
  ok = ok && layer.projection_notes().size() == 5;
#endif
  std::printf("consumer: fp8mla %s %s\n", fp8mla::kVersionString, ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
