// MlaLayer: the checks every prefill gets, the batch plan and the path, then the CPU or CUDA
// implementation (mla_layer_cpu.cpp, mla_layer_cuda.cpp).
#include "fp8mla/mla_layer.hpp"

#include <algorithm>

#include "fp8mla/error.hpp"
#include "model/mla_layer_impl.hpp"

namespace fp8mla {

std::int64_t MlaBatch::extend_tokens() const {
  std::int64_t n = 0;
  for (const MlaSequence& s : sequences) n += s.extend;
  return n;
}

void plan_mla_batch(const MlaConfig& config, const MlaBatch& batch,
                    const MlaPrefillOptions& options, MlaBatchPlan& p) {
  p.sequences = std::int64_t(batch.sequences.size());
  for (auto* v : {&p.positions, &p.slots, &p.prefix_lens, &p.prefix_rows, &p.chunk_first_row})
    v->clear();
  p.cu_q.assign(1, 0);
  p.cu_k_one_shot.assign(1, 0);
  p.max_q = p.max_k_one_shot = 0;
  for (std::int64_t b = 0; b < p.sequences; ++b) {
    const MlaSequence& s = batch.sequences[std::size_t(b)];
    if (s.prefix < 0 || s.extend < 0 || std::int64_t(s.slots.size()) != s.prefix + s.extend ||
        s.prefix + s.extend > config.max_position) {
      throw Error(ErrorCategory::kInvalidArgument,
                  concat("MlaLayer::prefill: sequence ", b,
                         ": expected prefix, extend >= 0, prefix + extend <= ", config.max_position,
                         " and that many slots; got prefix ", s.prefix, ", extend ", s.extend, ", ",
                         s.slots.size(), " slots"));
    }
    for (std::int64_t i = 0; i < s.extend; ++i) {
      p.positions.push_back(s.prefix + i);
      p.slots.push_back(s.slots[std::size_t(s.prefix + i)]);
    }
    p.prefix_rows.insert(p.prefix_rows.end(), s.slots.begin(), s.slots.begin() + s.prefix);
    p.cu_q.push_back(p.cu_q.back() + std::int32_t(s.extend));
    p.cu_k_one_shot.push_back(p.cu_k_one_shot.back() + std::int32_t(s.prefix + s.extend));
    p.max_q = std::max(p.max_q, std::int32_t(s.extend));
    p.max_k_one_shot = std::max(p.max_k_one_shot, std::int32_t(s.prefix + s.extend));
    p.prefix_lens.push_back(s.prefix);
  }
  p.tokens = p.cu_q.back();
  p.chunked = std::int64_t(p.prefix_rows.size()) > options.one_shot_max_prefix;
  if (!p.chunked) {
    p.chunks.clear();
    return;
  }
  plan_prefix_chunks(p.prefix_lens, options.chunk_capacity, p.chunks);
  std::int64_t row = 0;
  for (const PrefixChunk& c : p.chunks) {
    p.chunk_first_row.push_back(row);
    row += c.keys();
  }
}

MlaPath choose_mla_path(const AttentionBackend& backend, const TensorView& cache, Device device) {
  const BackendCapabilities& caps = backend.capabilities();
  MlaPath path;
  path.fp8 = caps.prepare_prefill_qkv;
  path.attention_dtype = path.fp8 ? DType::kE4M3 : DType::kBF16;
  BackendRequirements required;
  required.attention_dtype = path.attention_dtype;
  required.page_size = int(cache.ndim() == 3 ? cache.size(1) : 0);
  required.prepare_prefill_qkv = path.fp8;
  required.pack_prefix_chunk_kv = path.fp8;
  check_backend(caps, required, device);
  return path;
}

MlaLayer::MlaLayer(MlaConfig config, const MlaWeights& weights, Device device)
    : config_(std::move(config)), device_(device) {
  if (!device.is_cuda()) {
    impl_ = make_cpu_mla_layer(config_, weights);
    return;
  }
#ifdef FP8MLA_WITH_CUDA
  impl_ = make_cuda_mla_layer(config_, weights, device);
#else
  throw Error(
      ErrorCategory::kUnsupported,
      concat("MlaLayer: this build has no CUDA; cannot run the layer on ", to_string(device)));
#endif
}

MlaLayer::~MlaLayer() = default;
MlaLayer::MlaLayer(MlaLayer&&) noexcept = default;
MlaLayer& MlaLayer::operator=(MlaLayer&&) noexcept = default;

const std::vector<std::string>& MlaLayer::projection_notes() const {
  return impl_->projection_notes();
}

std::size_t MlaLayer::workspace_bytes(const MlaWorkspaceLimits& limits,
                                      const MlaPrefillOptions& options,
                                      const AttentionBackend& backend) const {
  if (limits.max_tokens < 0 || limits.max_sequences < 0 || limits.max_prefix_tokens < 0) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("MlaLayer::workspace_bytes: expected limits >= 0, got max_tokens ",
                       limits.max_tokens, ", max_sequences ", limits.max_sequences,
                       ", max_prefix_tokens ", limits.max_prefix_tokens));
  }
  const MlaPath path{backend.capabilities().prepare_prefill_qkv,
                     backend.capabilities().prepare_prefill_qkv ? DType::kE4M3 : DType::kBF16};
  return impl_->workspace_bytes(limits, options, path);
}

