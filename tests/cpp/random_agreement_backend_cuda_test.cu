// Random-shape agreement of the backends' prepare_prefill_qkv hook (attention_backend.hpp):
// seeded cases (random_agreement_util.hpp) of RoPE + e4m3 Q/K with the latent cache write
// (mla_rope_test_util.hpp's RopeCase, drawn as random_agreement_prep_cuda_test.cu draws it) and a
// padded bf16/f16 V, run through the "cpu" backend on the CPU (V token-major) and the
// "fp8-hopper" backend on the GPU (V transposed, the layout it declares). Bit-exactness: q_out,
// k_out, the cache and every other buffer byte for byte, the GPU's transposed V element for
// element the CPU's token-major V (its pitch padding still poison), and neither backend writes
// the other's V buffer.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "fp8mla/attention_backend.hpp"
#include "mla_rope_test_util.hpp"
#include "random_agreement_util.hpp"

namespace fp8mla::test {
namespace {

RopeCase draw_rope_for_hook(Draw& d);

// Buffers: RopeCase's, then V, v_out token-major, v_out transposed.
struct HookCase {
  RopeCase qk;
  std::int64_t v_head_pad = 0, v_token_pad = 0;  // V rows 128 + pad apart, tokens padded
  std::int64_t v_pitch_pad = 0;                  // the transposed v_out's token pitch past T
  float v_scale_inv = 1.0f;

  static constexpr int kV = kNumRopeBuffers, kVTokenMajor = kV + 1, kVTransposed = kV + 2;

