"""Straightforward numpy references for the MLA prefill preparation ops (include/fp8mla/mla_prep.hpp),
written from the spec and DeepSeek-V3's RoPE code, independent of the library.

RoPE itself is computed in float64 and returned with an error bound for the library's fp32 fma
formula, so a test accepts exactly the e4m3 values that one rounding of a value within that bound
gives (see assert_e4m3_near). The latent-cache ops are a plain multiply and cast: exact bytes."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from fp8mla_reference import cast_fp8

F32 = np.float32
NOPE, ROPE, QK, V, KV_LORA, LATENT = 128, 64, 192, 128, 512, 576
# A YaRN dict's missing keys: DeepSeek-V3's values, but mscale and mscale_all_dim absent (0), as
# transformers reads a config.
YARN_DEFAULTS = dict(factor=40.0, original_max_position=4096, beta_fast=32.0, beta_slow=1.0,
                     mscale=0.0, mscale_all_dim=0.0)


def f32(x) -> np.ndarray:
    return np.asarray(x).astype(np.float32)


def decode_e4m3(b) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)


# ---- cos/sin table (DeepSeek-V3's DeepseekV3YarnRotaryEmbedding, in float64) ---------------------


def yarn_get_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def inv_freq_and_magnitude(rope_dim: int, theta: float, yarn: dict | None):
    exponents = np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim
    freq_extra = 1.0 / theta**exponents
    if yarn is None:
        return freq_extra, 1.0
    y = dict(YARN_DEFAULTS, **yarn)
    freq_inter = 1.0 / (y["factor"] * theta**exponents)

    def correction_dim(num_rotations):
        return (rope_dim * math.log(y["original_max_position"] / (num_rotations * 2 * math.pi))
                / (2 * math.log(theta)))

    low = max(math.floor(correction_dim(y["beta_fast"])), 0)
    high = min(math.ceil(correction_dim(y["beta_slow"])), rope_dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(rope_dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    mask = 1.0 - ramp
    inv_freq = freq_inter * (1 - mask) + freq_extra * mask
    # transformers' attention_factor: the mscale ratio only where both are given and non-zero.
    if y["mscale"] and y["mscale_all_dim"]:
        magnitude = (yarn_get_mscale(y["factor"], y["mscale"])
                     / yarn_get_mscale(y["factor"], y["mscale_all_dim"]))
    else:
        magnitude = yarn_get_mscale(y["factor"], 1.0)
    return inv_freq, magnitude


def cos_sin_cache(max_pos: int, rope_dim: int = ROPE, theta: float = 10000.0, yarn=None):
    """float64 [max_pos, rope_dim] = [cos | sin] (the library rounds this once to f32)."""
    inv_freq, magnitude = inv_freq_and_magnitude(rope_dim, theta, yarn)
    angles = np.arange(max_pos, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1) * magnitude


# ---- RoPE ------------------------------------------------------------------------------------------


def pair_index(style: str):
    half = ROPE // 2
    i = np.arange(half)
    if style == "interleaved":
        return 2 * i, 2 * i + 1
    return i, i + half


def rope(x, positions, cos_sin, style: str):
    """(y, bound): float64 RoPE of x [..., T, (H,) 64] with the f32 table's values, and a bound on
    |fp32 fma result - y| (a few fp32 roundings of the terms' magnitudes)."""
    x = f32(x).astype(np.float64)
    table = np.asarray(cos_sin, dtype=np.float64)[np.asarray(positions)]  # [T, 64]
    half = ROPE // 2
    c, s = table[:, :half], table[:, half:]
    if x.ndim == 3:
        c, s = c[:, None, :], s[:, None, :]
    a, b = pair_index(style)
    y = np.empty_like(x)
    bound = np.empty_like(x)
    x0, x1 = x[..., a], x[..., b]
    y[..., a] = x0 * c - x1 * s
    y[..., b] = x1 * c + x0 * s
    magnitude = np.abs(x0 * c) + np.abs(x1 * s)
    bound[..., a] = magnitude * 2.0**-22
    bound[..., b] = magnitude * 2.0**-22
    return y, bound


def assert_e4m3_near(got, value, bound, scale_inv: float):
    """Every e4m3 code in `got` is what rounding some v in [value - bound, value + bound], times
    scale_inv, to e4m3 (nearest-even, saturating) gives."""
    scale_inv = np.float64(F32(scale_inv))
    lo = cast_fp8(((value - bound) * scale_inv).astype(np.float32))
    hi = cast_fp8(((value + bound) * scale_inv).astype(np.float32))
    g = decode_e4m3(got)
    lo_v, hi_v = decode_e4m3(lo), decode_e4m3(hi)
    assert g.shape == lo_v.shape
    ok = (g >= lo_v) & (g <= hi_v)
    if not ok.all():
        where = np.argwhere(~ok)[:5]
        details = [(tuple(i), g[tuple(i)], lo_v[tuple(i)], hi_v[tuple(i)]) for i in where]
        raise AssertionError(f"{(~ok).sum()} e4m3 values outside the bound, e.g. {details}")


# ---- latent cache ------------------------------------------------------------------------------


def quantize(x, scale_inv: float) -> np.ndarray:
    """e4m3 bytes of f32(x) * f32(scale_inv)."""
    return cast_fp8(f32(x) * F32(scale_inv))


def latent_rows(kv_c, k_pe, scale_inv: float) -> np.ndarray:
    """uint8 [T, 576]: the cache rows mla_kv_cache_write writes."""
    k_pe = np.asarray(k_pe).reshape(len(k_pe), ROPE)
    return np.concatenate([quantize(kv_c, scale_inv), quantize(k_pe, scale_inv)], axis=1)


def slot_row(cache_bytes: np.ndarray, slot: int) -> np.ndarray:
    page_size = cache_bytes.shape[1]
    return cache_bytes[slot // page_size, slot % page_size]


def dequantize_bf16(code_bytes, scale: float) -> np.ndarray:
    """bf16 bits (uint16) of bf16(decode_e4m3(q) * scale), the product in f32."""
    v = np.asarray(code_bytes).view(ml_dtypes.float8_e4m3fn).astype(np.float32) * F32(scale)
    return v.astype(ml_dtypes.bfloat16).view(np.uint16)


def pack(k_nope, k_pe, v, k_scale_inv: float, v_scale_inv: float):
    """(k_out [n, H, 192], v_out [n, H, 128]) bytes of mla_kv_pack_quantize_fp8."""
    n, heads = k_nope.shape[:2]
    k_pe = quantize(np.asarray(k_pe).reshape(n, ROPE), k_scale_inv)
    k = np.concatenate([quantize(k_nope, k_scale_inv),
                        np.broadcast_to(k_pe[:, None, :], (n, heads, ROPE))], axis=2)
    return k, quantize(v, v_scale_inv)
