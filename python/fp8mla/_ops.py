"""The op table of the Python surface: each op's arguments, outputs, mutations and docstring.

Everything else is generated from OPS: the public functions of fp8mla (__init__.py), the torch
custom ops torch.ops.fp8mla.<op> with their fake implementations (torch_ops.py), and the calls
into the nanobind module _C, which binds every op through one helper (python/src/module.cpp).
Array frameworks plug in through one small adapter each (_arrays.py: numpy, other DLPack arrays;
torch_ops.py: torch). _spec.py says what the kinds of arguments are and how the code is built.

Arguments are listed in the order of the C++ API (include/fp8mla/*.hpp), which is also the order
of the torch op's schema and of the _C function; the public Python signature takes the
positional ones in that order, then the keyword-only ones in that order.

To add an op (or an argument): declare it in the C++ API, add its def_op row (or parameter) to
the def_*_ops of its header at the end of python/src/module.cpp, and its Op (or Arg) here, in the
C++ order.

BACKEND_OPS are the methods of the attention backends (python/src/backend.cpp): ops like the
others whose first argument is the backend's name; fp8mla.AttentionBackend calls them.
"""

from __future__ import annotations

from . import _C
from ._arrays import adapter_for, adapter_for_device
from ._common import (
    MLA,
    SCALE_LAYOUTS,
    check_choice,
    group_scale_plan,
    invalid_argument,
    nvfp4_shapes,
    out_shape,
    transposed_pitch,
)
from ._spec import (
    BOOL,
    DTYPE,
    FLOAT,
    INOUT,
    INT,
    OPT_INOUT,
    OPT_INT,
    OPT_SCALAR_TENSOR,
    OPT_TENSOR,
    OUT,
    PY,
    SCALAR_TENSOR,
    SCALE,
    STR,
    TENSOR,
    YARN,
    Arg,
    Op,
)

# ---- allocation rules ----------------------------------------------------------------------------


def _group_scales(arrays, x, group_size, scale_layout):
    check_choice("quantize_fp8_per_token_group", "scale_layout", scale_layout, SCALE_LAYOUTS)
    kind, shape, transpose, rows = group_scale_plan(tuple(x.shape), group_size, scale_layout)
    if not transpose:
        return arrays.empty(shape, kind, x)
    # The column-major [rows, G] view of [G, R] storage, in one call (a slice and a transpose
    # cost torch two more).
    return arrays.empty_view(shape, kind, x, (rows, shape[0]), (1, shape[1]))


def _v_out(arrays, v, v_layout):
    """e4m3 like v [n, H, 128]; "transposed": a [n, H, 128] view of [H, 128, pitch] memory."""
    if v_layout == "transposed":
        n, heads, dim = v.shape
        pitch = transposed_pitch(n)
        return arrays.empty_view((heads, dim, pitch), "e4m3", v, (n, heads, dim),
                                 (1, dim * pitch, pitch))
    return arrays.empty_as(v, "e4m3")


def _backend_v_out(arrays, v, backend):
    """v_out of a backend's hook or pack: e4m3 in the backend's V layout."""
    return _v_out(arrays, v, _V_LAYOUTS.get(backend))


# The V layout each backend's hook and pack write (an unknown name: the binding says so).
_V_LAYOUTS = {name: _C.backend_capabilities(name)["v_layout"]
              for name in _C.attention_backend_names()}


def _check_cos_sin_rows(max_pos, out):
    shape = tuple(out.shape) if out is not None else ()
    if len(shape) >= 1 and shape[0] != max_pos:
        raise invalid_argument(f"make_cos_sin_cache: `out`: expected {max_pos} rows (max_pos), "
                               f"got shape {list(shape)}")


def _cos_sin_adapter(out, device):
    return adapter_for(out) if out is not None else adapter_for_device(device)


def _is_bytes(x) -> bool:
    """A plain uint8 array (numpy or torch): raw bytes whose format the op table names."""
    return str(x.dtype).rpartition(".")[2] == "uint8"


def _raw_quantized_out(out):
    """A uint8 output of the attention ops is packed FP4 bytes (as quantize_nvfp4 returns them);
    a uint16 one, bf16 bits."""
    return "e2m1x2" if _is_bytes(out) else "bf16"


