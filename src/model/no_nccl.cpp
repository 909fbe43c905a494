// The NCCL communicators of a build without NCCL's header (fp8mla/mla_parallel.hpp).
#include "fp8mla/error.hpp"
#include "fp8mla/mla_parallel.hpp"

namespace fp8mla {
namespace {

[[noreturn]] void no_nccl(const char* what) {
  throw Error(ErrorCategory::kUnsupported,
              concat(what,
                     ": fp8mla was built without NCCL (CUDA and nccl.h, e.g. from the "
                     "nvidia-nccl-cu13 wheel, are needed at build time)"));
}

}  // namespace

std::unique_ptr<MlaCommunicator> make_nccl_communicator(void*) {
  no_nccl("make_nccl_communicator");
}

std::vector<std::unique_ptr<MlaCommunicator>> make_nccl_communicators(const std::vector<int>&) {
  no_nccl("make_nccl_communicators");
}

}  // namespace fp8mla
