// Element types a TensorView can hold.
#pragma once

#include <cstdint>
#include <string_view>

namespace fp8mla {

enum class DType : std::uint8_t {
  kBF16,
  kF16,
  kF32,
  kE4M3,    // fp8 e4m3fn: no infinities, NaN = 0x7F/0xFF, max 448
  kE5M2,    // fp8 e5m2: IEEE-like, max 57344
  kUE8M0,   // unsigned power-of-two scale: one exponent byte, value 2^(e-127)
  kE2M1x2,  // two fp4 e2m1 values per byte, even element in the low nibble
  kI32,
  kI64,
};

// Bytes of one element (kE2M1x2 counts one byte holding two values).
int dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);

}  // namespace fp8mla
