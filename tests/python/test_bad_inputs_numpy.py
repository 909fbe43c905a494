"""The catalogue of bad inputs through the Python package on numpy arrays: every op, the
attention backends and the layer. Each entry makes one bad call on arrays that live inside larger
buffers with guard bands, expects the exception type and the words naming what was expected and
what was given, and checks that no byte of any buffer (outputs included, the call was rejected)
or of the guard bands around them changed. Skipped without ml_dtypes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
import fp8mla  # noqa: E402

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
INVALID = fp8mla.InvalidArgumentError
UNSUPPORTED = fp8mla.UnsupportedError
NAN, INF = float("nan"), float("inf")
GUARD = 64  # guard bytes on each side of an array


def guard_pattern(n: int) -> np.ndarray:
    """Guard bytes that vary with their position, so a shifted copy of them is caught too."""
    return ((np.arange(n, dtype=np.uint32) * 0x3D) ^ 0xA5).astype(np.uint8)


class Buffers:
    """The arrays of one call, each a view into its own guarded buffer: inputs hold known finite
    values, outputs the poison byte 0xFF (NaN in e4m3, bf16 and f32)."""

    def __init__(self):
        self._bases = []

    def _place(self, shape, dtype, offset: int):
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        base = guard_pattern(2 * GUARD + nbytes + offset)
        payload = base[GUARD + offset:GUARD + offset + nbytes]
        return base, payload

    def _keep(self, base):
        self._bases.append((base, base.copy()))

    def check_guards(self):
        """The guard bands around every buffer are intact (a valid call writes only payloads)."""
        for i, (base, before) in enumerate(self._bases):
            for band in (slice(0, GUARD), slice(len(base) - GUARD, len(base))):
                assert np.array_equal(base[band], before[band]), f"guard band of buffer {i} written"

    def input(self, shape, dtype=BF16, *, offset: int = 0, seed: int = 0) -> np.ndarray:
        base, payload = self._place(shape, dtype, offset)
        rng = np.random.default_rng(seed)
        if np.dtype(dtype).kind in "iu":
            values = rng.integers(0, 4, size=shape).astype(dtype)
        else:
            values = rng.uniform(-1, 1, size=shape).astype(np.float32).astype(dtype)
        payload[:] = values.reshape(-1).view(np.uint8)
        self._keep(base)
        return payload.view(dtype).reshape(shape)

    def output(self, shape, dtype=BF16, *, offset: int = 0) -> np.ndarray:
        base, payload = self._place(shape, dtype, offset)
        payload[:] = 0xFF
        self._keep(base)
        return payload.view(dtype).reshape(shape)

    def ints(self, values, dtype=np.int32) -> np.ndarray:
        values = np.asarray(values, dtype=dtype)
        base, payload = self._place(values.shape, dtype, 0)
        payload[:] = values.reshape(-1).view(np.uint8)
        self._keep(base)
        return payload.view(dtype).reshape(values.shape)

    def scalar(self, value: float) -> np.ndarray:
        return self.ints([value], np.float32)

    def check_unchanged(self):
        """Every byte of every buffer, guard bands included, is what it was when made."""
        for i, (base, before) in enumerate(self._bases):
            changed = np.flatnonzero(base != before)
            assert changed.size == 0, (f"buffer {i} of {len(self._bases)}: {changed.size} bytes "
                                       f"changed, first at {changed[:8] - GUARD} (payload offsets)")


@dataclass
class Bad:
    name: str
    call: Callable[[Buffers], object]
    error: type
    needles: tuple


# ---- quantization --------------------------------------------------------------------------------


def quantize_entries():
    def fp8(b, scale_inv=1.0, out=None, **kwargs):
        out = b.output((4, 64), E4M3) if out is None else out
        return fp8mla.quantize_fp8(b.input((4, 64)), scale_inv, out=out, **kwargs)

    def group(b, x_shape=(4, 256), scales=None, **kwargs):
        return fp8mla.quantize_fp8_per_token_group(b.input(x_shape), out=b.output(x_shape, E4M3),
                                                   scales=scales, **kwargs)

    def nvfp4(b, x=None, out=None, block=None, global_scale=None, **kwargs):
        x = b.input((4, 64)) if x is None else x
        return fp8mla.quantize_nvfp4(
            x, b.scalar(1.0) if global_scale is None else global_scale,
            out=b.output((4, 32), np.uint8) if out is None else out,
            block_scales=b.output((128, 4), E4M3) if block is None else block, **kwargs)

    def over_input(b):
        x = b.input((4, 64))
        return fp8mla.quantize_fp8(x, 1.0, out=x.view(np.uint8)[:, :64].view(E4M3))

    return [
        Bad("quantize_fp8 a list for x, out to allocate", lambda b: fp8mla.quantize_fp8(
            [[1.0, 2.0]], 1.0), TypeError,
            ("fp8mla.quantize_fp8: expected a numpy array, a torch tensor or an array with "
             "__dlpack__", "got list")),
        Bad("merge_attention_states None for o_a, outputs to allocate",
            lambda b: fp8mla.merge_attention_states(None, None, None, None), TypeError,
            ("fp8mla.merge_attention_states: expected a numpy array", "got NoneType")),
        Bad("quantize_fp8 a list for x, out given", lambda b: fp8mla.quantize_fp8(
            [[1.0, 2.0]], 1.0, out=b.output((1, 2), E4M3)), INVALID,
            ("quantize_fp8: `input`: expected an array that supports DLPack or the buffer "
             "protocol", "got list")),
        Bad("quantize_fp8 int32 x", lambda b: fp8mla.quantize_fp8(
            b.input((4, 64), np.int32), 1.0, out=b.output((4, 64), E4M3)), INVALID,
            ("`input` dtype: expected one of {bf16, f16, f32}", "got i32")),
        Bad("quantize_fp8 out of another shape", lambda b: fp8(b, out=b.output((4, 32), E4M3)),
            INVALID, ("expected the shape of `input`", "e4m3fn[4, 32]")),
        Bad("quantize_fp8 NaN scale_inv", lambda b: fp8(b, NAN), INVALID,
            ("`scale_inv`: expected a finite scale > 0", "got nan")),
        Bad("quantize_fp8 infinite scale_inv", lambda b: fp8(b, INF), INVALID,
            ("`scale_inv`: expected a finite scale > 0", "got inf")),
        Bad("quantize_fp8 zero scale_inv", lambda b: fp8(b, 0.0), INVALID,
            ("`scale_inv`: expected a finite scale > 0", "got 0")),
        Bad("quantize_fp8 negative scale_inv", lambda b: fp8(b, -3.0), INVALID,
            ("`scale_inv`: expected a finite scale > 0", "got -3")),
        Bad("quantize_fp8 NaN scale_inv array", lambda b: fp8(b, b.scalar(NAN)), INVALID,
            ("`scale_inv`: expected a finite scale > 0", "got nan")),
        Bad("quantize_fp8 scale_inv of two elements",
            lambda b: fp8(b, b.input((2,), np.float32)), INVALID,
            ("`scale_inv`: expected one f32 of shape [] or [1]", "f32[2]")),
        Bad("quantize_fp8 out over x", over_input, INVALID,
            ("`out`: expected memory apart from `input`", "bf16[4, 64]")),
        Bad("quantize_fp8 strided last dim of out",
            lambda b: fp8(b, out=b.output((4, 128), E4M3)[:, ::2]), INVALID,
            ("`out`", "contiguous (stride 1)")),
        Bad("quantize_fp8 misaligned x", lambda b: fp8mla.quantize_fp8(
            b.input((4, 64), offset=1), 1.0, out=b.output((4, 64), E4M3)), INVALID,
            ("`input`: expected a 2-byte aligned data pointer", "got address")),
        Bad("quantize_fp8 dtype e3m4", lambda b: fp8(b, dtype="e3m4"), INVALID,
            ("expected dtype one of ('e4m3', 'e5m2')", "got 'e3m4'")),
        Bad("quantize_fp8_dynamic scale of shape [1, 1]", lambda b: fp8mla.quantize_fp8_dynamic(
            b.input((4, 64)), out=b.output((4, 64), E4M3), scale=b.output((1, 1), np.float32)),
            INVALID, ("`scale`: expected one f32", "f32[1, 1]")),
        Bad("quantize_fp8_per_token_group group size 96",
            lambda b: group(b, (4, 192), b.output((4, 2), np.float32), group_size=96),
            UNSUPPORTED, ("expected group_size 64 or 128", "got 96")),
        Bad("quantize_fp8_per_token_group NaN eps",
            lambda b: group(b, scales=b.output((4, 2), np.float32), eps=NAN), INVALID,
            ("expected a finite eps > 0", "got nan")),
        Bad("quantize_fp8_per_token_group infinite eps",
            lambda b: group(b, scales=b.output((4, 2), np.float32), eps=float("inf")), INVALID,
            ("expected a finite eps > 0", "got inf")),
        Bad("quantize_fp8_per_token_group bf16 scales",
            lambda b: group(b, scales=b.output((4, 2), BF16)), INVALID,
            ("`scales` dtype", "bf16")),
        Bad("quantize_fp8_per_token_group scales of too few groups",
            lambda b: group(b, scales=b.output((4, 1), np.float32)), INVALID,
            ("`scales`: expected [4, 2]", "f32[4, 1]")),
        Bad("quantize_fp8_per_token_group row of 200 in groups of 64",
            lambda b: group(b, (4, 200), b.output((4, 3), np.float32), group_size=64), INVALID,
            ("expected the last dim to be a multiple of group_size 64", "bf16[4, 200]")),
        Bad("quantize_fp8_per_token_group scale layout diagonal",
            lambda b: group(b, scale_layout="diagonal"), INVALID,
            ("expected scale_layout one of ('row_major'", "got 'diagonal'")),
        Bad("quantize_nvfp4 f32 x", lambda b: nvfp4(b, x=b.input((4, 64), np.float32)), INVALID,
            ("`input` dtype", "expected one of {bf16, f16}", "got f32")),
        Bad("quantize_nvfp4 row of 40", lambda b: nvfp4(
            b, x=b.input((4, 40)), out=b.output((4, 20), np.uint8)), INVALID,
            ("expected the last dim to be a multiple of 16", "bf16[4, 40]")),
        Bad("quantize_nvfp4 out not halved", lambda b: nvfp4(b, out=b.output((4, 64), np.uint8)),
            INVALID, ("expected the shape of `input` with the last dim halved", "[4, 64]")),
        Bad("quantize_nvfp4 bf16 global scale",
            lambda b: nvfp4(b, global_scale=b.input((1,), BF16)), INVALID,
            ("`global_scale` dtype: expected f32", "got bf16")),
        Bad("quantize_nvfp4 zero global scale", lambda b: nvfp4(b, global_scale=b.scalar(0.0)),
            INVALID, ("`global_scale`: expected a finite scale > 0", "got 0")),
        Bad("quantize_nvfp4 layout zigzag", lambda b: nvfp4(b, layout="zigzag"), INVALID,
            ("expected layout 'swizzled' or 'linear'", "got 'zigzag'")),
    ]


# ---- MLA preparation -----------------------------------------------------------------------------

T, H, MAX_POS = 2, 2, 16


def rope_inputs(b, **replace):
    """mla_rope_quantize_fp8's arguments for 2 tokens and 2 heads, some replaced."""
    args = dict(q_nope=b.input((T, H, 128)), q_pe=b.input((T, H, 64)),
                k_nope=b.input((T, H, 128)), k_pe=b.input((T, 64)),
                positions=b.ints([0, 1]), cos_sin=b.input((MAX_POS, 64), np.float32),
                q_out=b.output((T, H, 192), E4M3), k_out=b.output((T, H, 192), E4M3))
    args.update(replace)
    return args


