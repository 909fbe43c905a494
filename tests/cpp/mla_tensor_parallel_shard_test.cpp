// The tensor-parallel weight shards (shard_mla_weights, the loaders with a MlaTensorParallel), the
// checks of the spec, and the in-process communicators (fp8mla/mla_parallel.hpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "error_test_util.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_layer.hpp"
#include "fp8mla/mla_parallel.hpp"
#include "fp8mla/numerics.hpp"
#include "fp8mla/safetensors.hpp"

namespace fp8mla {
namespace {

using test::expect_error;

// Element (r, c) of a 2-d contiguous tensor, as raw bytes.
std::vector<std::byte> element(const TensorView& t, std::int64_t r, std::int64_t c) {
  const std::size_t n = std::size_t(dtype_size(t.dtype()));
  const auto* p = static_cast<const std::byte*>(t.data()) + std::size_t(r * t.size(1) + c) * n;
  return {p, p + n};
}

// Every element of `shard` is the full tensor's at (row0 + r, col0 + c), and it covers `rows` x
// `cols`; returns the mismatches.
std::int64_t slice_mismatches(const TensorView& shard, const TensorView& full, std::int64_t row0,
                              std::int64_t rows, std::int64_t col0, std::int64_t cols) {
  EXPECT_EQ(shard.size(0), rows);
  EXPECT_EQ(shard.size(1), cols);
  EXPECT_TRUE(shard.is_contiguous());
  EXPECT_EQ(shard.dtype(), full.dtype());
  std::int64_t bad = 0;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      bad += element(shard, r, c) != element(full, row0 + r, col0 + c);
  return bad;
}

// Rank r of `size`: q (q_b_proj or q_proj) rows [r * Hl * 192, + Hl * 192), kv_b_proj rows
// [r * Hl * 256, + Hl * 256), o_proj columns [r * Hl * 128, + Hl * 128), the scales' 128-blocks
// of the same ranges; the latent weights the full ones (the same memory).
void check_shard(const MlaConfig& c, WeightFormat format, int size) {
  const MlaWeights full = generate_mla_weights(c, format, 21);
  const std::int64_t hl = c.heads / size;
  const bool fp8 = format == WeightFormat::kFp8Block;
  const auto q = c.q_lora_rank > 0 ? &MlaWeights::q_b_proj : &MlaWeights::q_proj;
  for (int rank = 0; rank < size; ++rank) {
    SCOPED_TRACE(::testing::Message() << c.name << " size " << size << " rank " << rank);
    const MlaWeights s = shard_mla_weights(full, c, {rank, size});
    const std::int64_t h0 = rank * hl, q_in = (full.*q).weight.size(1);
    EXPECT_EQ(slice_mismatches((s.*q).weight, (full.*q).weight, h0 * 192, hl * 192, 0, q_in), 0);
    EXPECT_EQ(slice_mismatches(s.kv_b_proj.weight, full.kv_b_proj.weight, h0 * 256, hl * 256, 0,
                               c.kv_lora_rank),
              0);
    EXPECT_EQ(
        slice_mismatches(s.o_proj.weight, full.o_proj.weight, 0, c.hidden, h0 * 128, hl * 128), 0);
    if (fp8) {
      const std::int64_t q_blocks = (full.*q).scale_inv.size(1);
      EXPECT_EQ(slice_mismatches((s.*q).scale_inv, (full.*q).scale_inv, h0 * 192 / 128,
                                 hl * 192 / 128, 0, q_blocks),
                0);
      EXPECT_EQ(
          slice_mismatches(s.kv_b_proj.scale_inv, full.kv_b_proj.scale_inv, h0 * 2, hl * 2, 0, 4),
          0);
      EXPECT_EQ(slice_mismatches(s.o_proj.scale_inv, full.o_proj.scale_inv, 0,
                                 (c.hidden + 127) / 128, h0, hl),
                0);
    } else {
      EXPECT_EQ(s.o_proj.scale_inv.data(), nullptr);
    }
    EXPECT_EQ(s.kv_a_proj_with_mqa.weight.data(), full.kv_a_proj_with_mqa.weight.data());
    EXPECT_EQ(s.kv_a_layernorm.data(), full.kv_a_layernorm.data());
    if (c.q_lora_rank > 0) {
      EXPECT_EQ(s.q_a_proj.weight.data(), full.q_a_proj.weight.data());
      EXPECT_EQ(s.q_a_layernorm.data(), full.q_a_layernorm.data());
    }
    // The shard is a layer of Hl heads.
    EXPECT_NO_THROW(MlaLayer(c, s, Device::cpu(), {rank, size}));
  }
}

MlaConfig with_heads(const char* preset, std::int64_t heads) {
  MlaConfig c = mla_preset(preset);
  c.heads = heads;
  return c;
}

TEST(MlaTensorParallelShard, SlicesMatchTheFullWeightsElementWise) {
  for (int size : {1, 2, 4}) check_shard(mla_preset("tiny"), WeightFormat::kBf16, size);
  check_shard(mla_preset("tiny"), WeightFormat::kFp8Block, 2);
  for (int size : {4, 8}) check_shard(with_heads("tiny", 16), WeightFormat::kFp8Block, size);
  // q_proj (no query LoRA) shards like q_b_proj: DeepSeek-V2-Lite's 16 heads over 8 ranks.
  check_shard(mla_preset("deepseek-v2-lite"), WeightFormat::kFp8Block, 8);
}

TEST(MlaTensorParallelShard, TheShardOutlivesTheFullWeights) {
  const MlaConfig c = mla_preset("tiny");
  MlaWeights s;
  std::vector<std::byte> q_rows;
  {
    const MlaWeights full = generate_mla_weights(c, WeightFormat::kFp8Block, 4);
    s = shard_mla_weights(full, c, {1, 2});
    const TensorView& q = full.q_b_proj.weight;
    const auto* at = static_cast<const std::byte*>(q.data()) + 384 * q.size(1);
    q_rows.assign(at, at + 384 * q.size(1));
  }
  EXPECT_EQ(std::memcmp(s.q_b_proj.weight.data(), q_rows.data(), q_rows.size()), 0);
}

TEST(MlaTensorParallelShard, BadSpecsAreClearErrors) {
  const MlaConfig tiny = mla_preset("tiny");  // 4 heads
  const auto bad = ErrorCategory::kInvalidArgument;
  for (int size : {0, 3, 16, -2}) {
    expect_error(
        [&] {
          check_mla_tensor_parallel(tiny, {0, size}, WeightFormat::kBf16);
        },
        bad, {"expected size 1, 2, 4 or 8", "of " + std::to_string(size)});
  }
  expect_error(
      [&] {
        check_mla_tensor_parallel(tiny, {0, 8}, WeightFormat::kBf16);
      },
      bad, {"dividing the head count 4", "'tiny'"});
  for (int rank : {-1, 2}) {
    expect_error(
        [&] {
          check_mla_tensor_parallel(tiny, {rank, 2}, WeightFormat::kBf16);
        },
        bad, {"expected 0 <= rank < 2", "rank " + std::to_string(rank)});
  }
  // One head per rank: q_b_proj shards of 192 rows straddle the 128-row scale blocks.
  const MlaWeights fp8 = generate_mla_weights(tiny, WeightFormat::kFp8Block, 2);
  expect_error(
      [&] {
        shard_mla_weights(fp8, tiny, {1, 4});
      },
      bad, {"q_b_proj shards of 1 heads * 192 = 192 rows", "128-row blocks"});
  expect_error([&] { MlaLayer(tiny, fp8, Device::cpu(), {0, 4}); }, bad, {"128-row blocks"});
  expect_error(
      [&] {
        check_mla_tensor_parallel(mla_preset("deepseek-v2-lite"), {0, 16}, WeightFormat::kFp8Block);
      },
      bad, {"expected size 1, 2, 4 or 8"});
  EXPECT_NO_THROW(check_mla_tensor_parallel(tiny, {3, 4}, WeightFormat::kBf16));
  // The layer takes rank-shaped weights: the full ones under size 2 name the shape expected.
  const MlaWeights bf16 = generate_mla_weights(tiny, WeightFormat::kBf16, 2);
  expect_error(
      [&] {
        MlaLayer(tiny, bf16, Device::cpu(), {0, 2});
      },
      bad, {"q_b_proj.weight", "[384, 512]"});
  // A communicator of another rank or size than the layer's.
  std::vector<std::unique_ptr<MlaCommunicator>> comms = make_cpu_communicators(2);
  const MlaWeights shard = shard_mla_weights(bf16, tiny, {0, 2});
  expect_error(
      [&] {
        MlaLayer(tiny, shard, Device::cpu(), {0, 2}, comms[1].get());
      },
      bad, {"communicator is rank 1 of 2", "rank 0 of 2"});
  // Full weights of the wrong shape for the config.
  expect_error(
      [&] {
        shard_mla_weights(bf16, with_heads("tiny", 8), {0, 2});
      },
      bad, {"expected the full weight 'q_b_proj.weight'", "[1536, 512]"});
}

// Runs fn(rank) on `size` threads and joins them.
template <typename Fn>
void on_ranks(int size, Fn fn) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) threads.emplace_back([&, rank] { fn(rank); });
  for (std::thread& t : threads) t.join();
}

