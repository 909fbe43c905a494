// fp8mla._C — the nanobind module behind the Python package `fp8mla`.
//
// Bindings only convert: every tensor argument arrives through DLPack (torch, numpy, cupy, jax,
// ...) as an nb::ndarray, becomes an fp8mla::TensorView (pointer, shape, strides in elements,
// device, dtype), and the C++ op does every check. A tensor argument is either an array or a
// pair (array, "dtype") naming the fp8mla dtype of an array whose framework has no such type (a
// uint8 view of float8 data, a uint16 view of numpy bfloat16). fp8mla::Error becomes fp8mla.Error
// (InvalidArgumentError / UnsupportedError subclasses) with the same message. The GIL is released
// around every op.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "fp8mla/attention.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_prep.hpp"
#include "fp8mla/quantize.hpp"
#include "fp8mla/runtime_info.hpp"
#include "fp8mla/tensor_view.hpp"
#include "fp8mla/version.hpp"

namespace nb = nanobind;
using fp8mla::DType;
using fp8mla::Error;
using fp8mla::ErrorCategory;
using fp8mla::TensorView;

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

// ---- Tensors -----------------------------------------------------------------------------------

[[noreturn]] void fail(std::string_view op, std::string_view name, const std::string& message) {
  throw Error(ErrorCategory::kInvalidArgument, fp8mla::concat(op, ": `", name, "`: ", message));
}

std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "bf16" || s == "bfloat16") return DType::kBF16;
  if (s == "f16" || s == "float16") return DType::kF16;
  if (s == "f32" || s == "float32") return DType::kF32;
  if (s == "e4m3" || s == "e4m3fn" || s == "float8_e4m3fn") return DType::kE4M3;
  if (s == "e5m2" || s == "float8_e5m2") return DType::kE5M2;
  if (s == "ue8m0" || s == "e8m0fnu" || s == "float8_e8m0fnu") return DType::kUE8M0;
  if (s == "e2m1x2" || s == "float4_e2m1fn_x2") return DType::kE2M1x2;
  if (s == "i32" || s == "int32") return DType::kI32;
  if (s == "i64" || s == "int64") return DType::kI64;
  return std::nullopt;
}

std::string describe_dlpack_dtype(nb::dlpack::dtype d) {
  using Code = nb::dlpack::dtype_code;
  const char* code = "code?";
  switch (Code(d.code)) {
    case Code::Int:
      code = "int";
      break;
    case Code::UInt:
      code = "uint";
      break;
    case Code::Float:
      code = "float";
      break;
    case Code::Bfloat:
      code = "bfloat";
      break;
    case Code::Complex:
      code = "complex";
      break;
    case Code::Bool:
      code = "bool";
      break;
    case Code::Float8_E4M3FN:
      code = "float8_e4m3fn";
      break;
    case Code::Float8_E5M2:
      code = "float8_e5m2";
      break;
    case Code::Float8_E8M0FNU:
      code = "float8_e8m0fnu";
      break;
    case Code::Float4_E2M1FN:
      code = "float4_e2m1fn";
      break;
    default:
      return fp8mla::concat("DLPack dtype code ", int(d.code), " bits ", int(d.bits), " lanes ",
                            int(d.lanes));
  }
  std::string s = fp8mla::concat(code, int(d.bits));
  if (d.lanes != 1) s += fp8mla::concat("x", int(d.lanes));
  return s;
}

// The fp8mla dtype of a DLPack dtype, if there is one.
std::optional<DType> from_dlpack(nb::dlpack::dtype d) {
  using Code = nb::dlpack::dtype_code;
  if (d.lanes != 1 && !(Code(d.code) == Code::Float4_E2M1FN && d.bits == 4 && d.lanes == 2))
    return std::nullopt;
  switch (Code(d.code)) {
    case Code::Float:
      if (d.bits == 16) return DType::kF16;
      if (d.bits == 32) return DType::kF32;
      break;
    case Code::Bfloat:
      if (d.bits == 16) return DType::kBF16;
      break;
    case Code::Int:
      if (d.bits == 32) return DType::kI32;
      if (d.bits == 64) return DType::kI64;
      break;
    case Code::Float8_E4M3FN:
      if (d.bits == 8) return DType::kE4M3;
      break;
    case Code::Float8_E5M2:
      if (d.bits == 8) return DType::kE5M2;
      break;
    case Code::Float8_E8M0FNU:
      if (d.bits == 8) return DType::kUE8M0;
      break;
    case Code::Float4_E2M1FN:  // packed pairs: one byte per element of the [M, K/2] view
      if (d.bits * d.lanes == 8) return DType::kE2M1x2;
      break;
    default:
      break;
  }
  return std::nullopt;
}

