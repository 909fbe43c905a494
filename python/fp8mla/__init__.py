"""fp8mla — FP8 MLA prefill for NVIDIA Hopper, with a CPU implementation of every op.

Quantization ops (DESIGN sections 2 and 3). Tensors cross through DLPack: torch tensors (CPU or
CUDA; each op is also a torch.library custom op, see fp8mla.torch_ops), numpy arrays (CPU; bf16
and fp8 through ml_dtypes), or any other DLPack array when every output is given. Outputs are
allocated on the input's device when not given. Bad arguments raise fp8mla.Error (its subclass
InvalidArgumentError is also a ValueError) with the C++ library's message.

    quantize_fp8(x, scale_inv, *, out=None, dtype="e4m3") -> out
    quantize_fp8_dynamic(x, *, out=None, scale=None, dtype="e4m3") -> (out, scale)
    quantize_fp8_per_token_group(x, *, group_size=128, eps=1e-10, scale_layout="row_major",
                                 round_scale_to_pow2=False, out=None, scales=None) -> (out, scales)
    quantize_nvfp4(x, global_scale, *, layout="swizzled", out=None, block_scales=None)
        -> (out, block_scales)
    info() -> dict

MLA prefill preparation (DESIGN section 3, ops 4-7; the C++ header fp8mla/mla_prep.hpp defines
the arithmetic). The latent cache is e4m3 [num_pages, page_size, 576] = [kv_c 512 | k_pe 64]:

    make_cos_sin_cache(max_pos, *, rope_dim=64, theta=10000.0, yarn=None, device=None, out=None)
        -> f32 [max_pos, rope_dim]
    softmax_mscale(*, yarn=None) -> float
    mla_rope_quantize_fp8(q_nope, q_pe, k_nope, k_pe, positions, cos_sin, *, style="interleaved",
                          q_scale_inv=1.0, k_scale_inv=1.0, q_out=None, k_out=None, kv_c=None,
                          cache=None, slot_mapping=None, cache_scale_inv=1.0, error_flag=None)
        -> (q_out, k_out)
    mla_kv_cache_write(kv_c, k_pe, cache, slot_mapping, *, scale_inv=1.0, error_flag=None) -> None
    mla_kv_gather(cache, slots, scale, *, kv_c_out=None, k_pe_out=None, error_flag=None)
        -> (kv_c_out, k_pe_out)
    mla_kv_pack_quantize_fp8(k_nope, k_pe, v, *, k_scale_inv=1.0, v_scale_inv=1.0, k_out=None,
                             v_out=None, v_layout="token_major") -> (k_out, v_out)
    mla_v_quantize_fp8(v, *, v_scale_inv=1.0, v_out=None, v_layout="token_major") -> v_out

Every op also takes `stream=` (an int cudaStream_t handle); by default CUDA torch tensors use
torch.cuda.current_stream().
"""

from __future__ import annotations

import sys

from . import _C
from ._C import Error, InvalidArgumentError, UnsupportedError
from ._common import invalid_argument as _invalid_argument
from ._common import yarn_tuple as _yarn_tuple

__version__ = _C.__version__

__all__ = [
    "Error",
    "InvalidArgumentError",
    "UnsupportedError",
    "info",
    "make_cos_sin_cache",
    "mla_kv_cache_write",
    "mla_kv_gather",
    "mla_kv_pack_quantize_fp8",
    "mla_rope_quantize_fp8",
    "mla_v_quantize_fp8",
    "quantize_fp8",
    "quantize_fp8_dynamic",
    "quantize_fp8_per_token_group",
    "quantize_nvfp4",
    "softmax_mscale",
    "prefill_attention",
    "merge_attention_states",
]

_torch_ops = None


def _load_torch_ops():
    global _torch_ops
    if _torch_ops is None:
        from . import torch_ops

        _torch_ops = torch_ops
    return _torch_ops


# Engines import torch first: register the custom ops now, so that torch.compile traces straight
# into them. Otherwise they are registered when the first torch tensor arrives.
if "torch" in sys.modules:
    _load_torch_ops()


def _frontend(x):
    root = type(x).__module__.partition(".")[0]
    if root == "torch":
        return _torch_ops if _torch_ops is not None else _load_torch_ops()
    if root == "numpy":
        from . import _numpy

        return _numpy
    return _Generic


