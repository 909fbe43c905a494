#include "core/check.hpp"

#include <array>
#include <cmath>
#include <utility>

namespace fp8mla {

void ArgChecker::fail(ErrorCategory category, std::string_view message) const {
  throw Error(category, concat(op_, ": ", message), where_);
}

void ArgChecker::require(bool ok, ErrorCategory category, std::string_view message) const {
  if (!ok) fail(category, message);
}

void ArgChecker::dtype(const TensorView& t, std::string_view name,
                       std::initializer_list<DType> allowed) const {
  for (DType d : allowed) {
    if (t.dtype() == d) return;
  }
  std::string names;
  for (DType d : allowed) names += concat(names.empty() ? "" : ", ", dtype_name(d));
  fail(ErrorCategory::kInvalidArgument,
       concat("`", name, "` dtype: expected ", allowed.size() == 1 ? "" : "one of {", names,
              allowed.size() == 1 ? "" : "}", ", got ", dtype_name(t.dtype())));
}

void ArgChecker::ndim(const TensorView& t, std::string_view name, int min_dims,
                      int max_dims) const {
  if (t.ndim() >= min_dims && t.ndim() <= max_dims) return;
  const std::string expected =
      min_dims == max_dims ? concat(min_dims) : concat(min_dims, " to ", max_dims);
  fail(ErrorCategory::kInvalidArgument,
       concat("`", name, "`: expected ", expected, " dims, got ", t.describe()));
}

void ArgChecker::size(const TensorView& t, std::string_view name, int dim,
                      std::int64_t expected) const {
  if (t.size(dim) == expected) return;
  fail(ErrorCategory::kInvalidArgument,
       concat("`", name, "` dim ", dim, ": expected size ", expected, ", got ", t.describe()));
}

void ArgChecker::device(const TensorView& t, std::string_view name, Device expected) const {
  if (t.device() == expected) return;
  fail(ErrorCategory::kInvalidArgument,
       concat("`", name, "`: expected a tensor on ", to_string(expected), ", got ", t.describe()));
}

void ArgChecker::aligned(const TensorView& t, std::string_view name, int bytes) const {
  const auto address = reinterpret_cast<std::uintptr_t>(t.data());
  if (address % std::uintptr_t(bytes) != 0) {
    fail(ErrorCategory::kInvalidArgument,
         concat("`", name, "`: expected a ", bytes, "-byte aligned data pointer, got address 0x",
                std::hex, address, std::dec, " (", t.describe(), ")"));
  }
  const auto element = std::int64_t(dtype_size(t.dtype()));
  for (int d = 0; d < t.ndim(); ++d) {
    if (t.size(d) > 1 && t.stride(d) != 1 && (t.stride(d) * element) % bytes != 0) {
      fail(ErrorCategory::kInvalidArgument,
           concat("`", name, "`: expected dim ", d, "'s stride to be a multiple of ", bytes,
                  " bytes, got ", t.stride(d), " elements (", t.describe(), ")"));
    }
  }
}

void ArgChecker::contiguous_last_dim(const TensorView& t, std::string_view name) const {
  if (t.ndim() == 0 || t.empty() || t.size(-1) <= 1 || t.stride(-1) == 1) return;
  fail(ErrorCategory::kInvalidArgument,
       concat("`", name, "`: expected a contiguous last dim (stride 1), got ", t.describe()));
}

void ArgChecker::positive_scale(float value, std::string_view name) const {
  if (std::isfinite(value) && value > 0.0f) return;
  fail(ErrorCategory::kInvalidArgument,
       concat("`", name, "`: expected a finite scale > 0, got ", value));
}

namespace {

// [first byte, one past the last byte] of a non-empty view with data; {0, 0} otherwise.
ArgChecker::ByteRange byte_range(const TensorView& t) {
  if (t.data() == nullptr || t.empty()) return {0, 0};
  std::int64_t last = 0;
  for (int d = 0; d < t.ndim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  const auto first = reinterpret_cast<std::uintptr_t>(t.data());
  return {first, first + std::uintptr_t((last + 1) * dtype_size(t.dtype()))};
}

}  // namespace

void ArgChecker::apart(const TensorView& out, std::string_view out_name, const TensorView& in,
                       std::string_view in_name) const {
  const Named o{&out, out_name}, i{&in, in_name};
  require_apart(o, byte_range(out), i, byte_range(in));
}

void ArgChecker::all_apart(std::span<const Named> outputs, std::span<const Named> inputs) const {
  constexpr std::size_t kMaxInputs = 16;
  require(inputs.size() <= kMaxInputs, ErrorCategory::kInternal, [&] {
    return concat("all_apart: at most ", kMaxInputs, " inputs, got ", inputs.size());
  });
  // The views with memory only (most optional ones are empty), then every pair compared inline:
  // the error path, which formats, is require_apart's.
  ByteRange in_ranges[kMaxInputs];
  std::size_t in_index[kMaxInputs], n = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const ByteRange r = byte_range(*inputs[i].view);
    if (r.first == r.second) continue;
    in_ranges[n] = r;
    in_index[n++] = i;
  }
  for (const Named& out : outputs) {
    const auto [out_begin, out_end] = byte_range(*out.view);
    if (out_begin == out_end) continue;
    for (std::size_t j = 0; j < n; ++j) {
      if (out_end > in_ranges[j].first && in_ranges[j].second > out_begin) {
        require_apart(out, {out_begin, out_end}, inputs[in_index[j]], in_ranges[j]);
      }
    }
  }
}

void ArgChecker::elements_apart(const TensorView& t, std::string_view name) const {
  if (t.empty()) return;
  // (stride, size) of the dims of size > 1, in increasing order (insertion sort: at most kMaxDims).
  std::array<std::pair<std::int64_t, std::int64_t>, kMaxDims> dims;
  int n = 0;
  for (int d = 0; d < t.ndim(); ++d) {
    if (t.size(d) <= 1) continue;
    const std::pair<std::int64_t, std::int64_t> dim{t.stride(d), t.size(d)};
    int i = n++;
    for (; i > 0 && dim < dims[i - 1]; --i) dims[i] = dims[i - 1];
    dims[i] = dim;
  }
  bool ok = true;
  std::int64_t span = 1;  // elements covered by the dims so far
  for (int i = 0; i < n; ++i) {
    const auto& [stride, size] = dims[i];
    ok = ok && stride > 0 && stride >= span;
    span = stride * (size - 1) + span;
  }
  require(ok, ErrorCategory::kInvalidArgument, [&] {
    return concat("`", name, "`: expected strides that keep every element apart, got ",
                  t.describe());
  });
}

void ArgChecker::same_view_or_apart(const TensorView& out, std::string_view out_name,
                                    const TensorView& in, std::string_view in_name) const {
  if (out.empty()) return;
  if (out.data() != in.data()) {
    apart(out, out_name, in, in_name);
    return;
  }
  bool same = out.dtype() == in.dtype() && out.ndim() == in.ndim();
  for (int d = 0; same && d < out.ndim(); ++d) {
    same = out.size(d) == in.size(d) && out.stride(d) == in.stride(d);
  }
  require(same, ErrorCategory::kInvalidArgument, [&] {
    return concat("`", out_name, "` aliases `", in_name,
                  "` as another view; an aliased output must be the same view, got ",
                  out.describe(), " and ", in.describe());
  });
}

void ArgChecker::outputs_apart(const TensorView& a, std::string_view a_name, const TensorView& b,
                               std::string_view b_name) const {
  const Named first{&a, a_name}, second{&b, b_name};
  require_apart(first, byte_range(a), second, byte_range(b), "two outputs may not share memory");
}

void ArgChecker::require_apart(const Named& out, ByteRange out_range, const Named& in,
                               ByteRange in_range, std::string_view why) const {
  const auto [out_begin, out_end] = out_range;
  const auto [in_begin, in_end] = in_range;
  if (out_begin == out_end || in_begin == in_end) return;
  if (out_end <= in_begin || in_end <= out_begin) return;
  fail(ErrorCategory::kInvalidArgument,
       concat("`", out.name, "`: expected memory apart from `", in.name, "` (", why, "), got ",
              out.view->describe(), " and ", in.view->describe()));
}

RowLayout ArgChecker::rows(const TensorView& t, std::string_view name) const {
  // A foldable view formats nothing; one that is not is folded again under its name, for the
  // error that says which argument it is.
  try {
    return fold_rows(t, {});
  } catch (const Error&) {
    return fold_rows(t, concat(op_, ": `", name, "`"));
  }
}

}  // namespace fp8mla