TEST(MlaTensorParallelCommunicator, SumsInRankOrderAndScattersRows) {
  const int n = 4;
  std::vector<std::unique_ptr<MlaCommunicator>> comms = make_cpu_communicators(n);
  // bf16: rank r holds r + 1 + i / 8; the sum is rounded once.
  std::vector<std::vector<std::uint16_t>> bufs(n, std::vector<std::uint16_t>(16));
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < 16; ++i)
      bufs[std::size_t(r)][std::size_t(i)] = encode_bf16(r + 1 + i / 8.f);
  on_ranks(n, [&](int r) {
    EXPECT_EQ(comms[std::size_t(r)]->rank(), r);
    EXPECT_EQ(comms[std::size_t(r)]->size(), n);
    comms[std::size_t(r)]->all_reduce_sum(
        TensorView(bufs[std::size_t(r)].data(), DType::kBF16, {4, 4}), nullptr);
  });
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < 16; ++i)
      EXPECT_EQ(bufs[std::size_t(r)][std::size_t(i)], encode_bf16(10 + 4 * (i / 8.f)));
  // f32 reduce-scatter over rows: rank r gets rows [2r, 2r + 2) of the sum.
  std::vector<std::vector<float>> in(n, std::vector<float>(8 * 3)), out(n, std::vector<float>(6));
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < 24; ++i) in[std::size_t(r)][std::size_t(i)] = float(i * (r + 1));
  on_ranks(n, [&](int r) {
    comms[std::size_t(r)]->reduce_scatter_sum(
        TensorView(in[std::size_t(r)].data(), DType::kF32, {8, 3}),
        TensorView(out[std::size_t(r)].data(), DType::kF32, {2, 3}), nullptr);
  });
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < 6; ++i)
      EXPECT_EQ(out[std::size_t(r)][std::size_t(i)], float((r * 6 + i) * 10));
}

