// MlaLayer::prefill of an MlaDeviceBatch on cuda:0: the host MlaBatch's bytes on the real rows
// and in the cache (padding rows, slot -1, write nothing; with cached prefixes the host batch's
// chunked path with one chunk); captured once in a CUDA graph with one batch's metadata and
// replayed after the device buffers were given another batch of the same padded shape (other
// sequence and prefix lengths, hidden states and slots): the eager prefill of that batch, both
// paths. Nothing is copied from the host inside the capture (it would fail).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <memory>
#include <tuple>
#include <vector>

#include "cuda_test_util.hpp"
#include "device_case_util.cuh"
#include "fp8mla/attention_backend.hpp"
#include "fp8mla/mla_layer.hpp"
#include "mla_device_batch_util.hpp"
#include "mla_layer_test_util.hpp"

namespace fp8mla {
namespace {

// The padded shape: rows, sequences, max_seqlen_q, and with prefixes prefix_tokens and
// max_seqlen_prefix.
constexpr std::int64_t kTokens = 112;
constexpr std::int64_t kSequences = 4;
constexpr std::int32_t kMaxSeqlenQ = 64;
constexpr std::int64_t kPrefixTokens = 136;
constexpr std::int32_t kMaxSeqlenPrefix = 64;

template <typename T>
struct Buffer {
  T* p = nullptr;
  std::size_t n = 0;
  explicit Buffer(std::size_t count) : n(count) {
    EXPECT_EQ(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)), cudaSuccess);
  }
  ~Buffer() { cudaFree(p); }
  void set(const std::vector<T>& h) {
    ASSERT_EQ(h.size(), n);
    EXPECT_EQ(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

// A layer's device tensors for the padded shape, and its two ways of running a batch.
struct DeviceRun {
  const MlaConfig& config;
  Buffer<std::int32_t> cu{kSequences + 1}, cu_prefix{kSequences + 1};
  Buffer<std::int64_t> positions{kTokens}, slots{kTokens}, prefix_slots{kPrefixTokens};
  bool prefixes = false;
  Buffer<std::uint16_t> hidden, out;
  Buffer<std::uint8_t> cache{std::size_t(kPages * kPageSize * kMlaLatentDim)}, workspace;
  std::size_t workspace_bytes;

  DeviceRun(const MlaConfig& c, std::size_t bytes, bool with_prefixes)
      : config(c),
        prefixes(with_prefixes),
        hidden(std::size_t(kTokens * c.hidden)),
        out(std::size_t(kTokens * c.hidden)),
        workspace(bytes),
        workspace_bytes(bytes) {}
  TensorView view(void* p, DType t, std::initializer_list<std::int64_t> shape) const {
    return TensorView(p, t, shape, Device::cuda(0));
  }
  MlaDeviceBatch batch() {
    MlaDeviceBatch b{view(cu.p, DType::kI32, {kSequences + 1}),
                     view(positions.p, DType::kI64, {kTokens}),
                     view(slots.p, DType::kI64, {kTokens}), kTokens, kMaxSeqlenQ};
    if (prefixes) {
      b.cu_seqlens_prefix = view(cu_prefix.p, DType::kI32, {kSequences + 1});
      b.prefix_slots = view(prefix_slots.p, DType::kI64, {kPrefixTokens});
      b.prefix_tokens = kPrefixTokens;
      b.max_seqlen_prefix = kMaxSeqlenPrefix;
    }
    return b;
  }
  void load(const PaddedBatch& p, const std::vector<std::uint8_t>& cache_bytes) {
    cu.set(p.cu_seqlens_q);
    if (prefixes) {
      cu_prefix.set(p.cu_seqlens_prefix);
      prefix_slots.set(p.prefix_slots);
    }
    positions.set(p.positions);
    slots.set(p.slots);
    hidden.set(p.hidden);
    cache.set(cache_bytes);
    EXPECT_EQ(cudaMemset(out.p, 0xFF, out.n * 2), cudaSuccess);
    // The test's stream does not wait for the legacy one these ran on.
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  void device_prefill(MlaLayer& layer, const AttentionBackend& backend, cudaStream_t stream) {
    const std::int64_t H = config.hidden;
    layer.prefill(view(hidden.p, DType::kBF16, {kTokens, H}), batch(),
                  view(cache.p, DType::kE4M3, {kPages, kPageSize, kMlaLatentDim}), backend, {},
                  view(out.p, DType::kBF16, {kTokens, H}),
                  view(workspace.p, DType::kE4M3, {std::int64_t(workspace_bytes)}), nullptr,
                  stream);
  }
  // The host batch's prefill of the same sequences (its rows first in `hidden`): out, cache.
  std::pair<std::vector<std::uint16_t>, std::vector<std::uint8_t>> host_prefill(
      MlaLayer& layer, const AttentionBackend& backend, const Fixture& f) {
    cache.set(f.cache);
    hidden.set([&] {
      std::vector<std::uint16_t> h = f.hidden;
      h.resize(hidden.n, 0);
      return h;
    }());
    const std::int64_t H = config.hidden;
    layer.prefill(view(hidden.p, DType::kBF16, {f.tokens, H}), f.batch,
                  view(cache.p, DType::kE4M3, {kPages, kPageSize, kMlaLatentDim}), backend,
                  one_prefix_chunk(), view(out.p, DType::kBF16, {f.tokens, H}),
                  view(workspace.p, DType::kE4M3, {std::int64_t(workspace_bytes)}));
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<std::uint16_t> o = out.get();
    o.resize(std::size_t(f.tokens * H));
    return {o, cache.get()};
  }
};

std::vector<std::uint16_t> real_rows(std::vector<std::uint16_t> out, const Fixture& f) {
  out.resize(std::size_t(f.tokens * f.config.hidden));
  return out;
}

using Case = std::tuple<WeightFormat, const char*, bool>;  // weights, backend, prefixes
class MlaDeviceBatchCuda : public testing::TestWithParam<Case> {};

TEST_P(MlaDeviceBatchCuda, EqualsTheHostBatchEagerAndReplayedForAnotherBatch) {
  FP8MLA_REQUIRE_HOPPER();
  const auto [format, backend_name, prefixes] = GetParam();
  Fixture a = prefixes ? Fixture({{20, 37}, {0, 50}, {40, 1}, {7, 9}}, 41)
                       : Fixture({{0, 37}, {0, 50}, {0, 1}, {0, 9}}, 41);
  Fixture b = prefixes ? Fixture({{0, 64}, {33, 3}, {5, 30}, {60, 12}}, 42)
                       : Fixture({{0, 64}, {0, 3}, {0, 30}, {0, 12}}, 42);
  const MlaWeights w = generate_mla_weights(a.config, format, 9);
  const std::unique_ptr<AttentionBackend> backend = make_attention_backend(backend_name);
  MlaLayer layer(a.config, w, Device::cuda(0));
  const std::int64_t P = prefixes ? kPrefixTokens : 0;
  const std::int32_t longest_prefix = prefixes ? kMaxSeqlenPrefix : 0;
  const PaddedBatch pa = pad_batch(a, kTokens, kMaxSeqlenQ, 1, P, longest_prefix);
  const PaddedBatch pb = pad_batch(b, kTokens, kMaxSeqlenQ, 2, P, longest_prefix);
  // A workspace for the device batch's shape and for the host batches' prefills.
  std::size_t bytes = layer.workspace_bytes({kTokens, kSequences, P}, one_prefix_chunk(), *backend);
  {
    DeviceRun probe(a.config, 1, prefixes);
    bytes = std::max(bytes, layer.workspace_bytes(probe.batch(), {}, *backend));
  }
  DeviceRun d(a.config, bytes, prefixes);
  const auto [a_out, a_cache] = d.host_prefill(layer, *backend, a);
  const auto [b_out, b_cache] = d.host_prefill(layer, *backend, b);
  const test::TestStream stream;

  d.load(pa, a.cache);  // eager, the device batch
  d.device_prefill(layer, *backend, stream.get());
  stream.sync();
  EXPECT_TRUE(real_rows(d.out.get(), a) == a_out);
  EXPECT_TRUE(d.cache.get() == a_cache);

  d.load(pa, a.cache);  // captured with a's metadata, replayed with b's
  const test::CapturedGraph graph(stream.get(),
                                  [&] { d.device_prefill(layer, *backend, stream.get()); });
  d.load(pb, b.cache);
  graph.launch(stream.get());
  stream.sync();
  EXPECT_TRUE(real_rows(d.out.get(), b) == b_out);
  EXPECT_TRUE(d.cache.get() == b_cache);
  d.load(pa, a.cache);  // and back
  graph.launch(stream.get());
  stream.sync();
  EXPECT_TRUE(real_rows(d.out.get(), a) == a_out);
}

// A host batch cannot be captured: its metadata is copied from host memory that the next call
// overwrites. The refusal names the fix and comes before anything is queued.
TEST(MlaDeviceBatchCudaCapture, HostBatchUnderCaptureIsRefused) {
  FP8MLA_REQUIRE_HOPPER();
  Fixture a({{0, 37}, {0, 50}, {0, 1}, {0, 9}}, 41);
  const MlaWeights w = generate_mla_weights(a.config, WeightFormat::kFp8Block, 9);
  const std::unique_ptr<AttentionBackend> backend = make_attention_backend("fp8-hopper");
  MlaLayer layer(a.config, w, Device::cuda(0));
  DeviceRun d(a.config, layer.workspace_bytes({kTokens, kSequences, 0}, {}, *backend), false);
  const auto [ref_out, ref_cache] = d.host_prefill(layer, *backend, a);
  d.load(pad_batch(a, kTokens, kMaxSeqlenQ, 1, 0, 0), a.cache);
  const std::vector<std::uint16_t> out_before = d.out.get();
  const test::TestStream stream;
  try {
    const test::CapturedGraph graph(stream.get(), [&] {
      const std::int64_t H = a.config.hidden;
      layer.prefill(d.view(d.hidden.p, DType::kBF16, {a.tokens, H}), a.batch,
                    d.view(d.cache.p, DType::kE4M3, {kPages, kPageSize, kMlaLatentDim}), *backend,
                    {}, d.view(d.out.p, DType::kBF16, {a.tokens, H}),
                    d.view(d.workspace.p, DType::kE4M3, {std::int64_t(d.workspace_bytes)}), nullptr,
                    stream.get());
    });
    ADD_FAILURE() << "a host batch was captured";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("capturing"), std::string::npos) << e.what();
  }
  // The refused call wrote nothing, and the layer still runs the host batch eagerly.
  EXPECT_TRUE(d.out.get() == out_before);
  EXPECT_TRUE(d.cache.get() == a.cache);
  const auto [out, cache] = d.host_prefill(layer, *backend, a);
  EXPECT_TRUE(out == ref_out);
  EXPECT_TRUE(cache == ref_cache);
}

INSTANTIATE_TEST_SUITE_P(Paths, MlaDeviceBatchCuda,
                         testing::Values(Case{WeightFormat::kFp8Block, "fp8-hopper", false},
                                         Case{WeightFormat::kFp8Block, "bf16-hopper", false},
                                         Case{WeightFormat::kBf16, "fp8-hopper", false},
                                         Case{WeightFormat::kFp8Block, "fp8-hopper", true},
                                         Case{WeightFormat::kFp8Block, "bf16-hopper", true}));

}  // namespace
}  // namespace fp8mla
