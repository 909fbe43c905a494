#include "fp8mla/error.hpp"
#include "fp8mla/runtime_info.hpp"
#include "fp8mla/version.hpp"

namespace fp8mla {

BuildInfo build_info() {
  BuildInfo info;
  info.version = kVersionString;
#if defined(FP8MLA_WITH_CUDA)
  info.cuda = true;
  info.cuda_arch = FP8MLA_CUDA_ARCH;
  info.cuda_version = FP8MLA_CUDA_VERSION;
#endif
#if defined(__clang__)
  info.compiler =
      concat("clang ", __clang_major__, ".", __clang_minor__, ".", __clang_patchlevel__);
#elif defined(__GNUC__)
  info.compiler = concat("gcc ", __GNUC__, ".", __GNUC_MINOR__, ".", __GNUC_PATCHLEVEL__);
#else
  info.compiler = "unknown";
#endif
  info.build_type = FP8MLA_BUILD_TYPE;
  return info;
}

}  // namespace fp8mla
