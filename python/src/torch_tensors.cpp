#include "torch_tensors.hpp"

#include <dlfcn.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <string_view>
#include <type_traits>
#include <vector>

#include "fp8mla/error.hpp"
#include "torch_cuda_context.hpp"

namespace fp8mla_python {
namespace {

using Code = nb::dlpack::dtype_code;

// torch's dtypes by attribute name, as its DLPack export describes them.
constexpr struct {
  const char* name;
  nb::dlpack::dtype dtype;
} kTorchDtypes[] = {
    {"bfloat16", {std::uint8_t(Code::Bfloat), 16, 1}},
    {"float16", {std::uint8_t(Code::Float), 16, 1}},
    {"float32", {std::uint8_t(Code::Float), 32, 1}},
    {"float64", {std::uint8_t(Code::Float), 64, 1}},
    {"int8", {std::uint8_t(Code::Int), 8, 1}},
    {"int16", {std::uint8_t(Code::Int), 16, 1}},
    {"int32", {std::uint8_t(Code::Int), 32, 1}},
    {"int64", {std::uint8_t(Code::Int), 64, 1}},
    {"uint8", {std::uint8_t(Code::UInt), 8, 1}},
    {"uint16", {std::uint8_t(Code::UInt), 16, 1}},
    {"bool", {std::uint8_t(Code::Bool), 8, 1}},
    {"float8_e4m3fn", {std::uint8_t(Code::Float8_E4M3FN), 8, 1}},
    {"float8_e5m2", {std::uint8_t(Code::Float8_E5M2), 8, 1}},
    {"float8_e8m0fnu", {std::uint8_t(Code::Float8_E8M0FNU), 8, 1}},
    {"float4_e2m1fn_x2", {std::uint8_t(Code::Float4_E2M1FN), 4, 2}},
};
constexpr std::size_t kDtypeCount = std::size(kTorchDtypes);

// One attribute read of a tensor: torch.Tensor's own descriptor, called directly for a tensor of
// exactly that type (no attribute lookup), or the attribute by name for a subclass.
struct Attribute {
  PyObject* name = nullptr;
  PyObject* descriptor = nullptr;
  bool method = false;  // data_ptr(), stride(), get_device(); otherwise a property

