// Argument checks and CPU/CUDA dispatch of the latent-cache ops of fp8mla/mla_prep.hpp:
// mla_kv_cache_write, mla_kv_gather, mla_kv_pack_quantize_fp8 and mla_v_quantize_fp8; the
// transposed V's pitch and view.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "core/check.hpp"
#include "fp8mla/mla_prep.hpp"
#include "ops/device_dispatch.hpp"
#include "ops/mla_kv_params.hpp"

namespace fp8mla {
namespace {

// [tokens, heads, dim] with a contiguous last dim, naturally aligned.
TokenHeads per_head(const ArgChecker& check, const TensorView& t, std::string_view name,
                    std::int64_t dim) {
  check.require(t.ndim() == 3 && t.size(2) == dim, ErrorCategory::kInvalidArgument, [&] {
    return concat("`", name, "`: expected [tokens, heads, ", dim, "], got ", t.describe());
  });
  check.contiguous_last_dim(t, name);
  check.aligned(t, name, dtype_size(t.dtype()));
  return {t.data(), t.dtype(), t.size(0), t.size(1), dim, t.stride(0), t.stride(1)};
}

// [tokens, dim] or [tokens, 1, dim]: one row per token, shared by all heads.
TokenHeads shared_rows(const ArgChecker& check, const TensorView& t, std::string_view name,
                       std::int64_t dim) {
  const bool shape_ok = (t.ndim() == 2 || (t.ndim() == 3 && t.size(1) == 1)) && t.size(-1) == dim;
  check.require(shape_ok, ErrorCategory::kInvalidArgument, [&] {
    return concat("`", name, "`: expected [tokens, ", dim, "] or [tokens, 1, ", dim, "], got ",
                  t.describe());
  });
  check.contiguous_last_dim(t, name);
  check.aligned(t, name, dtype_size(t.dtype()));
  return {t.data(), t.dtype(), t.size(0), 1, dim, t.stride(0), 0};
}

void same_count(const ArgChecker& check, std::int64_t got, std::int64_t expected,
                std::string_view what, std::string_view name, std::string_view like,
                const TensorView& t) {
  check.require(got == expected, ErrorCategory::kInvalidArgument, [&] {
    return concat("`", name, "`: expected ", expected, " ", what, " like `", like, "`, got ",
                  t.describe());
  });
}

// The V half of mla_kv_pack_quantize_fp8 (also all of mla_v_quantize_fp8): v [n, H, 128] bf16/f16
// and v_out e4m3 [n, H, 128] laid out as `layout` says, into p.v, p.v_out, p.v_transposed and
// p.v_out_dim_stride. Both must have the token and head counts and the device of `like` (named
// `like_name`, already checked as [n, H, ...]), or of v when `like` is null.
void v_params(const ArgChecker& check, const TensorView& v, const TensorView& v_out, VLayout layout,
              const TensorView* like, std::string_view like_name, MlaKvPackParams& p) {
  check.dtype(v, "v", {DType::kBF16, DType::kF16});
  check.dtype(v_out, "v_out", {DType::kE4M3});
  check.require(
      layout == VLayout::kTokenMajor || layout == VLayout::kTransposed,
      ErrorCategory::kInvalidArgument,
      [&] { return concat("`v_layout`: expected kTokenMajor or kTransposed, got ", int(layout)); });
  p.v = per_head(check, v, "v", kMlaVDim);
  p.v_transposed = layout == VLayout::kTransposed;
  if (p.v_transposed) {
    const TensorView& o = v_out;
    const bool shape_ok = o.ndim() == 3 && o.size(2) == kMlaVDim;
    check.require(shape_ok, ErrorCategory::kInvalidArgument, [&] {
      return concat("`v_out`: expected [tokens, heads, ", kMlaVDim, "], got ", o.describe());
    });
    // [H][128][>= n] memory: no two elements share a byte.
    const bool layout_ok = (o.size(0) <= 1 || o.stride(0) == 1) && o.stride(2) >= o.size(0) &&
                           (o.size(1) <= 1 || o.stride(1) >= kMlaVDim * o.stride(2));
    check.require(layout_ok, ErrorCategory::kInvalidArgument, [&] {
      return concat(
          "`v_out` (kTransposed): expected token stride 1, dim stride >= tokens and "
          "head stride >= 128 x dim stride, got ",
          o.describe());
    });
    p.v_out = {o.data(), o.dtype(), o.size(0), o.size(1), kMlaVDim, 1, o.stride(1)};
    p.v_out_dim_stride = o.stride(2);
  } else {
    p.v_out = per_head(check, v_out, "v_out", kMlaVDim);
  }
  const TensorView& ref = like != nullptr ? *like : v;
  const std::int64_t tokens = ref.size(0), heads = ref.size(1);
  same_count(check, p.v.tokens, tokens, "tokens", "v", like_name, v);
  same_count(check, p.v_out.tokens, tokens, "tokens", "v_out", like_name, v_out);
  same_count(check, p.v.heads, heads, "heads", "v", like_name, v);
  same_count(check, p.v_out.heads, heads, "heads", "v_out", like_name, v_out);
  check_devices(check, ref.device(), {{&v, "v"}, {&v_out, "v_out"}});
  check.elements_apart(v_out, "v_out");
}

// The cache, the slots of `tokens` tokens and the optional error flag, all on `device`.
LatentCacheParams latent_cache(const ArgChecker& check, const TensorView& cache,
                               const TensorView& slots, std::string_view slots_name,
                               const TensorView& error_flag, std::int64_t tokens,
                               std::string_view tokens_from, Device device) {
  check.dtype(cache, "cache", {DType::kE4M3});
  check.dtype(slots, slots_name, {DType::kI32, DType::kI64});
  check.ndim(cache, "cache", 3);
  check.require(cache.size(2) == kMlaLatentDim, ErrorCategory::kInvalidArgument, [&] {
    return concat("`cache`: expected the latent width ", kMlaLatentDim, " (", kMlaKvLoraRank,
                  " kv_c + ", kMlaRopeDim, " k_pe) as the last dim, got ", cache.describe());
  });
  check.require(cache.size(1) >= 1 && cache.size(1) <= 128, ErrorCategory::kUnsupported, [&] {
    return concat("`cache`: expected a page size (dim 1) from 1 to 128, got ", cache.size(1), " (",
                  cache.describe(), ")");
  });
  check.contiguous_last_dim(cache, "cache");
  check.require(slots.ndim() == 1 && slots.size(0) == tokens, ErrorCategory::kInvalidArgument, [&] {
    return concat("`", slots_name, "`: expected [", tokens, "] (one slot per token of `",
                  tokens_from, "`), got ", slots.describe());
  });
  check.require(slots.stride(0) == 1 || tokens <= 1, ErrorCategory::kInvalidArgument, [&] {
    return concat("`", slots_name, "`: expected a contiguous tensor, got ", slots.describe());
  });
  const bool has_flag = error_flag.data() != nullptr;
  if (has_flag) {
    check.dtype(error_flag, "error_flag", {DType::kI32});
    check.require(error_flag.numel() == 1 && error_flag.ndim() <= 1,
                  ErrorCategory::kInvalidArgument, [&] {
                    return concat("`error_flag`: expected one i32 of shape [] or [1], got ",
                                  error_flag.describe());
                  });
  }
  check_devices(check, device, {{&cache, "cache"}, {&slots, slots_name}});
  if (has_flag) check_devices(check, device, {{&error_flag, "error_flag"}});
  check.aligned(slots, slots_name, dtype_size(slots.dtype()));
  if (has_flag) check.aligned(error_flag, "error_flag", 4);

  LatentCacheParams c;
  c.cache = cache.data_as<std::uint8_t>();
  c.num_pages = cache.size(0);
  c.page_size = cache.size(1);
  c.page_stride = cache.stride(0);
  c.row_stride = cache.stride(1);
  c.slots = slots.data();
  c.slot_dtype = slots.dtype();
  c.error_flag = has_flag ? error_flag.data_as<std::int32_t>() : nullptr;
  return c;
}

}  // namespace

void mla_kv_cache_write(const TensorView& kv_c, const TensorView& k_pe,
                        const LatentCacheWrite& write, CudaStream stream) {
  const ArgChecker check("mla_kv_cache_write");
  MlaKvCacheWriteParams p;
  check.dtype(kv_c, "kv_c", {DType::kBF16, DType::kF16});
  check.dtype(k_pe, "k_pe", {kv_c.dtype()});
  check.require(
      kv_c.ndim() == 2 && kv_c.size(1) == kMlaKvLoraRank, ErrorCategory::kInvalidArgument, [&] {
        return concat("`kv_c`: expected [tokens, ", kMlaKvLoraRank, "], got ", kv_c.describe());
      });
  p.kv_c = shared_rows(check, kv_c, "kv_c", kMlaKvLoraRank);
  p.k_pe = shared_rows(check, k_pe, "k_pe", kMlaRopeDim);
  const std::int64_t tokens = p.kv_c.tokens;
  same_count(check, p.k_pe.tokens, tokens, "tokens", "k_pe", "kv_c", k_pe);
  check_devices(check, kv_c.device(), {{&k_pe, "k_pe"}});
  p.cache = latent_cache(check, write.cache, write.slot_mapping, "slot_mapping", write.error_flag,
                         tokens, "kv_c", kv_c.device());
  check.positive_scale(write.scale_inv, "scale_inv");
  check.elements_apart(write.cache, "cache");
  check.apart(write.cache, "cache", kv_c, "kv_c");
  check.apart(write.cache, "cache", k_pe, "k_pe");
  p.cache.scale_inv = write.scale_inv;
  if (tokens == 0) return;
  dispatch(
      kv_c.device(), [&] { cpu::mla_kv_cache_write(p); },
      [&](auto) { cuda::mla_kv_cache_write(p, stream); });
}

void mla_kv_gather(const TensorView& cache, const TensorView& slots, float scale,
                   const TensorView& kv_c_out, const TensorView& k_pe_out,
                   const TensorView& error_flag, CudaStream stream) {
  const ArgChecker check("mla_kv_gather");
  MlaKvGatherParams p;
  check.dtype(kv_c_out, "kv_c_out", {DType::kBF16});
  check.dtype(k_pe_out, "k_pe_out", {DType::kBF16});
  check.require(kv_c_out.ndim() == 2 && kv_c_out.size(1) == kMlaKvLoraRank,
                ErrorCategory::kInvalidArgument, [&] {
                  return concat("`kv_c_out`: expected [tokens, ", kMlaKvLoraRank, "], got ",
                                kv_c_out.describe());
                });
  p.kv_c_out = shared_rows(check, kv_c_out, "kv_c_out", kMlaKvLoraRank);
  p.k_pe_out = shared_rows(check, k_pe_out, "k_pe_out", kMlaRopeDim);
  const std::int64_t tokens = p.kv_c_out.tokens;
  same_count(check, p.k_pe_out.tokens, tokens, "tokens", "k_pe_out", "kv_c_out", k_pe_out);
  check_devices(check, cache.device(), {{&kv_c_out, "kv_c_out"}, {&k_pe_out, "k_pe_out"}});
  p.cache =
      latent_cache(check, cache, slots, "slots", error_flag, tokens, "kv_c_out", cache.device());
  check.positive_scale(scale, "scale");
  for (const auto& [t, name] : {std::pair{&kv_c_out, "kv_c_out"}, {&k_pe_out, "k_pe_out"}}) {
    check.elements_apart(*t, name);
    check.apart(*t, name, cache, "cache");
    check.apart(*t, name, slots, "slots");
  }
  p.scale = scale;
  if (tokens == 0) return;
  dispatch(
      cache.device(), [&] { cpu::mla_kv_gather(p); },
      [&](auto) { cuda::mla_kv_gather(p, stream); });
}

std::int64_t transposed_v_pitch(std::int64_t tokens) {
  return std::max<std::int64_t>(16, (tokens + 15) / 16 * 16);
}

TensorView transposed_v_view(void* data, std::int64_t tokens, std::int64_t heads,
                             std::int64_t pitch, Device device) {
  return TensorView(data, DType::kE4M3, {tokens, heads, kMlaVDim}, {1, kMlaVDim * pitch, pitch},
                    device);
}

void mla_kv_pack_quantize_fp8(const MlaKvPackArgs& args, CudaStream stream) {
  const ArgChecker check("mla_kv_pack_quantize_fp8");
  MlaKvPackParams p;
  check.dtype(args.k_nope, "k_nope", {DType::kBF16, DType::kF16});
  check.dtype(args.k_pe, "k_pe", {args.k_nope.dtype()});
  check.dtype(args.v, "v", {args.k_nope.dtype()});
  check.dtype(args.k_out, "k_out", {DType::kE4M3});
  p.k_nope = per_head(check, args.k_nope, "k_nope", kMlaNopeDim);
  p.k_pe = shared_rows(check, args.k_pe, "k_pe", kMlaRopeDim);
  p.k_split = given(args.k_rope_out);
  p.k_out = per_head(check, args.k_out, "k_out", p.k_split ? kMlaNopeDim : kMlaQkDim);
  v_params(check, args.v, args.v_out, args.v_layout, &args.k_nope, "k_nope", p);
  const std::int64_t tokens = p.k_nope.tokens, heads = p.k_nope.heads;
  same_count(check, p.k_pe.tokens, tokens, "tokens", "k_pe", "k_nope", args.k_pe);
  same_count(check, p.k_out.tokens, tokens, "tokens", "k_out", "k_nope", args.k_out);
  same_count(check, p.k_out.heads, heads, "heads", "k_out", "k_nope", args.k_out);
  if (p.k_split) {
    check.dtype(args.k_rope_out, "k_rope_out", {DType::kE4M3});
    p.k_rope_out = shared_rows(check, args.k_rope_out, "k_rope_out", kMlaRopeDim);
    same_count(check, p.k_rope_out.tokens, tokens, "tokens", "k_rope_out", "k_nope",
               args.k_rope_out);
  }
  check_devices(check, args.k_nope.device(),
                {{&args.k_pe, "k_pe"},
                 {&args.k_out, "k_out"},
                 {p.k_split ? &args.k_rope_out : &args.k_out, p.k_split ? "k_rope_out" : "k_out"}});
  check.positive_scale(args.k_scale_inv, "k_scale_inv");
  check.positive_scale(args.v_scale_inv, "v_scale_inv");
  check.elements_apart(args.k_out, "k_out");
  if (p.k_split) check.elements_apart(args.k_rope_out, "k_rope_out");
  const ArgChecker::Named inputs[] = {
      {&args.k_nope, "k_nope"}, {&args.k_pe, "k_pe"}, {&args.v, "v"}};
  const ArgChecker::Named outputs[] = {
      {&args.k_out, "k_out"}, {&args.v_out, "v_out"}, {&args.k_rope_out, "k_rope_out"}};
  check.all_apart(outputs, inputs);
  p.k_scale_inv = args.k_scale_inv;
  p.v_scale_inv = args.v_scale_inv;
  if (tokens == 0 || heads == 0) return;
  dispatch(
      args.k_nope.device(), [&] { cpu::mla_kv_pack_quantize_fp8(p); },
      [&](auto) { cuda::mla_kv_pack_quantize_fp8(p, stream); });
}

void mla_v_quantize_fp8(const TensorView& v, const TensorView& v_out, float v_scale_inv,
                        VLayout layout, CudaStream stream) {
  const ArgChecker check("mla_v_quantize_fp8");
  MlaKvPackParams p;
  p.v_only = true;
  v_params(check, v, v_out, layout, nullptr, "v", p);
  check.positive_scale(v_scale_inv, "v_scale_inv");
  check.apart(v_out, "v_out", v, "v");
  p.v_scale_inv = v_scale_inv;
  if (p.v.tokens == 0 || p.v.heads == 0) return;
  dispatch(
      v.device(), [&] { cpu::mla_kv_pack_quantize_fp8(p); },
      [&](auto) { cuda::mla_kv_pack_quantize_fp8(p, stream); });
}

}  // namespace fp8mla
