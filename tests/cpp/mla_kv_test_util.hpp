// Shared cases of the latent-cache op tests (mla_kv_cache_write, mla_kv_gather,
// mla_kv_pack_quantize_fp8, mla_v_quantize_fp8): buffer geometries that give the same views over
// host and device memory, deterministic inputs, and references written on logical indices.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "buffer_test_util.hpp"
#include "fp8mla/mla_prep.hpp"

namespace fp8mla::test {

// Element (t, h, i) of a view described by `spec`, in elements from the allocation's start.
inline std::int64_t element_at(const Spec& s, std::int64_t t, std::int64_t h, std::int64_t i) {
  if (s.shape.size() == 2) return s.offset + t * s.strides[0] + i;
  return s.offset + t * s.strides[0] + h * s.strides[1] + i * s.strides[2];
}

inline void store_slot(void* base, DType dtype, std::int64_t i, std::int64_t slot) {
  if (dtype == DType::kI32) {
    static_cast<std::int32_t*>(base)[i] = std::int32_t(slot);
  } else {
    static_cast<std::int64_t*>(base)[i] = slot;
  }
}

// A paged e4m3 cache [num_pages, page_size, 576] with row_pad bytes after each row and page_pad
// bytes after each page.
struct CacheGeometry {
  std::int64_t num_pages = 4;
  std::int64_t page_size = 16;
  std::int64_t row_pad = 0;
  std::int64_t page_pad = 0;

  std::int64_t capacity() const { return num_pages * page_size; }
  std::int64_t row_stride() const { return kMlaLatentDim + row_pad; }
  std::int64_t page_stride() const { return page_size * row_stride() + page_pad; }
  Spec spec() const {
    return {DType::kE4M3,
            {num_pages, page_size, kMlaLatentDim},
            {page_stride(), row_stride(), 1},
            0,
            num_pages * page_stride()};
  }
  std::int64_t row_offset(std::int64_t slot) const {
    return slot / page_size * page_stride() + slot % page_size * row_stride();
  }
  std::string describe() const {
    return concat("cache [", num_pages, ", ", page_size, ", 576] (row pad ", row_pad, ", page pad ",
                  page_pad, ")");
  }
};

// `n` distinct slots in [0, capacity) in a random order (n <= capacity).
inline std::vector<std::int64_t> distinct_slots(std::int64_t n, std::int64_t capacity,
                                                std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int64_t> slots;
  if (capacity <= 4 * n + 64) {
    std::vector<std::int64_t> all(static_cast<std::size_t>(capacity));
    for (std::int64_t i = 0; i < capacity; ++i) all[std::size_t(i)] = i;
    for (std::int64_t i = 0; i < n; ++i) {
      std::swap(all[std::size_t(i)], all[std::size_t(i + rng.below(std::uint32_t(capacity - i)))]);
    }
    slots.assign(all.begin(), all.begin() + n);
  } else {
    std::unordered_set<std::int64_t> used;
    while (std::int64_t(slots.size()) < n) {
      const std::int64_t s = std::int64_t(rng.next() % std::uint64_t(capacity));
      if (used.insert(s).second) slots.push_back(s);
    }
  }
  return slots;
}

// ---- mla_kv_cache_write -------------------------------------------------------------------

struct KvWriteCase {
  DType dtype = DType::kBF16;
  std::int64_t tokens = 0;
  CacheGeometry cache;
  std::int64_t kv_pad = 0, kv_offset = 0;  // kv_c rows 512 + kv_pad apart, kv_offset in
  bool k_pe_3d = false;                    // [T, 1, 64] rather than [T, 64]
  std::int64_t k_pe_pad = 0;
  DType slot_dtype = DType::kI64;
  int skip_every = 0;                        // every skip_every-th token has slot -1 (0: none)
  std::vector<std::int64_t> bad;             // tokens given an out-of-range slot (CUDA tests)
  std::vector<std::int64_t> explicit_slots;  // overrides the generated slots when not empty
  float scale_inv = 1.0f;
  Data data = Data::kRandom;
  std::uint64_t seed = 1;
  bool with_flag = true;

