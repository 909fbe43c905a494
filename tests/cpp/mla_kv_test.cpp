// CPU semantics of the latent-cache ops (mla_kv_cache_write, mla_kv_gather,
// mla_kv_pack_quantize_fp8, mla_v_quantize_fp8) against references on logical indices
// (mla_kv_test_util.hpp), and their argument checks: every bad input is an fp8mla::Error of the
// right category whose message names what was expected and what was given, and a rejected call
// writes nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "buffer_test_util.hpp"
#include "error_test_util.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_prep.hpp"
#include "fp8mla/numerics.hpp"
#include "mla_kv_test_util.hpp"

namespace fp8mla {
namespace {

using test::CacheGeometry;
using test::Data;
using test::HostBuffer;
using test::kPoison;
using test::KvGatherCase;
using test::KvPackCase;
using test::KvWriteCase;

std::vector<std::uint8_t> bytes_of(const HostBuffer& b) {
  return {b.payload().begin(), b.payload().end()};
}

void expect_write(const KvWriteCase& c) {
  SCOPED_TRACE(c.describe());
  std::vector<HostBuffer> buffers = test::host_buffers(c);
  const std::vector<std::uint8_t> want = c.expected_cache(buffers);
  const std::vector<std::uint8_t> kv = bytes_of(buffers[0]), pe = bytes_of(buffers[1]);
  test::run_cpu(c, buffers);
  EXPECT_TRUE(test::same_bytes(buffers[3].payload(), want, "cache"));
  EXPECT_TRUE(test::same_bytes(buffers[0].payload(), kv, "kv_c (input)"));
  EXPECT_TRUE(test::same_bytes(buffers[1].payload(), pe, "k_pe (input)"));
  std::int32_t flag;
  std::memcpy(&flag, buffers[4].data(), 4);
  EXPECT_EQ(flag, 0);
  for (const HostBuffer& b : buffers) EXPECT_TRUE(b.guards_intact());
}

// Runs `c` on the CPU: buffers[outputs[i].first] equals the reference's output i, no guard is hit.
template <typename Case>
void expect_reference(const Case& c, std::initializer_list<std::pair<int, const char*>> outputs) {
  SCOPED_TRACE(c.describe());
  std::vector<HostBuffer> buffers = test::host_buffers(c);
  const auto want = c.expected_outputs(buffers);
  test::run_cpu(c, buffers);
  std::size_t i = 0;
  for (const auto& [buffer, name] : outputs) {
    EXPECT_TRUE(test::same_bytes(buffers[buffer].payload(), want[i++], name));
  }
  for (const HostBuffer& b : buffers) EXPECT_TRUE(b.guards_intact());
}

void expect_gather(const KvGatherCase& c) {
  expect_reference(c, {{2, "kv_c_out"}, {3, "k_pe_out"}});
}

void expect_pack(const KvPackCase& c) {
  expect_reference(c, {{3, "k_out"}, {4, "v_out"}, {5, "k_rope_out"}});
}

// ---- mla_kv_cache_write -------------------------------------------------------------------

TEST(MlaKvCacheWrite, EveryPageSizeAndLayout) {
  test::for_each_cache_layout(
      {0, 1, 3, 7, 33, 100}, 4, 0, [](auto page_size, auto tokens, int layout, std::uint64_t seed) {
        expect_write(test::write_sweep_case(page_size, tokens, layout, seed, 1));
      });
}

TEST(MlaKvCacheWrite, AllSlotsSkippedWritesNothing) {
  KvWriteCase c;
  c.tokens = 5;
  c.explicit_slots = {-1, -1, -1, -1, -1};
  expect_write(c);
}

TEST(MlaKvCacheWrite, EmptyCacheAcceptsOnlySkippedTokens) {
  KvWriteCase c;
  c.tokens = 2;
  c.cache = {0, 16, 0, 0};
  c.explicit_slots = {-1, -1};
  expect_write(c);
}

TEST(MlaKvCacheWrite, OutOfRangeSlotThrowsAndWritesNothing) {
  for (std::int64_t bad_slot : {std::int64_t(64), std::int64_t(-2), std::int64_t(1) << 40}) {
    KvWriteCase c;
    c.tokens = 6;
    c.cache = {4, 16, 0, 0};
    c.explicit_slots = {0, 5, 63, bad_slot, 7, -1};
    std::vector<HostBuffer> buffers = test::host_buffers(c);
    const std::vector<std::uint8_t> before = bytes_of(buffers[3]);
    SCOPED_TRACE(concat("slot ", bad_slot));
    test::expect_error(
        [&] { test::run_cpu(c, buffers); }, ErrorCategory::kOutOfRange,
        {"mla_kv_cache_write", "`slot_mapping`[3]", concat("= ", bad_slot), "[0, 64)"});
    EXPECT_TRUE(test::same_bytes(buffers[3].payload(), before, "cache after a rejected write"));
  }
}

// ---- mla_kv_gather ------------------------------------------------------------------------

TEST(MlaKvGather, EveryPageSizeAndLayout) {
  test::for_each_cache_layout(
      {0, 1, 3, 7, 65, 200}, 3, 100,
      [](auto page_size, auto tokens, int layout, std::uint64_t seed) {
        expect_gather(test::gather_sweep_case(page_size, tokens, layout, seed, 3));
      });
}

TEST(MlaKvGather, BadSlotThrowsAndWritesNothing) {
  for (std::int64_t bad_slot : {std::int64_t(-1), std::int64_t(48), std::int64_t(-7)}) {
    KvGatherCase c;
    c.tokens = 4;
    c.cache = {3, 16, 0, 0};
    c.explicit_slots = {47, 0, bad_slot, 1};
    std::vector<HostBuffer> buffers = test::host_buffers(c);
    SCOPED_TRACE(concat("slot ", bad_slot));
    test::expect_error([&] { test::run_cpu(c, buffers); }, ErrorCategory::kOutOfRange,
                       {"`slots`[2]", "[0, 48)"});
    for (int k : {2, 3}) {
      for (std::uint8_t byte : buffers[k].payload()) ASSERT_EQ(byte, kPoison) << "buffer " << k;
    }
  }
}

// What the write wrote, gathered: exactly bf16(decode(q) * scale) of the cache bytes, and
// within FP8 precision of the input.
TEST(MlaKvGather, RoundTripsTheWrite) {
  const float scale_inv = 4.0f, scale = 0.25f;
  KvWriteCase w;
  w.tokens = 77;
  w.cache = {5, 32, 0, 0};
  w.skip_every = 0;
  w.scale_inv = scale_inv;
  w.seed = 9;
  std::vector<HostBuffer> wb = test::host_buffers(w);
  // Inputs in [-64, 64]: x * 4 stays within e4m3's range.
  test::Rng rng(5);
  for (int k : {0, 1}) {
    const test::Spec s = w.specs()[k];
    for (std::int64_t i = 0; i < s.buffer_elems; ++i) {
      const float v = (rng.uniform() * 2.0f - 1.0f) * std::ldexp(1.0f, int(rng.below(12)) - 5);
      test::store_f32(wb[k].data(), DType::kBF16, i, v);
    }
  }
  test::run_cpu(w, wb);

  KvGatherCase g;
  g.tokens = w.tokens;
  g.cache = w.cache;
  g.explicit_slots = w.slots();
  g.scale = scale;
  std::vector<HostBuffer> gb = test::host_buffers(g);
  std::memcpy(gb[0].data(), wb[3].data(), wb[3].bytes());
  const auto want = g.expected_outputs(gb);
  test::run_cpu(g, gb);
  EXPECT_TRUE(test::same_bytes(gb[2].payload(), want[0], "kv_c_out"));
  EXPECT_TRUE(test::same_bytes(gb[3].payload(), want[1], "k_pe_out"));

  const std::vector<test::Spec> ws = w.specs(), gs = g.specs();
  for (std::int64_t t = 0; t < w.tokens; ++t) {
    for (int i = 0; i < kMlaLatentDim; ++i) {
      const bool kv = i < kMlaKvLoraRank;
      const int j = kv ? i : i - kMlaKvLoraRank;
      const float x = test::load_f32(wb[kv ? 0 : 1].data(), DType::kBF16,
                                     test::element_at(ws[kv ? 0 : 1], t, 0, j));
      const float y = test::load_f32(gb[kv ? 2 : 3].data(), DType::kBF16,
                                     test::element_at(gs[kv ? 2 : 3], t, 0, j));
      // e4m3: 3 mantissa bits (relative 2^-4), subnormal step 2^-9 (scaled), then bf16 rounding.
      const float tol = std::fabs(x) * (0x1p-4f + 0x1p-8f) * 1.01f + 0x1p-10f * scale;
      ASSERT_LE(std::fabs(x - y), tol)
          << "token " << t << " element " << i << ": " << x << " -> " << y;
    }
  }
}

// ---- mla_kv_pack_quantize_fp8 -------------------------------------------------------------

TEST(MlaKvPack, EveryTokenCountUpTo64) {
  for (std::int64_t n = 0; n <= 64; ++n) {
    for (std::int64_t heads : {1, 16}) {
      KvPackCase c = test::pack_sweep_case(n, heads, std::uint64_t(n * 10 + heads));
      c.in_pad = 8;
      c.k_pe_3d = n % 4 == 1;
      c.out_pad = n % 5 == 0 ? 16 : 0;
      c.k_scale_inv = 0.5f;
      c.split_k = n % 3 == 1;
      expect_pack(c);
    }
  }
}

TEST(MlaKvPack, HeadsAndLayouts) {
  std::uint64_t seed = 500;
  for (std::int64_t heads : {1, 16, 128}) {
    for (std::int64_t n : {1, 3, 129}) {
      for (int layout = 0; layout < 3; ++layout) {
        KvPackCase c;
        c.dtype = layout == 1 ? DType::kF16 : DType::kBF16;
        c.tokens = n;
        c.heads = heads;
        c.fused = layout != 2;
        c.in_pad = layout == 2 ? 3 : 0;
        c.k_pe_3d = layout == 1;
        c.k_pe_pad = layout == 2 ? 5 : 0;
        c.out_pad = layout == 0 ? 0 : layout == 1 ? 16 : 1;
        c.k_scale_inv = layout == 2 ? 1.0f / 1024.0f : 1.0f;
        c.v_scale_inv = layout == 1 ? 300.0f : 1.0f;
        c.data = layout == 1 ? Data::kAdversarial : Data::kRandom;
        c.seed = ++seed;
        expect_pack(c);
      }
    }
  }
}

TEST(MlaKvPack, SplitKErrors) {
  KvPackCase c{.tokens = 5, .heads = 2, .split_k = true};
  std::vector<HostBuffer> b = test::host_buffers(c);
  const std::vector<void*> bases = test::host_bases(b);
  const auto args = [&] {
    MlaKvPackArgs a;
    const std::vector<test::Spec> s = c.specs();
    a.k_nope = c.k_nope_spec().view(bases[0], Device::cpu());
    a.k_pe = s[1].view(bases[1], Device::cpu());
    a.v = c.v_spec().view(bases[0], Device::cpu());
    a.k_out = c.k_out_spec().view(bases[3], Device::cpu());
    a.v_out = s[4].view(bases[4], Device::cpu());
    a.k_rope_out = s[5].view(bases[5], Device::cpu());
    return a;
  };
  MlaKvPackArgs a = args();
  a.k_out = c.specs()[3].view(bases[3], Device::cpu());  // 192 wide with k_rope_out given
  test::expect_error([&] { mla_kv_pack_quantize_fp8(a); }, ErrorCategory::kInvalidArgument,
                     {"`k_out`: expected [tokens, heads, 128]"});
  a = args();
  a.k_rope_out = TensorView(bases[5], DType::kBF16, {5, 64});
  test::expect_error([&] { mla_kv_pack_quantize_fp8(a); }, ErrorCategory::kInvalidArgument,
                     {"`k_rope_out` dtype", "e4m3"});
  a.k_rope_out = TensorView(bases[5], DType::kE4M3, {5, 2, 64});
  test::expect_error([&] { mla_kv_pack_quantize_fp8(a); }, ErrorCategory::kInvalidArgument,
                     {"`k_rope_out`: expected [tokens, 64] or [tokens, 1, 64]"});
  a.k_rope_out = TensorView(bases[5], DType::kE4M3, {4, 64});
  test::expect_error([&] { mla_kv_pack_quantize_fp8(a); }, ErrorCategory::kInvalidArgument,
                     {"`k_rope_out`: expected 5 tokens like `k_nope`"});
}

// V into the transposed layout prefill_attention's FP8 path reads: [H][128][n + pad] bytes.
TEST(MlaKvPack, TransposedV) {
  for (std::int64_t n : {0, 1, 3, 15, 16, 63, 64, 65, 129, 1000}) {
    for (std::int64_t heads : {1, 16}) {
      KvPackCase c = test::pack_sweep_case(n, heads, std::uint64_t(n * 7 + heads));
      c.v_transposed = true;
      c.v_pitch_pad = n % 16 == 0 ? 0 : 16 - n % 16;
      expect_pack(c);
    }
  }
}

// The pitch and view an engine allocates a transposed V with: V quantized into them holds, at
// every logical element, the token-major result's byte.
TEST(MlaKvPack, TransposedVPitchAndView) {
  for (const auto& [n, pitch] : std::initializer_list<std::pair<std::int64_t, std::int64_t>>{
           {0, 16}, {1, 16}, {15, 16}, {16, 16}, {17, 32}, {1000, 1008}}) {
    EXPECT_EQ(transposed_v_pitch(n), pitch) << n;
  }
  const std::int64_t n = 37, heads = 3, pitch = transposed_v_pitch(n);
  std::vector<std::uint16_t> v(std::size_t(n * heads * kMlaVDim));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = encode_bf16(float(int(i % 97) - 48) / 8.0f);
  std::vector<std::uint8_t> token_major(v.size()),
      transposed(std::size_t(heads * kMlaVDim * pitch));
  const TensorView v_in(v.data(), DType::kBF16, {n, heads, kMlaVDim});
  mla_v_quantize_fp8(v_in, TensorView(token_major.data(), DType::kE4M3, {n, heads, kMlaVDim}), 2.0f,
                     VLayout::kTokenMajor);
  const TensorView view = transposed_v_view(transposed.data(), n, heads, pitch, Device::cpu());
  EXPECT_EQ(view.size(0), n);
  EXPECT_EQ(view.stride(0), 1);
  EXPECT_EQ(view.stride(1), kMlaVDim * pitch);
  EXPECT_EQ(view.stride(2), pitch);
  mla_v_quantize_fp8(v_in, view, 2.0f, VLayout::kTransposed);
  for (std::int64_t t = 0; t < n; ++t) {
    for (std::int64_t h = 0; h < heads; ++h) {
      for (std::int64_t d = 0; d < kMlaVDim; ++d) {
        ASSERT_EQ(transposed[std::size_t((h * kMlaVDim + d) * pitch + t)],
                  token_major[std::size_t((t * heads + h) * kMlaVDim + d)])
            << t << " " << h << " " << d;
      }
    }
  }
}

TEST(MlaKvPack, LargeTokenCount) {
  KvPackCase c;
  c.tokens = 4099;
  c.heads = 16;
  c.data = Data::kAdversarial;
  c.seed = 77;
  expect_pack(c);
}

// ---- mla_v_quantize_fp8 -------------------------------------------------------------------

// V alone: equals the per-element reference, leaves k_out (and the transposed pitch's padding and
// the guards) untouched, and its v_out equals byte for byte what mla_kv_pack_quantize_fp8 writes
// from the same v.
void expect_v_only(const KvPackCase& c) {
  SCOPED_TRACE(c.describe());
  ASSERT_TRUE(c.v_only);
  std::vector<HostBuffer> buffers = test::host_buffers(c);
  const auto want = c.expected_outputs(buffers);
  test::run_cpu(c, buffers);
  EXPECT_TRUE(test::same_bytes(buffers[4].payload(), want[1], "v_out"));
  for (std::uint8_t byte : buffers[3].payload()) ASSERT_EQ(byte, kPoison) << "k_out was written";
  for (const HostBuffer& b : buffers) EXPECT_TRUE(b.guards_intact());

  KvPackCase pack = c;
  pack.v_only = false;
  std::vector<HostBuffer> packed = test::host_buffers(pack);
  test::run_cpu(pack, packed);
  EXPECT_TRUE(test::same_bytes(buffers[4].payload(), packed[4].payload(), "v_out vs the pack's"));
}

TEST(MlaVQuantize, BothLayoutsMatchThePackAndTheReference) {
  std::uint64_t seed = 900;
  for (bool transposed : {false, true}) {
    for (std::int64_t n : {0, 1, 7, 64, 65, 300}) {
      for (std::int64_t heads : {1, 16, 128}) {
        for (DType dtype : {DType::kBF16, DType::kF16}) {
          ++seed;
          KvPackCase c;
          c.v_only = true;
          c.dtype = dtype;
          c.tokens = n;
          c.heads = heads;
          c.fused = seed % 3 != 0;  // v a strided slice of [n, H, 256]; or its own padded rows
          c.in_pad = seed % 2 ? 8 : 3;
          c.out_pad = seed % 4 == 0 ? 16 : seed % 4 == 1 ? 5 : 0;
          c.v_transposed = transposed;
          c.v_pitch_pad = seed % 2 ? 3 : 16 - n % 16;  // > 0: padding bytes that must stay
          c.v_scale_inv = seed % 5 == 0 ? 300.0f : seed % 5 == 1 ? 1.0f / 64.0f : 3.0f;
          c.data = seed % 2 ? Data::kAdversarial : Data::kRandom;
          c.seed = seed;
          expect_v_only(c);
        }
      }
    }
  }
}

// ---- Argument checks ----------------------------------------------------------------------

using test::expect_error;
using test::fake;
using test::kFake;

LatentCacheWrite fake_write(std::int64_t tokens, std::int64_t page_size = 16) {
  LatentCacheWrite w;
  w.cache = fake(DType::kE4M3, {4, page_size, kMlaLatentDim});
  w.slot_mapping = fake(DType::kI64, {tokens});
  return w;
}

void write_call(const TensorView& kv_c, const TensorView& k_pe, const LatentCacheWrite& w) {
  mla_kv_cache_write(kv_c, k_pe, w);
}

// mla_kv_cache_write is rejected as an invalid argument whose message holds every one of
// `needles`.
void expect_write_rejected(std::initializer_list<std::string> needles, const TensorView& kv_c,
                           const TensorView& k_pe, const LatentCacheWrite& w) {
  expect_error([&] { write_call(kv_c, k_pe, w); }, ErrorCategory::kInvalidArgument, needles);
}

TEST(MlaKvArgs, WriteKvDtype) {
  expect_write_rejected(
      {"mla_kv_cache_write: `kv_c` dtype", "expected one of {bf16, f16}", "got f32"},
      fake(DType::kF32, {4, 512}), fake(DType::kF32, {4, 64}), fake_write(4));
  expect_write_rejected({"`k_pe` dtype", "expected bf16", "got f16"}, fake(DType::kBF16, {4, 512}),
                        fake(DType::kF16, {4, 64}), fake_write(4));
}

TEST(MlaKvArgs, WritePageSizeRange) {
  for (std::int64_t page_size : {0, 129}) {
    expect_error(
        [&] {
          write_call(fake(DType::kBF16, {4, 512}), fake(DType::kBF16, {4, 64}),
                     fake_write(4, page_size));
        },
        ErrorCategory::kUnsupported,
        {"`cache`", "page size (dim 1) from 1 to 128", concat("got ", page_size)});
  }
}

TEST(MlaKvArgs, WriteLatentWidth) {
  LatentCacheWrite w = fake_write(4);
  w.cache = fake(DType::kE4M3, {4, 16, 512});
  expect_write_rejected({"`cache`", "latent width 576", "e4m3fn[4, 16, 512]"},
                        fake(DType::kBF16, {4, 512}), fake(DType::kBF16, {4, 64}), w);
  w.cache = fake(DType::kBF16, {4, 16, 576});
  expect_write_rejected({"`cache` dtype", "expected e4m3fn", "got bf16"},
                        fake(DType::kBF16, {4, 512}), fake(DType::kBF16, {4, 64}), w);
}

TEST(MlaKvArgs, WriteMismatchedTokens) {
  expect_write_rejected({"`k_pe`", "expected 4 tokens like `kv_c`"}, fake(DType::kBF16, {4, 512}),
                        fake(DType::kBF16, {5, 64}), fake_write(4));
  expect_write_rejected({"`slot_mapping`", "expected [4]", "i64[3]"}, fake(DType::kBF16, {4, 512}),
                        fake(DType::kBF16, {4, 64}), fake_write(3));
}

TEST(MlaKvArgs, WriteKPeShape) {
  expect_write_rejected({"`k_pe`", "expected [tokens, 64] or [tokens, 1, 64]", "bf16[4, 2, 64]"},
                        fake(DType::kBF16, {4, 512}), fake(DType::kBF16, {4, 2, 64}),
                        fake_write(4));
  expect_write_rejected({"`kv_c`", "expected [tokens, 512]"}, fake(DType::kBF16, {4, 256}),
                        fake(DType::kBF16, {4, 64}), fake_write(4));
}

TEST(MlaKvArgs, WriteSlotAndFlagDtypes) {
  LatentCacheWrite w = fake_write(4);
  w.slot_mapping = fake(DType::kF32, {4});
  expect_write_rejected({"`slot_mapping` dtype", "expected one of {i32, i64}", "got f32"},
                        fake(DType::kBF16, {4, 512}), fake(DType::kBF16, {4, 64}), w);
  w = fake_write(4);
  w.error_flag = fake(DType::kI64, {1});
  expect_write_rejected({"`error_flag` dtype", "expected i32", "got i64"},
                        fake(DType::kBF16, {4, 512}), fake(DType::kBF16, {4, 64}), w);
  w.error_flag = fake(DType::kI32, {2});
  expect_write_rejected({"`error_flag`", "expected one i32", "i32[2]"},
                        fake(DType::kBF16, {4, 512}), fake(DType::kBF16, {4, 64}), w);
}

TEST(MlaKvArgs, WriteAlignmentAndStrides) {
  const TensorView odd(reinterpret_cast<void*>(std::uintptr_t{0x10001}), DType::kBF16, {4, 512});
  expect_write_rejected({"`kv_c`", "2-byte aligned", "0x10001"}, odd, fake(DType::kBF16, {4, 64}),
                        fake_write(4));
  const TensorView transposed(kFake, DType::kBF16, {4, 512}, {1, 4});
  expect_write_rejected({"`kv_c`", "contiguous last dim"}, transposed, fake(DType::kBF16, {4, 64}),
                        fake_write(4));
  LatentCacheWrite w = fake_write(4);
  w.slot_mapping = TensorView(kFake, DType::kI64, {4}, {2});
  expect_write_rejected({"`slot_mapping`", "contiguous", "strides [2]"},
                        fake(DType::kBF16, {4, 512}), fake(DType::kBF16, {4, 64}), w);
}

TEST(MlaKvArgs, MixedDevices) {
  // On a CPU-only build the CUDA view fails the device check; with CUDA, it is not on the CPU.
  expect_error(
      [] {
        write_call(fake(DType::kBF16, {4, 512}), fake(DType::kBF16, {4, 64}), [] {
          LatentCacheWrite w = fake_write(4);
          w.cache = fake(DType::kE4M3, {4, 16, 576}, Device::cuda(0));
          return w;
        }());
      },
      ErrorCategory::kInvalidArgument, {"`cache`", "expected a tensor on cpu", "cuda:0"});
  expect_error(
      [] {
        mla_kv_gather(fake(DType::kE4M3, {4, 16, 576}), fake(DType::kI32, {2}), 1.0f,
                      fake(DType::kBF16, {2, 512}), fake(DType::kBF16, {2, 64}, Device::cuda(0)));
      },
      ErrorCategory::kInvalidArgument, {"`k_pe_out`", "expected a tensor on cpu", "cuda:0"});
}

TEST(MlaKvArgs, GatherShapesAndDtypes) {
  expect_error(
      [] {
        mla_kv_gather(fake(DType::kE4M3, {4, 16, 576}), fake(DType::kI32, {2}), 1.0f,
                      fake(DType::kF16, {2, 512}), fake(DType::kBF16, {2, 64}));
      },
      ErrorCategory::kInvalidArgument, {"`kv_c_out` dtype", "expected bf16", "got f16"});
  expect_error(
      [] {
        mla_kv_gather(fake(DType::kE4M3, {4, 16, 576}), fake(DType::kI32, {3}), 1.0f,
                      fake(DType::kBF16, {2, 512}), fake(DType::kBF16, {2, 64}));
      },
      ErrorCategory::kInvalidArgument, {"`slots`", "expected [2]", "i32[3]"});
  expect_error(
      [] {
        mla_kv_gather(fake(DType::kE4M3, {4, 16, 576}), fake(DType::kI32, {2}), 1.0f,
                      fake(DType::kBF16, {2, 512}), fake(DType::kBF16, {3, 64}));
      },
      ErrorCategory::kInvalidArgument, {"`k_pe_out`", "expected 2 tokens like `kv_c_out`"});
  expect_error(
      [] {
        mla_kv_gather(fake(DType::kE4M3, {4, 256, 576}), fake(DType::kI32, {2}), 1.0f,
                      fake(DType::kBF16, {2, 512}), fake(DType::kBF16, {2, 64}));
      },
      ErrorCategory::kUnsupported, {"page size (dim 1) from 1 to 128", "got 256"});
}

MlaKvPackArgs fake_pack(std::int64_t n, std::int64_t h) {
  MlaKvPackArgs a;
  a.k_nope = fake(DType::kBF16, {n, h, 128});
  a.k_pe = fake(DType::kBF16, {n, 64});
  a.v = fake(DType::kBF16, {n, h, 128});
  a.k_out = fake(DType::kE4M3, {n, h, 192});
  a.v_out = fake(DType::kE4M3, {n, h, 128});
  return a;
}

// mla_kv_pack_quantize_fp8 of fake_pack(4, 16) with `field` set to `value` is rejected as an
// invalid argument whose message holds every one of `needles`.
template <typename Field>
void expect_pack_rejected(Field MlaKvPackArgs::*field, Field value,
                          std::initializer_list<std::string> needles) {
  MlaKvPackArgs a = fake_pack(4, 16);
  a.*field = value;
  expect_error([&] { mla_kv_pack_quantize_fp8(a); }, ErrorCategory::kInvalidArgument, needles);
}

TEST(MlaKvArgs, PackShapesDtypesAndCounts) {
  expect_pack_rejected(&MlaKvPackArgs::k_pe, fake(DType::kBF16, {4, 2, 64}),
                       {"mla_kv_pack_quantize_fp8: `k_pe`", "[tokens, 1, 64]", "bf16[4, 2, 64]"});
  expect_pack_rejected(&MlaKvPackArgs::v, fake(DType::kBF16, {4, 8, 128}),
                       {"`v`", "expected 16 heads like `k_nope`"});
  expect_pack_rejected(&MlaKvPackArgs::k_out, fake(DType::kE4M3, {5, 16, 192}),
                       {"`k_out`", "expected 4 tokens like `k_nope`"});
  expect_pack_rejected(&MlaKvPackArgs::k_out, fake(DType::kE4M3, {4, 16, 128}),
                       {"`k_out`", "expected [tokens, heads, 192]"});
  expect_pack_rejected(&MlaKvPackArgs::v_out, fake(DType::kE5M2, {4, 16, 128}),
                       {"`v_out` dtype", "expected e4m3fn", "got e5m2"});
  expect_pack_rejected(&MlaKvPackArgs::v_layout, static_cast<VLayout>(7),
                       {"`v_layout`", "kTokenMajor or kTransposed"});
  // kTransposed with a token-major v_out: its tokens are not contiguous.
  expect_pack_rejected(&MlaKvPackArgs::v_layout, VLayout::kTransposed,
                       {"`v_out` (kTransposed)", "token stride 1"});
}

// mla_v_quantize_fp8(v, v_out) rejects its arguments with a message holding every needle.
void expect_v_rejected(const TensorView& v, const TensorView& v_out, VLayout layout,
                       std::initializer_list<std::string> needles) {
  expect_error([&] { mla_v_quantize_fp8(v, v_out, 1.0f, layout); }, ErrorCategory::kInvalidArgument,
               needles);
}

void expect_v_rejected(const TensorView& v, const TensorView& v_out,
                       std::initializer_list<std::string> needles) {
  expect_v_rejected(v, v_out, VLayout::kTokenMajor, needles);
}

TEST(MlaKvArgs, VQuantizeDtypes) {
  expect_v_rejected(fake(DType::kF32, {4, 16, 128}), fake(DType::kE4M3, {4, 16, 128}),
                    {"mla_v_quantize_fp8: `v` dtype", "expected one of {bf16, f16}", "got f32"});
  expect_v_rejected(fake(DType::kBF16, {4, 16, 128}), fake(DType::kBF16, {4, 16, 128}),
                    {"mla_v_quantize_fp8: `v_out` dtype", "expected e4m3fn", "got bf16"});
  expect_v_rejected(fake(DType::kF16, {4, 16, 128}), fake(DType::kE5M2, {4, 16, 128}),
                    {"`v_out` dtype", "expected e4m3fn", "got e5m2"});
}

TEST(MlaKvArgs, VQuantizeShapesAndCounts) {
  expect_v_rejected(
      fake(DType::kBF16, {4, 16, 64}), fake(DType::kE4M3, {4, 16, 128}),
      {"mla_v_quantize_fp8: `v`", "expected [tokens, heads, 128]", "bf16[4, 16, 64]"});
  expect_v_rejected(fake(DType::kBF16, {4, 16, 128}), fake(DType::kE4M3, {4, 16, 192}),
                    {"`v_out`", "expected [tokens, heads, 128]", "e4m3fn[4, 16, 192]"});
  expect_v_rejected(fake(DType::kBF16, {4, 16, 128}), fake(DType::kE4M3, {5, 16, 128}),
                    {"`v_out`", "expected 4 tokens like `v`", "e4m3fn[5, 16, 128]"});
  expect_v_rejected(fake(DType::kBF16, {4, 16, 128}), fake(DType::kE4M3, {4, 8, 128}),
                    {"`v_out`", "expected 16 heads like `v`"});
  // The same counts checked for a transposed v_out ([H][128][pitch] memory, pitch 16).
  expect_v_rejected(fake(DType::kBF16, {4, 16, 128}),
                    TensorView(kFake, DType::kE4M3, {5, 16, 128}, {1, 128 * 16, 16}),
                    VLayout::kTransposed, {"`v_out`", "expected 4 tokens like `v`"});
  const TensorView strided_dim(kFake, DType::kBF16, {4, 16, 128}, {16 * 256, 256, 2});
  expect_v_rejected(strided_dim, fake(DType::kE4M3, {4, 16, 128}), {"`v`", "contiguous last dim"});
}

TEST(MlaKvArgs, VQuantizeTransposedLayout) {
  // A token-major v_out under kTransposed: token stride 128 x 16, not 1.
  expect_v_rejected(
      fake(DType::kBF16, {4, 16, 128}), fake(DType::kE4M3, {4, 16, 128}), VLayout::kTransposed,
      {"mla_v_quantize_fp8: `v_out` (kTransposed)", "token stride 1", "e4m3fn[4, 16, 128]"});
  // Dims 32 bytes apart hold only 32 of the 64 tokens.
  expect_v_rejected(fake(DType::kBF16, {64, 2, 128}),
                    TensorView(kFake, DType::kE4M3, {64, 2, 128}, {1, 128 * 32, 32}),
                    VLayout::kTransposed, {"`v_out` (kTransposed)", "dim stride >= tokens"});
  // Heads overlapping: head stride < 128 x dim stride.
  expect_v_rejected(
      fake(DType::kBF16, {64, 2, 128}), TensorView(kFake, DType::kE4M3, {64, 2, 128}, {1, 64, 64}),
      VLayout::kTransposed, {"`v_out` (kTransposed)", "head stride >= 128 x dim stride"});
  expect_v_rejected(fake(DType::kBF16, {4, 16, 128}), fake(DType::kE4M3, {4, 16, 128}),
                    static_cast<VLayout>(7), {"`v_layout`", "kTokenMajor or kTransposed", "got 7"});
}

TEST(MlaKvArgs, VQuantizeMixedDevices) {
  expect_v_rejected(fake(DType::kBF16, {4, 16, 128}),
                    fake(DType::kE4M3, {4, 16, 128}, Device::cuda(0)),
                    {"`v_out`", "expected a tensor on cpu", "cuda:0"});
}

TEST(MlaKvArgs, EmptyCallsWriteNothing) {
  HostBuffer cache(16 * 576);
  LatentCacheWrite w;
  w.cache = TensorView(cache.data(), DType::kE4M3, {1, 16, 576});
  w.slot_mapping = fake(DType::kI32, {0});
  mla_kv_cache_write(fake(DType::kBF16, {0, 512}), fake(DType::kBF16, {0, 64}), w);
  mla_kv_gather(w.cache, fake(DType::kI64, {0}), 1.0f, fake(DType::kBF16, {0, 512}),
                fake(DType::kBF16, {0, 1, 64}));
  mla_kv_pack_quantize_fp8(fake_pack(0, 16));
  mla_kv_pack_quantize_fp8(fake_pack(3, 0));
  // A split K of no keys: the empty k_rope_out (no data, as torch's) is given all the same.
  MlaKvPackArgs split = fake_pack(0, 16);
  split.k_out = fake(DType::kE4M3, {0, 16, 128});
  split.k_rope_out = TensorView(nullptr, DType::kE4M3, {0, 64});
  mla_kv_pack_quantize_fp8(split);
  for (VLayout layout : {VLayout::kTokenMajor, VLayout::kTransposed}) {
    const bool t = layout == VLayout::kTransposed;
    mla_v_quantize_fp8(fake(DType::kBF16, {0, 16, 128}),
                       t ? TensorView(kFake, DType::kE4M3, {0, 16, 128}, {1, 128 * 16, 16})
                         : fake(DType::kE4M3, {0, 16, 128}),
                       1.0f, layout);
    mla_v_quantize_fp8(fake(DType::kF16, {3, 0, 128}),
                       t ? TensorView(kFake, DType::kE4M3, {3, 0, 128}, {1, 128 * 16, 16})
                         : fake(DType::kE4M3, {3, 0, 128}),
                       1.0f, layout);
  }
  for (std::uint8_t byte : cache.payload()) ASSERT_EQ(byte, kPoison);
}

}  // namespace
}  // namespace fp8mla