  nb::object read(PyObject* obj, bool exact) const {
    PyObject* result;
    if (exact && method) {
      result = PyObject_Vectorcall(descriptor, &obj, 1, nullptr);
    } else if (exact) {
      result = Py_TYPE(descriptor)->tp_descr_get(descriptor, obj, (PyObject*)Py_TYPE(obj));
    } else {
      result = method ? PyObject_CallMethodNoArgs(obj, name) : PyObject_GetAttr(obj, name);
    }
    if (!result) throw nb::python_error();
    return nb::steal(result);
  }
};

Attribute attribute(nb::handle tensor_type, const char* name, bool method) {
  Attribute a;
  a.name = PyUnicode_InternFromString(name);
  if (!a.name) throw nb::python_error();
  a.descriptor = PyObject_GetAttr(tensor_type.ptr(), a.name);
  if (!a.descriptor) throw nb::python_error();
  a.method = method;
  if (!method && !Py_TYPE(a.descriptor)->tp_descr_get) {
    throw nb::type_error(fp8mla::concat("torch.Tensor.", name, " is not a property").c_str());
  }
  return a;
}

// The shim functions the "shim" reader calls (torch/csrc/inductor/aoti_torch/c/shim.h: a handle
// is an at::Tensor*, the result 0 on success).
struct Shim {
  using Handle = void*;
  using Result = std::int32_t;
  Result (*data_ptr)(Handle, void**) = nullptr;
  Result (*dim)(Handle, std::int64_t*) = nullptr;
  Result (*sizes)(Handle, std::int64_t**) = nullptr;
  Result (*strides)(Handle, std::int64_t**) = nullptr;
  Result (*dtype)(Handle, std::int32_t*) = nullptr;
  Result (*device_type)(Handle, std::int32_t*) = nullptr;
  Result (*device_index)(Handle, std::int32_t*) = nullptr;
  std::int32_t cpu = -1, cuda = -1;  // device type codes
  // torch's ScalarType code -> 1 + index into kTorchDtypes (0: a dtype fp8mla does not read).
  std::array<std::uint8_t, 256> dtype_of_code{};
};

// What torch_empty calls: the shim's allocation (through libtorch's allocator for the device, on
// torch's current stream) and torch's own wrapper of a tensor as a Python object, exported by
// libtorch_python (`THPVariable_Wrap(const at::TensorBase&)`; a handle points at an at::Tensor,
// whose base is that TensorBase).
struct Allocator {
  Shim::Result (*empty_strided)(std::int64_t, const std::int64_t*, const std::int64_t*,
                                std::int32_t, std::int32_t, std::int32_t, Shim::Handle*) = nullptr;
  Shim::Result (*delete_tensor)(Shim::Handle) = nullptr;
  Shim::Result (*reinterpret)(Shim::Handle, std::int64_t, const std::int64_t*, const std::int64_t*,
                              std::int64_t, Shim::Handle*) = nullptr;
  PyObject* (*wrap)(const void*) = nullptr;
  std::array<std::int32_t, kDtypeCount> code{};  // torch's ScalarType code of kTorchDtypes[i]
  // For torch_empty_group: the dtype view of an allocation (the shim's generated functions are
  // per device type; null where that library is not loaded).
  Shim::Result (*view_dtype_cpu)(Shim::Handle, std::int32_t, Shim::Handle*) = nullptr;
  Shim::Result (*view_dtype_cuda)(Shim::Handle, std::int32_t, Shim::Handle*) = nullptr;
  // The output dtypes by fp8mla name (torch_output_dtypes): name -> index into kTorchDtypes.
  std::vector<std::pair<PyObject*, std::size_t>> names;
};

// Set once by use_torch, then read-only; the references live as long as the process.
struct Torch {
  PyTypeObject* tensor_type = nullptr;
  PyObject* dtypes[kDtypeCount] = {};  // nullptr where this torch lacks the dtype
  Attribute data_ptr, shape, stride, dtype, is_cuda, is_cpu, get_device, cdata;
  Shim shim;
  Allocator allocator;
  bool use_shim = false;
  bool use_allocator = false;
  bool use_group = false;  // torch_empty_group allocates (use_allocator and its own check)
  bool ready = false;
} g_torch;

void check_ndim(const char* op, const char* name, std::int64_t ndim) {
  if (ndim > fp8mla::kMaxDims) {
    fail(op, name, fp8mla::concat("expected at most ", fp8mla::kMaxDims, " dims, got ", ndim));
  }
}

std::size_t read_dims(const char* op, const char* name, nb::handle tuple, std::int64_t* out) {
  if (!PyTuple_Check(tuple.ptr())) fail(op, name, "torch returned a shape that is not a tuple");
  const std::size_t ndim = std::size_t(PyTuple_GET_SIZE(tuple.ptr()));
  check_ndim(op, name, std::int64_t(ndim));
  for (std::size_t d = 0; d < ndim; ++d) {
    out[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple.ptr(), Py_ssize_t(d)));
  }
  if (PyErr_Occurred()) throw nb::python_error();
  return ndim;
}

std::optional<RawTensor> read_by_attributes(const char* op, const char* name, PyObject* obj,
                                            bool exact) {
  const Torch& t = g_torch;
  RawTensor raw;
  if (t.is_cuda.read(obj, exact).ptr() == Py_True) {
    raw.device = fp8mla::Device::cuda(int(PyLong_AsLong(t.get_device.read(obj, exact).ptr())));
  } else if (t.is_cpu.read(obj, exact).ptr() != Py_True) {
    return std::nullopt;
  }
  const nb::object dtype = t.dtype.read(obj, exact);
  const auto* found = std::find(std::begin(t.dtypes), std::end(t.dtypes), dtype.ptr());
  if (found == std::end(t.dtypes)) return std::nullopt;
  raw.dtype = kTorchDtypes[found - std::begin(t.dtypes)].dtype;
  raw.data = PyLong_AsVoidPtr(t.data_ptr.read(obj, exact).ptr());
  if (PyErr_Occurred()) throw nb::python_error();
  raw.ndim = read_dims(op, name, t.shape.read(obj, exact), raw.shape.data());
  const std::size_t stride_dims =
      read_dims(op, name, t.stride.read(obj, exact), raw.strides.data());
  if (stride_dims != raw.ndim) fail(op, name, "torch returned strides that do not match the shape");
  return raw;
}

enum class ShimRead { kRead, kNotFp8mla, kFailed };

// An exact torch.Tensor through the shim. kFailed (a call returned an error, e.g. a sparse
// tensor's strides): the attributes say what is wrong instead.
ShimRead read_by_shim(const char* op, const char* name, PyObject* obj, RawTensor& raw) {
  const Torch& t = g_torch;
  const Shim& s = t.shim;
  void* impl = PyLong_AsVoidPtr(t.cdata.read(obj, true).ptr());
  if (PyErr_Occurred()) throw nb::python_error();
  // An at::Tensor is one intrusive pointer to its TensorImpl: the address of `impl` is a handle.
  Shim::Handle handle = &impl;
  std::int32_t device_type = 0, device_index = 0, dtype = 0;
  if (s.device_type(handle, &device_type) != 0) return ShimRead::kFailed;
  if (device_type == s.cuda) {
    if (s.device_index(handle, &device_index) != 0) return ShimRead::kFailed;
    raw.device = fp8mla::Device::cuda(device_index);
  } else if (device_type != s.cpu) {
    return ShimRead::kNotFp8mla;
  }
  if (s.dtype(handle, &dtype) != 0) return ShimRead::kFailed;
  const std::uint8_t known = dtype >= 0 && dtype < 256 ? s.dtype_of_code[std::size_t(dtype)] : 0;
  if (known == 0) return ShimRead::kNotFp8mla;
  raw.dtype = kTorchDtypes[known - 1].dtype;
  std::int64_t ndim = 0;
  std::int64_t *sizes = nullptr, *strides = nullptr;
  if (s.dim(handle, &ndim) != 0 || s.sizes(handle, &sizes) != 0 ||
      s.strides(handle, &strides) != 0 || s.data_ptr(handle, &raw.data) != 0) {
    return ShimRead::kFailed;
  }
  check_ndim(op, name, ndim);
  raw.ndim = std::size_t(ndim);
  std::copy_n(sizes, ndim, raw.shape.begin());
  std::copy_n(strides, ndim, raw.strides.begin());
  return ShimRead::kRead;
}

template <typename Fn>
bool find_symbol(void* lib, Fn& fn, const char* symbol) {
  fn = reinterpret_cast<Fn>(dlsym(lib, symbol));
  return fn != nullptr;
}

// torch_empty's functions from the libraries torch loaded (left null where one is missing).
void load_allocator(void* shim_lib, const std::string& dir) {
  Allocator& a = g_torch.allocator;
  void* python_lib = dlopen((dir + "/lib/libtorch_python.so").c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (!python_lib || !find_symbol(shim_lib, a.empty_strided, "aoti_torch_empty_strided") ||
      !find_symbol(shim_lib, a.delete_tensor, "aoti_torch_delete_tensor_object") ||
      !find_symbol(shim_lib, a.reinterpret, "aoti_torch__reinterpret_tensor") ||
      !find_symbol(python_lib, a.wrap, "_Z16THPVariable_WrapRKN2at10TensorBaseE")) {
    a = Allocator{};
    return;
  }
  find_symbol(shim_lib, a.view_dtype_cpu, "aoti_torch_cpu_view_dtype");
  if (void* cuda_lib = dlopen((dir + "/lib/libtorch_cuda.so").c_str(), RTLD_LAZY | RTLD_NOLOAD)) {
    find_symbol(cuda_lib, a.view_dtype_cuda, "aoti_torch_cuda_view_dtype");
  }
}

// The shim's functions in the libtorch already loaded under `dir` (the torch package's folder;
// none: false).
bool load_shim(const std::string& dir, Shim& s) {
  for (const char* library : {"libtorch_cpu.so", "libtorch.so"}) {
    // RTLD_NOLOAD: a handle of the copy torch loaded, never a second one.
    void* lib = dlopen((dir + "/lib/" + library).c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (!lib) continue;
    const auto find = [lib](auto& fn, const char* symbol) { return find_symbol(lib, fn, symbol); };
    std::int32_t (*cpu)() = nullptr;
    std::int32_t (*cuda)() = nullptr;
    if (find(s.data_ptr, "aoti_torch_get_data_ptr") && find(s.dim, "aoti_torch_get_dim") &&
        find(s.sizes, "aoti_torch_get_sizes") && find(s.strides, "aoti_torch_get_strides") &&
        find(s.dtype, "aoti_torch_get_dtype") &&
        find(s.device_type, "aoti_torch_get_device_type") &&
        find(s.device_index, "aoti_torch_get_device_index") &&
        find(cpu, "aoti_torch_device_type_cpu") && find(cuda, "aoti_torch_device_type_cuda")) {
      s.cpu = cpu();
      s.cuda = cuda();
      load_allocator(lib, dir);
      return true;
    }
    dlclose(lib);
  }
  return false;
}

bool same(const RawTensor& a, const RawTensor& b) {
  return a.data == b.data && a.dtype == b.dtype && a.device == b.device && a.ndim == b.ndim &&
         std::equal(a.shape.begin(), a.shape.begin() + a.ndim, b.shape.begin()) &&
         std::equal(a.strides.begin(), a.strides.begin() + a.ndim, b.strides.begin());
}

// Learns the shim's dtype codes (one small tensor per dtype) and checks that the shim reads
// tensors of every kind the ops take (offsets, steps, transposes, broadcast and empty dims) as
// their attributes do. Any difference, or an error: the shim is not used.
bool shim_agrees(nb::handle torch) {
  using namespace nb::literals;
  Torch& t = g_torch;
  std::vector<nb::object> probes;
  const nb::object empty = torch.attr("empty");
  for (std::size_t i = 0; i < kDtypeCount; ++i) {
    if (!t.dtypes[i]) continue;
    nb::object probe = empty(2, "dtype"_a = nb::handle(t.dtypes[i]));
    void* impl = PyLong_AsVoidPtr(t.cdata.read(probe.ptr(), true).ptr());
    std::int32_t code = -1;
    if (t.shim.dtype(&impl, &code) != 0 || code < 0 || code >= 256 ||
        t.shim.dtype_of_code[std::size_t(code)] != 0) {
      return false;
    }
    t.shim.dtype_of_code[std::size_t(code)] = std::uint8_t(i + 1);
    t.allocator.code[i] = code;
    probes.push_back(std::move(probe));
  }
  const nb::object f32 = torch.attr("float32");
  const nb::object x = torch.attr("arange")(120, "dtype"_a = f32).attr("reshape")(2, 3, 4, 5);
  probes.push_back(x);
  probes.push_back(
      x.attr("transpose")(1, 3)[nb::make_tuple(nb::slice(1, 2, 1), nb::slice(0, 5, 2))]);
  probes.push_back(x.attr("select")(3, 2));
  probes.push_back(torch.attr("zeros")(3, "dtype"_a = torch.attr("int32")).attr("expand")(4, 3));
  probes.push_back(empty(0, 7, "dtype"_a = torch.attr("bfloat16")));
  for (const nb::object& probe : probes) {
    RawTensor by_shim;
    const std::optional<RawTensor> by_attributes =
        read_by_attributes("use_torch", "probe", probe.ptr(), true);
    if (read_by_shim("use_torch", "probe", probe.ptr(), by_shim) != ShimRead::kRead ||
        !by_attributes || !same(by_shim, *by_attributes)) {
      return false;
    }
  }
  return true;
}

using Dims = std::array<std::int64_t, fp8mla::kMaxDims>;

// A view of an allocation: its sizes and element strides from the allocation's start.
struct View {
  std::int64_t ndim = 0;
  Dims sizes{}, strides{};
};

Dims row_major(std::int64_t ndim, const Dims& sizes) {
  Dims strides{};
  for (std::int64_t d = ndim - 1, step = 1; d >= 0; --d) {
    strides[std::size_t(d)] = step;
    step *= std::max<std::int64_t>(sizes[std::size_t(d)], 1);  // torch's contiguous strides
  }
  return strides;
}

// The ints of a tuple (none: not a tuple of at most kMaxDims non-negative ints, e.g. SymInts,
// which torch then takes, or says what is wrong with).
std::optional<std::int64_t> read_ints(nb::handle tuple, Dims& out) {
  if (!PyTuple_Check(tuple.ptr()) || PyTuple_GET_SIZE(tuple.ptr()) > fp8mla::kMaxDims) {
    return std::nullopt;
  }
  const std::int64_t n = PyTuple_GET_SIZE(tuple.ptr());
  for (std::int64_t d = 0; d < n; ++d) {
    out[std::size_t(d)] = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple.ptr(), Py_ssize_t(d)));
  }
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return std::nullopt;
  }
  // torch's error for a negative size, not the shim's logged one.
  if (std::any_of(out.begin(), out.begin() + n, [](std::int64_t v) { return v < 0; })) {
    return std::nullopt;
  }
  return n;
}