// Converts one tensor argument; keeps its ndarray alive for the duration of the call.
class Args {
 public:
  explicit Args(const char* op) : op_(op) {}

  TensorView input(nb::handle obj, const char* name) { return convert<nb::ro>(obj, name); }
  TensorView output(nb::handle obj, const char* name) { return convert<>(obj, name); }
  // None: an empty view (data == nullptr), which the ops read as "not given".
  TensorView optional_input(nb::handle obj, const char* name) {
    return obj.is_none() ? TensorView() : input(obj, name);
  }
  TensorView optional_output(nb::handle obj, const char* name) {
    return obj.is_none() ? TensorView() : output(obj, name);
  }

 private:
  template <typename... Flags>
  TensorView convert(nb::handle obj, const char* name) {
    using Array = nb::ndarray<Flags...>;
    nb::handle array_obj = obj;
    std::optional<DType> dtype_override;
    if (nb::isinstance<nb::tuple>(obj)) {
      nb::tuple pair = nb::borrow<nb::tuple>(obj);
      if (pair.size() != 2 || !nb::isinstance<nb::str>(pair[1])) {
        fail(op_, name, "expected an array or a pair (array, dtype name)");
      }
      array_obj = pair[0];
      const std::string dtype_name = nb::cast<std::string>(pair[1]);
      dtype_override = parse_dtype(dtype_name);
      if (!dtype_override) fail(op_, name, fp8mla::concat("unknown dtype name '", dtype_name, "'"));
    }
    Array array;
    if (!nb::try_cast<Array>(array_obj, array, /*convert=*/false)) {
      fail(op_, name,
           fp8mla::concat("expected an array that supports DLPack or the buffer protocol, got ",
                          nb::inst_name(array_obj).c_str()));
    }

    const nb::dlpack::dtype dl = array.dtype();
    DType dtype;
    if (dtype_override) {
      using Code = nb::dlpack::dtype_code;
      const int bits = dl.bits * dl.lanes;
      const bool raw = Code(dl.code) == Code::Int || Code(dl.code) == Code::UInt;
      const std::optional<DType> native = from_dlpack(dl);
      if (!(native == dtype_override) &&
          !(raw && bits == 8 * fp8mla::dtype_size(*dtype_override))) {
        fail(op_, name,
             fp8mla::concat("cannot view ", describe_dlpack_dtype(dl), " data as ",
                            fp8mla::dtype_name(*dtype_override),
                            " (a dtype override needs an integer array of the same element size)"));
      }
      dtype = *dtype_override;
    } else if (const std::optional<DType> native = from_dlpack(dl)) {
      dtype = *native;
    } else {
      fail(op_, name,
           fp8mla::concat("dtype ", describe_dlpack_dtype(dl),
                          " has no fp8mla dtype (supported: bfloat16, float16, float32, int32, "
                          "int64, float8_e4m3fn, float8_e5m2, float8_e8m0fnu, float4_e2m1fn_x2; "
                          "uint8 arrays need an explicit dtype)"));
    }

    fp8mla::Device device;
    const int device_type = array.device_type();
    if (device_type == nb::device::cpu::value || device_type == nb::device::cuda_host::value) {
      device = fp8mla::Device::cpu();
    } else if (device_type == nb::device::cuda::value ||
               device_type == nb::device::cuda_managed::value) {
      device = fp8mla::Device::cuda(array.device_id());
    } else {
      fail(op_, name,
           fp8mla::concat("expected a tensor on the CPU or a CUDA device, got DLPack device type ",
                          device_type));
    }

    const std::size_t ndim = array.ndim();
    if (ndim > std::size_t(fp8mla::kMaxDims)) {
      fail(op_, name, fp8mla::concat("expected at most ", fp8mla::kMaxDims, " dims, got ", ndim));
    }
    std::array<std::int64_t, fp8mla::kMaxDims> shape{}, strides{};
    bool empty = false;
    for (std::size_t d = 0; d < ndim; ++d) {
      shape[d] = std::int64_t(array.shape(d));
      strides[d] = array.stride(d);
      empty = empty || shape[d] == 0;
    }
    // An array without elements has no meaningful strides (numpy reports zeros): give it the
    // row-major ones, which every op's layout checks accept.
    if (empty) {
      std::int64_t stride = 1;
      for (std::size_t d = ndim; d-- > 0;) {
        strides[d] = stride;
        stride *= std::max<std::int64_t>(shape[d], 1);
      }
    }
    void* data = const_cast<void*>(static_cast<const void*>(array.data()));
    keep(std::move(array));
    return TensorView(data, dtype, std::span<const std::int64_t>(shape.data(), ndim),
                      std::span<const std::int64_t>(strides.data(), ndim), device);
  }