def _raw_block_scale(out):
    """uint8 block scales: e4m3 with a packed FP4 (uint8) output, UE8M0 exponents otherwise."""
    return "e4m3" if _is_bytes(out) else "ue8m0"


def _fp8_out(arrays, x, dtype):
    """`out` of the per-tensor ops: x's shape in the format `dtype` names."""
    return arrays.empty_as(x, dtype)


# ---- the ops -------------------------------------------------------------------------------------

# q_out and k_out of the RoPE + e4m3 ops and the packs: [.., 192] like their no-RoPE inputs.
# (An allocation rule names the arguments it reads, so each query name has its own.)
_QK_OUT = {
    "q_nope": lambda arrays, q_nope: arrays.empty(
        out_shape(tuple(q_nope.shape), MLA["qk"]), "e4m3", q_nope),
    "q": lambda arrays, q: arrays.empty(out_shape(tuple(q.shape), MLA["qk"]), "e4m3", q),
}


def _k_out(arrays, k_nope, k_rope_out):
    """k_out: [.., 192], or k_nope's [.., 128] alone when K's RoPE part goes to k_rope_out."""
    dim = MLA["qk"] if k_rope_out is None else MLA["nope"]
    return arrays.empty(out_shape(tuple(k_nope.shape), dim), "e4m3", k_nope)


def _rope_quantize_args(query: str, latent: str) -> list:
    """mla_rope_quantize_fp8's arguments, which the backends' prepare hook takes too, with the
    query's no-RoPE part named `query` and the latent written to the cache `latent`."""
    return [
        Arg(query, TENSOR),
        Arg("q_pe", TENSOR),
        Arg("k_nope", TENSOR),
        Arg("k_pe", TENSOR),
        Arg("positions", TENSOR),
        Arg("cos_sin", TENSOR),
        Arg("style", STR, "interleaved"),
        Arg("q_scale_inv", FLOAT, 1.0),
        Arg("k_scale_inv", FLOAT, 1.0),
        Arg("q_out", OUT, dtype="e4m3", alloc=_QK_OUT[query]),
        Arg("k_out", OUT, dtype="e4m3", alloc=_k_out),
        # LatentCacheWrite: the cache, its slots, scale and error flag; then the latent.
        Arg("cache", OPT_INOUT, None, dtype="e4m3"),
        Arg("slot_mapping", OPT_TENSOR, None),
        Arg("cache_scale_inv", FLOAT, 1.0),
        Arg("error_flag", OPT_INOUT, None),
        Arg(latent, OPT_TENSOR, None),
        Arg("k_rope_out", OPT_INOUT, None, dtype="e4m3"),
    ]


def _kv_pack_args(v_out_alloc) -> list:
    """mla_kv_pack_quantize_fp8's tensors and scales, which the backends' pack takes too; V is
    allocated by `v_out_alloc` (the op's v_layout, or the backend's)."""
    return [
        Arg("k_nope", TENSOR),
        Arg("k_pe", TENSOR),
        Arg("v", TENSOR),
        Arg("k_scale_inv", FLOAT, 1.0),
        Arg("v_scale_inv", FLOAT, 1.0),
        Arg("k_out", OUT, dtype="e4m3", alloc=_k_out),
        Arg("v_out", OUT, dtype="e4m3", alloc=v_out_alloc),
        Arg("k_rope_out", OPT_INOUT, None, dtype="e4m3"),
    ]


