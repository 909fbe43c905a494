// Context parallelism of the CUDA layer, simulated on one GPU (docs/parallelism.md): N rank
// layers on cuda:0, each on its own thread, stream, cache and workspace, their latent rows
// all-gathered by a test communicator that copies between the ranks' device buffers. Each rank's
// output must be the one-rank CUDA layer's prefill of the rank's batch over the gathered cache,
// bit for bit, and every rank's cache the same bytes; the assembled output meets the layer's
// accuracy bound against the float64 reference of the full batch. World size 1 runs through
// NCCL. A real group of several GPUs is NCCL's (nccl_communicator_cuda_test).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cuda_test_util.hpp"
#include "fp8mla/attention_backend.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_parallel.hpp"
#include "mla_layer_test_util.hpp"

namespace fp8mla {
namespace {

// All-gathers between ranks of one process on one GPU: each call waits for its stream, meets
// the others, and the last to arrive copies every rank's rows. Only what the layer's context
// parallelism calls (a test stand-in; it synchronizes).
class OneGpuGroup {
 public:
  explicit OneGpuGroup(int size) : in_(std::size_t(size)), out_(std::size_t(size)) {}
  void all_gather(int rank, const TensorView& in, const TensorView& out) {
    std::unique_lock lock(mutex_);
    in_[std::size_t(rank)] = in;
    out_[std::size_t(rank)] = out;
    const std::uint64_t generation = generation_;
    if (++arrived_ < int(in_.size())) {
      done_.wait(lock, [&] { return generation_ != generation; });
      return;
    }
    const std::size_t bytes = std::size_t(in.numel());  // e4m3 rows
    for (std::size_t to = 0; to < out_.size(); ++to) {
      for (std::size_t from = 0; from < in_.size(); ++from) {
        auto* at = static_cast<std::uint8_t*>(out_[to].data()) + from * bytes;
        if (at != in_[from].data())
          EXPECT_EQ(cudaMemcpy(at, in_[from].data(), bytes, cudaMemcpyDeviceToDevice), cudaSuccess);
      }
    }
    // A device-to-device cudaMemcpy may return before it is done, and the ranks' streams do not
    // wait for the legacy stream it ran on.
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    arrived_ = 0;
    ++generation_;
    done_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  std::vector<TensorView> in_, out_;
  int arrived_ = 0;
  std::uint64_t generation_ = 0;
};

class OneGpuCommunicator final : public MlaCommunicator {
 public:
  OneGpuCommunicator(std::shared_ptr<OneGpuGroup> group, int rank, int size)
      : group_(std::move(group)), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(const TensorView&, CudaStream) override { unsupported(); }
  void reduce_scatter_sum(const TensorView&, const TensorView&, CudaStream) override {
    unsupported();
  }
  void all_gather(const TensorView& in, const TensorView& out, CudaStream stream) override {
    EXPECT_EQ(in.dtype(), DType::kE4M3);
    EXPECT_EQ(out.numel(), in.numel() * size_);
    EXPECT_EQ(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)), cudaSuccess);
    group_->all_gather(rank_, in, out);
  }

