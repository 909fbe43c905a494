// The in-process communicator group of fp8mla/mla_parallel.hpp: N ranks on N threads meet at a
// rendezvous per call; the last to arrive reduces every rank's buffer in f32 in rank order.
#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "fp8mla/error.hpp"
#include "fp8mla/mla_parallel.hpp"
#include "fp8mla/numerics.hpp"

namespace fp8mla {
namespace {

float load(const TensorView& t, std::int64_t i) {
  return t.dtype() == DType::kBF16 ? decode_bf16(t.data_as<std::uint16_t>()[i])
                                   : t.data_as<float>()[i];
}

void store(const TensorView& t, std::int64_t i, float v) {
  if (t.dtype() == DType::kBF16) {
    t.data_as<std::uint16_t>()[i] = encode_bf16(v);
  } else {
    t.data_as<float>()[i] = v;
  }
}

bool same_shape(const TensorView& a, const TensorView& b) {
  return a.dtype() == b.dtype() && std::ranges::equal(a.shape(), b.shape());
}

bool usable(const TensorView& t) {
  return (t.dtype() == DType::kBF16 || t.dtype() == DType::kF32) && t.ndim() >= 1 &&
         t.is_contiguous() && !t.device().is_cuda() && (t.data() != nullptr || t.empty());
}

// One call's tensors from every rank, and the reduction the last rank runs.
struct Call {
  std::vector<TensorView> in, out;  // per rank; for an all-reduce out == in
  bool scatter = false;
};

// What the last rank to arrive checks before anything is read; empty when the call is sound.
std::string check_call(const Call& call) {
  const int n = int(call.in.size());
  for (int r = 0; r < n; ++r) {
    const TensorView &in = call.in[std::size_t(r)], &out = call.out[std::size_t(r)];
    if (!usable(in) || !usable(out)) {
      return concat("rank ", r, ": expected contiguous host bf16 or f32 tensors, got ",
                    in.describe(), " and ", out.describe());
    }
    if (!same_shape(in, call.in[0])) {
      return concat("rank ", r, "'s ", in.describe(), " differs from rank 0's ",
                    call.in[0].describe());
    }
    if (!call.scatter) continue;
    const std::int64_t rows = in.size(0);
    const bool out_ok = out.dtype() == in.dtype() && out.ndim() == in.ndim() && rows % n == 0 &&
                        out.size(0) == rows / n &&
                        std::ranges::equal(out.shape().subspan(1), in.shape().subspan(1));
    if (!out_ok) {
      return concat("rank ", r, ": reduce_scatter_sum of ", in.describe(), " over ", n,
                    " ranks: expected rows divisible by ", n, " and out of 1/", n,
                    " of the rows, got ", out.describe());
    }
  }
  return {};
}

// Every element's sum over the ranks in f32, rank 0 first, into each rank's out (all-reduce) or
// rank r's rows of it (reduce-scatter). The sums are all taken before any buffer is written, as
// an all-reduce's outputs alias its inputs.
void reduce(const Call& call) {
  const int n = int(call.in.size());
  const std::int64_t numel = call.in[0].numel();
  std::vector<float> sum(std::size_t(numel), 0.0f);
  for (int r = 0; r < n; ++r)
    for (std::int64_t i = 0; i < numel; ++i)
      sum[std::size_t(i)] += load(call.in[std::size_t(r)], i);
  const std::int64_t part = call.scatter ? numel / n : numel;
  for (int r = 0; r < n; ++r) {
    const std::int64_t first = call.scatter ? r * part : 0;
    for (std::int64_t i = 0; i < part; ++i)
      store(call.out[std::size_t(r)], i, sum[std::size_t(first + i)]);
  }
}

class Group {
 public:
  explicit Group(int size)
      : call_{std::vector<TensorView>(std::size_t(size)),
              std::vector<TensorView>(std::size_t(size))} {}

  void run(int rank, const TensorView& in, const TensorView& out, bool scatter) {
    std::unique_lock lock(mutex_);
    const int n = int(call_.in.size());
    call_.in[std::size_t(rank)] = in;
    call_.out[std::size_t(rank)] = out;
    if (arrived_ == 0) call_.scatter = scatter;
    if (call_.scatter != scatter && error_.empty())
      error_ = concat("rank ", rank, " called another collective than the first rank to arrive");
    const std::uint64_t generation = generation_;
    if (++arrived_ == n) {
      if (error_.empty()) error_ = check_call(call_);
      if (error_.empty()) reduce(call_);
      result_ = error_;
      error_.clear();
      arrived_ = 0;
      ++generation_;
      done_.notify_all();
    } else {
      done_.wait(lock, [&] { return generation_ != generation; });
    }
    if (!result_.empty()) {
      throw Error(ErrorCategory::kInvalidArgument,
                  concat("MlaCommunicator (cpu, ", n, " ranks): ", result_));
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  Call call_;
  int arrived_ = 0;
  std::uint64_t generation_ = 0;
  std::string error_, result_;  // result_: the last call's, read by every rank before the next
};

class CpuCommunicator final : public MlaCommunicator {
 public:
  CpuCommunicator(std::shared_ptr<Group> group, int rank, int size)
      : group_(std::move(group)), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(const TensorView& inout, CudaStream) override {
    group_->run(rank_, inout, inout, false);
  }
  void reduce_scatter_sum(const TensorView& in, const TensorView& out, CudaStream) override {
    group_->run(rank_, in, out, true);
  }

 private:
  std::shared_ptr<Group> group_;
  int rank_, size_;
};

}  // namespace

std::vector<std::unique_ptr<MlaCommunicator>> make_cpu_communicators(int size) {
  if (size < 1 || size > 8) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("make_cpu_communicators: expected 1 <= size <= 8, got ", size));
  }
  auto group = std::make_shared<Group>(size);
  std::vector<std::unique_ptr<MlaCommunicator>> ranks;
  for (int r = 0; r < size; ++r) ranks.push_back(std::make_unique<CpuCommunicator>(group, r, size));
  return ranks;
}

}  // namespace fp8mla