  std::vector<std::int64_t> slots() const {
    if (!explicit_slots.empty()) return explicit_slots;
    std::int64_t used = 0;
    for (std::int64_t t = 0; t < tokens; ++t) used += !(skip_every && t % skip_every == 1);
    const std::vector<std::int64_t> pick = distinct_slots(used, cache.capacity(), seed * 7 + 3);
    std::vector<std::int64_t> s;
    std::size_t next = 0;
    for (std::int64_t t = 0; t < tokens; ++t) {
      s.push_back(skip_every && t % skip_every == 1 ? -1 : pick[next++]);
    }
    for (std::size_t i = 0; i < bad.size(); ++i) {
      const std::int64_t b = bad[i];
      s[std::size_t(b)] = i % 3 == 0   ? cache.capacity()
                          : i % 3 == 1 ? -2
                                       : cache.capacity() + 12345;
    }
    return s;
  }

  // kv_c, k_pe, slot_mapping, cache, error_flag.
  std::vector<Spec> specs() const {
    return {padded(dtype, {tokens, kMlaKvLoraRank}, kv_pad, kv_offset),
            k_pe_3d ? padded(dtype, {tokens, 1, kMlaRopeDim}, k_pe_pad)
                    : padded(dtype, {tokens, kMlaRopeDim}, k_pe_pad),
            dense(slot_dtype, {tokens}), cache.spec(), dense(DType::kI32, {1})};
  }
  void init(std::vector<HostBuffer>& b) const {
    const std::vector<Spec> s = specs();
    fill_input(b[0].data(), dtype, s[0].buffer_elems, data, seed);
    fill_input(b[1].data(), dtype, s[1].buffer_elems, data, seed + 1000);
    const std::vector<std::int64_t> sl = slots();
    for (std::int64_t t = 0; t < tokens; ++t) store_slot(b[2].data(), slot_dtype, t, sl[t]);
    Rng rng(seed * 31 + 7);  // the cache before the write: random bytes
    for (std::size_t i = 0; i < b[3].bytes(); ++i) b[3].data()[i] = std::uint8_t(rng.next());
    std::memset(b[4].data(), 0, 4);
  }
  void run(std::span<void* const> bases, Device device, CudaStream stream = nullptr) const {
    const std::vector<Spec> s = specs();
    LatentCacheWrite w;
    w.cache = s[3].view(bases[3], device);
    w.slot_mapping = s[2].view(bases[2], device);
    w.scale_inv = scale_inv;
    if (with_flag) w.error_flag = s[4].view(bases[4], device);
    mla_kv_cache_write(s[0].view(bases[0], device), s[1].view(bases[1], device), w, stream);
  }
  // The cache after the write, from the buffers before it (bad slots skipped).
  std::vector<std::uint8_t> expected_cache(const std::vector<HostBuffer>& before) const {
    const std::vector<Spec> s = specs();
    std::vector<std::uint8_t> out(before[3].payload().begin(), before[3].payload().end());
    const std::vector<std::int64_t> sl = slots();
    for (std::int64_t t = 0; t < tokens; ++t) {
      if (sl[t] < 0 || sl[t] >= cache.capacity()) continue;
      std::uint8_t* row = out.data() + cache.row_offset(sl[t]);
      for (int i = 0; i < kMlaKvLoraRank; ++i) {
        row[i] =
            encode_e4m3(load_f32(before[0].data(), dtype, element_at(s[0], t, 0, i)) * scale_inv);
      }
      for (int i = 0; i < kMlaRopeDim; ++i) {
        row[kMlaKvLoraRank + i] =
            encode_e4m3(load_f32(before[1].data(), dtype, element_at(s[1], t, 0, i)) * scale_inv);
      }
    }
    return out;
  }
  std::string describe() const {
    return concat("mla_kv_cache_write ", dtype_name(dtype), " T=", tokens, " ", cache.describe(),
                  ", kv pad ", kv_pad, " offset ", kv_offset, ", k_pe ", k_pe_3d ? "3-d" : "2-d",
                  " pad ", k_pe_pad, ", slots ", dtype_name(slot_dtype), " skip every ", skip_every,
                  ", ", bad.size(), " bad, scale_inv ", scale_inv, ", ", data_name(data), " seed ",
                  seed);
  }
};

// ---- mla_kv_gather ------------------------------------------------------------------------

struct KvGatherCase {
  std::int64_t tokens = 0;
  CacheGeometry cache;
  DType slot_dtype = DType::kI64;
  std::int64_t kv_pad = 0, k_pe_pad = 0;  // output row padding (elements)
  bool k_pe_3d = false;
  std::vector<std::int64_t> bad;  // tokens given an out-of-range slot (CUDA tests)
  std::vector<std::int64_t> explicit_slots;
  float scale = 1.0f;
  std::uint64_t seed = 1;
  bool with_flag = true;

