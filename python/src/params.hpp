// The parameter kinds the bindings of fp8mla._C are written in, and the one helper that binds an
// op from a list of them (def_op; def_query for a metadata query). module.cpp binds the ops of the
// public headers with them, backend.cpp the attention backends' methods.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <variant>

#include "fp8mla/attention_backend.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_parallel.hpp"
#include "fp8mla/mla_prep.hpp"
#include "fp8mla/quantize.hpp"
#include "fp8mla/tensor_view.hpp"
#include "tensor_args.hpp"
#include "torch_cuda_context.hpp"

namespace fp8mla_python {

using fp8mla::Error;
using fp8mla::ErrorCategory;
using fp8mla::TensorView;

inline fp8mla::CudaStream to_stream(std::uintptr_t handle) {
  return reinterpret_cast<fp8mla::CudaStream>(handle);
}

inline bool is_number(nb::handle h) {
  return PyFloat_Check(h.ptr()) || (PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr()));
}

// ---- Parameters: how one Python argument becomes one C++ argument ------------------------------
//
// Each kind has `Py` (what nanobind converts the Python argument to), `arg()` (its nb::arg) and
// `convert(args, py)` (the C++ value). def_op below binds an op from a list of them.

// A tensor the op reads (In) or writes (Out); Optional: None gives an empty view, "not given".
enum class Access { kIn, kOut };
template <Access A, bool Optional>
struct Tensor {
  const char* name;
  using Py = nb::handle;
  auto arg() const {
    if constexpr (Optional) {
      return nb::arg(name).none();
    } else {
      return nb::arg(name);
    }
  }
  TensorView convert(Args& args, nb::handle py) const {
    if (Optional && py.is_none()) return TensorView();
    return A == Access::kIn ? args.input(py, name) : args.output(py, name);
  }
};
constexpr Tensor<Access::kIn, false> in(const char* name) {
  return {name};
}
constexpr Tensor<Access::kOut, false> out(const char* name) {
  return {name};
}
constexpr Tensor<Access::kIn, true> optional_in(const char* name) {
  return {name};
}
constexpr Tensor<Access::kOut, true> optional_out(const char* name) {
  return {name};
}

// A number or bool, converted by nanobind.
template <typename T>
struct Value {
  const char* name;
  using Py = T;
  auto arg() const { return nb::arg(name); }
  T convert(Args&, T py) const { return py; }
};
template <typename T>
constexpr Value<T> value(const char* name) {
  return {name};
}

// None or an integer, converted by nanobind.
struct OptionalInt {
  const char* name;
  using Py = std::optional<std::int64_t>;
  auto arg() const { return nb::arg(name).none(); }
  Py convert(Args&, Py py) const { return py; }
};

// A float, or a one-element f32 tensor read by the kernel (quantize_fp8's two overloads).
struct ScaleInv {
  const char* name;
  using Py = nb::handle;
  auto arg() const { return nb::arg(name); }
  std::variant<float, TensorView> convert(Args& args, nb::handle py) const {
    if (is_number(py)) return nb::cast<float>(py);
    return args.input(py, name);
  }
};

// An enum of the C++ API by name: Names<E>::kAll lists them.
template <typename E>
struct Names;
template <>
struct Names<fp8mla::Nvfp4ScaleLayout> {
  static constexpr std::pair<std::string_view, fp8mla::Nvfp4ScaleLayout> kAll[] = {
      {"swizzled", fp8mla::Nvfp4ScaleLayout::kSwizzled128x4},
      {"linear", fp8mla::Nvfp4ScaleLayout::kLinear}};
};
template <>
struct Names<fp8mla::RopeStyle> {
  static constexpr std::pair<std::string_view, fp8mla::RopeStyle> kAll[] = {
      {"interleaved", fp8mla::RopeStyle::kInterleaved}, {"neox", fp8mla::RopeStyle::kNeox}};
};
template <>
struct Names<fp8mla::VLayout> {
  static constexpr std::pair<std::string_view, fp8mla::VLayout> kAll[] = {
      {"token_major", fp8mla::VLayout::kTokenMajor}, {"transposed", fp8mla::VLayout::kTransposed}};
};

template <>
struct Names<fp8mla::DeviceType> {
  static constexpr std::pair<std::string_view, fp8mla::DeviceType> kAll[] = {
      {"cpu", fp8mla::DeviceType::kCPU}, {"cuda", fp8mla::DeviceType::kCUDA}};
};

