"""Fused output quantization of prefill_attention and merge_attention_states through numpy:
for every key, scale dtype and layout, the op with a quantized `out` writes the bytes of the op
with a bf16 `out` followed by the standalone quantization op (the C++ test
tests/cpp/output_quant_fused_test.cpp checks the same with guard bands). Outputs and scales start
poisoned, twice with different bytes, so every byte the op must write is written and the others
(padded scale rows) stay. Skipped without ml_dtypes."""

from __future__ import annotations

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
import fp8mla  # noqa: E402

BF16, E4M3, F32, I32 = ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, np.float32, np.int32
UE8M0 = getattr(ml_dtypes, "float8_e8m0fnu", np.uint8)
H, D = 4, 128
W = H * D
# A ragged causal batch: a sequence after a 7-key prefix, an empty one, one with fewer keys than
# queries (its first two rows see no key), three queries without keys, and a plain one.
CU_Q = np.array([0, 5, 5, 9, 12, 18], I32)
CU_K = np.array([0, 12, 12, 14, 14, 20], I32)
T, TK = int(CU_Q[-1]), int(CU_K[-1])


def round_up(x, m):
    return (x + m - 1) // m * m


def storage(shape, dtype, poison):
    """A C-contiguous array of `shape` whose bytes are all `poison`."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.full(n, poison, np.uint8).view(dtype).reshape(shape)


# Each layout: (name, storage shape, dtype, the view given to the op, the part the standalone op
# writes). Views are functions of the storage.
def group_layouts(group):
    g = W // group
    words, t4 = (g + 3) // 4, round_up(T, 4)
    return [
        ("f32 row-major", (T, g), F32, lambda s: s, lambda v: v),
        ("f32 column-major", (g, T), F32, lambda s: s.T, lambda v: v),
        ("f32 TMA-aligned", (g, t4), F32, lambda s: s[:, :T].T, lambda v: v),
        ("f32 padded rows", (g, T + 6), F32, lambda s: s.T, lambda v: v[:T]),
        ("ue8m0 row-major", (T, g), UE8M0, lambda s: s, lambda v: v),
        ("ue8m0 column-major", (g, T), UE8M0, lambda s: s.T, lambda v: v),
        ("packed TMA-aligned", (words, t4), I32, lambda s: s[:, :T].T, lambda v: v),
        ("packed row-major", (T, words), I32, lambda s: s, lambda v: v),
    ]


NVFP4_LAYOUTS = [
    ("swizzled 2-d", (128, W // 16), "swizzled", lambda s: s, lambda v: v),
    ("swizzled 5-d", (1, W // 64, 32, 4, 4), "swizzled", lambda s: s, lambda v: v),
    ("swizzled, a spare tile", (256, W // 16), "swizzled", lambda s: s, lambda v: v[:128]),
    ("linear", (T, W // 16), "linear", lambda s: s, lambda v: v),
    ("linear, strided, spare rows", (T + 3, 40), "linear", lambda s: s[:, :W // 16],
     lambda v: v[:T]),
]


def out_view(storage_array, three_d, packed):
    """`out`: [T, H, D] (D / 2 bytes packed) or [T, W] rows padded by 48 bytes."""
    dim = D // 2 if packed else D
    if three_d:
        return storage_array.reshape(T, H, dim)
    return storage_array[:, 16:16 + H * dim]


def out_storage(three_d, packed, poison):
    dtype = np.uint8 if packed else E4M3
    cols = W // 2 if packed else W
    return storage((T, H, cols // H) if three_d else (T, cols + 48), dtype, poison)


def cases():
    for group in (128, 64):
        for name, shape, dtype, view, used in group_layouts(group):
            yield f"group{group} {name}", "group", group, shape, dtype, view, used
    yield "static", "static", None, (1,), F32, lambda s: s, lambda v: v
    for name, shape, layout, view, used in NVFP4_LAYOUTS:
        yield f"nvfp4 {name}", "nvfp4", layout, shape, E4M3, view, used


CASES = [(c, three_d) for c in cases() for three_d in (False, True)]
IDS = [f"{c[0]}{', 3-d out' if three_d else ''}" for c, three_d in CASES]
STATIC_SCALE = np.array([150.0], F32)
GLOBAL_SCALE = np.array([500.0], F32)


def quantized(case, three_d, poison):
    """(out storage, out view, scale storage, output_scale, output_block_scale view)."""
    _, kind, _, shape, dtype, view, _ = case
    out_s = out_storage(three_d, kind == "nvfp4", poison)
    scale_s = storage(shape, dtype, poison)
    if kind == "static":
        scale_s[...] = STATIC_SCALE
        return out_s, out_view(out_s, three_d, False), scale_s, scale_s, None
    scale = GLOBAL_SCALE if kind == "nvfp4" else None
    return out_s, out_view(out_s, three_d, kind == "nvfp4"), scale_s, scale, view(scale_s)


def standalone(case, rows, out, scale_view, output_scale):
    """The unfused reference: the standalone op of the key on the bf16 rows."""
    _, kind, param, *_, used = case
    out_rows = out.reshape(T, -1)
    if kind == "static":
        fp8mla.quantize_fp8(rows, output_scale, out=out_rows)
    elif kind == "group":
        fp8mla.quantize_fp8_per_token_group(rows, out=out_rows, scales=used(scale_view),
                                            group_size=param)
    else:
        fp8mla.quantize_nvfp4(rows, output_scale, out=out_rows, block_scales=used(scale_view),
                              layout=param)


def check_fused(case, three_d, rows, fused):
    for poison in (0xFF, 0x00):
        got = quantized(case, three_d, poison)
        want = quantized(case, three_d, poison)
        fused(got[1], got[3], got[4])
        standalone(case, rows, want[1], want[4], want[3])
        assert got[0].tobytes() == want[0].tobytes(), "out"
        assert got[2].tobytes() == want[2].tobytes(), "scales"


def attention_inputs():
    rng = np.random.default_rng(3)
    q = rng.uniform(-1, 1, (T, H, 192)).astype(BF16)
    k = rng.uniform(-1, 1, (TK, H, 192)).astype(BF16)
    v = rng.uniform(-4, 4, (TK, H, D)).astype(BF16)
    return q, k, v


def attend(q, k, v, **kwargs):
    return fp8mla.prefill_attention(q, k, v, CU_Q, CU_K, 12, 12, softmax_scale=0.0722, **kwargs)


@pytest.mark.parametrize("case, three_d", CASES, ids=IDS)
def test_prefill_attention_fused_equals_unfused(case, three_d):
    q, k, v = attention_inputs()
    rows = attend(q, k, v).reshape(T, W)
    assert not rows[5:7].astype(F32).any() and not rows[9:12].astype(F32).any()  # no keys

    def fused(out, output_scale, output_block_scale):
        result = attend(q, k, v, out=out, output_scale=output_scale,
                        output_block_scale=output_block_scale)
        assert result is out

    check_fused(case, three_d, rows, fused)


def merge_inputs(dtype):
    rng = np.random.default_rng(5)
    o_a, o_b = (rng.uniform(-4, 4, (T, H, D)).astype(dtype) for _ in range(2))
    lse_a, lse_b = (np.where(rng.uniform(size=(T, H)) < 0.25, -np.inf,
                             rng.uniform(-8, 8, (T, H))).astype(F32) for _ in range(2))
    lse_a[3] = lse_b[3] = -np.inf  # token 3: both sides empty, an all-zero row
    return o_a, lse_a, o_b, lse_b


@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "f32"])
@pytest.mark.parametrize("case, three_d", CASES, ids=IDS)
def test_merge_attention_states_fused_equals_unfused(case, three_d, dtype):
    states = merge_inputs(dtype)
    merged, merged_lse = fp8mla.merge_attention_states(*states)
    rows = merged.astype(BF16).reshape(T, W)  # f32 states: their merged values rounded once

    def fused(out, output_scale, output_block_scale):
        result, lse = fp8mla.merge_attention_states(
            *states, out=out, output_scale=output_scale, output_block_scale=output_block_scale)
        assert result is out
        assert lse.tobytes() == merged_lse.tobytes()

    check_fused(case, three_d, rows, fused)


def test_every_group_scale_written():
    q, k, v = attention_inputs()
    for kind, block in (("fp8_group128", np.zeros((T, 4), F32)),
                        ("fp8_group64", np.zeros((T, 8), UE8M0))):
        out = np.zeros((T, W), E4M3)
        assert fp8mla.detect_output_quant_key(out, None, block) == kind
        attend(q, k, v, out=out, output_block_scale=block)
        assert block.astype(F32).all()  # every scale written (eps keeps empty rows nonzero)


def test_heads_apart_are_rejected():
    q, k, v = attention_inputs()
    out = np.zeros((T, H, 2 * D), E4M3)[:, :, :D]
    with pytest.raises(fp8mla.InvalidArgumentError,
                       match="a quantized output needs the values of a token contiguous"):
        attend(q, k, v, out=out, output_scale=STATIC_SCALE)
