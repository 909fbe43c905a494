"""fp8mla's Python quantization ops on the CPU through numpy (+ ml_dtypes), against the numpy
reference in fp8mla_reference.py; error propagation, caller-given outputs, strided inputs."""

from __future__ import annotations

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
import fp8mla  # noqa: E402
import fp8mla_reference as ref  # noqa: E402
from dlpack_only import DLPackOnly  # noqa: E402

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
E5M2 = ml_dtypes.float8_e5m2
INPUT_DTYPES = [np.float32, np.float16, BF16]
FP8_TYPES = {"e4m3": E4M3, "e5m2": E5M2}


def make_input(shape, dtype, seed=0, spread=True):
    """Random values over many magnitudes (some past 448), exact in `dtype`."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    if spread:
        x *= np.exp2(rng.integers(-12, 12, size=shape)).astype(np.float32)
    if dtype == np.float16:
        x = np.clip(x, -60000, 60000)
    return x.astype(dtype)


def fp8_bytes(a) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


def assert_fp8_equal(out, expected_bytes, dtype="e4m3"):
    """Bit-exact, except that any NaN encoding matches any NaN."""
    got = fp8_bytes(out)
    expected_bytes = np.asarray(expected_bytes)
    assert got.shape == expected_bytes.shape
    np_type = FP8_TYPES[dtype]
    got_nan = np.isnan(got.view(np_type).astype(np.float32))
    exp_nan = np.isnan(expected_bytes.view(np_type).astype(np.float32))
    np.testing.assert_array_equal(got_nan, exp_nan)
    np.testing.assert_array_equal(np.where(got_nan, 0, got), np.where(exp_nan, 0, expected_bytes))


# ---- info ----------------------------------------------------------------------------------------


def test_info():
    info = fp8mla.info()
    assert info["version"] == fp8mla.__version__
    assert isinstance(info["cuda"], bool)
    assert isinstance(info["devices"], list)
    if not info["devices"]:
        assert info["devices_unavailable_reason"]


# ---- per-tensor --------------------------------------------------------------------------------


@pytest.mark.parametrize("in_dtype", INPUT_DTYPES, ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("dtype", ["e4m3", "e5m2"])
@pytest.mark.parametrize("scale_kind", ["float", "array"])
def test_quantize_fp8_static(in_dtype, dtype, scale_kind):
    x = make_input((7, 384), in_dtype)
    scale_inv = 0.75
    scale_arg = scale_inv if scale_kind == "float" else np.array([scale_inv], dtype=np.float32)
    out = fp8mla.quantize_fp8(x, scale_arg, dtype=dtype)
    assert out.dtype == FP8_TYPES[dtype] and out.shape == x.shape
    assert_fp8_equal(out, ref.quantize_fp8(x, scale_inv, dtype), dtype)


def test_quantize_fp8_saturates_and_keeps_nan():
    x = np.array([[0.0, -0.0, 1.0, 447.9, 448.0, 465.0, 1e9, -1e9, np.inf, -np.inf, np.nan, 1e-9,
                   -3.3, 2.0**-9, 2.0**-10, 100.5]], dtype=np.float32)
    out = fp8mla.quantize_fp8(x, 1.0)
    assert_fp8_equal(out, ref.quantize_fp8(x, 1.0))
    decoded = out.astype(np.float32)[0]
    assert decoded[6] == 448.0 and decoded[7] == -448.0 and decoded[8] == 448.0
    assert np.isnan(decoded[10])


def test_quantize_fp8_scale_shape_0d():
    x = make_input((3, 64), np.float32)
    out = fp8mla.quantize_fp8(x, np.array(2.0, dtype=np.float32))
    assert_fp8_equal(out, ref.quantize_fp8(x, 2.0))


@pytest.mark.parametrize("in_dtype", INPUT_DTYPES, ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("dtype", ["e4m3", "e5m2"])
def test_quantize_fp8_dynamic(in_dtype, dtype):
    x = make_input((5, 3, 96), in_dtype, seed=1)
    out, scale = fp8mla.quantize_fp8_dynamic(x, dtype=dtype)
    expected, expected_scale = ref.quantize_fp8_dynamic(x, dtype)
    assert scale.dtype == np.float32 and scale.shape == (1,)
    assert scale[0] == expected_scale
    assert_fp8_equal(out, expected, dtype)


def test_quantize_fp8_dynamic_zero_and_empty():
    out, scale = fp8mla.quantize_fp8_dynamic(np.zeros((2, 16), np.float32))
    assert scale[0] == ref.MIN_DYNAMIC_SCALE
    assert np.all(fp8_bytes(out) == 0)
    out, scale = fp8mla.quantize_fp8_dynamic(np.zeros((0, 16), np.float32))
    assert out.shape == (0, 16) and scale[0] == ref.MIN_DYNAMIC_SCALE


def test_quantize_fp8_empty():
    out = fp8mla.quantize_fp8(np.zeros((0, 128), BF16), 1.0)
    assert out.shape == (0, 128)


def test_arrays_refused_say_why():
    """Arrays the binding cannot take are refused naming the op, the argument and the reason."""
    x = np.ones((4, 128), np.float32)
    with pytest.raises(fp8mla.InvalidArgumentError,
                       match=r"quantize_fp8: `input`: .*expected non-negative strides"):
        fp8mla.quantize_fp8(x[::-1], 1.0)
    with pytest.raises(fp8mla.InvalidArgumentError,
                       match=r"quantize_fp8: `input`: expected an array in native byte order, "
                             r"got dtype >f4"):
        fp8mla.quantize_fp8(x.astype(">f4"), 1.0)
    read_only = np.zeros((4, 128), np.uint8)
    read_only.setflags(write=False)
    with pytest.raises(fp8mla.InvalidArgumentError,
                       match=r"quantize_fp8: `out`: expected a writable array"):
        fp8mla.quantize_fp8(x, 1.0, out=read_only)
    assert not read_only.any()


def test_dlpack_arrays_give_raw_fp8_outputs():
    """Frameworks without float8 dtypes pass uint8 outputs holding the e4m3 bytes."""
    x = np.random.default_rng(3).standard_normal((4, 128)).astype(np.float32)
    out = np.zeros((4, 128), np.uint8)
    fp8mla.quantize_fp8(DLPackOnly(x), 2.0, out=DLPackOnly(out))
    assert np.array_equal(out, fp8mla.quantize_fp8(x, 2.0).view(np.uint8))


@pytest.mark.parametrize("layout", ["row_major", "column_major", "tma_aligned", "ue8m0",
                                    "packed_ue8m0"])
def test_group_quant_rows_of_width_zero(layout):
    """Rows of width 0 keep their rows in the allocated scales (of no groups)."""
    out, scales = fp8mla.quantize_fp8_per_token_group(np.zeros((8, 0), BF16),
                                                      scale_layout=layout)
    assert out.shape == (8, 0) and scales.shape[0] == 8 and scales.size == 0


@pytest.mark.parametrize("layout", ["swizzled", "linear"])
def test_nvfp4_rows_of_width_zero(layout):
    out, block_scales = fp8mla.quantize_nvfp4(np.zeros((8, 0), BF16), 1.0, layout=layout)
    assert out.shape == (8, 0)
    assert block_scales.shape == ((128, 0) if layout == "swizzled" else (8, 0))


# ---- per-token-group ---------------------------------------------------------------------------


def read_f32_scales(scales):
    return np.array(scales, dtype=np.float32)


@pytest.mark.parametrize("group_size", [64, 128])
@pytest.mark.parametrize("layout", ["row_major", "column_major", "tma_aligned"])
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("in_dtype", [np.float32, BF16], ids=["f32", "bf16"])
def test_group_quant_f32_scales(group_size, layout, pow2, in_dtype):
    x = make_input((2, 5, 512), in_dtype, seed=2)  # 10 rows, a row count not a multiple of 4
    out, scales = fp8mla.quantize_fp8_per_token_group(
        x, group_size=group_size, scale_layout=layout, round_scale_to_pow2=pow2)
    q, s, _ = ref.quantize_fp8_per_token_group(x, group_size, pow2=pow2)
    m, g = 10, 512 // group_size
    assert scales.shape == (m, g) and scales.dtype == np.float32
    item = scales.itemsize
    expected_strides = {"row_major": (g * item, item), "column_major": (item, m * item),
                        "tma_aligned": (item, 12 * item)}[layout]
    assert scales.strides == expected_strides
    assert out.dtype == E4M3 and out.shape == x.shape
    assert_fp8_equal(out, q)
    np.testing.assert_array_equal(read_f32_scales(scales), s)


@pytest.mark.parametrize("group_size", [64, 128])
def test_group_quant_ue8m0(group_size):
    x = make_input((9, 640), BF16, seed=3)
    out, scales = fp8mla.quantize_fp8_per_token_group(x, group_size=group_size,
                                                      scale_layout="ue8m0")
    q, _, exponents = ref.quantize_fp8_per_token_group(x, group_size, pow2=True)
    assert scales.shape == exponents.shape and scales.itemsize == 1
    assert_fp8_equal(out, q)
    np.testing.assert_array_equal(np.ascontiguousarray(scales).view(np.uint8), exponents)


@pytest.mark.parametrize("group_size", [64, 128])
@pytest.mark.parametrize("cols", [128 * 3, 128 * 4, 128 * 9])
def test_group_quant_packed_ue8m0(group_size, cols):
    x = make_input((6, cols), np.float32, seed=4)
    out, scales = fp8mla.quantize_fp8_per_token_group(x, group_size=group_size,
                                                      scale_layout="packed_ue8m0")
    q, _, exponents = ref.quantize_fp8_per_token_group(x, group_size, pow2=True)
    words = (cols // group_size + 3) // 4
    assert scales.dtype == np.int32 and scales.shape == (6, words)
    assert scales.strides == (4, 8 * 4)  # TMA-aligned column-major: (1, round_up(6, 4))
    assert_fp8_equal(out, q)
    np.testing.assert_array_equal(np.array(scales), ref.pack_ue8m0(exponents))


def test_group_quant_eps():
    x = np.zeros((2, 128), np.float32)
    x[1, :] = 1e-20
    out, scales = fp8mla.quantize_fp8_per_token_group(x, eps=1e-4)
    q, s, _ = ref.quantize_fp8_per_token_group(x, 128, eps=1e-4)
    assert_fp8_equal(out, q)
    np.testing.assert_array_equal(scales, s)


def test_group_quant_caller_scales_decide_layout():
    x = make_input((8, 256), np.float32, seed=5)
    # A column-major f32 buffer with padding, as the next GEMM expects for a padded batch.
    storage = np.full((2, 16), np.nan, np.float32)
    scales = storage[:, :8].T
    out = np.empty((8, 256), np.uint8)
    got_out, got_scales = fp8mla.quantize_fp8_per_token_group(x, out=out, scales=scales)
    assert got_out is out and got_scales is scales
    q, s, _ = ref.quantize_fp8_per_token_group(x, 128)
    assert_fp8_equal(out, q)
    np.testing.assert_array_equal(scales, s)
    assert np.all(np.isnan(storage[:, 8:]))  # nothing outside the view is touched

    # uint8 scales are UE8M0 exponents.
    ue = np.empty((8, 2), np.uint8)
    fp8mla.quantize_fp8_per_token_group(x, scales=ue)
    np.testing.assert_array_equal(ue, ref.quantize_fp8_per_token_group(x, 128, pow2=True)[2])


# ---- NVFP4 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(5, 64), (130, 48), (2, 3, 32), (1, 16)])
@pytest.mark.parametrize("layout", ["swizzled", "linear"])
@pytest.mark.parametrize("in_dtype", [np.float16, BF16], ids=["f16", "bf16"])
def test_nvfp4(shape, layout, in_dtype):
    x = make_input(shape, in_dtype, seed=6, spread=False) * in_dtype(3)
    global_scale = 448.0 * 6.0 / 20.0
    out, block_scales = fp8mla.quantize_nvfp4(x, global_scale, layout=layout)
    packed, sf = ref.quantize_nvfp4(x, global_scale, layout)
    assert out.dtype == np.uint8 and out.shape == packed.shape
    assert block_scales.dtype == E4M3 and block_scales.shape == sf.shape
    np.testing.assert_array_equal(out, packed)
    np.testing.assert_array_equal(fp8_bytes(block_scales), sf)


def test_nvfp4_global_scale_array_and_given_outputs():
    x = make_input((4, 64), BF16, seed=7, spread=False)
    out = np.empty((4, 32), np.uint8)
    block_scales = np.empty((128, 4), np.uint8)
    gs = np.array([100.0], np.float32)
    got_out, got_scales = fp8mla.quantize_nvfp4(x, gs, out=out, block_scales=block_scales)
    assert got_out is out and got_scales is block_scales
    packed, sf = ref.quantize_nvfp4(x, 100.0)
    np.testing.assert_array_equal(out, packed)
    np.testing.assert_array_equal(block_scales, sf)


# ---- caller-given outputs, strided and N-d inputs ----------------------------------------------


def test_caller_given_outputs():
    x = make_input((4, 256), BF16, seed=8)
    out = np.empty((4, 256), E4M3)
    assert fp8mla.quantize_fp8(x, 0.5, out=out) is out
    assert_fp8_equal(out, ref.quantize_fp8(x, 0.5))
    raw = np.empty((4, 256), np.uint8)  # raw bytes: `dtype` names the format
    assert fp8mla.quantize_fp8(x, 0.5, out=raw, dtype="e5m2") is raw
    assert_fp8_equal(raw, ref.quantize_fp8(x, 0.5, "e5m2"), "e5m2")
    scale = np.empty((1,), np.float32)
    got_out, got_scale = fp8mla.quantize_fp8_dynamic(x, out=out, scale=scale)
    assert got_out is out and got_scale is scale
    assert scale[0] == ref.quantize_fp8_dynamic(x)[1]


def test_output_row_stride():
    x = make_input((6, 128), np.float32, seed=9)
    storage = np.zeros((6, 256), np.uint8)
    out = storage[:, 64:192]
    fp8mla.quantize_fp8(x, 1.0, out=out)
    assert_fp8_equal(out, ref.quantize_fp8(x, 1.0))
    assert np.all(storage[:, :64] == 0) and np.all(storage[:, 192:] == 0)


@pytest.mark.parametrize("in_dtype", INPUT_DTYPES, ids=["f32", "f16", "bf16"])
def test_strided_input_last_dims(in_dtype):
    kv = make_input((5, 4, 256), in_dtype, seed=10)
    x = kv[..., 128:]  # [T, H, 128] folding onto row stride 256
    assert not x.flags.c_contiguous
    contiguous = np.ascontiguousarray(x)
    assert_fp8_equal(fp8mla.quantize_fp8(x, 1.5), ref.quantize_fp8(contiguous, 1.5))
    out, s = fp8mla.quantize_fp8_per_token_group(x, group_size=64)
    q, s_ref, _ = ref.quantize_fp8_per_token_group(contiguous, 64)
    assert_fp8_equal(out, q)
    np.testing.assert_array_equal(s, s_ref)
    if in_dtype != np.float32:
        out, bs = fp8mla.quantize_nvfp4(x, 50.0)
        packed, sf = ref.quantize_nvfp4(contiguous, 50.0)
        np.testing.assert_array_equal(out, packed)
        np.testing.assert_array_equal(fp8_bytes(bs), sf)


def test_readonly_input():
    x = make_input((3, 128), np.float32, seed=11)
    x.setflags(write=False)
    assert_fp8_equal(fp8mla.quantize_fp8(x, 1.0), ref.quantize_fp8(x, 1.0))


# ---- errors: fp8mla.Error with the C++ library's message ----------------------------------------


def test_error_wrong_input_dtype():
    x = np.zeros((4, 128), np.int32)
    with pytest.raises(fp8mla.Error) as info:
        fp8mla.quantize_fp8(x, 1.0)
    error = info.value
    assert isinstance(error, ValueError) and isinstance(error, fp8mla.InvalidArgumentError)
    assert error.category == "invalid-argument"
    assert error.message == "quantize_fp8: `input` dtype: expected one of {bf16, f16, f32}, got i32"
    assert error.message in str(error)


def test_error_dtype_without_fp8mla_type():
    with pytest.raises(fp8mla.InvalidArgumentError, match="float64 has no fp8mla dtype"):
        fp8mla.quantize_fp8(np.zeros((4, 128), np.float64), 1.0)
    with pytest.raises(fp8mla.Error, match="uint8 arrays need an explicit dtype"):
        fp8mla.quantize_fp8_dynamic(np.zeros((4, 128), np.float32),
                                    scale=np.zeros((1,), np.uint8))


def test_error_wrong_output_shape():
    with pytest.raises(fp8mla.Error, match="`out`: expected the shape of `input`"):
        fp8mla.quantize_fp8(np.zeros((4, 128), np.float32), 1.0, out=np.empty((4, 64), E4M3))


def test_error_wrong_output_dtype():
    with pytest.raises(fp8mla.Error, match=r"`out` dtype: expected e4m3fn, got e5m2"):
        fp8mla.quantize_fp8_per_token_group(np.zeros((4, 128), np.float32),
                                            out=np.empty((4, 128), E5M2))


def test_error_unsupported_group_size():
    with pytest.raises(fp8mla.UnsupportedError, match="expected group_size 64 or 128, got 96") as info:
        fp8mla.quantize_fp8_per_token_group(np.zeros((4, 192), np.float32), group_size=96)
    assert info.value.category == "unsupported"
    assert isinstance(info.value, fp8mla.Error) and not isinstance(info.value, ValueError)


def test_error_group_not_dividing():
    with pytest.raises(fp8mla.Error, match="multiple of group_size 128"):
        fp8mla.quantize_fp8_per_token_group(np.zeros((4, 192), np.float32))


def test_error_unfoldable_strides():
    x = make_input((4, 256), np.float32)[:, ::2]  # last-dim stride 2
    with pytest.raises(fp8mla.Error, match="`input`"):
        fp8mla.quantize_fp8(x, 1.0)


def test_error_scale_inv_not_scalar():
    with pytest.raises(fp8mla.Error, match="`scale_inv`: expected one f32"):
        fp8mla.quantize_fp8(np.zeros((4, 128), np.float32), np.ones((2,), np.float32))


def test_error_nvfp4():
    with pytest.raises(fp8mla.Error, match=r"`input` dtype: expected one of \{bf16, f16\}"):
        fp8mla.quantize_nvfp4(np.zeros((4, 64), np.float32), 1.0)
    with pytest.raises(fp8mla.Error, match="multiple of 16"):
        fp8mla.quantize_nvfp4(np.zeros((4, 40), np.float16), 1.0)
    with pytest.raises(fp8mla.Error, match="128x4 swizzled"):
        fp8mla.quantize_nvfp4(np.zeros((4, 64), np.float16), 1.0,
                              block_scales=np.empty((4, 4), np.uint8))


def test_error_bad_choices():
    x = np.zeros((4, 128), np.float32)
    with pytest.raises(fp8mla.InvalidArgumentError, match="dtype"):
        fp8mla.quantize_fp8(x, 1.0, dtype="e3m4")
    with pytest.raises(fp8mla.InvalidArgumentError, match="scale_layout"):
        fp8mla.quantize_fp8_per_token_group(x, scale_layout="diagonal")
    with pytest.raises(fp8mla.InvalidArgumentError, match="layout"):
        fp8mla.quantize_nvfp4(x.astype(np.float16), 1.0, layout="tiled")


def test_error_not_an_array():
    with pytest.raises(fp8mla.Error, match="expected an array"):
        fp8mla._C.quantize_fp8([1.0, 2.0], np.empty((2,), np.uint8), 1.0)
    with pytest.raises(TypeError, match="expected a numpy array, a torch tensor or an array "
                       "with __dlpack__ for the tensor arguments, got list"):
        fp8mla.quantize_fp8([1.0, 2.0], 1.0)
    with pytest.raises(TypeError, match="pass out explicitly"):  # an array, but not one to copy
        fp8mla.quantize_fp8(DLPackOnly(np.ones((2, 128), np.float32)), 1.0)