template <typename E>
struct Choice {
  const char* name;
  using Py = std::string;
  auto arg() const { return nb::arg(name); }
  E convert(Args& args, const std::string& py) const {
    for (const auto& [spelling, e] : Names<E>::kAll) {
      if (spelling == py) return e;
    }
    std::string expected;
    const std::size_t count = std::size(Names<E>::kAll);
    for (std::size_t i = 0; i < count; ++i) {
      expected += fp8mla::concat(i == 0           ? ""
                                 : i + 1 == count ? " or "
                                                  : ", ",
                                 "'", Names<E>::kAll[i].first, "'");
    }
    throw Error(ErrorCategory::kInvalidArgument,
                fp8mla::concat(args.op(), ": expected ", name, " ", expected, ", got '", py, "'"));
  }
};
template <typename E>
constexpr Choice<E> choice(const char* name) {
  return {name};
}

// ---- One binding for every op ------------------------------------------------------------------

// Binds _C.<name>(params..., stream=0): converts the arguments in order (a bad one raises
// fp8mla.Error naming it), then calls fn(values..., stream) without the GIL; with torch's CUDA
// tensors, on torch's current stream (stream 0) and device, as torch's own ops run. `fn` is the C++
// op itself, or a lambda that puts the values into the op's argument struct.
template <typename Fn, typename... Params>
void def_op(nb::module_& m, const char* name, Fn fn, Params... params) {
  m.def(
      name,
      [name, fn, params...](typename Params::Py... py, std::uintptr_t stream) {
        Args args(name);
        // Braced initialization converts left to right.
        const std::tuple<decltype(params.convert(args, py))...> values{params.convert(args, py)...};
        // Torch's current stream and device for torch's CUDA tensors (torch_cuda_context.hpp).
        std::optional<TorchCudaCall> torch_cuda;
        if (args.torch_cuda_device() >= 0 && torch_cuda_context()) {
          torch_cuda.emplace(args.torch_cuda_device(), stream);
        }
        nb::gil_scoped_release release;
        std::apply([&](const auto&... v) { fn(v..., to_stream(stream)); }, values);
      },
      params.arg()..., nb::arg("stream") = 0);
}

// Binds _C.<name>(params...) for a query: it reads metadata only, so it takes no stream and
// keeps the GIL; returns what fn(values...) returns.
template <typename Fn, typename... Params>
void def_query(nb::module_& m, const char* name, Fn fn, Params... params) {
  m.def(
      name,
      [name, fn, params...](typename Params::Py... py) {
        Args args(name);
        const std::tuple<decltype(params.convert(args, py))...> values{params.convert(args, py)...};
        return std::apply(fn, values);
      },
      params.arg()...);
}

// `qk` with the latent cache write when `cache` is given; the write's other arguments (the latent
// named `kv_name`) without it are an error of `op`.
inline fp8mla::MlaRopeQuantizeArgs rope_quantize_args(
    const char* op, const char* kv_name, fp8mla::MlaRopeQuantizeArgs qk, const TensorView& cache,
    const TensorView& slot_mapping, float cache_scale_inv, const TensorView& error_flag,
    const TensorView& kv) {
  if (cache.data() != nullptr) {
    qk.cache_write = fp8mla::LatentCacheWrite{cache, slot_mapping, cache_scale_inv, error_flag};
    qk.kv_c = kv;
  } else if (kv.data() || slot_mapping.data() || error_flag.data()) {
    throw Error(ErrorCategory::kInvalidArgument,
                fp8mla::concat(op, ": `", kv_name,
                               "`, `slot_mapping` and `error_flag` belong to the latent cache "
                               "write: pass `cache` too (or none of them)"));
  }
  return qk;
}

// The attention backends (backend.cpp): the backend of `name`, made on first use (an unknown name
// raises make_attention_backend's error listing the known ones), and their bindings.
const fp8mla::AttentionBackend& backend_named(std::string_view name);
void def_backends(nb::module_& m);

// The MLA layer, its config and weights (layer.cpp).
void def_layer_bindings(nb::module_& m);

// An fp8mla::MlaCommunicator owned by its Python object (parallel.cpp binds it as
// fp8mla._C.MlaCommunicator). A type of this namespace for the reason MlaConfig is (layer.cpp).
struct Communicator {
  std::unique_ptr<fp8mla::MlaCommunicator> c;
};
// The communicators: the class, its collectives and the factories (parallel.cpp).
void def_parallel_bindings(nb::module_& m);

}  // namespace fp8mla_python
