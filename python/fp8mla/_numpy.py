"""The numpy front end (CPU). numpy has no bfloat16 / float8 types of its own: ml_dtypes arrays are
passed to the C++ library as same-size integer views with the fp8mla dtype named explicitly, and
outputs are allocated with ml_dtypes types when ml_dtypes is installed (uint8 otherwise)."""

from __future__ import annotations

import numpy as np

from . import _C
from ._common import (
    FP8_DTYPES,
    MLA,
    NVFP4_LAYOUTS,
    SCALE_LAYOUTS,
    V_LAYOUTS,
    check_choice,
    gather_rows,
    group_scale_plan,
    nvfp4_shapes,
    out_shape,
    transposed_pitch,
    yarn_tuple,
)

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes is optional
    ml_dtypes = None

# numpy dtype -> (fp8mla dtype name, integer view dtype) for types numpy's DLPack cannot export.
_VIEWS: dict = {}
_STORAGE = {"e4m3": np.uint8, "e5m2": np.uint8, "ue8m0": np.uint8, "e2m1x2": np.uint8,
            "bf16": np.uint16}
# The plain unsigned storage an output of each fp8mla dtype may be given as (raw bytes / bits).
_RAW = {"e4m3": np.uint8, "e5m2": np.uint8, "ue8m0": np.uint8, "e2m1x2": np.uint8,
        "bf16": np.uint16}
if ml_dtypes is not None:
    _VIEWS = {
        np.dtype(ml_dtypes.bfloat16): ("bf16", np.uint16),
        np.dtype(ml_dtypes.float8_e4m3fn): ("e4m3", np.uint8),
        np.dtype(ml_dtypes.float8_e5m2): ("e5m2", np.uint8),
    }
    _STORAGE["e4m3"] = ml_dtypes.float8_e4m3fn
    _STORAGE["e5m2"] = ml_dtypes.float8_e5m2
    _STORAGE["bf16"] = ml_dtypes.bfloat16
    if hasattr(ml_dtypes, "float8_e8m0fnu"):
        _VIEWS[np.dtype(ml_dtypes.float8_e8m0fnu)] = ("ue8m0", np.uint8)
        _STORAGE["ue8m0"] = ml_dtypes.float8_e8m0fnu


def arg(a, raw_dtype: str | None = None):
    """The argument _C takes for array `a`: the array, or (integer view, fp8mla dtype name).

    `raw_dtype` names the fp8mla dtype of a plain unsigned array of its size (an fp8 output given
    as uint8 bytes, a bf16 one as uint16 bits)."""
    if not isinstance(a, np.ndarray):
        return a
    view = _VIEWS.get(a.dtype)
    if view is not None:
        return (a.view(view[1]), view[0])
    if raw_dtype is not None and a.dtype == _RAW.get(raw_dtype):
        return (a, raw_dtype)
    return a


def _scalar_or_array(value):
    if isinstance(value, np.ndarray):
        return value
    return float(value)


def _f32_scalar(value):
    if isinstance(value, np.ndarray):
        return value
    return np.array([value], dtype=np.float32)


def quantize_fp8(x, scale_inv, *, out=None, dtype="e4m3", stream=None):
    check_choice("quantize_fp8", "dtype", dtype, FP8_DTYPES)
    if out is None:
        out = np.empty(x.shape, dtype=_STORAGE[dtype])
    _C.quantize_fp8(arg(x), arg(out, dtype), _scalar_or_array(scale_inv), stream or 0)
    return out


def quantize_fp8_dynamic(x, *, out=None, scale=None, dtype="e4m3", stream=None):
    check_choice("quantize_fp8_dynamic", "dtype", dtype, FP8_DTYPES)
    if out is None:
        out = np.empty(x.shape, dtype=_STORAGE[dtype])
    if scale is None:
        scale = np.empty((1,), dtype=np.float32)
    _C.quantize_fp8_dynamic(arg(x), arg(out, dtype), arg(scale), stream or 0)
    return out, scale


