// Visible skipping of CUDA tests on machines without a usable Hopper GPU.
#pragma once

#include <gtest/gtest.h>

#include "fp8mla/runtime_info.hpp"

// Skips the calling test (GTEST_SKIP returns from it) unless device 0 is sm_90 or newer.
#define FP8MLA_REQUIRE_HOPPER()                                                \
  do {                                                                         \
    const ::fp8mla::CudaDevices found = ::fp8mla::cuda_devices();              \
    if (found.devices.empty()) {                                               \
      GTEST_SKIP() << "no CUDA device (" << found.unavailable_reason << ")";   \
    }                                                                          \
    if (found.devices[0].arch < 90) {                                          \
      GTEST_SKIP() << "needs sm_90; device 0 is sm_" << found.devices[0].arch; \
    }                                                                          \
  } while (0)
