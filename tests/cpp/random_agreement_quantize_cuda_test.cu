// Random-shape agreement of the quantization ops (quantize.hpp): a few hundred seeded cases per op
// (random_agreement_util.hpp), each drawn afresh: input dtypes, N-d shapes with 0, 1 and many
// rows, row widths, padded and offset input rows and padded output rows, static scales by value
// and from memory, dynamic scales, every per-token-group scale layout (f32, UE8M0 bytes, packed
// i32, row- and column-major, TMA-aligned) with group sizes 64 and 128 and eps values, and every
// NVFP4 scale layout with global scales; random and adversarial inputs (NaN, inf, values past
// the FP8 maxima, subnormals). The rule is bit-exactness: the GPU gives the CPU's bytes in every
// buffer, outputs poisoned first (NVFP4 twice, with two poisons, since any byte is a valid e2m1
// pair), guard bands intact.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "fp8mla/quantize.hpp"
#include "quantize_test_util.hpp"
#include "random_agreement_util.hpp"

namespace fp8mla::test {
namespace {

constexpr std::int64_t kMaxElements = std::int64_t{1} << 20;

// A row width: a common one or any up to 4096.
std::int64_t draw_width(Draw& d) {
  if (d.chance(0.5)) return d.pick<std::int64_t>({1, 7, 16, 64, 128, 192, 512, 576, 1024, 7168});
  return d.range(1, 4096);
}

// Leading dims of an N-d shape (2-d or, on one case in three, 3-d) whose rows fit kMaxElements.
std::vector<std::int64_t> draw_shape(Draw& d, std::int64_t cols) {
  const std::int64_t max_rows = std::max<std::int64_t>(kMaxElements / cols, 1);
  if (d.chance(0.33)) {
    const std::int64_t inner = d.range(1, 5);
    return {d.tokens(std::max<std::int64_t>(max_rows / inner, 1)), inner, cols};
  }
  return {d.tokens(max_rows), cols};
}

template <typename Case>
void draw_padding(Draw& d, Case& c) {
  c.in_pad = d.pad(40);
  c.in_offset = d.range(0, c.in_pad);
  c.out_pad = d.pad(40);
}

Fp8Case draw_fp8(Draw& d) {
  Fp8Case c;
  c.in_dtype = d.pick({DType::kBF16, DType::kF16, DType::kF32});
  c.out_dtype = d.pick({DType::kE4M3, DType::kE5M2});
  c.shape = draw_shape(d, draw_width(d));
  draw_padding(d, c);
  c.scale = d.pick({Fp8Scale::kValue, Fp8Scale::kMemory, Fp8Scale::kDynamic});
  c.scale_inv = d.scale(1.0f / 4096.0f, 4096.0f);
  c.data = d.data();
  c.seed = d.bits();
  return c;
}

GroupCase draw_group(Draw& d) {
  GroupCase c;
  c.in_dtype = d.pick({DType::kBF16, DType::kF16, DType::kF32});
  c.group_size = d.pick({64, 128});
  const std::int64_t groups = d.chance(0.5) ? d.range(1, 8) : d.range(1, 8192 / c.group_size);
  c.shape = draw_shape(d, groups * c.group_size);
  draw_padding(d, c);
  c.layout = kAllScaleLayouts[d.range(0, std::int64_t(std::size(kAllScaleLayouts)) - 1)];
  c.eps = d.pick({1e-10f, 1e-10f, 1e-4f, 448.0f * 0x1p-90f, 1e-30f, 0x1p-149f});
  c.data = d.data();
  c.seed = d.bits();
  return c;
}

Nvfp4Case draw_nvfp4(Draw& d) {
  Nvfp4Case c;
  c.in_dtype = d.pick({DType::kBF16, DType::kF16});
  const std::int64_t k =
      d.chance(0.5) ? d.pick<std::int64_t>({16, 64, 80, 128, 576, 7168}) : 16 * d.range(1, 256);
  c.shape = draw_shape(d, k);
  draw_padding(d, c);
  c.scales = kAllNvfp4Scales[d.range(0, 2)];
  c.scale_pad = c.scales == Nvfp4Scales::kLinear ? d.pad(9) : 0;
  c.global_scale = d.scale(0.01f, 3000.0f);
  c.data = d.data();
  c.seed = d.bits();
  return c;
}

TEST(RandomAgreementCuda, QuantizeFp8PerTensor) {
  FP8MLA_REQUIRE_HOPPER();
  for_each_random_case("quantize_fp8 / quantize_fp8_dynamic", 300, draw_fp8,
                       [](const Fp8Case& c) { expect_bit_exact(c); });
}

TEST(RandomAgreementCuda, QuantizeFp8PerTokenGroup) {
  FP8MLA_REQUIRE_HOPPER();
  for_each_random_case("quantize_fp8_per_token_group", 300, draw_group,
                       [](const GroupCase& c) { expect_bit_exact(c); });
}

TEST(RandomAgreementCuda, QuantizeNvfp4) {
  FP8MLA_REQUIRE_HOPPER();
  for_each_random_case("quantize_nvfp4", 200, draw_nvfp4, [](const Nvfp4Case& c) {
    expect_bit_exact(c, {0xFF, 0x5A});
  });
}

}  // namespace
}  // namespace fp8mla::test
