// Shared helpers of the quantization op tests: deterministic and adversarial input data, buffer
// geometries (shape, strides, offset inside an allocation) that give the same views over host and
// device memory, poisoned buffers with guard bands, and the test cases of the three ops.
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
#include "fp8mla/quantize.hpp"
#include "fp8mla/tensor_view.hpp"

#if defined(__CUDACC__)
#include <cuda_runtime.h>

#include "cuda/common/runtime.hpp"
#endif

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

// Element `i` of a bf16, f16 or f32 array as fp32.
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

#if defined(__CUDACC__)
// A device allocation: poisoned payload between guard bands (cudaMalloc aligns to 256 bytes).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes, std::uint8_t poison = kPoison) : bytes_(bytes) {
    cuda::check(cudaMalloc(&base_, bytes + 2 * kGuardBytes), "cudaMalloc");
    const std::vector<std::uint8_t> front = expected_guard(0), back = expected_guard(1);
    cuda::check(cudaMemcpy(base_, front.data(), kGuardBytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    cuda::check(
        cudaMemcpy(base_ + kGuardBytes + bytes_, back.data(), kGuardBytes, cudaMemcpyHostToDevice),
        "cudaMemcpy");
    fill(poison);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : bytes_(other.bytes_), base_(std::exchange(other.base_, nullptr)) {}
  ~DeviceBuffer() {
    if (base_ != nullptr) cudaFree(base_);
  }

  void* data() const { return base_ + kGuardBytes; }
  std::size_t bytes() const { return bytes_; }
  void fill(std::uint8_t value) { cuda::check(cudaMemset(data(), value, bytes_), "cudaMemset"); }
  void upload(const void* host) {
    cuda::check(cudaMemcpy(data(), host, bytes_, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  // `n` bytes from payload offset `offset`.
  std::vector<std::uint8_t> download(std::size_t offset, std::size_t n) const {
    std::vector<std::uint8_t> host(n);
    cuda::check(cudaMemcpy(host.data(), base_ + kGuardBytes + offset, n, cudaMemcpyDeviceToHost),
                "cudaMemcpy");
    return host;
  }
  std::vector<std::uint8_t> download() const { return download(0, bytes_); }

  ::testing::AssertionResult guards_intact() const {
    for (int band = 0; band < 2; ++band) {
      std::vector<std::uint8_t> got(kGuardBytes);
      const std::uint8_t* at = band == 0 ? base_ : base_ + kGuardBytes + bytes_;
      cuda::check(cudaMemcpy(got.data(), at, kGuardBytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
      const ::testing::AssertionResult same = same_bytes(
          got, expected_guard(band),
          band == 0 ? "device guard before the payload" : "device guard after the payload");
      if (!same) return same;
    }
    return ::testing::AssertionSuccess();
  }

 private:
  std::vector<std::uint8_t> expected_guard(int band) const {
    std::vector<std::uint8_t> guard(kGuardBytes);
    const std::size_t start = band == 0 ? 0 : kGuardBytes + bytes_;
    for (std::size_t i = 0; i < kGuardBytes; ++i) guard[i] = guard_byte(start + i);
    return guard;
  }

  std::size_t bytes_;
  std::uint8_t* base_ = nullptr;
};

// Every host buffer copied into a fresh guarded device buffer.
inline std::vector<DeviceBuffer> upload(const std::vector<HostBuffer>& host) {
  std::vector<DeviceBuffer> device;
  for (const HostBuffer& h : host) {
    device.emplace_back(h.bytes());
    device.back().upload(h.data());
  }
  return device;
}

inline std::vector<void*> device_bases(const std::vector<DeviceBuffer>& device) {
  std::vector<void*> bases;
  for (const DeviceBuffer& d : device) bases.push_back(d.data());
  return bases;
}

// Sets the process-wide PDL switch for a scope and restores it after.
class PdlScope {
 public:
  explicit PdlScope(bool enabled) : saved_(cuda::pdl_enabled()) { cuda::set_pdl_enabled(enabled); }
  ~PdlScope() { cuda::set_pdl_enabled(saved_); }
  PdlScope(const PdlScope&) = delete;
  PdlScope& operator=(const PdlScope&) = delete;

 private:
  bool saved_;
};
#endif

// ---- Test cases of the three ops ---------------------------------------------------------------
// Each case lists its buffers (specs()[0] is the input, the rest outputs or scalar inputs), writes
// its inputs into host buffers (init) and runs its op on views over given buffers (run), so that
// the CPU and CUDA tests build identical calls.

inline std::int64_t rows_of(const std::vector<std::int64_t>& shape) {
  return product(std::span(shape).first(shape.size() - 1));
}

inline std::vector<std::int64_t> with_last(std::vector<std::int64_t> shape, std::int64_t last) {
  shape.back() = last;
  return shape;
}

enum class Fp8Scale { kValue, kMemory, kDynamic };

struct Fp8Case {
  DType in_dtype = DType::kBF16;
  DType out_dtype = DType::kE4M3;
  std::vector<std::int64_t> shape;  // of input and out
  std::int64_t in_pad = 0;          // the input's allocation is in_pad columns wider
  std::int64_t in_offset = 0;       // and the view starts in_offset columns in
  std::int64_t out_pad = 0;         // out rows are cols + out_pad apart
  Fp8Scale scale = Fp8Scale::kValue;
  float scale_inv = 1.0f;  // kValue and kMemory
  Data data = Data::kRandom;
  std::uint64_t seed = 1;

  // input, out, and the f32 scalar (scale_inv read, or dynamic scale written; shape [] or [1]).
  std::vector<Spec> specs() const {
    return {
        padded(in_dtype, shape, in_pad, in_offset), padded(out_dtype, shape, out_pad),
        dense(DType::kF32, seed % 2 ? std::vector<std::int64_t>{1} : std::vector<std::int64_t>{})};
  }
  void init(std::vector<HostBuffer>& buffers) const {
    fill_input(buffers[0].data(), in_dtype, specs()[0].buffer_elems, data, seed);
    if (scale == Fp8Scale::kMemory) std::memcpy(buffers[2].data(), &scale_inv, sizeof(float));
  }
  void run(std::span<void* const> bases, Device device, CudaStream stream = nullptr) const {
    const std::vector<Spec> s = specs();
    const TensorView in = s[0].view(bases[0], device), out = s[1].view(bases[1], device);
    const TensorView scalar = s[2].view(bases[2], device);
    switch (scale) {
      case Fp8Scale::kValue:
        quantize_fp8(in, out, scale_inv, stream);
        break;
      case Fp8Scale::kMemory:
        quantize_fp8(in, out, scalar, stream);
        break;
      case Fp8Scale::kDynamic:
        quantize_fp8_dynamic(in, out, scalar, stream);
        break;
    }
  }
  std::string describe() const {
    const char* scales[] = {"static by value", "static from memory", "dynamic"};
    return concat("quantize_fp8 ", dtype_name(in_dtype), shape_string(shape), " (pad ", in_pad,
                  ", offset ", in_offset, ") -> ", dtype_name(out_dtype), " (pad ", out_pad, "), ",
                  scales[int(scale)], " scale_inv ", scale_inv, ", ", data_name(data), " seed ",
                  seed);
  }
};

enum class ScaleLayout {
  kF32RowMajor,         // (G, 1)
  kF32ColMajor,         // (1, M)
  kF32TmaColMajor,      // (1, round_up(M, 4))
  kF32Pow2RowMajor,     // round_scale_to_pow2
  kF32Pow2TmaColMajor,  // round_scale_to_pow2
  kUe8m0RowMajor,
  kUe8m0ColMajor,
  kPackedRowMajor,     // i32 [M, ceil(G / 4)]
  kPackedTmaColMajor,  // i32 with strides (1, round_up(M, 4))
};

inline constexpr ScaleLayout kAllScaleLayouts[] = {
    ScaleLayout::kF32RowMajor,        ScaleLayout::kF32ColMajor,
    ScaleLayout::kF32TmaColMajor,     ScaleLayout::kF32Pow2RowMajor,
    ScaleLayout::kF32Pow2TmaColMajor, ScaleLayout::kUe8m0RowMajor,
    ScaleLayout::kUe8m0ColMajor,      ScaleLayout::kPackedRowMajor,
    ScaleLayout::kPackedTmaColMajor};

inline const char* layout_name(ScaleLayout layout) {
  const char* names[] = {
      "f32 row-major",      "f32 column-major",          "f32 TMA column-major",
      "f32 pow2 row-major", "f32 pow2 TMA column-major", "ue8m0 row-major",
      "ue8m0 column-major", "packed i32 row-major",      "packed i32 TMA column-major"};
  return names[int(layout)];
}

struct GroupCase {
  DType in_dtype = DType::kBF16;
  std::vector<std::int64_t> shape;  // of input and out
  std::int64_t in_pad = 0;
  std::int64_t in_offset = 0;
  std::int64_t out_pad = 0;
  int group_size = 128;
  ScaleLayout layout = ScaleLayout::kF32RowMajor;
  float eps = 1e-10f;
  Data data = Data::kRandom;
  std::uint64_t seed = 1;

  std::int64_t rows() const { return rows_of(shape); }
  std::int64_t groups() const { return shape.back() / group_size; }
  bool packed() const {
    return layout == ScaleLayout::kPackedRowMajor || layout == ScaleLayout::kPackedTmaColMajor;
  }
  DType scale_dtype() const {
    if (packed()) return DType::kI32;
    return layout == ScaleLayout::kUe8m0RowMajor || layout == ScaleLayout::kUe8m0ColMajor
               ? DType::kUE8M0
               : DType::kF32;
  }
  bool f32_pow2() const {
    return layout == ScaleLayout::kF32Pow2RowMajor || layout == ScaleLayout::kF32Pow2TmaColMajor;
  }
  // Scales rounded up to powers of two: UE8M0 storage, or f32 with round_scale_to_pow2.
  bool pow2() const { return scale_dtype() != DType::kF32 || f32_pow2(); }
  GroupQuantOptions options() const { return {group_size, eps, f32_pow2()}; }
  Spec scales() const {
    const std::int64_t m = rows(), width = packed() ? (groups() + 3) / 4 : groups();
    // With 0 rows the column stride is 1, as torch strides an empty dim (stride 0 is the separate
    // QuantizeArgs.ZeroRowsColumnMajorScales case).
    switch (layout) {
      case ScaleLayout::kF32ColMajor:
      case ScaleLayout::kUe8m0ColMajor:
        return {scale_dtype(), {m, width}, {1, std::max<std::int64_t>(m, 1)}, 0, m * width};
      case ScaleLayout::kF32TmaColMajor:
      case ScaleLayout::kF32Pow2TmaColMajor:
      case ScaleLayout::kPackedTmaColMajor: {
        const std::int64_t ld = round_up(m, 4);  // 16-byte aligned columns
        return {scale_dtype(), {m, width}, {1, std::max<std::int64_t>(ld, 1)}, 0, ld * width};
      }
      default:
        return dense(scale_dtype(), {m, width});
    }
  }

  std::vector<Spec> specs() const {
    return {padded(in_dtype, shape, in_pad, in_offset), padded(DType::kE4M3, shape, out_pad),
            scales()};
  }
  void init(std::vector<HostBuffer>& buffers) const {
    fill_input(buffers[0].data(), in_dtype, specs()[0].buffer_elems, data, seed);
  }
  void run(std::span<void* const> bases, Device device, CudaStream stream = nullptr) const {
    const std::vector<Spec> s = specs();
    quantize_fp8_per_token_group(s[0].view(bases[0], device), s[1].view(bases[1], device),
                                 s[2].view(bases[2], device), options(), stream);
  }
  std::string describe() const {
    return concat("quantize_fp8_per_token_group ", dtype_name(in_dtype), shape_string(shape),
                  " (pad ", in_pad, ", offset ", in_offset, ") -> out pad ", out_pad, ", group ",
                  group_size, ", scales ", layout_name(layout), ", eps ", eps, ", ",
                  data_name(data), " seed ", seed);
  }
};

enum class Nvfp4Scales { kSwizzled5d, kSwizzled2d, kLinear };

struct Nvfp4Case {
  DType in_dtype = DType::kBF16;
  std::vector<std::int64_t> shape;  // of the input; out has the last dim halved
  std::int64_t in_pad = 0;
  std::int64_t in_offset = 0;
  std::int64_t out_pad = 0;
  Nvfp4Scales scales = Nvfp4Scales::kSwizzled5d;
  std::int64_t scale_pad = 0;  // kLinear: scale rows are K/16 + scale_pad apart
  float global_scale = 1.0f;
  Data data = Data::kRandom;
  std::uint64_t seed = 1;

  std::int64_t rows() const { return rows_of(shape); }
  std::int64_t k_blocks() const { return shape.back() / 16; }
  Nvfp4ScaleLayout layout() const {
    return scales == Nvfp4Scales::kLinear ? Nvfp4ScaleLayout::kLinear
                                          : Nvfp4ScaleLayout::kSwizzled128x4;
  }

  // input, out, block_scales, global_scale.
  std::vector<Spec> specs() const {
    const std::int64_t m_tiles = (rows() + 127) / 128, k_tiles = (k_blocks() + 3) / 4;
    Spec block_scales = scales == Nvfp4Scales::kSwizzled5d
                            ? dense(DType::kE4M3, {m_tiles, k_tiles, 32, 4, 4})
                        : scales == Nvfp4Scales::kSwizzled2d
                            ? dense(DType::kE4M3, {m_tiles * 128, k_tiles * 4})
                            : padded(DType::kE4M3, {rows(), k_blocks()}, scale_pad);
    return {
        padded(in_dtype, shape, in_pad, in_offset),
        padded(DType::kE2M1x2, with_last(shape, shape.back() / 2), out_pad),
        std::move(block_scales),
        dense(DType::kF32, seed % 2 ? std::vector<std::int64_t>{1} : std::vector<std::int64_t>{})};
  }
  void init(std::vector<HostBuffer>& buffers) const {
    fill_input(buffers[0].data(), in_dtype, specs()[0].buffer_elems, data, seed);
    std::memcpy(buffers[3].data(), &global_scale, sizeof(float));
  }
  void run(std::span<void* const> bases, Device device, CudaStream stream = nullptr) const {
    const std::vector<Spec> s = specs();
    quantize_nvfp4(s[0].view(bases[0], device), s[1].view(bases[1], device),
                   s[2].view(bases[2], device), s[3].view(bases[3], device), layout(), stream);
  }
  std::string describe() const {
    const char* names[] = {"swizzled 5-d", "swizzled 2-d", "linear"};
    return concat("quantize_nvfp4 ", dtype_name(in_dtype), shape_string(shape), " (pad ", in_pad,
                  ", offset ", in_offset, ") -> out pad ", out_pad, ", scales ", names[int(scales)],
                  " (pad ", scale_pad, "), global_scale ", global_scale, ", ", data_name(data),
                  " seed ", seed);
  }
};

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
