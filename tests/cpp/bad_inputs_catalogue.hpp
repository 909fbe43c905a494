// The catalogue of bad inputs: every entry makes one bad call on real host buffers with guard
// bands and expects an fp8mla::Error of a given category whose message names what was expected
// and what was given; after the rejected call every byte of every buffer (outputs included) and
// of the guard bands around them must be as it was.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "buffer_test_util.hpp"
#include "fp8mla/error.hpp"
#include "fp8mla/mla_prep.hpp"
#include "fp8mla/tensor_view.hpp"

namespace fp8mla::test {

// How a view lies in its allocation: explicit strides (empty: row-major), a byte offset from the
// allocation's 256-byte aligned start (an odd one misaligns it) and the device it claims.
struct Placement {
  std::vector<std::int64_t> strides;
  std::int64_t byte_offset = 0;
  Device device = Device::cpu();
};

// Owns the buffers of one call. Inputs hold known bytes (finite values), outputs the poison byte;
// each buffer's bytes are recorded when it is made, for unchanged().
class Arena {
 public:
  TensorView input(DType dtype, std::vector<std::int64_t> shape, Placement at = {}) {
    return make(dtype, std::move(shape), std::move(at), /*output=*/false);
  }
  TensorView output(DType dtype, std::vector<std::int64_t> shape, Placement at = {}) {
    return make(dtype, std::move(shape), std::move(at), /*output=*/true);
  }
  // A contiguous 1-d i32 or i64 tensor holding `values`.
  TensorView ints(DType dtype, const std::vector<std::int64_t>& values, Placement at = {}) {
    auto buffer = std::make_unique<HostBuffer>(values.size() * 8 + 8);
    std::uint8_t* base = buffer->data() + at.byte_offset;
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (dtype == DType::kI64) {
        std::memcpy(base + 8 * i, &values[i], 8);
      } else {
        const auto v = std::int32_t(values[i]);
        std::memcpy(base + 4 * i, &v, 4);
      }
    }
    const std::vector<std::int64_t> shape = {std::int64_t(values.size())};
    const TensorView view = at.strides.empty()
                                ? TensorView(base, dtype, shape, at.device)
                                : TensorView(base, dtype, shape, at.strides, at.device);
    keep(std::move(buffer));
    return view;
  }
  // One f32 holding `value`, shape [1].
  TensorView scalar(float value, Device device = Device::cpu()) {
    auto buffer = std::make_unique<HostBuffer>(4);
    std::memcpy(buffer->data(), &value, 4);
    const TensorView view(buffer->data(), DType::kF32, {1}, device);
    keep(std::move(buffer));
    return view;
  }

  // Every buffer holds the bytes it held when made, and no guard byte changed.
  ::testing::AssertionResult unchanged() const {
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      const auto got = buffers_[i]->payload();
      const ::testing::AssertionResult same =
          same_bytes(got, recorded_[i], concat("buffer ", i, " of ", buffers_.size()));
      if (!same) return same;
      ::testing::AssertionResult guards = buffers_[i]->guards_intact();
      if (!guards) return guards << " (buffer " << i << ")";
    }
    return ::testing::AssertionSuccess();
  }

 private:
  TensorView make(DType dtype, std::vector<std::int64_t> shape, Placement at, bool output) {
    std::vector<std::int64_t> strides =
        at.strides.empty() ? contiguous_strides(shape) : std::move(at.strides);
    std::int64_t last = 0;  // the farthest element from the first, in elements
    bool empty = false;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      empty = empty || shape[d] == 0;
      last += (shape[d] - 1) * strides[d];
    }
    // A huge view (a size no buffer could hold) keeps a small buffer: the op must reject it
    // before it touches memory, or the guard bands show it did.
    const std::int64_t elems = empty || last > (1 << 22) ? 1 : last + 1;
    auto buffer = std::make_unique<HostBuffer>(
        std::size_t(elems * dtype_size(dtype) + at.byte_offset), output ? kPoison : 0);
    if (!output) fill_known(*buffer, dtype, elems, at.byte_offset);
    const TensorView view(buffer->data() + at.byte_offset, dtype, shape, strides, at.device);
    keep(std::move(buffer));
    return view;
  }

  static void fill_known(HostBuffer& b, DType dtype, std::int64_t elems, std::int64_t offset) {
    const bool floats = dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF32;
    if (floats && offset % dtype_size(dtype) == 0) {
      fill_input(b.data() + offset, dtype, elems, Data::kRandom, 7);
      return;
    }
    // Finite fp8 bytes (never 0x7F/0xFF, the e4m3 NaNs), and small integers.
    for (std::size_t i = 0; i < b.bytes(); ++i) b.data()[i] = std::uint8_t((i * 37) & 0x3E);
  }

  void keep(std::unique_ptr<HostBuffer> buffer) {
    recorded_.emplace_back(buffer->payload().begin(), buffer->payload().end());
    buffers_.push_back(std::move(buffer));
  }

  std::vector<std::unique_ptr<HostBuffer>> buffers_;
  std::vector<std::vector<std::uint8_t>> recorded_;
};

