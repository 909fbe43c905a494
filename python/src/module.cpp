// fp8mla._C — the nanobind module behind the Python package `fp8mla`.
//
// Bindings only convert: every tensor argument becomes an fp8mla::TensorView (pointer, shape,
// strides in elements, device, dtype; tensor_args.hpp says how: torch tensors read directly,
// other arrays through DLPack), and the C++ op does every check. fp8mla::Error becomes
// fp8mla.Error (InvalidArgumentError / UnsupportedError subclasses) with the same message. The
// GIL is released around every op.
//
// Every op is bound by one helper, def_op (params.hpp), from the list of its parameters in the C++
// API's order (def_quantize_ops, def_prep_ops and def_attention_ops at the end, one per public
// header: the table a new op or argument adds a row or an entry to, next to python/fp8mla/_ops.py).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <variant>

#include "fp8mla/attention.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_prep.hpp"
#include "fp8mla/output_quant.hpp"
#include "fp8mla/quantize.hpp"
#include "fp8mla/runtime_info.hpp"
#include "fp8mla/tensor_view.hpp"
#include "fp8mla/version.hpp"
#include "params.hpp"
#include "tensor_args.hpp"
#include "torch_tensors.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using fp8mla::DType;
using fp8mla::Error;
using fp8mla::ErrorCategory;
using fp8mla::TensorView;
using namespace fp8mla_python;

namespace {

// ---- Exceptions --------------------------------------------------------------------------------

PyObject* g_error = nullptr;             // fp8mla.Error(RuntimeError)
PyObject* g_invalid_argument = nullptr;  // fp8mla.InvalidArgumentError(Error, ValueError)
PyObject* g_unsupported = nullptr;       // fp8mla.UnsupportedError(Error, NotImplementedError)

PyObject* new_exception(const char* name, const char* doc, PyObject* bases) {
  PyObject* type = PyErr_NewExceptionWithDoc(name, doc, bases, nullptr);
  if (!type) throw nb::python_error();
  return type;
}

void create_exceptions(nb::module_& m) {
  g_error = new_exception(
      "fp8mla.Error",
      "An error reported by the fp8mla library. `category` is one of 'invalid-argument', "
      "'unsupported', 'out-of-range', 'cuda', 'io', 'internal'; `message` is the message without "
      "the category and source-location prefix that str() shows.",
      PyExc_RuntimeError);
  nb::object invalid_bases = nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_ValueError));
  g_invalid_argument = new_exception(
      "fp8mla.InvalidArgumentError",
      "fp8mla.Error for a bad argument (wrong dtype, shape, stride, device, value or index).",
      invalid_bases.ptr());
  nb::object unsupported_bases =
      nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_NotImplementedError));
  g_unsupported =
      new_exception("fp8mla.UnsupportedError",
                    "fp8mla.Error for a valid request this build or device cannot serve.",
                    unsupported_bases.ptr());
  m.attr("Error") = nb::handle(g_error);
  m.attr("InvalidArgumentError") = nb::handle(g_invalid_argument);
  m.attr("UnsupportedError") = nb::handle(g_unsupported);
}

void raise_error(const Error& e) {
  PyObject* type = g_error;
  switch (e.category()) {
    case ErrorCategory::kInvalidArgument:
    case ErrorCategory::kOutOfRange:
      type = g_invalid_argument;
      break;
    case ErrorCategory::kUnsupported:
      type = g_unsupported;
      break;
    default:
      break;
  }
  nb::object instance = nb::steal(PyObject_CallFunction(type, "s", e.what()));
  if (!instance.is_valid()) return;  // the Python error is already set
  instance.attr("category") = nb::str(std::string(fp8mla::category_name(e.category())).c_str());
  instance.attr("message") = nb::str(e.message().c_str());
  PyErr_SetObject(type, instance.ptr());
}

// None or (factor, original_max_position, beta_fast, beta_slow, mscale, mscale_all_dim); the
// Python layer maps the user's dict onto it.
using YarnTuple = std::tuple<double, std::int64_t, double, double, double, double>;

std::optional<fp8mla::YarnScaling> yarn_scaling(const std::optional<YarnTuple>& yarn) {
  if (!yarn) return std::nullopt;
  fp8mla::YarnScaling y;
  std::tie(y.factor, y.original_max_position, y.beta_fast, y.beta_slow, y.mscale,
           y.mscale_all_dim) = *yarn;
  return y;
}

struct Yarn {
  const char* name;
  using Py = std::optional<YarnTuple>;
  auto arg() const { return nb::arg(name).none(); }
  std::optional<fp8mla::YarnScaling> convert(Args&, const Py& py) const { return yarn_scaling(py); }
};

using fp8mla::CudaStream;