// Rank r's bytes for an all-gather: distinct per rank and position. Any bit pattern will do (f32
// NaN payloads included), as the bytes are copied, not converted.
std::vector<std::byte> rank_bytes(std::size_t n, int rank) {
  std::vector<std::byte> b(n);
  for (std::size_t i = 0; i < n; ++i)
    b[i] = std::byte((std::size_t(rank) * 37 + i * 11 + 1) & 0xFF);
  return b;
}

// An all-gather of `shape` rows on n ranks, out of place or in place (in = rank r's rows of out):
// rank q's bytes at rows [q * rows, (q + 1) * rows) of every rank's out, nothing written past it.
void check_all_gather(int n, DType dtype, std::vector<std::int64_t> shape, bool in_place) {
  SCOPED_TRACE(::testing::Message()
               << n << " ranks, " << dtype_name(dtype) << " rows of " << shape.back()
               << (in_place ? ", in place" : ", out of place"));
  std::vector<std::unique_ptr<MlaCommunicator>> comms = make_cpu_communicators(n);
  std::size_t slice = std::size_t(dtype_size(dtype));
  for (const std::int64_t d : shape) slice *= std::size_t(d);
  std::vector<std::int64_t> out_shape = shape;
  out_shape[0] *= n;
  const std::size_t guard = 16;
  const std::byte poison{0xA5};
  std::vector<std::vector<std::byte>> ins, outs;
  for (int r = 0; r < n; ++r) {
    ins.push_back(rank_bytes(slice, r));
    outs.emplace_back(slice * std::size_t(n) + guard, poison);
    if (in_place && slice > 0) {
      std::memcpy(outs.back().data() + std::size_t(r) * slice, ins.back().data(), slice);
    }
  }
  on_ranks(n, [&](int r) {
    std::byte* out = outs[std::size_t(r)].data();
    void* in = in_place ? out + std::size_t(r) * slice : ins[std::size_t(r)].data();
    comms[std::size_t(r)]->all_gather(TensorView(in, dtype, shape),
                                      TensorView(out, dtype, out_shape), nullptr);
  });
  for (int r = 0; r < n; ++r) {
    const std::vector<std::byte>& out = outs[std::size_t(r)];
    for (int q = 0; q < n; ++q) {
      const auto rows = out.begin() + std::ptrdiff_t(std::size_t(q) * slice);
      EXPECT_TRUE(std::equal(rows, rows + std::ptrdiff_t(slice), ins[std::size_t(q)].begin()))
          << "rank " << r << "'s out, rank " << q << "'s rows";
    }
    EXPECT_TRUE(std::all_of(out.end() - std::ptrdiff_t(guard), out.end(),
                            [&](std::byte b) { return b == poison; }))
        << "rank " << r << ": written past out";
    EXPECT_EQ(ins[std::size_t(r)], rank_bytes(slice, r)) << "rank " << r << "'s in changed";
  }
}

