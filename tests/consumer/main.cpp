#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fp8mla/attention_backend.hpp>
#include <fp8mla/kernel_registry.hpp>
#include <fp8mla/mla_config.hpp>
#include <fp8mla/mla_layer.hpp>
#include <fp8mla/numerics.hpp>
#include <fp8mla/runtime_info.hpp>
#include <fp8mla/tensor_view.hpp>
#include <fp8mla/version.hpp>
#if defined(CONSUMER_WITH_MODEL)
#include <fp8mla/mla_weights.hpp>
#include <fp8mla/safetensors.hpp>
#endif

int main() {
  const fp8mla::TensorView q(nullptr, fp8mla::DType::kE4M3, {8, 128, 192});
  bool ok = q.numel() == 8 * 128 * 192 && fp8mla::encode_e4m3(448.0f) == 0x7E &&
            fp8mla::build_info().version == fp8mla::kVersionString;
  // The layer and the backends are in fp8mla::fp8mla.
  const fp8mla::MlaConfig config = fp8mla::mla_preset("tiny");
  const fp8mla::MlaWeights weights =
      fp8mla::generate_mla_weights(config, fp8mla::WeightFormat::kBf16, 1);
  const fp8mla::MlaLayer layer(config, weights);
  ok = ok && layer.projection_notes().size() == 5;
  const std::unique_ptr<fp8mla::AttentionBackend> cpu = fp8mla::make_attention_backend("cpu");
  ok = ok && cpu->capabilities().prepare_prefill_qkv &&
       fp8mla::compiled_attention_variants().empty() == !fp8mla::build_info().cuda;
#if defined(CONSUMER_WITH_MODEL)
  // fp8mla::model: the weights through a safetensors file.
  const std::string path =
      (std::filesystem::temp_directory_path() / "fp8mla_consumer.safetensors").string();
  fp8mla::write_safetensors(path, fp8mla::mla_weight_tensors(weights, config, 0));
  {
    const fp8mla::SafetensorsFile file(path);
    ok = ok && fp8mla::load_mla_weights(file, config, 0).o_proj.weight.numel() ==
                   weights.o_proj.weight.numel();
  }
  std::filesystem::remove(path);
#endif
  std::printf("consumer: fp8mla %s %s\n", fp8mla::kVersionString, ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
