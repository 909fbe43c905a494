// MlaCommunicator over NCCL (fp8mla/mla_parallel.hpp). NCCL is loaded at run time (dlopen of
// libnccl.so.2): the library then links nothing beyond CUDA, and in an engine that already runs
// NCCL (through PyTorch) the process's loaded copy is the one used, so the caller's ncclComm_t
// and fp8mla's calls agree on the library. nccl.h gives the types only.
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fp8mla/dtype.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_parallel.hpp"

namespace fp8mla {
namespace {

// The NCCL entry points fp8mla calls, resolved once.
struct NcclApi {
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclCommCount) count = nullptr;
  decltype(&ncclCommUserRank) user_rank = nullptr;
  decltype(&ncclCommCuDevice) cu_device = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclCommInitAll) init_all = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  std::string failure;  // why NCCL is unusable; empty when every entry point resolved
};

template <typename Fn>
void resolve(void* lib, const char* name, Fn& fn, std::string& failure) {
  fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (fn == nullptr && failure.empty()) failure = concat("libnccl.so.2 lacks ", name);
}

const NcclApi& nccl_api() {
  static const NcclApi api = [] {
    NcclApi a;
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
#ifdef FP8MLA_NCCL_LIBRARY
    if (lib == nullptr) lib = dlopen(FP8MLA_NCCL_LIBRARY, RTLD_NOW | RTLD_GLOBAL);
#endif
    if (lib == nullptr) {
      const char* why = dlerror();
      a.failure = concat(
          "could not load libnccl.so.2 (install the nvidia-nccl-cu13 wheel or put "
          "NCCL's library on the loader path): ",
          why != nullptr ? why : "unknown reason");
      return a;
    }
    resolve(lib, "ncclGetErrorString", a.error_string, a.failure);
    resolve(lib, "ncclCommCount", a.count, a.failure);
    resolve(lib, "ncclCommUserRank", a.user_rank, a.failure);
    resolve(lib, "ncclCommCuDevice", a.cu_device, a.failure);
    resolve(lib, "ncclAllReduce", a.all_reduce, a.failure);
    resolve(lib, "ncclReduceScatter", a.reduce_scatter, a.failure);
    resolve(lib, "ncclAllGather", a.all_gather, a.failure);
    resolve(lib, "ncclCommInitAll", a.init_all, a.failure);
    resolve(lib, "ncclCommDestroy", a.destroy, a.failure);
    return a;
  }();
  if (!api.failure.empty()) throw Error(ErrorCategory::kUnsupported, api.failure);
  return api;
}

void check_nccl(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return;
  throw Error(ErrorCategory::kCuda, concat(what, ": ", nccl_api().error_string(result)));
}

ncclDataType_t nccl_type(const TensorView& t, const char* op) {
  if (t.dtype() == DType::kBF16) return ncclBfloat16;
  if (t.dtype() == DType::kF32) return ncclFloat32;
  throw Error(ErrorCategory::kInvalidArgument,
              concat(op, ": expected a bf16 or f32 tensor, got ", t.describe()));
}

