// CPU implementations of the latent-cache ops: the reference the CUDA kernels in
// src/cuda/mla_prep/mla_kv.cu must equal bit for bit. Bad slots are found by a scan over every
// slot before anything is written, so a rejected call leaves every output untouched.
#include <cstring>

#include "cpu/element_io.hpp"
#include "cpu/parallel_for.hpp"
#include "fp8mla/error.hpp"
#include "ops/mla_kv_params.hpp"

namespace fp8mla::cpu {
namespace {

constexpr std::int64_t kTokenGrain = 64;

// Start of row (token, head) of a [tokens, heads, dim] view.
const char* row_of(const TokenHeads& t, std::int64_t token, std::int64_t head) {
  return static_cast<const char*>(t.data) +
         (token * t.token_stride + head * t.head_stride) * dtype_size(t.dtype);
}
char* row_of_mut(const TokenHeads& t, std::int64_t token, std::int64_t head) {
  return const_cast<char*>(row_of(t, token, head));
}

// e4m3(x * scale_inv) of `n` elements.
void quantize_row(const char* in, DType dtype, std::int64_t n, float scale_inv, std::uint8_t* out) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = encode_e4m3(load_f32(in, dtype, i) * scale_inv);
}

// Throws kOutOfRange for the first slot outside the cache (a -1 too unless `minus_one_skips`).
void check_slots(const LatentCacheParams& c, std::int64_t tokens, bool minus_one_skips,
                 const char* op, const char* slots_name) {
  const std::int64_t capacity = c.num_pages * c.page_size;
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t slot = load_slot(c, t);
    if (minus_one_skips && slot == -1) continue;
    if (slot < 0 || slot >= capacity) {
      throw Error(
          ErrorCategory::kOutOfRange,
          concat(op, ": `", slots_name, "`[", t, "] = ", slot, " is outside the cache's slots [0, ",
                 capacity, ") (", c.num_pages, " pages of ", c.page_size, ")",
                 minus_one_skips ? "; -1 skips a token" : "", "; nothing was written"));
    }
  }
}

}  // namespace

void mla_kv_cache_write(const MlaKvCacheWriteParams& p) {
  const std::int64_t tokens = p.kv_c.tokens;
  check_slots(p.cache, tokens, true, "mla_kv_cache_write", "slot_mapping");
  parallel_for(tokens, kTokenGrain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t t = begin; t < end; ++t) {
      std::uint8_t* row = latent_row(p.cache, load_slot(p.cache, t));
      if (row == nullptr) continue;  // slot -1
      quantize_row(row_of(p.kv_c, t, 0), p.kv_c.dtype, p.kv_c.dim, p.cache.scale_inv, row);
      quantize_row(row_of(p.k_pe, t, 0), p.k_pe.dtype, p.k_pe.dim, p.cache.scale_inv,
                   row + p.kv_c.dim);
    }
  });
}

void mla_kv_gather(const MlaKvGatherParams& p) {
  const std::int64_t tokens = p.kv_c_out.tokens;
  check_slots(p.cache, tokens, false, "mla_kv_gather", "slots");
  parallel_for(tokens, kTokenGrain, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t t = begin; t < end; ++t) {
      const std::uint8_t* row = latent_row(p.cache, load_slot(p.cache, t));
      auto* kv_c = reinterpret_cast<std::uint16_t*>(row_of_mut(p.kv_c_out, t, 0));
      auto* k_pe = reinterpret_cast<std::uint16_t*>(row_of_mut(p.k_pe_out, t, 0));
      for (std::int64_t i = 0; i < p.kv_c_out.dim; ++i) {
        kv_c[i] = encode_bf16(decode_e4m3(row[i]) * p.scale);
      }
      for (std::int64_t i = 0; i < p.k_pe_out.dim; ++i) {
        k_pe[i] = encode_bf16(decode_e4m3(row[p.kv_c_out.dim + i]) * p.scale);
      }
    }
  });
}

// Also mla_v_quantize_fp8 (p.v_only: the K half skipped).
void mla_kv_pack_quantize_fp8(const MlaKvPackParams& p) {
  const std::int64_t heads = p.v.heads;
  const std::int64_t nope = p.k_nope.dim, rope = p.k_pe.dim;
  parallel_for(p.v.tokens, kTokenGrain / 4, [&](std::int64_t begin, std::int64_t end) {
    std::uint8_t k_pe[256];  // rope <= 256 (64 in MLA)
    std::uint8_t v[256];     // dim <= 256 (128 in MLA)
    for (std::int64_t t = begin; t < end; ++t) {
      if (!p.v_only) {
        quantize_row(row_of(p.k_pe, t, 0), p.k_pe.dtype, rope, p.k_scale_inv, k_pe);  // once
        if (p.k_split) {
          std::memcpy(row_of_mut(p.k_rope_out, t, 0), k_pe, std::size_t(rope));
        }
      }
      for (std::int64_t h = 0; h < heads; ++h) {
        if (!p.v_only) {
          auto* k = reinterpret_cast<std::uint8_t*>(row_of_mut(p.k_out, t, h));
          quantize_row(row_of(p.k_nope, t, h), p.k_nope.dtype, nope, p.k_scale_inv, k);
          if (!p.k_split) std::memcpy(k + nope, k_pe, std::size_t(rope));
        }
        auto* v_out = reinterpret_cast<std::uint8_t*>(row_of_mut(p.v_out, t, h));
        if (!p.v_transposed) {
          quantize_row(row_of(p.v, t, h), p.v.dtype, p.v.dim, p.v_scale_inv, v_out);
          continue;
        }
        quantize_row(row_of(p.v, t, h), p.v.dtype, p.v.dim, p.v_scale_inv, v);
        for (std::int64_t d = 0; d < p.v.dim; ++d) v_out[d * p.v_out_dim_stride] = v[d];
      }
    }
  });
}

}  // namespace fp8mla::cpu
