// Batch invariance: whether one sequence's (or token's) output bytes depend on the rest of the
// batch. What each op guarantees, and what is tested here:
//   prefill_attention: each tile is one (sequence, head, query block) and reduces over that
//     sequence's keys alone, in a fixed order; no split over keys is shared between sequences.
//     bf16: invariant. e4m3 (with and without LSE, V transposed or token-major, fused
//     fp8_group128 output): invariant among positions whose first key has the same offset in k
//     modulo 16. Its key tiles start on a 16-key boundary of k (TMA's alignment of transposed
//     V), so the offset modulo 16 sets which keys share a tile and the order of the sums; another
//     one changes the last bits, within the error rule. Tested: one sequence alone and inside
//     ragged batches of other sizes, neighbours and positions (so other max_seqlen, grids, token
//     offsets and V pitch padding); for e4m3, with key offsets that are multiples of 16.
//   merge_attention_states: invariant per (token, head). Tested: a token range merged alone
//     against the same tokens inside the whole batch.
//   mla_rope_quantize_fp8 (with its cache write), mla_kv_pack_quantize_fp8, mla_v_quantize_fp8,
//   quantize_fp8_per_token_group: invariant per token (row). Tested as the merge, by running the
//     op on a token range of the batch's views.
//   quantize_nvfp4 (per row at a given global scale), quantize_fp8 with a static scale,
//   mla_kv_cache_write, mla_kv_gather: per row or token by construction (elementwise over rows);
//     not tested here.
//   quantize_fp8_dynamic: NOT batch invariant by definition: its scale is the amax of the whole
//     tensor, so other rows change every row's bytes.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "attention_case_util.hpp"
#include "cuda_test_util.hpp"
#include "device_case_util.cuh"
#include "mla_kv_test_util.hpp"
#include "mla_rope_test_util.hpp"
#include "quantize_test_util.hpp"