struct BadInput {
  std::string name;
  std::function<void(Arena&)> call;
  ErrorCategory category;
  std::vector<std::string> needles;  // what was expected and what was given
};

// Makes the call of `entry`: an Error of its category naming every needle, buffers unchanged.
inline void expect_rejected(const BadInput& entry) {
  SCOPED_TRACE(entry.name);
  Arena arena;
  try {
    entry.call(arena);
    ADD_FAILURE() << entry.name << ": expected an fp8mla::Error, the call returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), entry.category) << e.what();
    for (const std::string& needle : entry.needles) {
      EXPECT_NE(e.message().find(needle), std::string::npos)
          << entry.name << ": message lacks '" << needle << "': " << e.message();
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << entry.name << ": expected an fp8mla::Error, got " << e.what();
  }
  EXPECT_TRUE(arena.unchanged()) << entry.name;
}

// The call an entry breaks, unbroken: it must succeed, so that each entry fails by its one bad
// argument and not by the rest of its call.
struct ValidCall {
  std::string name;
  std::function<void(Arena&)> call;
};

// The entries of each part of the catalogue (bad_inputs_*_test.cpp), and their valid calls.
std::vector<BadInput> quantize_bad_inputs();
std::vector<BadInput> mla_prep_bad_inputs();
std::vector<BadInput> attention_bad_inputs();
std::vector<BadInput> model_bad_inputs();
std::vector<ValidCall> quantize_valid_calls();
std::vector<ValidCall> mla_prep_valid_calls();
std::vector<ValidCall> attention_valid_calls();
std::vector<ValidCall> model_valid_calls();

// mla_kv_pack_quantize_fp8's arguments (and the backends' pack_prefix_chunk_kv's) for `tokens`
// tokens of `heads` heads, valid as they are: entries replace one of them.
inline MlaKvPackArgs pack_args(Arena& a, std::int64_t tokens, std::int64_t heads) {
  MlaKvPackArgs p;
  p.k_nope = a.input(DType::kBF16, {tokens, heads, 128});
  p.k_pe = a.input(DType::kBF16, {tokens, 64});
  p.v = a.input(DType::kBF16, {tokens, heads, 128});
  p.k_out = a.output(DType::kE4M3, {tokens, heads, 192});
  p.v_out = a.output(DType::kE4M3, {tokens, heads, 128});
  return p;
}

// mla_rope_quantize_fp8's arguments (and the prepare hook's Q/K part): 2 tokens, 2 heads,
// positions 0 and 1 of a 16-position cos/sin cache, with the cache write into 2 pages of 4 slots
// when `cache`; valid as they are: entries break one of them.
inline MlaRopeQuantizeArgs rope_args(Arena& a, bool cache = false) {
  MlaRopeQuantizeArgs r;
  r.q_nope = a.input(DType::kBF16, {2, 2, 128});
  r.q_pe = a.input(DType::kBF16, {2, 2, 64});
  r.k_nope = a.input(DType::kBF16, {2, 2, 128});
  r.k_pe = a.input(DType::kBF16, {2, 64});
  r.positions = a.ints(DType::kI32, {0, 1});
  r.cos_sin = a.input(DType::kF32, {16, 64});
  r.q_out = a.output(DType::kE4M3, {2, 2, 192});
  r.k_out = a.output(DType::kE4M3, {2, 2, 192});
  if (cache) {
    r.cache_write =
        LatentCacheWrite{a.input(DType::kE4M3, {2, 4, 576}), a.ints(DType::kI32, {0, 5}), 1.0f, {}};
    r.kv_c = a.input(DType::kBF16, {2, 512});
  }
  return r;
}

}  // namespace fp8mla::test