TEST(MlaTensorParallelCommunicator, GathersEveryRanksRowsByteForByte) {
  for (int n = 1; n <= 4; ++n) {
    for (const bool in_place : {false, true}) {
      check_all_gather(n, DType::kE4M3, {3, 576}, in_place);  // latent cache rows
      check_all_gather(n, DType::kUE8M0, {2, 5}, in_place);
      check_all_gather(n, DType::kF32, {3, 2, 3}, in_place);
      check_all_gather(n, DType::kBF16, {1, 7}, in_place);
      check_all_gather(n, DType::kI32, {5}, in_place);
      check_all_gather(n, DType::kI64, {2, 1}, in_place);
      check_all_gather(n, DType::kE4M3, {0, 576}, in_place);  // no rows on any rank
    }
  }
}

TEST(MlaTensorParallelCommunicator, MismatchedCallsFailOnEveryRank) {
  std::vector<std::unique_ptr<MlaCommunicator>> comms = make_cpu_communicators(2);
  std::vector<float> a(8), b(6);
  int errors = 0;
  std::mutex m;
  on_ranks(2, [&](int r) {
    try {
      comms[std::size_t(r)]->all_reduce_sum(
          r == 0 ? TensorView(a.data(), DType::kF32, {8}) : TensorView(b.data(), DType::kF32, {6}),
          nullptr);
    } catch (const Error& e) {
      std::lock_guard lock(m);
      ++errors;
      EXPECT_NE(e.message().find("differs from rank 0's"), std::string::npos) << e.message();
    }
  });
  EXPECT_EQ(errors, 2);
  std::vector<float> rows(6), part(3);
  errors = 0;
  on_ranks(2, [&](int r) {
    try {
      comms[std::size_t(r)]->reduce_scatter_sum(TensorView(rows.data(), DType::kF32, {6}),
                                                TensorView(part.data(), DType::kF32, {2}), nullptr);
    } catch (const Error& e) {
      std::lock_guard lock(m);
      ++errors;
      EXPECT_NE(e.message().find("expected rows divisible by 2"), std::string::npos);
    }
  });
  EXPECT_EQ(errors, 2);
  expect_error([] { make_cpu_communicators(0); }, ErrorCategory::kInvalidArgument,
               {"expected 1 <= size <= 8, got 0"});
}

