// An engine's MLA prefill step through fp8mla's C++ API, on a small random model: the C++ twin of
// engine_prefill.py, for an engine written in C++.
//
// The engine owns the projections, the paged FP8 latent cache, the batch and every buffer;
// fp8mla does the rest:
//   1. the backend's prepare hook: bf16 Q, K, V -> e4m3 Q and K (RoPE applied) and e4m3 V in the
//      layout the backend's attention reads, and the new tokens' latent rows written to the cache;
//   2. causal attention of the new tokens among themselves, with its LSE;
//   3. attention of the new tokens over their cached prefix: the prefix rows gathered from the
//      cache, expanded by kv_b_proj and packed to e4m3 by the backend;
//   4. that call folding its state into step 2's in place (the backend's fold_prior_state; a
//      merge of the two states after it for a backend without), then o_proj.
// Two steps run: a sequence's first tokens, then its next ones (the first now a cached prefix)
// beside a new sequence. Each step's output is compared with mla_prefill_reference, the float64
// reference of the whole layer, and the device error flag of the cache ops is read; the exit
// status is 1 if a cosine falls below the bound or the flag is set.
//
//   build/examples/engine_prefill [cpu|cuda]   (cuda: a Hopper GPU and a CUDA build; default cpu)
//
// The engine's own GEMMs and norms run on the host here, for brevity; a real engine runs them on
// its device and passes fp8mla views of their outputs, as below.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <fp8mla/attention.hpp>
#include <fp8mla/attention_backend.hpp>
#include <fp8mla/error.hpp>
#include <fp8mla/mla_layer.hpp>
#include <fp8mla/mla_weights.hpp>
#include <fp8mla/numerics.hpp>
#include <fp8mla/version.hpp>
#if defined(FP8MLA_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace {

using fp8mla::DType;
using fp8mla::TensorView;
constexpr std::int64_t kNope = fp8mla::kMlaNopeDim, kRope = fp8mla::kMlaRopeDim;
constexpr std::int64_t kQk = fp8mla::kMlaQkDim, kV = fp8mla::kMlaVDim;
constexpr std::int64_t kLora = fp8mla::kMlaKvLoraRank, kLatent = fp8mla::kMlaLatentDim;
constexpr std::int64_t kPageSize = 16, kPages = 8;
// The engine's static per-tensor FP8 scales (x = e4m3 * scale), calibrated per layer.
constexpr float kQScale = 0.5f, kKScale = 0.5f, kVScale = 0.25f, kCacheScale = 1.0f;
constexpr double kMinCosine = 0.999;  // the layer tests' bound for the FP8 path, bf16 weights

// The engine's memory on one device: every buffer it hands fp8mla, freed at the end.
class Memory {
 public:
  explicit Memory(fp8mla::Device device) : device_(device) {}
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;
  ~Memory() {
#if defined(FP8MLA_WITH_CUDA)
    for (void* p : device_blocks_) cudaFree(p);
#endif
  }

  // A new row-major tensor (contents unset).
  TensorView tensor(DType dtype, std::vector<std::int64_t> shape) {
    std::int64_t n = 1;
    for (std::int64_t s : shape) n *= s;
    return TensorView(allocate(std::max<std::int64_t>(n, 1) * fp8mla::dtype_size(dtype)), dtype,
                      shape, device_);
  }
  // A new tensor holding `values` (host data of dtype's size).
  template <typename T>
  TensorView upload(DType dtype, std::vector<std::int64_t> shape, const std::vector<T>& values) {
    TensorView t = tensor(dtype, std::move(shape));
    copy(t.data(), values.data(), values.size() * sizeof(T), true);
    return t;
  }
  template <typename T>
  std::vector<T> download(const TensorView& t) {
    std::vector<T> values(std::size_t(t.numel()));
    copy(values.data(), t.data(), values.size() * sizeof(T), false);
    return values;
  }

 private:
  std::byte* allocate(std::int64_t bytes) {
#if defined(FP8MLA_WITH_CUDA)
    if (device_.is_cuda()) {
      void* p = nullptr;
      check(cudaMalloc(&p, std::size_t(bytes)), "cudaMalloc");
      device_blocks_.push_back(p);
      return static_cast<std::byte*>(p);
    }
#endif
    host_blocks_.emplace_back(std::size_t(bytes));
    return host_blocks_.back().data();
  }
  void copy(void* to, const void* from, std::size_t bytes, bool to_device) {
#if defined(FP8MLA_WITH_CUDA)
    if (device_.is_cuda()) {
      check(
          cudaMemcpy(to, from, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost),
          "cudaMemcpy");
      return;
    }
#endif
    (void)to_device;
    std::memcpy(to, from, bytes);
  }

#if defined(FP8MLA_WITH_CUDA)
  static void check(cudaError_t status, const char* what) {
    if (status != cudaSuccess) {
      throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
    }
  }
#endif

