// Random-shape agreement of the attention ops (attention.hpp), seeded as random_agreement_util.hpp
// says. prefill_attention (random_attention_case.hpp: ragged batches with prefixes, e4m3 and
// bf16, causal and full, with and without the LSE, V transposed and token-major, padded strides)
// runs on the CPU and the GPU from identical poisoned buffers and both are held to the error rule
// of docs/design.md section 8 against the float64 reference (attention_reference.hpp): max
// |O - O_ref| <= 2 x (the BF16 attention's error + the bf16 rounding noise of O), the LSE within
// 1e-3, rows that see no key exactly O = 0 and LSE = -inf; and the GPU's O lies within that bound,
// plus the CPU's own error, of the CPU twin's. Every output element is written, nothing outside
// the views, no LSE without one asked for. merge_attention_states (bf16 and f32
// states, token and head counts, head dims, the general, in-place and aliased forms, misaligned
// states, empty rows) is held to merge_states_cuda_test's rule: against the float64 merge, and
// within a few ulp of the CPU op. On some cases of either op the GPU call also quantizes its output
// with a drawn key and scale layout (output_quant.hpp): those bytes must equal the standalone CPU
// op on the GPU's own unquantized output (output_quant_cuda_test.cu's rule), the LSE the unfused
// call's.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "attention_reference.hpp"
#include "merge_states_test_util.hpp"
#include "output_quant_test_util.hpp"
#include "random_agreement_util.hpp"
#include "random_attention_case.hpp"