// Runs fn(rank) on `size` ranks; every rank must throw a kInvalidArgument error containing
// `want`.
template <typename Fn>
void fails_on_every_rank(int size, const std::string& want, Fn fn) {
  SCOPED_TRACE(want);
  std::vector<int> errors(std::size_t(size), 0);
  on_ranks(size, [&](int r) {
    try {
      fn(r);
    } catch (const Error& e) {
      errors[std::size_t(r)] = 1;
      EXPECT_EQ(e.category(), ErrorCategory::kInvalidArgument);
      EXPECT_NE(e.message().find(want), std::string::npos) << e.message();
    }
  });
  for (int r = 0; r < size; ++r) EXPECT_EQ(errors[std::size_t(r)], 1) << "rank " << r;
}

TEST(MlaTensorParallelCommunicator, MismatchedGathersFailOnEveryRank) {
  const int n = 2;
  std::vector<std::unique_ptr<MlaCommunicator>> comms = make_cpu_communicators(n);
  std::vector<std::vector<float>> ins(n, std::vector<float>(8)), outs(n, std::vector<float>(16));
  auto view = [](std::vector<float>& v, std::initializer_list<std::int64_t> shape,
                 std::size_t offset = 0,
                 DType dtype = DType::kF32) { return TensorView(v.data() + offset, dtype, shape); };
  auto comm = [&](int r) -> MlaCommunicator& { return *comms[std::size_t(r)]; };
  // Another shape on rank 1.
  fails_on_every_rank(n, "differs from rank 0's f32[4, 2]", [&](int r) {
    comm(r).all_gather(r == 0 ? view(ins[0], {4, 2}) : view(ins[1], {3, 2}),
                       r == 0 ? view(outs[0], {8, 2}) : view(outs[1], {6, 2}), nullptr);
  });
  // Out without size() times in's rows, of another dtype, of other trailing dims.
  fails_on_every_rank(n, "expected out of in's dtype with 2 x 4 rows and in's trailing dims",
                      [&](int r) {
                        comm(r).all_gather(view(ins[std::size_t(r)], {4, 2}),
                                           view(outs[std::size_t(r)], {4, 2}), nullptr);
                      });
  fails_on_every_rank(n, "got i32[8, 2]", [&](int r) {
    comm(r).all_gather(view(ins[std::size_t(r)], {4, 2}),
                       view(outs[std::size_t(r)], {8, 2}, 0, DType::kI32), nullptr);
  });
  fails_on_every_rank(n, "got f32[8, 1, 2]", [&](int r) {
    comm(r).all_gather(view(ins[std::size_t(r)], {4, 2}), view(outs[std::size_t(r)], {8, 1, 2}),
                       nullptr);
  });
  // In overlapping out other than as this rank's rows.
  fails_on_every_rank(n, "exactly rank 0's rows of it, got in at byte 4 of out", [&](int r) {
    comm(r).all_gather(view(outs[std::size_t(r)], {4, 2}, r == 0 ? 1 : 8),
                       view(outs[std::size_t(r)], {8, 2}), nullptr);
  });
  // A device tensor, a scalar.
  fails_on_every_rank(n, "expected contiguous host tensors of at least one dimension", [&](int r) {
    comm(r).all_gather(TensorView(ins[std::size_t(r)].data(), DType::kF32, {4, 2}, Device::cuda(0)),
                       view(outs[std::size_t(r)], {8, 2}), nullptr);
  });
  fails_on_every_rank(n, "got f32[] strides", [&](int r) {
    comm(r).all_gather(view(ins[std::size_t(r)], {}), view(outs[std::size_t(r)], {2}), nullptr);
  });
  // Another collective on rank 1: which rank arrives first varies, the error does not.
  fails_on_every_rank(n, "but the first rank to arrive called", [&](int r) {
    if (r == 0) {
      comm(r).all_gather(view(ins[0], {4, 2}), view(outs[0], {8, 2}), nullptr);
    } else {
      comm(r).all_reduce_sum(view(ins[1], {4, 2}), nullptr);
    }
  });
  // The group still works after the errors.
  on_ranks(n, [&](int r) {
    ins[std::size_t(r)].assign(8, float(r + 1));
    comm(r).all_gather(view(ins[std::size_t(r)], {4, 2}), view(outs[std::size_t(r)], {8, 2}),
                       nullptr);
  });
  for (int r = 0; r < n; ++r)
    for (std::size_t k = 0; k < 16; ++k) EXPECT_EQ(outs[std::size_t(r)][k], k < 8 ? 1.0f : 2.0f);
}