def rope(b, with_cache=False, **replace):
    args = rope_inputs(b)
    if with_cache:
        args.update(cache=b.input((2, 4, 576), E4M3), slot_mapping=b.ints([0, 5]),
                    kv_c=b.input((T, 512)))
    args.update({k: (v(b) if callable(v) else v) for k, v in replace.items()})
    positional = [args.pop(k) for k in ("q_nope", "q_pe", "k_nope", "k_pe", "positions",
                                        "cos_sin")]
    return fp8mla.mla_rope_quantize_fp8(*positional, **args)


def cache_write(b, kv_c=None, k_pe=None, cache=None, slots=None, **kwargs):
    return fp8mla.mla_kv_cache_write(
        b.input((T, 512)) if kv_c is None else kv_c, b.input((T, 64)) if k_pe is None else k_pe,
        b.input((2, 4, 576), E4M3) if cache is None else cache,
        b.ints([1, 2]) if slots is None else slots, **kwargs)


def gather(b, slots=None, scale=1.0, **kwargs):
    kwargs.setdefault("kv_c_out", b.output((T, 512)))
    kwargs.setdefault("k_pe_out", b.output((T, 64)))
    return fp8mla.mla_kv_gather(b.input((2, 4, 576), E4M3),
                                b.ints([1, 6]) if slots is None else slots, scale, **kwargs)