  std::vector<std::int64_t> slots() const {
    if (!explicit_slots.empty()) return explicit_slots;
    Rng rng(seed * 13 + 5);
    std::vector<std::int64_t> s;  // repeats allowed
    for (std::int64_t t = 0; t < tokens; ++t) {
      s.push_back(std::int64_t(rng.next() % std::uint64_t(cache.capacity())));
    }
    for (std::size_t i = 0; i < bad.size(); ++i) {
      s[std::size_t(bad[i])] = i % 2 ? -1 : cache.capacity() + std::int64_t(i);
    }
    return s;
  }
  // cache, slots, kv_c_out, k_pe_out, error_flag.
  std::vector<Spec> specs() const {
    return {cache.spec(), dense(slot_dtype, {tokens}),
            padded(DType::kBF16, {tokens, kMlaKvLoraRank}, kv_pad),
            k_pe_3d ? padded(DType::kBF16, {tokens, 1, kMlaRopeDim}, k_pe_pad)
                    : padded(DType::kBF16, {tokens, kMlaRopeDim}, k_pe_pad),
            dense(DType::kI32, {1})};
  }
  void init(std::vector<HostBuffer>& b) const {
    Rng rng(seed * 31 + 11);  // every byte value, NaN codes 0x7F/0xFF included
    for (std::size_t i = 0; i < b[0].bytes(); ++i) b[0].data()[i] = std::uint8_t(rng.next());
    const std::vector<std::int64_t> sl = slots();
    for (std::int64_t t = 0; t < tokens; ++t) store_slot(b[1].data(), slot_dtype, t, sl[t]);
    std::memset(b[4].data(), 0, 4);
  }
  void run(std::span<void* const> bases, Device device, CudaStream stream = nullptr) const {
    const std::vector<Spec> s = specs();
    mla_kv_gather(s[0].view(bases[0], device), s[1].view(bases[1], device), scale,
                  s[2].view(bases[2], device), s[3].view(bases[3], device),
                  with_flag ? s[4].view(bases[4], device) : TensorView(), stream);
  }
  // Expected kv_c_out and k_pe_out buffers (bad slots: zeros), from the poisoned buffers.
  std::vector<std::vector<std::uint8_t>> expected_outputs(
      const std::vector<HostBuffer>& before) const {
    const std::vector<Spec> s = specs();
    std::vector<std::vector<std::uint8_t>> out;
    for (int k : {2, 3}) out.emplace_back(before[k].payload().begin(), before[k].payload().end());
    const std::vector<std::int64_t> sl = slots();
    for (std::int64_t t = 0; t < tokens; ++t) {
      const bool ok = sl[t] >= 0 && sl[t] < cache.capacity();
      const std::uint8_t* row = before[0].data() + (ok ? cache.row_offset(sl[t]) : 0);
      for (int i = 0; i < kMlaLatentDim; ++i) {
        const bool kv = i < kMlaKvLoraRank;
        const std::uint16_t v = ok ? encode_bf16(decode_e4m3(row[i]) * scale) : 0;
        const std::int64_t at =
            kv ? element_at(s[2], t, 0, i) : element_at(s[3], t, 0, i - kMlaKvLoraRank);
        std::memcpy(out[kv ? 0 : 1].data() + at * 2, &v, 2);
      }
    }
    return out;
  }
  std::string describe() const {
    return concat("mla_kv_gather T=", tokens, " ", cache.describe(), ", slots ",
                  dtype_name(slot_dtype), ", out pads ", kv_pad, "/", k_pe_pad, ", k_pe ",
                  k_pe_3d ? "3-d" : "2-d", ", ", bad.size(), " bad, scale ", scale, ", seed ",
                  seed);
  }
};

// ---- mla_kv_pack_quantize_fp8 and mla_v_quantize_fp8 --------------------------------------

// With v_only, the same buffers go to mla_v_quantize_fp8 (v and v_out only): k_out must stay as
// it was.
struct KvPackCase {
  DType dtype = DType::kBF16;
  std::int64_t tokens = 0;
  std::int64_t heads = 1;
  bool fused = true;        // k_nope = kv[..., :128], v = kv[..., 128:] of one [n, H, 256] kv
  std::int64_t in_pad = 0;  // not fused: k_nope and v rows 128 + in_pad apart
  bool k_pe_3d = false;
  std::int64_t k_pe_pad = 0;
  std::int64_t out_pad = 0;   // k_out rows 192 + out_pad, v_out rows 128 + out_pad apart
  bool v_transposed = false;  // v_out as VLayout::kTransposed: [H][128][tokens + v_pitch_pad]
  std::int64_t v_pitch_pad = 0;
  float k_scale_inv = 1.0f;
  float v_scale_inv = 1.0f;
  Data data = Data::kRandom;
  std::uint64_t seed = 1;
  bool v_only = false;  // run mla_v_quantize_fp8 instead
  // K split (k_rope_out): k_out [n, H, 128] in the same rows (their bytes 128.. untouched) and
  // k_rope_out like k_pe's shape, rows 64 + out_pad apart.
  bool split_k = false;