namespace fp8mla::test {
namespace {

const Device kGpu = Device::cuda(0);

void sync() {
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

// An attention case and, when `quant` >= 0, the output quantization case it also runs (an index
// into quant_cases(Tq, H, 128)).
struct AttentionDraw {
  RandomPrefillCase c;
  int quant = -1;
  std::string describe() const {
    if (quant < 0) return c.describe();
    return concat(c.describe(), "; fused output ",
                  quant_cases(c.tq(), c.heads, RandomPrefillCase::kDv)[std::size_t(quant)].name);
  }
};

// Query and key lengths of a batch: the sum of q_len x k_len x H at most 2^23 (halved until it is),
// so that the CPU twin takes well under a second.
void draw_lengths(Draw& d, RandomPrefillCase& c) {
  const int batch = int(d.range(1, 6));
  c.q_lens.clear();
  c.k_lens.clear();
  for (int b = 0; b < batch; ++b) {
    const int q = int(d.tokens(d.chance(0.3) ? 700 : 200));
    const std::int64_t kind = d.range(0, 9);
    const int k = kind < 4 ? q : kind < 8 ? q + int(d.range(1, 1500)) : int(d.range(0, q));
    c.q_lens.push_back(q);
    c.k_lens.push_back(k);
  }
  const auto work = [&] {
    std::int64_t w = 0;
    for (int b = 0; b < batch; ++b) w += std::int64_t(c.q_lens[b]) * c.k_lens[b] * c.heads;
    return w;
  };
  while (work() > (std::int64_t{1} << 23)) {
    for (int b = 0; b < batch; ++b) {
      c.q_lens[b] /= 2;
      c.k_lens[b] /= 2;
    }
  }
}

AttentionDraw draw_attention(Draw& d) {
  AttentionDraw a;
  RandomPrefillCase& c = a.c;
  c.fp8 = d.chance(0.6);
  c.causal = d.chance(0.6);
  c.with_lse = d.chance(0.6);
  c.v_token_major = c.fp8 && d.chance(0.4);
  c.heads = int(d.pick<std::int64_t>({1, 2, 3, 4, 8, 16, 16, 32, 128}));
  draw_lengths(d, c);
  const std::int64_t step = c.fp8 ? 16 : 8;  // elements in 16 bytes
  c.qk_head_pad = d.chance(0.5) ? 0 : step * d.range(1, 4);
  c.qk_token_pad = d.chance(0.5) ? 0 : step * d.range(1, 4);
  c.v_head_pad = d.chance(0.5) ? 0 : step * d.range(1, 4);
  c.v_token_pad = d.chance(0.5) ? 0 : step * d.range(1, 4);
  c.v_pitch_pad = d.chance(0.5) ? 0 : 16 * d.range(1, 3);
  c.out_head_pad = 2 * d.pad(8);
  c.out_token_pad = 2 * d.pad(8);
  c.lse_transposed = c.tq() > 0 && d.chance(0.5);
  c.lse_pad = d.pad(5);
  // Logits with a standard deviation from about 0.6 to 2.5 (the other attention tests: about 2).
  c.descales[0] = d.log_uniform(0.2f, 0.33f);
  c.descales[1] = d.log_uniform(0.2f, 0.33f);
  c.descales[2] = d.log_uniform(0.25f, 2.0f);
  c.scale_factor = d.log_uniform(0.7f, 1.1f);
  c.seed = d.bits();
  if (c.tq() > 0 && d.chance(0.4)) {
    a.quant = int(d.range(0, std::int64_t(quant_cases(c.tq(), c.heads, 128).size()) - 1));
  }
  return a;
}

// Each written element finite (O) or finite / -inf (LSE); bytes outside the views still poison;
// without an LSE asked for, its buffer all poison.
void expect_written_in_full(const RandomPrefillCase& c, const std::vector<HostBuffer>& b,
                            const char* device) {
  SCOPED_TRACE(device);
  const std::vector<Spec> s = c.specs();
  for (int i : {6, 7}) {
    std::vector<bool> in_view(b[i].bytes() / dtype_size(s[i].dtype), false);
    std::int64_t bad = 0, touched = 0;
    if (i == 6 || c.with_lse) {
      for_each_element(s[i].view(const_cast<std::uint8_t*>(b[i].data())),
                       [&](std::int64_t, std::int64_t off) {
                         in_view[std::size_t(off)] = true;
                         const float x = load_f32(b[i].data(), s[i].dtype, off);
                         bad += !(std::isfinite(x) || (i == 7 && x == -INFINITY));
                       });
    }
    const std::size_t es = dtype_size(s[i].dtype);
    for (std::size_t e = 0; e < in_view.size(); ++e) {
      if (in_view[e]) continue;
      for (std::size_t j = 0; j < es; ++j) touched += b[i].data()[e * es + j] != kPoison;
    }
    EXPECT_EQ(bad, 0) << (i == 6 ? "out" : "lse") << ": non-finite or unwritten elements";
    EXPECT_EQ(touched, 0) << (i == 6 ? "out" : "lse") << ": bytes outside the view written";
  }
}

struct RuleErrors {
  double gpu = 0, cpu = 0, gpu_cpu = 0, bf = 0, noise = 0, lse_gpu = 0, lse_cpu = 0;
  std::int64_t rows = 0, empty_rows_wrong = 0;
  void add(const RuleErrors& o) {
    gpu = std::max(gpu, o.gpu), cpu = std::max(cpu, o.cpu), gpu_cpu = std::max(gpu_cpu, o.gpu_cpu);
    bf = std::max(bf, o.bf), noise = std::max(noise, o.noise);
    lse_gpu = std::max(lse_gpu, o.lse_gpu), lse_cpu = std::max(lse_cpu, o.lse_cpu);
    rows += o.rows, empty_rows_wrong += o.empty_rows_wrong;
  }
};

// The errors of rows [begin, end) of `rows` against the float64 reference.
RuleErrors row_errors(const RandomPrefillCase& c, const AttentionInputs& in,
                      const std::vector<std::pair<std::int64_t, int>>& rows, std::size_t begin,
                      std::size_t end, const std::vector<HostBuffer>& gpu,
                      const std::vector<HostBuffer>& cpu) {
  const std::vector<Spec> s = c.specs();
  const auto o = [&](const std::vector<HostBuffer>& b, std::int64_t t, int h, int d) {
    return double(load_f32(b[6].data(), DType::kBF16, RandomPrefillCase::at(s[6], t, h, d)));
  };
  const auto lse = [&](const std::vector<HostBuffer>& b, std::int64_t t, int h) {
    const std::int64_t e = s[7].offset + t * s[7].strides[0] + h * s[7].strides[1];
    return double(load_f32(b[7].data(), DType::kF32, e));
  };
  RuleErrors r;
  for (std::size_t k = begin; k < end; ++k) {
    const auto [t, h] = rows[k];
    const RowRef ref = reference_row(in, t, h);
    ++r.rows;
    if (ref.lse == -INFINITY) {  // sees no key: O = 0 exactly, LSE = -inf
      bool ok = !c.with_lse || (lse(gpu, t, h) == -INFINITY && lse(cpu, t, h) == -INFINITY);
      for (int d = 0; d < kRefDv; ++d) ok = ok && o(gpu, t, h, d) == 0.0 && o(cpu, t, h, d) == 0.0;
      r.empty_rows_wrong += !ok;
      continue;
    }
    for (int d = 0; d < kRefDv; ++d) {
      const double want = ref.o[std::size_t(d)], g = o(gpu, t, h, d), p = o(cpu, t, h, d);
      r.gpu = std::max(r.gpu, std::abs(g - want));
      r.cpu = std::max(r.cpu, std::abs(p - want));
      r.gpu_cpu = std::max(r.gpu_cpu, std::abs(g - p));
      r.bf = std::max(r.bf, std::abs(ref.o_bf[std::size_t(d)] - want));
      r.noise = std::max(r.noise, std::abs(bf16_round(bf16_round(want + 0.3) - 0.3) - want));
    }
    if (c.with_lse) {
      r.lse_gpu = std::max(r.lse_gpu, std::abs(lse(gpu, t, h) - ref.lse));
      r.lse_cpu = std::max(r.lse_cpu, std::abs(lse(cpu, t, h) - ref.lse));
    }
  }
  return r;
}

// The error rule on the checked rows (attention_reference.hpp's choice, every row up to 2^19 of
// work), the rows split over threads.
void expect_error_rule(const RandomPrefillCase& c, const std::vector<HostBuffer>& initial,
                       const std::vector<HostBuffer>& gpu, const std::vector<HostBuffer>& cpu) {
  const AttentionInputs in = c.inputs(initial);
  std::mt19937 rng(std::uint32_t(c.seed));
  const std::vector<std::pair<std::int64_t, int>> rows =
      rows_to_check(in, rng, std::int64_t{1} << 19);
  const std::size_t threads = std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, 32);
  std::vector<RuleErrors> parts(threads);
  std::vector<std::thread> pool;
  for (std::size_t i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      parts[i] = row_errors(c, in, rows, rows.size() * i / threads, rows.size() * (i + 1) / threads,
                            gpu, cpu);
    });
  }
  for (std::thread& t : pool) t.join();
  RuleErrors e;
  for (const RuleErrors& p : parts) e.add(p);
  const double bound = 2.0 * e.bf + 2.0 * e.noise;
  EXPECT_EQ(e.empty_rows_wrong, 0) << "rows that see no key: O not 0 or LSE not -inf";
  EXPECT_LE(e.gpu, bound) << "GPU: max |O - ref| " << e.gpu << ", BF16 attention " << e.bf
                          << ", noise " << e.noise << " over " << e.rows << " rows";
  EXPECT_LE(e.cpu, bound) << "CPU: max |O - ref| " << e.cpu;
  EXPECT_LE(e.gpu_cpu, bound + e.cpu) << "max |O_gpu - O_cpu| " << e.gpu_cpu;
  EXPECT_LE(e.lse_gpu, 1e-3) << "GPU LSE";
  EXPECT_LE(e.lse_cpu, 1e-3) << "CPU LSE";
}

