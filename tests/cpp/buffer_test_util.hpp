// Shared helpers of the op tests: deterministic and adversarial input data, buffer geometries
// (shape, strides, offset inside an allocation) that give the same views over host and device
// memory, and poisoned host buffers with guard bands. A test case type lists its buffers
// (specs()), writes its inputs (init) and runs its op on views over given buffers (run), so that
// the CPU and CUDA tests build identical calls.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "fp8mla/error.hpp"
#include "fp8mla/numerics.hpp"
#include "fp8mla/tensor_view.hpp"

namespace fp8mla::test {

// Fills outputs before every run: 0xFF is NaN in e4m3 and e5m2, in f32 scales and a NaN UE8M0
// byte, none of which an op ever writes, so a byte left unwritten cannot pass for a result.
inline constexpr std::uint8_t kPoison = 0xFF;

inline std::int64_t round_up(std::int64_t x, std::int64_t multiple) {
  return (x + multiple - 1) / multiple * multiple;
}

// splitmix64: a fixed, platform-independent sequence for a given seed.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::uint32_t below(std::uint32_t n) { return std::uint32_t(((next() >> 32) * n) >> 32); }
  float uniform() { return float(next() >> 40) * 0x1p-24f; }  // [0, 1)

 private:
  std::uint64_t state_;
};

// ---- Input data ---------------------------------------------------------------------------------

enum class Data {
  kRandom,       // finite values over many binades, a different range per block of 16
  kAdversarial,  // blocks of specials, zeros, subnormals, huge values and raw bit patterns
};

inline const char* data_name(Data data) {
  return data == Data::kRandom ? "random" : "adversarial";
}

// Values every encoder has a rule for: NaN and +-inf, past 448 and 57344, the 672 = 1.5 * 448 case
// of UE8M0 scales, e2m1 ties, -0, fp32 and bf16 subnormals.
inline constexpr float kSpecialValues[] = {
    std::numeric_limits<float>::quiet_NaN(),
    -std::numeric_limits<float>::quiet_NaN(),
    std::numeric_limits<float>::infinity(),
    -std::numeric_limits<float>::infinity(),
    448.0f,
    -448.0f,
    449.0f,
    464.0f,
    480.0f,
    672.0f,
    -672.0f,
    57344.0f,
    61440.0f,
    -61440.0f,
    65504.0f,
    1e6f,
    3e38f,
    -0.0f,
    0.0f,
    1e-40f,      // fp32 subnormal
    -0x1p-133f,  // bf16 subnormal
    0x1p-149f,
    6.0f,
    -6.0f,
    2.5f,  // e2m1 ties
    5.0f,
    0.25f,
    0.75f,
};

inline void store_f32(void* base, DType dtype, std::int64_t i, float v) {
  switch (dtype) {
    case DType::kBF16:
      static_cast<std::uint16_t*>(base)[i] = encode_bf16(v);
      break;
    case DType::kF16:
      static_cast<std::uint16_t*>(base)[i] = encode_f16(v);
      break;
    default:
      static_cast<float*>(base)[i] = v;
      break;
  }
}

