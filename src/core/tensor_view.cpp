#include "fp8mla/tensor_view.hpp"

#include <sstream>

#include "fp8mla/error.hpp"

namespace fp8mla {
namespace {

std::string join(std::span<const std::int64_t> values) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < values.size(); ++i) os << (i ? ", " : "") << values[i];
  os << ']';
  return os.str();
}

// Throws unless the bytes from the view's first element to its last, `extent` elements of `dtype`,
// fit in an int64 (a larger size, e.g. [2^32, 2^32, 64], would wrap and read as a small one).
void check_extent(bool overflowed, std::int64_t extent, DType dtype,
                  std::span<const std::int64_t> shape, std::span<const std::int64_t> strides) {
  std::int64_t bytes = 0;
  if (!overflowed && !__builtin_mul_overflow(extent, std::int64_t(dtype_size(dtype)), &bytes)) {
    return;
  }
  throw Error(
      ErrorCategory::kInvalidArgument,
      concat("TensorView: expected a view spanning at most 2^63 - 1 bytes, got ", dtype_name(dtype),
             join(shape), strides.empty() ? "" : concat(" strides ", join(strides))));
}

}  // namespace

std::string to_string(Device device) {
  return device.is_cuda() ? concat("cuda:", device.index) : std::string("cpu");
}

TensorView::TensorView(void* data, DType dtype, std::span<const std::int64_t> shape, Device device)
    : data_(data), dtype_(dtype), device_(device) {
  if (shape.size() > std::size_t(kMaxDims)) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("TensorView: expected at most ", kMaxDims, " dims, got ", shape.size()));
  }
  ndim_ = int(shape.size());
  std::int64_t stride = 1;
  bool overflowed = false;
  for (int d = ndim_ - 1; d >= 0; --d) {
    if (shape[d] < 0) {
      throw Error(ErrorCategory::kInvalidArgument,
                  concat("TensorView: expected non-negative sizes, got shape ", join(shape)));
    }
    shape_[d] = shape[d];
    strides_[d] = stride;
    overflowed = __builtin_mul_overflow(stride, shape[d] > 0 ? shape[d] : 1, &stride) || overflowed;
  }
  check_extent(overflowed, stride, dtype, shape, {});
}

TensorView::TensorView(void* data, DType dtype, std::span<const std::int64_t> shape,
                       std::span<const std::int64_t> strides, Device device)
    : TensorView(data, dtype, shape, device) {
  if (strides.size() != shape.size()) {
    throw Error(ErrorCategory::kInvalidArgument,
                concat("TensorView: expected one stride per dim (", shape.size(), "), got ",
                       strides.size(), " strides"));
  }
  for (int d = 0; d < ndim_; ++d) {
    if (strides[d] < 0) {
      throw Error(ErrorCategory::kInvalidArgument,
                  concat("TensorView: expected non-negative strides, got ", join(strides)));
    }
    strides_[d] = strides[d];
  }
  // One past the farthest element from the first, in elements (0 for an empty view).
  std::int64_t extent = 1;
  bool overflowed = false;
  for (int d = 0; d < ndim_ && !empty(); ++d) {
    std::int64_t step = 0;
    overflowed = __builtin_mul_overflow(shape_[d] - 1, strides_[d], &step) ||
                 __builtin_add_overflow(extent, step, &extent) || overflowed;
  }
  check_extent(overflowed, extent, dtype, shape, strides);
}

void TensorView::throw_dim_out_of_range(int dim) const {
  throw Error(ErrorCategory::kOutOfRange,
              concat("TensorView: dim ", dim, " out of range for a ", ndim_, "-d view"));
}

std::int64_t TensorView::numel() const {
  std::int64_t n = 1;
  for (int d = 0; d < ndim_; ++d) n *= shape_[d];
  return n;
}

bool TensorView::is_contiguous() const {
  std::int64_t expected = 1;
  for (int d = ndim_ - 1; d >= 0; --d) {
    if (shape_[d] == 0) return true;
    if (shape_[d] != 1 && strides_[d] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

TensorView TensorView::narrow(int dim, std::int64_t start, std::int64_t length) const {
  const int d = normalize_dim(dim);
  if (start < 0 || length < 0 || start + length > shape_[d]) {
    throw Error(ErrorCategory::kOutOfRange,
                concat("TensorView::narrow: range [", start, ", ", start + length,
                       ") out of bounds for dim ", dim, " of size ", shape_[d]));
  }
  TensorView out = *this;
  out.shape_[d] = length;
  out.data_ = static_cast<char*>(data_) + start * strides_[d] * dtype_size(dtype_);
  return out;
}

std::string TensorView::describe() const {
  return concat(dtype_name(dtype_), join(shape()), " strides ", join(strides()), " on ",
                to_string(device_));
}

RowLayout fold_rows(const TensorView& view, std::string_view what) {
  const int n = view.ndim();
  if (n == 0) return {1, 1, 1};
  RowLayout layout;
  layout.cols = view.size(-1);
  layout.rows = view.numel() / (layout.cols > 0 ? layout.cols : 1);
  if (layout.cols == 0) layout.rows = 0;
  if (view.empty()) {
    layout.row_stride = layout.cols;
    return layout;
  }
  if (layout.cols > 1 && view.stride(-1) != 1) {
    throw Error(
        ErrorCategory::kInvalidArgument,
        concat(what, ": expected the last dim to be contiguous (stride 1), got ", view.describe()));
  }
  // Walk the leading dims from the innermost: each must step over exactly the dims inside it.
  // Size-1 dims take no step, so their stride does not matter.
  std::int64_t row_stride = 0;
  std::int64_t inner_span = 0;  // elements one step of the current dim must cover
  int inner_dim = -1;
  for (int d = n - 2; d >= 0; --d) {
    if (view.size(d) == 1) continue;
    if (inner_dim < 0) {
      row_stride = view.stride(d);
      inner_span = row_stride * view.size(d);
      inner_dim = d;
      if (row_stride < layout.cols) {
        throw Error(
            ErrorCategory::kInvalidArgument,
            concat(what, ": expected rows not to overlap: dim ", d, " has stride ", row_stride,
                   " but rows are ", layout.cols, " wide (", view.describe(), ")"));
      }
      continue;
    }
    if (view.stride(d) != inner_span) {
      throw Error(ErrorCategory::kInvalidArgument,
                  concat(what, ": cannot fold the leading dims onto one row stride: dim ", d,
                         " has stride ", view.stride(d), ", expected ", inner_span, " (stride ",
                         view.stride(inner_dim), " x size ", view.size(inner_dim), " of dim ",
                         inner_dim, "); got ", view.describe()));
    }
    inner_span = view.stride(d) * view.size(d);
    inner_dim = d;
  }
  layout.row_stride = inner_dim < 0 ? layout.cols : row_stride;
  return layout;
}

}  // namespace fp8mla