OPS = (
    Op("quantize_fp8", """Per-tensor FP8: out = fp8(x * scale_inv), nearest-even, saturating.

    `scale_inv` is a float or a one-element f32 tensor on x's device (read by the kernel, so a
    captured CUDA graph sees its current value). `dtype` "e4m3" or "e5m2": the format of an
    allocated `out`, or of the bytes of a given uint8 `out`; a given fp8 `out` is written in its
    own dtype.""", [
        Arg("x", TENSOR),
        Arg("out", OUT, dtype=lambda dtype: dtype, alloc=_fp8_out),
        Arg("scale_inv", SCALE, keyword=False),
        Arg("dtype", DTYPE, "e4m3"),
    ], result=lambda out: out),
    Op("quantize_fp8_dynamic", """Dynamic per-tensor FP8: scale = max(amax / fp8_max, min) into
    `scale` (one f32), then out = fp8(x * (1 / scale)). Returns (out, scale).""", [
        Arg("x", TENSOR),
        Arg("out", OUT, dtype=lambda dtype: dtype, alloc=_fp8_out),
        Arg("scale", OUT, dtype="f32", alloc=lambda arrays, x: arrays.empty((1,), "f32", x)),
        Arg("dtype", DTYPE, "e4m3"),
    ], result=lambda out, scale: (out, scale)),
    Op("quantize_fp8_per_token_group", """Per-token-group FP8 e4m3 (groups of 64 or 128 along the
    last dim). Returns (out, scales).

    Allocated scales follow `scale_layout`: "row_major" f32 [M, G]; "column_major" f32 strides
    (1, M); "tma_aligned" f32 strides (1, round_up(M, 4)); "ue8m0" one exponent byte per group
    [M, G]; "packed_ue8m0" int32 [M, ceil(G/4)] strides (1, round_up(M, 4)). Given `scales`, its
    dtype and strides decide the layout.""", [
        Arg("x", TENSOR),
        Arg("out", OUT, dtype="e4m3", alloc=lambda arrays, x: arrays.empty_as(x, "e4m3")),
        Arg("scales", OUT, dtype="ue8m0", alloc=_group_scales),
        Arg("group_size", INT, 128),
        Arg("eps", FLOAT, 1e-10),
        Arg("round_scale_to_pow2", BOOL, False),
        Arg("scale_layout", PY, "row_major"),
    ], result=lambda out, scales: (out, scales)),
    Op("quantize_nvfp4", """NVFP4: blocks of 16 along K, e4m3 block scales (128x4 swizzled or
    linear), two e2m1 values per byte. Returns (out [.., K/2], block_scales).""", [
        Arg("x", TENSOR),
        Arg("out", OUT, dtype="e2m1x2", alloc=lambda arrays, x, layout: arrays.empty(
            nvfp4_shapes(tuple(x.shape), layout)[0], "e2m1x2", x)),
        Arg("block_scales", OUT, dtype="e4m3", alloc=lambda arrays, x, layout: arrays.empty(
            nvfp4_shapes(tuple(x.shape), layout)[1], "e4m3", x)),
        Arg("global_scale", SCALAR_TENSOR, keyword=False),
        Arg("layout", STR, "swizzled"),
    ], result=lambda out, block_scales: (out, block_scales)),
    # ---- MLA prefill preparation (fp8mla/mla_prep.hpp) ----
    Op("make_cos_sin_cache", """The RoPE table of mla_rope_quantize_fp8: f32 [max_pos, rope_dim]
    = [cos(rope_dim/2) | sin(rope_dim/2)] of positions 0..max_pos-1, computed in double and
    rounded once.

    `yarn`: None (plain RoPE with base `theta`) or DeepSeek-V3's YaRN rope_scaling as a dict with
    keys factor, original_max_position, beta_fast, beta_slow, mscale, mscale_all_dim (missing
    factor, original_max_position, beta_fast, beta_slow take DeepSeek-V3's values 40, 4096, 32,
    1; a missing mscale or mscale_all_dim is absent, as transformers reads a config: cos and sin
    are scaled by mscale(factor, mscale) / mscale(factor, mscale_all_dim) only when both are
    given and non-zero, else by mscale(factor, 1), with mscale(f, m) = 0.1 * m * ln(f) + 1); a
    model config's rope_scaling dict (original_max_position_embeddings, type "yarn") and
    transformers 5's rope_parameters (rope_type "yarn" or "default", with rope_theta, which must
    equal `theta`; attention_factor, truncate and partial_rotary_factor are checked against what
    the table applies) are accepted as they are.

    Allocated (when `out` is not given) as a numpy array for `device=None`, as a torch tensor on
    `device` otherwise ("cpu", "cuda", a torch.device; numpy for "cpu" without torch). A CUDA
    table is filled by a blocking copy after synchronizing the stream (set-up work: not
    for CUDA graph capture). Given `out` (f32 [max_pos, rope_dim], contiguous rows) decides.""", [
        Arg("max_pos", PY, keyword=False),
        Arg("cos_sin", OUT, public="out", dtype="f32",
            alloc=lambda arrays, max_pos, rope_dim, device: arrays.empty(
                (max_pos, rope_dim), "f32", device)),
        Arg("rope_dim", INT, 64),
        Arg("theta", FLOAT, 10000.0),
        Arg("yarn", YARN, None),
        Arg("device", PY, None),
    ], result=lambda out: out, check=_check_cos_sin_rows, choose=_cos_sin_adapter,
       host_fill=True),
    Op("mla_rope_quantize_fp8", """Fused RoPE + FP8 e4m3 of Q and K for MLA prefill; optionally
    writes the latent cache too.

    q_nope, k_nope [T, H, 128], q_pe [T, H, 64] and k_pe [T, 64] or [T, 1, 64] (shared by all
    heads), all bf16 or all f16, any token/head strides with a contiguous last dim (slices of a
    projection's output work as they are); positions i32/i64 [T]; cos_sin from
    make_cos_sin_cache (rope_dim 64). `style` "interleaved" (pairs 2i, 2i+1: DeepSeek) or "neox"
    (pairs i, i+32). Writes
        q_out[t, h] = [e4m3(q_nope * q_scale_inv) | e4m3(rope(q_pe, pos) * q_scale_inv)]
        k_out[t, h] = [e4m3(k_nope * k_scale_inv) | e4m3(rope(k_pe, pos) * k_scale_inv)]
    (e4m3 [T, H, 192], allocated when not given) and returns (q_out, k_out). With `k_rope_out`
    (e4m3 [T, 64] or [T, 1, 64], given by the caller) K is split as prefill_attention's k_rope
    takes it: k_out [T, H, 128] holds e4m3(k_nope * k_scale_inv) and k_rope_out[t] the RoPE part
    once per token, the same bytes as every head's k_out[t, h, 128:] without the split.

    With `cache` (e4m3 [num_pages, page_size, 576]) it also writes, for slot_mapping[t] (i32/i64
    [T]; -1 skips the token), the row [e4m3(kv_c[t] * cache_scale_inv) |
    e4m3(rope(k_pe[t]) * cache_scale_inv)], kv_c bf16/f16 [T, 512]. A position outside cos_sin
    or a slot outside the cache raises on the CPU (nothing written); on CUDA that token's q/k rows
    are zeros, its cache row is skipped and `error_flag` (one i32 on the device, set to 1, never
    cleared) is set when given. kv_c, slot_mapping and error_flag need `cache`.""", [
        *_rope_quantize_args(query="q_nope", latent="kv_c"),
    ], result=lambda q_out, k_out: (q_out, k_out)),
    Op("mla_kv_cache_write", """Writes the latent rows [e4m3(kv_c[t] * scale_inv) |
    e4m3(k_pe[t] * scale_inv)] into the paged cache in place: slot s is row s % page_size of page
    s // page_size.

    kv_c bf16/f16 [T, 512], k_pe (already RoPE'd) [T, 64] or [T, 1, 64] of the same dtype;
    cache e4m3 [num_pages, page_size 1..128, 576] (contiguous rows, any page/row strides);
    slot_mapping i32/i64 [T], -1 skips a token. Other slots stay bit-identical. A slot outside the
    cache raises on the CPU (nothing written); on CUDA it is skipped and sets `error_flag` (one
    i32 on the device, set to 1, never cleared) when given. Returns None.""", [
        Arg("kv_c", TENSOR),
        Arg("k_pe", TENSOR),
        Arg("cache", INOUT, dtype="e4m3"),
        Arg("slot_mapping", TENSOR),
        Arg("scale_inv", FLOAT, 1.0),
        Arg("error_flag", OPT_INOUT, None),
    ], result=lambda: None),
    Op("mla_kv_gather", """Reads the latent rows of `slots` (i32/i64 [n], every one in range)
    back to bf16: kv_c_out [n, 512] and k_pe_out [n, 64] = bf16(decode_e4m3(row) * scale),
    allocated on the cache's device when not given. Returns (kv_c_out, k_pe_out). A bad slot
    raises on the CPU; on CUDA its rows are zeros and `error_flag` is set when given.""", [
        Arg("cache", TENSOR, dtype="e4m3"),
        Arg("slots", TENSOR),
        Arg("scale", FLOAT, keyword=False),
        Arg("kv_c_out", OUT, dtype="bf16", alloc=lambda arrays, cache, slots: arrays.empty(
            (_gather_rows(slots), MLA["kv_lora_rank"]), "bf16", cache)),
        Arg("k_pe_out", OUT, dtype="bf16", alloc=lambda arrays, cache, slots: arrays.empty(
            (_gather_rows(slots), MLA["rope"]), "bf16", cache)),
        Arg("error_flag", OPT_INOUT, None),
    ], result=lambda kv_c_out, k_pe_out: (kv_c_out, k_pe_out)),
    Op("mla_kv_pack_quantize_fp8", """Packs a prefix chunk's K and V for FP8 attention: k_out
    [n, H, 192] = [e4m3(k_nope * k_scale_inv) | e4m3(k_pe * k_scale_inv)] (k_pe [n, 64] or
    [n, 1, 64] broadcast to every head) and v_out [n, H, 128] = e4m3(v * v_scale_inv). k_nope
    [n, H, 128] and v [n, H, 128] bf16/f16 may be strided (slices of kv_b_proj's output).
    v_layout "transposed" writes v_out as a [n, H, 128] view of [H, 128, pitch] memory (tokens
    contiguous, pitch a multiple of 16 when allocated here), what FP8 prefill_attention reads on
    Hopper. With `k_rope_out` (e4m3 [n, 64] or [n, 1, 64], given by the caller) K is split as
    prefill_attention's k_rope takes it: k_out [n, H, 128] holds k_nope's part and k_rope_out[t]
    e4m3(k_pe[t] * k_scale_inv) once per token. Returns (k_out, v_out).""", [
        *_kv_pack_args(_v_out),
        Arg("v_layout", STR, "token_major"),
    ], result=lambda k_out, v_out: (k_out, v_out)),
    Op("mla_v_quantize_fp8", """V alone, for a backend whose K comes from mla_rope_quantize_fp8:
    v_out [n, H, 128] = e4m3(v * v_scale_inv), the V half of mla_kv_pack_quantize_fp8 (same
    bytes, same checks). v [n, H, 128] bf16/f16 may be strided (contiguous last dim). v_layout as
    for mla_kv_pack_quantize_fp8 ("transposed": a [n, H, 128] view of [H, 128, pitch] memory,
    pitch a multiple of 16 when allocated here). Returns v_out.""", [
        Arg("v", TENSOR),
        Arg("v_out", OUT, dtype="e4m3", alloc=_v_out),
        Arg("v_scale_inv", FLOAT, 1.0),
        Arg("v_layout", STR, "token_major"),
    ], result=lambda v_out: v_out),
    # ---- attention (fp8mla/attention.hpp) ----
    Op("prefill_attention", """Attention over a ragged batch (token-major; cu_seqlens_* int32
    [batch + 1]; max_seqlen_* upper bounds). q, k [T, H, 192] and v [Tk, H, 128]: e4m3 with
    one-element f32 descales, or bf16. v token-major (contiguous last dim) or, e4m3, transposed (a
    [Tk, H, 128] view of [H, 128, >= Tk] memory, keys contiguous: the CUDA kernel's fast path,
    same result); bf16 v token-major on CUDA. Causal masking is
    bottom-right aligned. Returns out (bf16 [Tq, H, 128], allocated when not given), or
    (out, lse) when `lse` is given or `return_lse` (f32 [Tq, H], natural log; -inf for rows that
    see no key).

    `k_rope` ([Tk, 64] or [Tk, 1, 64], q's dtype) gives the last 64 dims of every head's key
    once per key, MLA's RoPE part (the same for all heads): k is then [Tk, H, 128] and key j of
    head h is [k[j, h] | k_rope[j]], the same result as a k with k_rope in every head, without
    that per-head copy.

    `output_scale` / `output_block_scale` ask for a quantized `out` (the o_proj input), read as
    detect_output_quant_key reads them: float8_e4m3fn [Tq, H, 128] or [Tq, H * 128], or packed
    FP4 bytes (uint8) [Tq, H, 64] or [Tq, H * 64], a token's values contiguous. The op computes
    the bf16 output it returns without them and quantizes it exactly as the standalone op would:
    "fp8_static" = quantize_fp8(o, output_scale) (out = e4m3(o * output_scale)); group FP8 =
    quantize_fp8_per_token_group into output_block_scale's first Tq rows, in the layout its
    dtype and strides give; "nvfp4" = quantize_nvfp4 with global scale output_scale, swizzled
    block scales where output_block_scale holds the 128x4 tiles (contiguous, rows a multiple of
    128, or the 5-d view), linear otherwise. `out` and output_block_scale are written, the
    result is `out` as above. Fused on both devices: the CUDA kernel's epilogue writes the
    quantized output and scales directly. Under torch.compile, fp8mla.enable_output_quant_fusion()
    rewrites this op with a bf16 `out` followed by a standalone quantization of it into this
    form. cu_seqlens_q may end before Tq (a padded batch, as a CUDA graph captures it): the rows
    past its last token (out, lse and scale rows) are left as they are, on both devices.

    `prior_out` (bf16 [Tq, H, 128]) and `prior_lse` (f32 [Tq, H]), given together, are an earlier
    attention state of the same queries over other keys (a chunked prefix's state so far): the op
    returns that state merged with its own, the bytes of this call without them followed by
    merge_attention_states(prior_out, prior_lse, out, lse, ...) over the real tokens. They may be
    `out` and `lse` themselves (in place); with output scales the merged output is quantized (the
    last chunk writes the o_proj input). On CUDA non-causal calls only (the folding kernels; the
    CPU takes both).""", [
        Arg("q", TENSOR),
        Arg("k", TENSOR),
        Arg("v", TENSOR),
        Arg("cu_seqlens_q", TENSOR),
        Arg("cu_seqlens_k", TENSOR),
        Arg("max_seqlen_q", INT),
        Arg("max_seqlen_k", INT),
        Arg("softmax_scale", FLOAT, keyword=True),
        Arg("causal", BOOL, True),
        Arg("q_descale", OPT_SCALAR_TENSOR, None),
        Arg("k_descale", OPT_SCALAR_TENSOR, None),
        Arg("v_descale", OPT_SCALAR_TENSOR, None),
        Arg("out", OUT, dtype=_raw_quantized_out, alloc=lambda arrays, q, v: arrays.empty(
            (q.shape[0], q.shape[1], v.shape[2]), "bf16", q)),
        Arg("lse", OUT, dtype="f32", alloc=lambda arrays, q: arrays.empty(
            (q.shape[0], q.shape[1]), "f32", q), when=lambda return_lse: return_lse),
        Arg("output_scale", OPT_TENSOR, None),
        Arg("output_block_scale", OPT_INOUT, None, dtype=_raw_block_scale),
        Arg("k_rope", OPT_TENSOR, None),
        Arg("prior_out", OPT_TENSOR, None),
        Arg("prior_lse", OPT_TENSOR, None),
        Arg("return_lse", PY, False),
    ], result=lambda out, lse: (out, lse) if lse is not None else out),
    Op("merge_attention_states", """(o_a, lse_a) merged with (o_b, lse_b) (natural-log LSE):
    returns (out, out_lse), allocated when not given; `out`/`out_lse` may be o_a/lse_a for an
    in-place merge. An empty state has lse -inf, or +inf as FlashAttention-3 writes it; two merge
    to (0, -inf). `output_scale` / `output_block_scale` quantize the merged output as for
    prefill_attention (T tokens of H * D values, f32 states rounded to bf16 first): give them on
    the last merge of a chunked prefix only. Fused on both devices; under torch.compile,
    fp8mla.enable_output_quant_fusion() fuses a standalone quantization of the output here.
    `num_tokens` (one int32 on the states' device, e.g. cu_seqlens_q[-1:]) is the real token
    count of a batch padded to T (a CUDA graph): only the first num_tokens rows are merged and
    written, the others keep what they held.""", [
        Arg("o_a", TENSOR),
        Arg("lse_a", TENSOR),
        Arg("o_b", TENSOR),
        Arg("lse_b", TENSOR),
        Arg("out", OUT, dtype=_raw_quantized_out, alloc=lambda arrays, o_a: arrays.empty_like(
            o_a)),
        Arg("out_lse", OUT, dtype="f32", alloc=lambda arrays, lse_a: arrays.empty_as(
            lse_a, "f32")),
        Arg("output_scale", OPT_TENSOR, None),
        Arg("output_block_scale", OPT_INOUT, None, dtype=_raw_block_scale),
        Arg("num_tokens", OPT_TENSOR, None),
    ], result=lambda out, out_lse: (out, out_lse)),
    # ---- output quantization key (fp8mla/output_quant.hpp) ----
    Op("detect_output_quant_key", """The quantization an attention output asks for: None (bf16,
    no scales), "fp8_static", "fp8_group128", "fp8_group64" or "nvfp4", by the rules of
    fp8mla/output_quant.hpp (docs/design.md section 6); a bad combination raises
    fp8mla.InvalidArgumentError naming what was expected and what was given.

    `output` is the o_proj input [T, H * 128] (or its [T, H, 128] view): float8_e4m3fn for FP8,
    packed FP4 bytes (uint8 or float4_e2m1fn_x2, as quantize_nvfp4 returns them) for NVFP4.
    `output_scale` one f32; `output_block_scale` per-token-group scales in any layout
    quantize_fp8_per_token_group takes (f32, ue8m0, packed int32) or NVFP4 e4m3 block scales.
    `output_dim` defaults to the output's row width in values (its last dim for a 2-d FP8
    output, twice the last dim for packed FP4). Reads metadata only: no data, no stream, no
    allocation; torch tensors on any device (it is not a torch custom op: it returns a Python
    value and puts nothing in a graph, so under torch.compile it runs at a graph break).""", [
        Arg("output", TENSOR, dtype=lambda output: _raw_quantized_out(output)),
        Arg("output_scale", OPT_TENSOR, None, keyword=False),
        Arg("output_block_scale", OPT_TENSOR, None, keyword=False,
            dtype=lambda output: _raw_block_scale(output)),
        Arg("output_dim", OPT_INT, None, keyword=False),
    ], query=True),
)