// The loader with a spec gives the shard of the file's full weights, byte for byte.
// A build without NCCL's header says so; with it, nccl_communicator_cuda_test covers the group.
#ifndef FP8MLA_WITH_NCCL
TEST(MlaTensorParallelCommunicator, NcclNeedsABuildWithNccl) {
  test::expect_error([] { make_nccl_communicators({0}); }, ErrorCategory::kUnsupported,
                     {"make_nccl_communicators", "built without NCCL"});
  test::expect_error([] { make_nccl_communicator(nullptr); }, ErrorCategory::kUnsupported,
                     {"make_nccl_communicator", "built without NCCL"});
}
#endif

TEST(MlaTensorParallelShard, LoaderShardsTheFullCheckpoint) {
  const MlaConfig c = mla_preset("tiny");
  const MlaWeights generated = generate_mla_weights(c, WeightFormat::kFp8Block, 8);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("fp8mla_tp_test_" + std::to_string(::getpid()) + ".safetensors"))
                               .string();
  write_safetensors(path, mla_weight_tensors(generated, c, 1));
  {
    const SafetensorsFile file(path);
    for (int rank = 0; rank < 2; ++rank) {
      const MlaWeights loaded = load_mla_weights(file, c, 1, {rank, 2});
      const MlaWeights expected = shard_mla_weights(generated, c, {rank, 2});
      const auto a = mla_weight_tensors(loaded, mla_rank_config(c, {rank, 2}, loaded.format), 1);
      const auto b = mla_weight_tensors(expected, mla_rank_config(c, {rank, 2}, loaded.format), 1);
      ASSERT_EQ(a.size(), b.size());
      for (std::size_t i = 0; i < a.size(); ++i) {
        SCOPED_TRACE(a[i].first);
        const std::size_t bytes =
            std::size_t(a[i].second.numel() * dtype_size(a[i].second.dtype()));
        ASSERT_EQ(a[i].second.numel(), b[i].second.numel());
        EXPECT_EQ(std::memcmp(a[i].second.data(), b[i].second.data(), bytes), 0);
      }
    }
    expect_error(
        [&] {
          load_mla_weights(file, c, 1, {0, 4});
        },
        ErrorCategory::kInvalidArgument, {"128-row blocks"});
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace fp8mla