def pack(b, k_nope=None, **kwargs):
    kwargs.setdefault("k_out", b.output((T, H, 192), E4M3))
    kwargs.setdefault("v_out", b.output((T, H, 128), E4M3))
    return fp8mla.mla_kv_pack_quantize_fp8(
        b.input((T, H, 128)) if k_nope is None else k_nope, b.input((T, 64)),
        b.input((T, H, 128)), **kwargs)


def split_k(b, **kwargs):
    """K's outputs split (k_out [T, H, 128], k_rope_out [T, 64]), some replaced."""
    kwargs.setdefault("k_out", b.output((T, H, 128), E4M3))
    kwargs.setdefault("k_rope_out", b.output((T, 64), E4M3))
    return kwargs


def q_out_over_q_nope(b):
    q_nope = b.input((T, H, 128))
    return rope(b, q_nope=q_nope, q_out=q_nope.view(np.uint8)[..., :192].view(E4M3))


def prep_entries():
    return [
        Bad("mla_rope_quantize_fp8 q_nope of head dim 96",
            lambda b: rope(b, q_nope=lambda b: b.input((T, H, 96))), INVALID,
            ("`q_nope`: expected [T, H, 128]", "bf16[2, 2, 96]")),
        Bad("mla_rope_quantize_fp8 f16 q_pe", lambda b: rope(
            b, q_pe=lambda b: b.input((T, H, 64), np.float16)), INVALID,
            ("`q_pe` dtype", "expected bf16", "got f16")),
        Bad("mla_rope_quantize_fp8 float positions", lambda b: rope(
            b, positions=lambda b: b.input((T,), np.float32)), INVALID,
            ("`positions` dtype: expected one of {i32, i64}", "got f32")),
        Bad("mla_rope_quantize_fp8 position past cos_sin", lambda b: rope(
            b, positions=lambda b: b.ints([0, MAX_POS])), INVALID,
            ("`positions`[1] = 16", "outside the cos_sin cache [0, 16)")),
        Bad("mla_rope_quantize_fp8 negative position", lambda b: rope(
            b, positions=lambda b: b.ints([-5, 0], np.int64)), INVALID,
            ("`positions`[0] = -5", "[0, 16)")),
        Bad("mla_rope_quantize_fp8 NaN q_scale_inv", lambda b: rope(b, q_scale_inv=NAN), INVALID,
            ("`q_scale_inv`: expected a finite scale > 0", "got nan")),
        Bad("mla_rope_quantize_fp8 zero cache scale", lambda b: rope(
            b, with_cache=True, cache_scale_inv=0.0), INVALID,
            ("`cache_scale_inv`: expected a finite scale > 0", "got 0")),
        Bad("mla_rope_quantize_fp8 q_out over q_nope", q_out_over_q_nope, INVALID,
            ("`q_out`: expected memory apart from `q_nope`", "bf16[2, 2, 128]")),
        Bad("mla_rope_quantize_fp8 style gptj", lambda b: rope(b, style="gptj"), INVALID,
            ("expected style 'interleaved' or 'neox'", "got 'gptj'")),
        Bad("mla_rope_quantize_fp8 page size 256", lambda b: rope(
            b, with_cache=True, cache=lambda b: b.input((1, 256, 576), E4M3)), UNSUPPORTED,
            ("`cache`: expected a page size from 1 to 128", "e4m3fn[1, 256, 576]")),
        Bad("mla_rope_quantize_fp8 slot past the cache", lambda b: rope(
            b, with_cache=True, slot_mapping=lambda b: b.ints([0, 8])), INVALID,
            ("`slot_mapping`[1] = 8", "outside the cache's [0, 8) slots")),
        Bad("mla_rope_quantize_fp8 kv_c without the cache", lambda b: rope(
            b, kv_c=lambda b: b.input((T, 512))), INVALID,
            ("`kv_c`, `slot_mapping` and `error_flag` belong to the latent cache write",
             "pass `cache` too")),
        Bad("mla_rope_quantize_fp8 q_out with head stride 0", lambda b: rope(
            b, q_out=lambda b: np.lib.stride_tricks.as_strided(
                b.output((T, H, 192), E4M3), strides=(192, 0, 1))), INVALID,
            ("`q_out`: expected strides that keep every element apart", "e4m3fn[2, 2, 192]")),
        Bad("mla_kv_cache_write pages a row apart", lambda b: cache_write(
            b, cache=np.lib.stride_tricks.as_strided(
                b.output((2, 4, 576), E4M3), strides=(576, 576, 1))), INVALID,
            ("`cache`: expected strides that keep every element apart", "e4m3fn[2, 4, 576]")),
        Bad("mla_kv_cache_write kv_c of width 256",
            lambda b: cache_write(b, kv_c=b.input((T, 256))), INVALID,
            ("`kv_c`: expected [tokens, 512]", "bf16[2, 256]")),
        Bad("mla_kv_cache_write slot past the cache",
            lambda b: cache_write(b, slots=b.ints([0, 8], np.int64)), INVALID,
            ("`slot_mapping`[1] = 8 is outside the cache's slots [0, 8)", "nothing was written")),
        Bad("mla_kv_cache_write negative scale", lambda b: cache_write(b, scale_inv=-1.0),
            INVALID, ("`scale_inv`: expected a finite scale > 0", "got -1")),
        Bad("mla_kv_cache_write bf16 cache",
            lambda b: cache_write(b, cache=b.input((2, 4, 576))), INVALID,
            ("`cache` dtype: expected e4m3fn", "got bf16")),
        Bad("mla_kv_cache_write slot_mapping of 3 for 2 tokens",
            lambda b: cache_write(b, slots=b.ints([0, 1, 2])), INVALID,
            ("`slot_mapping`: expected [2] (one slot per token of `kv_c`)", "i32[3]")),
        Bad("mla_kv_gather slot -1", lambda b: gather(b, slots=b.ints([-1, 0])), INVALID,
            ("`slots`[0] = -1 is outside the cache's slots [0, 8)", "nothing was written")),
        Bad("mla_kv_gather NaN scale", lambda b: gather(b, scale=NAN), INVALID,
            ("`scale`: expected a finite scale > 0", "got nan")),
        Bad("mla_kv_gather f32 kv_c_out",
            lambda b: gather(b, kv_c_out=b.output((T, 512), np.float32)), INVALID,
            ("`kv_c_out` dtype: expected bf16", "got f32")),
        Bad("mla_kv_pack_quantize_fp8 k_nope of head dim 64",
            lambda b: pack(b, k_nope=b.input((T, H, 64))), INVALID,
            ("`k_nope`: expected [tokens, heads, 128]", "bf16[2, 2, 64]")),
        Bad("mla_kv_pack_quantize_fp8 v_layout diagonal", lambda b: pack(b, v_layout="diagonal"),
            INVALID, ("expected v_layout 'token_major' or 'transposed'", "got 'diagonal'")),
        Bad("mla_kv_pack_quantize_fp8 infinite v_scale_inv",
            lambda b: pack(b, v_scale_inv=INF), INVALID,
            ("`v_scale_inv`: expected a finite scale > 0", "got inf")),
        Bad("mla_v_quantize_fp8 negative scale", lambda b: fp8mla.mla_v_quantize_fp8(
            b.input((T, H, 128)), v_out=b.output((T, H, 128), E4M3), v_scale_inv=-0.5), INVALID,
            ("`v_scale_inv`: expected a finite scale > 0", "got -0.5")),
        Bad("mla_rope_quantize_fp8 bf16 k_rope_out",
            lambda b: rope(b, **split_k(b, k_rope_out=b.output((T, 64)))), INVALID,
            ("`k_rope_out` dtype: expected e4m3fn", "got bf16")),
        Bad("mla_rope_quantize_fp8 k_rope_out 32 wide",
            lambda b: rope(b, **split_k(b, k_rope_out=b.output((T, 32), E4M3))), INVALID,
            ("`k_rope_out`: expected [T, 64] or [T, 1, 64] with T = 2", "e4m3fn[2, 32]")),
        Bad("mla_rope_quantize_fp8 k_rope_out with a 192-wide k_out",
            lambda b: rope(b, **split_k(b, k_out=b.output((T, H, 192), E4M3))), INVALID,
            ("`k_out`: expected [T, H, 128] = [2, 2, 128]", "e4m3fn[2, 2, 192]")),
        Bad("mla_kv_pack_quantize_fp8 k_rope_out of 3 tokens",
            lambda b: pack(b, **split_k(b, k_rope_out=b.output((3, 64), E4M3))), INVALID,
            ("`k_rope_out`: expected 2 tokens like `k_nope`", "e4m3fn[3, 64]")),
        Bad("mla_kv_pack_quantize_fp8 bf16 k_rope_out",
            lambda b: pack(b, **split_k(b, k_rope_out=b.output((T, 64)))), INVALID,
            ("`k_rope_out` dtype: expected e4m3fn", "got bf16")),
        Bad("make_cos_sin_cache theta 1", lambda b: fp8mla.make_cos_sin_cache(
            MAX_POS, out=b.output((MAX_POS, 64), np.float32), theta=1.0), INVALID,
            ("expected a finite theta > 1", "got 1")),
    ]