class _Generic:
    """Other DLPack arrays (cupy, jax, ...): passed through as they are; outputs must be given."""

    @staticmethod
    def _need(op, **outputs):
        missing = [name for name, value in outputs.items() if value is None]
        if missing:
            raise TypeError(
                f"fp8mla.{op}: allocating outputs is supported for torch and numpy arrays; "
                f"pass {', '.join(missing)} explicitly"
            )

    @staticmethod
    def quantize_fp8(x, scale_inv, *, out=None, dtype="e4m3", stream=None):
        _Generic._need("quantize_fp8", out=out)
        scale = float(scale_inv) if isinstance(scale_inv, (int, float)) else scale_inv
        _C.quantize_fp8(x, out, scale, stream or 0)
        return out

    @staticmethod
    def quantize_fp8_dynamic(x, *, out=None, scale=None, dtype="e4m3", stream=None):
        _Generic._need("quantize_fp8_dynamic", out=out, scale=scale)
        _C.quantize_fp8_dynamic(x, out, scale, stream or 0)
        return out, scale

    @staticmethod
    def quantize_fp8_per_token_group(x, *, group_size=128, eps=1e-10, scale_layout="row_major",
                                     round_scale_to_pow2=False, out=None, scales=None,
                                     stream=None):
        _Generic._need("quantize_fp8_per_token_group", out=out, scales=scales)
        _C.quantize_fp8_per_token_group(x, out, scales, group_size, eps, round_scale_to_pow2,
                                        stream or 0)
        return out, scales

    @staticmethod
    def quantize_nvfp4(x, global_scale, *, layout="swizzled", out=None, block_scales=None,
                       stream=None):
        _Generic._need("quantize_nvfp4", out=out, block_scales=block_scales)
        _C.quantize_nvfp4(x, out, block_scales, global_scale, layout, stream or 0)
        return out, block_scales

    @staticmethod
    def make_cos_sin_cache(max_pos, *, rope_dim=64, theta=10000.0, yarn=None, out=None,
                           stream=None):
        _C.make_cos_sin_cache(out, int(rope_dim), float(theta),
                              _yarn_tuple("make_cos_sin_cache", yarn), stream or 0)
        return out

    @staticmethod
    def mla_rope_quantize_fp8(q_nope, q_pe, k_nope, k_pe, positions, cos_sin, *,
                              style="interleaved", q_scale_inv=1.0, k_scale_inv=1.0, q_out=None,
                              k_out=None, kv_c=None, cache=None, slot_mapping=None,
                              cache_scale_inv=1.0, error_flag=None, stream=None):
        _Generic._need("mla_rope_quantize_fp8", q_out=q_out, k_out=k_out)
        _C.mla_rope_quantize_fp8(q_nope, q_pe, k_nope, k_pe, positions, cos_sin, style,
                                 float(q_scale_inv), float(k_scale_inv), q_out, k_out, kv_c,
                                 cache, slot_mapping, float(cache_scale_inv), error_flag,
                                 stream or 0)
        return q_out, k_out

    @staticmethod
    def mla_kv_cache_write(kv_c, k_pe, cache, slot_mapping, *, scale_inv=1.0, error_flag=None,
                           stream=None):
        _C.mla_kv_cache_write(kv_c, k_pe, cache, slot_mapping, float(scale_inv), error_flag,
                              stream or 0)

    @staticmethod
    def mla_kv_gather(cache, slots, scale, *, kv_c_out=None, k_pe_out=None, error_flag=None,
                      stream=None):
        _Generic._need("mla_kv_gather", kv_c_out=kv_c_out, k_pe_out=k_pe_out)
        _C.mla_kv_gather(cache, slots, float(scale), kv_c_out, k_pe_out, error_flag, stream or 0)
        return kv_c_out, k_pe_out

    @staticmethod
    def mla_kv_pack_quantize_fp8(k_nope, k_pe, v, *, k_scale_inv=1.0, v_scale_inv=1.0,
                                 k_out=None, v_out=None, v_layout="token_major", stream=None):
        _Generic._need("mla_kv_pack_quantize_fp8", k_out=k_out, v_out=v_out)
        _C.mla_kv_pack_quantize_fp8(k_nope, k_pe, v, float(k_scale_inv), float(v_scale_inv),
                                    k_out, v_out, v_layout, stream or 0)
        return k_out, v_out

    @staticmethod
    def mla_v_quantize_fp8(v, *, v_scale_inv=1.0, v_out=None, v_layout="token_major",
                           stream=None):
        _Generic._need("mla_v_quantize_fp8", v_out=v_out)
        _C.mla_v_quantize_fp8(v, float(v_scale_inv), v_out, v_layout, stream or 0)
        return v_out

    @staticmethod
    def prefill_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                          softmax_scale, causal=True, q_descale=None, k_descale=None,
                          v_descale=None, out=None, lse=None, return_lse=False, stream=None):
        _Generic._need("prefill_attention", out=out)
        if return_lse:
            _Generic._need("prefill_attention", lse=lse)
        _C.prefill_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                             int(max_seqlen_k), float(softmax_scale), bool(causal), q_descale,
                             k_descale, v_descale, out, lse, stream or 0)
        return (out, lse) if lse is not None else out

    @staticmethod
    def merge_attention_states(o_a, lse_a, o_b, lse_b, *, out=None, out_lse=None, stream=None):
        _Generic._need("merge_attention_states", out=out, out_lse=out_lse)
        _C.merge_attention_states(o_a, lse_a, o_b, lse_b, out, out_lse, stream or 0)
        return out, out_lse


