// Shared cases of the mla_rope_quantize_fp8 tests (CPU semantics and CPU-vs-CUDA bytes): buffers
// and views built the same way over host or device memory, inputs written on the host, and an
// independent fp32 reference of the op's exact arithmetic. Reuses quantize_test_util.hpp's data,
// poisoned/guarded buffers and byte comparison.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "buffer_test_util.hpp"
#include "fp8mla/mla_prep.hpp"

namespace fp8mla::test {

// A view inside buffer `buffer` of a case.
struct ViewSpec {
  int buffer = 0;
  DType dtype = DType::kBF16;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  std::int64_t offset = 0;  // elements

  TensorView view(std::span<void* const> bases, Device device) const {
    return TensorView(static_cast<char*>(bases[buffer]) + offset * dtype_size(dtype), dtype, shape,
                      strides, device);
  }
  // Byte offset of element (i0, i1, i2) (missing indices 0).
  std::int64_t byte_at(std::int64_t i0, std::int64_t i1 = 0, std::int64_t i2 = 0) const {
    const std::int64_t idx[3] = {i0, i1, i2};
    std::int64_t e = offset;
    for (std::size_t d = 0; d < shape.size(); ++d) e += idx[d] * strides[d];
    return e * std::int64_t(dtype_size(dtype));
  }
};

// Buffer indices of a RopeCase.
enum RopeBuffer : int {
  kQNope,  // q_nope; with `strided`, q = [T, H, 192 + pad] holding q_nope and q_pe
  kQPe,
  kKNope,  // with `strided`, kv = [T, H, 256] (k_nope = kv[..., :128])
  kKPe,    // with `strided`, kv_a = [T, 576] holding kv_c and k_pe
  kKvC,
  kPositions,
  kCosSin,
  kQOut,
  kKOut,
  kCache,
  kSlots,
  kErrorFlag,
  kKRopeOut,  // with split_k: K's RoPE part, [T, 64] rows 80 apart (or [T, 1, 64])
  kNumRopeBuffers,
};

struct RopeCase {
  DType in_dtype = DType::kBF16;
  std::int64_t tokens = 3;
  std::int64_t heads = 16;
  RopeStyle style = RopeStyle::kInterleaved;
  DType position_dtype = DType::kI64;
  bool strided = false;     // slices of wider tensors (q[..., 128:], kv[..., :128], kv_a[:, 512:])
  bool k_pe_3d = false;     // k_pe as [T, 1, 64]
  bool misaligned = false;  // views one element past 16-byte boundaries: the scalar CUDA path
  std::int64_t out_head_pad = 0;  // q_out/k_out heads 192 + pad bytes apart
  // K split (k_rope_out): k_out [T, H, 128] in the same rows (bytes 128.. of a head untouched).
  bool split_k = false;
  // k_nope not given (K's nope part written elsewhere): k_out's nope bytes stay as they were;
  // with split_k k_out is not given either.
  bool no_k_nope = false;
  std::int64_t max_pos = 4096;
  std::int64_t cos_sin_pad = 0;  // cos_sin rows 64 + pad floats apart
  bool yarn = true;
  float q_scale_inv = 1.0f;
  float k_scale_inv = 1.0f;
  // Cache write (page_size 0: none).
  std::int64_t page_size = 0;
  std::int64_t cache_row_pad = 0;  // rows 576 + pad bytes apart
  DType slot_dtype = DType::kI64;
  float cache_scale_inv = 1.0f;
  bool with_error_flag = true;
  Data data = Data::kRandom;
  std::uint64_t seed = 1;

  std::int64_t num_pages() const {
    return page_size == 0 ? 0 : (tokens + tokens / 3 + page_size) / page_size + 1;
  }