// One output asked of the allocator: `ndim` sizes of dtype kTorchDtypes[dtype] on `like`'s
// device, or the `view` of such an allocation.
struct Request {
  void* like = nullptr;  // like's TensorImpl: its address is a shim handle (as in read_by_shim)
  std::size_t dtype = 0;
  std::int64_t ndim = 0;
  Dims sizes{};
  bool has_view = false;
  View view;

  Shim::Handle handle() { return &like; }
  // The elements of the allocation (nullopt: past int64, which torch then refuses).
  std::optional<std::int64_t> elements() const {
    std::int64_t n = 1;
    for (std::int64_t d = 0; d < ndim; ++d) {
      if (__builtin_mul_overflow(n, sizes[std::size_t(d)], &n)) return std::nullopt;
    }
    return n;
  }
};

// Reads an exact torch.Tensor `like`, `shape` (None: like's sizes) and the view (None, None: no
// view) into r; false where the allocator does not take them.
bool read_request(nb::handle like, nb::handle shape, nb::handle view_shape, nb::handle view_strides,
                  Request& r) {
  const Torch& t = g_torch;
  if (Py_TYPE(like.ptr()) != t.tensor_type) return false;
  r.like = PyLong_AsVoidPtr(t.cdata.read(like.ptr(), true).ptr());
  if (PyErr_Occurred()) throw nb::python_error();
  if (shape.is_none()) {
    std::int64_t* like_sizes = nullptr;
    if (t.shim.dim(r.handle(), &r.ndim) != 0 || r.ndim > fp8mla::kMaxDims ||
        t.shim.sizes(r.handle(), &like_sizes) != 0) {
      return false;
    }
    std::copy_n(like_sizes, r.ndim, r.sizes.begin());
  } else {
    const std::optional<std::int64_t> n = read_ints(shape, r.sizes);
    if (!n) return false;
    r.ndim = *n;
  }
  if (view_shape.is_none()) return true;
  const std::optional<std::int64_t> n = read_ints(view_shape, r.view.sizes);
  const std::optional<std::int64_t> m = read_ints(view_strides, r.view.strides);
  const std::optional<std::int64_t> elements = r.elements();
  if (!n || !m || *n != *m || !elements) return false;
  r.view.ndim = *n;
  r.has_view = true;
  // Inside the allocation: a non-empty view's last element at most the storage's last.
  std::int64_t last = 0;
  for (std::int64_t d = 0; d < r.view.ndim; ++d) {
    last += (r.view.sizes[std::size_t(d)] - 1) * r.view.strides[std::size_t(d)];
  }
  const auto view_end = r.view.sizes.begin() + r.view.ndim;
  return std::find(r.view.sizes.begin(), view_end, 0) != view_end || last < *elements;
}

