// A chunked-prefill chain launched back to back on one stream, 1000 times with PDL on and 1000
// times with it off, gives the same final bytes every time:
//   mla_rope_quantize_fp8 (q, k of the new tokens), mla_v_quantize_fp8 (their V, transposed),
//   mla_kv_pack_quantize_fp8 (the prefix chunk's K and V), prefill_attention against the prefix
//   (full) and against the new tokens (causal), both with LSE, merge_attention_states, and
//   quantize_fp8_per_token_group of the merged output (the o_proj input); or, folded, the
//   attention against the new tokens (causal, with LSE) and then against the prefix folding that
//   state in and writing the o_proj input and its scales itself (no merge, no quantize kernel).
// The chain alternates between two input sets on the same intermediate buffers, so a kernel that
// reads an intermediate before its producer finished (a missing or misplaced PDL wait), or writes
// one its predecessor still reads, sees the other set's values and changes the result. The final
// outputs are fingerprinted on the device after every chain (the fingerprint kernel waits for its
// predecessor too, so it is itself launched with PDL and keeps the chains back to back).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda_test_util.hpp"
#include "device_case_util.cuh"
#include "fp8mla/attention.hpp"
#include "fp8mla/mla_prep.hpp"
#include "fp8mla/quantize.hpp"

namespace fp8mla::test {
namespace {

const std::size_t kRuns = rerun_count();
constexpr std::int64_t kHeads = 16, kMaxPos = 4096;
// Two sequences: new tokens (queries) and prefix-chunk keys per sequence.
constexpr std::int32_t kCuQ[] = {0, 100, 256}, kCuPrefix[] = {0, 200, 384};
constexpr std::int64_t kT = 256, kP = 384;

// Uniform bf16 values in [-range, range].
DeviceBuffer uniform_bf16(std::int64_t n, float range, std::uint64_t seed) {
  std::vector<std::uint16_t> host(static_cast<std::size_t>(n));
  Rng rng(seed);
  for (std::uint16_t& x : host) x = encode_bf16((rng.uniform() * 2.0f - 1.0f) * range);
  return to_device(host);
}

// One input set of the chain.
struct ChainInputs {
  DeviceBuffer q_nope, q_pe, k_nope, k_pe, v, positions, prefix_kv, prefix_k_pe;
  explicit ChainInputs(std::uint64_t seed)
      : q_nope(uniform_bf16(kT * kHeads * 128, 2.0f, seed)),
        q_pe(uniform_bf16(kT * kHeads * 64, 2.0f, seed + 1)),
        k_nope(uniform_bf16(kT * kHeads * 128, 2.0f, seed + 2)),
        k_pe(uniform_bf16(kT * 64, 2.0f, seed + 3)),
        v(uniform_bf16(kT * kHeads * 128, 2.0f, seed + 4)),
        positions(std::size_t(kT) * 8),
        prefix_kv(uniform_bf16(kP * kHeads * 256, 2.0f, seed + 5)),
        prefix_k_pe(uniform_bf16(kP * 64, 2.0f, seed + 6)) {
    std::vector<std::int64_t> pos(kT);
    for (int b = 0; b < 2; ++b) {
      for (std::int32_t t = kCuQ[b]; t < kCuQ[b + 1]; ++t) {
        pos[std::size_t(t)] =
            kCuPrefix[b + 1] - kCuPrefix[b] + (t - kCuQ[b]) + std::int64_t(seed % 7);
      }
    }
    positions.upload(pos.data());
  }
};

// The intermediates and final outputs, shared by both input sets.
struct ChainWork {
  static constexpr std::int64_t kPitchT = 256, kPitchP = 384;  // transposed V: multiples of 16
  DeviceBuffer cos_sin{std::size_t(kMaxPos * 64 * 4)};
  DeviceBuffer q8{std::size_t(kT * kHeads * 192)}, k8{std::size_t(kT * kHeads * 192)};
  DeviceBuffer v8{std::size_t(kHeads * 128 * kPitchT)};
  DeviceBuffer kp8{std::size_t(kP * kHeads * 192)}, vp8{std::size_t(kHeads * 128 * kPitchP)};
  DeviceBuffer o_a{std::size_t(kT * kHeads * 128 * 2)}, o_b{std::size_t(kT * kHeads * 128 * 2)};
  DeviceBuffer o{std::size_t(kT * kHeads * 128 * 2)};
  DeviceBuffer lse_a{std::size_t(kT * kHeads * 4)}, lse_b{std::size_t(kT * kHeads * 4)};
  DeviceBuffer lse{std::size_t(kT * kHeads * 4)};
  DeviceBuffer out8{std::size_t(kT * kHeads * 128)}, scales{std::size_t(kT * kHeads * 4)};
  DeviceBuffer cu_q = to_device(std::vector<std::int32_t>(std::begin(kCuQ), std::end(kCuQ)));
  DeviceBuffer cu_p =
      to_device(std::vector<std::int32_t>(std::begin(kCuPrefix), std::end(kCuPrefix)));
  DeviceBuffer descales = to_device(std::vector<float>{0.25f, 0.25f, 0.25f});