// ---- Quantization (fp8mla/quantize.hpp) ----
void def_quantize_ops(nb::module_& m) {
  def_op(
      m, "quantize_fp8",
      [](const TensorView& input, const TensorView& out,
         const std::variant<float, TensorView>& scale_inv, CudaStream stream) {
        std::visit([&](const auto& s) { fp8mla::quantize_fp8(input, out, s, stream); }, scale_inv);
      },
      in("input"), out("out"), ScaleInv{"scale_inv"});
  def_op(m, "quantize_fp8_dynamic", fp8mla::quantize_fp8_dynamic, in("input"), out("out"),
         out("scale"));
  def_op(
      m, "quantize_fp8_per_token_group",
      [](const TensorView& input, const TensorView& out, const TensorView& scales, int group_size,
         float eps, bool round_scale_to_pow2, CudaStream stream) {
        fp8mla::quantize_fp8_per_token_group(input, out, scales,
                                             {group_size, eps, round_scale_to_pow2}, stream);
      },
      in("input"), out("out"), out("scales"), value<int>("group_size"), value<float>("eps"),
      value<bool>("round_scale_to_pow2"));
  def_op(m, "quantize_nvfp4", fp8mla::quantize_nvfp4, in("input"), out("out"), out("block_scales"),
         in("global_scale"), choice<fp8mla::Nvfp4ScaleLayout>("layout"));
}

// ---- MLA prefill preparation (fp8mla/mla_prep.hpp) ----
void def_prep_ops(nb::module_& m) {
  def_op(
      m, "make_cos_sin_cache",
      [](const TensorView& cos_sin, int rope_dim, double theta,
         const std::optional<fp8mla::YarnScaling>& yarn, CudaStream stream) {
        fp8mla::make_cos_sin_cache(cos_sin, {rope_dim, theta, yarn}, stream);
      },
      out("cos_sin"), value<int>("rope_dim"), value<double>("theta"), Yarn{"yarn"});
  def_op(
      m, "mla_rope_quantize_fp8",
      [](const TensorView& q_nope, const TensorView& q_pe, const TensorView& k_nope,
         const TensorView& k_pe, const TensorView& positions, const TensorView& cos_sin,
         fp8mla::RopeStyle style, float q_scale_inv, float k_scale_inv, const TensorView& q_out,
         const TensorView& k_out, const TensorView& cache, const TensorView& slot_mapping,
         float cache_scale_inv, const TensorView& error_flag, const TensorView& kv_c,
         const TensorView& k_rope_out, CudaStream stream) {
        fp8mla::MlaRopeQuantizeArgs args =
            rope_quantize_args("mla_rope_quantize_fp8", "kv_c",
                               {q_nope, q_pe, k_nope, k_pe, positions, cos_sin, style, q_scale_inv,
                                k_scale_inv, q_out, k_out},
                               cache, slot_mapping, cache_scale_inv, error_flag, kv_c);
        args.k_rope_out = k_rope_out;
        fp8mla::mla_rope_quantize_fp8(args, stream);
      },
      in("q_nope"), in("q_pe"), in("k_nope"), in("k_pe"), in("positions"), in("cos_sin"),
      choice<fp8mla::RopeStyle>("style"), value<float>("q_scale_inv"), value<float>("k_scale_inv"),
      out("q_out"), out("k_out"), optional_out("cache"), optional_in("slot_mapping"),
      value<float>("cache_scale_inv"), optional_out("error_flag"), optional_in("kv_c"),
      optional_out("k_rope_out"));
  def_op(
      m, "mla_kv_cache_write",
      [](const TensorView& kv_c, const TensorView& k_pe, const TensorView& cache,
         const TensorView& slot_mapping, float scale_inv, const TensorView& error_flag,
         CudaStream stream) {
        fp8mla::mla_kv_cache_write(kv_c, k_pe, {cache, slot_mapping, scale_inv, error_flag},
                                   stream);
      },
      in("kv_c"), in("k_pe"), out("cache"), in("slot_mapping"), value<float>("scale_inv"),
      optional_out("error_flag"));
  def_op(m, "mla_kv_gather", fp8mla::mla_kv_gather, in("cache"), in("slots"), value<float>("scale"),
         out("kv_c_out"), out("k_pe_out"), optional_out("error_flag"));
  def_op(
      m, "mla_kv_pack_quantize_fp8",
      [](const TensorView& k_nope, const TensorView& k_pe, const TensorView& v, float k_scale_inv,
         float v_scale_inv, const TensorView& k_out, const TensorView& v_out,
         const TensorView& k_rope_out, fp8mla::VLayout v_layout, CudaStream stream) {
        fp8mla::mla_kv_pack_quantize_fp8(
            {k_nope, k_pe, v, k_scale_inv, v_scale_inv, k_out, v_out, v_layout, k_rope_out},
            stream);
      },
      in("k_nope"), in("k_pe"), in("v"), value<float>("k_scale_inv"), value<float>("v_scale_inv"),
      out("k_out"), out("v_out"), optional_out("k_rope_out"), choice<fp8mla::VLayout>("v_layout"));
  def_op(m, "mla_v_quantize_fp8", fp8mla::mla_v_quantize_fp8, in("v"), out("v_out"),
         value<float>("v_scale_inv"), choice<fp8mla::VLayout>("v_layout"));
}