def quantize_fp8(x, scale_inv, *, out=None, dtype="e4m3", stream=None):
    """Per-tensor FP8: out = fp8(x * scale_inv), nearest-even, saturating.

    `scale_inv` is a float or a one-element f32 tensor on x's device (read by the kernel, so a
    captured CUDA graph sees its current value). `dtype` "e4m3" or "e5m2"."""
    return _frontend(x).quantize_fp8(x, scale_inv, out=out, dtype=dtype, stream=stream)


def quantize_fp8_dynamic(x, *, out=None, scale=None, dtype="e4m3", stream=None):
    """Dynamic per-tensor FP8: scale = max(amax / fp8_max, min) into `scale` (one f32), then
    out = fp8(x * (1 / scale)). Returns (out, scale)."""
    return _frontend(x).quantize_fp8_dynamic(x, out=out, scale=scale, dtype=dtype, stream=stream)


def quantize_fp8_per_token_group(x, *, group_size=128, eps=1e-10, scale_layout="row_major",
                                 round_scale_to_pow2=False, out=None, scales=None, stream=None):
    """Per-token-group FP8 e4m3 (groups of 64 or 128 along the last dim). Returns (out, scales).

    Allocated scales follow `scale_layout`: "row_major" f32 [M, G]; "column_major" f32 strides
    (1, M); "tma_aligned" f32 strides (1, round_up(M, 4)); "ue8m0" one exponent byte per group
    [M, G]; "packed_ue8m0" int32 [M, ceil(G/4)] strides (1, round_up(M, 4)). Given `scales`, its
    dtype and strides decide the layout."""
    return _frontend(x).quantize_fp8_per_token_group(
        x, group_size=group_size, eps=eps, scale_layout=scale_layout,
        round_scale_to_pow2=round_scale_to_pow2, out=out, scales=scales, stream=stream)


def quantize_nvfp4(x, global_scale, *, layout="swizzled", out=None, block_scales=None,
                   stream=None):
    """NVFP4: blocks of 16 along K, e4m3 block scales (128x4 swizzled or linear), two e2m1 values
    per byte. Returns (out [.., K/2], block_scales)."""
    return _frontend(x).quantize_nvfp4(x, global_scale, layout=layout, out=out,
                                       block_scales=block_scales, stream=stream)


# ---- MLA prefill preparation ---------------------------------------------------------------------


def make_cos_sin_cache(max_pos, *, rope_dim=64, theta=10000.0, yarn=None, device=None, out=None,
                       stream=None):
    """The RoPE table of mla_rope_quantize_fp8: f32 [max_pos, rope_dim] = [cos(rope_dim/2) |
    sin(rope_dim/2)] of positions 0..max_pos-1, computed in double and rounded once.

    `yarn`: None (plain RoPE with base `theta`) or DeepSeek-V3's YaRN rope_scaling as a dict with
    keys factor, original_max_position, beta_fast, beta_slow, mscale, mscale_all_dim (missing
    keys take DeepSeek-V3's values: 40, 4096, 32, 1, 1, 1); a model config's rope_scaling dict
    (original_max_position_embeddings, type "yarn") is accepted as it is.

    Allocated (when `out` is not given) as a numpy array for `device=None`, as a torch tensor on
    `device` otherwise ("cpu", "cuda", a torch.device; numpy for "cpu" without torch). A CUDA
    table is filled by a blocking copy after synchronizing the stream (set-up work: not
    for CUDA graph capture). Given `out` (f32 [max_pos, rope_dim], contiguous rows) decides."""
    op = "make_cos_sin_cache"
    if out is not None:
        shape = tuple(out.shape)
        if len(shape) >= 1 and shape[0] != max_pos:
            raise _invalid_argument(
                f"{op}: `out`: expected {max_pos} rows (max_pos), got shape {list(shape)}")
        frontend = _frontend(out)
    elif device is None:
        from . import _numpy as frontend
    else:
        try:
            import torch  # noqa: F401
        except ImportError:
            if str(device) != "cpu":
                raise _invalid_argument(f"{op}: device {device!r} needs torch") from None
            from . import _numpy as frontend
        else:
            frontend = _torch_ops if _torch_ops is not None else _load_torch_ops()
            return frontend.make_cos_sin_cache(max_pos, rope_dim=rope_dim, theta=theta,
                                               yarn=yarn, device=device, stream=stream)
    return frontend.make_cos_sin_cache(max_pos, rope_dim=rope_dim, theta=theta, yarn=yarn,
                                       out=out, stream=stream)