def quantize_fp8_per_token_group(
    x,
    *,
    group_size=128,
    eps=1e-10,
    scale_layout="row_major",
    round_scale_to_pow2=False,
    out=None,
    scales=None,
    stream=None,
):
    op = "quantize_fp8_per_token_group"
    if out is None:
        out = np.empty(x.shape, dtype=_STORAGE["e4m3"])
    if scales is None:
        check_choice(op, "scale_layout", scale_layout, SCALE_LAYOUTS)
        kind, shape, transpose, rows = group_scale_plan(x.shape, group_size, scale_layout)
        dtype = {"f32": np.float32, "ue8m0": _STORAGE["ue8m0"], "i32": np.int32}[kind]
        scales = np.empty(shape, dtype=dtype)
        if transpose:
            scales = scales[:, :rows].T
    _C.quantize_fp8_per_token_group(
        arg(x), arg(out, "e4m3"), arg(scales, "ue8m0"), group_size, eps, round_scale_to_pow2,
        stream or 0,
    )
    return out, scales


def quantize_nvfp4(x, global_scale, *, layout="swizzled", out=None, block_scales=None, stream=None):
    check_choice("quantize_nvfp4", "layout", layout, NVFP4_LAYOUTS)
    out_shape, scales_shape = nvfp4_shapes(x.shape, layout)
    if out is None:
        out = np.empty(out_shape, dtype=np.uint8)
    if block_scales is None:
        block_scales = np.empty(scales_shape, dtype=_STORAGE["e4m3"])
    _C.quantize_nvfp4(
        arg(x), arg(out, "e2m1x2"), arg(block_scales, "e4m3"), arg(_f32_scalar(global_scale)),
        layout, stream or 0,
    )
    return out, block_scales


# ---- MLA prefill preparation ---------------------------------------------------------------------


def _opt(a, raw_dtype: str | None = None):
    return None if a is None else arg(a, raw_dtype)


def make_cos_sin_cache(max_pos, *, rope_dim=64, theta=10000.0, yarn=None, out=None, stream=None):
    yarn = yarn_tuple("make_cos_sin_cache", yarn)
    if out is None:
        out = np.empty((max_pos, rope_dim), dtype=np.float32)
    _C.make_cos_sin_cache(arg(out), int(rope_dim), float(theta), yarn, stream or 0)
    return out


def mla_rope_quantize_fp8(q_nope, q_pe, k_nope, k_pe, positions, cos_sin, *, style="interleaved",
                          q_scale_inv=1.0, k_scale_inv=1.0, q_out=None, k_out=None, kv_c=None,
                          cache=None, slot_mapping=None, cache_scale_inv=1.0, error_flag=None,
                          stream=None):
    if q_out is None:
        q_out = np.empty(out_shape(q_nope.shape, MLA["qk"]), dtype=_STORAGE["e4m3"])
    if k_out is None:
        k_out = np.empty(out_shape(k_nope.shape, MLA["qk"]), dtype=_STORAGE["e4m3"])
    _C.mla_rope_quantize_fp8(
        arg(q_nope), arg(q_pe), arg(k_nope), arg(k_pe), arg(positions), arg(cos_sin), style,
        float(q_scale_inv), float(k_scale_inv), arg(q_out, "e4m3"), arg(k_out, "e4m3"),
        _opt(kv_c), _opt(cache, "e4m3"), _opt(slot_mapping), float(cache_scale_inv),
        _opt(error_flag), stream or 0,
    )
    return q_out, k_out


def mla_kv_cache_write(kv_c, k_pe, cache, slot_mapping, *, scale_inv=1.0, error_flag=None,
                       stream=None):
    _C.mla_kv_cache_write(arg(kv_c), arg(k_pe), arg(cache, "e4m3"), arg(slot_mapping),
                          float(scale_inv), _opt(error_flag), stream or 0)