// ---- Attention (fp8mla/attention.hpp) and the output quantization key (output_quant.hpp) ----
void def_attention_ops(nb::module_& m) {
  def_op(
      m, "prefill_attention",
      [](const TensorView& q, const TensorView& k, const TensorView& v,
         const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, int max_seqlen_q,
         int max_seqlen_k, float softmax_scale, bool causal, const TensorView& q_descale,
         const TensorView& k_descale, const TensorView& v_descale, const TensorView& out,
         const TensorView& lse, const TensorView& output_scale,
         const TensorView& output_block_scale, const TensorView& k_rope,
         const TensorView& prior_out, const TensorView& prior_lse, CudaStream stream) {
        fp8mla::prefill_attention(
            {q, k, k_rope, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
             causal, q_descale, k_descale, v_descale, out, lse, output_scale, output_block_scale,
             prior_out, prior_lse},
            stream);
      },
      in("q"), in("k"), in("v"), in("cu_seqlens_q"), in("cu_seqlens_k"), value<int>("max_seqlen_q"),
      value<int>("max_seqlen_k"), value<float>("softmax_scale"), value<bool>("causal"),
      optional_in("q_descale"), optional_in("k_descale"), optional_in("v_descale"), out("out"),
      optional_out("lse"), optional_in("output_scale"), optional_out("output_block_scale"),
      optional_in("k_rope"), optional_in("prior_out"), optional_in("prior_lse"));
  def_op(
      m, "merge_attention_states",
      [](const TensorView& o_a, const TensorView& lse_a, const TensorView& o_b,
         const TensorView& lse_b, const TensorView& out, const TensorView& out_lse,
         const TensorView& output_scale, const TensorView& output_block_scale,
         const TensorView& num_tokens, CudaStream stream) {
        fp8mla::merge_attention_states(o_a, lse_a, o_b, lse_b, out, out_lse, output_scale,
                                       output_block_scale, num_tokens, stream);
      },
      in("o_a"), in("lse_a"), in("o_b"), in("lse_b"), out("out"), out("out_lse"),
      optional_in("output_scale"), optional_out("output_block_scale"), optional_in("num_tokens"));

  // The output quantization key: None or the key's name.
  def_query(
      m, "detect_output_quant_key",
      [](const TensorView& output, const TensorView& output_scale,
         const TensorView& output_block_scale,
         std::optional<std::int64_t> output_dim) -> std::optional<std::string> {
        const fp8mla::OutputQuantKey key =
            fp8mla::detect_output_quant_key(output, output_scale, output_block_scale,
                                            output_dim.value_or(fp8mla::output_row_width(output)));
        if (key == fp8mla::OutputQuantKey::kNone) return std::nullopt;
        return std::string(fp8mla::to_string(key));
      },
      in("output"), optional_in("output_scale"), optional_in("output_block_scale"),
      OptionalInt{"output_dim"});
}

// A dict from keyword arguments: make_dict("a"_a = 1, "b"_a = 2).
template <typename... Kwargs>
nb::dict make_dict(Kwargs&&... kwargs) {
  const nb::handle dict_type(reinterpret_cast<PyObject*>(&PyDict_Type));
  return nb::cast<nb::dict>(dict_type(std::forward<Kwargs>(kwargs)...));
}

nb::dict yarn_defaults() {
  const fp8mla::YarnScaling y;
  return make_dict("factor"_a = y.factor, "original_max_position"_a = y.original_max_position,
                   "beta_fast"_a = y.beta_fast, "beta_slow"_a = y.beta_slow, "mscale"_a = y.mscale,
                   "mscale_all_dim"_a = y.mscale_all_dim);
}

double yarn_attention_factor(double factor, double mscale, double mscale_all_dim) {
  fp8mla::YarnScaling y;
  y.factor = factor;
  y.mscale = mscale;
  y.mscale_all_dim = mscale_all_dim;
  return fp8mla::yarn_attention_factor(y);
}

double softmax_mscale(const std::optional<YarnTuple>& yarn) {
  return fp8mla::softmax_mscale({fp8mla::kMlaRopeDim, 10000.0, yarn_scaling(yarn)});
}

