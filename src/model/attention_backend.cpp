#include "fp8mla/attention_backend.hpp"

#include <algorithm>
#include <iterator>

#include "core/check.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/kernel_registry.hpp"
#include "fp8mla/output_quant.hpp"
#include "fp8mla/quantize.hpp"
#include "fp8mla/runtime_info.hpp"

namespace fp8mla {
namespace {

// The visible CUDA devices, queried once: backends are checked on every prefill.
const CudaDevices& visible_devices() {
  static const CudaDevices devices = cuda_devices();
  return devices;
}

// The visible CUDA device `device` is, if any.
const CudaDeviceInfo* cuda_device_info(Device device) {
  for (const CudaDeviceInfo& d : visible_devices().devices) {
    if (d.ordinal == device.index) return &d;
  }
  return nullptr;
}

std::string device_text(Device device) {
  if (!device.is_cuda()) return "cpu";
  const CudaDeviceInfo* d = cuda_device_info(device);
  return d ? concat(to_string(device), " (", d->name, ", sm_", d->arch, ")")
           : concat(to_string(device), " (not visible: ", visible_devices().unavailable_reason,
                    ")");
}

// "cpu", "sm_90a" (Hopper kernels use the arch-specific features), "sm_XX" or "unknown".
std::string architecture_of(Device device) {
  if (!device.is_cuda()) return "cpu";
  const CudaDeviceInfo* d = cuda_device_info(device);
  return d ? "sm_" + std::to_string(d->arch) + (d->arch == 90 ? "a" : "") : "unknown";
}

template <typename T>
std::string join(const std::vector<T>& items, auto text) {
  std::string s;
  for (const T& item : items) s += concat(s.empty() ? "" : ", ", text(item));
  return s.empty() ? "none" : s;
}

std::string join(const std::vector<std::string>& items) {
  return join(items, [](const std::string& s) { return s; });
}

// The hook's V has the tokens and heads of its Q, and passes mla_v_quantize_fp8's checks (run on
// an empty slice of it first) before mla_rope_quantize_fp8 writes anything: a bad V then leaves
// q_out, k_out and the cache as they were.
void check_v_like_q(const PrepareQkvArgs& args, VLayout layout) {
  const TensorView& q = args.qk.q_nope;
  const TensorView& v = args.v;
  if (q.ndim() == 3 && v.ndim() == 3 && (v.size(0) != q.size(0) || v.size(1) != q.size(1))) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("prepare_prefill_qkv: `v`: expected the ", q.size(0), " tokens and ",
                       q.size(1), " heads of `q_nope` (", q.describe(), "), got ", v.describe()));
  }
  const auto none = [](const TensorView& t) { return t.ndim() >= 1 ? t.narrow(0, 0, 0) : t; };
  try {
    mla_v_quantize_fp8(none(v), none(args.v_out), args.v_scale_inv, layout);
  } catch (const Error&) {
    // The check that failed holds for any token count: it fails again on the views as given,
    // before writing anything, with a message that shows them.
    mla_v_quantize_fp8(v, args.v_out, args.v_scale_inv, layout);
    throw;
  }
}

// A backend made of fp8mla's ops, which run where their tensors are: backends differ in what they
// declare (kBackends), not in code.
class OpsBackend final : public AttentionBackend {
 public:
  explicit OpsBackend(BackendCapabilities caps) : caps_(std::move(caps)) {}
  const BackendCapabilities& capabilities() const override { return caps_; }
  void prefill_attention(const PrefillAttentionArgs& args, CudaStream stream) const override {
    fp8mla::prefill_attention(args, stream);
  }
  void prepare_prefill_qkv(const PrepareQkvArgs& args, CudaStream stream) const override {
    if (!caps_.prepare_prefill_qkv) AttentionBackend::prepare_prefill_qkv(args, stream);
    const bool quantize_v = given(args.v) || given(args.v_out);
    if (quantize_v) check_v_like_q(args, caps_.v_layout);
    mla_rope_quantize_fp8(args.qk, stream);
    if (quantize_v)
      mla_v_quantize_fp8(args.v, args.v_out, args.v_scale_inv, caps_.v_layout, stream);
  }
  void pack_prefix_chunk_kv(const MlaKvPackArgs& args, CudaStream stream) const override {
    if (!caps_.pack_prefix_chunk_kv) AttentionBackend::pack_prefix_chunk_kv(args, stream);
    if (args.v_layout != caps_.v_layout) {
      throw Error(ErrorCategory::kInvalidArgument,
                  concat("attention backend '", caps_.name, "' packs V ",
                         caps_.v_layout == VLayout::kTransposed ? "transposed" : "token-major",
                         "; the pack arguments ask for the other layout"));
    }
    mla_kv_pack_quantize_fp8(args, stream);
  }

