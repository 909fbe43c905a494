// fp8mla::TensorView — a non-owning view of caller memory: dtype, up to 8 dims, strides in
// elements, device and data pointer. Engines own their memory; every op takes views.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include "fp8mla/dtype.hpp"

namespace fp8mla {

enum class DeviceType : std::uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;  // CUDA ordinal; 0 for the CPU

  static constexpr Device cpu() { return {DeviceType::kCPU, 0}; }
  static constexpr Device cuda(int ordinal = 0) { return {DeviceType::kCUDA, ordinal}; }
  constexpr bool is_cuda() const { return type == DeviceType::kCUDA; }
  constexpr bool operator==(const Device&) const = default;
};

std::string to_string(Device device);  // "cpu", "cuda:1"

inline constexpr int kMaxDims = 8;

class TensorView {
 public:
  TensorView() = default;
  // Row-major contiguous view.
  TensorView(void* data, DType dtype, std::span<const std::int64_t> shape,
             Device device = Device::cpu());
  TensorView(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
             Device device = Device::cpu())
      : TensorView(data, dtype, std::span<const std::int64_t>(shape.begin(), shape.size()),
                   device) {}
  // Explicit strides, in elements; they must be non-negative. Either way the bytes from the first
  // element to the last must fit in an int64 (a larger size would wrap).
  TensorView(void* data, DType dtype, std::span<const std::int64_t> shape,
             std::span<const std::int64_t> strides, Device device = Device::cpu());
  TensorView(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
             std::initializer_list<std::int64_t> strides, Device device = Device::cpu())
      : TensorView(data, dtype, std::span<const std::int64_t>(shape.begin(), shape.size()),
                   std::span<const std::int64_t>(strides.begin(), strides.size()), device) {}

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int ndim() const { return ndim_; }
  // Negative dims count from the end, as in Python.
  std::int64_t size(int dim) const { return shape_[normalize_dim(dim)]; }
  std::int64_t stride(int dim) const { return strides_[normalize_dim(dim)]; }
  std::span<const std::int64_t> shape() const { return {shape_.data(), std::size_t(ndim_)}; }
  std::span<const std::int64_t> strides() const { return {strides_.data(), std::size_t(ndim_)}; }

  std::int64_t numel() const;
  bool empty() const { return numel() == 0; }
  // Row-major contiguous, ignoring strides of size-1 dims.
  bool is_contiguous() const;

  // The sub-view [start, start + length) along `dim`, as Python's t.narrow(dim, start, length).
  TensorView narrow(int dim, std::int64_t start, std::int64_t length) const;

  // "bf16[4, 128, 256] strides [32768, 256, 1] on cuda:0"
  std::string describe() const;

 private:
  // Inline: the argument checks call size() and stride() dozens of times a call.
  int normalize_dim(int dim) const {
    const int d = dim < 0 ? dim + ndim_ : dim;
    if (d < 0 || d >= ndim_) [[unlikely]]
      throw_dim_out_of_range(dim);
    return d;
  }
  [[noreturn]] void throw_dim_out_of_range(int dim) const;

  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_{};
  int ndim_ = 0;
  std::array<std::int64_t, kMaxDims> shape_{};
  std::array<std::int64_t, kMaxDims> strides_{};
};

// A view seen as rows of `cols` contiguous elements, row r starting at data + r * row_stride.
struct RowLayout {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t row_stride = 0;
};

// Folds all leading dims onto one row stride (e.g. kv[..., 128:] of a [T, H, 256] tensor is
// T*H rows of 128 with row stride 256). Requires last-dim stride 1 and each leading dim's stride
// to equal the next dim's stride times its size; otherwise throws an Error naming `what`, the
// offending dim and the strides. A 0-d view is one row of one element.
RowLayout fold_rows(const TensorView& view, std::string_view what);

}  // namespace fp8mla
