// Argument checks and CPU/CUDA dispatch of the RoPE ops of fp8mla/mla_prep.hpp:
// make_cos_sin_cache, softmax_mscale and mla_rope_quantize_fp8.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <numbers>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/check.hpp"
#include "fp8mla/mla_prep.hpp"
#include "ops/device_dispatch.hpp"
#include "ops/mla_rope_params.hpp"

namespace fp8mla {
namespace {

// DeepSeek-V3's yarn_get_mscale.
double yarn_get_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// DeepSeek-V3's yarn_find_correction_dim.
double yarn_correction_dim(double num_rotations, int dim, double base, double max_position) {
  return dim * std::log(max_position / (num_rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(base));
}

// inv_freq[i], i < rope_dim / 2, and the factor applied to cos and sin.
std::vector<double> inverse_frequencies(const RopeConfig& config, double& magnitude) {
  const int d = config.rope_dim;
  std::vector<double> inv_freq(std::size_t(d / 2));
  magnitude = 1.0;
  for (int i = 0; i < d / 2; ++i) inv_freq[i] = 1.0 / std::pow(config.theta, 2.0 * i / d);
  if (!config.yarn) return inv_freq;
  const YarnScaling& y = *config.yarn;
  const double max_position = double(y.original_max_position);
  const double low =
      std::max(std::floor(yarn_correction_dim(y.beta_fast, d, config.theta, max_position)), 0.0);
  double high = std::min(std::ceil(yarn_correction_dim(y.beta_slow, d, config.theta, max_position)),
                         double(d - 1));
  if (low == high) high += 0.001;
  for (int i = 0; i < d / 2; ++i) {
    const double freq_extra = inv_freq[i];
    const double freq_inter = 1.0 / (y.factor * std::pow(config.theta, 2.0 * i / d));
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double mask = 1.0 - ramp;
    inv_freq[i] = freq_inter * (1.0 - mask) + freq_extra * mask;
  }
  magnitude = yarn_attention_factor(y);
  return inv_freq;
}

void check_config(const ArgChecker& check, const RopeConfig& config) {
  check.require(
      config.rope_dim > 0 && config.rope_dim % 2 == 0, ErrorCategory::kInvalidArgument,
      [&] { return concat("expected an even, positive rope_dim, got ", config.rope_dim); });
  check.require(config.theta > 1.0 && std::isfinite(config.theta), ErrorCategory::kInvalidArgument,
                [&] { return concat("expected a finite theta > 1, got ", config.theta); });
  if (!config.yarn) return;
  const YarnScaling& y = *config.yarn;
  check.require(y.factor > 0.0 && std::isfinite(y.factor), ErrorCategory::kInvalidArgument,
                [&] { return concat("yarn: expected a finite factor > 0, got ", y.factor); });
  check.require(y.original_max_position > 0, ErrorCategory::kInvalidArgument, [&] {
    return concat("yarn: expected original_max_position > 0, got ", y.original_max_position);
  });
  check.require(y.beta_fast > 0.0 && y.beta_slow > 0.0, ErrorCategory::kInvalidArgument, [&] {
    return concat("yarn: expected beta_fast and beta_slow > 0, got ", y.beta_fast, " and ",
                  y.beta_slow);
  });
}

// A [T, heads, dim] view (or [T, dim] when `shared`, also accepted as [T, 1, dim]) with a
// contiguous last dim.
TokenHeads token_heads(const ArgChecker& check, const TensorView& t, std::string_view name,
                       DType dtype, std::int64_t tokens, std::int64_t heads, std::int64_t dim,
                       bool shared) {
  check.dtype(t, name, {dtype});
  const bool shape_ok =
      shared ? (t.ndim() == 2 && t.size(0) == tokens && t.size(1) == dim) ||
                   (t.ndim() == 3 && t.size(0) == tokens && t.size(1) == 1 && t.size(2) == dim)
             : t.ndim() == 3 && t.size(0) == tokens && t.size(1) == heads && t.size(2) == dim;
  check.require(shape_ok, ErrorCategory::kInvalidArgument, [&] {
    return shared ? concat("`", name, "`: expected [T, ", dim, "] or [T, 1, ", dim,
                           "] with T = ", tokens, ", got ", t.describe())
                  : concat("`", name, "`: expected [T, H, ", dim, "] = [", tokens, ", ", heads,
                           ", ", dim, "], got ", t.describe());
  });
  check.contiguous_last_dim(t, name);
  check.aligned(t, name, int(dtype_size(dtype)));
  TokenHeads th;
  th.data = t.data();
  th.dtype = dtype;
  th.tokens = tokens;
  th.heads = shared ? 1 : heads;
  th.dim = dim;
  th.token_stride = t.stride(0);
  th.head_stride = shared ? 0 : t.stride(1);
  return th;
}

// An i32 or i64 [T] index vector with stride 1.
const void* index_vector(const ArgChecker& check, const TensorView& t, std::string_view name,
                         std::int64_t tokens) {
  check.dtype(t, name, {DType::kI32, DType::kI64});
  check.require(t.ndim() == 1 && t.size(0) == tokens && (tokens <= 1 || t.stride(0) == 1),
                ErrorCategory::kInvalidArgument, [&] {
                  return concat("`", name, "`: expected a contiguous [T] = [", tokens, "], got ",
                                t.describe());
                });
  check.aligned(t, name, int(dtype_size(t.dtype())));
  return t.data();
}

// A `dtype` tensor [leading..., width] with contiguous rows; `note` follows the expected shape in
// the message.
void contiguous_rows(const ArgChecker& check, const TensorView& t, std::string_view name,
                     DType dtype, std::initializer_list<std::string_view> leading,
                     std::int64_t width, std::string_view note) {
  check.dtype(t, name, {dtype});
  const int dims = int(leading.size()) + 1;
  check.require(t.ndim() == dims && t.size(dims - 1) == width && t.stride(dims - 1) == 1,
                ErrorCategory::kInvalidArgument, [&] {
                  std::string shape;
                  for (std::string_view dim : leading) shape += concat(dim, ", ");
                  return concat("`", name, "`: expected [", shape, width, "] with contiguous rows",
                                note, ", got ", t.describe());
                });
}

// The scales are finite and positive; the outputs (q_out, k_out, and the cache when written) lie
// apart from every input.
void check_scales_and_overlaps(const ArgChecker& check, const MlaRopeQuantizeArgs& args) {
  check.positive_scale(args.q_scale_inv, "q_scale_inv");
  check.positive_scale(args.k_scale_inv, "k_scale_inv");
  if (args.cache_write) check.positive_scale(args.cache_write->scale_inv, "cache_scale_inv");
  const ArgChecker::Named inputs[] = {
      {&args.q_nope, "q_nope"}, {&args.q_pe, "q_pe"},           {&args.k_nope, "k_nope"},
      {&args.k_pe, "k_pe"},     {&args.positions, "positions"}, {&args.cos_sin, "cos_sin"},
      {&args.kv_c, "kv_c"}};
  const TensorView no_cache;
  const ArgChecker::Named outputs[] = {
      {&args.q_out, "q_out"},
      {&args.k_out, "k_out"},
      {&args.k_rope_out, "k_rope_out"},
      {args.cache_write ? &args.cache_write->cache : &no_cache, "cache"}};
  check.all_apart(outputs, inputs);
}

}  // namespace

double yarn_attention_factor(const YarnScaling& y) {
  if (y.mscale == 0.0 || y.mscale_all_dim == 0.0) return yarn_get_mscale(y.factor, 1.0);
  return yarn_get_mscale(y.factor, y.mscale) / yarn_get_mscale(y.factor, y.mscale_all_dim);
}

double softmax_mscale(const RopeConfig& config) {
  return config.yarn ? yarn_get_mscale(config.yarn->factor, config.yarn->mscale_all_dim) : 1.0;
}

void make_cos_sin_cache(const TensorView& cos_sin, const RopeConfig& config, CudaStream) {
  const ArgChecker check("make_cos_sin_cache");
  check_config(check, config);
  check.dtype(cos_sin, "cos_sin", {DType::kF32});
  check.ndim(cos_sin, "cos_sin", 2);
  check.size(cos_sin, "cos_sin", 1, config.rope_dim);
  check.contiguous_last_dim(cos_sin, "cos_sin");
  check.aligned(cos_sin, "cos_sin", 4);
  check.elements_apart(cos_sin, "cos_sin");
  check_devices(check, cos_sin.device(), {});
  const std::int64_t rows = cos_sin.size(0), d = config.rope_dim, half = d / 2;
  if (rows == 0) return;

  double magnitude = 1.0;
  const std::vector<double> inv_freq = inverse_frequencies(config, magnitude);
  std::vector<float> table(std::size_t(rows * d));
  for (std::int64_t p = 0; p < rows; ++p) {
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle = double(p) * inv_freq[std::size_t(i)];
      table[std::size_t(p * d + i)] = float(std::cos(angle) * magnitude);
      table[std::size_t(p * d + half + i)] = float(std::sin(angle) * magnitude);
    }
  }
  float* dst = cos_sin.data_as<float>();
  const std::int64_t stride = cos_sin.stride(0);
  dispatch(
      cos_sin.device(),
      [&] {
        for (std::int64_t p = 0; p < rows; ++p) {
          std::copy_n(table.data() + p * d, d, dst + p * stride);
        }
      },
      [&](auto) { cuda::copy_f32_rows_to_device(dst, stride, table.data(), rows, d); });
}

void mla_rope_quantize_fp8(const MlaRopeQuantizeArgs& args, CudaStream stream) {
  const ArgChecker check("mla_rope_quantize_fp8");
  MlaRopeQuantizeParams p;

  check.dtype(args.q_nope, "q_nope", {DType::kBF16, DType::kF16});
  check.require(args.q_nope.ndim() == 3 && args.q_nope.size(2) == kMlaNopeDim,
                ErrorCategory::kInvalidArgument, [&] {
                  return concat("`q_nope`: expected [T, H, ", kMlaNopeDim, "], got ",
                                args.q_nope.describe());
                });
  const DType in = args.q_nope.dtype();
  const std::int64_t tokens = args.q_nope.size(0), heads = args.q_nope.size(1);
  check.require(heads >= 1, ErrorCategory::kInvalidArgument, [&] {
    return concat("`q_nope`: expected at least one head, got ", args.q_nope.describe());
  });
  p.tokens = tokens;
  p.heads = heads;
  p.q_nope = token_heads(check, args.q_nope, "q_nope", in, tokens, heads, kMlaNopeDim, false);
  p.q_pe = token_heads(check, args.q_pe, "q_pe", in, tokens, heads, kMlaRopeDim, false);
  p.k_split = given(args.k_rope_out);
  p.k_nope_part = given(args.k_nope);
  if (p.k_nope_part) {
    p.k_nope = token_heads(check, args.k_nope, "k_nope", in, tokens, heads, kMlaNopeDim, false);
  }
  p.k_pe = token_heads(check, args.k_pe, "k_pe", in, tokens, 1, kMlaRopeDim, true);
  p.q_out = token_heads(check, args.q_out, "q_out", DType::kE4M3, tokens, heads, kMlaQkDim, false);
  // Without k_nope a split K has no k_out, and an unsplit one's k_out gets its RoPE part alone.
  const bool k_out_part = p.k_nope_part || !p.k_split;
  check.require(k_out_part || !given(args.k_out), ErrorCategory::kInvalidArgument, [&] {
    return concat(
        "`k_out`: expected none without k_nope when k_rope_out takes K's RoPE part "
        "(nothing would be written to it), got ",
        args.k_out.describe());
  });
  if (k_out_part) {
    p.k_out = token_heads(check, args.k_out, "k_out", DType::kE4M3, tokens, heads,
                          p.k_split ? kMlaNopeDim : kMlaQkDim, false);
  }
  if (p.k_split) {
    p.k_rope_out = token_heads(check, args.k_rope_out, "k_rope_out", DType::kE4M3, tokens, 1,
                               kMlaRopeDim, true);
    check.elements_apart(args.k_rope_out, "k_rope_out");
  }
  check.elements_apart(args.q_out, "q_out");
  if (k_out_part) check.elements_apart(args.k_out, "k_out");

  p.positions = index_vector(check, args.positions, "positions", tokens);
  p.position_dtype = args.positions.dtype();

  const TensorView& cs = args.cos_sin;
  contiguous_rows(check, cs, "cos_sin", DType::kF32, {"max_pos"}, kMlaRopeDim,
                  " (make_cos_sin_cache)");
  check.aligned(cs, "cos_sin", 4);
  p.cos_sin = cs.data_as<const float>();
  p.max_pos = cs.size(0);
  p.cos_sin_row_stride = cs.stride(0);
  p.style = args.style;
  p.q_scale_inv = args.q_scale_inv;
  p.k_scale_inv = args.k_scale_inv;

  const Device device = args.q_nope.device();
  // Absent views stand in as tensors checked already.
  const TensorView& k_nope = p.k_nope_part ? args.k_nope : args.q_pe;
  const TensorView& k_out = k_out_part ? args.k_out : args.q_out;
  check_devices(check, device,
                {{&args.q_pe, "q_pe"},
                 {&k_nope, "k_nope"},
                 {&args.k_pe, "k_pe"},
                 {&args.positions, "positions"},
                 {&args.cos_sin, "cos_sin"},
                 {&args.q_out, "q_out"},
                 {&k_out, "k_out"},
                 {p.k_split ? &args.k_rope_out : &k_out, p.k_split ? "k_rope_out" : "k_out"}});

  if (args.cache_write) {
    const LatentCacheWrite& w = *args.cache_write;
    p.cache_write = true;
    check.require(args.kv_c.data() != nullptr || tokens == 0, ErrorCategory::kInvalidArgument, [&] {
      return concat("`kv_c`: required with cache_write (bf16/f16 [T, ", kMlaKvLoraRank,
                    "]), got none");
    });
    p.kv_c = token_heads(check, args.kv_c, "kv_c", in, tokens, 1, kMlaKvLoraRank, true);
    const TensorView& c = w.cache;
    contiguous_rows(check, c, "cache", DType::kE4M3, {"num_pages", "page_size"}, kMlaLatentDim, "");
    check.require(c.size(1) >= 1 && c.size(1) <= 128, ErrorCategory::kUnsupported, [&] {
      return concat("`cache`: expected a page size from 1 to 128, got ", c.describe());
    });
    check.elements_apart(c, "cache");
    p.cache.cache = c.data_as<std::uint8_t>();
    p.cache.num_pages = c.size(0);
    p.cache.page_size = c.size(1);
    p.cache.page_stride = c.stride(0);
    p.cache.row_stride = c.stride(1);
    p.cache.slots = index_vector(check, w.slot_mapping, "slot_mapping", tokens);
    p.cache.slot_dtype = w.slot_mapping.dtype();
    p.cache.scale_inv = w.scale_inv;
    check_devices(check, device,
                  {{&args.kv_c, "kv_c"}, {&w.cache, "cache"}, {&w.slot_mapping, "slot_mapping"}});
    if (w.error_flag.data() != nullptr) {
      check.dtype(w.error_flag, "error_flag", {DType::kI32});
      check.require(w.error_flag.numel() == 1 && w.error_flag.ndim() <= 1,
                    ErrorCategory::kInvalidArgument, [&] {
                      return concat("`error_flag`: expected one i32 of shape [] or [1], got ",
                                    w.error_flag.describe());
                    });
      check.aligned(w.error_flag, "error_flag", 4);
      check_devices(check, device, {{&w.error_flag, "error_flag"}});
      p.cache.error_flag = w.error_flag.data_as<std::int32_t>();
    }
  }
  check_scales_and_overlaps(check, args);
  if (tokens == 0) return;
  dispatch(
      device, [&] { cpu::mla_rope_quantize_fp8(p); },
      [&](auto) { cuda::mla_rope_quantize_fp8(p, stream); });
}

}  // namespace fp8mla