 private:
  BackendCapabilities caps_;
};

// The backends, by what they declare. A CUDA backend takes the attention dtypes and head dims of
// the kernels this build compiled (compiled_attention_variants: none without CUDA) and runs on the
// architecture they were compiled for.
struct BackendSpec {
  const char* name;
  DeviceType device;
  bool fp8;  // e4m3 attention (besides bf16), the prepare_prefill_qkv hook and pack_prefix_chunk_kv
  VLayout v_layout;  // of the FP8 V the hook and the pack write
};
// FP8 P V on Hopper reads V with contiguous tokens (wgmma's K-major operand). bf16-hopper has no
// hook or pack, so its layout is never used.
constexpr BackendSpec kBackends[] = {
    {"cpu", DeviceType::kCPU, true, VLayout::kTokenMajor},
    {"cpu-bf16", DeviceType::kCPU, false, VLayout::kTokenMajor},
    {"fp8-hopper", DeviceType::kCUDA, true, VLayout::kTransposed},
    {"bf16-hopper", DeviceType::kCUDA, false, VLayout::kTransposed},
};

// The output quantization keys the attention fuses: all of them, on the CPU and in the epilogue
// of every compiled Hopper kernel (and the merge of attention states).
constexpr OutputQuantKey kFusedKeys[] = {OutputQuantKey::kFp8Static, OutputQuantKey::kFp8Group128,
                                         OutputQuantKey::kFp8Group64, OutputQuantKey::kNvfp4};

// The (Dqk, Dv) pairs the CPU attention is checked at: MLA's and smaller ones.
constexpr std::pair<int, int> kCpuHeadDims[] = {{192, 128}, {128, 128}, {64, 64}, {128, 64}};

template <typename T>
void add_unique(std::vector<T>& items, const T& item) {
  if (std::find(items.begin(), items.end(), item) == items.end()) items.push_back(item);
}

BackendCapabilities capabilities_of(const BackendSpec& spec) {
  BackendCapabilities caps;
  caps.name = spec.name;
  caps.prepare_prefill_qkv = caps.pack_prefix_chunk_kv = spec.fp8;
  caps.v_layout = spec.v_layout;
  const auto takes = [&](DType dtype) { return spec.fp8 || dtype == DType::kBF16; };
  if (spec.device == DeviceType::kCPU) {
    for (DType dtype : {DType::kE4M3, DType::kBF16}) {
      if (takes(dtype)) caps.attention_dtypes.push_back(dtype);
    }
    caps.head_dims.assign(std::begin(kCpuHeadDims), std::end(kCpuHeadDims));
    caps.architectures = {"cpu"};
    for (OutputQuantKey key : kFusedKeys) caps.output_quant.emplace_back(to_string(key));
    caps.fold_prior_state = true;
    return caps;
  }
  for (const AttentionVariantKey& key : compiled_attention_variants()) {
    if (!takes(key.dtype)) continue;
    add_unique(caps.attention_dtypes, key.dtype);
    add_unique(caps.head_dims, {key.head_dim_qk, key.head_dim_v});
  }
  const std::string arch = build_info().cuda_arch;
  if (!arch.empty()) caps.architectures = {arch};
  if (!caps.attention_dtypes.empty()) {
    for (OutputQuantKey key : kFusedKeys) caps.output_quant.emplace_back(to_string(key));
    caps.fold_prior_state = true;
  }
  return caps;
}

}  // namespace