namespace fp8mla::test {
namespace {

// ---- prefill_attention --------------------------------------------------------------------------

constexpr std::uint64_t kSequenceSeed = 777;

struct Batch {
  std::vector<int> q_lens, k_lens;
  std::size_t at;  // the position of the sequence under test
};

// The sequence's rows of every output buffer (out, lse and the fused block scales are all
// token-major with rows of one size), after one run of `c`.
std::vector<std::vector<std::uint8_t>> sequence_rows(const PrefillCase& c, std::size_t at) {
  const DeviceCase<PrefillCase> dc(c);
  const TestStream stream;
  dc.run(stream.get());
  stream.sync();
  EXPECT_TRUE(dc.guards_intact());
  std::int64_t first = 0;
  for (std::size_t b = 0; b < at; ++b) first += c.q_lens[b];
  std::vector<std::vector<std::uint8_t>> rows;
  const std::vector<int> outputs =
      c.quant == OutputQuantKey::kFp8Group128 ? std::vector{6, 7, 8} : std::vector{6, 7};
  for (int i : outputs) {
    const std::size_t row_bytes = dc.buffer(std::size_t(i)).bytes() / std::size_t(c.tq());
    rows.push_back(
        dc.buffer(std::size_t(i))
            .download(std::size_t(first) * row_bytes, std::size_t(c.q_lens[at]) * row_bytes));
  }
  return rows;
}

// The sequence (q_len queries, k_len keys) alone, then in each batch: the same bytes.
void expect_sequence_invariant(PrefillCase base, int q_len, int k_len) {
  // e4m3: the sequence's keys start at offsets 0, 48 and 336 (multiples of 16, see the top).
  std::vector<Batch> batches =
      base.fp8 ? std::vector<Batch>{{{q_len}, {k_len}, 0},
                                    {{48, q_len, 7}, {48, k_len, 300}, 1},
                                    {{3, 1, 200, q_len}, {3, 125, 208, k_len}, 3},
                                    {{q_len, 64, 64, 64, 64, 64}, {k_len, 64, 64, 64, 64, 64}, 0}}
               : std::vector<Batch>{{{q_len}, {k_len}, 0},
                                    {{50, q_len, 7}, {50, k_len, 300}, 1},
                                    {{3, 1, 200, q_len}, {3, 129, 200, k_len}, 3},
                                    {{q_len, 64, 64, 64, 64, 64}, {k_len, 64, 64, 64, 64, 64}, 0}};
  // 70 sequences of short tiles, 16 heads: 1120 work tiles, at least 8 per SM of an H100/H200, so
  // the kernel runs them on its persistent grid (the others on one CTA a tile): the same bytes.
  Batch many{std::vector<int>(70, 64), std::vector<int>(70, 64), 35};
  many.q_lens[35] = q_len;
  many.k_lens[35] = k_len;
  batches.push_back(many);
  std::vector<std::vector<std::uint8_t>> alone;
  for (std::size_t n = 0; n < batches.size(); ++n) {
    const Batch& batch = batches[n];
    PrefillCase c = base;
    c.q_lens = batch.q_lens;
    c.k_lens = batch.k_lens;
    c.seed = 100 + n;
    c.seq_seeds.clear();
    for (std::size_t b = 0; b < batch.q_lens.size(); ++b) {
      c.seq_seeds.push_back(b == batch.at ? kSequenceSeed : 1000 * n + b);
    }
    SCOPED_TRACE(c.describe());
    const std::vector<std::vector<std::uint8_t>> rows = sequence_rows(c, batch.at);
    if (n == 0) {
      alone = rows;
      continue;
    }
    for (std::size_t i = 0; i < rows.size(); ++i) {
      EXPECT_TRUE(same_bytes(
          rows[i], alone[i],
          concat("output ", i, " (0 out, 1 lse, 2 scales)", " in batch ", n, " vs alone")));
    }
  }
}

TEST(BatchInvarianceCuda, PrefillSequenceAloneAndInRaggedBatches) {
  FP8MLA_REQUIRE_HOPPER();
  for (const PrefillCase& base :
       {PrefillCase{}, PrefillCase{.with_lse = false}, PrefillCase{.v_token_major = true},
        PrefillCase{.fp8 = false}, PrefillCase{.causal = false},
        PrefillCase{.quant = OutputQuantKey::kFp8Group128},
        PrefillCase{.causal = false, .fold = true}}) {
    expect_sequence_invariant(base, 100, 100);
    expect_sequence_invariant(base, 100, 260);  // a prefix longer than the new tokens
  }
}

// ---- Row-wise ops: a token range alone against the same tokens in the batch ---------------------

struct ByteRange {
  std::size_t buffer, begin, end;
};

// Runs the whole batch, then (from the same buffers) `part` on a token range of it; the byte
// ranges the range's tokens own must be equal, and `part` must have written them (the poison of
// the pristine buffers differs from the result somewhere).
template <typename Case>
void expect_part_equals_whole(const Case& c,
                              const std::function<void(std::span<void* const>, cudaStream_t)>& part,
                              const std::vector<ByteRange>& ranges) {
  SCOPED_TRACE(c.describe());
  const DeviceCase<Case> dc(c);
  const TestStream stream;
  const std::vector<std::vector<std::uint8_t>> pristine = dc.download();
  dc.run(stream.get());
  stream.sync();
  const std::vector<std::vector<std::uint8_t>> whole = dc.download();
  dc.restore(stream.get());
  part(dc.bases(), stream.get());
  stream.sync();
  const std::vector<std::vector<std::uint8_t>> alone = dc.download();
  bool wrote = false;
  for (const ByteRange& r : ranges) {
    const auto slice = [&](const std::vector<std::vector<std::uint8_t>>& b) {
      return std::span(b[r.buffer]).subspan(r.begin, r.end - r.begin);
    };
    EXPECT_TRUE(same_bytes(slice(alone), slice(whole),
                           concat("buffer ", r.buffer, " bytes ", r.begin, "..", r.end)));
    wrote |= !std::ranges::equal(slice(alone), slice(pristine));
  }
  EXPECT_TRUE(wrote) << "the token range wrote nothing";
  EXPECT_TRUE(dc.guards_intact());
}

constexpr std::int64_t kFirst = 37, kCount = 91;  // tokens 37 .. 127 of 300

TEST(BatchInvarianceCuda, MergeTokenRangeAloneAndInTheBatch) {
  FP8MLA_REQUIRE_HOPPER();
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    const MergeCase c{.dtype = dtype, .tokens = 300, .heads = 16, .seed = 61};
    const std::vector<Spec> s = c.specs();
    const auto part = [&](std::span<void* const> b, cudaStream_t stream) {
      const auto v = [&](int i) {
        return s[std::size_t(i)].view(b[std::size_t(i)], Device::cuda(0)).narrow(0, kFirst, kCount);
      };
      merge_attention_states(v(0), v(1), v(2), v(3), v(4), v(5), stream);
    };
    // out is head-major ([H, T, D] memory): one range per head; out_lse rows are H + 3 apart.
    std::vector<ByteRange> ranges;
    const std::size_t es = dtype_size(dtype), d = std::size_t(c.dim);
    for (std::int64_t h = 0; h < c.heads; ++h) {
      const std::size_t head = std::size_t(h * c.tokens) * d * es;
      ranges.push_back({4, head + kFirst * d * es, head + (kFirst + kCount) * d * es});
    }
    const std::size_t lse_row = std::size_t(c.heads + 3) * 4;
    ranges.push_back({5, kFirst * lse_row, (kFirst + kCount) * lse_row});
    expect_part_equals_whole(c, part, ranges);
  }
}

TEST(BatchInvarianceCuda, RopeQuantizeTokenRangeAloneAndInTheBatch) {
  FP8MLA_REQUIRE_HOPPER();
  RopeCase c;
  c.tokens = 300;
  c.heads = 16;
  c.page_size = 16;
  c.seed = 62;
  const std::vector<ViewSpec> v = c.views();
  const auto part = [&](std::span<void* const> b, cudaStream_t stream) {
    MlaRopeQuantizeArgs a = c.args(b, Device::cuda(0));
    for (TensorView* t : {&a.q_nope, &a.q_pe, &a.k_nope, &a.k_pe, &a.positions, &a.q_out, &a.k_out,
                          &a.cache_write->slot_mapping, &a.kv_c}) {
      *t = t->narrow(0, kFirst, kCount);
    }
    mla_rope_quantize_fp8(a, stream);
  };
  std::vector<ByteRange> ranges;
  for (int out : {kQOut, kKOut}) {
    ranges.push_back({std::size_t(out), std::size_t(v[out].byte_at(kFirst)),
                      std::size_t(v[out].byte_at(kFirst + kCount))});
  }
  // The cache rows of the range's slots.
  const std::vector<HostBuffer> host = case_buffers(c);
  for (std::int64_t t = kFirst; t < kFirst + kCount; ++t) {
    const std::int64_t slot = RopeCase::load_index(host[kSlots].data(), c.slot_dtype, t);
    if (slot < 0) continue;
    const std::size_t row = std::size_t(v[kCache].byte_at(slot / c.page_size, slot % c.page_size));
    ranges.push_back({std::size_t(kCache), row, row + 576});
  }
  expect_part_equals_whole(c, part, ranges);
}

TEST(BatchInvarianceCuda, KvPackAndVQuantizeTokenRangeAloneAndInTheBatch) {
  FP8MLA_REQUIRE_HOPPER();
  for (bool v_only : {false, true}) {
    KvPackCase c;
    c.tokens = 300;
    c.heads = 16;
    c.v_transposed = true;
    c.v_only = v_only;
    c.seed = 63;
    const std::vector<Spec> s = c.specs();
    const auto part = [&](std::span<void* const> b, cudaStream_t stream) {
      const Device d = Device::cuda(0);
      const TensorView v = c.v_spec().view(b[0], d).narrow(0, kFirst, kCount);
      const TensorView v_out = s[4].view(b[4], d).narrow(0, kFirst, kCount);
      if (v_only) {
        mla_v_quantize_fp8(v, v_out, c.v_scale_inv, VLayout::kTransposed, stream);
        return;
      }
      MlaKvPackArgs a;
      a.k_nope = c.k_nope_spec().view(b[0], d).narrow(0, kFirst, kCount);
      a.k_pe = s[1].view(b[1], d).narrow(0, kFirst, kCount);
      a.v = v;
      a.k_out = s[3].view(b[3], d).narrow(0, kFirst, kCount);
      a.v_out = v_out;
      a.v_layout = VLayout::kTransposed;
      mla_kv_pack_quantize_fp8(a, stream);
    };
    std::vector<ByteRange> ranges;
    if (!v_only) ranges.push_back({3, kFirst * 192 * 16, (kFirst + kCount) * 192 * 16});
    // Transposed V: each (head, dim) row of `pitch` tokens holds the range's tokens.
    const std::size_t pitch = std::size_t(c.tokens + c.v_pitch_pad);
    for (std::size_t row = 0; row < std::size_t(c.heads) * 128; ++row) {
      ranges.push_back({4, row * pitch + kFirst, row * pitch + kFirst + kCount});
    }
    expect_part_equals_whole(c, part, ranges);
  }
}

TEST(BatchInvarianceCuda, PerTokenGroupRowRangeAloneAndInTheBatch) {
  FP8MLA_REQUIRE_HOPPER();
  const GroupCase c{.shape = {300, 2048}, .layout = ScaleLayout::kF32RowMajor, .seed = 64};
  const std::vector<Spec> s = c.specs();
  const auto part = [&](std::span<void* const> b, cudaStream_t stream) {
    const auto v = [&](int i) {
      return s[std::size_t(i)].view(b[std::size_t(i)], Device::cuda(0)).narrow(0, kFirst, kCount);
    };
    quantize_fp8_per_token_group(v(0), v(1), v(2), c.options(), stream);
  };
  const std::size_t groups = 2048 / 128;
  expect_part_equals_whole(c, part,
                           {{1, kFirst * 2048, (kFirst + kCount) * 2048},
                            {2, kFirst * groups * 4, (kFirst + kCount) * groups * 4}});
}

}  // namespace
}  // namespace fp8mla::test