  ChainWork() {
    RopeConfig config;
    config.yarn = YarnScaling{};
    make_cos_sin_cache(TensorView(cos_sin.data(), DType::kF32, {kMaxPos, 64}, Device::cuda(0)),
                       config);
  }
  TensorView descale(int i) const {
    return TensorView(descales.as<float>() + i, DType::kF32, {1}, Device::cuda(0));
  }
};

TensorView cuda_view(const DeviceBuffer& b, DType dtype, std::initializer_list<std::int64_t> shape,
                     std::initializer_list<std::int64_t> strides) {
  return TensorView(b.data(), dtype, shape, strides, Device::cuda(0));
}
TensorView cuda_view(const DeviceBuffer& b, DType dtype,
                     std::initializer_list<std::int64_t> shape) {
  return TensorView(b.data(), dtype, shape, Device::cuda(0));
}

TensorView transposed_v(const DeviceBuffer& b, std::int64_t tokens, std::int64_t pitch) {
  return cuda_view(b, DType::kE4M3, {tokens, kHeads, 128}, {1, 128 * pitch, pitch});
}

PrefillAttentionArgs attention_args(const ChainWork& w, const DeviceBuffer& k,
                                    const DeviceBuffer& v, std::int64_t keys, std::int64_t pitch,
                                    bool prefix) {
  PrefillAttentionArgs a;
  a.q = cuda_view(w.q8, DType::kE4M3, {kT, kHeads, 192});
  a.k = cuda_view(k, DType::kE4M3, {keys, kHeads, 192});
  a.v = transposed_v(v, keys, pitch);
  a.cu_seqlens_q = cuda_view(w.cu_q, DType::kI32, {3});
  a.cu_seqlens_k = cuda_view(prefix ? w.cu_p : w.cu_q, DType::kI32, {3});
  a.max_seqlen_q = 156;
  a.max_seqlen_k = prefix ? 200 : 156;
  a.softmax_scale = 0.0722f;
  a.causal = !prefix;
  a.q_descale = w.descale(0);
  a.k_descale = w.descale(1);
  a.v_descale = w.descale(2);
  a.out = cuda_view(prefix ? w.o_a : w.o_b, DType::kBF16, {kT, kHeads, 128});
  a.lse = cuda_view(prefix ? w.lse_a : w.lse_b, DType::kF32, {kT, kHeads});
  return a;
}

void enqueue_chain(const ChainInputs& in, const ChainWork& w, bool fold, cudaStream_t stream) {
  const DType bf16 = DType::kBF16;
  MlaRopeQuantizeArgs rope;
  rope.q_nope = cuda_view(in.q_nope, bf16, {kT, kHeads, 128});
  rope.q_pe = cuda_view(in.q_pe, bf16, {kT, kHeads, 64});
  rope.k_nope = cuda_view(in.k_nope, bf16, {kT, kHeads, 128});
  rope.k_pe = cuda_view(in.k_pe, bf16, {kT, 64});
  rope.positions = cuda_view(in.positions, DType::kI64, {kT});
  rope.cos_sin = cuda_view(w.cos_sin, DType::kF32, {kMaxPos, 64});
  rope.q_scale_inv = 4.0f;
  rope.k_scale_inv = 4.0f;
  rope.q_out = cuda_view(w.q8, DType::kE4M3, {kT, kHeads, 192});
  rope.k_out = cuda_view(w.k8, DType::kE4M3, {kT, kHeads, 192});
  mla_rope_quantize_fp8(rope, stream);
  mla_v_quantize_fp8(cuda_view(in.v, bf16, {kT, kHeads, 128}), transposed_v(w.v8, kT, w.kPitchT),
                     4.0f, VLayout::kTransposed, stream);
  MlaKvPackArgs pack;
  pack.k_nope = cuda_view(in.prefix_kv, bf16, {kP, kHeads, 128}, {kHeads * 256, 256, 1});
  pack.k_pe = cuda_view(in.prefix_k_pe, bf16, {kP, 64});
  pack.v = TensorView(in.prefix_kv.as<std::uint16_t>() + 128, bf16, {kP, kHeads, 128},
                      {kHeads * 256, 256, 1}, Device::cuda(0));
  pack.k_scale_inv = 4.0f;
  pack.v_scale_inv = 4.0f;
  pack.k_out = cuda_view(w.kp8, DType::kE4M3, {kP, kHeads, 192});
  pack.v_out = transposed_v(w.vp8, kP, w.kPitchP);
  pack.v_layout = VLayout::kTransposed;
  mla_kv_pack_quantize_fp8(pack, stream);
  const auto o = [](const DeviceBuffer& b) {
    return cuda_view(b, DType::kBF16, {kT, kHeads, 128});
  };
  const auto l = [](const DeviceBuffer& b) { return cuda_view(b, DType::kF32, {kT, kHeads}); };
  if (fold) {
    prefill_attention(attention_args(w, w.k8, w.v8, kT, w.kPitchT, false), stream);
    PrefillAttentionArgs prefix = attention_args(w, w.kp8, w.vp8, kP, w.kPitchP, true);
    prefix.prior_out = o(w.o_b);
    prefix.prior_lse = l(w.lse_b);
    prefix.out = cuda_view(w.out8, DType::kE4M3, {kT, kHeads * 128});
    prefix.output_block_scale = cuda_view(w.scales, DType::kF32, {kT, kHeads});
    prefix.lse = l(w.lse);
    prefill_attention(prefix, stream);
    return;
  }
  prefill_attention(attention_args(w, w.kp8, w.vp8, kP, w.kPitchP, true), stream);
  prefill_attention(attention_args(w, w.k8, w.v8, kT, w.kPitchT, false), stream);
  merge_attention_states(o(w.o_a), l(w.lse_a), o(w.o_b), l(w.lse_b), o(w.o), l(w.lse), stream);
  quantize_fp8_per_token_group(cuda_view(w.o, bf16, {kT, kHeads * 128}),
                               cuda_view(w.out8, DType::kE4M3, {kT, kHeads * 128}),
                               cuda_view(w.scales, DType::kF32, {kT, kHeads}), {128}, stream);
}

struct ChainResult {
  std::vector<std::uint64_t> fingerprints;                     // kRuns rows of (out8, scales, lse)
  std::vector<std::vector<std::uint8_t>> last_even, last_odd;  // final bytes of each input set
};

ChainResult run_chains(bool pdl, bool fold) {
  const PdlScope scope(pdl);
  const ChainInputs sets[2] = {ChainInputs(100), ChainInputs(200)};
  const ChainWork w;
  const TestStream stream;
  const Fingerprints f(kRuns, 3);
  ChainResult result;
  const auto finals = [&] {
    return std::vector<std::vector<std::uint8_t>>{w.out8.download(), w.scales.download(),
                                                  w.lse.download()};
  };
  for (std::size_t r = 0; r < kRuns; ++r) {
    enqueue_chain(sets[r % 2], w, fold, stream.get());
    enqueue_fingerprint(w.out8.data(), w.out8.bytes(), f.slot(r, 0), stream.get());
    enqueue_fingerprint(w.scales.data(), w.scales.bytes(), f.slot(r, 1), stream.get());
    enqueue_fingerprint(w.lse.data(), w.lse.bytes(), f.slot(r, 2), stream.get());
    if (r == kRuns - 2 || r == kRuns - 1) {
      stream.sync();
      (r % 2 == 0 ? result.last_even : result.last_odd) = finals();
    }
  }
  stream.sync();
  result.fingerprints = f.download();
  for (const DeviceBuffer* b : {&w.q8, &w.k8, &w.v8, &w.kp8, &w.vp8, &w.o, &w.out8, &w.scales}) {
    EXPECT_TRUE(b->guards_intact());
  }
  return result;
}

void expect_same_bytes_with_pdl_on_and_off(bool fold) {
  const ChainResult off = run_chains(false, fold), on = run_chains(true, fold);
  const std::vector<std::uint64_t>& ref = off.fingerprints;
  // The two input sets must give different outputs, or stale reads could not show.
  for (int k = 0; k < 3; ++k) EXPECT_NE(ref[std::size_t(k)], ref[std::size_t(3 + k)]) << k;
  std::size_t mismatches = 0;
  for (const ChainResult* res : {&off, &on}) {
    for (std::size_t r = 0; r < kRuns; ++r) {
      for (std::size_t k = 0; k < 3; ++k) {
        if (res->fingerprints[r * 3 + k] == ref[(r % 2) * 3 + k]) continue;
        if (++mismatches <= 8) {
          ADD_FAILURE() << (res == &on ? "PDL on" : "PDL off") << ", chain " << r << ": output "
                        << k << " (0 out, 1 scales, 2 lse) differs from chain " << r % 2
                        << " with PDL off";
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0u);
  for (std::size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(on.fingerprints[k], ref[k]) << "first chain, output " << k;
    EXPECT_TRUE(same_bytes(on.last_even[k], off.last_even[k], concat("set 0, output ", k)));
    EXPECT_TRUE(same_bytes(on.last_odd[k], off.last_odd[k], concat("set 1, output ", k)));
  }
}

TEST(PdlChainCuda, PrepAttentionMergeQuantizeSameBytesWithPdlOnAndOff) {
  FP8MLA_REQUIRE_HOPPER();
  expect_same_bytes_with_pdl_on_and_off(false);
}

TEST(PdlChainCuda, PrepAttentionFoldedIntoTheQuantizedOutputSameBytesWithPdlOnAndOff) {
  FP8MLA_REQUIRE_HOPPER();
  expect_same_bytes_with_pdl_on_and_off(true);
}

}  // namespace
}  // namespace fp8mla::test