  void keep(nb::ndarray<nb::ro>&& a) { inputs_.push_back(std::move(a)); }
  void keep(nb::ndarray<>&& a) { outputs_.push_back(std::move(a)); }

  const char* op_;
  std::vector<nb::ndarray<nb::ro>> inputs_;
  std::vector<nb::ndarray<>> outputs_;
};

fp8mla::CudaStream to_stream(std::uintptr_t handle) {
  return reinterpret_cast<fp8mla::CudaStream>(handle);
}

bool is_number(nb::handle h) {
  return PyFloat_Check(h.ptr()) || (PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr()));
}

// ---- Ops ---------------------------------------------------------------------------------------

void quantize_fp8(nb::handle input, nb::handle out, nb::handle scale_inv, std::uintptr_t stream) {
  Args args("quantize_fp8");
  const TensorView x = args.input(input, "input");
  const TensorView o = args.output(out, "out");
  if (is_number(scale_inv)) {
    const float s = nb::cast<float>(scale_inv);
    nb::gil_scoped_release release;
    fp8mla::quantize_fp8(x, o, s, to_stream(stream));
  } else {
    const TensorView s = args.input(scale_inv, "scale_inv");
    nb::gil_scoped_release release;
    fp8mla::quantize_fp8(x, o, s, to_stream(stream));
  }
}

void quantize_fp8_dynamic(nb::handle input, nb::handle out, nb::handle scale,
                          std::uintptr_t stream) {
  Args args("quantize_fp8_dynamic");
  const TensorView x = args.input(input, "input");
  const TensorView o = args.output(out, "out");
  const TensorView s = args.output(scale, "scale");
  nb::gil_scoped_release release;
  fp8mla::quantize_fp8_dynamic(x, o, s, to_stream(stream));
}

void quantize_fp8_per_token_group(nb::handle input, nb::handle out, nb::handle scales,
                                  int group_size, float eps, bool round_scale_to_pow2,
                                  std::uintptr_t stream) {
  Args args("quantize_fp8_per_token_group");
  const TensorView x = args.input(input, "input");
  const TensorView o = args.output(out, "out");
  const TensorView s = args.output(scales, "scales");
  fp8mla::GroupQuantOptions options;
  options.group_size = group_size;
  options.eps = eps;
  options.round_scale_to_pow2 = round_scale_to_pow2;
  nb::gil_scoped_release release;
  fp8mla::quantize_fp8_per_token_group(x, o, s, options, to_stream(stream));
}