# ---- attention -----------------------------------------------------------------------------------

TQ = 4


def attention(b, dtype=BF16, dqk=192, dv=128, cu_q=None, cu_k=None, max_q=TQ, max_k=TQ,
              **kwargs):
    q, k, v = b.input((TQ, H, dqk), dtype), b.input((TQ, H, dqk), dtype), b.input((TQ, H, dv),
                                                                                   dtype)
    kwargs.setdefault("out", b.output((TQ, H, dv)))
    kwargs.setdefault("lse", b.output((TQ, H), np.float32))
    if dtype == E4M3:
        for name in ("q_descale", "k_descale", "v_descale"):
            kwargs.setdefault(name, b.scalar(1.0))
    kwargs = {key: (value(b, q, k, v) if callable(value) else value)
              for key, value in kwargs.items()}
    kwargs.setdefault("softmax_scale", 0.1)
    return fp8mla.prefill_attention(q, k, v, b.ints(cu_q or [0, TQ]), b.ints(cu_k or [0, TQ]),
                                    max_q, max_k, **kwargs)


def attention_split_k(b, k_dqk=128, k_rope_shape=(TQ, 64), k_rope_dtype=BF16):
    """prefill_attention with K split: k [Tk, H, 128] and k_rope, the RoPE part once per key."""
    q, k, v = b.input((TQ, H, 192)), b.input((TQ, H, k_dqk)), b.input((TQ, H, 128))
    return fp8mla.prefill_attention(q, k, v, b.ints([0, TQ]), b.ints([0, TQ]), TQ, TQ,
                                    out=b.output((TQ, H, 128)), softmax_scale=0.1,
                                    k_rope=b.input(k_rope_shape, k_rope_dtype))