def mla_kv_gather(cache, slots, scale, *, kv_c_out=None, k_pe_out=None, error_flag=None,
                  stream=None):
    n = gather_rows(slots.shape)
    if kv_c_out is None:
        kv_c_out = np.empty((n, MLA["kv_lora_rank"]), dtype=_STORAGE["bf16"])
    if k_pe_out is None:
        k_pe_out = np.empty((n, MLA["rope"]), dtype=_STORAGE["bf16"])
    _C.mla_kv_gather(arg(cache, "e4m3"), arg(slots), float(scale), arg(kv_c_out, "bf16"),
                     arg(k_pe_out, "bf16"), _opt(error_flag), stream or 0)
    return kv_c_out, k_pe_out


def _v_out(v, v_layout):
    """A new e4m3 V output like v [n, H, 128] in `v_layout` ("transposed": a [n, H, 128] view of
    [H, 128, pitch] memory)."""
    if v_layout == "transposed":
        n, heads, dim = v.shape
        return np.empty((heads, dim, transposed_pitch(n)),
                        dtype=_STORAGE["e4m3"])[:, :, :n].transpose(2, 0, 1)
    return np.empty(v.shape, dtype=_STORAGE["e4m3"])


def mla_kv_pack_quantize_fp8(k_nope, k_pe, v, *, k_scale_inv=1.0, v_scale_inv=1.0, k_out=None,
                             v_out=None, v_layout="token_major", stream=None):
    check_choice("mla_kv_pack_quantize_fp8", "v_layout", v_layout, V_LAYOUTS)
    if k_out is None:
        k_out = np.empty(out_shape(k_nope.shape, MLA["qk"]), dtype=_STORAGE["e4m3"])
    if v_out is None:
        v_out = _v_out(v, v_layout)
    _C.mla_kv_pack_quantize_fp8(arg(k_nope), arg(k_pe), arg(v), float(k_scale_inv),
                                float(v_scale_inv), arg(k_out, "e4m3"), arg(v_out, "e4m3"),
                                v_layout, stream or 0)
    return k_out, v_out


def mla_v_quantize_fp8(v, *, v_scale_inv=1.0, v_out=None, v_layout="token_major", stream=None):
    check_choice("mla_v_quantize_fp8", "v_layout", v_layout, V_LAYOUTS)
    if v_out is None:
        v_out = _v_out(v, v_layout)
    _C.mla_v_quantize_fp8(arg(v), float(v_scale_inv), arg(v_out, "e4m3"), v_layout, stream or 0)
    return v_out


def prefill_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                      softmax_scale, causal=True, q_descale=None, k_descale=None, v_descale=None,
                      out=None, lse=None, return_lse=False, stream=None):
    if out is None:
        out = np.empty((q.shape[0], q.shape[1], v.shape[2]), dtype=_STORAGE["bf16"])
    if lse is None and return_lse:
        lse = np.empty((q.shape[0], q.shape[1]), dtype=np.float32)
    descale = lambda d: None if d is None else _f32_scalar(d)  # noqa: E731
    _C.prefill_attention(arg(q), arg(k), arg(v), arg(cu_seqlens_q), arg(cu_seqlens_k),
                         int(max_seqlen_q), int(max_seqlen_k), float(softmax_scale), bool(causal),
                         descale(q_descale), descale(k_descale), descale(v_descale),
                         arg(out, "bf16"), _opt(lse), stream or 0)
    return (out, lse) if lse is not None else out


def merge_attention_states(o_a, lse_a, o_b, lse_b, *, out=None, out_lse=None, stream=None):
    if out is None:
        out = np.empty_like(o_a)
    if out_lse is None:
        out_lse = np.empty(lse_a.shape, dtype=np.float32)
    _C.merge_attention_states(arg(o_a), arg(lse_a), arg(o_b), arg(lse_b), arg(out, "bf16"),
                              arg(out_lse), stream or 0)
    return out, out_lse
