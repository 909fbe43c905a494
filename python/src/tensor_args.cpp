#include "tensor_args.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include "fp8mla/error.hpp"
#include "torch_tensors.hpp"

namespace fp8mla_python {

using fp8mla::DType;
using fp8mla::Error;
using fp8mla::ErrorCategory;
using fp8mla::TensorView;
using Code = nb::dlpack::dtype_code;

void fail(std::string_view op, std::string_view name, const std::string& message) {
  throw Error(ErrorCategory::kInvalidArgument, fp8mla::concat(op, ": `", name, "`: ", message));
}

namespace {

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
  static constexpr std::pair<Code, const char*> kCodes[] = {
      {Code::Int, "int"},
      {Code::UInt, "uint"},
      {Code::Float, "float"},
      {Code::Bfloat, "bfloat"},
      {Code::Complex, "complex"},
      {Code::Bool, "bool"},
      {Code::Float8_E4M3FN, "float8_e4m3fn"},
      {Code::Float8_E5M2, "float8_e5m2"},
      {Code::Float8_E8M0FNU, "float8_e8m0fnu"},
      {Code::Float4_E2M1FN, "float4_e2m1fn"},
  };
  for (const auto& [code, name] : kCodes) {
    if (Code(d.code) != code) continue;
    std::string s = fp8mla::concat(name, int(d.bits));
    if (d.lanes != 1) s += fp8mla::concat("x", int(d.lanes));
    return s;
  }
  return fp8mla::concat("DLPack dtype code ", int(d.code), " bits ", int(d.bits), " lanes ",
                        int(d.lanes));
}

// The fp8mla dtype of a DLPack dtype, if there is one.
std::optional<DType> fp8mla_dtype(nb::dlpack::dtype d) {
  // Bits per element; e2m1 comes as packed pairs: one byte per element of the [M, K/2] view.
  static constexpr struct {
    Code code;
    int bits;
    DType dtype;
  } kTypes[] = {
      {Code::Float, 16, DType::kF16},
      {Code::Float, 32, DType::kF32},
      {Code::Bfloat, 16, DType::kBF16},
      {Code::Int, 32, DType::kI32},
      {Code::Int, 64, DType::kI64},
      {Code::Float8_E4M3FN, 8, DType::kE4M3},
      {Code::Float8_E5M2, 8, DType::kE5M2},
      {Code::Float8_E8M0FNU, 8, DType::kUE8M0},
      {Code::Float4_E2M1FN, 8, DType::kE2M1x2},
  };
  if (d.lanes != 1 && !(Code(d.code) == Code::Float4_E2M1FN && d.bits == 4 && d.lanes == 2))
    return std::nullopt;
  for (const auto& t : kTypes) {
    if (Code(d.code) == t.code && d.bits * d.lanes == t.bits) return t.dtype;
  }
  return std::nullopt;
}

// Why an object did not convert to an array view, for the error: what numpy arrays most often
// lack (a writable buffer for an output, native byte order), else what was expected.
std::string unreadable_array(nb::handle obj, bool read_only) {
  if (nb::hasattr(obj, "flags") && nb::hasattr(obj, "dtype")) {
    const nb::object dtype = obj.attr("dtype");
    if (nb::hasattr(dtype, "isnative") && !nb::cast<bool>(dtype.attr("isnative"))) {
      return fp8mla::concat("expected an array in native byte order, got dtype ",
                            nb::str(dtype).c_str());
    }
    const nb::object flags = obj.attr("flags");
    if (!read_only && nb::hasattr(flags, "writeable") && !nb::cast<bool>(flags.attr("writeable"))) {
      return fp8mla::concat("expected a writable array (the op writes it), got a read-only ",
                            nb::inst_name(obj).c_str());
    }
  }
  return fp8mla::concat("expected an array that supports DLPack or the buffer protocol, got ",
                        nb::inst_name(obj).c_str());
}

}  // namespace

// ---- Args --------------------------------------------------------------------------------------

