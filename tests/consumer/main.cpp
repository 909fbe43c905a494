#include <cstdio>

#include <fp8mla/numerics.hpp>
#include <fp8mla/runtime_info.hpp>
#include <fp8mla/tensor_view.hpp>
#include <fp8mla/version.hpp>

int main() {
  const fp8mla::TensorView q(nullptr, fp8mla::DType::kE4M3, {8, 128, 192});
  const bool ok = q.numel() == 8 * 128 * 192 && fp8mla::encode_e4m3(448.0f) == 0x7E &&
                  fp8mla::build_info().version == fp8mla::kVersionString;
  std::printf("consumer: fp8mla %s %s\n", fp8mla::kVersionString, ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
