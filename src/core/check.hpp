// Argument validation shared by every op. Each message starts with the op and the argument's
// name and says what was expected and what was given:
//   "quantize_fp8: `out` dtype: expected one of {e4m3fn, e5m2}, got bf16"
#pragma once

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "fp8mla/error.hpp"
#include "fp8mla/tensor_view.hpp"

namespace fp8mla {

// Whether an optional tensor argument was passed: a default view is not; a view with dims is,
// even without data (no elements: torch's empty tensors have no data pointer).
inline bool given(const TensorView& t) {
  return t.data() != nullptr || t.ndim() > 0;
}

class ArgChecker {
 public:
  explicit ArgChecker(std::string_view op,
                      std::source_location where = std::source_location::current())
      : op_(op), where_(where) {}

  void dtype(const TensorView& t, std::string_view name,
             std::initializer_list<DType> allowed) const;
  void ndim(const TensorView& t, std::string_view name, int min_dims, int max_dims) const;
  void ndim(const TensorView& t, std::string_view name, int dims) const {
    ndim(t, name, dims, dims);
  }
  void size(const TensorView& t, std::string_view name, int dim, std::int64_t expected) const;
  void device(const TensorView& t, std::string_view name, Device expected) const;
  // The data pointer, and every stride other than 1 element, are multiples of `bytes` bytes.
  void aligned(const TensorView& t, std::string_view name, int bytes) const;
  // The last dim has stride 1 (trivially true for an empty view or a last dim of size <= 1).
  void contiguous_last_dim(const TensorView& t, std::string_view name) const;
  // A host-side scale factor: finite and > 0 (NaN, infinities, zero and negative values would
  // turn every output element into NaN, zero or a flipped sign without a word).
  void positive_scale(float value, std::string_view name) const;
  // The bytes an output `out` may write lie outside those `in` may be read from: the two views'
  // address ranges (first to last element) do not intersect. An empty view or one without data
  // overlaps nothing.
  void apart(const TensorView& out, std::string_view out_name, const TensorView& in,
             std::string_view in_name) const;
  // An output that starts where an input starts must be that input (the in-place form: same
  // dtype, dims and strides), not a shifted, re-strided or re-typed view of it; any other output
  // lies apart from the input (apart()).
  void same_view_or_apart(const TensorView& out, std::string_view out_name, const TensorView& in,
                          std::string_view in_name) const;
  // Two outputs lie apart (address ranges as apart()'s): one would overwrite the other.
  void outputs_apart(const TensorView& a, std::string_view a_name, const TensorView& b,
                     std::string_view b_name) const;
  // No two elements of `t` share memory (an output written through it would lose writes): taken
  // in increasing stride order, each dim of size > 1 steps at least over the dims before it.
  void elements_apart(const TensorView& t, std::string_view name) const;
  // apart() for every (output, input) pair, each view's address range computed once.
  struct Named {
    const TensorView* view;
    std::string_view name;
  };
  using ByteRange = std::pair<std::uintptr_t, std::uintptr_t>;  // [first byte, one past last)
  void all_apart(std::span<const Named> outputs, std::span<const Named> inputs) const;
  // Rows of `t` as fold_rows() sees them, with errors naming the op and argument.
  RowLayout rows(const TensorView& t, std::string_view name) const;
  // A free-form requirement: throws `category` with "<op>: <message>" when `ok` is false.
  void require(bool ok, ErrorCategory category, std::string_view message) const;
  // The same with a formatted message: make_message(), e.g. `[&] { return concat(...); }`, runs
  // only when `ok` is false, so a passing check allocates nothing.
  template <typename MakeMessage>
  requires std::invocable<MakeMessage&> &&
      std::convertible_to<std::invoke_result_t<MakeMessage&>, std::string_view>
  void require(bool ok, ErrorCategory category, MakeMessage&& make_message) const {
    if (!ok) [[unlikely]] {
      fail(category, make_message());
    }
  }

 private:
  [[noreturn]] void fail(ErrorCategory category, std::string_view message) const;
  void require_apart(const Named& out, ByteRange out_range, const Named& in, ByteRange in_range,
                     std::string_view why = "an output may not overlap an input") const;

  std::string_view op_;
  std::source_location where_;
};

}  // namespace fp8mla
