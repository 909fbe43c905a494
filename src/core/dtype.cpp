#include "fp8mla/dtype.hpp"

namespace fp8mla {

int dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kE4M3:
    case DType::kE5M2:
    case DType::kUE8M0:
    case DType::kE2M1x2:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kF32:
      return "f32";
    case DType::kE4M3:
      return "e4m3fn";
    case DType::kE5M2:
      return "e5m2";
    case DType::kUE8M0:
      return "ue8m0";
    case DType::kE2M1x2:
      return "e2m1x2";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
  }
  return "unknown";
}

}  // namespace fp8mla