// Element `i` of a bf16, f16 or f32 array as fp32 (written here, not taken from the CPU ops, so
// that the references stay independent of what they check).
inline float load_f32(const void* base, DType dtype, std::int64_t i) {
  switch (dtype) {
    case DType::kBF16:
      return decode_bf16(static_cast<const std::uint16_t*>(base)[i]);
    case DType::kF16:
      return decode_f16(static_cast<const std::uint16_t*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

// Writes `n` elements of `dtype` (bf16, f16 or f32) at `base`.
inline void fill_input(void* base, DType dtype, std::int64_t n, Data data, std::uint64_t seed) {
  Rng rng(seed);
  const auto random_value = [&](int top_exp) {
    const float magnitude = std::ldexp(1.0f + rng.uniform(), top_exp - int(rng.below(8)));
    return rng.below(2) ? -magnitude : magnitude;
  };
  std::int64_t zeros_until = 0;
  for (std::int64_t begin = 0; begin < n; begin += 16) {
    const std::int64_t end = std::min<std::int64_t>(begin + 16, n);
    const int top_exp = int(rng.below(18)) - 8;  // blocks from ~2^-16 to ~2^10
    // Whole runs of 128 zeros, so that groups of 64 and 128 and whole rows see amax = 0.
    if (data == Data::kAdversarial && begin % 128 == 0 && rng.below(6) == 0) {
      zeros_until = begin + 128;
    }
    const std::uint32_t mode = begin < zeros_until ? 3 : data == Data::kRandom ? 0 : rng.below(14);
    for (std::int64_t i = begin; i < end; ++i) {
      if (mode >= 12) {  // raw bits: signaling and negative NaNs, payloads, subnormals
        if (dtype == DType::kF32) {
          static_cast<std::uint32_t*>(base)[i] = std::uint32_t(rng.next());
        } else {
          static_cast<std::uint16_t*>(base)[i] = std::uint16_t(rng.next());
        }
        continue;
      }
      float v = 0.0f;
      if (mode < 3) {
        v = random_value(top_exp);
      } else if (mode < 5) {
        v = rng.below(2) ? 0.0f : -0.0f;
      } else if (mode < 8) {
        v = rng.below(4) == 0 ? kSpecialValues[rng.below(std::size(kSpecialValues))]
                              : random_value(top_exp);
      } else if (mode < 10) {
        v = random_value(8 + int(rng.below(14)));  // past 448 and 57344
      } else {
        v = random_value(-120 - int(rng.below(30)));  // fp32 and bf16 subnormals
      }
      store_f32(base, dtype, i, v);
    }
  }
}

// ---- Buffer geometry ---------------------------------------------------------------------------

inline std::int64_t product(std::span<const std::int64_t> sizes) {
  std::int64_t n = 1;
  for (std::int64_t s : sizes) n *= s;
  return n;
}

inline std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> strides(shape.size());
  std::int64_t stride = 1;
  for (std::size_t d = shape.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= std::max<std::int64_t>(shape[d], 1);
  }
  return strides;
}

inline std::string shape_string(std::span<const std::int64_t> sizes) {
  std::string s = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) s += concat(i ? ", " : "", sizes[i]);
  return s + "]";
}

// A view inside an allocation: the same Spec gives the same view over host or device memory.
struct Spec {
  DType dtype = DType::kF32;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  std::int64_t offset = 0;        // elements from the allocation's start to the view's first
  std::int64_t buffer_elems = 0;  // elements the allocation holds

  std::size_t bytes() const { return std::size_t(buffer_elems) * dtype_size(dtype); }
  TensorView view(void* base, Device device = Device::cpu()) const {
    return TensorView(static_cast<char*>(base) + offset * dtype_size(dtype), dtype, shape, strides,
                      device);
  }
};

inline Spec dense(DType dtype, std::vector<std::int64_t> shape) {
  std::vector<std::int64_t> strides = contiguous_strides(shape);
  const std::int64_t n = product(shape);
  return {dtype, std::move(shape), std::move(strides), 0, n};
}

// `shape` inside an allocation whose last dim is `pad` elements wider, starting `offset` (<= pad)
// columns in: rows of the view are cols + pad apart.
inline Spec padded(DType dtype, std::vector<std::int64_t> shape, std::int64_t pad,
                   std::int64_t offset = 0) {
  std::vector<std::int64_t> alloc = shape;
  alloc.back() += pad;
  return {dtype, std::move(shape), contiguous_strides(alloc), offset, product(alloc)};
}

// ---- Poisoned buffers with guard bands ----------------------------------------------------------

inline constexpr std::size_t kGuardBytes = 256;

// Guard bytes vary with their position, so a shifted copy of them is caught too.
inline std::uint8_t guard_byte(std::size_t position) {
  return std::uint8_t(0xA5u ^ (position * 0x3Du));
}

// A host allocation: a 256-byte aligned payload filled with a poison byte, between guard bands.
class HostBuffer {
 public:
  explicit HostBuffer(std::size_t bytes, std::uint8_t poison = kPoison)
      : bytes_(bytes), storage_(bytes + 3 * kGuardBytes) {
    const auto base = reinterpret_cast<std::uintptr_t>(storage_.data());
    front_ = std::size_t(round_up(std::int64_t(base + kGuardBytes), 256)) - base;
    for (std::size_t i = 0; i < storage_.size(); ++i) storage_[i] = guard_byte(i);
    fill(poison);
  }

  std::uint8_t* data() { return storage_.data() + front_; }
  const std::uint8_t* data() const { return storage_.data() + front_; }
  std::size_t bytes() const { return bytes_; }
  std::span<const std::uint8_t> payload() const { return {data(), bytes_}; }
  void fill(std::uint8_t value) { std::memset(data(), value, bytes_); }

  ::testing::AssertionResult guards_intact() const {
    for (std::size_t i = 0; i < storage_.size(); ++i) {
      if (i >= front_ && i < front_ + bytes_) continue;
      if (storage_[i] != guard_byte(i)) {
        return ::testing::AssertionFailure()
               << "host guard byte at payload offset " << std::int64_t(i) - std::int64_t(front_)
               << " (payload " << bytes_ << " bytes) was overwritten";
      }
    }
    return ::testing::AssertionSuccess();
  }

 private:
  std::size_t bytes_;
  std::vector<std::uint8_t> storage_;
  std::size_t front_ = 0;
};

// Byte-for-byte equality, listing the first differences.
inline ::testing::AssertionResult same_bytes(std::span<const std::uint8_t> got,
                                             std::span<const std::uint8_t> want,
                                             const std::string& what) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << what << ": " << got.size() << " bytes, expected " << want.size();
  }
  std::size_t mismatches = 0;
  std::string first;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    if (++mismatches <= 8) {
      first += concat("\n  byte ", i, ": got 0x", std::hex, int(got[i]), ", expected 0x",
                      int(want[i]), std::dec);
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << mismatches << " of " << got.size() << " bytes differ" << first;
}