void quantize_nvfp4(nb::handle input, nb::handle out, nb::handle block_scales,
                    nb::handle global_scale, const std::string& layout, std::uintptr_t stream) {
  Args args("quantize_nvfp4");
  fp8mla::Nvfp4ScaleLayout scale_layout;
  if (layout == "swizzled") {
    scale_layout = fp8mla::Nvfp4ScaleLayout::kSwizzled128x4;
  } else if (layout == "linear") {
    scale_layout = fp8mla::Nvfp4ScaleLayout::kLinear;
  } else {
    throw Error(ErrorCategory::kInvalidArgument,
                fp8mla::concat("quantize_nvfp4: expected layout 'swizzled' or 'linear', got '",
                               layout, "'"));
  }
  const TensorView x = args.input(input, "input");
  const TensorView o = args.output(out, "out");
  const TensorView bs = args.output(block_scales, "block_scales");
  const TensorView gs = args.input(global_scale, "global_scale");
  nb::gil_scoped_release release;
  fp8mla::quantize_nvfp4(x, o, bs, gs, scale_layout, to_stream(stream));
}

// ---- MLA prefill preparation (fp8mla/mla_prep.hpp) ---------------------------------------------

// (factor, original_max_position, beta_fast, beta_slow, mscale, mscale_all_dim); the Python layer
// maps the user's dict onto it.
using YarnTuple = std::tuple<double, std::int64_t, double, double, double, double>;

fp8mla::RopeConfig rope_config(int rope_dim, double theta, const std::optional<YarnTuple>& yarn) {
  fp8mla::RopeConfig config;
  config.rope_dim = rope_dim;
  config.theta = theta;
  if (yarn) {
    fp8mla::YarnScaling y;
    std::tie(y.factor, y.original_max_position, y.beta_fast, y.beta_slow, y.mscale,
             y.mscale_all_dim) = *yarn;
    config.yarn = y;
  }
  return config;
}

nb::dict yarn_defaults() {
  const fp8mla::YarnScaling y;
  nb::dict d;
  d["factor"] = y.factor;
  d["original_max_position"] = y.original_max_position;
  d["beta_fast"] = y.beta_fast;
  d["beta_slow"] = y.beta_slow;
  d["mscale"] = y.mscale;
  d["mscale_all_dim"] = y.mscale_all_dim;
  return d;
}

void make_cos_sin_cache(nb::handle cos_sin, int rope_dim, double theta,
                        const std::optional<YarnTuple>& yarn, std::uintptr_t stream) {
  Args args("make_cos_sin_cache");
  const TensorView out = args.output(cos_sin, "cos_sin");
  const fp8mla::RopeConfig config = rope_config(rope_dim, theta, yarn);
  nb::gil_scoped_release release;
  fp8mla::make_cos_sin_cache(out, config, to_stream(stream));
}

double softmax_mscale(const std::optional<YarnTuple>& yarn) {
  return fp8mla::softmax_mscale(rope_config(fp8mla::kMlaRopeDim, 10000.0, yarn));
}

fp8mla::RopeStyle parse_rope_style(const std::string& style) {
  if (style == "interleaved") return fp8mla::RopeStyle::kInterleaved;
  if (style == "neox") return fp8mla::RopeStyle::kNeox;
  throw Error(ErrorCategory::kInvalidArgument,
              fp8mla::concat("mla_rope_quantize_fp8: expected style 'interleaved' or 'neox', got '",
                             style, "'"));
}

