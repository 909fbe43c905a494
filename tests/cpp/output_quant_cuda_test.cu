// Fused output quantization on the GPU (docs/design.md section 6): the prefill kernel's epilogue
// and the CUDA merge of attention states with a quantized `out` give, bit for bit, the same CUDA
// op with a bf16 `out` followed by the standalone quantization op, for every key, scale dtype and
// scale layout. Neither CUDA op is bit-identical to its CPU twin (attention follows an error rule,
// the merge differs through expf/logf), so the reference is the CUDA op's own unfused output,
// quantized by the CPU standalone op (which the CUDA one equals: quantize_cuda_test.cu).
// Attention: e4m3 and bf16, causal and not, with and without the LSE; ragged batches with empty
// sequences, rows that see no key, sequences shorter than a 128-row tile and longer than one, and
// a padded token count (CUDA graphs: `out` and the scales sized past the real tokens, the padded
// rows left as they were). Merge: D not a multiple of 8 (the value-by-value variant), groups that
// span heads, misaligned states, out_lse in place of lse_a. Outputs and scales are poisoned twice
// with different bytes; whole buffers are compared, guard bands included.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "cuda/common/runtime.hpp"
#include "cuda_test_util.hpp"
#include "fp8mla/attention.hpp"
#include "merge_states_test_util.hpp"
#include "ops/quantize_params.hpp"
#include "output_quant_test_util.hpp"