BACKEND_OPS = (
    Op("backend_prepare_prefill_qkv", """The backend's BF16 -> FP8 transition of one prefill
    step (its prepare_prefill_qkv hook): mla_rope_quantize_fp8 of (q, q_pe, k_nope, k_pe) with
    the latent cache write, and mla_v_quantize_fp8 of v in the backend's V layout. Returns
    (q_out, k_out, v_out), e4m3 and ready for prefill_attention.

    q [T, H, 128] is the no-RoPE part of the query and q_pe [T, H, 64] its RoPE part (slices
    q[..., :128] and q[..., 128:] of q_b_proj's output work as they are); k_nope and v
    [T, H, 128] slices of kv_b_proj's output; k_pe [T, 64] or [T, 1, 64] the latent's RoPE part;
    positions i32/i64 [T]; cos_sin from make_cos_sin_cache. With `cache` (e4m3 [num_pages,
    page_size, 576]) the latent rows [e4m3(kv_a * cache_scale_inv) | e4m3(rope(k_pe) *
    cache_scale_inv)] are written at slot_mapping (-1 skips a token); kv_a [T, 512] is the
    normalized latent. `k_rope_out` splits K as mla_rope_quantize_fp8 does (k_out [T, H, 128],
    the RoPE part once per token), the form prefill_attention's k_rope reads. Arithmetic, checks
    and errors as for mla_rope_quantize_fp8 and mla_v_quantize_fp8. A backend without the hook
    raises fp8mla.UnsupportedError.""", [
        Arg("backend", STR),
        *_rope_quantize_args(query="q", latent="kv_a"),
        Arg("v", TENSOR, keyword=False),
        Arg("v_scale_inv", FLOAT, 1.0),
        Arg("v_out", OUT, dtype="e4m3", alloc=_backend_v_out),
    ], result=lambda q_out, k_out, v_out: (q_out, k_out, v_out)),
    Op("backend_pack_prefix_chunk_kv", """The backend's FP8 pack of a prefix chunk's K and V
    (re-expanded from the latent cache): mla_kv_pack_quantize_fp8 with V in the backend's V
    layout. Returns (k_out, v_out). A backend without the pack raises
    fp8mla.UnsupportedError.""", [
        Arg("backend", STR),
        *_kv_pack_args(_backend_v_out),
    ], result=lambda k_out, v_out: (k_out, v_out)),
)


def _gather_rows(slots) -> int:
    """Token count of mla_kv_gather's outputs for `slots` (the op checks it is 1-d)."""
    return slots.shape[0] if len(slots.shape) >= 1 else 1