void mla_rope_quantize_fp8(nb::handle q_nope, nb::handle q_pe, nb::handle k_nope, nb::handle k_pe,
                           nb::handle positions, nb::handle cos_sin, const std::string& style,
                           float q_scale_inv, float k_scale_inv, nb::handle q_out, nb::handle k_out,
                           nb::handle kv_c, nb::handle cache, nb::handle slot_mapping,
                           float cache_scale_inv, nb::handle error_flag, std::uintptr_t stream) {
  Args args("mla_rope_quantize_fp8");
  fp8mla::MlaRopeQuantizeArgs a;
  a.q_nope = args.input(q_nope, "q_nope");
  a.q_pe = args.input(q_pe, "q_pe");
  a.k_nope = args.input(k_nope, "k_nope");
  a.k_pe = args.input(k_pe, "k_pe");
  a.positions = args.input(positions, "positions");
  a.cos_sin = args.input(cos_sin, "cos_sin");
  a.style = parse_rope_style(style);
  a.q_scale_inv = q_scale_inv;
  a.k_scale_inv = k_scale_inv;
  a.q_out = args.output(q_out, "q_out");
  a.k_out = args.output(k_out, "k_out");
  if (!cache.is_none()) {
    fp8mla::LatentCacheWrite w;
    w.cache = args.output(cache, "cache");
    w.slot_mapping = args.optional_input(slot_mapping, "slot_mapping");
    w.scale_inv = cache_scale_inv;
    w.error_flag = args.optional_output(error_flag, "error_flag");
    a.cache_write = w;
    a.kv_c = args.optional_input(kv_c, "kv_c");
  } else if (!kv_c.is_none() || !slot_mapping.is_none() || !error_flag.is_none()) {
    throw Error(ErrorCategory::kInvalidArgument,
                "mla_rope_quantize_fp8: `kv_c`, `slot_mapping` and `error_flag` belong to the "
                "latent cache write: pass `cache` too (or none of them)");
  }
  nb::gil_scoped_release release;
  fp8mla::mla_rope_quantize_fp8(a, to_stream(stream));
}

void mla_kv_cache_write(nb::handle kv_c, nb::handle k_pe, nb::handle cache, nb::handle slot_mapping,
                        float scale_inv, nb::handle error_flag, std::uintptr_t stream) {
  Args args("mla_kv_cache_write");
  const TensorView c = args.input(kv_c, "kv_c");
  const TensorView pe = args.input(k_pe, "k_pe");
  fp8mla::LatentCacheWrite w;
  w.cache = args.output(cache, "cache");
  w.slot_mapping = args.input(slot_mapping, "slot_mapping");
  w.scale_inv = scale_inv;
  w.error_flag = args.optional_output(error_flag, "error_flag");
  nb::gil_scoped_release release;
  fp8mla::mla_kv_cache_write(c, pe, w, to_stream(stream));
}

void mla_kv_gather(nb::handle cache, nb::handle slots, float scale, nb::handle kv_c_out,
                   nb::handle k_pe_out, nb::handle error_flag, std::uintptr_t stream) {
  Args args("mla_kv_gather");
  const TensorView c = args.input(cache, "cache");
  const TensorView s = args.input(slots, "slots");
  const TensorView kv = args.output(kv_c_out, "kv_c_out");
  const TensorView pe = args.output(k_pe_out, "k_pe_out");
  const TensorView flag = args.optional_output(error_flag, "error_flag");
  nb::gil_scoped_release release;
  fp8mla::mla_kv_gather(c, s, scale, kv, pe, flag, to_stream(stream));
}

fp8mla::VLayout parse_v_layout(std::string_view op, const std::string& layout) {
  if (layout == "token_major") return fp8mla::VLayout::kTokenMajor;
  if (layout == "transposed") return fp8mla::VLayout::kTransposed;
  throw Error(
      ErrorCategory::kInvalidArgument,
      fp8mla::concat(op, ": expected v_layout 'token_major' or 'transposed', got '", layout, "'"));
}

void mla_kv_pack_quantize_fp8(nb::handle k_nope, nb::handle k_pe, nb::handle v, float k_scale_inv,
                              float v_scale_inv, nb::handle k_out, nb::handle v_out,
                              const std::string& v_layout, std::uintptr_t stream) {
  Args args("mla_kv_pack_quantize_fp8");
  fp8mla::MlaKvPackArgs a;
  a.k_nope = args.input(k_nope, "k_nope");
  a.k_pe = args.input(k_pe, "k_pe");
  a.v = args.input(v, "v");
  a.k_scale_inv = k_scale_inv;
  a.v_scale_inv = v_scale_inv;
  a.k_out = args.output(k_out, "k_out");
  a.v_out = args.output(v_out, "v_out");
  a.v_layout = parse_v_layout("mla_kv_pack_quantize_fp8", v_layout);
  nb::gil_scoped_release release;
  fp8mla::mla_kv_pack_quantize_fp8(a, to_stream(stream));
}

