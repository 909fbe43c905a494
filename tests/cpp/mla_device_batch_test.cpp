// MlaLayer::prefill of an MlaDeviceBatch on the CPU (the metadata in host memory): the host
// MlaBatch's bytes on the real rows (with cached prefixes: the host batch's chunked path with one
// chunk), the same cache rows written and no other, padding rows (slot -1) writing nothing; and
// the errors of metadata the CPU can read.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "error_test_util.hpp"
#include "fp8mla/attention_backend.hpp"
#include "fp8mla/mla_layer.hpp"
#include "mla_device_batch_util.hpp"
#include "mla_layer_test_util.hpp"

namespace fp8mla {
namespace {

MlaDeviceBatch views(PaddedBatch& p) {
  MlaDeviceBatch b{
      TensorView(p.cu_seqlens_q.data(), DType::kI32, {std::int64_t(p.cu_seqlens_q.size())}),
      TensorView(p.positions.data(), DType::kI64, {p.tokens}),
      TensorView(p.slots.data(), DType::kI64, {p.tokens}), p.tokens, p.max_seqlen_q};
  if (p.prefix_tokens > 0) {
    b.cu_seqlens_prefix = TensorView(p.cu_seqlens_prefix.data(), DType::kI32,
                                     {std::int64_t(p.cu_seqlens_prefix.size())});
    b.prefix_slots = TensorView(p.prefix_slots.data(), DType::kI64, {p.prefix_tokens});
    b.prefix_tokens = p.prefix_tokens;
    b.max_seqlen_prefix = p.max_seqlen_prefix;
  }
  return b;
}

class MlaDeviceBatchCpu : public testing::TestWithParam<std::tuple<WeightFormat, const char*>> {};

TEST_P(MlaDeviceBatchCpu, EqualsTheHostBatchOnTheRealRows) {
  const auto [format, backend_name] = GetParam();
  Fixture f({{0, 37}, {0, 50}, {0, 1}, {0, 9}}, 31);
  const MlaWeights w = generate_mla_weights(f.config, format, 8);
  const std::unique_ptr<AttentionBackend> backend = make_attention_backend(backend_name);
  MlaLayer layer(f.config, w);
  const std::vector<std::uint8_t> cache_before = f.cache;
  const std::int64_t H = f.config.hidden;
  std::vector<std::uint16_t> host_out(f.hidden.size(), 0xFFFF);
  layer.prefill(f.hidden_view(), f.batch, f.cache_view(), *backend, {},
                TensorView(host_out.data(), DType::kBF16, {f.tokens, H}));
  const std::vector<std::uint8_t> host_cache = f.cache;

  f.cache = cache_before;
  PaddedBatch p = pad_batch(f, f.tokens + 5, 64, 3);
  std::vector<std::uint16_t> out(std::size_t(p.tokens * H), 0xFFFF);
  layer.prefill(TensorView(p.hidden.data(), DType::kBF16, {p.tokens, H}), views(p), f.cache_view(),
                *backend, {}, TensorView(out.data(), DType::kBF16, {p.tokens, H}));
  EXPECT_TRUE(std::equal(host_out.begin(), host_out.end(), out.begin()));
  EXPECT_TRUE(f.cache == host_cache);  // the padding rows wrote nothing
}

// With cached prefixes: the host batch with every prefix key in one chunk.
TEST_P(MlaDeviceBatchCpu, WithPrefixesEqualsTheHostBatchsOneChunk) {
  const auto [format, backend_name] = GetParam();
  Fixture f({{20, 37}, {0, 50}, {40, 1}, {7, 9}, {12, 0}}, 33);
  const MlaWeights w = generate_mla_weights(f.config, format, 8);
  const std::unique_ptr<AttentionBackend> backend = make_attention_backend(backend_name);
  MlaLayer layer(f.config, w);
  const std::vector<std::uint8_t> cache_before = f.cache;
  const std::int64_t H = f.config.hidden;
  std::vector<std::uint16_t> host_out(f.hidden.size(), 0xFFFF);
  layer.prefill(f.hidden_view(), f.batch, f.cache_view(), *backend, one_prefix_chunk(),
                TensorView(host_out.data(), DType::kBF16, {f.tokens, H}));
  const std::vector<std::uint8_t> host_cache = f.cache;

  f.cache = cache_before;
  PaddedBatch p = pad_batch(f, f.tokens + 3, 64, 4, 90, 48);
  std::vector<std::uint16_t> out(std::size_t(p.tokens * H), 0xFFFF);
  // The options' prefix settings do not apply to a device batch.
  layer.prefill(TensorView(p.hidden.data(), DType::kBF16, {p.tokens, H}), views(p), f.cache_view(),
                *backend, {}, TensorView(out.data(), DType::kBF16, {p.tokens, H}));
  EXPECT_TRUE(std::equal(host_out.begin(), host_out.end(), out.begin()));
  EXPECT_TRUE(f.cache == host_cache);
}

INSTANTIATE_TEST_SUITE_P(Paths, MlaDeviceBatchCpu,
                         testing::Combine(testing::Values(WeightFormat::kBf16,
                                                          WeightFormat::kFp8Block),
                                          testing::Values("cpu", "cpu-bf16")));

TEST(MlaDeviceBatchCpuErrors, MetadataTheCpuCanReadAreChecked) {
  Fixture f({{0, 8}, {0, 4}}, 5);
  const MlaWeights w = generate_mla_weights(f.config, WeightFormat::kBf16, 2);
  const std::unique_ptr<AttentionBackend> backend = make_attention_backend("cpu");
  MlaLayer layer(f.config, w);
  const std::int64_t H = f.config.hidden;
  const auto run = [&](PaddedBatch p, MlaDeviceBatch b) {
    std::vector<std::uint16_t> out(std::size_t(p.tokens * H));
    layer.prefill(TensorView(p.hidden.data(), DType::kBF16, {p.tokens, H}), b, f.cache_view(),
                  *backend, {}, TensorView(out.data(), DType::kBF16, {p.tokens, H}));
  };
  Fixture g({{5, 8}, {3, 4}}, 6);
  const PaddedBatch plain = pad_batch(f, 16, 8, 1), prefixed = pad_batch(g, 16, 8, 1, 10, 5);
  // `base` edited by `edit` (its views made first, so an edit of the vectors shows through).
  const auto expect_on = [&](const PaddedBatch& base, auto&& edit, std::string needle) {
    PaddedBatch p = base;
    MlaDeviceBatch b = views(p);
    edit(p, b);
    test::expect_error([&] { run(p, b); }, ErrorCategory::kInvalidArgument,
                       {"MlaLayer::prefill (device batch)", needle});
  };
  const auto expect = [&](auto&& edit, std::string needle) { expect_on(plain, edit, needle); };
  const auto expect_prefix = [&](auto&& edit, std::string needle) {
    expect_on(prefixed, edit, needle);
  };
  expect([](PaddedBatch& p, MlaDeviceBatch&) { p.cu_seqlens_q[0] = 1; },
         "expected cu_seqlens_q from 0 to at most tokens 16, got 1 to 12");
  expect([](PaddedBatch& p, MlaDeviceBatch&) { p.cu_seqlens_q[2] = 17; }, "got 0 to 17");
  expect([](PaddedBatch&, MlaDeviceBatch& b) { b.max_seqlen_q = 7; },
         "sequence 0: expected 0 to max_seqlen_q 7 in cu_seqlens_q, got 8");
  expect([&](PaddedBatch& p, MlaDeviceBatch&) { p.positions[3] = f.config.max_position; },
         "row 3: expected a position in [0, ");
  expect(
      [](PaddedBatch& p, MlaDeviceBatch& b) {
        b.positions = TensorView(p.positions.data(), DType::kI32, {p.tokens});
      },
      "expected `positions` contiguous i64 [16]");
  expect(
      [](PaddedBatch& p, MlaDeviceBatch& b) {
        b.slot_mapping = TensorView(p.slots.data(), DType::kI64, {p.tokens - 1});
      },
      "expected `slot_mapping` contiguous i64 [16]");
  expect(
      [](PaddedBatch& p, MlaDeviceBatch& b) {
        b.cu_seqlens_q = TensorView(p.cu_seqlens_q.data(), DType::kI64, {3});
      },
      "expected `cu_seqlens_q` contiguous i32 [B + 1]");
  expect([](PaddedBatch&, MlaDeviceBatch& b) { b.tokens = -1; }, "expected tokens, max_seqlen_q");
  // Prefixes.
  expect_prefix([](PaddedBatch& p, MlaDeviceBatch&) { p.cu_seqlens_prefix[2] = 11; },
                "expected cu_seqlens_prefix from 0 to at most prefix_tokens 10, got 0 to 11");
  expect_prefix([](PaddedBatch&, MlaDeviceBatch& b) { b.max_seqlen_prefix = 4; },
                "sequence 0: expected 0 to max_seqlen_prefix 4 in cu_seqlens_prefix, got 5");
  expect_prefix(
      [](PaddedBatch& p, MlaDeviceBatch& b) {
        b.cu_seqlens_prefix = TensorView(p.cu_seqlens_prefix.data(), DType::kI32, {2});
      },
      "expected `cu_seqlens_prefix` contiguous i32 [3]");
  expect_prefix(
      [](PaddedBatch& p, MlaDeviceBatch& b) {
        b.prefix_slots = TensorView(p.prefix_slots.data(), DType::kI64, {9});
      },
      "expected `prefix_slots` contiguous i64 [10]");
}

}  // namespace
}  // namespace fp8mla