// The request's tensor (a row-major allocation or its view); nullptr where libtorch declined
// (torch's own allocation then says why).
PyObject* allocate(Request& r) {
  const Torch& t = g_torch;
  const Allocator& a = t.allocator;
  std::int32_t device_type = 0, device_index = 0;
  if (t.shim.device_type(r.handle(), &device_type) != 0 ||
      t.shim.device_index(r.handle(), &device_index) != 0) {
    return nullptr;
  }
  const Dims strides = row_major(r.ndim, r.sizes);
  Shim::Handle storage = nullptr, out = nullptr;
  if (a.empty_strided(r.ndim, r.sizes.data(), strides.data(), a.code[r.dtype], device_type,
                      device_index, &storage) != 0) {
    return nullptr;
  }
  out = storage;
  if (r.has_view && a.reinterpret(storage, r.view.ndim, r.view.sizes.data(), r.view.strides.data(),
                                  0, &out) != 0) {
    a.delete_tensor(storage);
    return nullptr;
  }
  PyObject* tensor = a.wrap(out);
  a.delete_tensor(out);  // the Python tensor holds its own reference (of the storage too)
  if (r.has_view) a.delete_tensor(storage);
  if (!tensor) throw nb::python_error();
  return tensor;
}

// torch_empty, whether or not use_torch chose it.
nb::object make_empty(nb::handle like, nb::handle dtype, nb::handle shape, nb::handle view_shape,
                      nb::handle view_strides) {
  const Torch& t = g_torch;
  if (!t.allocator.wrap || !t.use_shim) return nb::none();
  const auto* found = std::find(std::begin(t.dtypes), std::end(t.dtypes), dtype.ptr());
  if (found == std::end(t.dtypes) || *found == nullptr) return nb::none();
  Request r;
  r.dtype = std::size_t(found - std::begin(t.dtypes));
  if (!read_request(like, shape, view_shape, view_strides, r)) return nb::none();
  PyObject* tensor = allocate(r);
  return tensor ? nb::steal(tensor) : nb::none();
}