void mla_v_quantize_fp8(nb::handle v, float v_scale_inv, nb::handle v_out,
                        const std::string& v_layout, std::uintptr_t stream) {
  Args args("mla_v_quantize_fp8");
  const TensorView x = args.input(v, "v");
  const TensorView o = args.output(v_out, "v_out");
  const fp8mla::VLayout layout = parse_v_layout("mla_v_quantize_fp8", v_layout);
  nb::gil_scoped_release release;
  fp8mla::mla_v_quantize_fp8(x, o, v_scale_inv, layout, to_stream(stream));
}

// ---- Attention (fp8mla/attention.hpp) -------------------------------------------------------

void prefill_attention(nb::handle q, nb::handle k, nb::handle v, nb::handle cu_seqlens_q,
                       nb::handle cu_seqlens_k, int max_seqlen_q, int max_seqlen_k,
                       float softmax_scale, bool causal, nb::handle q_descale, nb::handle k_descale,
                       nb::handle v_descale, nb::handle out, nb::handle lse,
                       std::uintptr_t stream) {
  Args args("prefill_attention");
  fp8mla::PrefillAttentionArgs a;
  a.q = args.input(q, "q");
  a.k = args.input(k, "k");
  a.v = args.input(v, "v");
  a.cu_seqlens_q = args.input(cu_seqlens_q, "cu_seqlens_q");
  a.cu_seqlens_k = args.input(cu_seqlens_k, "cu_seqlens_k");
  a.max_seqlen_q = max_seqlen_q;
  a.max_seqlen_k = max_seqlen_k;
  a.softmax_scale = softmax_scale;
  a.causal = causal;
  a.q_descale = args.optional_input(q_descale, "q_descale");
  a.k_descale = args.optional_input(k_descale, "k_descale");
  a.v_descale = args.optional_input(v_descale, "v_descale");
  a.out = args.output(out, "out");
  a.lse = args.optional_output(lse, "lse");
  nb::gil_scoped_release release;
  fp8mla::prefill_attention(a, to_stream(stream));
}

void merge_attention_states(nb::handle o_a, nb::handle lse_a, nb::handle o_b, nb::handle lse_b,
                            nb::handle out, nb::handle out_lse, std::uintptr_t stream) {
  Args args("merge_attention_states");
  const TensorView oa = args.input(o_a, "o_a");
  const TensorView la = args.input(lse_a, "lse_a");
  const TensorView ob = args.input(o_b, "o_b");
  const TensorView lb = args.input(lse_b, "lse_b");
  const TensorView o = args.output(out, "out");
  const TensorView l = args.output(out_lse, "out_lse");
  nb::gil_scoped_release release;
  fp8mla::merge_attention_states(oa, la, ob, lb, o, l, to_stream(stream));
}