def merge(b, **replace):
    args = dict(o_a=b.input((TQ, H, 128)), lse_a=b.input((TQ, H), np.float32),
                o_b=b.input((TQ, H, 128)), lse_b=b.input((TQ, H), np.float32),
                out=b.output((TQ, H, 128)), out_lse=b.output((TQ, H), np.float32))
    args.update({k: (v(b, args) if callable(v) else v) for k, v in replace.items()})
    positional = [args.pop(k) for k in ("o_a", "lse_a", "o_b", "lse_b")]
    return fp8mla.merge_attention_states(*positional, **args)


def attention_entries():
    return [
        Bad("prefill_attention f32 k_rope",
            lambda b: attention_split_k(b, k_rope_dtype=np.float32), INVALID,
            ("`k_rope` dtype: expected bf16 (the dtype of `q`)", "got f32")),
        Bad("prefill_attention k_rope 32 wide",
            lambda b: attention_split_k(b, k_rope_shape=(TQ, 32)), INVALID,
            ("`k_rope`: expected [4, 64] or [4, 1, 64]", "bf16[4, 32]")),
        Bad("prefill_attention k_rope of 3 keys",
            lambda b: attention_split_k(b, k_rope_shape=(3, 64)), INVALID,
            ("`k_rope`: expected [4, 64] or [4, 1, 64]", "bf16[3, 64]")),
        Bad("prefill_attention k_rope with a 192-wide k",
            lambda b: attention_split_k(b, k_dqk=192), INVALID,
            ("`k`: expected [4, 2, 128]", "the rest is `k_rope`", "bf16[4, 2, 192]")),
        Bad("prefill_attention f16 q", lambda b: attention(b, np.float16), INVALID,
            ("`q` dtype: expected one of {e4m3fn, bf16}", "got f16")),
        Bad("prefill_attention Dqk 96", lambda b: attention(b, dqk=96), UNSUPPORTED,
            ("`q`: expected a head dim of 192, 128 or 64", "bf16[4, 2, 96]")),
        Bad("prefill_attention Dqk 576", lambda b: attention(b, dqk=576), UNSUPPORTED,
            ("`q`: expected a head dim of 192, 128 or 64", "bf16[4, 2, 576]")),
        Bad("prefill_attention Dv 512", lambda b: attention(b, dv=512), UNSUPPORTED,
            ("`v`: expected a head dim of 128 or 64", "bf16[4, 2, 512]")),
        Bad("prefill_attention decreasing cu_seqlens_q",
            lambda b: attention(b, cu_q=[0, 3, 2], cu_k=[0, 2, 4]), INVALID,
            ("`cu_seqlens_q`: expected non-decreasing offsets", "got 3 then 2 at index 2")),
        Bad("prefill_attention cu_seqlens of different lengths",
            lambda b: attention(b, cu_k=[0, 2, 4]), INVALID,
            ("`cu_seqlens_k`: expected the length of `cu_seqlens_q` (2)", "i32[3]")),
        Bad("prefill_attention cu_seqlens_q past q", lambda b: attention(b, cu_q=[0, 5]),
            INVALID, ("`cu_seqlens_q`: expected at most 4 (the tokens of `q`) last", "got 5")),
        Bad("prefill_attention max_seqlen_q smaller than a sequence",
            lambda b: attention(b, max_q=3), INVALID,
            ("`max_seqlen_q` (3) is smaller than the length 4 of sequence 0", "`cu_seqlens_q`")),
        Bad("prefill_attention NaN softmax_scale", lambda b: attention(b, softmax_scale=NAN),
            INVALID, ("expected a finite softmax_scale", "got nan")),
        Bad("prefill_attention negative softmax_scale",
            lambda b: attention(b, softmax_scale=-0.1), INVALID,
            ("expected a finite softmax_scale > 0", "got -0.1")),
        Bad("prefill_attention e4m3 without descales", lambda b: attention(
            b, E4M3, q_descale=None, k_descale=None, v_descale=None), INVALID,
            ("`q_descale`: expected one f32 for FP8 inputs", "got none")),
        Bad("prefill_attention NaN k_descale",
            lambda b: attention(b, E4M3, k_descale=lambda b, *_: b.scalar(NAN)), INVALID,
            ("`k_descale`: expected a finite scale > 0", "got nan")),
        Bad("prefill_attention zero v_descale",
            lambda b: attention(b, E4M3, v_descale=lambda b, *_: b.scalar(0.0)), INVALID,
            ("`v_descale`: expected a finite scale > 0", "got 0")),
        Bad("prefill_attention infinite output_scale", lambda b: attention(
            b, out=b.output((TQ, H, 128), E4M3), output_scale=b.scalar(INF)), INVALID,
            ("`output_scale`: expected a finite scale > 0", "got inf")),
        Bad("prefill_attention out over q", lambda b: attention(
            b, out=lambda b, q, k, v: q[..., :128]), INVALID,
            ("`out`: expected memory apart from `q`", "got bf16[4, 2, 128]", "bf16[4, 2, 192]")),
        Bad("prefill_attention lse of [H, Tq]", lambda b: attention(
            b, lse=b.output((H, TQ), np.float32)), INVALID,
            ("`lse`: expected [4, 2] ([Tq, H])", "f32[2, 4]")),
        Bad("prefill_attention out of Dv 64 for 128", lambda b: attention(
            b, out=b.output((TQ, H, 64))), INVALID,
            ("`out`: expected [4, 2, 128] ([Tq, H, Dv])", "[4, 2, 64]")),
        Bad("prefill_attention prior_lse without prior_out", lambda b: attention(
            b, prior_lse=b.input((TQ, H), np.float32)), INVALID,
            ("expected `prior_out` and `prior_lse` together", "got only `prior_lse`")),
        Bad("prefill_attention f32 prior_out", lambda b: attention(
            b, prior_out=b.input((TQ, H, 128), np.float32),
            prior_lse=b.input((TQ, H), np.float32)), INVALID,
            ("`prior_out` dtype: expected bf16", "got f32")),
        Bad("merge_attention_states o_b of 3 tokens",
            lambda b: merge(b, o_b=lambda b, _: b.input((3, H, 128))), INVALID,
            ("`o_b` dim 0: expected size 4", "bf16[3, 2, 128]")),
        Bad("merge_attention_states out at o_a with other strides", lambda b: merge(
            b, out=lambda b, args: np.lib.stride_tricks.as_strided(
                args["o_a"], strides=(128 * 2, 512 * 2, 2))), INVALID,
            ("`out` aliases `o_a` as another view", "strides [128, 512, 1]")),
        Bad("merge_attention_states out on o_b", lambda b: merge(
            b, out=lambda b, args: args["o_b"]), INVALID,
            ("`out`: expected memory apart from `o_b`",)),
        Bad("merge_attention_states num_tokens past the tokens",
            lambda b: merge(b, num_tokens=lambda b, _: b.ints([TQ + 1])), INVALID,
            ("`num_tokens`: expected 0 to 4 (the tokens of `o_a`)", "got 5")),
        Bad("merge_attention_states f16 lse_a",
            lambda b: merge(b, lse_a=lambda b, _: b.input((TQ, H), np.float16)), INVALID,
            ("`lse_a` dtype: expected f32", "got f16")),
        Bad("detect_output_quant_key group count that does not divide the row",
            lambda b: fp8mla.detect_output_quant_key(b.output((TQ, 256), E4M3), None,
                                                     b.output((TQ, 3), np.float32)), INVALID,
            ("expected a group count that divides output_dim 256", "got 3 groups")),
        Bad("detect_output_quant_key NVFP4 without a global scale",
            lambda b: fp8mla.detect_output_quant_key(b.output((TQ, 64), np.uint8), None,
                                                     b.output((TQ, 8), E4M3)), INVALID,
            ("`output_scale`: expected the global scale (one f32) of the NVFP4", "got none")),
    ]


