"""detect_output_quant_key through numpy: every rule and every error of the C++ table test
(tests/cpp/output_quant_test.cpp) but the device ones, in each scale layout as
quantize_fp8_per_token_group and quantize_nvfp4 allocate them; and the attention ops' reading of
a quantized `out`. Skipped without ml_dtypes."""

from __future__ import annotations

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
import fp8mla  # noqa: E402

BF16, E4M3, F32, I32 = ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, np.float32, np.int32
UE8M0 = getattr(ml_dtypes, "float8_e8m0fnu", np.uint8)  # uint8 next to an e4m3 output: ue8m0
T, W = 10, 512  # 10 tokens, 4 heads of 128
ONE = np.ones(1, F32)


def zeros(shape, dtype):
    return np.zeros(shape, dtype)


def column_major(rows, cols, dtype, pitch=None):
    """[rows, cols] with strides (1, pitch): pitch rows (TMA-aligned when a multiple of 4)."""
    return zeros((cols, pitch or rows), dtype)[:, :rows].T


def fp8(shape=(T, W)):
    return zeros(shape, E4M3)


def fp4(shape=(T, W // 2)):
    return zeros(shape, np.uint8)  # packed e2m1 pairs, as quantize_nvfp4 returns them


KEYS = [
    ("bf16, no scales", zeros((T, W), BF16), None, None, None, None),
    ("bf16 [T, H, Dv], no scales", zeros((T, 4, 128), BF16), None, None, None, None),
    ("static, scale [1]", fp8(), ONE, None, None, "fp8_static"),
    ("static, scale []", fp8(), np.ones((), F32), None, None, "fp8_static"),
    ("static, [T, H, Dv] strided", fp8((T, 4, 256))[:, :, :128], ONE, None, 512, "fp8_static"),
    ("group128 row-major", fp8(), None, zeros((T, 4), F32), None, "fp8_group128"),
    ("group128 column-major", fp8(), None, column_major(T, 4, F32), None, "fp8_group128"),
    ("group128 TMA-aligned", fp8(), None, column_major(T, 4, F32, 12), None, "fp8_group128"),
    ("group128 padded rows", fp8(), None, column_major(16, 4, F32), None, "fp8_group128"),
    ("group128 ue8m0", fp8(), None, zeros((T, 4), UE8M0), None, "fp8_group128"),
    ("group128 packed", fp8(), None, column_major(T, 1, I32, 12), None, "fp8_group128"),
    ("group64 row-major", fp8(), None, zeros((T, 8), F32), None, "fp8_group64"),
    ("group64 column-major", fp8(), None, column_major(T, 8, F32), None, "fp8_group64"),
    ("group64 TMA-aligned", fp8(), None, column_major(T, 8, F32, 12), None, "fp8_group64"),
    ("group64 ue8m0 column-major", fp8(), None, column_major(T, 8, UE8M0, 12), None,
     "fp8_group64"),
    ("group64 packed", fp8(), None, column_major(T, 2, I32, 12), None, "fp8_group64"),
    ("group128, [T, H, Dv] strided", fp8((T, 4, 160))[:, :, :128], None, zeros((T, 4), F32),
     512, "fp8_group128"),
    ("group64, row stride > W", fp8((T, 1024))[:, :W], None, zeros((T, 8), F32), None,
     "fp8_group64"),
    ("group128, 0 rows", fp8((0, W)), None, zeros((0, 4), F32), None, "fp8_group128"),
    ("packed, 3 heads", fp8((T, 384)), None, zeros((T, 1), I32), None, "fp8_group128"),
    ("nvfp4 linear", fp4(), ONE, zeros((T, 32), E4M3), None, "nvfp4"),
    ("nvfp4 swizzled 2-d", fp4(), ONE, zeros((128, 32), E4M3), None, "nvfp4"),
    ("nvfp4 swizzled 5-d", fp4(), ONE, zeros((1, 8, 32, 4, 4), E4M3), None, "nvfp4"),
    ("nvfp4 swizzled, padded blocks", fp4((T, 40)), ONE, zeros((128, 8), E4M3), 80, "nvfp4"),
    ("nvfp4, uint8 block scales", fp4(), ONE, zeros((T, 32), np.uint8), None, "nvfp4"),
]

ERRORS = [
    ("e4m3 without scales", fp8(), None, None, None,
     "`output` dtype: expected bf16, got e4m3fn (a quantized output needs output_scale or "
     "output_block_scale)"),
    ("e2m1x2 without scales", fp4(), None, None, None, "expected bf16, got e2m1x2"),
    ("f32 without scales", zeros((T, W), F32), None, None, None,
     "`output` dtype: expected bf16, got f32"),
    ("scale with bf16", zeros((T, W), BF16), ONE, None, None, "with output_scale, got bf16"),
    ("block with bf16", zeros((T, W), BF16), None, zeros((T, 4), F32), None,
     "e2m1x2 (NVFP4) with output_block_scale, got bf16"),
    ("block with e5m2", zeros((T, W), ml_dtypes.float8_e5m2), None, zeros((T, 4), F32), None,
     "got e5m2"),
    ("both scales, group FP8", fp8(), ONE, zeros((T, 4), F32), None,
     "`output_scale`: expected none with `output_block_scale`"),
    ("groups do not divide", fp8(), None, zeros((T, 3), F32), None,
     "expected a group count that divides output_dim 512, got 3 groups"),
    ("zero groups", fp8(), None, zeros((T, 0), F32), None, "got 0 groups"),
    ("group of 256", fp8(), None, zeros((T, 2), F32), None, "512 / 2 = 256"),
    ("group of 32", fp8(), None, zeros((T, 16), UE8M0), None, "= 32"),
    ("fewer scale rows", fp8(), None, column_major(9, 4, F32, 12), None,
     "`output_block_scale`: expected at least 10 rows"),
    ("fewer packed rows", fp8(), None, zeros((8, 1), I32), None, "at least 10 rows"),
    ("packed words fit no group size", fp8(), None, zeros((T, 3), I32), None,
     "expected ceil(G / 4) words a row for G = 512 / 128 or 512 / 64"),
    ("packed words fit both group sizes", fp8((T, 256)), None, zeros((T, 1), I32), None,
     "fit both group sizes 64 and 128"),
    ("group scale dtype", fp8(), None, zeros((T, 4), np.float16), None,
     "`output_block_scale` dtype: expected one of {f32, ue8m0, i32}, got f16"),
    ("group scale 3-d", fp8(), None, zeros((T, 4, 1), F32), None,
     "`output_block_scale`: expected 2 dims"),
    ("output_dim not the row width", fp8(), None, zeros((T, 4), F32), 256,
     "output_dim: expected the row width of `output`, 512 values, got 256"),
    ("output_dim of packed fp4 bytes", fp4(), ONE, zeros((T, 16), E4M3), 256,
     "512 values (two e2m1 values a byte), got 256"),
    ("last dim not contiguous", fp8((T, 1024))[:, ::2], ONE, None, None,
     "`output`: expected a contiguous last dim"),
    ("1-d output", fp8((W,)), ONE, None, None, "`output`: expected [T, W] or [T, H, Dv]"),
    ("scale dtype", fp8(), zeros(1, BF16), None, None,
     "`output_scale` dtype: expected f32, got bf16"),
    ("scale of 2 elements", fp8(), zeros(2, F32), None, None,
     "`output_scale`: expected one f32 of shape [] or [1]"),
    ("scale [1, 1]", fp8(), zeros((1, 1), F32), None, None, "expected one f32"),
    ("nvfp4 without the global scale", fp4(), None, zeros((T, 32), E4M3), None,
     "`output_scale`: expected the global scale (one f32) of the NVFP4 `output`, got none"),
    ("scale alone with e2m1x2", fp4(), ONE, None, None,
     "`output_block_scale`: expected e4m3 block scales with the e2m1x2 (NVFP4)"),
    ("nvfp4 block scale dtype", fp4(), ONE, zeros((T, 32), F32), None,
     "`output_block_scale` dtype: expected e4m3fn, got f32"),
    ("nvfp4 block count", fp4(), ONE, zeros((T, 16), E4M3), None,
     "expected NVFP4 block scales, linear [R, 32] or 128x4 swizzled [R, 32]"),
    ("nvfp4 5-d tile shape", fp4(), ONE, zeros((1, 8, 32, 4, 2), E4M3), None,
     "expected NVFP4 block scales"),
    ("nvfp4 fewer rows", fp4(), ONE, zeros((9, 32), E4M3), None, "at least 10 rows"),
    ("nvfp4 fewer 5-d rows", fp4((200, 256)), ONE, zeros((1, 8, 32, 4, 4), E4M3), None,
     "at least 200 rows"),
    ("nvfp4 output_dim not a multiple of 16", fp4((T, 4)), ONE, zeros((T, 1), E4M3), None,
     "output_dim: expected a multiple of 16"),
]


@pytest.mark.parametrize("name, output, scale, block, dim, key", KEYS, ids=[c[0] for c in KEYS])
def test_key(name, output, scale, block, dim, key):
    assert fp8mla.detect_output_quant_key(output, scale, block, dim) == key


@pytest.mark.parametrize("name, output, scale, block, dim, needle", ERRORS,
                         ids=[c[0] for c in ERRORS])
def test_error(name, output, scale, block, dim, needle):
    with pytest.raises(fp8mla.InvalidArgumentError) as info:
        fp8mla.detect_output_quant_key(output, scale, block, dim)
    assert info.value.message.startswith("detect_output_quant_key: ")
    assert needle in info.value.message


@pytest.mark.parametrize("layout, group_size, key", [
    (layout, group, f"fp8_group{group}")
    for layout in ("row_major", "column_major", "tma_aligned", "ue8m0", "packed_ue8m0")
    for group in (64, 128)])
def test_key_of_quantize_outputs(layout, group_size, key):
    out, scales = fp8mla.quantize_fp8_per_token_group(
        zeros((13, W), F32), group_size=group_size, scale_layout=layout)
    assert fp8mla.detect_output_quant_key(out, output_block_scale=scales) == key


@pytest.mark.parametrize("layout", ["swizzled", "linear"])
def test_key_of_nvfp4_outputs(layout):
    out, block_scales = fp8mla.quantize_nvfp4(zeros((13, W), BF16), ONE, layout=layout)
    assert fp8mla.detect_output_quant_key(out, ONE, block_scales) == "nvfp4"
    with pytest.raises(fp8mla.InvalidArgumentError, match="expected the global scale"):
        fp8mla.detect_output_quant_key(out, output_block_scale=block_scales)


# ---- the attention ops ---------------------------------------------------------------------------

OP_CASES = [
    ("group128", fp8((T, 4, 128)), None, zeros((T, 4), F32), "fp8_group128"),
    ("group64 packed", fp8((T, 4, 128)), None, column_major(T, 2, I32, 12), "fp8_group64"),
    ("static", fp8((T, 4, 128)), ONE, None, "fp8_static"),
    ("nvfp4", fp4((T, 4, 64)), ONE, zeros((T, 32), E4M3), "nvfp4"),
]


def attention_inputs():
    q = zeros((T, 4, 192), BF16)
    v = zeros((T, 4, 128), BF16)
    cu = np.array([0, 4, T], np.int32)
    return q, v, cu


@pytest.mark.parametrize("name, out, scale, block, key", OP_CASES, ids=[c[0] for c in OP_CASES])
def test_attention_ops_take_quantized_out(name, out, scale, block, key):
    # Fused on the CPU (the bytes: test_output_quant_fused_numpy.py); the op returns `out`.
    q, v, cu = attention_inputs()
    out, block = out.copy(), None if block is None else block.copy()
    assert fp8mla.prefill_attention(q, q, v, cu, cu, 6, 6, softmax_scale=0.1, out=out,
                                    output_scale=scale, output_block_scale=block) is out
    lse = zeros((T, 4), F32)
    merged, _ = fp8mla.merge_attention_states(v, lse, v, lse, out=out, output_scale=scale,
                                              output_block_scale=block)
    assert merged is out


def test_attention_ops_bad_quantized_out():
    q, v, cu = attention_inputs()
    with pytest.raises(fp8mla.InvalidArgumentError,
                       match=r"prefill_attention: `out` dtype: expected bf16, got e4m3fn \(a "
                             r"quantized output needs"):
        fp8mla.prefill_attention(q, q, v, cu, cu, 6, 6, softmax_scale=0.1, out=fp8((T, 4, 128)))
    with pytest.raises(fp8mla.InvalidArgumentError, match="expected groups of 64 or 128"):
        fp8mla.prefill_attention(q, q, v, cu, cu, 6, 6, softmax_scale=0.1, out=fp8((T, 4, 128)),
                                 output_block_scale=zeros((T, 2), F32))
    lse = zeros((T, 4), F32)
    with pytest.raises(fp8mla.InvalidArgumentError,
                       match="merge_attention_states: `out` dtype: expected e4m3fn"):
        fp8mla.merge_attention_states(v, lse, v, lse, output_scale=ONE)
    # bf16 without scales runs as before.
    out = fp8mla.prefill_attention(q, q, v, cu, cu, 6, 6, softmax_scale=0.1)
    assert out.dtype == BF16 and out.shape == (T, 4, 128)
