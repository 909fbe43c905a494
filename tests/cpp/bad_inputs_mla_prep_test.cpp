// The bad inputs of the MLA preparation ops (fp8mla/mla_prep.hpp): fused RoPE + FP8 with and
// without the cache write, the latent cache write, gather, K/V pack and V quantization.
#include <cmath>
#include <limits>
#include <vector>

#include "bad_inputs_catalogue.hpp"
#include "fp8mla/mla_prep.hpp"

namespace fp8mla::test {
namespace {

constexpr auto kInvalid = ErrorCategory::kInvalidArgument;
constexpr auto kOutOfRange = ErrorCategory::kOutOfRange;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr std::int64_t kT = 2, kH = 2, kMaxPos = 16;
static_assert(kT == 2 && kH == 2, "rope_args (bad_inputs_catalogue.hpp) is 2 tokens of 2 heads");

// Runs mla_rope_quantize_fp8 on rope_args(cache) after `edit`.
template <typename Edit>
auto rope_call(bool cache, Edit edit) {
  return [=](Arena& a) {
    MlaRopeQuantizeArgs r = rope_args(a, cache);
    edit(a, r);
    mla_rope_quantize_fp8(r);
  };
}

std::vector<BadInput> rope_bad_inputs() {
  return {
      {"mla_rope_quantize_fp8: q_nope of head dim 96",
       rope_call(false,
                 [](Arena& a, auto& r) {
                   r.q_nope = a.input(DType::kBF16, {kT, kH, 96});
                 }),
       kInvalid,
       {"`q_nope`: expected [T, H, 128]", "got bf16[2, 2, 96]"}},
      {"mla_rope_quantize_fp8: bf16 k_rope_out",
       rope_call(false,
                 [](Arena& a, auto& r) {
                   r.k_out = a.output(DType::kE4M3, {kT, kH, 128});
                   r.k_rope_out = a.output(DType::kBF16, {kT, 64});
                 }),
       kInvalid,
       {"`k_rope_out` dtype: expected e4m3fn", "got bf16"}},
      {"mla_rope_quantize_fp8: f16 q_pe with bf16 q_nope",
       rope_call(false,
                 [](Arena& a, auto& r) {
                   r.q_pe = a.input(DType::kF16, {kT, kH, 64});
                 }),
       kInvalid,
       {"`q_pe` dtype", "expected bf16", "got f16"}},
      {"mla_rope_quantize_fp8: k_pe per head",
       rope_call(false,
                 [](Arena& a, auto& r) {
                   r.k_pe = a.input(DType::kBF16, {kT, kH, 64});
                 }),
       kInvalid,
       {"`k_pe`: expected [T, 64] or [T, 1, 64] with T = 2", "got bf16[2, 2, 64]"}},
      {"mla_rope_quantize_fp8: zero heads",
       rope_call(false,
                 [](Arena& a, auto& r) {
                   r.q_nope = a.input(DType::kBF16, {kT, 0, 128});
                 }),
       kInvalid,
       {"`q_nope`: expected at least one head", "got bf16[2, 0, 128]"}},
      {"mla_rope_quantize_fp8: f32 positions",
       rope_call(false, [](Arena& a, auto& r) { r.positions = a.input(DType::kF32, {kT}); }),
       kInvalid,
       {"`positions` dtype", "expected one of {i32, i64}", "got f32"}},
      {"mla_rope_quantize_fp8: positions of the wrong length",
       rope_call(false,
                 [](Arena& a, auto& r) {
                   r.positions = a.ints(DType::kI64, {0, 1, 2});
                 }),
       kInvalid,
       {"`positions`: expected a contiguous [T] = [2]", "got i64[3]"}},
      {"mla_rope_quantize_fp8: position past cos_sin",
       rope_call(false,
                 [](Arena& a, auto& r) {
                   r.positions = a.ints(DType::kI32, {0, kMaxPos});
                 }),
       kOutOfRange,
       {"`positions`[1] = 16", "outside the cos_sin cache [0, 16)"}},
      {"mla_rope_quantize_fp8: negative position",
       rope_call(false,
                 [](Arena& a, auto& r) {
                   r.positions = a.ints(DType::kI64, {-1, 0});
                 }),
       kOutOfRange,
       {"`positions`[0] = -1", "[0, 16)"}},
      {"mla_rope_quantize_fp8: cos_sin of rope dim 32",
       rope_call(false,
                 [](Arena& a, auto& r) {
                   r.cos_sin = a.input(DType::kF32, {kMaxPos, 32});
                 }),
       kInvalid,
       {"`cos_sin`: expected [max_pos, 64] with contiguous rows", "got f32[16, 32]"}},
      {"mla_rope_quantize_fp8: bf16 q_out",
       rope_call(false,
                 [](Arena& a, auto& r) {
                   r.q_out = a.output(DType::kBF16, {kT, kH, 192});
                 }),
       kInvalid,
       {"`q_out` dtype", "expected e4m3fn", "got bf16"}},
      {"mla_rope_quantize_fp8: k_out on cuda:0",
       rope_call(false,
                 [](Arena& a, auto& r) {
                   r.k_out = a.output(DType::kE4M3, {kT, kH, 192}, {.device = Device::cuda(0)});
                 }),
       kInvalid,
       {"`k_out`: expected a tensor on cpu", "on cuda:0"}},
      {"mla_rope_quantize_fp8: misaligned q_pe",
       rope_call(false,
                 [](Arena& a, auto& r) {
                   r.q_pe = a.input(DType::kBF16, {kT, kH, 64}, {.byte_offset = 1});
                 }),
       kInvalid,
       {"`q_pe`: expected a 2-byte aligned data pointer", "got address"}},
      {"mla_rope_quantize_fp8: NaN q_scale_inv",
       rope_call(false, [](Arena&, auto& r) { r.q_scale_inv = kNaN; }),
       kInvalid,
       {"`q_scale_inv`: expected a finite scale > 0", "got nan"}},
      {"mla_rope_quantize_fp8: zero k_scale_inv",
       rope_call(false, [](Arena&, auto& r) { r.k_scale_inv = 0.0f; }),
       kInvalid,
       {"`k_scale_inv`: expected a finite scale > 0", "got 0"}},
      {"mla_rope_quantize_fp8: q_out over q_nope",
       rope_call(false,
                 [](Arena&, auto& r) {
                   r.q_out = TensorView(r.q_nope.data(), DType::kE4M3, {kT, kH, 192});
                 }),
       kInvalid,
       {"`q_out`: expected memory apart from `q_nope`", "e4m3fn[2, 2, 192]", "bf16[2, 2, 128]"}},
  };
}

// mla_rope_quantize_fp8 with the latent cache write.
std::vector<BadInput> rope_cache_bad_inputs() {
  return {
      {"mla_rope_quantize_fp8: cache write without kv_c",
       rope_call(true, [](Arena&, auto& r) { r.kv_c = {}; }),
       kInvalid,
       {"`kv_c`: required with cache_write", "got none"}},
      {"mla_rope_quantize_fp8: cache page size 256",
       rope_call(true,
                 [](Arena& a, auto& r) {
                   r.cache_write->cache = a.input(DType::kE4M3, {1, 256, 576});
                 }),
       ErrorCategory::kUnsupported,
       {"`cache`: expected a page size from 1 to 128", "got e4m3fn[1, 256, 576]"}},
      {"mla_rope_quantize_fp8: slot past the cache",
       rope_call(true,
                 [](Arena& a, auto& r) {
                   r.cache_write->slot_mapping = a.ints(DType::kI32, {0, 8});
                 }),
       kOutOfRange,
       {"`slot_mapping`[1] = 8", "outside the cache's [0, 8) slots"}},
      {"mla_rope_quantize_fp8: slot -2",
       rope_call(true,
                 [](Arena& a, auto& r) {
                   r.cache_write->slot_mapping = a.ints(DType::kI64, {-2, 0});
                 }),
       kOutOfRange,
       {"`slot_mapping`[0] = -2", "or -1 to skip"}},
      {"mla_rope_quantize_fp8: i64 error flag",
       rope_call(true,
                 [](Arena& a, auto& r) { r.cache_write->error_flag = a.output(DType::kI64, {1}); }),
       kInvalid,
       {"`error_flag` dtype", "expected i32", "got i64"}},
      {"mla_rope_quantize_fp8: infinite cache scale",
       rope_call(true,
                 [](Arena&, auto& r) {
                   r.cache_write->scale_inv = std::numeric_limits<float>::infinity();
                 }),
       kInvalid,
       {"`cache_scale_inv`: expected a finite scale > 0", "got inf"}},
  };
}

// mla_kv_cache_write of 2 tokens into 2 pages of 4 slots, one argument replaced by `edit`.
template <typename Edit>
auto cache_write_call(Edit edit) {
  return [=](Arena& a) {
    TensorView kv_c = a.input(DType::kBF16, {kT, 512}), k_pe = a.input(DType::kBF16, {kT, 64});
    LatentCacheWrite w{a.input(DType::kE4M3, {2, 4, 576}), a.ints(DType::kI32, {1, 2}), 1.0f, {}};
    edit(a, kv_c, k_pe, w);
    mla_kv_cache_write(kv_c, k_pe, w);
  };
}

std::vector<BadInput> cache_write_bad_inputs() {
  return {
      {"mla_kv_cache_write: kv_c of width 256",
       cache_write_call([](Arena& a, auto& kv_c, auto&, auto&) {
         kv_c = a.input(DType::kBF16, {kT, 256});
       }),
       kInvalid,
       {"`kv_c`: expected [tokens, 512]", "got bf16[2, 256]"}},
      {"mla_kv_cache_write: f16 k_pe with bf16 kv_c",
       cache_write_call([](Arena& a, auto&, auto& k_pe, auto&) {
         k_pe = a.input(DType::kF16, {kT, 64});
       }),
       kInvalid,
       {"`k_pe` dtype", "expected bf16", "got f16"}},
      {"mla_kv_cache_write: cache rows of 512",
       cache_write_call([](Arena& a, auto&, auto&, auto& w) {
         w.cache = a.input(DType::kE4M3, {2, 4, 512});
       }),
       kInvalid,
       {"`cache`: expected the latent width 576", "got e4m3fn[2, 4, 512]"}},
      {"mla_kv_cache_write: page size 0",
       cache_write_call([](Arena& a, auto&, auto&, auto& w) {
         w.cache = a.input(DType::kE4M3, {2, 0, 576});
       }),
       ErrorCategory::kUnsupported,
       {"expected a page size (dim 1) from 1 to 128", "got 0"}},
      {"mla_kv_cache_write: slot_mapping of the wrong length",
       cache_write_call([](Arena& a, auto&, auto&, auto& w) {
         w.slot_mapping = a.ints(DType::kI32, {0, 1, 2});
       }),
       kInvalid,
       {"`slot_mapping`: expected [2] (one slot per token of `kv_c`)", "got i32[3]"}},
      {"mla_kv_cache_write: strided slot_mapping",
       cache_write_call([](Arena& a, auto&, auto&, auto& w) {
         const TensorView four = a.ints(DType::kI32, {0, 1, 2, 3});
         w.slot_mapping = TensorView(four.data(), DType::kI32, {2}, {2});
       }),
       kInvalid,
       {"`slot_mapping`: expected a contiguous tensor", "strides [2]"}},
      {"mla_kv_cache_write: slot past the cache",
       cache_write_call([](Arena& a, auto&, auto&, auto& w) {
         w.slot_mapping = a.ints(DType::kI64, {3, 8});
       }),
       kOutOfRange,
       {"`slot_mapping`[1] = 8 is outside the cache's slots [0, 8)", "nothing was written"}},
      {"mla_kv_cache_write: negative scale",
       cache_write_call([](Arena&, auto&, auto&, auto& w) { w.scale_inv = -1.0f; }),
       kInvalid,
       {"`scale_inv`: expected a finite scale > 0", "got -1"}},
      {"mla_kv_cache_write: cache over kv_c",
       cache_write_call([](Arena&, auto& kv_c, auto&, auto& w) {
         w.cache = TensorView(kv_c.data(), DType::kE4M3, {1, 1, 576});
       }),
       kInvalid,
       {"`cache`: expected memory apart from `kv_c`", "e4m3fn[1, 1, 576]"}},
  };
}

// mla_kv_gather of 2 slots of a 2-page cache, one argument replaced by `edit`.
template <typename Edit>
auto gather_call(Edit edit) {
  return [=](Arena& a) {
    TensorView cache = a.input(DType::kE4M3, {2, 4, 576}), slots = a.ints(DType::kI32, {1, 6});
    TensorView kv_c = a.output(DType::kBF16, {kT, 512}), k_pe = a.output(DType::kBF16, {kT, 64});
    float scale = 1.0f;
    edit(a, cache, slots, kv_c, k_pe, scale);
    mla_kv_gather(cache, slots, scale, kv_c, k_pe);
  };
}

std::vector<BadInput> gather_bad_inputs() {
  return {
      {"mla_kv_gather: f32 kv_c_out",
       gather_call([](Arena& a, auto&, auto&, auto& kv_c, auto&, auto&) {
         kv_c = a.output(DType::kF32, {kT, 512});
       }),
       kInvalid,
       {"`kv_c_out` dtype", "expected bf16", "got f32"}},
      {"mla_kv_gather: k_pe_out of another token count",
       gather_call([](Arena& a, auto&, auto&, auto&, auto& k_pe, auto&) {
         k_pe = a.output(DType::kBF16, {3, 64});
       }),
       kInvalid,
       {"`k_pe_out`: expected 2 tokens like `kv_c_out`", "got bf16[3, 64]"}},
      {"mla_kv_gather: slot past the cache",
       gather_call([](Arena& a, auto&, auto& slots, auto&, auto&, auto&) {
         slots = a.ints(DType::kI32, {1, 100});
       }),
       kOutOfRange,
       {"`slots`[1] = 100 is outside the cache's slots [0, 8)"}},
      {"mla_kv_gather: slot -1",
       gather_call([](Arena& a, auto&, auto& slots, auto&, auto&, auto&) {
         slots = a.ints(DType::kI64, {-1, 0});
       }),
       kOutOfRange,
       {"`slots`[0] = -1 is outside the cache's slots [0, 8)"}},
      {"mla_kv_gather: slots on cuda:0",
       gather_call([](Arena& a, auto&, auto& slots, auto&, auto&, auto&) {
         slots = a.ints(DType::kI32, {1, 6}, {.device = Device::cuda(0)});
       }),
       kInvalid,
       {"`slots`: expected a tensor on cpu", "on cuda:0"}},
      {"mla_kv_gather: NaN scale",
       gather_call([](Arena&, auto&, auto&, auto&, auto&, auto& scale) { scale = kNaN; }),
       kInvalid,
       {"`scale`: expected a finite scale > 0", "got nan"}},
      {"mla_kv_gather: kv_c_out over the cache",
       gather_call([](Arena&, auto& cache, auto&, auto& kv_c, auto&, auto&) {
         kv_c = TensorView(cache.data(), DType::kBF16, {kT, 512});
       }),
       kInvalid,
       {"`kv_c_out`: expected memory apart from `cache`", "bf16[2, 512]", "e4m3fn[2, 4, 576]"}},
  };
}

// mla_kv_pack_quantize_fp8 of 2 tokens and 2 heads, one argument replaced by `edit`.
template <typename Edit>
auto pack_call(Edit edit) {
  return [=](Arena& a) {
    MlaKvPackArgs p = pack_args(a, kT, kH);
    edit(a, p);
    mla_kv_pack_quantize_fp8(p);
  };
}

std::vector<BadInput> pack_bad_inputs() {
  return {
      {"mla_kv_pack_quantize_fp8: k_nope of head dim 64",
       pack_call([](Arena& a, auto& p) {
         p.k_nope = a.input(DType::kBF16, {kT, kH, 64});
       }),
       kInvalid,
       {"`k_nope`: expected [tokens, heads, 128]", "got bf16[2, 2, 64]"}},
      {"mla_kv_pack_quantize_fp8: k_out of head dim 128",
       pack_call([](Arena& a, auto& p) {
         p.k_out = a.output(DType::kE4M3, {kT, kH, 128});
       }),
       kInvalid,
       {"`k_out`: expected [tokens, heads, 192]", "got e4m3fn[2, 2, 128]"}},
      {"mla_kv_pack_quantize_fp8: k_rope_out of 3 tokens",
       pack_call([](Arena& a, auto& p) {
         p.k_out = a.output(DType::kE4M3, {kT, kH, 128});
         p.k_rope_out = a.output(DType::kE4M3, {3, 64});
       }),
       kInvalid,
       {"`k_rope_out`: expected 2 tokens like `k_nope`", "got e4m3fn[3, 64]"}},
      {"mla_kv_pack_quantize_fp8: v of 3 heads",
       pack_call([](Arena& a, auto& p) {
         p.v = a.input(DType::kBF16, {kT, 3, 128});
       }),
       kInvalid,
       {"`v`: expected 2 heads like `k_nope`", "got bf16[2, 3, 128]"}},
      {"mla_kv_pack_quantize_fp8: transposed v_out with token-major strides",
       pack_call([](Arena&, auto& p) { p.v_layout = VLayout::kTransposed; }),
       kInvalid,
       {"`v_out` (kTransposed): expected token stride 1", "strides [256, 128, 1]"}},
      {"mla_kv_pack_quantize_fp8: unknown v_layout",
       pack_call([](Arena&, auto& p) { p.v_layout = VLayout(7); }),
       kInvalid,
       {"`v_layout`: expected kTokenMajor or kTransposed", "got 7"}},
      {"mla_kv_pack_quantize_fp8: infinite v_scale_inv",
       pack_call([](Arena&, auto& p) { p.v_scale_inv = std::numeric_limits<float>::infinity(); }),
       kInvalid,
       {"`v_scale_inv`: expected a finite scale > 0", "got inf"}},
      {"mla_kv_pack_quantize_fp8: v_out over v",
       pack_call([](Arena&, auto& p) {
         p.v_out = TensorView(p.v.data(), DType::kE4M3, {kT, kH, 128});
       }),
       kInvalid,
       {"`v_out`: expected memory apart from `v`", "e4m3fn[2, 2, 128]"}},
      {"mla_v_quantize_fp8: bf16 v_out",
       [](Arena& a) {
         mla_v_quantize_fp8(a.input(DType::kBF16, {kT, kH, 128}),
                            a.output(DType::kBF16, {kT, kH, 128}), 1.0f, VLayout::kTokenMajor);
       },
       kInvalid,
       {"`v_out` dtype", "expected e4m3fn", "got bf16"}},
      {"mla_v_quantize_fp8: negative v_scale_inv",
       [](Arena& a) {
         mla_v_quantize_fp8(a.input(DType::kBF16, {kT, kH, 128}),
                            a.output(DType::kE4M3, {kT, kH, 128}), -0.5f, VLayout::kTokenMajor);
       },
       kInvalid,
       {"`v_scale_inv`: expected a finite scale > 0", "got -0.5"}},
      {"make_cos_sin_cache: theta 1",
       [](Arena& a) {
         RopeConfig config;
         config.theta = 1.0;
         make_cos_sin_cache(a.output(DType::kF32, {kMaxPos, 64}), config);
       },
       kInvalid,
       {"expected a finite theta > 1", "got 1"}},
      {"make_cos_sin_cache: table of the wrong width",
       [](Arena& a) {
         make_cos_sin_cache(a.output(DType::kF32, {kMaxPos, 32}), RopeConfig{});
       },
       kInvalid,
       {"`cos_sin` dim 1: expected size 64", "got f32[16, 32]"}},
  };
}

// Outputs two of whose elements share memory (a zero or too short stride): the op would write
// one element over another.
std::vector<BadInput> self_overlapping_output_bad_inputs() {
  constexpr auto kApart = "expected strides that keep every element apart";
  return {
      {"mla_rope_quantize_fp8: q_out with head stride 0",
       rope_call(false,
                 [](Arena& a, auto& r) {
                   r.q_out = a.output(DType::kE4M3, {kT, kH, 192}, {.strides = {192, 0, 1}});
                 }),
       kInvalid,
       {concat("`q_out`: ", kApart), "e4m3fn[2, 2, 192]"}},
      {"mla_rope_quantize_fp8: cache rows with stride 0",
       rope_call(
           true,
           [](Arena& a, auto& r) {
             r.cache_write->cache = a.output(DType::kE4M3, {2, 4, 576}, {.strides = {2304, 0, 1}});
           }),
       kInvalid,
       {concat("`cache`: ", kApart), "e4m3fn[2, 4, 576]"}},
      {"mla_kv_cache_write: pages a row apart",
       cache_write_call([](Arena& a, auto&, auto&, auto& w) {
         w.cache = a.output(DType::kE4M3, {2, 4, 576}, {.strides = {576, 576, 1}});
       }),
       kInvalid,
       {concat("`cache`: ", kApart), "e4m3fn[2, 4, 576]"}},
      {"mla_kv_gather: kv_c_out with token stride 0",
       gather_call([](Arena& a, auto&, auto&, auto& kv_c, auto&, auto&) {
         kv_c = a.output(DType::kBF16, {kT, 512}, {.strides = {0, 1}});
       }),
       kInvalid,
       {concat("`kv_c_out`: ", kApart), "bf16[2, 512]"}},
      {"mla_kv_pack_quantize_fp8: k_out with head stride 0",
       pack_call([](Arena& a, auto& p) {
         p.k_out = a.output(DType::kE4M3, {kT, kH, 192}, {.strides = {192, 0, 1}});
       }),
       kInvalid,
       {concat("`k_out`: ", kApart), "e4m3fn[2, 2, 192]"}},
      {"mla_v_quantize_fp8: v_out with token stride 0",
       [](Arena& a) {
         mla_v_quantize_fp8(a.input(DType::kBF16, {kT, kH, 128}),
                            a.output(DType::kE4M3, {kT, kH, 128}, {.strides = {0, 128, 1}}), 1.0f,
                            VLayout::kTokenMajor);
       },
       kInvalid,
       {concat("`v_out`: ", kApart), "e4m3fn[2, 2, 128]"}},
  };
}

}  // namespace

std::vector<BadInput> mla_prep_bad_inputs() {
  std::vector<BadInput> all = rope_bad_inputs();
  for (auto part : {rope_cache_bad_inputs(), cache_write_bad_inputs(), gather_bad_inputs(),
                    pack_bad_inputs(), self_overlapping_output_bad_inputs()}) {
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

std::vector<ValidCall> mla_prep_valid_calls() {
  constexpr auto no_edit = [](Arena&, auto&) {};
  return {
      {"mla_rope_quantize_fp8", rope_call(false, no_edit)},
      {"mla_rope_quantize_fp8 with the cache write", rope_call(true, no_edit)},
      {"mla_kv_cache_write", cache_write_call([](Arena&, auto&, auto&, auto&) {})},
      {"mla_kv_gather", gather_call([](Arena&, auto&, auto&, auto&, auto&, auto&) {})},
      {"mla_kv_pack_quantize_fp8", pack_call(no_edit)},
  };
}

}  // namespace fp8mla::test