// Calls fn(i, offset) for every element of `v` in row-major logical order: `i` counts elements,
// `offset` is in elements from v.data() (strides applied by an odometer over the dims).
template <typename Fn>
void for_each_element(const TensorView& v, Fn fn) {
  const std::int64_t n = v.numel();
  const std::span<const std::int64_t> shape = v.shape(), strides = v.strides();
  std::int64_t index[kMaxDims] = {};
  std::int64_t offset = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    fn(i, offset);
    for (int d = v.ndim() - 1; d >= 0; --d) {
      if (++index[d] < shape[d]) {
        offset += strides[d];
        break;
      }
      offset -= (shape[d] - 1) * strides[d];
      index[d] = 0;
    }
  }
}

// The payload pointers of host buffers, in order (what a case's views are built on).
inline std::vector<void*> host_bases(std::vector<HostBuffer>& host) {
  std::vector<void*> bases;
  for (HostBuffer& h : host) bases.push_back(h.data());
  return bases;
}

inline std::int64_t rows_of(const std::vector<std::int64_t>& shape) {
  return product(std::span(shape).first(shape.size() - 1));
}

inline std::vector<std::int64_t> with_last(std::vector<std::int64_t> shape, std::int64_t last) {
  shape.back() = last;
  return shape;
}

// Host buffers of a case: outputs poisoned with `poison`, inputs written.
template <typename Case>
std::vector<HostBuffer> host_buffers(const Case& c, std::uint8_t poison = kPoison) {
  std::vector<HostBuffer> buffers;
  for (const Spec& spec : c.specs()) buffers.emplace_back(spec.bytes(), poison);
  c.init(buffers);
  return buffers;
}

// Runs the CPU op of a case on its host buffers.
template <typename Case>
void run_cpu(const Case& c, std::vector<HostBuffer>& buffers) {
  std::vector<void*> bases;
  for (HostBuffer& b : buffers) bases.push_back(b.data());
  c.run(bases, Device::cpu());
}

}  // namespace fp8mla::test
