// Checking the errors of bad arguments: the category and the words a user needs to see.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "fp8mla/error.hpp"
#include "fp8mla/tensor_view.hpp"

namespace fp8mla::test {

// Runs `fn`, expects an Error of `category` whose message contains every one of `needles`.
template <typename Fn>
void expect_error(Fn fn, ErrorCategory category, std::initializer_list<std::string> needles) {
  try {
    fn();
    ADD_FAILURE() << "expected an fp8mla::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), category) << e.what();
    for (const std::string& needle : needles) {
      EXPECT_NE(e.message().find(needle), std::string::npos)
          << "message lacks '" << needle << "': " << e.message();
    }
  }
}

// An address no test dereferences: views over it are for argument checks that reject the call
// before any element is read.
inline void* const kFake = reinterpret_cast<void*>(std::uintptr_t{0x10000});

inline TensorView fake(DType dtype, std::initializer_list<std::int64_t> shape,
                       Device device = Device::cpu()) {
  return TensorView(kFake, dtype, shape, device);
}

}  // namespace fp8mla::test
