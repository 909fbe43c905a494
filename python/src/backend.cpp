// The attention backends in fp8mla._C (fp8mla/attention_backend.hpp). A backend is named by its
// name: the C++ backends are stateless, made once per name here, so the Python object
// (fp8mla.AttentionBackend) and the torch custom ops carry the name and the binding looks the
// backend up. Its hook and pack are bound like the ops (params.hpp), argument for argument.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fp8mla/attention_backend.hpp"
#include "params.hpp"

namespace fp8mla_python {

using namespace nb::literals;
using fp8mla::AttentionBackend;
using fp8mla::CudaStream;

// The dtypes of check_backend's requirements, by their Python names.
template <>
struct Names<fp8mla::DType> {
  static constexpr std::pair<std::string_view, fp8mla::DType> kAll[] = {
      {"e4m3", fp8mla::DType::kE4M3}, {"bf16", fp8mla::DType::kBF16}};
};

namespace {

template <typename E>
std::string name_of(E e) {
  for (const auto& [spelling, value] : Names<E>::kAll) {
    if (value == e) return std::string(spelling);
  }
  return "unknown";
}

// A backend argument: its name.
struct BackendName {
  const char* name;
  using Py = std::string;
  auto arg() const { return nb::arg(name); }
  const AttentionBackend* convert(Args&, const std::string& py) const { return &backend_named(py); }
};

nb::dict capabilities(const std::string& name) {
  const fp8mla::BackendCapabilities& caps = backend_named(name).capabilities();
  std::vector<std::string> dtypes;
  for (fp8mla::DType dtype : caps.attention_dtypes) dtypes.push_back(name_of(dtype));
  nb::dict d;
  d["name"] = caps.name;
  d["attention_dtypes"] = dtypes;
  d["head_dims"] = caps.head_dims;
  d["min_page_size"] = caps.min_page_size;
  d["max_page_size"] = caps.max_page_size;
  d["output_quant"] = caps.output_quant;
  d["architectures"] = caps.architectures;
  d["prepare_prefill_qkv"] = caps.prepare_prefill_qkv;
  d["pack_prefix_chunk_kv"] = caps.pack_prefix_chunk_kv;
  d["v_layout"] = name_of(caps.v_layout);
  d["fold_prior_state"] = caps.fold_prior_state;
  return d;
}

void def_check_backend(nb::module_& m) {
  def_query(
      m, "check_backend",
      [](const AttentionBackend* backend, fp8mla::DType attention_dtype, int head_dim_qk,
         int head_dim_v, int page_size, const std::string& output_quant, bool prepare_prefill_qkv,
         bool pack_prefix_chunk_kv, fp8mla::DeviceType device_type, int device_index) {
        fp8mla::check_backend(backend->capabilities(),
                              {attention_dtype, head_dim_qk, head_dim_v, page_size, output_quant,
                               prepare_prefill_qkv, pack_prefix_chunk_kv},
                              {device_type, device_index});
      },
      BackendName{"backend"}, choice<fp8mla::DType>("attention_dtype"), value<int>("head_dim_qk"),
      value<int>("head_dim_v"), value<int>("page_size"), value<std::string>("output_quant"),
      value<bool>("prepare_prefill_qkv"), value<bool>("pack_prefix_chunk_kv"),
      choice<fp8mla::DeviceType>("device_type"), value<int>("device_index"));
}

// The hook: PrepareQkvArgs in order, named as the Python function names them (SGLang's names:
// q and k_nope the no-RoPE parts, kv_a the latent).
void def_prepare_prefill_qkv(nb::module_& m) {
  def_op(
      m, "backend_prepare_prefill_qkv",
      [](const AttentionBackend* backend, const TensorView& q, const TensorView& q_pe,
         const TensorView& k_nope, const TensorView& k_pe, const TensorView& positions,
         const TensorView& cos_sin, fp8mla::RopeStyle style, float q_scale_inv, float k_scale_inv,
         const TensorView& q_out, const TensorView& k_out, const TensorView& cache,
         const TensorView& slot_mapping, float cache_scale_inv, const TensorView& error_flag,
         const TensorView& kv_a, const TensorView& k_rope_out, const TensorView& v,
         float v_scale_inv, const TensorView& v_out, CudaStream stream) {
        fp8mla::PrepareQkvArgs args;
        args.qk = rope_quantize_args("prepare_prefill_qkv", "kv_a",
                                     {q, q_pe, k_nope, k_pe, positions, cos_sin, style, q_scale_inv,
                                      k_scale_inv, q_out, k_out},
                                     cache, slot_mapping, cache_scale_inv, error_flag, kv_a);
        args.qk.k_rope_out = k_rope_out;
        args.v = v;
        args.v_scale_inv = v_scale_inv;
        args.v_out = v_out;
        backend->prepare_prefill_qkv(args, stream);
      },
      BackendName{"backend"}, in("q"), in("q_pe"), in("k_nope"), in("k_pe"), in("positions"),
      in("cos_sin"), choice<fp8mla::RopeStyle>("style"), value<float>("q_scale_inv"),
      value<float>("k_scale_inv"), out("q_out"), out("k_out"), optional_out("cache"),
      optional_in("slot_mapping"), value<float>("cache_scale_inv"), optional_out("error_flag"),
      optional_in("kv_a"), optional_out("k_rope_out"), in("v"), value<float>("v_scale_inv"),
      out("v_out"));
}

// The pack: MlaKvPackArgs in order, V in the backend's layout (the only one it packs).
void def_pack_prefix_chunk_kv(nb::module_& m) {
  def_op(
      m, "backend_pack_prefix_chunk_kv",
      [](const AttentionBackend* backend, const TensorView& k_nope, const TensorView& k_pe,
         const TensorView& v, float k_scale_inv, float v_scale_inv, const TensorView& k_out,
         const TensorView& v_out, const TensorView& k_rope_out, CudaStream stream) {
        backend->pack_prefix_chunk_kv({k_nope, k_pe, v, k_scale_inv, v_scale_inv, k_out, v_out,
                                       backend->capabilities().v_layout, k_rope_out},
                                      stream);
      },
      BackendName{"backend"}, in("k_nope"), in("k_pe"), in("v"), value<float>("k_scale_inv"),
      value<float>("v_scale_inv"), out("k_out"), out("v_out"), optional_out("k_rope_out"));
}

}  // namespace

const AttentionBackend& backend_named(std::string_view name) {
  static const std::vector<std::unique_ptr<AttentionBackend>> backends = [] {
    std::vector<std::unique_ptr<AttentionBackend>> all;
    for (const std::string& known : fp8mla::attention_backend_names()) {
      all.push_back(fp8mla::make_attention_backend(known));
    }
    return all;
  }();
  for (const auto& backend : backends) {
    if (backend->capabilities().name == name) return *backend;
  }
  (void)fp8mla::make_attention_backend(name);  // an unknown name: throws, listing the known ones
  throw Error(ErrorCategory::kInternal, fp8mla::concat("attention backend '", name, "' not made"));
}

void def_backends(nb::module_& m) {
  m.def("attention_backend_names", &fp8mla::attention_backend_names);
  m.def("backend_capabilities", &capabilities, nb::arg("backend"));
  def_check_backend(m);
  def_prepare_prefill_qkv(m);
  def_pack_prefix_chunk_kv(m);
}

}  // namespace fp8mla_python