// The GPU's own bf16 O as contiguous [Tq, H * 128] rows.
HostBuffer bf16_rows(const RandomPrefillCase& c, const std::vector<HostBuffer>& gpu) {
  const std::vector<Spec> s = c.specs();
  const std::int64_t w = c.heads * RandomPrefillCase::kDv;
  HostBuffer rows(std::size_t(std::max<std::int64_t>(c.tq() * w, 1)) * 2);
  for (std::int64_t t = 0; t < c.tq(); ++t) {
    for (std::int64_t h = 0; h < c.heads; ++h) {
      std::memcpy(rows.data() + (t * w + h * RandomPrefillCase::kDv) * 2,
                  gpu[6].data() + RandomPrefillCase::at(s[6], t, h, 0) * 2,
                  RandomPrefillCase::kDv * 2);
    }
  }
  return rows;
}

std::vector<std::uint8_t> bytes_of(const HostBuffer& b) {
  return {b.payload().begin(), b.payload().end()};
}

// fused(out, output_scale, output_block_scale), a GPU call that syncs, against the standalone CPU
// op of `q` on `rows` (bf16 [T, W]: the unfused GPU output), out and scales poisoned twice.
template <typename Fused>
void expect_fused_equals_standalone(const QuantCase& q, const TensorView& rows, Fused fused) {
  for (std::uint8_t poison : {std::uint8_t(0xFF), std::uint8_t(0x5A)}) {
    SCOPED_TRACE(concat("fused output ", q.name, ", poison 0x", std::hex, int(poison)));
    QuantBuffers host(q, poison), want(q, poison);
    const DeviceBuffer out = to_device(bytes_of(host.out)), scale = to_device(bytes_of(host.scale)),
                       global = to_device(bytes_of(host.global));
    const auto [output_scale, block_scale] = op_scales(q, scale.data(), global.data(), kGpu);
    fused(q.out.view(out.data(), kGpu), output_scale, block_scale);
    run_standalone(q, rows, want);
    pad_swizzled(q, want, rows.size(0), rows.size(0), rows.size(1), poison);
    EXPECT_TRUE(same_bytes(out.download(), want.out.payload(), "out"));
    EXPECT_TRUE(same_bytes(scale.download(), want.scale.payload(), "scales"));
    EXPECT_TRUE(same_bytes(global.download(), want.global.payload(), "output_scale"));
    EXPECT_TRUE(out.guards_intact() && scale.guards_intact() && global.guards_intact());
  }
}

