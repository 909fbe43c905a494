// `fp8mla bench host`: the host cost of one call of each op through the C++ API (argument
// checks and launch), at a tiny prefill (T = 4 tokens, DeepSeek-V3's MLA dims). Per op: --calls
// calls issued back to back (no synchronization between them: on CUDA they queue, the queue far
// from full), timed on the host clock, then one synchronization; the median over --reps of the
// time per call. On the CPU (a CPU-only build, or --device cpu) an op computes as it is called,
// so its time includes the work; --tokens 0 leaves the checks alone. On CUDA the table ends with
// the launch floor: an empty kernel launched the same way. Available in every build.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "fp8mla/attention.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_prep.hpp"
#include "fp8mla/output_quant.hpp"
#include "fp8mla/quantize.hpp"
#include "fp8mla/version.hpp"

#if defined(FP8MLA_WITH_CUDA)
#include "bench/launch_floor.hpp"
#include "cuda/common/device_buffer.hpp"
#endif

namespace fp8mla::cli {
namespace {

struct HostOptions {
  std::string device = "cuda";
  std::int64_t tokens = 4;
  std::int64_t heads = 16;
  int calls = 200;
  int reps = 30;
  std::string json;
};

// Zero-filled memory on the device under test; upload() copies small host arrays into it.
class Memory {
 public:
  explicit Memory(Device device) : device_(device) {}

  TensorView view(DType dtype, std::vector<std::int64_t> shape,
                  std::vector<std::int64_t> strides = {}) {
    std::int64_t elements = 1;  // the span the view reaches
    for (std::size_t d = 0; d < shape.size(); ++d) {
      elements = strides.empty() ? elements * shape[d] : elements + (shape[d] - 1) * strides[d];
    }
    std::byte* data = allocate(std::max<std::int64_t>(elements, 1) * dtype_size(dtype));
    if (strides.empty()) return TensorView(data, dtype, shape, device_);
    return TensorView(data, dtype, shape, strides, device_);
  }

  template <typename T>
  TensorView upload(DType dtype, const std::vector<T>& values) {
    TensorView v = view(dtype, {std::int64_t(values.size())});
#if defined(FP8MLA_WITH_CUDA)
    if (device_.is_cuda()) {
      cuda::check(
          cudaMemcpy(v.data(), values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice),
          "cudaMemcpy(bench host)");
      return v;
    }
#endif
    std::copy(values.begin(), values.end(), v.data_as<T>());
    return v;
  }

  void synchronize() const {
#if defined(FP8MLA_WITH_CUDA)
    if (device_.is_cuda()) cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#endif
  }

 private:
  std::byte* allocate(std::int64_t bytes) {
#if defined(FP8MLA_WITH_CUDA)
    if (device_.is_cuda()) {
      cuda_.emplace_back(bytes);
      cuda::check(cudaMemset(cuda_.back().data(), 0, std::size_t(bytes)), "cudaMemset");
      return cuda_.back().data();
    }
#endif
    host_.emplace_back(std::size_t(bytes));
    return host_.back().data();
  }