// ---- torch_empty_group ---------------------------------------------------------------------

constexpr std::size_t kMaxGroup = 4;
// Bytes from one output's start to the next one's: a multiple of every dtype's size, and as
// aligned as the kernels' vector and TMA accesses want.
constexpr std::int64_t kGroupAlign = 256;

std::int64_t element_bytes(std::size_t dtype) {
  return kTorchDtypes[dtype].dtype.bits * kTorchDtypes[dtype].dtype.lanes / 8;
}

// The kTorchDtypes index of an fp8mla dtype name of use_torch's `output_dtypes`.
std::optional<std::size_t> named_dtype(nb::handle name) {
  const auto& names = g_torch.allocator.names;
  for (const auto& [known, index] : names) {
    if (known == name.ptr()) return index;  // the usual case: the same interned string
  }
  for (const auto& [known, index] : names) {
    if (PyUnicode_Check(name.ptr()) && PyUnicode_Compare(known, name.ptr()) == 0) return index;
  }
  return std::nullopt;
}

// The dtype of a group spec: an fp8mla name, or (None) like's own dtype, as torch.empty_like
// gives it for a row-major `like` (nullopt otherwise).
std::optional<std::size_t> group_dtype(nb::handle name, Request& r) {
  const Torch& t = g_torch;
  if (!name.is_none()) return named_dtype(name);
  std::int32_t code = -1;
  std::int64_t* strides = nullptr;
  if (t.shim.dtype(r.handle(), &code) != 0 || code < 0 || code >= 256 ||
      t.shim.dtype_of_code[std::size_t(code)] == 0 || t.shim.strides(r.handle(), &strides) != 0) {
    return std::nullopt;
  }
  const Dims want = row_major(r.ndim, r.sizes);
  const std::optional<std::int64_t> elements = r.elements();
  for (std::int64_t d = 0; d < r.ndim && elements != 0; ++d) {
    if (r.sizes[std::size_t(d)] != 1 && strides[d] != want[std::size_t(d)]) return std::nullopt;
  }
  return std::size_t(t.shim.dtype_of_code[std::size_t(code)] - 1);
}

