// Random-shape agreement of the MLA prep ops (mla_prep.hpp): a few hundred seeded cases per op
// (random_agreement_util.hpp). mla_rope_quantize_fp8 with and without its paged latent cache write
// (token and head counts, bf16/f16, both RoPE styles, i32/i64 positions and slots, strided,
// misaligned and padded views, cos_sin tables of any length and row padding, YaRN or plain, page
// sizes 1 to 128 and padded cache rows, scales); mla_kv_cache_write and mla_kv_gather (page sizes,
// padded rows and pages, skipped slots, 2-d and 3-d k_pe, repeated gather slots, scales up to
// overflow); mla_kv_pack_quantize_fp8 and mla_v_quantize_fp8 (fused or separate K/V, head counts,
// V token-major or transposed with odd pitches). The rule is bit-exactness: the GPU gives the
// CPU's bytes in every buffer, outputs poisoned first, the cache's other rows untouched, guard
// bands intact.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "fp8mla/mla_prep.hpp"
#include "mla_kv_test_util.hpp"
#include "mla_rope_test_util.hpp"
#include "random_agreement_util.hpp"

namespace fp8mla::test {
namespace {

RopeCase draw_rope(Draw& d) {
  RopeCase c;
  c.in_dtype = d.pick({DType::kBF16, DType::kF16});
  c.heads = d.pick<std::int64_t>({1, 2, 3, 16, 16, 33, 128});
  c.tokens = d.tokens(std::max<std::int64_t>(4000 / c.heads, 1));
  c.style = d.pick({RopeStyle::kInterleaved, RopeStyle::kNeox});
  c.position_dtype = d.pick({DType::kI32, DType::kI64});
  c.strided = d.chance(0.5);
  c.k_pe_3d = d.chance(0.5);
  c.misaligned = d.chance(0.25);
  c.out_head_pad = d.pick<std::int64_t>({0, 0, 1, 5, 16, 64});
  c.max_pos = d.chance(0.5) ? d.pick<std::int64_t>({1, 37, 4096}) : d.range(1, 8192);
  c.cos_sin_pad = d.pad(8);
  c.yarn = d.chance(0.5);
  c.q_scale_inv = d.scale(1.0f / 64.0f, 64.0f);
  c.k_scale_inv = d.scale(1.0f / 64.0f, 64.0f);
  c.page_size = d.chance(0.3)   ? 0
                : d.chance(0.5) ? d.pick<std::int64_t>({1, 16, 64, 128})
                                : d.range(1, 128);
  c.cache_row_pad = d.pick<std::int64_t>({0, 0, 1, 64, 100});
  c.slot_dtype = d.pick({DType::kI32, DType::kI64});
  c.cache_scale_inv = d.scale(1.0f / 64.0f, 64.0f);
  c.with_error_flag = d.chance(0.5);
  c.data = d.data();
  c.seed = d.bits();
  c.split_k = d.chance(0.5);
  return c;
}

// A cache with room for `tokens` distinct slots and `spare` pages more.
CacheGeometry draw_cache(Draw& d, std::int64_t tokens, std::int64_t spare) {
  CacheGeometry g;
  g.page_size = d.chance(0.5) ? d.pick<std::int64_t>({1, 16, 32, 64, 128}) : d.range(1, 128);
  g.num_pages = (tokens + g.page_size - 1) / g.page_size + d.range(spare > 0 ? 1 : 0, spare);
  g.num_pages = std::max<std::int64_t>(g.num_pages, 1);
  g.row_pad = d.pick<std::int64_t>({0, 0, 3, 16, 64});
  g.page_pad = d.pick<std::int64_t>({0, 0, 5, 32});
  return g;
}

KvWriteCase draw_write(Draw& d) {
  KvWriteCase c;
  c.dtype = d.pick({DType::kBF16, DType::kF16});
  c.tokens = d.tokens(2000);
  c.cache = draw_cache(d, c.tokens, 3);
  c.kv_pad = d.pad(16);
  c.kv_offset = d.range(0, c.kv_pad);
  c.k_pe_3d = d.chance(0.5);
  c.k_pe_pad = d.pad(8);
  c.slot_dtype = d.pick({DType::kI32, DType::kI64});
  c.skip_every = d.chance(0.5) ? 0 : int(d.range(2, 7));
  c.scale_inv = d.scale(1.0f / 64.0f, 64.0f);
  c.data = d.data();
  c.seed = d.bits() >> 8;  // slots() multiplies it
  c.with_flag = d.chance(0.5);
  return c;
}

KvGatherCase draw_gather(Draw& d) {
  KvGatherCase c;
  c.tokens = d.tokens(3000);
  c.cache = draw_cache(d, d.range(1, 600), 2);
  c.slot_dtype = d.pick({DType::kI32, DType::kI64});
  c.kv_pad = d.pad(16);
  c.k_pe_pad = d.pad(8);
  c.k_pe_3d = d.chance(0.5);
  c.scale = d.chance(0.1) ? 3e30f : d.scale(1.0f / 1024.0f, 1024.0f);
  c.seed = d.bits() >> 8;
  c.with_flag = d.chance(0.5);
  return c;
}

KvPackCase draw_pack(Draw& d) {
  KvPackCase c;
  c.dtype = d.pick({DType::kBF16, DType::kF16});
  c.heads = d.pick<std::int64_t>({1, 2, 16, 16, 33, 128});
  c.tokens = d.tokens(std::max<std::int64_t>(10000 / c.heads, 1));
  c.fused = d.chance(0.5);
  c.in_pad = c.fused ? 0 : d.pad(16);
  c.k_pe_3d = d.chance(0.5);
  c.k_pe_pad = d.pad(8);
  c.out_pad = d.pad(16);
  c.v_transposed = d.chance(0.5);
  c.v_pitch_pad = d.pad(40);
  if (c.v_transposed && c.tokens == 0) c.v_pitch_pad = std::max<std::int64_t>(c.v_pitch_pad, 1);
  c.k_scale_inv = d.scale(1.0f / 64.0f, 64.0f);
  c.v_scale_inv = d.scale(1.0f / 64.0f, 64.0f);
  c.data = d.data();
  c.seed = d.bits() >> 8;
  c.v_only = d.chance(0.3);
  c.split_k = !c.v_only && d.chance(0.5);
  return c;
}

TEST(RandomAgreementCuda, MlaRopeQuantizeFp8) {
  FP8MLA_REQUIRE_HOPPER();
  for_each_random_case("mla_rope_quantize_fp8", 300, draw_rope,
                       [](const RopeCase& c) { expect_bit_exact(c); });
}

TEST(RandomAgreementCuda, MlaKvCacheWrite) {
  FP8MLA_REQUIRE_HOPPER();
  for_each_random_case("mla_kv_cache_write", 300, draw_write,
                       [](const KvWriteCase& c) { expect_bit_exact(c); });
}

TEST(RandomAgreementCuda, MlaKvGather) {
  FP8MLA_REQUIRE_HOPPER();
  for_each_random_case("mla_kv_gather", 300, draw_gather,
                       [](const KvGatherCase& c) { expect_bit_exact(c); });
}

TEST(RandomAgreementCuda, MlaKvPackAndVQuantize) {
  FP8MLA_REQUIRE_HOPPER();
  for_each_random_case("mla_kv_pack_quantize_fp8 / mla_v_quantize_fp8", 300, draw_pack,
                       [](const KvPackCase& c) { expect_bit_exact(c); });
}

}  // namespace
}  // namespace fp8mla::test
