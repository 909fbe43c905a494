// The bad inputs of the attention ops (fp8mla/attention.hpp) and of the output quantization key
// (fp8mla/output_quant.hpp): dtypes, head dims, shapes, strides, alignment, devices, cu_seqlens
// and max_seqlen, scales and descales, huge sizes and outputs over their inputs.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "bad_inputs_catalogue.hpp"
#include "fp8mla/attention.hpp"
#include "fp8mla/output_quant.hpp"

namespace fp8mla::test {
namespace {

constexpr auto kInvalid = ErrorCategory::kInvalidArgument;
constexpr auto kUnsupported = ErrorCategory::kUnsupported;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr std::int64_t kT = 4, kH = 2;

// A valid call: one causal sequence of 4 queries and keys, 2 heads, Dqk 192 and Dv 128, with
// an LSE; e4m3 with unit descales or bf16.
PrefillAttentionArgs prefill_args(Arena& a, DType dtype = DType::kBF16) {
  PrefillAttentionArgs p;
  p.q = a.input(dtype, {kT, kH, 192});
  p.k = a.input(dtype, {kT, kH, 192});
  p.v = a.input(dtype, {kT, kH, 128});
  p.cu_seqlens_q = a.ints(DType::kI32, {0, kT});
  p.cu_seqlens_k = a.ints(DType::kI32, {0, kT});
  p.max_seqlen_q = p.max_seqlen_k = int(kT);
  p.softmax_scale = 0.1f;
  if (dtype == DType::kE4M3) {
    p.q_descale = a.scalar(1.0f);
    p.k_descale = a.scalar(1.0f);
    p.v_descale = a.scalar(1.0f);
  }
  p.out = a.output(DType::kBF16, {kT, kH, 128});
  p.lse = a.output(DType::kF32, {kT, kH});
  return p;
}

// Runs prefill_attention on prefill_args(dtype) after `edit`.
template <typename Edit>
auto prefill_call(Edit edit, DType dtype = DType::kBF16) {
  return [=](Arena& a) {
    PrefillAttentionArgs p = prefill_args(a, dtype);
    edit(a, p);
    prefill_attention(p);
  };
}

// Two sequences of 2 queries and keys each, with `cu_q` and `cu_k` as the offsets.
template <typename Edit>
auto two_sequences(std::vector<std::int64_t> cu_q, std::vector<std::int64_t> cu_k, Edit edit) {
  return prefill_call([=](Arena& a, auto& p) {
    p.cu_seqlens_q = a.ints(DType::kI32, cu_q);
    p.cu_seqlens_k = a.ints(DType::kI32, cu_k);
    edit(a, p);
  });
}

constexpr auto kNoEdit = [](Arena&, auto&) {};

std::vector<BadInput> prefill_shape_bad_inputs() {
  return {
      {"prefill_attention: f16 q",
       prefill_call([](Arena& a, auto& p) {
         p.q = a.input(DType::kF16, {kT, kH, 192});
         p.k = a.input(DType::kF16, {kT, kH, 192});
         p.v = a.input(DType::kF16, {kT, kH, 128});
       }),
       kInvalid,
       {"`q` dtype", "expected one of {e4m3fn, bf16}", "got f16"}},
      {"prefill_attention: e4m3 k with bf16 q",
       prefill_call([](Arena& a, auto& p) {
         p.k = a.input(DType::kE4M3, {kT, kH, 192});
       }),
       kInvalid,
       {"`k` dtype: expected bf16 (the dtype of `q`)", "got e4m3fn"}},
      {"prefill_attention: f32 k_rope",
       prefill_call([](Arena& a, auto& p) {
         p.k = a.input(DType::kBF16, {kT, kH, 128});
         p.k_rope = a.input(DType::kF32, {kT, 64});
       }),
       kInvalid,
       {"`k_rope` dtype: expected bf16 (the dtype of `q`)", "got f32"}},
      {"prefill_attention: k_rope of 3 keys for 4",
       prefill_call([](Arena& a, auto& p) {
         p.k = a.input(DType::kBF16, {kT, kH, 128});
         p.k_rope = a.input(DType::kBF16, {3, 64});
       }),
       kInvalid,
       {"`k_rope`: expected [4, 64] or [4, 1, 64]", "got bf16[3, 64]"}},
      {"prefill_attention: k_rope with a 192-wide k",
       prefill_call([](Arena& a, auto& p) {
         p.k_rope = a.input(DType::kBF16, {kT, 64});
       }),
       kInvalid,
       {"`k`: expected [4, 2, 128]", "the rest is `k_rope`", "got bf16[4, 2, 192]"}},
      {"prefill_attention: q of 2 dims",
       prefill_call([](Arena& a, auto& p) {
         p.q = a.input(DType::kBF16, {kT, 192});
       }),
       kInvalid,
       {"`q`: expected 3 dims", "got bf16[4, 192]"}},
      {"prefill_attention: k of 3 heads",
       prefill_call([](Arena& a, auto& p) {
         p.k = a.input(DType::kBF16, {kT, 3, 192});
       }),
       kInvalid,
       {"`k`: expected [4, 2, 192]", "got bf16[4, 3, 192]"}},
      {"prefill_attention: v of 5 keys for 4",
       prefill_call([](Arena& a, auto& p) {
         p.v = a.input(DType::kBF16, {5, kH, 128});
       }),
       kInvalid,
       {"`v`: expected [4, 2, 128]", "got bf16[5, 2, 128]"}},
      {"prefill_attention: strided last dim of q",
       prefill_call([](Arena& a, auto& p) {
         p.q = a.input(DType::kBF16, {kT, kH, 192}, {.strides = {768, 384, 2}});
       }),
       kInvalid,
       {"`q`: expected a contiguous last dim (stride 1)", "strides [768, 384, 2]"}},
      {"prefill_attention: v neither token-major nor transposed",
       prefill_call([](Arena& a, auto& p) {
         p.v = a.input(DType::kBF16, {kT, kH, 128}, {.strides = {512, 256, 2}});
       }),
       kInvalid,
       {"`v`: expected a contiguous last dim (token-major) or contiguous tokens",
        "strides [512, 256, 2]"}},
      {"prefill_attention: misaligned k",
       prefill_call([](Arena& a, auto& p) {
         p.k = a.input(DType::kBF16, {kT, kH, 192}, {.byte_offset = 1});
       }),
       kInvalid,
       {"`k`: expected a 2-byte aligned data pointer", "got address"}},
      {"prefill_attention: Dqk 96",
       prefill_call([](Arena& a, auto& p) {
         p.q = a.input(DType::kBF16, {kT, kH, 96});
         p.k = a.input(DType::kBF16, {kT, kH, 96});
       }),
       kUnsupported,
       {"`q`: expected a head dim of 192, 128 or 64", "got bf16[4, 2, 96]"}},
      {"prefill_attention: Dqk 576 (the latent width)",
       prefill_call([](Arena& a, auto& p) {
         p.q = a.input(DType::kBF16, {kT, kH, 576});
         p.k = a.input(DType::kBF16, {kT, kH, 576});
       }),
       kUnsupported,
       {"`q`: expected a head dim of 192, 128 or 64", "got bf16[4, 2, 576]"}},
      {"prefill_attention: Dv 512",
       prefill_call([](Arena& a, auto& p) {
         p.v = a.input(DType::kBF16, {kT, kH, 512});
         p.out = a.output(DType::kBF16, {kT, kH, 512});
       }),
       kUnsupported,
       {"`v`: expected a head dim of 128 or 64", "got bf16[4, 2, 512]"}},
  };
}

// `out` and `lse`: shapes, strides, devices, sizes and overlaps.
std::vector<BadInput> prefill_output_bad_inputs() {
  return {
      {"prefill_attention: out of head dim 64 for Dv 128",
       prefill_call([](Arena& a, auto& p) {
         p.out = a.output(DType::kBF16, {kT, kH, 64});
       }),
       kInvalid,
       {"`out`: expected [4, 2, 128] ([Tq, H, Dv])", "got bf16[4, 2, 64]"}},
      {"prefill_attention: out rows that share memory",
       prefill_call([](Arena& a, auto& p) {
         p.out = a.output(DType::kBF16, {kT, kH, 128}, {.strides = {0, 128, 1}});
       }),
       kInvalid,
       {"`out`: expected strides that keep every element apart", "strides [0, 128, 1]"}},
      {"prefill_attention: out on cuda:0",
       prefill_call([](Arena& a, auto& p) {
         p.out = a.output(DType::kBF16, {kT, kH, 128}, {.device = Device::cuda(0)});
       }),
       kInvalid,
       {"`out`: expected a tensor on cpu, the device of the other tensors", "on cuda:0"}},
      {"prefill_attention: bf16 lse",
       prefill_call([](Arena& a, auto& p) {
         p.lse = a.output(DType::kBF16, {kT, kH});
       }),
       kInvalid,
       {"`lse` dtype: expected f32", "got bf16"}},
      {"prefill_attention: lse of [H, Tq]",
       prefill_call([](Arena& a, auto& p) {
         p.lse = a.output(DType::kF32, {kH, kT});
       }),
       kInvalid,
       {"`lse`: expected [4, 2] ([Tq, H])", "got f32[2, 4]"}},
      {"prefill_attention: 2^31 query tokens",
       prefill_call([](Arena& a, auto& p) {
         p.q = a.input(DType::kBF16, {std::int64_t(1) << 31, kH, 192});
       }),
       kInvalid,
       {"expected at most 2^31 - 1 tokens (i32 cu_seqlens)", "got q bf16[2147483648, 2, 192]"}},
      {"prefill_attention: out over q",
       prefill_call([](Arena&, auto& p) {
         p.out = TensorView(p.q.data(), DType::kBF16, {kT, kH, 128});
       }),
       kInvalid,
       {"`out`: expected memory apart from `q`", "bf16[4, 2, 128]", "bf16[4, 2, 192]"}},
      {"prefill_attention: lse over v",
       prefill_call([](Arena&, auto& p) {
         p.lse = TensorView(p.v.data(), DType::kF32, {kT, kH});
       }),
       kInvalid,
       {"`lse`: expected memory apart from `v`", "f32[4, 2]"}},
  };
}

std::vector<BadInput> prefill_batch_bad_inputs() {
  return {
      {"prefill_attention: decreasing cu_seqlens_q",
       two_sequences({0, 3, 2}, {0, 2, 4}, kNoEdit),
       kInvalid,
       {"`cu_seqlens_q`: expected non-decreasing offsets", "got 3 then 2 at index 2"}},
      {"prefill_attention: cu_seqlens_k longer than cu_seqlens_q",
       prefill_call([](Arena& a, auto& p) {
         p.cu_seqlens_k = a.ints(DType::kI32, {0, 2, 4});
       }),
       kInvalid,
       {"`cu_seqlens_k`: expected the length of `cu_seqlens_q` (2)", "got i32[3]"}},
      {"prefill_attention: cu_seqlens_q past q",
       prefill_call([](Arena& a, auto& p) {
         p.cu_seqlens_q = a.ints(DType::kI32, {0, 5});
       }),
       kInvalid,
       {"`cu_seqlens_q`: expected at most 4 (the tokens of `q`) last", "got 5"}},
      {"prefill_attention: cu_seqlens_k not starting at 0",
       prefill_call([](Arena& a, auto& p) {
         p.cu_seqlens_k = a.ints(DType::kI32, {1, 4});
       }),
       kInvalid,
       {"`cu_seqlens_k`: expected 0 first", "got 1"}},
      {"prefill_attention: empty cu_seqlens_q",
       prefill_call([](Arena& a, auto& p) { p.cu_seqlens_q = a.ints(DType::kI32, {}); }),
       kInvalid,
       {"`cu_seqlens_q`: expected [batch + 1] with batch >= 0", "got i32[0]"}},
      {"prefill_attention: i64 cu_seqlens_k",
       prefill_call([](Arena& a, auto& p) {
         p.cu_seqlens_k = a.ints(DType::kI64, {0, kT});
       }),
       kInvalid,
       {"`cu_seqlens_k` dtype: expected i32", "got i64"}},
      {"prefill_attention: cu_seqlens_q on cuda:0",
       prefill_call([](Arena& a, auto& p) {
         p.cu_seqlens_q = a.ints(DType::kI32, {0, kT}, {.device = Device::cuda(0)});
       }),
       kInvalid,
       {"`cu_seqlens_q`: expected a tensor on cpu", "on cuda:0"}},
      {"prefill_attention: max_seqlen_q smaller than a sequence",
       two_sequences({0, 1, 4}, {0, 2, 4}, [](Arena&, auto& p) { p.max_seqlen_q = 2; }),
       kInvalid,
       {"`max_seqlen_q` (2) is smaller than the length 3 of sequence 1 in `cu_seqlens_q`"}},
      {"prefill_attention: max_seqlen_k smaller than a sequence",
       prefill_call([](Arena&, auto& p) { p.max_seqlen_k = 3; }),
       kInvalid,
       {"`max_seqlen_k` (3) is smaller than the length 4 of sequence 0"}},
      {"prefill_attention: negative max_seqlen_q",
       prefill_call([](Arena&, auto& p) { p.max_seqlen_q = -1; }),
       kInvalid,
       {"expected max_seqlen_q and max_seqlen_k >= 0", "got -1 and 4"}},
      {"prefill_attention: NaN softmax_scale",
       prefill_call([](Arena&, auto& p) { p.softmax_scale = kNaN; }),
       kInvalid,
       {"expected a finite softmax_scale", "got nan"}},
      {"prefill_attention: infinite softmax_scale",
       prefill_call(
           [](Arena&, auto& p) { p.softmax_scale = -std::numeric_limits<float>::infinity(); }),
       kInvalid,
       {"expected a finite softmax_scale", "got -inf"}},
      {"prefill_attention: softmax_scale left at 0",
       prefill_call([](Arena&, auto& p) { p.softmax_scale = 0.0f; }),
       kInvalid,
       {"expected a finite softmax_scale > 0", "got 0"}},
      {"prefill_attention: e4m3 without q_descale",
       prefill_call([](Arena&, auto& p) { p.q_descale = {}; }, DType::kE4M3),
       kInvalid,
       {"`q_descale`: expected one f32 for FP8 inputs", "got none"}},
      {"prefill_attention: k_descale of two elements",
       prefill_call([](Arena& a, auto& p) { p.k_descale = a.input(DType::kF32, {2}); },
                    DType::kE4M3),
       kInvalid,
       {"`k_descale`: expected one f32 of shape [] or [1]", "got f32[2]"}},
      {"prefill_attention: v_descale on cuda:0",
       prefill_call([](Arena& a, auto& p) { p.v_descale = a.scalar(1.0f, Device::cuda(0)); },
                    DType::kE4M3),
       kInvalid,
       {"`v_descale`: expected a tensor on cpu, the device of `q`", "on cuda:0"}},
      {"prefill_attention: NaN q_descale",
       prefill_call([](Arena& a, auto& p) { p.q_descale = a.scalar(kNaN); }, DType::kE4M3),
       kInvalid,
       {"`q_descale`: expected a finite scale > 0", "got nan"}},
      {"prefill_attention: zero k_descale",
       prefill_call([](Arena& a, auto& p) { p.k_descale = a.scalar(0.0f); }, DType::kE4M3),
       kInvalid,
       {"`k_descale`: expected a finite scale > 0", "got 0"}},
      {"prefill_attention: negative v_descale",
       prefill_call([](Arena& a, auto& p) { p.v_descale = a.scalar(-1.0f); }, DType::kE4M3),
       kInvalid,
       {"`v_descale`: expected a finite scale > 0", "got -1"}},
      {"prefill_attention: e4m3 out without scales",
       prefill_call([](Arena& a, auto& p) {
         p.out = a.output(DType::kE4M3, {kT, kH, 128});
       }),
       kInvalid,
       {"`out` dtype: expected bf16, got e4m3fn",
        "a quantized output needs output_scale or output_block_scale"}},
      {"prefill_attention: NaN output_scale of an fp8_static out",
       prefill_call([](Arena& a, auto& p) {
         p.out = a.output(DType::kE4M3, {kT, kH, 128});
         p.output_scale = a.scalar(kNaN);
       }),
       kInvalid,
       {"`output_scale`: expected a finite scale > 0", "got nan"}},
      {"prefill_attention: lse inside out",
       prefill_call([](Arena&, auto& p) {
         p.lse = TensorView(p.out.data(), DType::kF32, {p.out.size(0), p.out.size(1)});
       }),
       kInvalid,
       {"`out`: expected memory apart from `lse` (two outputs may not share memory)"}},
      {"prefill_attention: output_scale with a bf16 out",
       prefill_call([](Arena& a, auto& p) { p.output_scale = a.scalar(1.0f); }),
       kInvalid,
       {"`out` dtype: expected e4m3fn (static or group FP8) or e2m1x2 (NVFP4) with output_scale",
        "got bf16"}},
  };
}

// merge_attention_states of two [4, 2, 128] bf16 states into fresh outputs, edited by `edit`.
template <typename Edit>
auto merge_call(Edit edit) {
  return [=](Arena& a) {
    TensorView o_a = a.input(DType::kBF16, {kT, kH, 128}), lse_a = a.input(DType::kF32, {kT, kH});
    TensorView o_b = a.input(DType::kBF16, {kT, kH, 128}), lse_b = a.input(DType::kF32, {kT, kH});
    TensorView out = a.output(DType::kBF16, {kT, kH, 128});
    TensorView out_lse = a.output(DType::kF32, {kT, kH});
    TensorView num_tokens;
    edit(a, o_a, lse_a, o_b, lse_b, out, out_lse, num_tokens);
    merge_attention_states(o_a, lse_a, o_b, lse_b, out, out_lse, {}, {}, num_tokens);
  };
}

// A prior state to fold in: half given, dtype, shape, device, and an output over it.
std::vector<BadInput> prefill_prior_bad_inputs() {
  const auto with_prior = [](auto edit) {
    return prefill_call([=](Arena& a, auto& p) {
      p.prior_out = a.input(DType::kBF16, {kT, kH, 128});
      p.prior_lse = a.input(DType::kF32, {kT, kH});
      edit(a, p);
    });
  };
  return {
      {"prefill_attention: prior_out without prior_lse",
       with_prior([](Arena&, auto& p) { p.prior_lse = {}; }),
       kInvalid,
       {"expected `prior_out` and `prior_lse` together", "got only `prior_out`"}},
      {"prefill_attention: f32 prior_out",
       with_prior([](Arena& a, auto& p) {
         p.prior_out = a.input(DType::kF32, {kT, kH, 128});
       }),
       kInvalid,
       {"`prior_out` dtype: expected bf16, got f32"}},
      {"prefill_attention: prior_lse of another token count",
       with_prior([](Arena& a, auto& p) {
         p.prior_lse = a.input(DType::kF32, {kT + 1, kH});
       }),
       kInvalid,
       {"`prior_lse`: expected [4, 2] ([Tq, H])", "got f32[5, 2]"}},
      {"prefill_attention: prior_out on cuda:0",
       with_prior([](Arena& a, auto& p) {
         p.prior_out = a.input(DType::kBF16, {kT, kH, 128}, {.device = Device::cuda(0)});
       }),
       kInvalid,
       {"`prior_out`: expected a tensor on cpu", "on cuda:0"}},
      {"prefill_attention: lse over prior_out",
       with_prior([](Arena&, auto& p) {
         p.lse = TensorView(p.prior_out.data(), DType::kF32, {kT, kH});
       }),
       kInvalid,
       {"`lse`: expected memory apart from `prior_out`"}},
  };
}

std::vector<BadInput> merge_bad_inputs() {
  return {
      {"merge_attention_states: f16 states",
       merge_call([](Arena& a, auto& o_a, auto&, auto& o_b, auto&, auto& out, auto&, auto&) {
         o_a = a.input(DType::kF16, {kT, kH, 128});
         o_b = a.input(DType::kF16, {kT, kH, 128});
         out = a.output(DType::kF16, {kT, kH, 128});
       }),
       kInvalid,
       {"`o_a` dtype: expected one of {bf16, f32}", "got f16"}},
      {"merge_attention_states: o_b of 3 tokens",
       merge_call([](Arena& a, auto&, auto&, auto& o_b, auto&, auto&, auto&, auto&) {
         o_b = a.input(DType::kBF16, {3, kH, 128});
       }),
       kInvalid,
       {"`o_b` dim 0: expected size 4", "got bf16[3, 2, 128]"}},
      {"merge_attention_states: bf16 lse_a",
       merge_call([](Arena& a, auto&, auto& lse_a, auto&, auto&, auto&, auto&, auto&) {
         lse_a = a.input(DType::kBF16, {kT, kH});
       }),
       kInvalid,
       {"`lse_a` dtype: expected f32", "got bf16"}},
      {"merge_attention_states: out_lse inside out",
       merge_call([](Arena&, auto&, auto&, auto&, auto&, auto& out, auto& out_lse, auto&) {
         out_lse = TensorView(out.data(), DType::kF32, {kT, kH});
       }),
       kInvalid,
       {"`out`: expected memory apart from `out_lse` (two outputs may not share memory)"}},
      {"merge_attention_states: out at o_a with other strides",
       merge_call([](Arena&, auto& o_a, auto&, auto&, auto&, auto& out, auto&, auto&) {
         out = TensorView(o_a.data(), DType::kBF16, {kT, kH, 128}, {128, 512, 1});
       }),
       kInvalid,
       {"`out` aliases `o_a` as another view", "strides [128, 512, 1]"}},
      {"merge_attention_states: out over the second half of o_b",
       merge_call([](Arena& a, auto&, auto&, auto& o_b, auto&, auto& out, auto&, auto&) {
         // o_b, the first 4 tokens of an 8-token buffer; out, tokens 2 to 5 of it.
         const TensorView eight = a.input(DType::kBF16, {2 * kT, kH, 128});
         o_b = eight.narrow(0, 0, kT);
         out = eight.narrow(0, 2, kT);
       }),
       kInvalid,
       {"`out`: expected memory apart from `o_b`", "bf16[4, 2, 128]"}},
      {"merge_attention_states: out_lse elements that share memory",
       merge_call([](Arena& a, auto&, auto&, auto&, auto&, auto&, auto& out_lse, auto&) {
         out_lse = a.output(DType::kF32, {kT, kH}, {.strides = {1, 1}});
       }),
       kInvalid,
       {"`out_lse`: expected strides that keep every element apart", "strides [1, 1]"}},
      {"merge_attention_states: negative global scale of an NVFP4 out",
       [](Arena& a) {
         merge_attention_states(
             a.input(DType::kBF16, {kT, kH, 128}), a.input(DType::kF32, {kT, kH}),
             a.input(DType::kBF16, {kT, kH, 128}), a.input(DType::kF32, {kT, kH}),
             a.output(DType::kE2M1x2, {kT, kH * 64}), a.output(DType::kF32, {kT, kH}),
             a.scalar(-1.0f), a.output(DType::kE4M3, {kT, 16}));
       },
       kInvalid,
       {"`output_scale`: expected a finite scale > 0", "got -1"}},
      {"merge_attention_states: num_tokens past the tokens",
       merge_call([](Arena& a, auto&, auto&, auto&, auto&, auto&, auto&, auto& num_tokens) {
         num_tokens = a.ints(DType::kI32, {kT + 1});
       }),
       kInvalid,
       {"`num_tokens`: expected 0 to 4 (the tokens of `o_a`)", "got 5"}},
      {"merge_attention_states: negative num_tokens",
       merge_call([](Arena& a, auto&, auto&, auto&, auto&, auto&, auto&, auto& num_tokens) {
         num_tokens = a.ints(DType::kI32, {-1});
       }),
       kInvalid,
       {"`num_tokens`: expected 0 to 4", "got -1"}},
      {"merge_attention_states: i64 num_tokens",
       merge_call([](Arena& a, auto&, auto&, auto&, auto&, auto&, auto&, auto& num_tokens) {
         num_tokens = a.ints(DType::kI64, {2});
       }),
       kInvalid,
       {"`num_tokens` dtype: expected i32", "got i64"}},
  };
}

std::vector<BadInput> output_quant_bad_inputs() {
  const auto detect = [](const TensorView& out, const TensorView& scale, const TensorView& block,
                         std::int64_t dim = 256) {
    detect_output_quant_key(out, scale, block, dim);
  };
  return {
      {"detect_output_quant_key: group count that does not divide the row",
       [=](Arena& a) {
         detect(a.output(DType::kE4M3, {kT, 256}), {}, a.output(DType::kF32, {kT, 3}));
       },
       kInvalid,
       {"expected a group count that divides output_dim 256", "got 3 groups"}},
      {"detect_output_quant_key: groups of 32",
       [=](Arena& a) {
         detect(a.output(DType::kE4M3, {kT, 256}), {}, a.output(DType::kF32, {kT, 8}));
       },
       kInvalid,
       {"expected groups of 64 or 128", "256 / 8 = 32"}},
      {"detect_output_quant_key: packed words that fit both group sizes",
       [=](Arena& a) {
         detect(a.output(DType::kE4M3, {kT, 256}), {}, a.output(DType::kI32, {kT, 1}));
       },
       kInvalid,
       {"1 packed UE8M0 words a row fit both group sizes 64 and 128", "got i32[4, 1]"}},
      {"detect_output_quant_key: too few scale rows",
       [=](Arena& a) {
         detect(a.output(DType::kE4M3, {kT, 256}), {}, a.output(DType::kF32, {2, 2}));
       },
       kInvalid,
       {"expected at least 4 rows (one per row of `output`)", "got f32[2, 2]"}},
      {"detect_output_quant_key: NVFP4 without a global scale",
       [=](Arena& a) {
         detect(a.output(DType::kE2M1x2, {kT, 128}), {}, a.output(DType::kE4M3, {kT, 16}));
       },
       kInvalid,
       {"`output_scale`: expected the global scale (one f32) of the NVFP4 `output`", "got none"}},
      {"detect_output_quant_key: output_dim not the row width",
       [=](Arena& a) {
         detect(a.output(DType::kE4M3, {kT, 256}), a.scalar(1.0f), {}, 512);
       },
       kInvalid,
       {"output_dim: expected the row width of `output`, 256 values", "got 512"}},
      {"detect_output_quant_key: both scales for group FP8",
       [=](Arena& a) {
         detect(a.output(DType::kE4M3, {kT, 256}), a.scalar(1.0f), a.output(DType::kF32, {kT, 2}));
       },
       kInvalid,
       {"`output_scale`: expected none with `output_block_scale`", "got f32[1]"}},
  };
}

}  // namespace

std::vector<BadInput> attention_bad_inputs() {
  std::vector<BadInput> all = prefill_shape_bad_inputs();
  for (auto part : {prefill_output_bad_inputs(), prefill_batch_bad_inputs(),
                    prefill_prior_bad_inputs(), merge_bad_inputs(), output_quant_bad_inputs()}) {
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

std::vector<ValidCall> attention_valid_calls() {
  return {
      {"prefill_attention bf16", prefill_call(kNoEdit)},
      {"prefill_attention e4m3", prefill_call(kNoEdit, DType::kE4M3)},
      {"prefill_attention of two sequences", two_sequences({0, 2, 4}, {0, 2, 4}, kNoEdit)},
      {"prefill_attention folding a prior state in place", prefill_call([](Arena&, auto& p) {
         p.prior_out = p.out;
         p.prior_lse = p.lse;
       })},
      {"merge_attention_states",
       merge_call([](Arena&, auto&, auto&, auto&, auto&, auto&, auto&, auto&) {})},
  };
}

}  // namespace fp8mla::test
