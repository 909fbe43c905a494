"""The numpy front end (CPU). numpy has no bfloat16 / float8 types of its own: ml_dtypes arrays are
passed to the C++ library as same-size integer views with the fp8mla dtype named explicitly, and
outputs are allocated with ml_dtypes types when ml_dtypes is installed (uint8 otherwise)."""

from __future__ import annotations

import numpy as np

from . import _C
from ._common import (
    FP8_DTYPES,
    NVFP4_LAYOUTS,
    SCALE_LAYOUTS,
    check_choice,
    group_scale_plan,
    nvfp4_shapes,
)

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes is optional
    ml_dtypes = None

# numpy dtype -> (fp8mla dtype name, integer view dtype) for types numpy's DLPack cannot export.
_VIEWS: dict = {}
_STORAGE = {"e4m3": np.uint8, "e5m2": np.uint8, "ue8m0": np.uint8, "e2m1x2": np.uint8}
if ml_dtypes is not None:
    _VIEWS = {
        np.dtype(ml_dtypes.bfloat16): ("bf16", np.uint16),
        np.dtype(ml_dtypes.float8_e4m3fn): ("e4m3", np.uint8),
        np.dtype(ml_dtypes.float8_e5m2): ("e5m2", np.uint8),
    }
    _STORAGE["e4m3"] = ml_dtypes.float8_e4m3fn
    _STORAGE["e5m2"] = ml_dtypes.float8_e5m2
    if hasattr(ml_dtypes, "float8_e8m0fnu"):
        _VIEWS[np.dtype(ml_dtypes.float8_e8m0fnu)] = ("ue8m0", np.uint8)
        _STORAGE["ue8m0"] = ml_dtypes.float8_e8m0fnu


def arg(a, raw_dtype: str | None = None):
    """The argument _C takes for array `a`: the array, or (integer view, fp8mla dtype name).

    `raw_dtype` names the fp8mla dtype of a plain uint8 array (an fp8 output given as bytes)."""
    if not isinstance(a, np.ndarray):
        return a
    view = _VIEWS.get(a.dtype)
    if view is not None:
        return (a.view(view[1]), view[0])
    if raw_dtype is not None and a.dtype == np.uint8:
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