  std::vector<ViewSpec> views() const {
    const std::int64_t T = tokens, H = heads, mis = misaligned ? 1 : 0;
    std::vector<ViewSpec> v(kNumRopeBuffers);
    const DType d = in_dtype;
    if (strided) {
      const std::int64_t qw = kMlaQkDim + 8;  // q rows 200 wide
      v[kQNope] = {kQNope, d, {T, H, 128}, {H * qw, qw, 1}, mis};
      v[kQPe] = {kQNope, d, {T, H, 64}, {H * qw, qw, 1}, 128 + mis};
      v[kKNope] = {kKNope, d, {T, H, 128}, {H * 256, 256, 1}, mis};
      const std::int64_t kw = kMlaLatentDim;
      v[kKvC] = {kKPe, d, {T, 512}, {kw, 1}, mis};
      v[kKPe] = k_pe_3d ? ViewSpec{kKPe, d, {T, 1, 64}, {kw, 64, 1}, 512 + mis}
                        : ViewSpec{kKPe, d, {T, 64}, {kw, 1}, 512 + mis};
    } else {
      v[kQNope] = {kQNope, d, {T, H, 128}, {H * 128, 128, 1}, mis};
      v[kQPe] = {kQPe, d, {T, H, 64}, {H * 64, 64, 1}, mis};
      v[kKNope] = {kKNope, d, {T, H, 128}, {H * 128, 128, 1}, mis};
      v[kKPe] = k_pe_3d ? ViewSpec{kKPe, d, {T, 1, 64}, {64, 64, 1}, mis}
                        : ViewSpec{kKPe, d, {T, 64}, {64, 1}, mis};
      v[kKvC] = {kKvC, d, {T, 512}, {512, 1}, mis};
    }
    v[kPositions] = {kPositions, position_dtype, {T}, {1}, 0};
    const std::int64_t cw = kMlaRopeDim + cos_sin_pad;
    v[kCosSin] = {kCosSin, DType::kF32, {max_pos, 64}, {cw, 1}, 0};
    const std::int64_t hw = kMlaQkDim + out_head_pad, tw = H * hw + 16;
    v[kQOut] = {kQOut, DType::kE4M3, {T, H, 192}, {tw, hw, 1}, mis};
    v[kKOut] = {kKOut, DType::kE4M3, {T, H, split_k ? 128 : 192}, {tw, hw, 1}, mis};
    v[kKRopeOut] = k_pe_3d ? ViewSpec{kKRopeOut, DType::kE4M3, {T, 1, 64}, {80, 64, 1}, mis}
                           : ViewSpec{kKRopeOut, DType::kE4M3, {T, 64}, {80, 1}, mis};
    const std::int64_t rw = kMlaLatentDim + cache_row_pad,
                       ps = std::max<std::int64_t>(page_size, 1);
    v[kCache] = {kCache, DType::kE4M3, {num_pages(), ps, 576}, {ps * rw + 32, rw, 1}, mis};
    v[kSlots] = {kSlots, slot_dtype, {T}, {1}, 0};
    v[kErrorFlag] = {kErrorFlag, DType::kI32, {1}, {1}, 0};
    return v;
  }

  // Bytes of each buffer: enough for every view inside it.
  std::vector<std::size_t> buffer_bytes() const {
    std::vector<std::size_t> bytes(kNumRopeBuffers, 16);
    for (const ViewSpec& s : views()) {
      std::int64_t last = s.offset;
      bool empty = false;
      for (std::size_t d = 0; d < s.shape.size(); ++d) {
        if (s.shape[d] == 0) empty = true;
        last += (s.shape[d] - 1) * s.strides[d];
      }
      if (!empty) {
        bytes[s.buffer] =
            std::max(bytes[s.buffer], std::size_t(last + 1) * dtype_size(s.dtype) + 64);
      }
    }
    return bytes;
  }

  RopeConfig config() const {
    RopeConfig c;
    if (yarn) c.yarn = YarnScaling{};
    return c;
  }

  // Token t's position and slot as init() writes them.
  std::int64_t position(std::int64_t t) const {
    Rng rng(seed * 7919 + std::uint64_t(t));
    const std::uint32_t r = rng.below(8);
    return r == 0 ? 0 : r == 1 ? max_pos - 1 : std::int64_t(rng.below(std::uint32_t(max_pos)));
  }