  Device device_;
  std::vector<std::vector<std::byte>> host_;
#if defined(FP8MLA_WITH_CUDA)
  std::vector<cuda::DeviceBuffer> cuda_;
#endif
};

struct Case {
  std::string op;
  std::function<void()> call;
};

// One call of every op on T tokens and H heads (prefill_attention e4m3 with V transposed, as
// mla_kv_pack_quantize_fp8 writes it; the cache has 64-token pages).
std::vector<Case> make_cases(Memory& m, std::int64_t t, std::int64_t h) {
  using D = DType;
  const std::int64_t pitch = transposed_v_pitch(t);
  const TensorView x = m.view(D::kBF16, {t, 512}), x8 = m.view(D::kE4M3, {t, 512});
  const TensorView one = m.upload(D::kF32, std::vector<float>{1.0f});
  const TensorView scale = m.view(D::kF32, {1});
  const TensorView hidden = m.view(D::kBF16, {t, 7168}), hidden8 = m.view(D::kE4M3, {t, 7168});
  const TensorView group_scales = m.view(D::kF32, {t, 56});
  const TensorView fp4 = m.view(D::kE2M1x2, {t, 3584});
  const TensorView fp4_scales = m.view(D::kE4M3, {(t + 127) / 128 * 128, 448});  // swizzled
  const TensorView q_nope = m.view(D::kBF16, {t, h, 128}), q_pe = m.view(D::kBF16, {t, h, 64});
  const TensorView k_nope = m.view(D::kBF16, {t, h, 128}), k_pe = m.view(D::kBF16, {t, 64});
  const TensorView kv_c = m.view(D::kBF16, {t, 512}), v = m.view(D::kBF16, {t, h, 128});
  const TensorView positions = m.view(D::kI64, {t}), slots = m.view(D::kI64, {t});
  const TensorView cos_sin = m.view(D::kF32, {4096, 64});
  const TensorView q8 = m.view(D::kE4M3, {t, h, 192}), k8 = m.view(D::kE4M3, {t, h, 192});
  const TensorView v8 = m.view(D::kE4M3, {t, h, 128}, {1, 128 * pitch, pitch});
  const TensorView cache = m.view(D::kE4M3, {4, 64, 576});
  const TensorView gathered_c = m.view(D::kBF16, {t, 512}), gathered_pe = m.view(D::kBF16, {t, 64});
  const TensorView cu = m.upload(D::kI32, std::vector<std::int32_t>{0, std::int32_t(t)});
  const TensorView o = m.view(D::kBF16, {t, h, 128}), lse = m.view(D::kF32, {t, h});
  const TensorView merged = m.view(D::kBF16, {t, h, 128}), merged_lse = m.view(D::kF32, {t, h});
  const LatentCacheWrite write{cache, slots, 1.0f, {}};
  const int max_seqlen = int(t);
  return {
      {"quantize_fp8", [=] { quantize_fp8(x, x8, 1.0f); }},
      {"quantize_fp8_dynamic", [=] { quantize_fp8_dynamic(x, x8, scale); }},
      {"quantize_fp8_per_token_group",
       [=] { quantize_fp8_per_token_group(hidden, hidden8, group_scales); }},
      {"quantize_nvfp4", [=] { quantize_nvfp4(hidden, fp4, fp4_scales, one); }},
      {"mla_rope_quantize_fp8",
       [=] {
         mla_rope_quantize_fp8({q_nope, q_pe, k_nope, k_pe, positions, cos_sin,
                                RopeStyle::kInterleaved, 1.0f, 1.0f, q8, k8});
       }},
      {"mla_rope_quantize_fp8+cache",
       [=] {
         mla_rope_quantize_fp8({q_nope, q_pe, k_nope, k_pe, positions, cos_sin,
                                RopeStyle::kInterleaved, 1.0f, 1.0f, q8, k8, write, kv_c});
       }},
      {"mla_kv_cache_write", [=] { mla_kv_cache_write(kv_c, k_pe, write); }},
      {"mla_kv_gather", [=] { mla_kv_gather(cache, slots, 1.0f, gathered_c, gathered_pe); }},
      {"mla_kv_pack_quantize_fp8",
       [=] {
         mla_kv_pack_quantize_fp8({k_nope, k_pe, v, 1.0f, 1.0f, k8, v8, VLayout::kTransposed});
       }},
      {"mla_v_quantize_fp8", [=] { mla_v_quantize_fp8(v, v8, 1.0f, VLayout::kTransposed); }},
      {"prefill_attention",
       [=] {
         PrefillAttentionArgs a{.q = q8,
                                .k = k8,
                                .v = v8,
                                .cu_seqlens_q = cu,
                                .cu_seqlens_k = cu,
                                .max_seqlen_q = max_seqlen,
                                .max_seqlen_k = max_seqlen,
                                .softmax_scale = 0.07f};
         a.q_descale = a.k_descale = a.v_descale = one;
         a.out = o;
         a.lse = lse;
         prefill_attention(a);
       }},
      {"merge_attention_states",
       [=] { merge_attention_states(o, lse, o, lse, merged, merged_lse); }},
      {"detect_output_quant_key", [=] { detect_output_quant_key(x8, one, {}, 512); }},
  };
}

// Median over `reps` of the time per call of `calls` calls issued back to back, in µs.
double host_us(const Case& c, const Memory& m, int calls, int reps) {
  for (int i = 0; i < 10; ++i) c.call();
  m.synchronize();
  std::vector<double> per_call;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) c.call();
    const auto end = std::chrono::steady_clock::now();
    m.synchronize();
    per_call.push_back(std::chrono::duration<double, std::micro>(end - start).count() / calls);
  }
  std::nth_element(per_call.begin(), per_call.begin() + reps / 2, per_call.end());
  return per_call[std::size_t(reps / 2)];
}