  // Allocations: kv (or k_nope), k_pe, v (empty when fused), k_out, v_out, k_rope_out (empty
  // unless split_k).
  std::vector<Spec> specs() const {
    const std::int64_t n = tokens, h = heads;
    return {
        fused ? dense(dtype, {n, h, 2 * kMlaNopeDim}) : padded(dtype, {n, h, kMlaNopeDim}, in_pad),
        k_pe_3d ? padded(dtype, {n, 1, kMlaRopeDim}, k_pe_pad)
                : padded(dtype, {n, kMlaRopeDim}, k_pe_pad),
        fused ? dense(dtype, {0}) : padded(dtype, {n, h, kMlaVDim}, in_pad),
        padded(DType::kE4M3, {n, h, kMlaQkDim}, out_pad),
        v_transposed ? transposed_v_spec() : padded(DType::kE4M3, {n, h, kMlaVDim}, out_pad),
        !split_k  ? dense(DType::kE4M3, {0})
        : k_pe_3d ? padded(DType::kE4M3, {n, 1, kMlaRopeDim}, out_pad)
                  : padded(DType::kE4M3, {n, kMlaRopeDim}, out_pad)};
  }
  // The k_out view's spec: its allocation, 128 wide for a split K.
  Spec k_out_spec() const {
    Spec s = specs()[3];
    if (split_k) s.shape.back() = kMlaNopeDim;
    return s;
  }
  Spec transposed_v_spec() const {
    const std::int64_t pitch = tokens + v_pitch_pad;
    return {DType::kE4M3,
            {tokens, heads, kMlaVDim},
            {1, kMlaVDim * pitch, pitch},
            0,
            heads * kMlaVDim * pitch};
  }
  // The k_nope and v views' specs.
  Spec k_nope_spec() const {
    if (!fused) return specs()[0];
    Spec s = specs()[0];
    s.shape.back() = kMlaNopeDim;
    return s;
  }
  Spec v_spec() const {
    if (!fused) return specs()[2];
    Spec s = k_nope_spec();
    s.offset = kMlaNopeDim;
    return s;
  }
  void init(std::vector<HostBuffer>& b) const {
    const std::vector<Spec> s = specs();
    for (int k : {0, 1, 2}) fill_input(b[k].data(), dtype, s[k].buffer_elems, data, seed + k);
  }
  void run(std::span<void* const> bases, Device device, CudaStream stream = nullptr) const {
    const std::vector<Spec> s = specs();
    const VLayout layout = v_transposed ? VLayout::kTransposed : VLayout::kTokenMajor;
    if (v_only) {
      mla_v_quantize_fp8(v_spec().view(fused ? bases[0] : bases[2], device),
                         s[4].view(bases[4], device), v_scale_inv, layout, stream);
      return;
    }
    MlaKvPackArgs a;
    a.k_nope = k_nope_spec().view(bases[0], device);
    a.k_pe = s[1].view(bases[1], device);
    a.v = v_spec().view(fused ? bases[0] : bases[2], device);
    a.k_scale_inv = k_scale_inv;
    a.v_scale_inv = v_scale_inv;
    a.k_out = k_out_spec().view(bases[3], device);
    a.v_out = s[4].view(bases[4], device);
    a.v_layout = layout;
    if (split_k) a.k_rope_out = s[5].view(bases[5], device);
    mla_kv_pack_quantize_fp8(a, stream);
  }
  std::vector<std::vector<std::uint8_t>> expected_outputs(
      const std::vector<HostBuffer>& before) const {
    const std::vector<Spec> s = specs();
    const Spec kn = k_nope_spec(), vs = v_spec();
    const void* v_base = before[fused ? 0 : 2].data();
    std::vector<std::vector<std::uint8_t>> out;
    for (int k : {3, 4, 5}) {
      out.emplace_back(before[k].payload().begin(), before[k].payload().end());
    }
    for (std::int64_t t = 0; t < tokens; ++t) {
      for (std::int64_t h = 0; h < heads; ++h) {
        for (int i = 0; i < kMlaVDim; ++i) {
          out[1][element_at(s[4], t, h, i)] =
              encode_e4m3(load_f32(v_base, dtype, element_at(vs, t, h, i)) * v_scale_inv);
        }
        if (v_only) continue;  // k_out untouched
        for (int i = 0; i < kMlaNopeDim; ++i) {
          out[0][element_at(s[3], t, h, i)] =
              encode_e4m3(load_f32(before[0].data(), dtype, element_at(kn, t, h, i)) * k_scale_inv);
        }
        for (int i = 0; i < kMlaRopeDim; ++i) {  // every head's row, or once in k_rope_out
          const std::uint8_t code = encode_e4m3(
              load_f32(before[1].data(), dtype, element_at(s[1], t, 0, i)) * k_scale_inv);
          if (split_k) {
            out[2][element_at(s[5], t, 0, i)] = code;
          } else {
            out[0][element_at(s[3], t, h, kMlaNopeDim + i)] = code;
          }
        }
      }
    }
    return out;
  }
  std::string describe() const {
    return concat(v_only ? "mla_v_quantize_fp8 " : "mla_kv_pack_quantize_fp8 ", dtype_name(dtype),
                  " n=", tokens, " H=", heads, fused ? " fused kv" : " separate", " (in pad ",
                  in_pad, "), k_pe ", k_pe_3d ? "3-d" : "2-d", " pad ", k_pe_pad, ", out pad ",
                  out_pad,
                  v_transposed ? concat(", v transposed (pitch pad ", v_pitch_pad, ")") : "",
                  split_k ? ", k_rope_out" : "", ", scale_inv k ", k_scale_inv, " v ", v_scale_inv,
                  ", ", data_name(data), " seed ", seed);
  }
};

// ---- The sweeps the CPU and CUDA tests share ----------------------------------------------

// Calls fn(page_size, tokens, layout, seed) for every page size, token count and layout <
// `layouts`, the seeds counting up from seed + 1.
template <typename Fn>
void for_each_cache_layout(std::initializer_list<std::int64_t> token_counts, int layouts,
                           std::uint64_t seed, Fn fn) {
  for (std::int64_t page_size : {1, 16, 32, 64, 128}) {
    for (std::int64_t tokens : token_counts) {
      for (int layout = 0; layout < layouts; ++layout) fn(page_size, tokens, layout, ++seed);
    }
  }
}

// The pack case of the token-count sweeps: n tokens of `heads` heads, f16 and adversarial data on
// odd n, k_nope and v slices of one kv unless n is a multiple of 3, v_scale_inv 3.
inline KvPackCase pack_sweep_case(std::int64_t n, std::int64_t heads, std::uint64_t seed) {
  return {.dtype = n % 2 ? DType::kF16 : DType::kBF16,
          .tokens = n,
          .heads = heads,
          .fused = n % 3 != 0,
          .v_scale_inv = 3.0f,
          .data = n % 2 ? Data::kAdversarial : Data::kRandom,
          .seed = seed};
}

// Cache-write case `layout` (0..3): padded pages and kv_c rows, 3-d k_pe, unaligned pages (3, the
// scalar path), skipped tokens; the cache has `spare_pages` pages more than the tokens need.
inline KvWriteCase write_sweep_case(std::int64_t page_size, std::int64_t tokens, int layout,
                                    std::uint64_t seed, std::int64_t spare_pages) {
  KvWriteCase c;
  c.dtype = seed % 2 ? DType::kF16 : DType::kBF16;
  c.tokens = tokens;
  c.cache = {(tokens + page_size) / page_size + spare_pages, page_size, layout % 2 ? 16 : 0,
             layout >= 2 ? 3 : 0};
  c.kv_pad = layout == 1 ? 8 : layout == 3 ? 5 : 0;
  c.kv_offset = layout == 3 ? 3 : 0;
  c.k_pe_3d = layout % 2 == 1;
  c.k_pe_pad = layout == 2 ? 1 : 0;
  c.slot_dtype = seed % 3 ? DType::kI64 : DType::kI32;
  c.skip_every = layout == 0 ? 0 : 3 + layout;
  c.scale_inv = layout == 2 ? 0.37f : layout == 3 ? 16.0f : 1.0f;
  c.data = seed % 2 ? Data::kAdversarial : Data::kRandom;
  c.seed = seed;
  return c;
}

// Gather case `layout` (0..2) from a cache of `pages` pages: padded pages and output rows, 3-d
// k_pe, unaligned pages; scale 3e30 overflows to inf.
inline KvGatherCase gather_sweep_case(std::int64_t page_size, std::int64_t tokens, int layout,
                                      std::uint64_t seed, std::int64_t pages) {
  KvGatherCase c;
  c.tokens = tokens;
  c.cache = {pages, page_size, layout == 1 ? 32 : 0, layout == 2 ? 5 : 0};
  c.slot_dtype = seed % 2 ? DType::kI32 : DType::kI64;
  c.kv_pad = layout == 1 ? 8 : layout == 2 ? 3 : 0;
  c.k_pe_pad = layout == 2 ? 1 : 0;
  c.k_pe_3d = layout == 1;
  c.scale = layout == 0 ? 1.0f : layout == 1 ? 0.0123f : 3e30f;
  c.seed = seed;
  return c;
}

}  // namespace fp8mla::test