  std::vector<HostBuffer> buffers(std::uint8_t poison = kPoison) const {
    std::vector<HostBuffer> b;
    for (std::size_t bytes : buffer_bytes()) b.emplace_back(bytes, poison);
    return b;
  }

  void init(std::vector<HostBuffer>& b) const {
    for (int i : {kQNope, kQPe, kKNope, kKPe, kKvC}) {
      fill_input(b[i].data(), in_dtype, std::int64_t(b[i].bytes() / 2), data, seed * 16 + i);
    }
    const std::vector<ViewSpec> v = views();
    const std::vector<void*> bases = host_bases(b);
    for (std::int64_t t = 0; t < tokens; ++t)
      store_index(b[kPositions].data(), position_dtype, t, position(t));
    make_cos_sin_cache(v[kCosSin].view(bases, Device::cpu()), config());
    // Distinct slots in a shuffled order, every fifth token skipped (-1).
    const std::int64_t slots_total = num_pages() * std::max<std::int64_t>(page_size, 1);
    std::vector<std::int64_t> order(std::size_t(std::max<std::int64_t>(slots_total, 0)));
    std::iota(order.begin(), order.end(), 0);
    Rng rng(seed + 99);
    for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
    for (std::int64_t t = 0; t < tokens; ++t) {
      const std::int64_t slot = page_size == 0 || t % 5 == 4 ? -1 : order[std::size_t(t)];
      store_index(b[kSlots].data(), slot_dtype, t, slot);
    }
    std::memset(b[kErrorFlag].data(), 0, 4);
  }

  static void store_index(void* base, DType dtype, std::int64_t i, std::int64_t v) {
    if (dtype == DType::kI32) {
      static_cast<std::int32_t*>(base)[i] = std::int32_t(v);
    } else {
      static_cast<std::int64_t*>(base)[i] = v;
    }
  }
  static std::int64_t load_index(const void* base, DType dtype, std::int64_t i) {
    return dtype == DType::kI32 ? static_cast<const std::int32_t*>(base)[i]
                                : static_cast<const std::int64_t*>(base)[i];
  }

  MlaRopeQuantizeArgs args(std::span<void* const> bases, Device device) const {
    const std::vector<ViewSpec> v = views();
    MlaRopeQuantizeArgs a;
    a.q_nope = v[kQNope].view(bases, device);
    a.q_pe = v[kQPe].view(bases, device);
    if (!no_k_nope) a.k_nope = v[kKNope].view(bases, device);
    a.k_pe = v[kKPe].view(bases, device);
    a.positions = v[kPositions].view(bases, device);
    a.cos_sin = v[kCosSin].view(bases, device);
    a.style = style;
    a.q_scale_inv = q_scale_inv;
    a.k_scale_inv = k_scale_inv;
    a.q_out = v[kQOut].view(bases, device);
    if (!(no_k_nope && split_k)) a.k_out = v[kKOut].view(bases, device);
    if (split_k) a.k_rope_out = v[kKRopeOut].view(bases, device);
    if (page_size > 0) {
      LatentCacheWrite w;
      w.cache = v[kCache].view(bases, device);
      w.slot_mapping = v[kSlots].view(bases, device);
      w.scale_inv = cache_scale_inv;
      if (with_error_flag) w.error_flag = v[kErrorFlag].view(bases, device);
      a.cache_write = w;
      a.kv_c = v[kKvC].view(bases, device);
    }
    return a;
  }

  void run(std::span<void* const> bases, Device device, CudaStream stream = nullptr) const {
    mla_rope_quantize_fp8(args(bases, device), stream);
  }

