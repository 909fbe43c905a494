// Argument checks of prefill_attention (fp8mla/attention.hpp), then the CPU reference or the
// Hopper kernel (src/cuda/attention), whose TMA loads add alignment and layout requirements.
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/check.hpp"
#include "cuda/attention/prefill_registry.hpp"
#include "fp8mla/attention.hpp"
#include "ops/device_dispatch.hpp"
#include "ops/output_quant.hpp"
#include "ops/prefill_attention_params.hpp"

namespace fp8mla {
namespace {

// A single f32 (shape [] or [1]) on `device`.
const float* scalar_f32(const ArgChecker& check, const TensorView& t, std::string_view name,
                        Device device) {
  check.require(t.data() != nullptr, ErrorCategory::kInvalidArgument,
                [&] { return concat("`", name, "`: expected one f32 for FP8 inputs, got none"); });
  check.dtype(t, name, {DType::kF32});
  check.require(t.numel() == 1 && t.ndim() <= 1, ErrorCategory::kInvalidArgument, [&] {
    return concat("`", name, "`: expected one f32 of shape [] or [1], got ", t.describe());
  });
  check.require(t.device() == device, ErrorCategory::kInvalidArgument, [&] {
    return concat("`", name, "`: expected a tensor on ", to_string(device),
                  ", the device of `q`, got ", t.describe());
  });
  check.aligned(t, name, 4);
  return t.data_as<const float>();
}

// `t` has exactly `shape`.
void check_shape(const ArgChecker& check, const TensorView& t, std::string_view name,
                 std::initializer_list<std::int64_t> shape, std::string_view what) {
  bool same = t.ndim() == int(shape.size());
  int d = 0;
  for (auto it = shape.begin(); same && it != shape.end(); ++it, ++d) same = t.size(d) == *it;
  check.require(same, ErrorCategory::kInvalidArgument, [&] {
    std::string expected;
    for (std::int64_t s : shape) expected += concat(expected.empty() ? "" : ", ", s);
    return concat("`", name, "`: expected [", expected, "] (", what, "), got ", t.describe());
  });
}

// q, k, out: 3 dims, contiguous last dim, aligned to their element size.
void check_token_head_dim(const ArgChecker& check, const TensorView& t, std::string_view name) {
  check.ndim(t, name, 3);
  check.contiguous_last_dim(t, name);
  check.aligned(t, name, int(dtype_size(t.dtype())));
}

// v: [Tk, H, Dv] token-major (contiguous last dim) or transposed (contiguous keys); a view that
// is both (one token) counts as token-major, as the CUDA launch reads it (dim stride 1).
bool check_v_layout(const ArgChecker& check, const TensorView& v) {
  check.ndim(v, "v", 3);
  check.aligned(v, "v", int(dtype_size(v.dtype())));
  const bool token_major = v.stride(2) == 1 || v.size(2) <= 1;
  const bool transposed = !token_major && v.stride(0) == 1;
  check.require(token_major || transposed, ErrorCategory::kInvalidArgument, [&] {
    return concat(
        "`v`: expected a contiguous last dim (token-major) or contiguous tokens "
        "(transposed, [H, Dv, Tk] memory), got ",
        v.describe());
  });
  return transposed;
}

// What the Hopper kernel's TMA loads need: 16-byte aligned bases and strides of dims with more
// than one element (the descriptors ignore the others).
void check_tma_operand(const ArgChecker& check, const TensorView& t, std::string_view name,
                       std::initializer_list<int> dims) {
  check.aligned(t, name, 16);
  for (int d : dims) {
    const std::int64_t bytes = t.stride(d) * std::int64_t(dtype_size(t.dtype()));
    check.require(t.size(d) <= 1 || bytes % 16 == 0, ErrorCategory::kInvalidArgument, [&] {
      return concat("`", name, "`: the CUDA kernel needs the stride of dim ", d,
                    " to be a multiple of 16 bytes, got ", t.describe());
    });
  }
}

// k_rope: the last kRopeDims dims of every head's key, [Tk, 64] or [Tk, 1, 64] (any token stride,
// contiguous last dim); k then holds the first Dqk - 64.
constexpr std::int64_t kRopeDims = 64;
void check_k_rope(const ArgChecker& check, const PrefillAttentionArgs& args, std::int64_t tk,
                  std::int64_t dqk) {
  const TensorView& r = args.k_rope;
  check.require(r.dtype() == args.q.dtype(), ErrorCategory::kInvalidArgument, [&] {
    return concat("`k_rope` dtype: expected ", dtype_name(args.q.dtype()),
                  " (the dtype of `q`), got ", dtype_name(r.dtype()));
  });
  check.require(dqk > kRopeDims, ErrorCategory::kUnsupported, [&] {
    return concat(
        "`k_rope`: expected `q` with a head dim of 128 or 192 (64 of them from k_rope), "
        "got ",
        args.q.describe());
  });
  check.ndim(r, "k_rope", 2, 3);
  const bool shape_ok =
      r.size(0) == tk && r.size(r.ndim() - 1) == kRopeDims && (r.ndim() == 2 || r.size(1) == 1);
  check.require(shape_ok, ErrorCategory::kInvalidArgument, [&] {
    return concat("`k_rope`: expected [", tk, ", 64] or [", tk,
                  ", 1, 64] (Tk of `k`, one row for all heads), got ", r.describe());
  });
  check.contiguous_last_dim(r, "k_rope");
  check.aligned(r, "k_rope", int(dtype_size(r.dtype())));
}

// A bf16 [T, H, D] the epilogue reads or writes in pairs: 4-byte aligned, even token and head
// strides.
void check_even_strides(const ArgChecker& check, const TensorView& t, std::string_view name) {
  check.aligned(t, name, 4);
  for (int d : {0, 1}) {
    check.require(t.size(d) <= 1 || t.stride(d) % 2 == 0, ErrorCategory::kInvalidArgument, [&] {
      return concat("`", name, "`: the CUDA kernel needs even token and head strides, got ",
                    t.describe());
    });
  }
}

void check_cuda_layouts(const ArgChecker& check, const PrefillAttentionArgs& args,
                        bool v_transposed, bool quantized) {
  const bool fp8 = args.q.dtype() == DType::kE4M3;
  check_tma_operand(check, args.q, "q", {0, 1});
  check_tma_operand(check, args.k, "k", {0, 1});
  if (given(args.k_rope)) check_tma_operand(check, args.k_rope, "k_rope", {0});
  if (fp8) {
    // FP8 wgmma reads V^T (keys contiguous): the transposed layout lands as it reads it; a
    // token-major tile is transposed in shared memory first (the slower path). TMA reads either
    // with 16-byte strides: head and dim strides transposed, token and head strides token-major.
    if (v_transposed) {
      check_tma_operand(check, args.v, "v", {1, 2});
    } else {
      check_tma_operand(check, args.v, "v", {0, 1});
    }
  } else {
    check.require(!v_transposed, ErrorCategory::kInvalidArgument, [&] {
      return concat(
          "`v`: the CUDA kernel needs bf16 V token-major (contiguous last dim), "
          "got ",
          args.v.describe());
    });
    check_tma_operand(check, args.v, "v", {0, 1});
  }
  // The grid is sized by max_seqlen_q and the host cannot read cu_seqlens: catch the bounds that
  // cannot hold for any offsets (some sequence has at least Tq / batch queries).
  const std::int64_t batch = args.cu_seqlens_q.size(0) - 1;
  check.require(std::int64_t(args.max_seqlen_q) * batch >= args.q.size(0) &&
                    std::int64_t(args.max_seqlen_k) * batch >= args.k.size(0),
                ErrorCategory::kInvalidArgument, [&] {
                  return concat("max_seqlen_q (", args.max_seqlen_q, ") and max_seqlen_k (",
                                args.max_seqlen_k, ") cannot bound ", batch, " sequences of ",
                                args.q.size(0), " queries and ", args.k.size(0), " keys in all");
                });
  // The epilogue stores pairs of bf16 (a quantized `out` takes any stride).
  if (!quantized) check_even_strides(check, args.out, "out");
  check.require(args.cu_seqlens_q.size(0) - 1 <= 65535 && args.q.size(1) <= 65535,
                ErrorCategory::kInvalidArgument, [&] {
                  return concat("the CUDA kernel takes at most 65535 sequences and heads, got ",
                                args.cu_seqlens_q.size(0) - 1, " and ", args.q.size(1));
                });
}

// `out`: bf16 [Tq, H, Dv] without a key; with one, the output rows and scales of its quantization.
OutputQuantParams check_out(const ArgChecker& check, const PrefillAttentionArgs& args,
                            OutputQuantKey key, std::int64_t tq, std::int64_t heads,
                            std::int64_t dv) {
  if (key != OutputQuantKey::kNone) {
    return output_quant_params(check, key, args.out, args.output_scale, args.output_block_scale, tq,
                               heads, dv);
  }
  check_token_head_dim(check, args.out, "out");
  check_shape(check, args.out, "out", {tq, heads, dv}, "[Tq, H, Dv]");
  check.elements_apart(args.out, "out");
  return {};
}

void check_cu_seqlens(const ArgChecker& check, const TensorView& t, std::string_view name) {
  check.dtype(t, name, {DType::kI32});
  check.ndim(t, name, 1);
  check.require(t.size(0) >= 1, ErrorCategory::kInvalidArgument, [&] {
    return concat("`", name, "`: expected [batch + 1] with batch >= 0, got ", t.describe());
  });
  check.contiguous_last_dim(t, name);
  check.aligned(t, name, 4);
}

// The CPU path reads the offsets: 0 first, non-decreasing, at most `total` last (fewer: a batch
// padded past its tokens, docs/design.md section 6), lengths <= max_seqlen.
void check_cu_seqlens_values(const ArgChecker& check, const std::int32_t* cu, std::int64_t batch,
                             std::int64_t total, int max_seqlen, std::string_view name,
                             std::string_view max_name, std::string_view tokens_of) {
  check.require(cu[0] == 0, ErrorCategory::kInvalidArgument,
                [&] { return concat("`", name, "`: expected 0 first, got ", cu[0]); });
  for (std::int64_t b = 0; b < batch; ++b) {
    check.require(cu[b + 1] >= cu[b], ErrorCategory::kInvalidArgument, [&] {
      return concat("`", name, "`: expected non-decreasing offsets, got ", cu[b], " then ",
                    cu[b + 1], " at index ", b + 1);
    });
  }
  check.require(cu[batch] <= total, ErrorCategory::kInvalidArgument, [&] {
    return concat("`", name, "`: expected at most ", total, " (the tokens of `", tokens_of,
                  "`) last, got ", cu[batch]);
  });
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t len = std::int64_t(cu[b + 1]) - cu[b];
    check.require(len <= max_seqlen, ErrorCategory::kInvalidArgument, [&] {
      return concat("`", max_name, "` (", max_seqlen, ") is smaller than the length ", len,
                    " of sequence ", b, " in `", name, "`");
    });
  }
}

// `out`, `lse` and the output scales lie apart from every input (an aliased output would be read
// after it was written) and from one another.
void check_outputs_apart(const ArgChecker& check, const PrefillAttentionArgs& args) {
  const ArgChecker::Named inputs[] = {{&args.q, "q"},
                                      {&args.k, "k"},
                                      {&args.k_rope, "k_rope"},
                                      {&args.v, "v"},
                                      {&args.cu_seqlens_q, "cu_seqlens_q"},
                                      {&args.cu_seqlens_k, "cu_seqlens_k"},
                                      {&args.q_descale, "q_descale"},
                                      {&args.k_descale, "k_descale"},
                                      {&args.v_descale, "v_descale"},
                                      {&args.output_scale, "output_scale"}};
  const ArgChecker::Named outputs[] = {
      {&args.out, "out"}, {&args.lse, "lse"}, {&args.output_block_scale, "output_block_scale"}};
  check.all_apart(outputs, inputs);
  check.outputs_apart(args.out, "out", args.lse, "lse");
  check.outputs_apart(args.lse, "lse", args.output_block_scale, "output_block_scale");
  if (!given(args.prior_out) && !given(args.prior_lse)) return;
  // The prior state may be folded in place (each element is read before it is written).
  check.same_view_or_apart(args.out, "out", args.prior_out, "prior_out");
  check.same_view_or_apart(args.lse, "lse", args.prior_lse, "prior_lse");
  check.apart(args.out, "out", args.prior_lse, "prior_lse");
  check.apart(args.lse, "lse", args.prior_out, "prior_out");
  check.apart(args.output_block_scale, "output_block_scale", args.prior_out, "prior_out");
  check.apart(args.output_block_scale, "output_block_scale", args.prior_lse, "prior_lse");
}

// The prior state to fold in: both or neither; bf16 [Tq, H, Dv] and f32 [Tq, H] on `device`.
bool check_prior_state(const ArgChecker& check, const PrefillAttentionArgs& args, std::int64_t tq,
                       std::int64_t heads, std::int64_t dv, Device device) {
  const bool has_out = given(args.prior_out), has_lse = given(args.prior_lse);
  check.require(has_out == has_lse, ErrorCategory::kInvalidArgument, [&] {
    return concat("expected `prior_out` and `prior_lse` together (a prior state to fold in), got ",
                  has_out ? "only `prior_out`" : "only `prior_lse`");
  });
  if (!has_out) return false;
  const TensorView& o = args.prior_out;
  const TensorView& l = args.prior_lse;
  check.dtype(o, "prior_out", {DType::kBF16});
  check_token_head_dim(check, o, "prior_out");
  check_shape(check, o, "prior_out", {tq, heads, dv}, "[Tq, H, Dv], the shape of the output");
  check.dtype(l, "prior_lse", {DType::kF32});
  check_shape(check, l, "prior_lse", {tq, heads}, "[Tq, H]");
  check.aligned(l, "prior_lse", 4);
  check.device(o, "prior_out", device);
  check.device(l, "prior_lse", device);
  return true;
}

// The CPU path with a prior state: this call's bf16 output and LSE into buffers of their own, then
// the merge op folds them into the prior state (its in-place form when the state is `out`), with
// the call's output scales and the real token count of a padded batch: the bytes the contract
// states, by construction.
void fold_cpu(const PrefillAttentionArgs& args, PrefillAttentionParams p) {
  const std::int64_t rows = p.tq, real = p.cu_seqlens_q[p.batch];
  std::vector<std::uint16_t> own(std::size_t(rows * p.heads * p.dv));
  std::vector<float> own_lse(std::size_t(rows * p.heads));
  p.tq = real;
  p.out = own.data();
  p.out_token_stride = p.heads * p.dv;
  p.out_head_stride = p.dv;
  p.quant = {};
  p.lse = own_lse.data();
  p.lse_token_stride = p.heads;
  p.lse_head_stride = 1;
  if (p.heads > 0) cpu::prefill_attention(p);
  std::int32_t real_tokens = std::int32_t(real);
  std::vector<float> scratch_lse(given(args.lse) ? 0 : own_lse.size());
  const TensorView out_lse =
      given(args.lse) ? args.lse : TensorView(scratch_lse.data(), DType::kF32, {rows, p.heads});
  merge_attention_states(
      args.prior_out, args.prior_lse, TensorView(own.data(), DType::kBF16, {rows, p.heads, p.dv}),
      TensorView(own_lse.data(), DType::kF32, {rows, p.heads}), args.out, out_lse,
      args.output_scale, args.output_block_scale, TensorView(&real_tokens, DType::kI32, {1}));
}

// The CPU path: the host can read the offsets and the descales. Only the rows of the sequences
// are computed: with cu_seqlens_q ending before Tq (a padded batch) the rows past its last token,
// and their scales, keep what they held. With an output quantization key the attention writes
// its bf16 output into a buffer of its own, which the key's standalone quantization then turns
// into `out` and its scales.
void run_cpu(const ArgChecker& check, const PrefillAttentionArgs& args, PrefillAttentionParams& p) {
  check_cu_seqlens_values(check, p.cu_seqlens_q, p.batch, p.tq, p.max_seqlen_q, "cu_seqlens_q",
                          "max_seqlen_q", "q");
  check_cu_seqlens_values(check, p.cu_seqlens_k, p.batch, p.tk, p.max_seqlen_k, "cu_seqlens_k",
                          "max_seqlen_k", "k");
  if (p.dtype == DType::kE4M3) {
    p.q_descale_value = *p.q_descale;
    p.k_descale_value = *p.k_descale;
    p.v_descale_value = *p.v_descale;
    check.positive_scale(p.q_descale_value, "q_descale");
    check.positive_scale(p.k_descale_value, "k_descale");
    check.positive_scale(p.v_descale_value, "v_descale");
  }
  check_output_scale_value(check, p.quant);
  check_outputs_apart(check, args);
  if (p.prior_out != nullptr) {
    fold_cpu(args, p);
    return;
  }
  p.tq = p.cu_seqlens_q[p.batch];  // the rows cpu::prefill_attention computes
  if (p.heads == 0) return;
  if (p.quant.key == OutputQuantKey::kNone) {
    cpu::prefill_attention(p);
    return;
  }
  const std::int64_t width = p.heads * p.dv;
  std::vector<std::uint16_t> bf16(std::size_t(p.tq * width));
  p.out = bf16.data();
  p.out_token_stride = width;
  p.out_head_stride = p.dv;
  cpu::prefill_attention(p);
  cpu::quantize_output(p.quant, {bf16.data(), DType::kBF16, p.tq, width, width});
}
// The tensors' pointers, strides and sizes, the batch and the scalars, once every check passed.
void set_tensors(PrefillAttentionParams& p, const PrefillAttentionArgs& args, OutputQuantKey key,
                 const OutputQuantParams& quant) {
  const TensorView& q = args.q;
  const TensorView& k = args.k;
  const TensorView& v = args.v;
  const TensorView& out = args.out;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.q_token_stride = q.stride(0);
  p.q_head_stride = q.stride(1);
  p.k_token_stride = k.stride(0);
  p.k_head_stride = k.stride(1);
  if (given(args.k_rope)) {
    p.k_rope = args.k_rope.data();
    p.k_rope_dim = int(kRopeDims);
    p.k_rope_token_stride = args.k_rope.stride(0);
  }
  p.v_token_stride = v.stride(0);
  p.v_head_stride = v.stride(1);
  p.v_dim_stride = v.stride(2);
  p.tq = q.size(0);
  p.tk = k.size(0);
  p.heads = q.size(1);
  p.dqk = int(q.size(2));
  p.dv = int(v.size(2));
  p.cu_seqlens_q = args.cu_seqlens_q.data_as<const std::int32_t>();
  p.cu_seqlens_k = args.cu_seqlens_k.data_as<const std::int32_t>();
  p.batch = args.cu_seqlens_q.size(0) - 1;
  p.max_seqlen_q = args.max_seqlen_q;
  p.max_seqlen_k = args.max_seqlen_k;
  p.softmax_scale = args.softmax_scale;
  p.causal = args.causal;
  if (key == OutputQuantKey::kNone) {
    p.out = out.data_as<std::uint16_t>();
    p.out_token_stride = out.stride(0);
    p.out_head_stride = out.stride(1);
  }
  p.quant = quant;
  if (given(args.lse)) {
    p.lse = args.lse.data_as<float>();
    p.lse_token_stride = args.lse.stride(0);
    p.lse_head_stride = args.lse.stride(1);
  }
  if (given(args.prior_out)) {
    p.prior_out = args.prior_out.data_as<const std::uint16_t>();
    p.prior_out_token_stride = args.prior_out.stride(0);
    p.prior_out_head_stride = args.prior_out.stride(1);
    p.prior_lse = args.prior_lse.data_as<const float>();
    p.prior_lse_token_stride = args.prior_lse.stride(0);
    p.prior_lse_head_stride = args.prior_lse.stride(1);
  }
}

}  // namespace

