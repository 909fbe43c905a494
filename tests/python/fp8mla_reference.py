"""Straightforward numpy references for the quantization ops (docs/design.md section 2), written
from the spec with ml_dtypes casts, independent of the library. All arithmetic is float32 like the
library.

ml_dtypes' float8 / float4 casts round to nearest-even but do not saturate (overflow gives NaN or
inf), so values are clamped to the format's largest finite value first."""

from __future__ import annotations

import ml_dtypes
import numpy as np

F32 = np.float32
FP8 = {"e4m3": (ml_dtypes.float8_e4m3fn, 448.0), "e5m2": (ml_dtypes.float8_e5m2, 57344.0)}
MIN_DYNAMIC_SCALE = F32(1.0) / F32(448.0 * 512.0)


def as_f32(x) -> np.ndarray:
    return np.asarray(x).astype(np.float32)


def cast_fp8(v: np.ndarray, dtype: str = "e4m3") -> np.ndarray:
    """fp8 bytes of float32 `v`: nearest-even, saturating, NaN kept."""
    np_type, fmax = FP8[dtype]
    v = np.asarray(v, dtype=np.float32)
    return np.clip(v, -fmax, fmax).astype(np_type).view(np.uint8)


def cast_e2m1(v: np.ndarray) -> np.ndarray:
    """e2m1 codes (one per byte, low nibble) of float32 `v`: nearest-even, saturating to +-6."""
    v = np.clip(np.asarray(v, dtype=np.float32), -6.0, 6.0)
    return v.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0x0F


def quantize_fp8(x, scale_inv: float, dtype: str = "e4m3") -> np.ndarray:
    return cast_fp8(as_f32(x) * F32(scale_inv), dtype)


def quantize_fp8_dynamic(x, dtype: str = "e4m3"):
    xf = as_f32(x)
    amax = F32(np.nanmax(np.abs(xf))) if xf.size and not np.all(np.isnan(xf)) else F32(0)
    scale = np.maximum(amax / F32(FP8[dtype][1]), MIN_DYNAMIC_SCALE).astype(np.float32)
    return cast_fp8(xf * (F32(1.0) / scale), dtype), F32(scale)


def ue8m0_exponent(s: np.ndarray) -> np.ndarray:
    """Biased exponent e of the smallest power of two 2^(e-127) >= s (s > 0, normal range)."""
    mantissa, exponent = np.frexp(np.asarray(s, dtype=np.float32))  # s = m * 2^exponent, m in [0.5, 1)
    e = np.where(mantissa == 0.5, exponent - 1, exponent) + 127
    return np.clip(e, 0, 254).astype(np.uint8)


def quantize_fp8_per_token_group(x, group_size: int, eps: float = 1e-10, pow2: bool = False):
    """(e4m3 bytes [.., K], scales f32 [M, G], ue8m0 exponents uint8 [M, G])."""
    xf = as_f32(x).reshape(-1, x.shape[-1])
    m, k = xf.shape
    groups = xf.reshape(m, k // group_size, group_size)
    amax = np.maximum(F32(eps), np.max(np.abs(groups), axis=2)).astype(np.float32)
    s = (amax / F32(448.0)).astype(np.float32)
    exponents = ue8m0_exponent(s)
    if pow2:
        s = np.ldexp(F32(1.0), exponents.astype(np.int32) - 127).astype(np.float32)
    q = cast_fp8(groups / s[:, :, None]).reshape(x.shape)
    return q, s, exponents


def pack_ue8m0(exponents: np.ndarray) -> np.ndarray:
    """int32 [M, ceil(G/4)]: group g in byte g % 4 of word g / 4, padding bytes zero."""
    m, g = exponents.shape
    padded = np.zeros((m, (g + 3) // 4 * 4), dtype=np.uint8)
    padded[:, :g] = exponents
    return padded.view("<i4").reshape(m, -1)


def swizzled_offset(m: int, kb: int, k_blocks: int) -> int:
    k_tiles = (k_blocks + 3) // 4
    return (((m // 128) * k_tiles + kb // 4) * 32 + m % 32) * 16 + ((m % 128) // 32) * 4 + kb % 4


def quantize_nvfp4(x, global_scale: float, layout: str = "swizzled"):
    """(packed e2m1 bytes [.., K/2], block scales bytes: swizzled 2-d or linear [M, K/16])."""
    xf = as_f32(x).reshape(-1, x.shape[-1])
    m, k = xf.shape
    gs = F32(global_scale)
    blocks = xf.reshape(m, k // 16, 16)
    amax = np.max(np.abs(blocks), axis=2).astype(np.float32)
    sf = cast_fp8(gs * (amax / F32(6.0)))
    sf_value = sf.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(sf_value == 0, F32(0), F32(1.0) / (sf_value * (F32(1.0) / gs))).astype(
            np.float32
        )
    codes = cast_e2m1(blocks * inv[:, :, None]).reshape(m, k)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    packed = packed.reshape(tuple(x.shape[:-1]) + (k // 2,))
    k_blocks = k // 16
    if layout == "linear":
        return packed, sf
    rows, cols = (m + 127) // 128 * 128, (k_blocks + 3) // 4 * 4
    swizzled = np.zeros(rows * cols, dtype=np.uint8)
    for r in range(m):
        for kb in range(k_blocks):
            swizzled[swizzled_offset(r, kb, k_blocks)] = sf[r, kb]
    return packed, swizzled.reshape(rows, cols)