// Shim handles owned until the group's tensors hold their own references.
struct Handles {
  std::array<Shim::Handle, kDtypeCount> by_dtype{};
  ~Handles() {
    for (Shim::Handle h : by_dtype) {
      if (h) g_torch.allocator.delete_tensor(h);
    }
  }
};

// torch_empty_group, whether or not use_torch chose it.
nb::object make_empty_group(nb::handle specs) {
  const Torch& t = g_torch;
  const Allocator& a = t.allocator;
  if (!a.wrap || !t.use_shim || !PyTuple_Check(specs.ptr())) return nb::none();
  const std::size_t n = std::size_t(PyTuple_GET_SIZE(specs.ptr()));
  if (n == 0 || n > kMaxGroup) return nb::none();
  std::array<Request, kMaxGroup> r;
  std::array<std::int64_t, kMaxGroup> offset{};
  std::int64_t total = 0;
  std::int32_t device_type = 0, device_index = 0;
  for (std::size_t i = 0; i < n; ++i) {
    PyObject* spec = PyTuple_GET_ITEM(specs.ptr(), Py_ssize_t(i));
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 5) return nb::none();
    const auto item = [spec](int k) { return nb::handle(PyTuple_GET_ITEM(spec, k)); };
    if (!read_request(item(0), item(2), item(3), item(4), r[i])) return nb::none();
    const std::optional<std::size_t> dtype = group_dtype(item(1), r[i]);
    std::int32_t type = 0, index = 0;
    if (!dtype || t.shim.device_type(r[i].handle(), &type) != 0 ||
        t.shim.device_index(r[i].handle(), &index) != 0 || (i > 0 && type != device_type) ||
        (i > 0 && index != device_index)) {
      return nb::none();
    }
    device_type = type;
    device_index = index;
    r[i].dtype = *dtype;
    const std::optional<std::int64_t> elements = r[i].elements();
    std::int64_t bytes = 0;
    if (!elements || __builtin_mul_overflow(*elements, element_bytes(*dtype), &bytes) ||
        bytes > (std::int64_t(1) << 62) - total) {
      return nb::none();
    }
    offset[i] = total;
    total += (bytes + kGroupAlign - 1) / kGroupAlign * kGroupAlign;
  }
  const auto view_dtype = device_type == t.shim.cuda  ? a.view_dtype_cuda
                          : device_type == t.shim.cpu ? a.view_dtype_cpu
                                                      : nullptr;
  // One allocation in the first output's dtype; the others' dtypes are views of it.
  Handles typed;
  const std::size_t first = r[0].dtype;
  const std::int64_t count = total / element_bytes(first), step = 1;
  if (a.empty_strided(1, &count, &step, a.code[first], device_type, device_index,
                      &typed.by_dtype[first]) != 0) {
    return nb::none();
  }
  nb::object group = nb::steal(PyTuple_New(Py_ssize_t(n)));
  for (std::size_t i = 0; i < n; ++i) {
    Shim::Handle& base = typed.by_dtype[r[i].dtype];
    if (!base && (!view_dtype || view_dtype(typed.by_dtype[first], a.code[r[i].dtype], &base))) {
      return nb::none();
    }
    const View v =
        r[i].has_view ? r[i].view : View{r[i].ndim, r[i].sizes, row_major(r[i].ndim, r[i].sizes)};
    Shim::Handle out = nullptr;
    if (a.reinterpret(base, v.ndim, v.sizes.data(), v.strides.data(),
                      offset[i] / element_bytes(r[i].dtype), &out) != 0) {
      return nb::none();
    }
    PyObject* tensor = a.wrap(out);
    a.delete_tensor(out);
    if (!tensor) throw nb::python_error();
    PyTuple_SET_ITEM(group.ptr(), Py_ssize_t(i), tensor);
  }
  return group;
}