void prefill_attention(const PrefillAttentionArgs& args, CudaStream stream) {
  const ArgChecker check("prefill_attention");
  const TensorView& q = args.q;
  const TensorView& k = args.k;
  const TensorView& v = args.v;
  const TensorView& out = args.out;
  const bool has_lse = given(args.lse);

  // dtypes
  check.dtype(q, "q", {DType::kE4M3, DType::kBF16});
  check.require(k.dtype() == q.dtype(), ErrorCategory::kInvalidArgument, [&] {
    return concat("`k` dtype: expected ", dtype_name(q.dtype()), " (the dtype of `q`), got ",
                  dtype_name(k.dtype()));
  });
  check.require(v.dtype() == q.dtype(), ErrorCategory::kInvalidArgument, [&] {
    return concat("`v` dtype: expected ", dtype_name(q.dtype()), " (the dtype of `q`), got ",
                  dtype_name(v.dtype()));
  });
  const OutputQuantKey key =
      check_output_quant_key(check, out, args.output_scale, args.output_block_scale, DType::kBF16);
  if (has_lse) check.dtype(args.lse, "lse", {DType::kF32});

  // shapes and layouts
  check_token_head_dim(check, q, "q");
  check_token_head_dim(check, k, "k");
  const bool v_transposed = check_v_layout(check, v);
  const std::int64_t tq = q.size(0), heads = q.size(1), dqk = q.size(2);
  const std::int64_t tk = k.size(0), dv = v.size(2);
  check.require(dqk == 192 || dqk == 128 || dqk == 64, ErrorCategory::kUnsupported, [&] {
    return concat("`q`: expected a head dim of 192, 128 or 64, got ", q.describe());
  });
  const bool split_k = given(args.k_rope);
  if (split_k) {
    check_k_rope(check, args, tk, dqk);
    check_shape(check, k, "k", {tk, heads, dqk - kRopeDims},
                "[Tk, H, Dqk - 64] with H and Dqk of `q`: the rest is `k_rope`");
  } else {
    check_shape(check, k, "k", {tk, heads, dqk}, "[Tk, H, Dqk] with H and Dqk of `q`");
  }
  check.require(dv == 128 || dv == 64, ErrorCategory::kUnsupported, [&] {
    return concat("`v`: expected a head dim of 128 or 64, got ", v.describe());
  });
  check_shape(check, v, "v", {tk, heads, dv}, "[Tk, H, Dv] with Tk of `k` and H of `q`");
  check.require(tq <= INT32_MAX && tk <= INT32_MAX, ErrorCategory::kInvalidArgument, [&] {
    return concat("expected at most 2^31 - 1 tokens (i32 cu_seqlens), got q ", q.describe(), ", k ",
                  k.describe());
  });
  const OutputQuantParams quant = check_out(check, args, key, tq, heads, dv);
  if (has_lse) {
    check_shape(check, args.lse, "lse", {tq, heads}, "[Tq, H]");
    check.aligned(args.lse, "lse", 4);
    check.elements_apart(args.lse, "lse");
  }
  check_cu_seqlens(check, args.cu_seqlens_q, "cu_seqlens_q");
  check_cu_seqlens(check, args.cu_seqlens_k, "cu_seqlens_k");
  check.require(args.cu_seqlens_q.size(0) == args.cu_seqlens_k.size(0),
                ErrorCategory::kInvalidArgument, [&] {
                  return concat("`cu_seqlens_k`: expected the length of `cu_seqlens_q` (",
                                args.cu_seqlens_q.size(0), "), got ", args.cu_seqlens_k.describe());
                });
  check.require(args.max_seqlen_q >= 0 && args.max_seqlen_k >= 0, ErrorCategory::kInvalidArgument,
                [&] {
                  return concat("expected max_seqlen_q and max_seqlen_k >= 0, got ",
                                args.max_seqlen_q, " and ", args.max_seqlen_k);
                });
  // > 0 on both devices (the CUDA kernel takes each row's max on unscaled scores, the scale
  // folded into the exponent); 0 is also what an unset PrefillAttentionArgs holds.
  check.require(std::isfinite(args.softmax_scale) && args.softmax_scale > 0.0f,
                ErrorCategory::kInvalidArgument, [&] {
                  return concat("expected a finite softmax_scale > 0, got ", args.softmax_scale);
                });

  // devices
  const Device device = q.device();
  const TensorView& lse_or_q = has_lse ? args.lse : q;
  check_devices(check, device,
                {{&k, "k"},
                 {split_k ? &args.k_rope : &k, split_k ? "k_rope" : "k"},
                 {&v, "v"},
                 {&out, "out"},
                 {&args.cu_seqlens_q, "cu_seqlens_q"},
                 {&args.cu_seqlens_k, "cu_seqlens_k"},
                 {&lse_or_q, has_lse ? "lse" : "q"}});

  const bool folds = check_prior_state(check, args, tq, heads, dv, device);

  PrefillAttentionParams p;
  p.dtype = q.dtype();
  if (p.dtype == DType::kE4M3) {
    p.q_descale = scalar_f32(check, args.q_descale, "q_descale", device);
    p.k_descale = scalar_f32(check, args.k_descale, "k_descale", device);
    p.v_descale = scalar_f32(check, args.v_descale, "v_descale", device);
  }
  if (device.is_cuda()) {
    check_cuda_layouts(check, args, v_transposed, key != OutputQuantKey::kNone);
    if (folds) check_even_strides(check, args.prior_out, "prior_out");
  }

  set_tensors(p, args, key, quant);

  dispatch(
      device, [&] { run_cpu(check, args, p); },
      [&](auto) {
        check_outputs_apart(check, args);
        cuda::prefill_attention(attention_variant_key(args), p, stream);
      });
}

}  // namespace fp8mla