// The GPU call with the drawn output key: the standalone op's bytes on the GPU's bf16 O, the
// unfused call's LSE.
void expect_fused_output(const AttentionDraw& a, const std::vector<HostBuffer>& initial,
                         const std::vector<HostBuffer>& gpu) {
  const RandomPrefillCase& c = a.c;
  const QuantCase q = quant_cases(c.tq(), c.heads, RandomPrefillCase::kDv)[std::size_t(a.quant)];
  HostBuffer rows = bf16_rows(c, gpu);
  const TensorView bf16(rows.data(), DType::kBF16, {c.tq(), c.heads * RandomPrefillCase::kDv});
  expect_fused_equals_standalone(
      q, bf16, [&](const TensorView& out, const TensorView& scale, const TensorView& block) {
        const std::vector<DeviceBuffer> device = upload(initial);
        PrefillAttentionArgs args = c.args(device_bases(device), kGpu);
        args.out = out;
        args.output_scale = scale;
        args.output_block_scale = block;
        prefill_attention(args);
        sync();
        EXPECT_TRUE(same_bytes(device[7].download(), gpu[7].payload(), "lse"));
      });
}

void expect_attention_agrees(const AttentionDraw& a) {
  const RandomPrefillCase& c = a.c;
  const std::vector<HostBuffer> initial = host_buffers(c);
  std::vector<HostBuffer> cpu = host_buffers(c), gpu = host_buffers(c);
  const std::vector<DeviceBuffer> device = upload(initial);
  c.run(device_bases(device), kGpu);
  c.run(host_bases(cpu), Device::cpu());
  sync();
  for (std::size_t i = 0; i < device.size(); ++i) {
    const std::vector<std::uint8_t> bytes = device[i].download();
    std::memcpy(gpu[i].data(), bytes.data(), bytes.size());
    EXPECT_TRUE(device[i].guards_intact()) << "device buffer " << i;
    EXPECT_TRUE(cpu[i].guards_intact()) << "host buffer " << i;
    if (i < 6) {
      EXPECT_TRUE(same_bytes(gpu[i].payload(), initial[i].payload(), concat("input ", i)));
    }
  }
  expect_written_in_full(c, gpu, "GPU");
  expect_written_in_full(c, cpu, "CPU");
  expect_error_rule(c, initial, gpu, cpu);
  if (a.quant >= 0) expect_fused_output(a, initial, gpu);
}

TEST(RandomAgreementCuda, PrefillAttention) {
  FP8MLA_REQUIRE_HOPPER();
  for_each_random_case("prefill_attention", 40, draw_attention, expect_attention_agrees);
}

// ---- merge_attention_states ---------------------------------------------------------------------

// A merge case and, when `quant` >= 0 (general form only), the output quantization case it also
// runs (an index into quant_cases(T, H, D)).
struct MergeDraw {
  MergeCase c;
  int quant = -1;
  std::string describe() const {
    if (quant < 0) return c.describe();
    return concat(c.describe(), "; fused output ",
                  quant_cases(c.tokens, c.heads, c.dim)[std::size_t(quant)].name);
  }
};