def softmax_mscale(*, yarn=None) -> float:
    """The factor YaRN applies to the softmax scale: scale = qk_dim**-0.5 * mscale**2 with
    mscale = 0.1 * mscale_all_dim * ln(factor) + 1 (1.0 without YaRN or with factor <= 1).
    `yarn` as for make_cos_sin_cache."""
    return _C.softmax_mscale(_yarn_tuple("softmax_mscale", yarn))


def mla_rope_quantize_fp8(q_nope, q_pe, k_nope, k_pe, positions, cos_sin, *, style="interleaved",
                          q_scale_inv=1.0, k_scale_inv=1.0, q_out=None, k_out=None, kv_c=None,
                          cache=None, slot_mapping=None, cache_scale_inv=1.0, error_flag=None,
                          stream=None):
    """Fused RoPE + FP8 e4m3 of Q and K for MLA prefill; optionally writes the latent cache too.

    q_nope, k_nope [T, H, 128], q_pe [T, H, 64] and k_pe [T, 64] or [T, 1, 64] (shared by all
    heads), all bf16 or all f16, any token/head strides with a contiguous last dim (slices of a
    projection's output work as they are); positions i32/i64 [T]; cos_sin from
    make_cos_sin_cache (rope_dim 64). `style` "interleaved" (pairs 2i, 2i+1: DeepSeek) or "neox"
    (pairs i, i+32). Writes
        q_out[t, h] = [e4m3(q_nope * q_scale_inv) | e4m3(rope(q_pe, pos) * q_scale_inv)]
        k_out[t, h] = [e4m3(k_nope * k_scale_inv) | e4m3(rope(k_pe, pos) * k_scale_inv)]
    (e4m3 [T, H, 192], allocated when not given) and returns (q_out, k_out).

    With `cache` (e4m3 [num_pages, page_size, 576]) it also writes, for slot_mapping[t] (i32/i64
    [T]; -1 skips the token), the row [e4m3(kv_c[t] * cache_scale_inv) |
    e4m3(rope(k_pe[t]) * cache_scale_inv)], kv_c bf16/f16 [T, 512]. A position outside cos_sin
    or a slot outside the cache raises on the CPU (nothing written); on CUDA that token's q/k rows
    are zeros, its cache row is skipped and `error_flag` (one i32 on the device, set to 1, never
    cleared) is set when given. kv_c, slot_mapping and error_flag need `cache`."""
    return _frontend(q_nope).mla_rope_quantize_fp8(
        q_nope, q_pe, k_nope, k_pe, positions, cos_sin, style=style, q_scale_inv=q_scale_inv,
        k_scale_inv=k_scale_inv, q_out=q_out, k_out=k_out, kv_c=kv_c, cache=cache,
        slot_mapping=slot_mapping, cache_scale_inv=cache_scale_inv, error_flag=error_flag,
        stream=stream)


def mla_kv_cache_write(kv_c, k_pe, cache, slot_mapping, *, scale_inv=1.0, error_flag=None,
                       stream=None):
    """Writes the latent rows [e4m3(kv_c[t] * scale_inv) | e4m3(k_pe[t] * scale_inv)] into the
    paged cache in place: slot s is row s % page_size of page s // page_size.

    kv_c bf16/f16 [T, 512], k_pe (already RoPE'd) [T, 64] or [T, 1, 64] of the same dtype;
    cache e4m3 [num_pages, page_size 1..128, 576] (contiguous rows, any page/row strides);
    slot_mapping i32/i64 [T], -1 skips a token. Other slots stay bit-identical. A slot outside the
    cache raises on the CPU (nothing written); on CUDA it is skipped and sets `error_flag` (one
    i32 on the device, set to 1, never cleared) when given. Returns None."""
    return _frontend(kv_c).mla_kv_cache_write(kv_c, k_pe, cache, slot_mapping,
                                              scale_inv=scale_inv, error_flag=error_flag,
                                              stream=stream)