  Spec v_spec() const {
    const std::int64_t hs = kMlaVDim + v_head_pad, ts = qk.heads * hs + v_token_pad;
    return {qk.in_dtype, {qk.tokens, qk.heads, kMlaVDim}, {ts, hs, 1}, 0, qk.tokens * ts};
  }
  Spec token_major_spec() const { return dense(DType::kE4M3, {qk.tokens, qk.heads, kMlaVDim}); }
  Spec transposed_spec() const {
    const std::int64_t pitch = qk.tokens + v_pitch_pad;
    return {DType::kE4M3,
            {qk.tokens, qk.heads, kMlaVDim},
            {1, kMlaVDim * pitch, pitch},
            0,
            qk.heads * kMlaVDim * pitch};
  }
  std::vector<HostBuffer> buffers(std::uint8_t poison) const {
    std::vector<HostBuffer> b = qk.buffers(poison);
    for (const Spec& s : {v_spec(), token_major_spec(), transposed_spec()}) {
      b.emplace_back(s.bytes(), poison);
    }
    return b;
  }
  void init(std::vector<HostBuffer>& b) const {
    qk.init(b);
    fill_input(b[kV].data(), qk.in_dtype, v_spec().buffer_elems, qk.data, qk.seed * 16 + 15);
  }
  // The hook of `backend` (v_out as its layout asks) on views over `bases`.
  void run(const char* backend, std::span<void* const> bases, Device device,
           CudaStream stream) const {
    PrepareQkvArgs a;
    a.qk = qk.args(bases, device);
    a.v = v_spec().view(bases[kV], device);
    a.v_scale_inv = v_scale_inv;
    const std::unique_ptr<AttentionBackend> b = make_attention_backend(backend);
    const bool transposed = b->capabilities().v_layout == VLayout::kTransposed;
    a.v_out = transposed ? transposed_spec().view(bases[kVTransposed], device)
                         : token_major_spec().view(bases[kVTokenMajor], device);
    b->prepare_prefill_qkv(a, stream);
  }
  std::string describe() const {
    return concat("prepare_prefill_qkv (cpu on the CPU, fp8-hopper on the GPU): ", qk.describe(),
                  "; V pads ", v_head_pad, "/", v_token_pad, ", v_out pitch pad ", v_pitch_pad,
                  ", v_scale_inv ", v_scale_inv);
  }
};

HookCase draw_hook(Draw& d) {
  HookCase c;
  c.qk = draw_rope_for_hook(d);
  c.v_head_pad = d.pad(16);
  c.v_token_pad = d.pad(16);
  c.v_pitch_pad = d.pad(40);
  if (c.qk.tokens == 0) c.v_pitch_pad = std::max<std::int64_t>(c.v_pitch_pad, 1);
  c.v_scale_inv = d.scale(1.0f / 64.0f, 64.0f);
  return c;
}

RopeCase draw_rope_for_hook(Draw& d) {
  RopeCase c;
  c.in_dtype = d.pick({DType::kBF16, DType::kF16});
  c.heads = d.pick<std::int64_t>({1, 2, 3, 16, 16, 33, 128});
  c.tokens = d.tokens(std::max<std::int64_t>(3000 / c.heads, 1));
  c.style = d.pick({RopeStyle::kInterleaved, RopeStyle::kNeox});
  c.position_dtype = d.pick({DType::kI32, DType::kI64});
  c.strided = d.chance(0.5);
  c.k_pe_3d = d.chance(0.5);
  c.misaligned = d.chance(0.25);
  c.out_head_pad = d.pick<std::int64_t>({0, 0, 1, 16});
  c.max_pos = d.range(1, 8192);
  c.cos_sin_pad = d.pad(8);
  c.yarn = d.chance(0.5);
  c.q_scale_inv = d.scale(1.0f / 64.0f, 64.0f);
  c.k_scale_inv = d.scale(1.0f / 64.0f, 64.0f);
  c.page_size = d.chance(0.5) ? d.pick<std::int64_t>({1, 16, 64, 128}) : d.range(1, 128);
  c.cache_row_pad = d.pick<std::int64_t>({0, 0, 1, 64});
  c.slot_dtype = d.pick({DType::kI32, DType::kI64});
  c.cache_scale_inv = d.scale(1.0f / 64.0f, 64.0f);
  c.with_error_flag = d.chance(0.5);
  c.data = d.data();
  c.seed = d.bits();
  return c;
}

void expect_hook_agrees(const HookCase& c) {
  std::vector<HostBuffer> host = initial_buffers(c, kPoison);
  const std::vector<DeviceBuffer> device = upload(host);
  c.run("cpu", host_bases(host), Device::cpu(), nullptr);
  c.run("fp8-hopper", device_bases(device), Device::cuda(0), nullptr);
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  // What the GPU's buffers must hold: the CPU's, with V transposed instead of token-major.
  std::vector<std::vector<std::uint8_t>> want;
  for (const HostBuffer& h : host) want.emplace_back(h.payload().begin(), h.payload().end());
  const Spec tm = c.token_major_spec(), tr = c.transposed_spec();
  for (std::int64_t t = 0; t < c.qk.tokens; ++t) {
    for (std::int64_t h = 0; h < c.qk.heads; ++h) {
      for (std::int64_t i = 0; i < kMlaVDim; ++i) {
        const std::int64_t from = t * tm.strides[0] + h * tm.strides[1] + i;
        const std::int64_t to = t * tr.strides[0] + h * tr.strides[1] + i * tr.strides[2];
        want[HookCase::kVTransposed][std::size_t(to)] =
            want[HookCase::kVTokenMajor][std::size_t(from)];
      }
    }
  }
  std::fill(want[HookCase::kVTokenMajor].begin(), want[HookCase::kVTokenMajor].end(), kPoison);
  for (std::size_t i = 0; i < device.size(); ++i) {
    EXPECT_TRUE(same_bytes(device[i].download(), want[i], concat("buffer ", i)));
    EXPECT_TRUE(device[i].guards_intact()) << "device buffer " << i;
    EXPECT_TRUE(host[i].guards_intact()) << "host buffer " << i;
  }
}

TEST(RandomAgreementCuda, PreparePrefillQkvHook) {
  FP8MLA_REQUIRE_HOPPER();
  for_each_random_case("prepare_prefill_qkv", 200, draw_hook, expect_hook_agrees);
}

}  // namespace
}  // namespace fp8mla::test