  std::string describe() const {
    return concat("mla_rope_quantize_fp8 ", dtype_name(in_dtype), " T=", tokens, " H=", heads,
                  style == RopeStyle::kNeox ? " neox" : " interleaved", " positions ",
                  dtype_name(position_dtype), strided ? " strided" : " contiguous",
                  k_pe_3d ? " k_pe[T,1,64]" : " k_pe[T,64]", misaligned ? " misaligned" : "",
                  split_k ? " k_rope_out" : "", no_k_nope ? " no k_nope" : "", " out_head_pad ",
                  out_head_pad, " max_pos ", max_pos, " cos_sin_pad ", cos_sin_pad,
                  yarn ? " yarn" : " plain", " scales ", q_scale_inv, "/", k_scale_inv,
                  " page_size ", page_size, " (row pad ", cache_row_pad, ", slots ",
                  dtype_name(slot_dtype), ", scale_inv ", cache_scale_inv, ") ", data_name(data),
                  " seed ", seed);
  }
};

// The test's own fp32 RoPE of one 64-element row (the formula of fp8mla/mla_prep.hpp).
inline void reference_rope(const float* x, const float* cs, RopeStyle style, float* y) {
  for (int i = 0; i < 32; ++i) {
    const int a = style == RopeStyle::kInterleaved ? 2 * i : i;
    const int b = style == RopeStyle::kInterleaved ? 2 * i + 1 : i + 32;
    y[a] = std::fma(x[a], cs[i], -(x[b] * cs[32 + i]));
    y[b] = std::fma(x[b], cs[i], x[a] * cs[32 + i]);
  }
}

// The output buffers (q_out, k_out, cache) that a correct run leaves, given the initial buffers
// `b` (inputs written, outputs as poisoned): an independent fp32 reference. Tokens listed in
// `bad_position` get zero q_out/k_out rows and no cache row (the CUDA path's documented result).
inline void reference_outputs(const RopeCase& c, std::vector<HostBuffer>& b,
                              const std::vector<std::int64_t>& bad_position = {}) {
  const std::vector<ViewSpec> v = c.views();
  const auto in = [&](const ViewSpec& s, std::int64_t t, std::int64_t h, int i) {
    return load_f32(b[s.buffer].data() + s.byte_at(t, h, 0), s.dtype, i);
  };
  const auto elem = [&](const ViewSpec& s, std::int64_t t, std::int64_t i) {  // 2-d views
    return load_f32(b[s.buffer].data() + s.byte_at(t, i), s.dtype, 0);
  };
  const auto* cs_base = reinterpret_cast<const float*>(b[kCosSin].data());
  const bool k3 = c.k_pe_3d;
  for (std::int64_t t = 0; t < c.tokens; ++t) {
    const bool bad = std::find(bad_position.begin(), bad_position.end(), t) != bad_position.end();
    const std::int64_t pos = RopeCase::load_index(b[kPositions].data(), c.position_dtype, t);
    float k_x[64], k_y[64];
    const float* cs = bad ? nullptr : cs_base + pos * v[kCosSin].strides[0];
    for (int i = 0; i < 64; ++i) k_x[i] = k3 ? in(v[kKPe], t, 0, i) : elem(v[kKPe], t, i);
    if (!bad) reference_rope(k_x, cs, c.style, k_y);
    // K's RoPE part: in every head's k_out row, or once in k_rope_out's.
    std::uint8_t* k_rope_row = c.split_k ? b[kKRopeOut].data() + v[kKRopeOut].byte_at(t) : nullptr;
    if (k_rope_row != nullptr) {
      for (int i = 0; i < 64; ++i) k_rope_row[i] = bad ? 0 : encode_e4m3(k_y[i] * c.k_scale_inv);
    }
    for (std::int64_t h = 0; h < c.heads; ++h) {
      std::uint8_t* q = b[kQOut].data() + v[kQOut].byte_at(t, h);
      std::uint8_t* k = b[kKOut].data() + v[kKOut].byte_at(t, h);
      if (bad) {
        std::memset(q, 0, 192);
        if (!c.no_k_nope) std::memset(k, 0, c.split_k ? 128 : 192);
        if (c.no_k_nope && !c.split_k) std::memset(k + 128, 0, 64);
        continue;
      }
      float q_x[64], q_y[64];
      for (int i = 0; i < 64; ++i) q_x[i] = in(v[kQPe], t, h, i);
      reference_rope(q_x, cs, c.style, q_y);
      for (int i = 0; i < 128; ++i) {
        q[i] = encode_e4m3(in(v[kQNope], t, h, i) * c.q_scale_inv);
        if (!c.no_k_nope) k[i] = encode_e4m3(in(v[kKNope], t, h, i) * c.k_scale_inv);
      }
      for (int i = 0; i < 64; ++i) {
        q[128 + i] = encode_e4m3(q_y[i] * c.q_scale_inv);
        if (!c.split_k) k[128 + i] = encode_e4m3(k_y[i] * c.k_scale_inv);
      }
    }
    if (c.page_size == 0 || bad) continue;
    const std::int64_t slot = RopeCase::load_index(b[kSlots].data(), c.slot_dtype, t);
    if (slot < 0 || slot >= c.num_pages() * c.page_size) continue;
    std::uint8_t* row =
        b[kCache].data() + v[kCache].byte_at(slot / c.page_size, slot % c.page_size);
    for (int i = 0; i < 512; ++i) {
      row[i] = encode_e4m3(elem(v[kKvC], t, i) * c.cache_scale_inv);
    }
    for (int i = 0; i < 64; ++i) row[512 + i] = encode_e4m3(k_y[i] * c.cache_scale_inv);
  }
}

}  // namespace fp8mla::test

