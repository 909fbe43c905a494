// How the tensor arguments of fp8mla._C become fp8mla::TensorViews.
//
// A tensor argument is an array or a pair (array, "dtype") naming the fp8mla dtype of an array
// whose framework has no such type (a uint8 view of float8 data, a uint16 view of numpy
// bfloat16). torch tensors are read directly (torch_tensors.hpp: nothing allocated) once
// use_torch has been called; every other array, and a torch tensor on a device other than the CPU
// or CUDA, crosses through DLPack as an nb::ndarray.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fp8mla/tensor_view.hpp"

namespace fp8mla_python {

namespace nb = nanobind;

[[noreturn]] void fail(std::string_view op, std::string_view name, const std::string& message);

// What a tensor argument describes before its fp8mla dtype is decided.
struct RawTensor {
  void* data = nullptr;
  nb::dlpack::dtype dtype{};
  fp8mla::Device device{};
  std::size_t ndim = 0;
  std::array<std::int64_t, fp8mla::kMaxDims> shape{}, strides{};
};

// Converts the tensor arguments of one call; keeps their DLPack arrays alive until it ends.
class Args {
 public:
  explicit Args(const char* op) : op_(op) {}

  const char* op() const { return op_; }

  fp8mla::TensorView input(nb::handle obj, const char* name) { return convert(obj, name, true); }
  fp8mla::TensorView output(nb::handle obj, const char* name) { return convert(obj, name, false); }

  // The CUDA device of the first torch tensor converted that is on one; -1 for none.
  int torch_cuda_device() const { return torch_cuda_device_; }

 private:
  fp8mla::TensorView convert(nb::handle obj, const char* name, bool read_only);
  RawTensor from_dlpack(nb::handle obj, const char* name, bool read_only);

  const char* op_;
  int torch_cuda_device_ = -1;
  std::vector<nb::ndarray<nb::ro>> inputs_;
  std::vector<nb::ndarray<>> outputs_;
};

}  // namespace fp8mla_python