nb::dict info() {
  const fp8mla::BuildInfo build = fp8mla::build_info();
  nb::dict d;
  d["version"] = build.version;
  d["cuda"] = build.cuda;
  d["cuda_arch"] = build.cuda_arch;
  d["cuda_version"] = build.cuda_version;
  d["compiler"] = build.compiler;
  d["build_type"] = build.build_type;
  const fp8mla::CudaDevices cuda = fp8mla::cuda_devices();
  nb::list devices;
  for (const fp8mla::CudaDeviceInfo& dev : cuda.devices) {
    nb::dict e;
    e["ordinal"] = dev.ordinal;
    e["name"] = dev.name;
    e["arch"] = dev.arch;
    e["sm_count"] = dev.sm_count;
    e["l2_bytes"] = dev.l2_bytes;
    e["global_memory_bytes"] = dev.global_memory_bytes;
    devices.append(e);
  }
  d["devices"] = devices;
  d["devices_unavailable_reason"] = cuda.unavailable_reason;
  return d;
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
  m.def("prefill_attention", &prefill_attention, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"), nb::arg("max_seqlen_q"),
        nb::arg("max_seqlen_k"), nb::arg("softmax_scale"), nb::arg("causal"),
        nb::arg("q_descale").none(), nb::arg("k_descale").none(), nb::arg("v_descale").none(),
        nb::arg("out"), nb::arg("lse").none(), nb::arg("stream"));
  m.def("merge_attention_states", &merge_attention_states, nb::arg("o_a"), nb::arg("lse_a"),
        nb::arg("o_b"), nb::arg("lse_b"), nb::arg("out"), nb::arg("out_lse"), nb::arg("stream"));
  m.def("quantize_fp8", &quantize_fp8, nb::arg("input"), nb::arg("out"), nb::arg("scale_inv"),
        nb::arg("stream") = 0);
  m.def("quantize_fp8_dynamic", &quantize_fp8_dynamic, nb::arg("input"), nb::arg("out"),
        nb::arg("scale"), nb::arg("stream") = 0);
  m.def("quantize_fp8_per_token_group", &quantize_fp8_per_token_group, nb::arg("input"),
        nb::arg("out"), nb::arg("scales"), nb::arg("group_size"), nb::arg("eps"),
        nb::arg("round_scale_to_pow2"), nb::arg("stream") = 0);
  m.def("quantize_nvfp4", &quantize_nvfp4, nb::arg("input"), nb::arg("out"),
        nb::arg("block_scales"), nb::arg("global_scale"), nb::arg("layout"), nb::arg("stream") = 0);

  m.attr("MLA_DIMS") = [] {
    nb::dict d;
    d["nope"] = fp8mla::kMlaNopeDim;
    d["rope"] = fp8mla::kMlaRopeDim;
    d["qk"] = fp8mla::kMlaQkDim;
    d["v"] = fp8mla::kMlaVDim;
    d["kv_lora_rank"] = fp8mla::kMlaKvLoraRank;
    d["latent"] = fp8mla::kMlaLatentDim;
    return d;
  }();
  m.attr("YARN_DEFAULTS") = yarn_defaults();
  m.def("make_cos_sin_cache", &make_cos_sin_cache, nb::arg("cos_sin"), nb::arg("rope_dim"),
        nb::arg("theta"), nb::arg("yarn").none(), nb::arg("stream") = 0);
  m.def("softmax_mscale", &softmax_mscale, nb::arg("yarn").none());
  m.def("mla_rope_quantize_fp8", &mla_rope_quantize_fp8, nb::arg("q_nope"), nb::arg("q_pe"),
        nb::arg("k_nope"), nb::arg("k_pe"), nb::arg("positions"), nb::arg("cos_sin"),
        nb::arg("style"), nb::arg("q_scale_inv"), nb::arg("k_scale_inv"), nb::arg("q_out"),
        nb::arg("k_out"), nb::arg("kv_c").none(), nb::arg("cache").none(),
        nb::arg("slot_mapping").none(), nb::arg("cache_scale_inv"), nb::arg("error_flag").none(),
        nb::arg("stream") = 0);
  m.def("mla_kv_cache_write", &mla_kv_cache_write, nb::arg("kv_c"), nb::arg("k_pe"),
        nb::arg("cache"), nb::arg("slot_mapping"), nb::arg("scale_inv"),
        nb::arg("error_flag").none(), nb::arg("stream") = 0);
  m.def("mla_kv_gather", &mla_kv_gather, nb::arg("cache"), nb::arg("slots"), nb::arg("scale"),
        nb::arg("kv_c_out"), nb::arg("k_pe_out"), nb::arg("error_flag").none(),
        nb::arg("stream") = 0);
  m.def("mla_kv_pack_quantize_fp8", &mla_kv_pack_quantize_fp8, nb::arg("k_nope"), nb::arg("k_pe"),
        nb::arg("v"), nb::arg("k_scale_inv"), nb::arg("v_scale_inv"), nb::arg("k_out"),
        nb::arg("v_out"), nb::arg("v_layout") = "token_major", nb::arg("stream") = 0);
  m.def("mla_v_quantize_fp8", &mla_v_quantize_fp8, nb::arg("v"), nb::arg("v_scale_inv"),
        nb::arg("v_out"), nb::arg("v_layout") = "token_major", nb::arg("stream") = 0);
}