def mla_kv_gather(cache, slots, scale, *, kv_c_out=None, k_pe_out=None, error_flag=None,
                  stream=None):
    """Reads the latent rows of `slots` (i32/i64 [n], every one in range) back to bf16:
    kv_c_out [n, 512] and k_pe_out [n, 64] = bf16(decode_e4m3(row) * scale), allocated on the
    cache's device when not given. Returns (kv_c_out, k_pe_out). A bad slot raises on the CPU;
    on CUDA its rows are zeros and `error_flag` is set when given."""
    return _frontend(cache).mla_kv_gather(cache, slots, scale, kv_c_out=kv_c_out,
                                          k_pe_out=k_pe_out, error_flag=error_flag,
                                          stream=stream)


def mla_kv_pack_quantize_fp8(k_nope, k_pe, v, *, k_scale_inv=1.0, v_scale_inv=1.0, k_out=None,
                             v_out=None, v_layout="token_major", stream=None):
    """Packs a prefix chunk's K and V for FP8 attention: k_out [n, H, 192] =
    [e4m3(k_nope * k_scale_inv) | e4m3(k_pe * k_scale_inv)] (k_pe [n, 64] or [n, 1, 64] broadcast
    to every head) and v_out [n, H, 128] = e4m3(v * v_scale_inv). k_nope [n, H, 128] and v
    [n, H, 128] bf16/f16 may be strided (slices of kv_b_proj's output). v_layout "transposed"
    writes v_out as a [n, H, 128] view of [H, 128, pitch] memory (tokens contiguous, pitch a
    multiple of 16 when allocated here), what FP8 prefill_attention reads on Hopper. Returns
    (k_out, v_out)."""
    return _frontend(k_nope).mla_kv_pack_quantize_fp8(
        k_nope, k_pe, v, k_scale_inv=k_scale_inv, v_scale_inv=v_scale_inv, k_out=k_out,
        v_out=v_out, v_layout=v_layout, stream=stream)


def mla_v_quantize_fp8(v, *, v_scale_inv=1.0, v_out=None, v_layout="token_major", stream=None):
    """V alone, for a backend whose K comes from mla_rope_quantize_fp8: v_out [n, H, 128] =
    e4m3(v * v_scale_inv), the V half of mla_kv_pack_quantize_fp8 (same bytes, same checks). v
    [n, H, 128] bf16/f16 may be strided (contiguous last dim). v_layout as for
    mla_kv_pack_quantize_fp8 ("transposed": a [n, H, 128] view of [H, 128, pitch] memory,
    pitch a multiple of 16 when allocated here). Returns v_out."""
    return _frontend(v).mla_v_quantize_fp8(v, v_scale_inv=v_scale_inv, v_out=v_out,
                                           v_layout=v_layout, stream=stream)


def prefill_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                      softmax_scale, causal=True, q_descale=None, k_descale=None, v_descale=None,
                      out=None, lse=None, return_lse=False, stream=None):
    """Attention over a ragged batch (token-major; cu_seqlens_* int32 [batch + 1]; max_seqlen_*
    upper bounds). q, k [T, H, 192] and v [Tk, H, 128]: e4m3 with one-element f32 descales, or
    bf16. On CUDA, e4m3 v must be transposed (a [Tk, H, 128] view of [H, 128, >= Tk] memory, keys
    contiguous) and bf16 v token-major. Causal masking is bottom-right aligned. Returns out
    (bf16 [Tq, H, 128], allocated when not given), or (out, lse) when `lse` is given or
    `return_lse` (f32 [Tq, H], natural log; -inf for rows that see no key)."""
    return _frontend(q).prefill_attention(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        softmax_scale=softmax_scale, causal=causal, q_descale=q_descale, k_descale=k_descale,
        v_descale=v_descale, out=out, lse=lse, return_lse=return_lse, stream=stream)


def merge_attention_states(o_a, lse_a, o_b, lse_b, *, out=None, out_lse=None, stream=None):
    """(o_a, lse_a) merged with (o_b, lse_b) (natural-log LSE): returns (out, out_lse), allocated
    when not given; `out`/`out_lse` may be o_a/lse_a for an in-place merge."""
    return _frontend(o_a).merge_attention_states(o_a, lse_a, o_b, lse_b, out=out,
                                                 out_lse=out_lse, stream=stream)


def info() -> dict:
    """Build and device information: version, cuda (bool), cuda_arch, devices, ..."""
    return _C.info()