  fp8mla::Device device_;
  std::vector<std::vector<std::byte>> host_blocks_;
  std::vector<void*> device_blocks_;
};

using Bf16 = std::vector<std::uint16_t>;

// The engine's GEMM: y [rows, out] = bf16(x [rows, in] . W^T), W a bf16 [out, in] weight.
Bf16 linear(const Bf16& x, std::int64_t rows, const TensorView& w) {
  const std::int64_t out = w.size(0), in = w.size(1);
  const auto* wb = w.data_as<const std::uint16_t>();
  Bf16 y(std::size_t(rows * out));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t o = 0; o < out; ++o) {
      float acc = 0.0f;
      for (std::int64_t i = 0; i < in; ++i) {
        acc +=
            fp8mla::decode_bf16(x[std::size_t(r * in + i)]) * fp8mla::decode_bf16(wb[o * in + i]);
      }
      y[std::size_t(r * out + o)] = fp8mla::encode_bf16(acc);
    }
  }
  return y;
}

// RMSNorm of each row's first `width` of `stride` values.
Bf16 rms_norm(const Bf16& x, std::int64_t rows, std::int64_t width, std::int64_t stride,
              const TensorView& gain, double eps) {
  const auto* g = gain.data_as<const std::uint16_t>();
  Bf16 y(std::size_t(rows * width));
  for (std::int64_t r = 0; r < rows; ++r) {
    float squares = 0.0f;
    for (std::int64_t i = 0; i < width; ++i) {
      const float v = fp8mla::decode_bf16(x[std::size_t(r * stride + i)]);
      squares += v * v;
    }
    const float norm = 1.0f / std::sqrt(squares / float(width) + float(eps));
    for (std::int64_t i = 0; i < width; ++i) {
      y[std::size_t(r * width + i)] = fp8mla::encode_bf16(
          fp8mla::decode_bf16(x[std::size_t(r * stride + i)]) * norm * fp8mla::decode_bf16(g[i]));
    }
  }
  return y;
}

// A [rows, heads, dim] view into row-major [rows, heads, width] memory, `offset` values in.
TensorView heads_view(const TensorView& t, std::int64_t heads, std::int64_t width,
                      std::int64_t offset, std::int64_t dim) {
  return TensorView(static_cast<std::byte*>(t.data()) + offset * fp8mla::dtype_size(t.dtype()),
                    t.dtype(), {t.size(0), heads, dim}, {heads * width, width, 1}, t.device());
}

// An e4m3 V of n tokens in the backend's layout (transposed: [H][128][pitch] memory).
TensorView v_out(Memory& memory, fp8mla::VLayout layout, std::int64_t n, std::int64_t heads) {
  if (layout == fp8mla::VLayout::kTokenMajor) return memory.tensor(DType::kE4M3, {n, heads, kV});
  const std::int64_t pitch = fp8mla::transposed_v_pitch(n);
  const TensorView block = memory.tensor(DType::kE4M3, {heads, kV, pitch});
  return fp8mla::transposed_v_view(block.data(), n, heads, pitch, block.device());
}

std::vector<std::int32_t> offsets(const std::vector<std::int64_t>& lengths) {
  std::vector<std::int32_t> cu{0};
  for (std::int64_t n : lengths) cu.push_back(cu.back() + std::int32_t(n));
  return cu;
}

struct Model {
  fp8mla::MlaConfig config;
  fp8mla::MlaWeights weights;
  const fp8mla::AttentionBackend& backend;
  TensorView cos_sin, cache, q_descale, k_descale, v_descale;
  // i32 [1], 0: set to 1 by a device op that met a bad slot or position in device data (on
  // CUDA those cannot throw without a sync; on the CPU they throw).
  TensorView error_flag;
};

// A batch's metadata as the engine holds it: per sequence its lengths, per new token its
// position and cache slot, and the prefix rows' slots.
struct Metadata {
  std::vector<std::int64_t> extends, prefixes, new_slots, prefix_slots;
  std::vector<std::int32_t> positions;
};