# ---- backends and the layer ----------------------------------------------------------------------


def prepare(b, backend="cpu", **replace):
    args = rope_inputs(b)
    args.update(cache=b.input((2, 4, 576), E4M3), slot_mapping=b.ints([0, 5]),
                kv_a=b.input((T, 512)), v_out=b.output((T, H, 128), E4M3))
    v = replace.pop("v", None)
    args.update({k: (val(b) if callable(val) else val) for k, val in replace.items()})
    positional = [args.pop(k) for k in ("q_nope", "q_pe", "k_nope", "k_pe", "positions",
                                        "cos_sin")]
    v = b.input((T, H, 128)) if v is None else v(b)
    return fp8mla.make_attention_backend(backend).prepare_prefill_qkv(*positional, v, **args)


@pytest.fixture(scope="module")
def tiny_layer():
    return fp8mla.MlaLayer(None, fp8mla.generate_mla_weights("tiny", "bf16", seed=0))


LAYER = {}


def layer_prefill(b, hidden=None, batch=None, cache=None, **kwargs):
    layer = LAYER["tiny"]
    kwargs.setdefault("out", b.output((3, 512)))
    return layer.prefill(b.input((3, 512)) if hidden is None else hidden,
                         [(0, 3, [4, 5, 6])] if batch is None else batch,
                         b.input((4, 16, 576), E4M3) if cache is None else cache, **kwargs)