namespace fp8mla {
namespace {

using test::DeviceBuffer;
using test::HostBuffer;
using test::QuantBuffers;
using test::QuantCase;

void sync() {
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

DeviceBuffer upload(const HostBuffer& host) {
  DeviceBuffer device(host.bytes());
  device.upload(host.data());
  return device;
}

// fused(out, output_scale, output_block_scale) on device views against the standalone op over
// `bf16`, the unfused output's first real rows [real, W] (of `rows` the output holds).
void expect_fused_matches(
    const QuantCase& c, const TensorView& bf16, std::int64_t rows,
    const std::function<void(const TensorView&, const TensorView&, const TensorView&)>& fused) {
  SCOPED_TRACE(c.name);
  const std::int64_t width = bf16.size(1);
  for (std::uint8_t poison : {std::uint8_t(0xFF), std::uint8_t(0x00)}) {
    QuantBuffers host(c, poison), want(c, poison);
    DeviceBuffer out = upload(host.out), scale = upload(host.scale), global = upload(host.global);
    const auto [output_scale, block] =
        test::op_scales(c, scale.data(), global.data(), Device::cuda(0));
    try {
      fused(c.out.view(out.data(), Device::cuda(0)), output_scale, block);
    } catch (const Error& e) {
      FAIL() << e.what();
    }
    sync();
    test::run_standalone(c, bf16, want);
    test::pad_swizzled(c, want, bf16.size(0), rows, width, poison);
    EXPECT_TRUE(test::same_bytes(out.download(), want.out.payload(), "out"));
    EXPECT_TRUE(test::same_bytes(scale.download(), want.scale.payload(), "scales"));
    EXPECT_TRUE(test::same_bytes(global.download(), want.global.payload(), "output_scale"));
    EXPECT_TRUE(out.guards_intact() && scale.guards_intact() && global.guards_intact());
  }
}

// ---- prefill_attention
// ---------------------------------------------------------------------------

constexpr std::int64_t kDqk = 192, kDv = 128;

// A ragged batch on the device: q [tq, H, 192] (tq may exceed the real tokens, as for a CUDA
// graph), k [tk, H, 192], v [tk, H, 128] token-major, e4m3 with descales or bf16.
struct Batch {
  std::vector<std::int32_t> cu_q{0}, cu_k{0};
  std::int64_t tq = 0, tk = 0, heads = 4;
  bool fp8 = true, causal = true;
  std::vector<DeviceBuffer> buffers;  // q, k, v, cu_q, cu_k, descales
  int max_q = 0, max_k = 0;

  Batch(const std::vector<int>& q_lens, const std::vector<int>& k_lens, std::int64_t padding,
        bool e4m3, bool is_causal)
      : fp8(e4m3), causal(is_causal) {
    for (std::size_t b = 0; b < q_lens.size(); ++b) {
      cu_q.push_back(cu_q.back() + q_lens[b]);
      cu_k.push_back(cu_k.back() + k_lens[b]);
      max_q = std::max(max_q, q_lens[b]);
      max_k = std::max(max_k, k_lens[b]);
    }
    tq = cu_q.back() + padding;
    tk = cu_k.back();
    // A bound no offsets could violate: the padded rows count as queries for it.
    const std::int64_t batch = std::int64_t(q_lens.size());
    max_q = std::max<int>(max_q, int((tq + batch - 1) / batch));
    test::Rng rng(17);
    const DType dtype = fp8 ? DType::kE4M3 : DType::kBF16;
    const auto make = [&](std::int64_t n, float range) {
      HostBuffer host(std::size_t(std::max<std::int64_t>(n, 1)) * dtype_size(dtype));
      for (std::int64_t i = 0; i < n; ++i) {
        const float x = (rng.uniform() * 2.0f - 1.0f) * range;
        if (fp8) {
          host.data()[i] = encode_e4m3(x);
        } else {
          test::store_f32(host.data(), dtype, i, x);
        }
      }
      buffers.push_back(upload(host));
    };
    make(tq * heads * kDqk, fp8 ? 2.0f : 1.0f);
    make(tk * heads * kDqk, fp8 ? 4.0f : 1.0f);
    make(tk * heads * kDv, fp8 ? 2.0f : 4.0f);
    buffers.push_back(test::to_device(cu_q));
    buffers.push_back(test::to_device(cu_k));
    buffers.push_back(test::to_device(std::vector<float>{0.5f, 0.25f, 2.0f}));
  }
  std::int64_t real() const { return cu_q.back(); }
  PrefillAttentionArgs args(const TensorView& out, const TensorView& lse) const {
    const Device gpu = Device::cuda(0);
    const DType dtype = fp8 ? DType::kE4M3 : DType::kBF16;
    PrefillAttentionArgs a;
    a.q = TensorView(buffers[0].data(), dtype, {tq, heads, kDqk}, gpu);
    a.k = TensorView(buffers[1].data(), dtype, {tk, heads, kDqk}, gpu);
    a.v = TensorView(buffers[2].data(), dtype, {tk, heads, kDv}, gpu);
    a.cu_seqlens_q = TensorView(buffers[3].data(), DType::kI32, {std::int64_t(cu_q.size())}, gpu);
    a.cu_seqlens_k = TensorView(buffers[4].data(), DType::kI32, {std::int64_t(cu_k.size())}, gpu);
    a.max_seqlen_q = max_q;
    a.max_seqlen_k = max_k;
    a.softmax_scale = 0.0722f;
    a.causal = causal;
    if (fp8) {
      for (int i = 0; i < 3; ++i) {
        TensorView d(buffers[5].as<float>() + i, DType::kF32, {1}, gpu);
        (i == 0 ? a.q_descale : i == 1 ? a.k_descale : a.v_descale) = d;
      }
    }
    a.out = out;
    a.lse = lse;
    return a;
  }
};

// The fused epilogue against the unfused one, for every key and layout, with and without the LSE.
void expect_attention_fuses(const Batch& batch) {
  const Device gpu = Device::cuda(0);
  const std::int64_t width = batch.heads * kDv;
  for (bool with_lse : {true, false}) {
    SCOPED_TRACE(with_lse ? "with lse" : "without lse");
    DeviceBuffer bf16(std::size_t(batch.tq * width * 2)),
        lse(std::size_t(batch.tq * batch.heads) * 4);
    const TensorView lse_view =
        with_lse ? TensorView(lse.data(), DType::kF32, {batch.tq, batch.heads}, gpu) : TensorView();
    prefill_attention(batch.args(
        TensorView(bf16.data(), DType::kBF16, {batch.tq, batch.heads, kDv}, gpu), lse_view));
    sync();
    const std::vector<std::uint8_t> rows = bf16.download(0, std::size_t(batch.real() * width * 2));
    const std::vector<std::uint8_t> want_lse = lse.download();
    const TensorView real_rows(const_cast<std::uint8_t*>(rows.data()), DType::kBF16,
                               {batch.real(), width});
    for (const QuantCase& c : test::walked(test::quant_cases(batch.tq, batch.heads, kDv))) {
      DeviceBuffer fused_lse(lse.bytes());
      expect_fused_matches(
          c, real_rows, batch.tq,
          [&](const TensorView& out, const TensorView& scale, const TensorView& block) {
            PrefillAttentionArgs a = batch.args(
                out, with_lse
                         ? TensorView(fused_lse.data(), DType::kF32, {batch.tq, batch.heads}, gpu)
                         : TensorView());
            a.output_scale = scale;
            a.output_block_scale = block;
            prefill_attention(a);
          });
      EXPECT_TRUE(test::same_bytes(fused_lse.download(), want_lse, "lse"));
    }
  }
}

struct BatchShape {
  const char* name;
  std::vector<int> q_lens, k_lens;
  std::int64_t padding;  // tokens past the real ones (a CUDA graph's padded batch)
};

// Empty sequences, rows that see no key (causal: fewer keys than queries; none at all), tiles of
// fewer than 128 rows, sequences over several tiles, and padded token counts (one whose padded
// rows reach a 128-row tile past the real ones: the swizzled NVFP4 padding zeros are all there).
const BatchShape kBatchShapes[] = {
    {"ragged with empty sequences", {5, 0, 4, 3, 6}, {12, 0, 2, 0, 6}, 0},
    {"several tiles", {200, 77, 1}, {300, 77, 129}, 0},
    {"padded token count", {130, 3}, {140, 3}, 167},
    {"padded within the tile of the last real row", {20}, {20}, 5},
};

TEST(OutputQuantCuda, PrefillAttentionEqualsUnfusedThenStandalone) {
  FP8MLA_REQUIRE_HOPPER();
  for (const BatchShape& shape : kBatchShapes) {
    for (bool fp8 : {true, false}) {
      for (bool causal : {true, false}) {
        SCOPED_TRACE(concat(shape.name, fp8 ? ", e4m3" : ", bf16", causal ? ", causal" : ""));
        expect_attention_fuses(Batch(shape.q_lens, shape.k_lens, shape.padding, fp8, causal));
      }
    }
  }
}

TEST(OutputQuantCuda, PrefillAttentionIsDeterministic) {
  FP8MLA_REQUIRE_HOPPER();
  const Batch batch({200, 77}, {300, 77}, 0, true, true);
  for (const QuantCase& c : test::walked(test::quant_cases(batch.tq, batch.heads, kDv))) {
    if (c.name.find("out ") != std::string::npos) continue;  // one out layout each
    SCOPED_TRACE(c.name);
    QuantBuffers host(c, test::kPoison);
    std::vector<std::uint8_t> first_out, first_scale;
    for (int run = 0; run < 10; ++run) {
      DeviceBuffer out = upload(host.out), scale = upload(host.scale), global = upload(host.global);
      const auto [s, b] = test::op_scales(c, scale.data(), global.data(), Device::cuda(0));
      PrefillAttentionArgs a = batch.args(c.out.view(out.data(), Device::cuda(0)), {});
      a.output_scale = s;
      a.output_block_scale = b;
      prefill_attention(a);
      sync();
      if (run == 0) {
        first_out = out.download();
        first_scale = scale.download();
      } else {
        ASSERT_TRUE(test::same_bytes(out.download(), first_out, "out"));
        ASSERT_TRUE(test::same_bytes(scale.download(), first_scale, "scales"));
      }
    }
  }
}

// ---- merge_attention_states
// ----------------------------------------------------------------------

// The CUDA merge of `c` (general form) into a quantized out, against its bf16 or f32 out rounded
// to bf16 and quantized; out_lse written as without a key (into its own buffer, or in place of
// lse_a with `lse_in_place`).
void expect_merge_fuses(const test::MergeCase& c, bool lse_in_place) {
  SCOPED_TRACE(concat(c.describe(), lse_in_place ? ", out_lse = lse_a" : ""));
  const Device gpu = Device::cuda(0);
  const std::vector<test::Spec> s = c.specs();
  const std::vector<HostBuffer> inputs = test::host_buffers(c);
  std::vector<DeviceBuffer> unfused = test::upload(inputs);
  c.run(test::device_bases(unfused), gpu);
  sync();
  // The unfused out, as bf16 rows [T, H * D].
  std::vector<std::uint8_t> merged = unfused[4].download();
  const TensorView merged_view = s[4].view(merged.data());
  std::vector<std::uint16_t> bf16(std::size_t(c.tokens * c.heads * c.dim));
  for (std::int64_t t = 0; t < c.tokens; ++t) {
    for (std::int64_t h = 0; h < c.heads; ++h) {
      for (std::int64_t d = 0; d < c.dim; ++d) {
        bf16[std::size_t((t * c.heads + h) * c.dim + d)] =
            encode_bf16(test::elem(merged_view, t, h, d));
      }
    }
  }
  const TensorView rows(bf16.data(), DType::kBF16, {c.tokens, c.heads * c.dim});
  const std::vector<std::uint8_t> want_lse = unfused[5].download();
  for (const QuantCase& q : test::walked(test::quant_cases(c.tokens, c.heads, c.dim))) {
    std::vector<DeviceBuffer> states;
    expect_fused_matches(
        q, rows, c.tokens,
        [&](const TensorView& out, const TensorView& scale, const TensorView& block) {
          // Fresh states for each call: with out_lse in place the last call changed lse_a.
          states = test::upload(inputs);
          const auto v = [&](int i) {
            return s[std::size_t(i)].view(states[std::size_t(i)].data(), gpu);
          };
          merge_attention_states(v(0), v(1), v(2), v(3), out, lse_in_place ? v(1) : v(5), scale,
                                 block);
        });
    // out_lse element by element (its buffer differs in place).
    std::vector<std::uint8_t> got_lse = states[lse_in_place ? 1 : 5].download();
    const TensorView got = s[lse_in_place ? 1 : 5].view(got_lse.data());
    const TensorView want = s[5].view(const_cast<std::uint8_t*>(want_lse.data()));
    for (std::int64_t t = 0; t < c.tokens; ++t) {
      for (std::int64_t h = 0; h < c.heads; ++h) {
        const float a = test::elem(got, t, h), b = test::elem(want, t, h);
        ASSERT_EQ(std::memcmp(&a, &b, 4), 0) << "out_lse (" << t << ", " << h << ")";
      }
    }
  }
}

TEST(OutputQuantCuda, MergeAttentionStatesEqualsUnfusedThenStandalone) {
  FP8MLA_REQUIRE_HOPPER();
  struct Shape {
    std::int64_t tokens, heads, dim;
  };
  // MLA's rows; groups of 64 over heads of 64; W / 16 blocks not a multiple of 4 (swizzled
  // column padding); D below 8 (groups span 32 heads, value by value); D = 20 (static only:
  // W not a multiple of 16); more than one 128-row tile.
  const Shape shapes[] = {{18, 4, 128}, {33, 3, 64}, {7, 5, 48},
                          {9, 32, 4},   {5, 3, 20},  {130, 16, 128}};
  std::uint64_t seed = 1;
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (const Shape& shape : shapes) {
      for (bool misalign : {false, true}) {
        test::MergeCase c;
        c.dtype = dtype;
        c.tokens = shape.tokens;
        c.heads = shape.heads;
        c.dim = shape.dim;
        c.misalign = misalign;
        c.empty_a_percent = misalign ? 50 : 20;
        c.empty_b_percent = misalign ? 50 : 20;
        c.seed = seed++;
        expect_merge_fuses(c, misalign);
      }
    }
  }
}

}  // namespace
}  // namespace fp8mla