// Whether torch_empty's tensors are what torch.empty would make: for every dtype and a few
// shapes (empty and zero-dim ones too), an exact torch.Tensor whose attributes give that dtype,
// shape, row-major strides and the CPU, and whose memory torch can write and read.
bool allocator_agrees(nb::handle torch) {
  using namespace nb::literals;
  const nb::object like = torch.attr("empty")(1);
  for (std::size_t i = 0; i < kDtypeCount; ++i) {
    if (!g_torch.dtypes[i]) continue;
    for (const nb::tuple& shape :
         {nb::make_tuple(3, 5), nb::make_tuple(0, 4, 2), nb::make_tuple(7), nb::make_tuple()}) {
      const nb::object made = make_empty(like, g_torch.dtypes[i], shape, nb::none(), nb::none());
      const nb::object want = torch.attr("empty")(shape, "dtype"_a = nb::handle(g_torch.dtypes[i]));
      if (made.is_none() || Py_TYPE(made.ptr()) != g_torch.tensor_type) return false;
      const std::optional<RawTensor> got =
          read_by_attributes("use_torch", "probe", made.ptr(), true);
      const std::optional<RawTensor> ref =
          read_by_attributes("use_torch", "probe", want.ptr(), true);
      if (!got || !ref) return false;
      RawTensor same_place = *ref;
      same_place.data = got->data;
      if (!same(*got, same_place) || made.attr("requires_grad").ptr() != Py_False) return false;
    }
  }
  const nb::object words =
      make_empty(like, torch.attr("int32"), nb::make_tuple(64), nb::none(), nb::none());
  words.attr("fill_")(-7);
  if (!nb::cast<bool>(words.attr("eq")(-7).attr("all")().attr("item")())) return false;
  // A view (a transposed V's shape): the shape and strides asked for, on an allocation of the
  // storage's size, from its start.
  const nb::object view = make_empty(like, torch.attr("float32"), nb::make_tuple(2, 3, 8),
                                     nb::make_tuple(5, 2, 3), nb::make_tuple(1, 24, 8));
  if (view.is_none() || Py_TYPE(view.ptr()) != g_torch.tensor_type) return false;
  const std::optional<RawTensor> got = read_by_attributes("use_torch", "probe", view.ptr(), true);
  const nb::object storage = view.attr("untyped_storage")();
  return got && got->ndim == 3 && got->shape[0] == 5 && got->shape[1] == 2 && got->shape[2] == 3 &&
         got->strides[0] == 1 && got->strides[1] == 24 && got->strides[2] == 8 &&
         nb::cast<std::int64_t>(storage.attr("nbytes")()) == 2 * 3 * 8 * 4 &&
         nb::cast<std::uintptr_t>(storage.attr("data_ptr")()) ==
             reinterpret_cast<std::uintptr_t>(got->data);
}

// Whether torch_empty_group's tensors are torch_empty's of the same specs (dtype, shape,
// strides, device, not requiring grad), each at its own 256-byte-aligned place of one shared
// storage, apart from the others: every output dtype next to a bf16 one, a transposed view with
// an empty_like's twin, and three writable outputs filled one by one.
bool group_agrees(nb::handle torch) {
  using namespace nb::literals;
  const Torch& t = g_torch;
  const nb::object like = torch.attr("empty")(2, 3, "dtype"_a = torch.attr("bfloat16"));
  const nb::object none = nb::none();
  std::vector<nb::tuple> groups;
  for (const auto& [name, index] : t.allocator.names) {
    groups.push_back(
        nb::make_tuple(nb::make_tuple(like, "bf16", nb::make_tuple(5), none, none),
                       nb::make_tuple(like, nb::handle(name), nb::make_tuple(3, 7), none, none)));
  }
  groups.push_back(
      nb::make_tuple(nb::make_tuple(like, "e4m3", nb::make_tuple(2, 8, 40),
                                    nb::make_tuple(33, 2, 8), nb::make_tuple(1, 320, 40)),
                     nb::make_tuple(like, "e4m3", none, none, none)));
  const nb::tuple filled =
      nb::make_tuple(nb::make_tuple(like, "f32", nb::make_tuple(4), none, none),
                     nb::make_tuple(like, "i32", nb::make_tuple(3), none, none),
                     nb::make_tuple(like, none, none, none, none));
  groups.push_back(filled);
  for (const nb::tuple& specs : groups) {
    const nb::object made = make_empty_group(specs);
    if (made.is_none() || nb::len(made) != nb::len(specs)) return false;
    const std::uintptr_t storage =
        nb::cast<std::uintptr_t>(made[0].attr("untyped_storage")().attr("data_ptr")());
    std::uintptr_t next = storage;
    for (std::size_t i = 0; i < nb::len(specs); ++i) {
      const nb::handle spec = specs[i];
      const nb::handle name = spec[1];
      const std::optional<std::size_t> index = named_dtype(name);
      if (!name.is_none() && !index) return false;
      const nb::object dtype =
          name.is_none() ? like.attr("dtype") : nb::borrow(t.dtypes[index.value_or(0)]);
      const nb::object want = make_empty(spec[0], dtype, spec[2], spec[3], spec[4]);
      const nb::handle got = made[i];
      const std::optional<RawTensor> g = read_by_attributes("use_torch", "probe", got.ptr(), true);
      const std::optional<RawTensor> w =
          want.is_none() ? std::nullopt
                         : read_by_attributes("use_torch", "probe", want.ptr(), true);
      if (!g || !w || Py_TYPE(got.ptr()) != t.tensor_type ||
          got.attr("requires_grad").ptr() != Py_False ||
          nb::cast<std::uintptr_t>(got.attr("untyped_storage")().attr("data_ptr")()) != storage) {
        return false;
      }
      RawTensor same_place = *w;
      same_place.data = g->data;
      const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(g->data);
      if (!same(*g, same_place) || at < next || (at - storage) % kGroupAlign != 0) return false;
      next = at + std::uintptr_t(
                      nb::cast<std::int64_t>(want.attr("untyped_storage")().attr("nbytes")()));
    }
  }
  const nb::object outs = make_empty_group(filled);
  for (std::size_t i = 0; i < 3; ++i) outs[i].attr("fill_")(int(i) + 1);
  for (std::size_t i = 0; i < 3; ++i) {
    if (!nb::cast<bool>(outs[i].attr("eq")(int(i) + 1).attr("all")().attr("item")())) return false;
  }
  return true;
}

}  // namespace