void run_host(const HostOptions& o) {
  const Device device = o.device == "cpu" ? Device::cpu() : Device::cuda(0);
#if !defined(FP8MLA_WITH_CUDA)
  if (device.is_cuda()) throw Error(ErrorCategory::kUnsupported, "bench host: a CPU-only build");
#endif
  Memory memory(device);
  const std::vector<Case> cases = make_cases(memory, o.tokens, o.heads);
  std::printf("fp8mla %s bench host: %s, T = %lld, H = %lld, %d calls x %d reps, median\n",
              kVersionString, to_string(device).c_str(), static_cast<long long>(o.tokens),
              static_cast<long long>(o.heads), o.calls, o.reps);
  std::printf("%-36s %10s\n", "op", "us/call");
  std::string rows;
  for (const Case& c : cases) {
    const double us = host_us(c, memory, o.calls, o.reps);
    std::printf("%-36s %10.2f\n", c.op.c_str(), us);
    rows += concat(rows.empty() ? "" : ",\n", "    {\"op\": \"", c.op, "\", \"us_per_call\": ", us,
                   "}");
  }
#if defined(FP8MLA_WITH_CUDA)
  if (device.is_cuda()) {
    for (const LaunchFloorCase& f : launch_floor_cases()) {
      const double us = host_us({f.name, f.launch}, memory, o.calls, o.reps);
      std::printf("%-36s %10.2f\n", f.name.c_str(), us);
      rows +=
          concat(",\n    {\"op\": \"", f.name, "\", \"us_per_call\": ", us, ", \"floor\": true}");
    }
  }
#endif
  if (o.json.empty()) return;
  std::ofstream f(o.json);
  f << "{\n  \"benchmark\": \"host\",\n  \"device\": \"" << to_string(device)
    << "\",\n  \"tokens\": " << o.tokens << ",\n  \"heads\": " << o.heads
    << ",\n  \"calls\": " << o.calls << ",\n  \"reps\": " << o.reps << ",\n  \"rows\": [\n"
    << rows << "\n  ]\n}\n";
  if (!f) throw Error(ErrorCategory::kIo, concat("bench host: cannot write ", o.json));
}

}  // namespace

void add_bench_host_command(CLI::App& bench) {
  auto o = std::make_shared<HostOptions>();
#if !defined(FP8MLA_WITH_CUDA)
  o->device = "cpu";
#endif
  CLI::App* cmd =
      bench.add_subcommand("host", "Host time per call of each op through the C++ API (T = 4)");
  cmd->add_option("--device", o->device, "cuda (cuda:0) or cpu")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  cmd->add_option("--tokens", o->tokens, "tokens T (0: the checks alone on the CPU)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--heads", o->heads, "heads H")->check(CLI::PositiveNumber);
  cmd->add_option("--calls", o->calls, "calls per repetition, issued back to back")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--reps", o->reps, "repetitions (the median is reported)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--json", o->json, "write the rows to this JSON file");
  cmd->callback([o] { run_host(*o); });
}

}  // namespace fp8mla::cli