Metadata metadata(const fp8mla::MlaBatch& batch) {
  Metadata meta;
  for (const fp8mla::MlaSequence& s : batch.sequences) {
    meta.extends.push_back(s.extend);
    meta.prefixes.push_back(s.prefix);
    for (std::int64_t i = 0; i < s.prefix + s.extend; ++i) {
      (i < s.prefix ? meta.prefix_slots : meta.new_slots).push_back(s.slots[std::size_t(i)]);
      if (i >= s.prefix) meta.positions.push_back(std::int32_t(i));
    }
  }
  return meta;
}

// Steps 1 and 2 for the new tokens' bf16 q [T, H * 192], kv [T, H * 256] (kv_b_proj's output),
// latent [T, 576] (kv_a_proj_with_mqa's) and kv_a [T, 512] (its normalized kv_c): returns the
// attention's arguments with its output and LSE.
fp8mla::PrefillAttentionArgs prepare_and_attend(Memory& memory, const Model& m,
                                                const Metadata& meta, const TensorView& q,
                                                const TensorView& kv, const TensorView& latent,
                                                const TensorView& kv_a) {
  const std::int64_t tokens = q.size(0), heads = m.config.heads;
  // 1. BF16 -> FP8 through the backend's hook; the new latent rows go to the cache.
  fp8mla::PrepareQkvArgs prep;
  prep.qk.q_nope = heads_view(q, heads, kQk, 0, kNope);
  prep.qk.q_pe = heads_view(q, heads, kQk, kNope, kRope);
  prep.qk.k_nope = heads_view(kv, heads, kNope + kV, 0, kNope);
  prep.qk.k_pe = TensorView(static_cast<std::byte*>(latent.data()) + kLora * 2, DType::kBF16,
                            {tokens, kRope}, {kLatent, 1}, latent.device());
  prep.qk.positions = memory.upload(DType::kI32, {tokens}, meta.positions);
  prep.qk.cos_sin = m.cos_sin;
  prep.qk.q_scale_inv = 1.0f / kQScale;
  prep.qk.k_scale_inv = 1.0f / kKScale;
  prep.qk.q_out = memory.tensor(DType::kE4M3, {tokens, heads, kQk});
  prep.qk.k_out = memory.tensor(DType::kE4M3, {tokens, heads, kQk});
  prep.qk.cache_write =
      fp8mla::LatentCacheWrite{m.cache, memory.upload(DType::kI64, {tokens}, meta.new_slots),
                               1.0f / kCacheScale, m.error_flag};
  prep.qk.kv_c = kv_a;
  prep.v = heads_view(kv, heads, kNope + kV, kNope, kV);
  prep.v_scale_inv = 1.0f / kVScale;
  prep.v_out = v_out(memory, m.backend.capabilities().v_layout, tokens, heads);
  m.backend.prepare_prefill_qkv(prep);

  // 2. The new tokens among themselves: causal, with the LSE the fold needs.
  fp8mla::PrefillAttentionArgs attention;
  attention.q = prep.qk.q_out;
  attention.k = prep.qk.k_out;
  attention.v = prep.v_out;
  attention.cu_seqlens_q = attention.cu_seqlens_k =
      memory.upload(DType::kI32, {std::int64_t(meta.extends.size()) + 1}, offsets(meta.extends));
  attention.max_seqlen_q = attention.max_seqlen_k =
      int(*std::max_element(meta.extends.begin(), meta.extends.end()));
  attention.softmax_scale = float(m.config.softmax_scale());
  attention.q_descale = m.q_descale;
  attention.k_descale = m.k_descale;
  attention.v_descale = m.v_descale;
  attention.out = memory.tensor(DType::kBF16, {tokens, heads, kV});
  attention.lse = memory.tensor(DType::kF32, {tokens, heads});
  m.backend.prefill_attention(attention);
  return attention;
}