MergeDraw draw_merge(Draw& d) {
  MergeDraw m;
  MergeCase& c = m.c;
  c.dtype = d.pick({DType::kBF16, DType::kF32});
  c.heads = d.pick<std::int64_t>({1, 5, 16, 16, 128});
  c.dim = d.chance(0.5) ? d.pick<std::int64_t>({1, 3, 64, 72, 128, 128, 512}) : d.range(1, 256);
  c.tokens = d.tokens(std::max<std::int64_t>((std::int64_t{1} << 18) / (c.heads * c.dim), 1));
  c.form = d.pick(
      {MergeCase::Form::kGeneral, MergeCase::Form::kInplace, MergeCase::Form::kGeneralAliased});
  c.misalign = d.chance(0.3);
  c.empty_a_percent = int(d.pick<std::int64_t>({0, 20, 50, 100}));
  c.empty_b_percent = int(d.pick<std::int64_t>({0, 20, 50, 100}));
  c.seed = d.bits();
  if (c.form == MergeCase::Form::kGeneral && c.tokens > 0 && d.chance(0.4)) {
    // quant_cases lays packed-FP4 outs out as H x D / 2 bytes a token: an even D only.
    std::vector<int> usable;
    const std::vector<QuantCase> quant = quant_cases(c.tokens, c.heads, c.dim);
    for (std::size_t i = 0; i < quant.size(); ++i) {
      if (quant[i].key != OutputQuantKey::kNvfp4 || c.dim % 2 == 0) usable.push_back(int(i));
    }
    m.quant = usable[std::size_t(d.range(0, std::int64_t(usable.size()) - 1))];
  }
  return m;
}

// The GPU merge into the drawn quantized out: the standalone op's bytes on the unfused GPU out
// rounded to bf16 (`gpu` viewed through gpu_bases), out_lse as without the key.
void expect_merge_fuses(const MergeDraw& m, const std::vector<HostBuffer>& before,
                        std::span<void* const> gpu_bases) {
  const MergeCase& c = m.c;
  const std::vector<Spec> s = c.specs();
  const TensorView merged = s[4].view(gpu_bases[4]);
  std::vector<std::uint16_t> bf16(std::size_t(c.tokens * c.heads * c.dim));
  for (std::int64_t t = 0; t < c.tokens; ++t) {
    for (std::int64_t h = 0; h < c.heads; ++h) {
      for (std::int64_t d = 0; d < c.dim; ++d) {
        bf16[std::size_t((t * c.heads + h) * c.dim + d)] = encode_bf16(elem(merged, t, h, d));
      }
    }
  }
  const TensorView rows(bf16.data(), DType::kBF16, {c.tokens, c.heads * c.dim});
  const QuantCase q = quant_cases(c.tokens, c.heads, c.dim)[std::size_t(m.quant)];
  const std::vector<std::uint8_t> want_lse(
      static_cast<const std::uint8_t*>(gpu_bases[5]),
      static_cast<const std::uint8_t*>(gpu_bases[5]) + s[5].bytes());
  expect_fused_equals_standalone(
      q, rows, [&](const TensorView& out, const TensorView& scale, const TensorView& block) {
        const std::vector<DeviceBuffer> states = upload(before);
        const auto v = [&](int i) {
          return s[std::size_t(i)].view(states[std::size_t(i)].data(), kGpu);
        };
        merge_attention_states(v(0), v(1), v(2), v(3), out, v(5), scale, block);
        sync();
        EXPECT_TRUE(same_bytes(states[5].download(), want_lse, "out_lse"));
      });
}

// merge_states_cuda_test's rule: the GPU against the float64 merge (bytes outside the written
// views unchanged) and within a few ulp of the CPU op; then the drawn fused output.
void expect_merge_agrees(const MergeDraw& m) {
  const MergeCase& c = m.c;
  const std::vector<HostBuffer> before = host_buffers(c);
  std::vector<HostBuffer> cpu = host_buffers(c), gpu = host_buffers(c);
  const std::vector<void*> cpu_bases = host_bases(cpu), gpu_bases = host_bases(gpu);
  const MergeRef ref = merge_reference(c, cpu_bases);
  c.run(cpu_bases, Device::cpu());
  const std::vector<DeviceBuffer> device = upload(before);
  c.run(device_bases(device), kGpu, nullptr);
  sync();
  std::vector<std::vector<std::uint8_t>> after;
  for (std::size_t i = 0; i < device.size(); ++i) {
    after.push_back(device[i].download());
    std::memcpy(gpu[i].data(), after.back().data(), after.back().size());
    EXPECT_TRUE(device[i].guards_intact()) << "device buffer " << i;
  }
  expect_matches_reference(c, gpu_bases, ref);
  expect_rest_unchanged(c, before, after, gpu_bases);
  expect_near_cpu(c, ref, cpu_bases, gpu_bases);
  if (m.quant >= 0) expect_merge_fuses(m, before, gpu_bases);
}

TEST(RandomAgreementCuda, MergeAttentionStates) {
  FP8MLA_REQUIRE_HOPPER();
  for_each_random_case("merge_attention_states", 300, draw_merge, expect_merge_agrees);
}

}  // namespace
}  // namespace fp8mla::test