RawTensor Args::from_dlpack(nb::handle obj, const char* name, bool read_only) {
  RawTensor raw;
  const auto read = [&](auto&& array) {
    raw.dtype = array.dtype();
    const int device_type = array.device_type();
    if (device_type == nb::device::cpu::value || device_type == nb::device::cuda_host::value) {
      raw.device = fp8mla::Device::cpu();
    } else if (device_type == nb::device::cuda::value ||
               device_type == nb::device::cuda_managed::value) {
      raw.device = fp8mla::Device::cuda(array.device_id());
    } else {
      fail(op_, name,
           fp8mla::concat("expected a tensor on the CPU or a CUDA device, got DLPack device type ",
                          device_type));
    }
    raw.ndim = array.ndim();
    if (raw.ndim > std::size_t(fp8mla::kMaxDims)) {
      fail(op_, name,
           fp8mla::concat("expected at most ", fp8mla::kMaxDims, " dims, got ", raw.ndim));
    }
    for (std::size_t d = 0; d < raw.ndim; ++d) {
      raw.shape[d] = std::int64_t(array.shape(d));
      raw.strides[d] = array.stride(d);
    }
    raw.data = const_cast<void*>(static_cast<const void*>(array.data()));
  };
  const auto cast = [&](auto& array, auto& kept) {
    if (!nb::try_cast(obj, array, /*convert=*/false)) {
      fail(op_, name, unreadable_array(obj, read_only));
    }
    read(array);
    kept.push_back(std::move(array));
  };
  if (read_only) {
    nb::ndarray<nb::ro> array;
    cast(array, inputs_);
  } else {
    nb::ndarray<> array;
    cast(array, outputs_);
  }
  return raw;
}

TensorView Args::convert(nb::handle obj, const char* name, bool read_only) {
  nb::handle array_obj = obj;
  std::optional<DType> dtype_override;
  if (PyTuple_Check(obj.ptr())) {
    if (PyTuple_GET_SIZE(obj.ptr()) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(obj.ptr(), 1))) {
      fail(op_, name, "expected an array or a pair (array, dtype name)");
    }
    array_obj = PyTuple_GET_ITEM(obj.ptr(), 0);
    Py_ssize_t size = 0;
    const char* chars = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(obj.ptr(), 1), &size);
    if (!chars) throw nb::python_error();
    const std::string dtype_name(chars, std::size_t(size));
    dtype_override = parse_dtype(dtype_name);
    if (!dtype_override) fail(op_, name, fp8mla::concat("unknown dtype name '", dtype_name, "'"));
  }
  std::optional<RawTensor> torch = read_torch(op_, name, array_obj);
  RawTensor raw = torch ? *torch : from_dlpack(array_obj, name, read_only);
  if (torch && raw.device.is_cuda() && torch_cuda_device_ < 0)
    torch_cuda_device_ = raw.device.index;

  const nb::dlpack::dtype dl = raw.dtype;
  DType dtype;
  if (dtype_override) {
    const int bits = dl.bits * dl.lanes;
    const bool integer = Code(dl.code) == Code::Int || Code(dl.code) == Code::UInt;
    if (!(fp8mla_dtype(dl) == dtype_override) &&
        !(integer && bits == 8 * fp8mla::dtype_size(*dtype_override))) {
      fail(op_, name,
           fp8mla::concat("cannot view ", describe_dlpack_dtype(dl), " data as ",
                          fp8mla::dtype_name(*dtype_override),
                          " (a dtype override needs an integer array of the same element size)"));
    }
    dtype = *dtype_override;
  } else if (const std::optional<DType> native = fp8mla_dtype(dl)) {
    dtype = *native;
  } else {
    fail(op_, name,
         fp8mla::concat("dtype ", describe_dlpack_dtype(dl),
                        " has no fp8mla dtype (supported: bfloat16, float16, float32, int32, "
                        "int64, float8_e4m3fn, float8_e5m2, float8_e8m0fnu, float4_e2m1fn_x2; "
                        "uint8 arrays need an explicit dtype)"));
  }

  // An array without elements has no meaningful strides (numpy reports zeros): give it the
  // row-major ones, which every op's layout checks accept.
  if (std::find(raw.shape.begin(), raw.shape.begin() + raw.ndim, 0) !=
      raw.shape.begin() + raw.ndim) {
    std::int64_t stride = 1;
    for (std::size_t d = raw.ndim; d-- > 0;) {
      raw.strides[d] = stride;
      stride *= std::max<std::int64_t>(raw.shape[d], 1);
    }
  }
  try {
    return TensorView(raw.data, dtype, std::span<const std::int64_t>(raw.shape.data(), raw.ndim),
                      std::span<const std::int64_t>(raw.strides.data(), raw.ndim), raw.device);
  } catch (const fp8mla::Error& e) {
    fail(op_, name, e.message());  // negative strides, a view past 2^63 bytes: say whose
  }
}

}  // namespace fp8mla_python
