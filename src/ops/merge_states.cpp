// Argument checks and CPU/CUDA dispatch of merge_attention_states (fp8mla/attention.hpp, op 9).
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/check.hpp"
#include "fp8mla/attention.hpp"
#include "fp8mla/numerics.hpp"
#include "ops/device_dispatch.hpp"
#include "ops/merge_states_params.hpp"
#include "ops/output_quant.hpp"

namespace fp8mla {
namespace {

// Rows of `width` elements at i * s0 + j * s1 (i < n0, j < n1) never share an element.
bool disjoint(std::int64_t n0, std::int64_t s0, std::int64_t n1, std::int64_t s1,
              std::int64_t width) {
  if (n0 == 0 || n1 == 0 || (n0 == 1 && n1 == 1)) return true;
  if (n0 == 1) return s1 >= width;
  if (n1 == 1) return s0 >= width;
  return (s1 >= width && s0 >= s1 * n1) || (s0 >= width && s1 >= s0 * n0);
}

MergeStatesParams::States states_of(const ArgChecker& check, const TensorView& t,
                                    std::string_view name, const TensorView& o_a) {
  check.dtype(t, name, {o_a.dtype()});
  check.ndim(t, name, 3);
  for (int d = 0; d < 3; ++d) check.size(t, name, d, o_a.size(d));
  check.contiguous_last_dim(t, name);
  check.aligned(t, name, int(dtype_size(t.dtype())));
  return {t.data(), t.stride(0), t.stride(1)};
}

MergeStatesParams::Lse lse_of(const ArgChecker& check, const TensorView& t, std::string_view name,
                              const TensorView& o_a) {
  check.dtype(t, name, {DType::kF32});
  check.ndim(t, name, 2);
  check.size(t, name, 0, o_a.size(0));
  check.size(t, name, 1, o_a.size(1));
  check.aligned(t, name, 4);
  return {t.data_as<float>(), t.stride(0), t.stride(1)};
}

// `num_tokens`: one i32 on `device`, the real token count of a padded batch.
const std::int32_t* num_tokens_of(const ArgChecker& check, const TensorView& t, Device device) {
  if (!given(t)) return nullptr;
  check.dtype(t, "num_tokens", {DType::kI32});
  check.require(t.numel() == 1 && t.ndim() <= 1, ErrorCategory::kInvalidArgument, [&] {
    return concat("`num_tokens`: expected one i32 of shape [] or [1], got ", t.describe());
  });
  check.device(t, "num_tokens", device);
  check.aligned(t, "num_tokens", 4);
  return t.data_as<const std::int32_t>();
}

// The merge into `out`, or with a key into a buffer of the states' dtype, rounded to bf16 (the
// unquantized attention output) and quantized by the key's standalone op. Only the first
// num_tokens tokens, when given (a padded batch).
void run_cpu(const ArgChecker& check, MergeStatesParams p) {
  check_output_scale_value(check, p.quant);
  if (p.num_tokens != nullptr) {
    const std::int64_t n = *p.num_tokens;
    check.require(n >= 0 && n <= p.tokens, ErrorCategory::kInvalidArgument, [&] {
      return concat("`num_tokens`: expected 0 to ", p.tokens, " (the tokens of `o_a`), got ", n);
    });
    p.tokens = n;
  }
  if (p.quant.key == OutputQuantKey::kNone) {
    cpu::merge_attention_states(p);
    return;
  }
  const std::int64_t rows = p.tokens * p.heads, width = p.heads * p.dim;
  std::vector<std::uint16_t> bf16(std::size_t(rows * p.dim));
  std::vector<float> f32(p.dtype == DType::kF32 ? bf16.size() : 0);
  p.out = {p.dtype == DType::kF32 ? static_cast<void*>(f32.data()) : bf16.data(), width, p.dim};
  cpu::merge_attention_states(p);
  for (std::size_t i = 0; i < f32.size(); ++i) bf16[i] = encode_bf16(f32[i]);
  cpu::quantize_output(p.quant, {bf16.data(), DType::kBF16, p.tokens, width, width});
}

void run_merge(const ArgChecker& check, const TensorView& o_a, const TensorView& lse_a,
               const TensorView& o_b, const TensorView& lse_b, const TensorView& out,
               const TensorView& out_lse, const TensorView& output_scale,
               const TensorView& output_block_scale, const TensorView& num_tokens,
               CudaStream stream) {
  check.dtype(o_a, "o_a", {DType::kBF16, DType::kF32});
  check.ndim(o_a, "o_a", 3);
  MergeStatesParams p;
  p.dtype = o_a.dtype();
  p.tokens = o_a.size(0);
  p.heads = o_a.size(1);
  p.dim = o_a.size(2);
  p.o_a = states_of(check, o_a, "o_a", o_a);
  p.o_b = states_of(check, o_b, "o_b", o_a);
  const OutputQuantKey key =
      check_output_quant_key(check, out, output_scale, output_block_scale, o_a.dtype());
  p.quant = output_quant_params(check, key, out, output_scale, output_block_scale, p.tokens,
                                p.heads, p.dim);
  if (key == OutputQuantKey::kNone) p.out = states_of(check, out, "out", o_a);
  p.lse_a = lse_of(check, lse_a, "lse_a", o_a);
  p.lse_b = lse_of(check, lse_b, "lse_b", o_a);
  p.out_lse = lse_of(check, out_lse, "out_lse", o_a);
  check_devices(
      check, o_a.device(),
      {{&lse_a, "lse_a"}, {&o_b, "o_b"}, {&lse_b, "lse_b"}, {&out, "out"}, {&out_lse, "out_lse"}});
  check.require(key != OutputQuantKey::kNone ||
                    disjoint(p.tokens, p.out.token_stride, p.heads, p.out.head_stride, p.dim),
                ErrorCategory::kInvalidArgument, [&] {
                  return concat("`out`: expected strides that keep every row apart, got ",
                                out.describe());
                });
  check.require(disjoint(p.tokens, p.out_lse.token_stride, p.heads, p.out_lse.head_stride, 1),
                ErrorCategory::kInvalidArgument, [&] {
                  return concat("`out_lse`: expected strides that keep every element apart, got ",
                                out_lse.describe());
                });
  // Only the running state may be merged into in place (docs/design.md, op 9).
  check.same_view_or_apart(out, "out", o_a, "o_a");
  check.apart(out, "out", o_b, "o_b");
  check.same_view_or_apart(out_lse, "out_lse", lse_a, "lse_a");
  check.apart(out_lse, "out_lse", lse_b, "lse_b");
  check.apart(out, "out", lse_a, "lse_a");
  check.apart(out, "out", lse_b, "lse_b");
  check.apart(out_lse, "out_lse", o_a, "o_a");
  check.apart(out_lse, "out_lse", o_b, "o_b");
  check.outputs_apart(out, "out", out_lse, "out_lse");
  check.outputs_apart(out_lse, "out_lse", output_block_scale, "output_block_scale");
  p.num_tokens = num_tokens_of(check, num_tokens, o_a.device());
  if (p.tokens == 0 || p.heads == 0) return;
  check.require(p.dim > 0, ErrorCategory::kInvalidArgument, [&] {
    return concat("`o_a`: expected a head dim of at least 1, got ", o_a.describe());
  });
  dispatch(
      o_a.device(), [&] { run_cpu(check, p); },
      [&](auto) { cuda::merge_attention_states(p, stream); });
}

}  // namespace

void merge_attention_states(const TensorView& o_a, const TensorView& lse_a, const TensorView& o_b,
                            const TensorView& lse_b, const TensorView& out,
                            const TensorView& out_lse, CudaStream stream) {
  merge_attention_states(o_a, lse_a, o_b, lse_b, out, out_lse, {}, {}, {}, stream);
}

void merge_attention_states(const TensorView& o_a, const TensorView& lse_a, const TensorView& o_b,
                            const TensorView& lse_b, const TensorView& out,
                            const TensorView& out_lse, const TensorView& output_scale,
                            const TensorView& output_block_scale, const TensorView& num_tokens,
                            CudaStream stream) {
  const ArgChecker check("merge_attention_states");
  run_merge(check, o_a, lse_a, o_b, lse_b, out, out_lse, output_scale, output_block_scale,
            num_tokens, stream);
}

void merge_attention_states_inplace(const TensorView& o, const TensorView& lse,
                                    const TensorView& o_b, const TensorView& lse_b,
                                    CudaStream stream) {
  const ArgChecker check("merge_attention_states_inplace");
  run_merge(check, o, lse, o_b, lse_b, o, lse, {}, {}, {}, stream);
}

}  // namespace fp8mla
