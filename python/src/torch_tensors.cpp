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
  }
}

// The shim's functions in the libtorch already loaded beside `torch` (none: false).
bool load_shim(nb::handle torch, Shim& s) {
  const std::string dir = nb::cast<std::string>(
      nb::module_::import_("os.path").attr("dirname")(torch.attr("__file__")));
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

// A row-major tensor of `ndim` sizes with dtype kTorchDtypes[index] on `like`'s device (read
// through `handle`), or the `view` of one; nullptr where libtorch declined (torch's own
// allocation then says why).
PyObject* allocate(Shim::Handle like, std::size_t index, std::int64_t ndim, const Dims& sizes,
                   const View* view) {
  const Torch& t = g_torch;
  const Allocator& a = t.allocator;
  std::int32_t device_type = 0, device_index = 0;
  if (t.shim.device_type(like, &device_type) != 0 ||
      t.shim.device_index(like, &device_index) != 0) {
    return nullptr;
  }
  Dims strides{};
  for (std::int64_t d = ndim - 1, step = 1; d >= 0; --d) {
    strides[std::size_t(d)] = step;
    step *= std::max<std::int64_t>(sizes[std::size_t(d)], 1);  // torch's contiguous strides
  }
  Shim::Handle storage = nullptr, out = nullptr;
  if (a.empty_strided(ndim, sizes.data(), strides.data(), a.code[index], device_type, device_index,
                      &storage) != 0) {
    return nullptr;
  }
  out = storage;
  if (view &&
      a.reinterpret(storage, view->ndim, view->sizes.data(), view->strides.data(), 0, &out) != 0) {
    a.delete_tensor(storage);
    return nullptr;
  }
  PyObject* tensor = a.wrap(out);
  a.delete_tensor(out);  // the Python tensor holds its own reference (of the storage too)
  if (view) a.delete_tensor(storage);
  if (!tensor) throw nb::python_error();
  return tensor;
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

// torch_empty, whether or not use_torch chose it.
nb::object make_empty(nb::handle like, nb::handle dtype, nb::handle shape, nb::handle view_shape,
                      nb::handle view_strides) {
  const Torch& t = g_torch;
  PyObject* obj = like.ptr();
  if (!t.allocator.wrap || !t.use_shim || Py_TYPE(obj) != t.tensor_type) return nb::none();
  const auto* found = std::find(std::begin(t.dtypes), std::end(t.dtypes), dtype.ptr());
  if (found == std::end(t.dtypes) || *found == nullptr) return nb::none();
  void* impl = PyLong_AsVoidPtr(t.cdata.read(obj, true).ptr());
  if (PyErr_Occurred()) throw nb::python_error();
  Shim::Handle handle = &impl;  // as in read_by_shim
  Dims sizes{};
  std::int64_t ndim = 0;
  if (shape.is_none()) {
    std::int64_t* like_sizes = nullptr;
    if (t.shim.dim(handle, &ndim) != 0 || ndim > fp8mla::kMaxDims ||
        t.shim.sizes(handle, &like_sizes) != 0) {
      return nb::none();
    }
    std::copy_n(like_sizes, ndim, sizes.begin());
  } else {
    const std::optional<std::int64_t> n = read_ints(shape, sizes);
    if (!n) return nb::none();
    ndim = *n;
  }
  View view;
  if (!view_shape.is_none()) {
    const std::optional<std::int64_t> n = read_ints(view_shape, view.sizes);
    const std::optional<std::int64_t> m = read_ints(view_strides, view.strides);
    if (!n || !m || *n != *m) return nb::none();
    view.ndim = *n;
    // Inside the allocation: a non-empty view's last element at most the storage's last.
    std::int64_t last = 0, elements = 1;
    for (std::int64_t d = 0; d < ndim; ++d) elements *= sizes[std::size_t(d)];
    for (std::int64_t d = 0; d < view.ndim; ++d) {
      last += (view.sizes[std::size_t(d)] - 1) * view.strides[std::size_t(d)];
    }
    const bool empty = std::find(view.sizes.begin(), view.sizes.begin() + view.ndim, 0) !=
                       view.sizes.begin() + view.ndim;
    if (!empty && last >= elements) return nb::none();
  }
  PyObject* tensor = allocate(handle, std::size_t(found - std::begin(t.dtypes)), ndim, sizes,
                              view_shape.is_none() ? nullptr : &view);
  return tensor ? nb::steal(tensor) : nb::none();
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

}  // namespace

nb::object torch_empty(nb::handle like, nb::handle dtype, nb::handle shape, nb::handle view_shape,
                       nb::handle view_strides) {
  return g_torch.use_allocator ? make_empty(like, dtype, shape, view_shape, view_strides)
                               : nb::none();
}

std::string torch_allocator() {
  return g_torch.use_allocator ? "shim" : "torch";
}

void use_torch(nb::handle torch) {
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
  if (nb::hasattr(tensor, "_cdata") && load_shim(torch, t.shim)) {
    t.cdata = attribute(tensor, "_cdata", false);
    t.use_shim = shim_agrees(torch);
    const char* allocator = std::getenv("FP8MLA_TORCH_ALLOCATOR");
    const bool forced_torch = allocator && std::string_view(allocator) == "torch";
    t.use_allocator = t.use_shim && t.allocator.wrap && !forced_torch && allocator_agrees(torch);
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
