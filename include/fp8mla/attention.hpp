// Prefill attention for MLA and the merge of attention states (docs/design.md section 3, ops 8-9;
// sections 1 and 8 for masking, LSE and the error rule). Conventions as in quantize.hpp:
// TensorViews on one device, caller-allocated outputs written in full, 0 tokens valid, bad
// arguments throw fp8mla::Error.
#pragma once

#include "fp8mla/stream.hpp"
#include "fp8mla/tensor_view.hpp"

namespace fp8mla {

// ---- 8. Prefill attention ------------------------------------------------------------------
// A ragged batch, token-major: sequence b has queries cu_seqlens_q[b]..cu_seqlens_q[b+1] and keys
// cu_seqlens_k[b]..cu_seqlens_k[b+1]. For query i of a sequence with q_len queries and k_len
// keys, causal masking is bottom-right aligned: key j is visible when j <= i + (k_len - q_len).
//   s_j = softmax_scale * (q_i . k_j)   (q, k dequantized: x * descale for FP8 inputs)
//   O_i = sum_j softmax(s)_j * v_j,  LSE_i = ln(sum_j exp(s_j))   over the visible keys
// A row that sees no key (k_len = 0, or causal with i + k_len - q_len < 0) gives O = 0 and
// LSE = -inf.
struct PrefillAttentionArgs {
  TensorView q;  // [Tq, H, Dqk] e4m3 or bf16 (Dqk 192; 128 and 64 for non-MLA use)
  TensorView k;  // [Tk, H, Dqk], same dtype as q; [Tk, H, Dqk - 64] with k_rope
  // Optional: the last 64 dims of every head's key, given once per key (MLA's RoPE part of K is
  // the same for all heads): [Tk, 64] or [Tk, 1, 64], same dtype as q, any token stride with a
  // contiguous last dim. Key j of head h is then [k[j, h] | k_rope[j]], the same values (and
  // the same output bytes) as a k that holds k_rope in every head, without that per-head copy.
  TensorView k_rope;
  // [Tk, H, Dv] (Dv 128), same dtype as q, in one of two layouts:
  //  token-major: contiguous last dim (any token/head strides), as engines and FlashAttention
  //  keep V;
  //  transposed: contiguous tokens, i.e. a [Tk, H, Dv] view of [H][Dv][>= Tk] memory, which is
  //  what FP8 P V on Hopper reads (mla_kv_pack_quantize_fp8 writes it, VLayout::kTransposed).
  // A view that is both (one token) is token-major. The e4m3 CUDA kernel takes either and gives
  // the same bytes; transposed is its fast path (a token-major tile is transposed in shared
  // memory first).
  TensorView v;
  TensorView cu_seqlens_q;  // i32 [batch + 1], on q's device
  TensorView cu_seqlens_k;  // i32 [batch + 1]
  int max_seqlen_q = 0;     // upper bounds the caller knows, so the CUDA path never syncs
  int max_seqlen_k = 0;
  float softmax_scale = 0.0f;  // finite and > 0 (set it: 0 is an error)
  bool causal = true;
  // Per-tensor descales of FP8 inputs (one f32 each on q's device); ignored for bf16.
  TensorView q_descale;
  TensorView k_descale;
  TensorView v_descale;
  TensorView out;  // bf16 [Tq, H, Dv], any token/head strides, contiguous last dim (or quantized)
  // Optional f32 [Tq, H], any strides (e.g. a transposed [H, Tq] buffer). Leave it empty when
  // not needed: the e4m3 kernel then skips the f32 row sum of P, which only the LSE uses, and
  // accumulates Q K^T in one run of FP8 wgmmas instead of three promoted to f32 (the LSE's 1e-3
  // needs three). So its O differs in the last bits from a call with an LSE; both meet the error
  // rule. bf16 gives the same O either way.
  TensorView lse;
  // Fused output quantization (docs/design.md section 6; fp8mla/output_quant.hpp): with either
  // scale given, `out` is the quantized o_proj input and its key is detected by
  // detect_output_quant_key over its row width (bad combinations are its kInvalidArgument
  // errors). `out` is then e4m3 (FP8 keys) or e2m1x2 (nvfp4), [Tq, H, Dv] ([Tq, H, Dv / 2] bytes
  // for e2m1x2) with a token's values contiguous, or [Tq, H * Dv], any token stride. The op
  // computes O as without a key, rounds it to bf16 (the `out` it would write) and applies the
  // key's standalone op to each token's row of H * Dv values:
  //   fp8_static: quantize_fp8 with scale_inv = output_scale (one f32), out = e4m3(o * it);
  //   fp8_group128, fp8_group64: quantize_fp8_per_token_group (eps 1e-10) into the first Tq rows
  //     of output_block_scale, in the layout its dtype and strides give (f32 scales exact, ue8m0
  //     bytes and packed i32 words powers of two);
  //   nvfp4: quantize_nvfp4 with global_scale = output_scale, block scales 128x4 swizzled when
  //     output_block_scale is the 5-d view or a contiguous [R, round_up(H * Dv / 16, 4)] with R a
  //     multiple of 128 (the tiles of the first Tq rows written, padding as zeros), else linear
  //     (the first Tq rows).
  // So fused and unfused give the same bytes. Scale rows past those are not written. Both paths
  // fuse every key (on CUDA the kernel's epilogue). Leave both empty for the bf16 `out`.
  // A padded batch (CUDA graphs: tensors sized for Tq tokens, cu_seqlens_q ending before Tq):
  // only the rows of the sequences are written (out, lse, scale rows); the rows past the last
  // token keep what they held, except the swizzled NVFP4 padding rows Tq .. round_up(Tq, 128),
  // zeros as without padding (docs/design.md section 6).
  TensorView output_scale;
  TensorView output_block_scale;
  // Optional: a prior attention state of the same queries over other keys (chunked prefixes: the
  // state so far), folded into this call's: with both given the op writes
  //   (out, lse) = (prior_out, prior_lse) (+) (O, LSE of this call)
  // by merge_attention_states' rule (op 9; prior_* are its o_a, lse_a), with O rounded to bf16
  // first: the bytes of this call without them (bf16 `out`, an `lse`) followed by
  // merge_attention_states(prior_out, prior_lse, that out, that lse, out, lse, output_scale,
  // output_block_scale) on the same device (the CUDA kernel's epilogue merges in registers;
  // a padded batch's rows past its last token are neither merged nor written). A quantized
  // `out` quantizes the merged output, so the last chunk of a chunked prefix writes the o_proj
  // input. prior_out: bf16 [Tq, H, Dv], any token/head strides, contiguous last dim (even
  // strides on CUDA); prior_lse: f32 [Tq, H], any strides; -inf (or +inf) marks an empty state.
  // prior_out may be `out` itself and prior_lse `lse` itself (same data and strides: in place);
  // `lse` stays optional (the merged LSE, not needed after the last chunk).
  TensorView prior_out;
  TensorView prior_lse;
};

// `out`, `lse` and `output_block_scale` may not overlap any input (first to last element), except
// the in-place prior state above. The CPU
// path reads the descales and output_scale on the host and rejects ones that are not finite and
// > 0 (the CUDA kernels read them on the device, unchecked).
// The CPU path is the reference (fp32 accumulation, threaded). The CUDA path (Hopper, sm_90a) runs
// the compiled variants of src/cuda/attention/prefill_variants.def (e4m3 and bf16, causal or not,
// Dqk 192, Dv 128; another combination is a kUnsupported error listing them) and needs:
//  - q, k, k_rope, v 16-byte aligned, with the strides TMA steps by (of dims longer than 1) in
//    multiples of 16 bytes: token and head strides of q, k and token-major v; k_rope's token
//    stride; head and dim strides of a transposed e4m3 v. e4m3 V in either layout (transposed is
//    faster), bf16 V token-major;
//  - out with even token and head strides (and positive descales);
//  - max_seqlen_q at least every sequence's query count (it sizes the grid: rows beyond it are not
//    computed). The device path does not read cu_seqlens on the host; it rejects only bounds
//    that no offsets allow (max_seqlen * batch < tokens).
// It allocates nothing and does not synchronize. P is rounded to e4m3 for the FP8 P V product
// after scaling by 2^8, which keeps probabilities down to 2^-14 normal.
void prefill_attention(const PrefillAttentionArgs& args, CudaStream stream = nullptr);

// ---- 9. Merge of attention states ----------------------------------------------------------
// (o_a, lse_a) (+) (o_b, lse_b): m = max(lse_a, lse_b); w_a = exp(lse_a - m), w_b = exp(lse_b - m);
// o = (w_a * o_a + w_b * o_b) / (w_a + w_b), lse = m + ln(w_a + w_b). Natural-log LSE. Two empty
// states (-inf, -inf) merge to (0, -inf), never NaN; one empty state leaves the other unchanged,
// byte for byte (a side whose weight is exactly 0 is not read, so its o may hold anything). An
// lse of +inf (FlashAttention-3's empty row) is an empty state, as -inf. A NaN lse propagates. The
// CPU and CUDA results differ only through exp/log (a few ulp).
// o_* are [T, H, D] bf16 or f32 (any token/head strides, contiguous last dim), lse_* f32 [T, H]
// (any strides; each input is read with its own strides). `out`/`out_lse` may be `o_a`/`lse_a`
// themselves (same data and strides); other overlaps of outputs with inputs are not allowed.
void merge_attention_states(const TensorView& o_a, const TensorView& lse_a, const TensorView& o_b,
                            const TensorView& lse_b, const TensorView& out,
                            const TensorView& out_lse, CudaStream stream = nullptr);

// The same with output scales for a quantized `out`, read and applied as PrefillAttentionArgs
// says (T tokens of H * D values): the merged o, rounded to bf16 (f32 states: their merged value
// rounded once), quantized by the key's standalone op; out_lse as without scales. Empty scales
// give the unquantized merge. With chunked prefixes only the last merge, whose `out` is the o_proj
// input, asks for the quantization (the earlier ones keep bf16 or f32 states).
// `num_tokens` (optional, one i32 of shape [] or [1] on the states' device, e.g. the last element
// of the batch's cu_seqlens_q) is the real token count of a batch padded to T (a CUDA graph
// captured for T tokens, docs/design.md section 6): only tokens [0, num_tokens) are merged and
// written, the rows past them (out, out_lse, scale rows) keep what they held; the swizzled NVFP4
// padding rows are T .. round_up(T, 128) as without it. The CUDA kernels read it on the device
// (a value outside [0, T] is clamped to it); the CPU path reads it on the host and rejects one
// outside [0, T].
void merge_attention_states(const TensorView& o_a, const TensorView& lse_a, const TensorView& o_b,
                            const TensorView& lse_b, const TensorView& out,
                            const TensorView& out_lse, const TensorView& output_scale,
                            const TensorView& output_block_scale, const TensorView& num_tokens = {},
                            CudaStream stream = nullptr);

// (o, lse) <- (o, lse) (+) (o_b, lse_b), in place.
void merge_attention_states_inplace(const TensorView& o, const TensorView& lse,
                                    const TensorView& o_b, const TensorView& lse_b,
                                    CudaStream stream = nullptr);

}  // namespace fp8mla