def model_entries():
    return [
        Bad("make_attention_backend unknown name",
            lambda b: fp8mla.make_attention_backend("tpu"), INVALID,
            ("unknown attention backend 'tpu'", "known: cpu, cpu-bf16, fp8-hopper, bf16-hopper")),
        Bad("check_backend head dims 96/128",
            lambda b: fp8mla.check_backend("cpu", head_dim_qk=96), UNSUPPORTED,
            ("Required: attention dtype e4m3fn, head dims 96/128", "Missing: head dims 96/128")),
        Bad("check_backend page size 256", lambda b: fp8mla.check_backend("cpu", page_size=256),
            UNSUPPORTED, ("page sizes 1-128", "Missing: page size 256")),
        Bad("check_backend fp8-hopper on the CPU", lambda b: fp8mla.check_backend("fp8-hopper"),
            UNSUPPORTED, ("cannot serve this layer on cpu", "architecture cpu")),
        Bad("prepare_prefill_qkv of cpu-bf16", lambda b: prepare(b, "cpu-bf16"), UNSUPPORTED,
            ("attention backend 'cpu-bf16' has no prepare_prefill_qkv",)),
        Bad("prepare_prefill_qkv v of 3 tokens for 2", lambda b: prepare(
            b, v=lambda b: b.input((3, H, 128)), v_out=lambda b: b.output((3, H, 128), E4M3)),
            INVALID, ("`v`: expected the 2 tokens and 2 heads of `q_nope`", "bf16[3, 2, 128]")),
        Bad("prepare_prefill_qkv v_out of head dim 64", lambda b: prepare(
            b, v_out=lambda b: b.output((T, H, 64), E4M3)), INVALID,
            ("`v_out`: expected [tokens, heads, 128]", "e4m3fn[2, 2, 64]")),
        Bad("prepare_prefill_qkv NaN v_scale_inv", lambda b: prepare(b, v_scale_inv=NAN),
            INVALID, ("`v_scale_inv`: expected a finite scale > 0", "got nan")),
        Bad("pack_prefix_chunk_kv of cpu-bf16", lambda b: fp8mla.make_attention_backend(
            "cpu-bf16").pack_prefix_chunk_kv(b.input((T, H, 128)), b.input((T, 64)),
                                             b.input((T, H, 128))), UNSUPPORTED,
            ("attention backend 'cpu-bf16' has no pack_prefix_chunk_kv",)),
        Bad("MlaLayer.prefill hidden of width 256",
            lambda b: layer_prefill(b, hidden=b.input((3, 256))), INVALID,
            ("expected `hidden` contiguous bf16 [3, 512]", "bf16[3, 256]")),
        Bad("MlaLayer.prefill slot past the cache",
            lambda b: layer_prefill(b, batch=[(0, 3, [4, 5, 64])]), INVALID,
            ("`slot_mapping`[2] = 64", "outside the cache's [0, 64) slots")),
        Bad("MlaLayer.prefill fewer slots than tokens",
            lambda b: layer_prefill(b, batch=[(0, 3, [4, 5])]), INVALID,
            ("sequence 0: expected prefix, extend >= 0", "2 slots")),
        Bad("MlaLayer.prefill slots of two dimensions",
            lambda b: layer_prefill(b, batch=[(0, 3, [[4], [5], [6]])]), INVALID,
            ("expected a sequence's slots 1-d", "got shape (3, 1)")),
        Bad("MlaLayer.prefill chunk capacity 0", lambda b: layer_prefill(b, chunk_capacity=0),
            INVALID, ("chunk_capacity >= 1", "got 8192, 0")),
        Bad("MlaLayer.prefill NaN q scale", lambda b: layer_prefill(b, q_scale_inv=NAN),
            INVALID, ("scales > 0", "fp8 scale_inv q/k/v nan/1/1")),
        Bad("MlaLayer.prefill bf16 cache",
            lambda b: layer_prefill(b, cache=b.input((4, 16, 576))), INVALID,
            ("expected `cache` e4m3 [pages, page_size, 576]", "got bf16[4, 16, 576]")),
        Bad("MlaLayer unknown backend", lambda b: fp8mla.MlaLayer(
            None, fp8mla.generate_mla_weights("tiny", "bf16", seed=0), backend="tpu"), INVALID,
            ("unknown attention backend 'tpu'", "known: cpu, cpu-bf16")),
        Bad("mla_config unknown preset", lambda b: fp8mla.mla_config("gpt"), INVALID,
            ("unknown MLA preset 'gpt'", "known: deepseek-v2-lite, deepseek-v2, deepseek-v3")),
        Bad("MlaLayer.calibrate headroom 0.5",
            lambda b: LAYER["tiny"].calibrate(b.input((1, 512)), [(0, 1, [0])], headroom=0.5),
            INVALID, ("expected a finite headroom >= 1", "got 0.5")),
        Bad("MlaLayer.prefill_device_batch cu_seqlens_q from 1", lambda b: LAYER[
            "tiny"].prefill_device_batch(b.input((4, 512)), b.ints([1, 3]),
                                         b.ints([0, 1, 2, 0], np.int64),
                                         b.ints([4, 5, 6, -1], np.int64),
                                         b.input((4, 16, 576), E4M3), max_seqlen_q=3,
                                         out=b.output((4, 512))), INVALID,
            ("expected cu_seqlens_q from 0 to at most tokens 4", "got 1 to 3")),
        Bad("context_parallel_batch rank 2 of 2",
            lambda b: fp8mla.context_parallel_batch([(0, 4, [0, 1, 2, 3])], 2, 2), INVALID,
            ("expected size >= 1 and 0 <= rank < size", "got rank 2 of 2")),
        Bad("MlaCommunicator.all_gather out of the wrong rows",
            lambda b: fp8mla.make_cpu_communicators(1)[0].all_gather(
                b.input((3, 576), E4M3), b.output((4, 576), E4M3)), INVALID,
            ("all_gather", "e4m3fn[4, 576]")),
    ]