class NcclCommunicator final : public MlaCommunicator {
 public:
  NcclCommunicator(ncclComm_t comm, bool owned) : comm_(comm), owned_(owned) {
    const NcclApi& api = nccl_api();
    try {
      check_nccl(api.user_rank(comm_, &rank_), "ncclCommUserRank");
      check_nccl(api.count(comm_, &size_), "ncclCommCount");
      check_nccl(api.cu_device(comm_, &device_), "ncclCommCuDevice");
    } catch (...) {
      if (owned_) api.destroy(comm_);  // the destructor does not run for a failed constructor
      throw;
    }
  }
  ~NcclCommunicator() override {
    if (owned_) nccl_api().destroy(comm_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(const TensorView& inout, CudaStream stream) override {
    const ncclDataType_t type = nccl_type(inout, "all_reduce_sum");
    check_tensor(inout, "all_reduce_sum", "`inout`");
    check_nccl(nccl_api().all_reduce(inout.data(), inout.data(), std::size_t(inout.numel()), type,
                                     ncclSum, comm_, stream),
               "ncclAllReduce");
  }

  void reduce_scatter_sum(const TensorView& in, const TensorView& out, CudaStream stream) override {
    const ncclDataType_t type = nccl_type(in, "reduce_scatter_sum");
    check_tensor(in, "reduce_scatter_sum", "`in`");
    check_tensor(out, "reduce_scatter_sum", "`out`");
    const bool shapes_ok =
        out.dtype() == in.dtype() && in.ndim() >= 1 && out.ndim() == in.ndim() &&
        in.size(0) % size_ == 0 && out.size(0) == in.size(0) / size_ &&
        std::equal(out.shape().begin() + 1, out.shape().end(), in.shape().begin() + 1);
    if (!shapes_ok) {
      throw Error(ErrorCategory::kInvalidArgument,
                  concat("reduce_scatter_sum over ", size_,
                         " ranks: expected `out` of `in`'s dtype "
                         "with 1/",
                         size_, " of its rows (rows divisible by ", size_, "), got ", in.describe(),
                         " and ", out.describe()));
    }
    check_nccl(nccl_api().reduce_scatter(in.data(), out.data(), std::size_t(out.numel()), type,
                                         ncclSum, comm_, stream),
               "ncclReduceScatter");
  }

  // Bytes (ncclUint8), so that any dtype is gathered unchanged.
  void all_gather(const TensorView& in, const TensorView& out, CudaStream stream) override {
    check_tensor(in, "all_gather", "`in`");
    check_tensor(out, "all_gather", "`out`");
    const bool shapes_ok =
        out.dtype() == in.dtype() && in.ndim() >= 1 && out.ndim() == in.ndim() &&
        out.size(0) == std::int64_t(size_) * in.size(0) &&
        std::equal(out.shape().begin() + 1, out.shape().end(), in.shape().begin() + 1);
    if (!shapes_ok) {
      throw Error(ErrorCategory::kInvalidArgument,
                  concat("all_gather over ", size_, " ranks: expected `out` of `in`'s dtype with ",
                         size_, " times its rows and its trailing dims, got ", in.describe(),
                         " and ", out.describe()));
    }
    const std::size_t in_bytes = std::size_t(in.numel()) * std::size_t(dtype_size(in.dtype()));
    check_in_place(in, out, in_bytes);
    check_nccl(nccl_api().all_gather(in.data(), out.data(), in_bytes, ncclUint8, comm_, stream),
               "ncclAllGather");
  }

 private:
  // NCCL's all-gather is in place only when `in` is exactly this rank's rows of `out`; any other
  // overlap would be read while it is written.
  void check_in_place(const TensorView& in, const TensorView& out, std::size_t in_bytes) const {
    const std::uintptr_t a = std::uintptr_t(in.data()), b = std::uintptr_t(out.data());
    const bool apart = in_bytes == 0 || a + in_bytes <= b || b + in_bytes * size_ <= a;
    if (apart || a == b + std::size_t(rank_) * in_bytes) return;
    throw Error(ErrorCategory::kInvalidArgument,
                concat("all_gather: expected `in` apart from `out` or exactly rank ", rank_,
                       "'s rows of it, got `in` at byte ", std::int64_t(a - b), " of `out` (",
                       in.describe(), " and ", out.describe(), ")"));
  }

  // A contiguous tensor on the communicator's GPU (NCCL reads and writes it in place).
  void check_tensor(const TensorView& t, const char* op, const char* name) const {
    if (!t.device().is_cuda() || t.device().index != device_ || !t.is_contiguous() ||
        (t.data() == nullptr && !t.empty())) {
      throw Error(ErrorCategory::kInvalidArgument,
                  concat(op, ": ", name, ": expected a contiguous tensor on cuda:", device_,
                         " (the NCCL communicator's device), got ", t.describe()));
    }
  }

  ncclComm_t comm_;
  bool owned_;
  int rank_ = 0, size_ = 0, device_ = 0;
};

}  // namespace

std::unique_ptr<MlaCommunicator> make_nccl_communicator(void* nccl_comm) {
  if (nccl_comm == nullptr) {
    throw Error(ErrorCategory::kInvalidArgument,
                "make_nccl_communicator: expected an initialized ncclComm_t, got null");
  }
  return std::make_unique<NcclCommunicator>(static_cast<ncclComm_t>(nccl_comm), false);
}

std::vector<std::unique_ptr<MlaCommunicator>> make_nccl_communicators(
    const std::vector<int>& devices) {
  if (devices.empty() || devices.size() > 8) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("make_nccl_communicators: expected 1 to 8 devices, got ", devices.size()));
  }
  std::vector<ncclComm_t> comms(devices.size());
  check_nccl(nccl_api().init_all(comms.data(), int(devices.size()), devices.data()),
             "ncclCommInitAll");
  std::vector<std::unique_ptr<MlaCommunicator>> group;
  std::size_t wrapped = 0;
  try {
    for (; wrapped < comms.size(); ++wrapped)
      group.push_back(std::make_unique<NcclCommunicator>(comms[wrapped], true));
  } catch (...) {
    // The failed one destroyed itself and `group` destroys the ones before it; the rest are ours.
    for (std::size_t i = wrapped + 1; i < comms.size(); ++i) nccl_api().destroy(comms[i]);
    throw;
  }
  return group;
}

}  // namespace fp8mla