void MlaLayer::prefill(const TensorView& hidden, const MlaBatch& batch, const TensorView& cache,
                       const AttentionBackend& backend, const MlaPrefillOptions& options,
                       const TensorView& out, const TensorView& workspace, MlaStageTimes* times,
                       CudaStream stream) {
  const MlaConfig& c = config_;
  // The message is built only when the check fails.
  const auto require = [](bool ok, auto&& what) {
    if (!ok) throw Error(ErrorCategory::kInvalidArgument, concat("MlaLayer::prefill: ", what()));
  };
  for (const auto& [t, name] : {std::pair{&hidden, "hidden"}, {&cache, "cache"}, {&out, "out"}}) {
    require(t->device() == device_, [&] {
      return concat("expected `", name, "` on the layer's device ", to_string(device_), ", got ",
                    t->describe());
    });
  }
  require(options.one_shot_max_prefix >= 0 && options.chunk_capacity >= 1 &&
              options.cache_scale_inv > 0 && options.fp8.q_scale_inv > 0 &&
              options.fp8.k_scale_inv > 0 && options.fp8.v_scale_inv > 0,
          [&] {
            return concat(
                "expected options one_shot_max_prefix >= 0, chunk_capacity >= 1 and scales > 0; "
                "got ",
                options.one_shot_max_prefix, ", ", options.chunk_capacity, ", cache_scale_inv ",
                options.cache_scale_inv, ", fp8 scale_inv q/k/v ", options.fp8.q_scale_inv, "/",
                options.fp8.k_scale_inv, "/", options.fp8.v_scale_inv);
          });
  const std::int64_t T = batch.extend_tokens();
  require(hidden.dtype() == DType::kBF16 && hidden.ndim() == 2 && hidden.size(0) == T &&
              hidden.size(1) == c.hidden && hidden.is_contiguous(),
          [&] {
            return concat("expected `hidden` contiguous bf16 [", T, ", ", c.hidden,
                          "] (T = the batch's ", "extend tokens), got ", hidden.describe());
          });
  require(out.dtype() == DType::kBF16 && out.ndim() == 2 && out.size(0) == T &&
              out.size(1) == c.hidden && out.is_contiguous(),
          [&] {
            return concat("expected `out` contiguous bf16 [", T, ", ", c.hidden, "], got ",
                          out.describe());
          });
  require(cache.dtype() == DType::kE4M3 && cache.ndim() == 3 && cache.size(2) == kMlaLatentDim,
          [&] {
            return concat("expected `cache` e4m3 [pages, page_size, ", kMlaLatentDim, "], got ",
                          cache.describe());
          });
  plan_mla_batch(c, batch, options, impl_->plan);
  const MlaPath path = choose_mla_path(backend, cache, device_);
  impl_->prefill(
      {hidden, impl_->plan, cache, backend, options, out, workspace, path, times, stream});
}

}  // namespace fp8mla