 private:
  [[noreturn]] static void unsupported() {
    throw Error(ErrorCategory::kUnsupported, "OneGpuCommunicator: all_gather only");
  }
  std::shared_ptr<OneGpuGroup> group_;
  int rank_, size_;
};

// A device buffer holding a host vector's bytes.
template <typename T>
struct OnDevice {
  void* p = nullptr;
  std::size_t bytes = 0;
  explicit OnDevice(const std::vector<T>& host) : bytes(host.size() * sizeof(T)) {
    EXPECT_EQ(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)), cudaSuccess);
    if (bytes > 0)
      EXPECT_EQ(cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  explicit OnDevice(std::size_t n) : bytes(n) {
    EXPECT_EQ(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)), cudaSuccess);
  }
  ~OnDevice() { cudaFree(p); }
  OnDevice(const OnDevice&) = delete;
  std::vector<T> host() const {
    std::vector<T> h(bytes / sizeof(T));
    EXPECT_EQ(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

struct RankResult {
  std::vector<std::uint16_t> out;
  std::vector<std::uint8_t> cache;
};

// One rank's prefill on cuda:0: context-parallel through `comm` when given, else a plain
// prefill of `batch.batch` over `cache`.
RankResult run_rank(MlaLayer& layer, const Fixture& f, const MlaContextParallelBatch& batch,
                    MlaCommunicator* comm, const std::vector<std::uint8_t>& cache,
                    const AttentionBackend& backend, const MlaPrefillOptions& o) {
  const Device d = Device::cuda(0);
  const std::int64_t t = std::int64_t(batch.tokens.size()), hidden = f.config.hidden;
  OnDevice<std::uint16_t> x(take_rows(f.hidden, batch.tokens, hidden));
  OnDevice<std::uint16_t> out(std::vector<std::uint16_t>(std::size_t(t * hidden), 0xFFFF));
  OnDevice<std::uint8_t> c(cache);
  const std::size_t ws = layer.workspace_bytes(batch.workspace_limits(), o, backend);
  OnDevice<std::uint8_t> workspace(ws);
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const TensorView xv(x.p, DType::kBF16, {t, hidden}, d), ov(out.p, DType::kBF16, {t, hidden}, d);
  const TensorView cv(c.p, DType::kE4M3, {kPages, kPageSize, kMlaLatentDim}, d);
  const TensorView wv(workspace.p, DType::kE4M3, {std::int64_t(ws)}, d);
  if (comm != nullptr) {
    layer.prefill_context_parallel(xv, batch, *comm, cv, backend, o, ov, wv, nullptr, stream);
  } else {
    layer.prefill(xv, batch.batch, cv, backend, o, ov, wv, nullptr, stream);
  }
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  return {out.host(), c.host()};
}

using Case = std::tuple<WeightFormat, const char*, int>;
class MlaContextParallelCuda : public testing::TestWithParam<Case> {};

TEST_P(MlaContextParallelCuda, RanksEqualTheirOwnPrefillOverTheGatheredCache) {
  FP8MLA_REQUIRE_HOPPER();
  const auto [format, backend_name, n] = GetParam();
  Fixture f({{0, 301}, {40, 90}, {0, 1}, {9, 0}, {200, 7}}, 23);
  const MlaWeights w = generate_mla_weights(f.config, format, 6);
  const std::unique_ptr<AttentionBackend> backend = make_attention_backend(backend_name);
  std::vector<double> ref(f.hidden.size());
  mla_prefill_reference(f.config, w, f.hidden_view(), f.batch, f.cache_view(), 1.0f, ref.data());
  std::vector<MlaLayer> layers;
  for (int r = 0; r < n; ++r) layers.emplace_back(f.config, w, Device::cuda(0));
  for (std::int64_t capacity : {std::int64_t(0), std::int64_t(64)}) {
    SCOPED_TRACE(testing::Message()
                 << backend_name << ", " << n << " ranks, capacity " << capacity);
    const MlaPrefillOptions o = prefix_mode(capacity);
    auto group = std::make_shared<OneGpuGroup>(n);
    std::vector<std::unique_ptr<MlaCommunicator>> comms;
    std::vector<MlaContextParallelBatch> batches;
    for (int r = 0; r < n; ++r) {
      comms.push_back(std::make_unique<OneGpuCommunicator>(group, r, n));
      batches.push_back(mla_context_parallel_batch(f.batch, {r, n}));
    }
    std::vector<RankResult> results(static_cast<std::size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
        results[std::size_t(r)] = run_rank(layers[std::size_t(r)], f, batches[std::size_t(r)],
                                           comms[std::size_t(r)].get(), f.cache, *backend, o);
      });
    }
    for (std::thread& t : threads) t.join();
    std::vector<std::uint16_t> assembled(f.hidden.size(), 0xFFFF);
    for (int r = 0; r < n; ++r) {
      const RankResult& got = results[std::size_t(r)];
      EXPECT_TRUE(got.cache == results[0].cache) << "rank " << r << "'s cache";
      const RankResult plain =
          run_rank(layers[0], f, batches[std::size_t(r)], nullptr, got.cache, *backend, o);
      EXPECT_TRUE(got.out == plain.out) << "rank " << r;
      const std::vector<std::int64_t>& tokens = batches[std::size_t(r)].tokens;
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        std::copy_n(got.out.begin() + std::ptrdiff_t(i) * f.config.hidden, f.config.hidden,
                    assembled.begin() + tokens[i] * f.config.hidden);
      }
    }
    const Compare c = compare(assembled, ref);
    std::printf("[ cp       ] %s, %d ranks, capacity %lld: cosine %.6f, max abs %.3g\n",
                backend_name, n, static_cast<long long>(capacity), c.cosine, c.max_abs);
    EXPECT_GE(c.cosine,
              LayerAccuracy(format, ref).min_cosine(std::string(backend_name) == "fp8-hopper"));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MlaContextParallelCuda,
                         testing::Values(Case{WeightFormat::kFp8Block, "fp8-hopper", 2},
                                         Case{WeightFormat::kFp8Block, "fp8-hopper", 3},
                                         Case{WeightFormat::kBf16, "bf16-hopper", 4},
                                         Case{WeightFormat::kFp8Block, "bf16-hopper", 2}));

// One rank through NCCL: the plain prefill of the whole batch, bit for bit, and its cache.
TEST(MlaContextParallelCudaNccl, OneRankThroughNcclIsThePlainPrefill) {
  FP8MLA_REQUIRE_HOPPER();
  std::vector<std::unique_ptr<MlaCommunicator>> comms;
  try {
    comms = make_nccl_communicators({0});
  } catch (const Error& e) {
    if (e.category() != ErrorCategory::kUnsupported) throw;
    GTEST_SKIP() << e.message();
  }
  Fixture f({{0, 130}, {40, 33}}, 29);
  const MlaWeights w = generate_mla_weights(f.config, WeightFormat::kFp8Block, 7);
  const std::unique_ptr<AttentionBackend> backend = make_attention_backend("fp8-hopper");
  MlaLayer layer(f.config, w, Device::cuda(0));
  const MlaContextParallelBatch batch = mla_context_parallel_batch(f.batch, {0, 1});
  const RankResult cp = run_rank(layer, f, batch, comms[0].get(), f.cache, *backend, {});
  const RankResult plain = run_rank(layer, f, batch, nullptr, f.cache, *backend, {});
  EXPECT_TRUE(cp.out == plain.out);
  EXPECT_TRUE(cp.cache == plain.cache);
}

}  // namespace
}  // namespace fp8mla
