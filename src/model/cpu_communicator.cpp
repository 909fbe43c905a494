// The in-process communicator group of fp8mla/mla_parallel.hpp: N ranks on N threads meet at a
// rendezvous per call; the last to arrive checks every rank's tensors, then reduces every rank's
// buffer in f32 in rank order (all-reduce, reduce-scatter) or copies every rank's rows into every
// rank's output (all-gather).
#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "fp8mla/dtype.hpp"
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

// A contiguous host tensor of at least one dimension, with memory unless it is empty.
bool host_contiguous(const TensorView& t) {
  return t.ndim() >= 1 && t.is_contiguous() && !t.device().is_cuda() &&
         (t.data() != nullptr || t.empty());
}

bool usable(const TensorView& t) {
  return (t.dtype() == DType::kBF16 || t.dtype() == DType::kF32) && host_contiguous(t);
}

std::size_t byte_size(const TensorView& t) {
  return std::size_t(t.numel()) * std::size_t(dtype_size(t.dtype()));
}

enum class Collective { kAllReduce, kReduceScatter, kAllGather };

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "all_reduce_sum";
    case Collective::kReduceScatter:
      return "reduce_scatter_sum";
    case Collective::kAllGather:
      return "all_gather";
  }
  return "?";
}

// One call's tensors from every rank, and the collective the last rank runs.
struct Call {
  std::vector<TensorView> in, out;  // per rank; for an all-reduce out == in
  Collective kind = Collective::kAllReduce;
};

// rank r's out of an all-gather: in's dtype, n times its rows, the same trailing dims; `in`
// either apart from it or exactly rank r's rows of it (the in-place form NCCL also takes).
std::string check_gather_out(const TensorView& in, const TensorView& out, int r, int n) {
  const bool out_ok = out.dtype() == in.dtype() && out.ndim() == in.ndim() &&
                      out.size(0) == n * in.size(0) &&
                      std::ranges::equal(out.shape().subspan(1), in.shape().subspan(1));
  if (!out_ok) {
    return concat("rank ", r, ": all_gather of ", in.describe(), " over ", n,
                  " ranks: expected out of in's dtype with ", n, " x ", in.size(0),
                  " rows and in's trailing dims, got ", out.describe());
  }
  const auto* in_p = static_cast<const std::byte*>(in.data());
  const auto* out_p = static_cast<const std::byte*>(out.data());
  const std::size_t in_bytes = byte_size(in);
  const std::uintptr_t a = std::uintptr_t(in_p), b = std::uintptr_t(out_p);
  const bool apart = in_bytes == 0 || a + in_bytes <= b || b + byte_size(out) <= a;
  if (!apart && in_p != out_p + std::size_t(r) * in_bytes) {
    return concat("rank ", r, ": all_gather: expected in apart from out or exactly rank ", r,
                  "'s rows of it, got in at byte ", std::int64_t(a - b), " of out");
  }
  return {};
}

// An all-gather: any dtype, the same dtype and shape on every rank.
std::string check_gather(const Call& call) {
  const int n = int(call.in.size());
  for (int r = 0; r < n; ++r) {
    const TensorView &in = call.in[std::size_t(r)], &out = call.out[std::size_t(r)];
    if (!host_contiguous(in) || !host_contiguous(out)) {
      return concat("rank ", r,
                    ": all_gather: expected contiguous host tensors of at least one dimension, "
                    "got ",
                    in.describe(), " and ", out.describe());
    }
    if (!same_shape(in, call.in[0])) {
      return concat("rank ", r, "'s ", in.describe(), " differs from rank 0's ",
                    call.in[0].describe());
    }
    if (std::string bad = check_gather_out(in, out, r, n); !bad.empty()) return bad;
  }
  return {};
}

// What the last rank to arrive checks before anything is read; empty when the call is sound.
std::string check_call(const Call& call) {
  if (call.kind == Collective::kAllGather) return check_gather(call);
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
    if (call.kind != Collective::kReduceScatter) continue;
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
  const bool scatter = call.kind == Collective::kReduceScatter;
  const std::int64_t part = scatter ? numel / n : numel;
  for (int r = 0; r < n; ++r) {
    const std::int64_t first = scatter ? r * part : 0;
    for (std::int64_t i = 0; i < part; ++i)
      store(call.out[std::size_t(r)], i, sum[std::size_t(first + i)]);
  }
}

// Rank q's in into rows [q * rows, (q + 1) * rows) of every rank's out. Every in is staged
// before any out is written, as an in-place in is a slice of its rank's out (and a caller may
// hand every rank one shared out).
void gather(const Call& call) {
  const std::size_t bytes = byte_size(call.in[0]);
  if (bytes == 0) return;
  std::vector<std::byte> all;
  all.reserve(bytes * call.in.size());
  for (const TensorView& in : call.in) {
    const auto* p = static_cast<const std::byte*>(in.data());
    all.insert(all.end(), p, p + bytes);
  }
  for (const TensorView& out : call.out) std::memcpy(out.data(), all.data(), all.size());
}

void run_call(const Call& call) {
  if (call.kind == Collective::kAllGather) {
    gather(call);
  } else {
    reduce(call);
  }
}

class Group {
 public:
  explicit Group(int size)
      : call_{std::vector<TensorView>(std::size_t(size)),
              std::vector<TensorView>(std::size_t(size))} {}

  void run(int rank, const TensorView& in, const TensorView& out, Collective kind) {
    std::unique_lock lock(mutex_);
    const int n = int(call_.in.size());
    call_.in[std::size_t(rank)] = in;
    call_.out[std::size_t(rank)] = out;
    if (arrived_ == 0) call_.kind = kind;
    if (call_.kind != kind && error_.empty()) {
      error_ = concat("rank ", rank, " called ", collective_name(kind),
                      ", but the first rank to arrive called ", collective_name(call_.kind));
    }
    const std::uint64_t generation = generation_;
    if (++arrived_ == n) {
      if (error_.empty()) error_ = check_call(call_);
      if (error_.empty()) run_call(call_);
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
    group_->run(rank_, inout, inout, Collective::kAllReduce);
  }
  void reduce_scatter_sum(const TensorView& in, const TensorView& out, CudaStream) override {
    group_->run(rank_, in, out, Collective::kReduceScatter);
  }
  void all_gather(const TensorView& in, const TensorView& out, CudaStream) override {
    group_->run(rank_, in, out, Collective::kAllGather);
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