nb::dict info() {
  const fp8mla::BuildInfo build = fp8mla::build_info();
  const fp8mla::CudaDevices cuda = fp8mla::cuda_devices();
  nb::list devices;
  for (const fp8mla::CudaDeviceInfo& dev : cuda.devices) {
    devices.append(make_dict("ordinal"_a = dev.ordinal, "name"_a = dev.name, "arch"_a = dev.arch,
                             "sm_count"_a = dev.sm_count, "l2_bytes"_a = dev.l2_bytes,
                             "global_memory_bytes"_a = dev.global_memory_bytes));
  }
  return make_dict("version"_a = build.version, "cuda"_a = build.cuda,
                   "cuda_arch"_a = build.cuda_arch, "cuda_version"_a = build.cuda_version,
                   "compiler"_a = build.compiler, "build_type"_a = build.build_type,
                   "devices"_a = devices, "devices_unavailable_reason"_a = cuda.unavailable_reason);
}

// (data_ptr, (DLPack code, bits, lanes), shape, strides, (device kind, index)), or None where the
// reader leaves the tensor to DLPack.
nb::object read_torch_tensor(nb::handle tensor, const std::string& reader) {
  if (reader != "shim" && reader != "attributes") {
    throw nb::value_error("reader: expected \"shim\" or \"attributes\"");
  }
  const std::optional<RawTensor> raw =
      read_torch("_read_torch_tensor", "tensor", tensor, reader.c_str());
  if (!raw) return nb::none();
  nb::list shape, strides;
  for (std::size_t d = 0; d < raw->ndim; ++d) {
    shape.append(raw->shape[d]);
    strides.append(raw->strides[d]);
  }
  return nb::make_tuple(
      reinterpret_cast<std::uintptr_t>(raw->data),
      nb::make_tuple(int(raw->dtype.code), int(raw->dtype.bits), int(raw->dtype.lanes)),
      nb::tuple(shape), nb::tuple(strides),
      nb::make_tuple(raw->device.is_cuda() ? "cuda" : "cpu", raw->device.index));
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "fp8mla C++ bindings (use the fp8mla package, not this module, directly)";
  create_exceptions(m);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      raise_error(e);
    }
  });

  m.attr("__version__") = fp8mla::kVersionString;
  m.def("info", &info, "Build and device information");
  def_quantize_ops(m);
  def_prep_ops(m);
  def_attention_ops(m);
  def_backends(m);
  def_parallel_bindings(m);
  def_layer_bindings(m);
  m.def("use_torch", &fp8mla_python::use_torch, nb::arg("torch"), nb::arg("output_dtypes"),
        "Reads torch tensors directly from now on (torch_ops.py calls it once)");
  m.def("torch_tensor_reader", &fp8mla_python::torch_tensor_reader,
        "How torch tensors are read: \"shim\", \"attributes\" or \"none\" (torch_tensors.hpp)");
  m.def("torch_allocator", &fp8mla_python::torch_allocator,
        "How outputs are allocated for torch: \"grouped\" (torch_empty_group), \"shim\" "
        "(torch_empty) or \"torch\"");
  m.def("torch_cuda_context", &fp8mla_python::torch_cuda_context,
        "Whether the ops resolve torch's current CUDA stream and device themselves "
        "(torch_cuda_context.hpp)");
  m.def("torch_empty_group", &fp8mla_python::torch_empty_group, nb::arg("specs"),
        "A call's outputs in one libtorch allocation, or None (torch_tensors.hpp)");
  m.def("torch_empty", &fp8mla_python::torch_empty, nb::arg("like"), nb::arg("dtype"),
        nb::arg("shape").none(), nb::arg("view_shape").none() = nb::none(),
        nb::arg("view_strides").none() = nb::none(),
        "A row-major tensor (or a view of one) from libtorch's allocator, or None "
        "(torch_tensors.hpp)");
  m.def("_read_torch_tensor", &read_torch_tensor, nb::arg("tensor"), nb::arg("reader"),
        "What a reader (\"shim\" / \"attributes\") sees of a torch tensor, for tests");

  m.attr("MLA_DIMS") =
      make_dict("nope"_a = fp8mla::kMlaNopeDim, "rope"_a = fp8mla::kMlaRopeDim,
                "qk"_a = fp8mla::kMlaQkDim, "v"_a = fp8mla::kMlaVDim,
                "kv_lora_rank"_a = fp8mla::kMlaKvLoraRank, "latent"_a = fp8mla::kMlaLatentDim);
  m.attr("YARN_DEFAULTS") = yarn_defaults();
  m.def("softmax_mscale", &softmax_mscale, nb::arg("yarn").none());
  m.def("yarn_attention_factor", &yarn_attention_factor, nb::arg("factor"), nb::arg("mscale"),
        nb::arg("mscale_all_dim"),
        "The factor the RoPE table's YaRN scales cos and sin by (fp8mla/mla_prep.hpp)");
}