// Steps 3 and 4: the new tokens' attention over their cached prefixes, folded into `attention`'s
// output and LSE.
void attend_prefix(Memory& memory, const Model& m, const Metadata& meta,
                   const fp8mla::PrefillAttentionArgs& attention) {
  const std::int64_t n = std::int64_t(meta.prefix_slots.size()), heads = m.config.heads;
  const fp8mla::VLayout layout = m.backend.capabilities().v_layout;
  // 3. The prefix rows gathered from the cache, expanded by kv_b_proj, packed to FP8.
  const TensorView kv_c = memory.tensor(DType::kBF16, {n, kLora});
  const TensorView k_pe = memory.tensor(DType::kBF16, {n, kRope});
  fp8mla::mla_kv_gather(m.cache, memory.upload(DType::kI64, {n}, meta.prefix_slots), kCacheScale,
                        kv_c, k_pe, m.error_flag);
  const TensorView kv =
      memory.upload(DType::kBF16, {n, heads * (kNope + kV)},
                    linear(memory.download<std::uint16_t>(kv_c), n, m.weights.kv_b_proj.weight));
  fp8mla::MlaKvPackArgs pack;
  pack.k_nope = heads_view(kv, heads, kNope + kV, 0, kNope);
  pack.k_pe = k_pe;
  pack.v = heads_view(kv, heads, kNope + kV, kNope, kV);
  pack.k_scale_inv = 1.0f / kKScale;
  pack.v_scale_inv = 1.0f / kVScale;
  pack.k_out = memory.tensor(DType::kE4M3, {n, heads, kQk});
  pack.v_out = v_out(memory, layout, n, heads);
  pack.v_layout = layout;
  m.backend.pack_prefix_chunk_kv(pack);

  fp8mla::PrefillAttentionArgs over_prefix = attention;
  over_prefix.k = pack.k_out;
  over_prefix.v = pack.v_out;
  over_prefix.cu_seqlens_k =
      memory.upload(DType::kI32, {std::int64_t(meta.prefixes.size()) + 1}, offsets(meta.prefixes));
  over_prefix.max_seqlen_k = int(*std::max_element(meta.prefixes.begin(), meta.prefixes.end()));
  over_prefix.causal = false;
  // 4. Folded into the new tokens' state in place by the same call (a sequence without a prefix
  // sees no key there and keeps its rows).
  if (m.backend.capabilities().fold_prior_state) {
    over_prefix.prior_out = over_prefix.out = attention.out;
    over_prefix.prior_lse = over_prefix.lse = attention.lse;
    m.backend.prefill_attention(over_prefix);
    return;
  }
  // A backend that does not fold: the call's own state, merged in place after it.
  over_prefix.out = memory.tensor(DType::kBF16, {attention.q.size(0), heads, kV});
  over_prefix.lse = memory.tensor(DType::kF32, {attention.q.size(0), heads});
  m.backend.prefill_attention(over_prefix);
  fp8mla::merge_attention_states_inplace(attention.out, attention.lse, over_prefix.out,
                                         over_prefix.lse);
}

// One prefill of `batch`: writes its new tokens' latent rows into the cache and returns the
// o_proj output, bf16 [T, hidden].
Bf16 prefill_step(Memory& memory, const Model& m, const Bf16& hidden,
                  const fp8mla::MlaBatch& batch) {
  const fp8mla::MlaConfig& c = m.config;
  const fp8mla::MlaWeights& w = m.weights;
  const std::int64_t tokens = batch.extend_tokens();
  const Metadata meta = metadata(batch);
  // The engine's projections of the new tokens (q straight from q_proj without a q LoRA).
  const Bf16 q =
      c.q_lora_rank > 0
          ? linear(rms_norm(linear(hidden, tokens, w.q_a_proj.weight), tokens, c.q_lora_rank,
                            c.q_lora_rank, w.q_a_layernorm, c.rms_norm_eps),
                   tokens, w.q_b_proj.weight)
          : linear(hidden, tokens, w.q_proj.weight);
  const Bf16 latent = linear(hidden, tokens, w.kv_a_proj_with_mqa.weight);  // [kv_c | k_pe]
  const Bf16 kv_a = rms_norm(latent, tokens, kLora, kLatent, w.kv_a_layernorm, c.rms_norm_eps);
  const Bf16 kv = linear(kv_a, tokens, w.kv_b_proj.weight);

  const fp8mla::PrefillAttentionArgs attention =
      prepare_and_attend(memory, m, meta, memory.upload(DType::kBF16, {tokens, c.q_width()}, q),
                         memory.upload(DType::kBF16, {tokens, c.kv_b_width()}, kv),
                         memory.upload(DType::kBF16, {tokens, kLatent}, latent),
                         memory.upload(DType::kBF16, {tokens, kLora}, kv_a));
  if (!meta.prefix_slots.empty()) attend_prefix(memory, m, meta, attention);
  return linear(memory.download<std::uint16_t>(attention.out), tokens, w.o_proj.weight);
}