nb::object torch_empty(nb::handle like, nb::handle dtype, nb::handle shape, nb::handle view_shape,
                       nb::handle view_strides) {
  return g_torch.use_allocator ? make_empty(like, dtype, shape, view_shape, view_strides)
                               : nb::none();
}

nb::object torch_empty_group(nb::handle specs) {
  return g_torch.use_group ? make_empty_group(specs) : nb::none();
}

std::string torch_allocator() {
  return g_torch.use_group ? "grouped" : g_torch.use_allocator ? "shim" : "torch";
}

void use_torch(nb::handle torch, nb::dict output_dtypes) {
  // The folder of the torch package: its lib/ holds the libtorch it loaded.
  const std::string dir = nb::cast<std::string>(
      nb::module_::import_("os.path").attr("dirname")(torch.attr("__file__")));
  load_torch_cuda_context(dir);
  g_torch = Torch{};
  Torch& t = g_torch;
  const nb::object tensor = torch.attr("Tensor");
  t.tensor_type = reinterpret_cast<PyTypeObject*>(tensor.inc_ref().ptr());
  for (std::size_t i = 0; i < kDtypeCount; ++i) {
    if (nb::hasattr(torch, kTorchDtypes[i].name)) {
      t.dtypes[i] = torch.attr(kTorchDtypes[i].name).inc_ref().ptr();
    }
  }
  t.data_ptr = attribute(tensor, "data_ptr", true);
  t.shape = attribute(tensor, "shape", false);
  t.stride = attribute(tensor, "stride", true);
  t.dtype = attribute(tensor, "dtype", false);
  t.is_cuda = attribute(tensor, "is_cuda", false);
  t.is_cpu = attribute(tensor, "is_cpu", false);
  t.get_device = attribute(tensor, "get_device", true);
  t.ready = true;  // the attributes reader is complete: the shim's check compares with it
  const char* forced = std::getenv("FP8MLA_TORCH_READER");
  if (forced && std::string_view(forced) == "attributes") return;
  if (nb::hasattr(tensor, "_cdata") && load_shim(dir, t.shim)) {
    t.cdata = attribute(tensor, "_cdata", false);
    t.use_shim = shim_agrees(torch);
    const char* env = std::getenv("FP8MLA_TORCH_ALLOCATOR");
    const std::string_view allocator = env ? env : "grouped";
    t.use_allocator =
        t.use_shim && t.allocator.wrap && allocator != "torch" && allocator_agrees(torch);
    for (const auto& [name, dtype] : output_dtypes) {
      const auto* found = std::find(std::begin(t.dtypes), std::end(t.dtypes), dtype.ptr());
      if (found == std::end(t.dtypes) || !*found) continue;  // an alias this torch lacks
      t.allocator.names.emplace_back(name.inc_ref().ptr(),
                                     std::size_t(found - std::begin(t.dtypes)));
    }
    t.use_group = t.use_allocator && allocator != "shim" && group_agrees(torch);
  }
}

std::string torch_tensor_reader() {
  return !g_torch.ready ? "none" : g_torch.use_shim ? "shim" : "attributes";
}

std::optional<RawTensor> read_torch(const char* op, const char* name, nb::handle tensor,
                                    const char* reader) {
  const Torch& t = g_torch;
  PyObject* obj = tensor.ptr();
  if (!t.ready || !PyObject_TypeCheck(obj, t.tensor_type)) return std::nullopt;
  const bool exact = Py_TYPE(obj) == t.tensor_type;
  const bool shim = reader ? std::string_view(reader) == "shim" : t.use_shim;
  if (exact && shim) {
    if (!t.use_shim) fail(op, name, "the shim reader is not in use (torch_tensor_reader())");
    RawTensor raw;
    switch (read_by_shim(op, name, obj, raw)) {
      case ShimRead::kRead:
        return raw;
      case ShimRead::kNotFp8mla:
        return std::nullopt;
      case ShimRead::kFailed:
        break;
    }
  }
  return read_by_attributes(op, name, obj, exact);
}

}  // namespace fp8mla_python