void check_backend(const BackendCapabilities& caps, const BackendRequirements& required,
                   Device device) {
  std::vector<std::string> missing;
  const auto& dtypes = caps.attention_dtypes;
  if (std::find(dtypes.begin(), dtypes.end(), required.attention_dtype) == dtypes.end()) {
    missing.push_back(concat("attention dtype ", dtype_name(required.attention_dtype)));
  }
  const std::pair<int, int> dims{required.head_dim_qk, required.head_dim_v};
  if (std::find(caps.head_dims.begin(), caps.head_dims.end(), dims) == caps.head_dims.end()) {
    missing.push_back(concat("head dims ", dims.first, "/", dims.second));
  }
  if (required.page_size < caps.min_page_size || required.page_size > caps.max_page_size) {
    missing.push_back(concat("page size ", required.page_size));
  }
  if (!required.output_quant.empty() &&
      std::find(caps.output_quant.begin(), caps.output_quant.end(), required.output_quant) ==
          caps.output_quant.end()) {
    missing.push_back(concat("fused output quantization ", required.output_quant));
  }
  if (required.prepare_prefill_qkv && !caps.prepare_prefill_qkv)
    missing.push_back("prepare_prefill_qkv");
  if (required.pack_prefix_chunk_kv && !caps.pack_prefix_chunk_kv)
    missing.push_back("pack_prefix_chunk_kv");
  const std::string arch = architecture_of(device);
  if (std::find(caps.architectures.begin(), caps.architectures.end(), arch) ==
      caps.architectures.end()) {
    missing.push_back(concat("architecture ", arch));
  }
  if (missing.empty()) return;
  throw Error(
      ErrorCategory::kUnsupported,
      concat(
          "attention backend '", caps.name, "' cannot serve this layer on ", device_text(device),
          ". Required: attention dtype ", dtype_name(required.attention_dtype), ", head dims ",
          required.head_dim_qk, "/", required.head_dim_v, ", page size ", required.page_size,
          required.output_quant.empty() ? ""
                                        : concat(", output quantization ", required.output_quant),
          required.prepare_prefill_qkv ? ", prepare_prefill_qkv" : "",
          required.pack_prefix_chunk_kv ? ", pack_prefix_chunk_kv" : "", ", architecture ", arch,
          ". Supported: attention dtypes ", join(caps.attention_dtypes, dtype_name), ", head dims ",
          join(caps.head_dims, [](const auto& d) { return concat(d.first, "/", d.second); }),
          ", page sizes ", caps.min_page_size, "-", caps.max_page_size, ", output quantization ",
          join(caps.output_quant), ", prepare_prefill_qkv ",
          caps.prepare_prefill_qkv ? "yes" : "no", ", pack_prefix_chunk_kv ",
          caps.pack_prefix_chunk_kv ? "yes" : "no", ", architectures ", join(caps.architectures),
          ". Missing: ", join(missing), "."));
}

void AttentionBackend::prepare_prefill_qkv(const PrepareQkvArgs&, CudaStream) const {
  throw Error(ErrorCategory::kUnsupported,
              concat("attention backend '", capabilities().name, "' has no prepare_prefill_qkv"));
}

void AttentionBackend::pack_prefix_chunk_kv(const MlaKvPackArgs&, CudaStream) const {
  throw Error(ErrorCategory::kUnsupported,
              concat("attention backend '", capabilities().name, "' has no pack_prefix_chunk_kv"));
}

std::unique_ptr<AttentionBackend> make_attention_backend(std::string_view name) {
  for (const BackendSpec& spec : kBackends) {
    if (spec.name == name) return std::make_unique<OpsBackend>(capabilities_of(spec));
  }
  throw Error(
      ErrorCategory::kInvalidArgument,
      concat("unknown attention backend '", name, "'; known: ", join(attention_backend_names())));
}

std::vector<std::string> attention_backend_names() {
  std::vector<std::string> names;
  for (const BackendSpec& spec : kBackends) names.emplace_back(spec.name);
  return names;
}

}  // namespace fp8mla