double cosine(const Bf16& a, const std::vector<double>& b) {
  double ab = 0.0, aa = 0.0, bb = 0.0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    const double x = fp8mla::decode_bf16(a[i]);
    ab += x * b[i];
    aa += x * x;
    bb += b[i] * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

// The exit status of a cuda run without a usable CUDA device (ctest's SKIP_RETURN_CODE).
constexpr int kSkipped = 77;

bool cuda_device_available() {
#if defined(FP8MLA_WITH_CUDA)
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
#else
  return false;  // a build without CUDA
#endif
}

int run(const std::string& device_name) {
  const bool cuda = device_name == "cuda";
  if (cuda && !cuda_device_available()) {
    std::printf("skipped: no usable CUDA device in this build or machine\n");
    return kSkipped;
  }
  const fp8mla::Device device = cuda ? fp8mla::Device::cuda(0) : fp8mla::Device::cpu();
  const auto backend = fp8mla::make_attention_backend(cuda ? "fp8-hopper" : "cpu");
  fp8mla::BackendRequirements required;
  required.page_size = int(kPageSize);
  required.prepare_prefill_qkv = required.pack_prefix_chunk_kv = true;
  fp8mla::check_backend(backend->capabilities(), required, device);

  Memory memory(device);
  const fp8mla::MlaConfig config = fp8mla::mla_preset("tiny");
  Model m{config,
          fp8mla::generate_mla_weights(config, fp8mla::WeightFormat::kBf16, 1),
          *backend,
          memory.tensor(DType::kF32, {config.max_position, kRope}),
          memory.upload(DType::kE4M3, {kPages, kPageSize, kLatent},
                        std::vector<std::uint8_t>(std::size_t(kPages * kPageSize * kLatent))),
          memory.upload(DType::kF32, {1}, std::vector<float>{kQScale}),
          memory.upload(DType::kF32, {1}, std::vector<float>{kKScale}),
          memory.upload(DType::kF32, {1}, std::vector<float>{kVScale}),
          memory.upload(DType::kI32, {1}, std::vector<std::int32_t>{0})};
  fp8mla::make_cos_sin_cache(m.cos_sin, config.rope);

  std::vector<std::int64_t> free_slots(std::size_t(kPages * kPageSize));
  std::iota(free_slots.begin(), free_slots.end(), 0);
  std::mt19937_64 rng(2);
  std::shuffle(free_slots.begin(), free_slots.end(), rng);
  const std::vector<std::int64_t> slots_a(free_slots.begin(), free_slots.begin() + 64);
  const std::vector<std::int64_t> slots_b(free_slots.begin() + 64, free_slots.begin() + 81);
  const std::vector<fp8mla::MlaBatch> steps = {
      {{{0, 40, {slots_a.begin(), slots_a.begin() + 40}}}},  // a sequence's first 40 tokens
      {{{40, 24, slots_a}, {0, 17, slots_b}}}};              // its next 24, and a new sequence

  std::printf("fp8mla %s: model %s, backend %s, device %s\n", fp8mla::kVersionString,
              config.name.c_str(), backend->capabilities().name.c_str(), device_name.c_str());
  std::normal_distribution<float> normal;
  double worst = 1.0;
  for (std::size_t step = 0; step < steps.size(); ++step) {
    const std::int64_t tokens = steps[step].extend_tokens();
    Bf16 hidden(std::size_t(tokens * config.hidden));
    for (std::uint16_t& x : hidden) x = fp8mla::encode_bf16(normal(rng));
    // The reference reads the prefix rows as they were before this step.
    std::vector<std::uint8_t> cache_before = memory.download<std::uint8_t>(m.cache);
    const Bf16 out = prefill_step(memory, m, hidden, steps[step]);
    std::vector<double> reference(std::size_t(tokens * config.hidden));
    fp8mla::mla_prefill_reference(
        config, m.weights,
        TensorView(hidden.data(), DType::kBF16, {tokens, config.hidden}, fp8mla::Device::cpu()),
        steps[step],
        TensorView(cache_before.data(), DType::kE4M3, {kPages, kPageSize, kLatent},
                   fp8mla::Device::cpu()),
        1.0f / kCacheScale, reference.data());
    const double score = cosine(out, reference);
    worst = std::min(worst, score);
    if (memory.download<std::int32_t>(m.error_flag)[0] != 0) {
      std::printf("step %zu: a bad slot or position in the batch (error_flag set)\n", step);
      worst = 0.0;
    }
    std::printf(
        "step %zu: %lld new tokens in %zu sequences: cosine to the float64 reference "
        "%.6f\n",
        step, static_cast<long long>(tokens), steps[step].sequences.size(), score);
  }
  const bool ok = worst >= kMinCosine;
  std::printf("%s: worst cosine %.6f (bound %.3f)\n", ok ? "ok" : "FAILED", worst, kMinCosine);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string device = argc > 1 ? argv[1] : "cpu";
  if (argc > 2 || (device != "cpu" && device != "cuda")) {
    std::fprintf(stderr, "usage: %s [cpu|cuda]\n", argv[0]);
    return 2;
  }
  try {
    return run(device);
  } catch (const std::exception& e) {  // fp8mla::Error says what and where
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