CATALOGUE = quantize_entries() + prep_entries() + attention_entries() + model_entries()


@pytest.fixture(autouse=True)
def _layer(tiny_layer):
    LAYER["tiny"] = tiny_layer


@pytest.mark.parametrize("entry", CATALOGUE, ids=[e.name for e in CATALOGUE])
def test_bad_input_is_a_clear_error_and_writes_nothing(entry):
    buffers = Buffers()
    with pytest.raises(entry.error) as e:
        entry.call(buffers)
    message = str(e.value)
    for needle in entry.needles:
        assert needle in message, f"{entry.name}: message lacks {needle!r}: {message}"
    buffers.check_unchanged()


def test_catalogue_size_and_names():
    names = [e.name for e in CATALOGUE]
    assert len(set(names)) == len(names)
    assert all(e.needles for e in CATALOGUE)
    print(f"bad inputs catalogue (python): {len(CATALOGUE)} entries")
    assert len(CATALOGUE) >= 60


# The calls the entries break, unbroken, succeed on the same guarded buffers (so every entry
# fails by its one bad argument), and write only their outputs.
VALID = [
    ("quantize_fp8", lambda b: fp8mla.quantize_fp8(b.input((4, 64)), 1.0,
                                                   out=b.output((4, 64), E4M3))),
    ("mla_rope_quantize_fp8", lambda b: rope(b, with_cache=True)),
    ("mla_kv_gather", gather),
    ("mla_kv_pack_quantize_fp8", pack),
    ("mla_rope_quantize_fp8 split K", lambda b: rope(b, **split_k(b))),
    ("mla_kv_pack_quantize_fp8 split K", lambda b: pack(b, **split_k(b))),
    ("prefill_attention split K", attention_split_k),
    ("prefill_attention bf16", attention),
    ("prefill_attention e4m3", lambda b: attention(b, E4M3)),
    ("merge_attention_states", merge),
    ("prepare_prefill_qkv", prepare),
    ("MlaLayer.prefill", layer_prefill),
]


@pytest.mark.parametrize("name,call", VALID, ids=[v[0] for v in VALID])
def test_valid_call_succeeds(name, call):
    buffers = Buffers()
    call(buffers)
    buffers.check_guards()


def test_guard_bands_catch_a_write():
    """The check itself: one byte written just past an output is seen."""
    buffers = Buffers()
    out = buffers.output((4, 64), E4M3)
    buffers._bases[0][0][GUARD + out.nbytes] ^= 1
    with pytest.raises(AssertionError, match="1 bytes changed"):
        buffers.check_unchanged()