namespace fp8mla::test {

// The shared matrix of the CPU and CUDA tests: H in {1, 16, 128} x T in {0, 1, 3, 17, 64, 1000},
// two variants each, cycling through dtypes, RoPE styles, index dtypes, layouts (strided,
// contiguous, misaligned, padded), cos_sin tables, scales and cache page sizes.
inline std::vector<RopeCase> rope_matrix(Data data) {
  std::vector<RopeCase> cases;
  std::uint64_t k = 0;
  for (std::int64_t heads : {1, 16, 128}) {
    for (std::int64_t tokens : {0, 1, 3, 17, 64, 1000}) {
      for (int variant = 0; variant < 2; ++variant, ++k) {
        RopeCase c;
        c.tokens = tokens;
        c.heads = heads;
        c.in_dtype = k % 2 ? DType::kF16 : DType::kBF16;
        c.style = (k / 2) % 2 ? RopeStyle::kNeox : RopeStyle::kInterleaved;
        c.position_dtype = (k / 3) % 2 ? DType::kI32 : DType::kI64;
        c.strided = k % 3 != 0;
        c.k_pe_3d = (k / 5) % 2 == 1;
        c.split_k = k % 3 == 2;
        c.no_k_nope = k % 4 == 1;
        c.misaligned = k % 4 == 3;
        c.out_head_pad = k % 3 == 1 ? 16 : k % 3 == 2 ? 5 : 0;
        c.page_size = std::array<std::int64_t, 5>{0, 1, 16, 64, 128}[k % 5];
        c.cache_row_pad = k % 2 ? 64 : 0;
        c.slot_dtype = (k / 2) % 2 ? DType::kI32 : DType::kI64;
        c.yarn = k % 2 == 0;
        c.cos_sin_pad = std::array<std::int64_t, 3>{0, 4, 1}[k % 3];
        c.max_pos = k % 7 == 3 ? 37 : 4096;
        c.q_scale_inv = std::array<float, 3>{1.0f, 0.5f, 3.7f}[k % 3];
        c.k_scale_inv = std::array<float, 3>{1.0f, 2.0f, 0.11f}[(k + 1) % 3];
        c.cache_scale_inv = std::array<float, 3>{1.0f, 0.25f, 5.0f}[(k + 2) % 3];
        c.with_error_flag = k % 2 == 0;
        c.data = data;
        c.seed = k + 1;
        cases.push_back(c);
      }
    }
  }
  return cases;
}

}  // namespace fp8mla::test
