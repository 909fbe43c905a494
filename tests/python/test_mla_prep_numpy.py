"""fp8mla's MLA prefill preparation ops on the CPU through numpy (+ ml_dtypes), against the numpy
references in mla_prep_reference.py: RoPE within one e4m3 rounding of a float64 reference, the
latent-cache ops byte for byte; strided inputs, caller-given outputs, slot -1, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
import fp8mla  # noqa: E402
import mla_prep_reference as ref  # noqa: E402
from dlpack_only import DLPackOnly  # noqa: E402

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
IN_DTYPES = [BF16, np.float16]
IDS = ["bf16", "f16"]
DEEPSEEK_V3_ROPE_SCALING = {  # config.json of DeepSeek-V3 / R1, as it is
    "beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096, "type": "yarn",
}


def rand(shape, dtype, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(scale)
    x *= np.exp2(rng.integers(-3, 4, size=shape)).astype(np.float32)
    return x.astype(dtype)


def u8(a) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


def random_cache(num_pages, page_size, seed, page_stride=None):
    """e4m3 cache filled with random non-NaN bytes (a view into padded storage when page_stride)."""
    rng = np.random.default_rng(seed)
    width = page_stride if page_stride else page_size * ref.LATENT
    storage = rng.integers(0, 0x7F, size=(num_pages, width), dtype=np.uint8)
    storage |= rng.integers(0, 2, size=storage.shape, dtype=np.uint8) << 7
    cache = storage[:, : page_size * ref.LATENT].reshape(num_pages, page_size, ref.LATENT)
    return storage, cache.view(E4M3)


# ---- cos/sin cache and softmax mscale --------------------------------------------------------------


@pytest.mark.parametrize("yarn", [None, {}, DEEPSEEK_V3_ROPE_SCALING,
                                  {"factor": 4.0, "original_max_position": 2048, "mscale": 0.707,
                                   "mscale_all_dim": 0.5},
                                  {"factor": 8.0, "mscale": 0.707},
                                  {"factor": 8.0, "mscale_all_dim": 0.5}],
                         ids=["plain", "yarn-defaults", "deepseek-v3-config", "yarn-other",
                              "mscale-only", "mscale-all-dim-only"])
def test_cos_sin_cache(yarn):
    max_pos = 5000
    table = fp8mla.make_cos_sin_cache(max_pos, yarn=yarn)
    assert isinstance(table, np.ndarray) and table.dtype == np.float32
    assert table.shape == (max_pos, 64)
    expected = ref.cos_sin_cache(max_pos, yarn=None if yarn is None else {
        ("original_max_position" if k == "original_max_position_embeddings" else k): v
        for k, v in yarn.items() if k != "type"})
    # Computed in double and rounded once: within an f32 rounding (angles up to 5000 rad lose a
    # few more bits to the argument reduction of different libm's).
    np.testing.assert_allclose(table, expected, rtol=0, atol=4e-7)


def test_cos_sin_cache_options_and_out():
    table = fp8mla.make_cos_sin_cache(7, rope_dim=16, theta=500000.0)
    np.testing.assert_allclose(table, ref.cos_sin_cache(7, 16, 500000.0), rtol=0, atol=1e-7)
    storage = np.full((7, 20), np.nan, np.float32)
    out = storage[:, 2:18]
    assert fp8mla.make_cos_sin_cache(7, rope_dim=16, theta=500000.0, out=out) is out
    np.testing.assert_array_equal(out, table)
    assert np.isnan(storage[:, :2]).all() and np.isnan(storage[:, 18:]).all()
    assert fp8mla.make_cos_sin_cache(0).shape == (0, 64)
    # device="cpu": a torch tensor where torch is installed, numpy otherwise; the same values.
    on_cpu = np.asarray(fp8mla.make_cos_sin_cache(3, device="cpu"))
    np.testing.assert_array_equal(on_cpu, fp8mla.make_cos_sin_cache(3))


def test_cos_sin_cache_errors():
    with pytest.raises(fp8mla.InvalidArgumentError, match="even, positive rope_dim"):
        fp8mla.make_cos_sin_cache(4, rope_dim=7)
    with pytest.raises(fp8mla.InvalidArgumentError, match="theta > 1"):
        fp8mla.make_cos_sin_cache(4, theta=1.0)
    with pytest.raises(fp8mla.InvalidArgumentError, match="unknown yarn key 'alpha'"):
        fp8mla.make_cos_sin_cache(4, yarn={"alpha": 1.0})
    with pytest.raises(fp8mla.InvalidArgumentError, match="expected 'yarn' or 'default', got 'linear'"):
        fp8mla.make_cos_sin_cache(4, yarn={"type": "linear", "factor": 2.0})
    with pytest.raises(fp8mla.InvalidArgumentError, match="original_max_position.*integer"):
        fp8mla.make_cos_sin_cache(4, yarn={"original_max_position": 10.5})
    with pytest.raises(fp8mla.InvalidArgumentError, match="yarn: expected a finite factor"):
        fp8mla.make_cos_sin_cache(4, yarn={"factor": -1.0})
    with pytest.raises(fp8mla.InvalidArgumentError, match="expected 4 rows"):
        fp8mla.make_cos_sin_cache(4, out=np.empty((5, 64), np.float32))
    with pytest.raises(fp8mla.InvalidArgumentError, match="`cos_sin` dtype"):
        fp8mla.make_cos_sin_cache(4, out=np.empty((4, 64), np.float16))
    with pytest.raises(fp8mla.InvalidArgumentError, match="`cos_sin`"):
        fp8mla.make_cos_sin_cache(4, out=np.empty((4, 32), np.float32))


# transformers 5 keeps a model's RoPE in config.rope_parameters, rope_theta and rope_type inside.
DEEPSEEK_V3_ROPE_PARAMETERS = {
    "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
    "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
    "mscale_all_dim": 1.0}


def test_cos_sin_cache_takes_rope_parameters():
    want = fp8mla.make_cos_sin_cache(3000, yarn=DEEPSEEK_V3_ROPE_SCALING)
    got = fp8mla.make_cos_sin_cache(3000, yarn=DEEPSEEK_V3_ROPE_PARAMETERS)
    assert got.tobytes() == want.tobytes()
    # The keys the table computes or fixes are checked against it, never ignored.
    ok = dict(DEEPSEEK_V3_ROPE_PARAMETERS, attention_factor=1.0, truncate=True,
              partial_rotary_factor=1.0)
    assert fp8mla.make_cos_sin_cache(3000, yarn=ok).tobytes() == want.tobytes()
    scaled = {"rope_type": "yarn", "factor": 8.0, "mscale": 0.707, "mscale_all_dim": 0.5}
    ratio = (0.1 * 0.707 * math.log(8) + 1) / (0.1 * 0.5 * math.log(8) + 1)
    assert fp8mla.make_cos_sin_cache(64, yarn=dict(scaled, attention_factor=ratio)).tobytes() == \
        fp8mla.make_cos_sin_cache(64, yarn=scaled).tobytes()
    # Another base: the dict's rope_theta must be the op's theta.
    kimi = dict(DEEPSEEK_V3_ROPE_PARAMETERS, rope_theta=50000.0, factor=32.0)
    with pytest.raises(fp8mla.InvalidArgumentError, match=r"rope_theta'\] is 50000.0 but theta is "
                       r"10000.0: pass theta=50000.0"):
        fp8mla.make_cos_sin_cache(64, yarn=kimi)
    without_theta = {k: v for k, v in kimi.items() if k != "rope_theta"}
    assert fp8mla.make_cos_sin_cache(64, theta=50000.0, yarn=kimi).tobytes() == \
        fp8mla.make_cos_sin_cache(64, theta=50000.0, yarn=without_theta).tobytes()
    # Plain RoPE as rope_parameters.
    plain = {"rope_type": "default", "rope_theta": 10000.0}
    assert fp8mla.make_cos_sin_cache(64, yarn=plain).tobytes() == \
        fp8mla.make_cos_sin_cache(64).tobytes()
    # What the table cannot give is an error naming the key.
    for bad, message in [
            ({"attention_factor": 1.25}, r"attention_factor'\]: expected 1.0"),
            ({"truncate": False}, r"truncate'\]: expected True"),
            ({"partial_rotary_factor": 0.5}, r"partial_rotary_factor'\]: expected 1.0"),
            ({"rope_type": "default", "factor": 40.0}, r"rope_type 'default' \(plain RoPE\) with "
                                                        r"YaRN keys \['factor'\]"),
            ({"rope_type": "default", "partial_rotary_factor": 0.5}, "partial_rotary_factor")]:
        with pytest.raises(fp8mla.InvalidArgumentError, match=message):
            fp8mla.make_cos_sin_cache(64, yarn=dict(DEEPSEEK_V3_ROPE_PARAMETERS, **bad)
                                      if "rope_type" not in bad else dict(bad, rope_theta=1e4))


@pytest.mark.parametrize("keys", [{}, {"mscale": 0.707}, {"mscale_all_dim": 0.707},
                                  {"mscale": 0.0, "mscale_all_dim": 1.0},
                                  {"mscale": 1.0, "mscale_all_dim": 0.707},
                                  {"mscale": 0.707, "mscale_all_dim": 0.707}])
def test_yarn_dict_reads_as_the_config_loader_does(keys):
    """A config's rope_scaling passed to the ops as it is gives the table and softmax scale of the
    same config read by mla_config (transformers' rule for the mscale keys it leaves out)."""
    rope_scaling = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                    **keys}
    config = fp8mla.mla_config({
        "model_type": "deepseek_v3", "hidden_size": 256, "num_attention_heads": 2,
        "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6, "rope_theta": 10000, "rope_scaling": rope_scaling})
    table = fp8mla.make_cos_sin_cache(64, yarn=rope_scaling)
    assert table.tobytes() == fp8mla.make_cos_sin_cache(64, yarn=config.yarn).tobytes()
    mscale = fp8mla.softmax_mscale(yarn=rope_scaling)
    assert mscale * mscale / math.sqrt(192) == pytest.approx(config.softmax_scale, rel=1e-12)
    np.testing.assert_allclose(table, ref.cos_sin_cache(64, yarn={
        ("original_max_position" if k == "original_max_position_embeddings" else k): v
        for k, v in rope_scaling.items() if k != "type"}), rtol=0, atol=4e-7)


def test_softmax_mscale():
    assert fp8mla.softmax_mscale() == 1.0
    assert fp8mla.softmax_mscale(yarn=None) == 1.0
    expected = 0.1 * math.log(40) + 1
    # Without mscale_all_dim (transformers reads a missing one as 0) the softmax keeps its scale.
    assert fp8mla.softmax_mscale(yarn={}) == 1.0
    assert fp8mla.softmax_mscale(yarn={"mscale_all_dim": 1.0}) == pytest.approx(expected,
                                                                                rel=1e-15)
    assert fp8mla.softmax_mscale(yarn=DEEPSEEK_V3_ROPE_SCALING) == pytest.approx(expected, rel=1e-15)
    assert fp8mla.softmax_mscale(yarn=DEEPSEEK_V3_ROPE_PARAMETERS) == \
        fp8mla.softmax_mscale(yarn=DEEPSEEK_V3_ROPE_SCALING)
    got = fp8mla.softmax_mscale(yarn={"factor": 8.0, "mscale_all_dim": 0.5})
    assert got == pytest.approx(0.05 * math.log(8) + 1, rel=1e-15)
    assert fp8mla.softmax_mscale(yarn={"factor": 1.0}) == 1.0
    assert isinstance(got, float)


# ---- mla_rope_quantize_fp8 ---------------------------------------------------------------------


def rope_inputs(tokens, heads, dtype, seed=0, max_pos=64):
    """Strided views as an engine has them: q = [T, H, 192] split into nope | pe, the compressed
    kv [T, 576] split into kv_c | k_pe, k_nope a slice of kv_b_proj's [T, H, 256] output."""
    q = rand((tokens, heads, ref.QK), dtype, seed)
    ckv = rand((tokens, ref.LATENT), dtype, seed + 1)
    kv = rand((tokens, heads, 256), dtype, seed + 2)
    positions = np.random.default_rng(seed + 3).integers(0, max_pos, size=tokens).astype(np.int32)
    return dict(q_nope=q[..., :128], q_pe=q[..., 128:], k_nope=kv[..., :128],
                k_pe=ckv[:, 512:], kv_c=ckv[:, :512], positions=positions)


def check_rope_outputs(inp, cos_sin, q_out, k_out, style, q_scale_inv, k_scale_inv):
    np.testing.assert_array_equal(u8(q_out[..., :128]), ref.quantize(inp["q_nope"], q_scale_inv))
    np.testing.assert_array_equal(u8(k_out[..., :128]), ref.quantize(inp["k_nope"], k_scale_inv))
    q_rope, q_bound = ref.rope(inp["q_pe"], inp["positions"], cos_sin, style)
    ref.assert_e4m3_near(q_out[..., 128:], q_rope, q_bound, q_scale_inv)
    k_rope, k_bound = ref.rope(np.asarray(inp["k_pe"]).reshape(-1, 64), inp["positions"], cos_sin,
                               style)
    heads = q_out.shape[1]
    for h in range(heads):
        ref.assert_e4m3_near(k_out[:, h, 128:], k_rope, k_bound, k_scale_inv)
        # k_pe is RoPE'd once per token: every head carries the same bytes.
        np.testing.assert_array_equal(u8(k_out[:, h, 128:]), u8(k_out[:, 0, 128:]))


@pytest.mark.parametrize("dtype", IN_DTYPES, ids=IDS)
@pytest.mark.parametrize("style", ["interleaved", "neox"])
@pytest.mark.parametrize("tokens,heads", [(1, 1), (37, 16), (5, 128)])
def test_rope_quantize(dtype, style, tokens, heads):
    cos_sin = fp8mla.make_cos_sin_cache(64, yarn=DEEPSEEK_V3_ROPE_SCALING)
    inp = rope_inputs(tokens, heads, dtype, seed=tokens)
    assert tokens * heads == 1 or not inp["q_nope"].flags.c_contiguous
    q_out, k_out = fp8mla.mla_rope_quantize_fp8(
        inp["q_nope"], inp["q_pe"], inp["k_nope"], inp["k_pe"], inp["positions"], cos_sin,
        style=style, q_scale_inv=2.0, k_scale_inv=0.25)
    assert q_out.dtype == E4M3 and q_out.shape == (tokens, heads, 192)
    assert k_out.dtype == E4M3 and k_out.shape == (tokens, heads, 192)
    check_rope_outputs(inp, cos_sin, q_out, k_out, style, 2.0, 0.25)


def test_rope_style_differs_and_position_zero_is_identity():
    cos_sin = fp8mla.make_cos_sin_cache(8)
    inp = rope_inputs(4, 2, BF16, seed=5, max_pos=8)
    args = [inp[k] for k in ("q_nope", "q_pe", "k_nope", "k_pe")]
    q_i, _ = fp8mla.mla_rope_quantize_fp8(*args, inp["positions"], cos_sin, style="interleaved")
    q_n, _ = fp8mla.mla_rope_quantize_fp8(*args, inp["positions"], cos_sin, style="neox")
    assert not np.array_equal(u8(q_i), u8(q_n))
    zero = np.zeros(4, np.int64)  # i64 positions; cos 1, sin 0: plain quantization
    q0, k0 = fp8mla.mla_rope_quantize_fp8(*args, zero, cos_sin)
    np.testing.assert_array_equal(u8(q0[..., 128:]), ref.quantize(inp["q_pe"], 1.0))
    np.testing.assert_array_equal(u8(k0[:, 0, 128:]), ref.quantize(inp["k_pe"], 1.0))


@pytest.mark.parametrize("dtype", IN_DTYPES, ids=IDS)
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_rope_quantize_with_cache_write(dtype, page_size):
    tokens, heads = 23, 4
    cos_sin = fp8mla.make_cos_sin_cache(64, yarn={})
    inp = rope_inputs(tokens, heads, dtype, seed=7)
    num_pages = (2 * tokens + page_size - 1) // page_size
    storage, cache = random_cache(num_pages, page_size, seed=8)
    before = u8(cache).copy()
    rng = np.random.default_rng(9)
    slots = rng.permutation(num_pages * page_size)[:tokens].astype(np.int64)
    slots[3] = -1
    flag = np.zeros((1,), np.int32)
    q_out, k_out = fp8mla.mla_rope_quantize_fp8(
        inp["q_nope"], inp["q_pe"], inp["k_nope"], inp["k_pe"], inp["positions"], cos_sin,
        q_scale_inv=0.5, k_scale_inv=4.0, kv_c=inp["kv_c"], cache=cache, slot_mapping=slots,
        cache_scale_inv=4.0, error_flag=flag)
    check_rope_outputs(inp, cos_sin, q_out, k_out, "interleaved", 0.5, 4.0)
    assert flag[0] == 0
    after = u8(cache)
    expected = before.copy()
    kv_c_bytes = ref.quantize(inp["kv_c"], 4.0)
    for t, s in enumerate(slots):
        if s == -1:
            continue
        row = ref.slot_row(expected, int(s))
        row[:512] = kv_c_bytes[t]
        # The cache's RoPE part is rounded once from fp32 like k_out's: same scale, same bytes.
        row[512:] = u8(k_out[t, 0, 128:])
    np.testing.assert_array_equal(after, expected)


def test_rope_quantize_caller_outputs():
    tokens, heads = 6, 3
    cos_sin = fp8mla.make_cos_sin_cache(64)
    inp = rope_inputs(tokens, heads, BF16, seed=11)
    # One [T, 2, H, 192] buffer holding q_out and k_out: token stride 2 * H * 192.
    buffer = np.zeros((tokens, 2, heads, 192), np.uint8)
    q_out, k_out = buffer[:, 0], buffer[:, 1]
    got_q, got_k = fp8mla.mla_rope_quantize_fp8(
        inp["q_nope"], inp["q_pe"], inp["k_nope"], inp["k_pe"][:, None, :], inp["positions"],
        cos_sin, q_out=q_out, k_out=k_out)
    assert got_q is q_out and got_k is k_out
    check_rope_outputs(inp, cos_sin, q_out, k_out, "interleaved", 1.0, 1.0)


def test_rope_quantize_empty():
    cos_sin = fp8mla.make_cos_sin_cache(4)
    z = np.zeros((0, 2, 128), BF16)
    q, k = fp8mla.mla_rope_quantize_fp8(z, np.zeros((0, 2, 64), BF16), z, np.zeros((0, 64), BF16),
                                        np.zeros(0, np.int32), cos_sin)
    assert q.shape == (0, 2, 192) and k.shape == (0, 2, 192)


def test_rope_quantize_errors():
    cos_sin = fp8mla.make_cos_sin_cache(16)
    inp = rope_inputs(4, 2, BF16, seed=12, max_pos=16)
    args = [inp[k] for k in ("q_nope", "q_pe", "k_nope", "k_pe")]
    q_out = np.zeros((4, 2, 192), np.uint8)
    k_out = np.zeros((4, 2, 192), np.uint8)

    bad = inp["positions"].copy()
    bad[2] = 16
    with pytest.raises(fp8mla.InvalidArgumentError) as info:
        fp8mla.mla_rope_quantize_fp8(*args, bad, cos_sin, q_out=q_out, k_out=k_out)
    assert info.value.category == "out-of-range"
    assert "`positions`[2] = 16 is outside the cos_sin cache [0, 16)" in info.value.message
    assert not q_out.any() and not k_out.any()  # nothing written

    _, cache = random_cache(2, 4, seed=13)
    before = u8(cache).copy()
    slots = np.array([0, 1, 8, 2], np.int32)
    with pytest.raises(fp8mla.InvalidArgumentError, match=r"`slot_mapping`\[2\] = 8 is outside"):
        fp8mla.mla_rope_quantize_fp8(*args, inp["positions"], cos_sin, q_out=q_out, k_out=k_out,
                                     kv_c=inp["kv_c"], cache=cache, slot_mapping=slots)
    np.testing.assert_array_equal(u8(cache), before)
    assert not q_out.any()

    with pytest.raises(fp8mla.InvalidArgumentError, match="`q_pe` dtype: expected bf16, got f16"):
        fp8mla.mla_rope_quantize_fp8(args[0], args[1].astype(np.float16), *args[2:],
                                     inp["positions"], cos_sin)
    with pytest.raises(fp8mla.InvalidArgumentError, match="`q_nope`: expected"):
        fp8mla.mla_rope_quantize_fp8(args[0][..., :64], *args[1:], inp["positions"], cos_sin)
    with pytest.raises(fp8mla.InvalidArgumentError, match="`cos_sin`: expected"):
        fp8mla.mla_rope_quantize_fp8(*args, inp["positions"], fp8mla.make_cos_sin_cache(16, rope_dim=32))
    with pytest.raises(fp8mla.InvalidArgumentError, match="`positions` dtype"):
        fp8mla.mla_rope_quantize_fp8(*args, inp["positions"].astype(np.float32), cos_sin)
    with pytest.raises(fp8mla.InvalidArgumentError, match="`k_out`"):
        fp8mla.mla_rope_quantize_fp8(*args, inp["positions"], cos_sin,
                                     k_out=np.zeros((4, 2, 128), np.uint8))
    with pytest.raises(fp8mla.InvalidArgumentError, match="style 'interleaved' or 'neox'"):
        fp8mla.mla_rope_quantize_fp8(*args, inp["positions"], cos_sin, style="gptj")
    with pytest.raises(fp8mla.InvalidArgumentError, match="pass `cache` too"):
        fp8mla.mla_rope_quantize_fp8(*args, inp["positions"], cos_sin, slot_mapping=slots)
    with pytest.raises(fp8mla.InvalidArgumentError, match="`kv_c`: required"):
        fp8mla.mla_rope_quantize_fp8(*args, inp["positions"], cos_sin, cache=cache,
                                     slot_mapping=slots)
    with pytest.raises(fp8mla.InvalidArgumentError, match="`error_flag`"):
        fp8mla.mla_rope_quantize_fp8(*args, inp["positions"], cos_sin, kv_c=inp["kv_c"],
                                     cache=cache, slot_mapping=np.arange(4, dtype=np.int32),
                                     error_flag=np.zeros((1,), np.int64))


# ---- mla_kv_cache_write / mla_kv_gather --------------------------------------------------------


@pytest.mark.parametrize("dtype", IN_DTYPES, ids=IDS)
@pytest.mark.parametrize("page_size", [1, 5, 64, 128])
@pytest.mark.parametrize("slot_dtype", [np.int32, np.int64])
def test_kv_cache_write_and_gather(dtype, page_size, slot_dtype):
    tokens, num_pages = 40, 3 + 80 // page_size
    ckv = rand((tokens, ref.LATENT), dtype, seed=page_size, scale=30.0)
    kv_c, k_pe = ckv[:, :512], ckv[:, 512:]  # strided views of the compressed kv
    # Pages padded apart (a page stride larger than page_size * 576).
    storage, cache = random_cache(num_pages, page_size, seed=1, page_stride=page_size * 576 + 64)
    before = storage.copy()
    rng = np.random.default_rng(2)
    slots = rng.permutation(num_pages * page_size)[:tokens].astype(slot_dtype)
    slots[[0, 17]] = -1
    assert fp8mla.mla_kv_cache_write(kv_c, k_pe, cache, slots, scale_inv=0.125) is None

    rows = ref.latent_rows(kv_c, k_pe, 0.125)
    expected = before.copy()
    exp_cache = expected[:, : page_size * 576].reshape(num_pages, page_size, 576)
    for t, s in enumerate(slots):
        if s != -1:
            ref.slot_row(exp_cache, int(s))[:] = rows[t]
    np.testing.assert_array_equal(storage, expected)  # incl. untouched slots and page padding

    written = slots[slots != -1]
    kv_out, pe_out = fp8mla.mla_kv_gather(cache, written, 8.0)
    assert kv_out.dtype == BF16 and kv_out.shape == (len(written), 512)
    assert pe_out.dtype == BF16 and pe_out.shape == (len(written), 64)
    gathered = np.stack([ref.slot_row(exp_cache, int(s)) for s in written])
    np.testing.assert_array_equal(kv_out.view(np.uint16), ref.dequantize_bf16(gathered[:, :512], 8.0))
    np.testing.assert_array_equal(pe_out.view(np.uint16), ref.dequantize_bf16(gathered[:, 512:], 8.0))


def test_kv_gather_random_bytes_and_caller_outputs():
    _, cache = random_cache(4, 16, seed=3)
    slots = np.array([63, 0, 5, 5, 17], np.int32)
    kv_buf = np.zeros((5, 600), np.uint16)  # raw bf16 bits, row stride 600
    pe_out = np.empty((5, 1, 64), BF16)
    kv_out = kv_buf[:, 8:520]
    flag = np.zeros((), np.int32)
    got_kv, got_pe = fp8mla.mla_kv_gather(cache, slots, 0.75, kv_c_out=kv_out, k_pe_out=pe_out,
                                          error_flag=flag)
    assert got_kv is kv_out and got_pe is pe_out
    rows = np.stack([ref.slot_row(u8(cache), int(s)) for s in slots])
    np.testing.assert_array_equal(kv_out, ref.dequantize_bf16(rows[:, :512], 0.75))
    np.testing.assert_array_equal(pe_out.reshape(5, 64).view(np.uint16),
                                  ref.dequantize_bf16(rows[:, 512:], 0.75))
    assert not kv_buf[:, :8].any() and not kv_buf[:, 520:].any()
    assert flag == 0


def test_kv_cache_write_k_pe_3d_and_empty():
    kv_c = rand((3, 512), BF16, seed=4)
    k_pe = rand((3, 1, 64), BF16, seed=5)
    cache = np.zeros((1, 4, 576), np.uint8)  # raw bytes
    fp8mla.mla_kv_cache_write(kv_c, k_pe, cache, np.array([3, 0, 1]), error_flag=np.zeros(1, np.int32))
    rows = ref.latent_rows(kv_c, k_pe, 1.0)
    np.testing.assert_array_equal(cache[0, [3, 0, 1]], rows)
    assert not cache[0, 2].any()
    fp8mla.mla_kv_cache_write(np.zeros((0, 512), BF16), np.zeros((0, 64), BF16), cache,
                              np.zeros(0, np.int32))
    kv, pe = fp8mla.mla_kv_gather(cache, np.zeros(0, np.int64), 1.0)
    assert kv.shape == (0, 512) and pe.shape == (0, 64)


def test_kv_cache_errors():
    kv_c = rand((4, 512), BF16, seed=6)
    k_pe = rand((4, 64), BF16, seed=7)
    _, cache = random_cache(2, 4, seed=8)
    before = u8(cache).copy()
    with pytest.raises(fp8mla.InvalidArgumentError) as info:
        fp8mla.mla_kv_cache_write(kv_c, k_pe, cache, np.array([0, 1, 8, 2]))
    assert info.value.category == "out-of-range"
    assert "`slot_mapping`[2] = 8 is outside the cache's slots [0, 8)" in info.value.message
    with pytest.raises(fp8mla.InvalidArgumentError, match=r"`slot_mapping`\[0\] = -2"):
        fp8mla.mla_kv_cache_write(kv_c, k_pe, cache, np.array([-2, 1, 3, 2]))
    np.testing.assert_array_equal(u8(cache), before)  # nothing written

    with pytest.raises(fp8mla.InvalidArgumentError, match=r"`slots`\[1\] = -1 is outside"):
        fp8mla.mla_kv_gather(cache, np.array([0, -1]), 1.0)  # -1 skips writes, not gathers
    with pytest.raises(fp8mla.InvalidArgumentError, match="`k_pe` dtype: expected bf16, got f16"):
        fp8mla.mla_kv_cache_write(kv_c, k_pe.astype(np.float16), cache, np.arange(4))
    with pytest.raises(fp8mla.InvalidArgumentError, match="`slot_mapping`: expected \\[4\\]"):
        fp8mla.mla_kv_cache_write(kv_c, k_pe, cache, np.arange(3))
    with pytest.raises(fp8mla.InvalidArgumentError, match="`cache`: expected the latent width 576"):
        fp8mla.mla_kv_cache_write(kv_c, k_pe, np.zeros((2, 4, 512), E4M3), np.arange(4))
    with pytest.raises(fp8mla.UnsupportedError, match="page size"):
        fp8mla.mla_kv_cache_write(kv_c, k_pe, np.zeros((1, 129, 576), E4M3), np.arange(4))
    with pytest.raises(fp8mla.InvalidArgumentError, match="`cache` dtype"):
        fp8mla.mla_kv_cache_write(kv_c, k_pe, np.zeros((2, 4, 576), BF16), np.arange(4))
    with pytest.raises(fp8mla.InvalidArgumentError, match="`kv_c_out` dtype"):
        fp8mla.mla_kv_gather(cache, np.arange(2), 1.0, kv_c_out=np.zeros((2, 512), np.float16))
    with pytest.raises(fp8mla.InvalidArgumentError, match="`error_flag`: expected one i32"):
        fp8mla.mla_kv_gather(cache, np.arange(2), 1.0, error_flag=np.zeros(2, np.int32))


def test_rope_quantize_split_k_gives_the_bytes_of_every_head():
    """k_rope_out: k_out holds k_nope's 128 dims, k_rope_out the RoPE part once per token, the
    bytes every head's k_out[..., 128:] holds without it."""
    cos_sin = fp8mla.make_cos_sin_cache(64, yarn=DEEPSEEK_V3_ROPE_SCALING)
    inp = rope_inputs(37, 16, BF16, seed=5)
    args = (inp["q_nope"], inp["q_pe"], inp["k_nope"], inp["k_pe"], inp["positions"], cos_sin)
    q_whole, k_whole = fp8mla.mla_rope_quantize_fp8(*args, k_scale_inv=0.25)
    for k_rope_out in (np.zeros((37, 64), E4M3), np.zeros((37, 1, 80), E4M3)[..., :64]):
        q_out, k_out = fp8mla.mla_rope_quantize_fp8(*args, k_scale_inv=0.25,
                                                    k_rope_out=k_rope_out)
        assert k_out.shape == (37, 16, 128)
        np.testing.assert_array_equal(u8(q_out), u8(q_whole))
        np.testing.assert_array_equal(u8(k_out), u8(k_whole[..., :128]))
        np.testing.assert_array_equal(u8(k_rope_out).reshape(37, 64), u8(k_whole[:, 0, 128:]))
    with pytest.raises(fp8mla.InvalidArgumentError, match="`k_out`"):
        fp8mla.mla_rope_quantize_fp8(*args, k_out=np.zeros((37, 16, 192), E4M3),
                                     k_rope_out=np.zeros((37, 64), E4M3))


# ---- mla_kv_pack_quantize_fp8 ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", IN_DTYPES, ids=IDS)
@pytest.mark.parametrize("n,heads", [(1, 1), (33, 16), (130, 8)])
def test_kv_pack(dtype, n, heads):
    kv = rand((n, heads, 256), dtype, seed=n, scale=100.0)  # kv_b_proj output: [k_nope | v]
    k_nope, v = kv[..., :128], kv[..., 128:]
    k_pe = rand((n, ref.LATENT), dtype, seed=n + 1)[:, 512:]
    k_out, v_out = fp8mla.mla_kv_pack_quantize_fp8(k_nope, k_pe, v, k_scale_inv=0.5,
                                                   v_scale_inv=3.0)
    assert k_out.dtype == E4M3 and k_out.shape == (n, heads, 192)
    assert v_out.dtype == E4M3 and v_out.shape == (n, heads, 128)
    k_exp, v_exp = ref.pack(k_nope, k_pe, v, 0.5, 3.0)
    np.testing.assert_array_equal(u8(k_out), k_exp)
    np.testing.assert_array_equal(u8(v_out), v_exp)


def test_kv_pack_split_k_gives_the_bytes_of_every_head():
    kv = rand((33, 16, 256), BF16, seed=3, scale=100.0)
    k_pe = rand((33, ref.LATENT), BF16, seed=4)[:, 512:]
    k_whole, v_whole = fp8mla.mla_kv_pack_quantize_fp8(kv[..., :128], k_pe, kv[..., 128:],
                                                       k_scale_inv=0.5)
    k_rope_out = np.zeros((33, 64), E4M3)
    k_out, v_out = fp8mla.mla_kv_pack_quantize_fp8(kv[..., :128], k_pe, kv[..., 128:],
                                                   k_scale_inv=0.5, k_rope_out=k_rope_out)
    assert k_out.shape == (33, 16, 128)
    np.testing.assert_array_equal(u8(k_out), u8(k_whole[..., :128]))
    np.testing.assert_array_equal(u8(v_out), u8(v_whole))
    np.testing.assert_array_equal(u8(k_rope_out), u8(k_whole[:, 0, 128:]))


def test_kv_pack_caller_outputs_and_errors():
    k_nope = rand((4, 2, 128), BF16, seed=20)
    k_pe = rand((4, 1, 64), BF16, seed=21)
    v = rand((4, 2, 128), BF16, seed=22)
    buffer = np.zeros((4, 2, 320), np.uint8)
    k_out, v_out = buffer[..., :192], buffer[..., 192:]
    got_k, got_v = fp8mla.mla_kv_pack_quantize_fp8(k_nope, k_pe, v, k_out=k_out, v_out=v_out)
    assert got_k is k_out and got_v is v_out
    k_exp, v_exp = ref.pack(k_nope, k_pe, v, 1.0, 1.0)
    np.testing.assert_array_equal(k_out, k_exp)
    np.testing.assert_array_equal(v_out, v_exp)
    k, vv = fp8mla.mla_kv_pack_quantize_fp8(np.zeros((0, 2, 128), BF16), np.zeros((0, 64), BF16),
                                            np.zeros((0, 2, 128), BF16))
    assert k.shape == (0, 2, 192) and vv.shape == (0, 2, 128)

    with pytest.raises(fp8mla.InvalidArgumentError, match="`v` dtype: expected bf16, got f16"):
        fp8mla.mla_kv_pack_quantize_fp8(k_nope, k_pe, v.astype(np.float16))
    with pytest.raises(fp8mla.InvalidArgumentError, match="`v`: expected 4 tokens like `k_nope`"):
        fp8mla.mla_kv_pack_quantize_fp8(k_nope, k_pe, v[:3])
    with pytest.raises(fp8mla.InvalidArgumentError, match="`k_pe`: expected"):
        fp8mla.mla_kv_pack_quantize_fp8(k_nope, rand((4, 2, 64), BF16, seed=1), v)
    with pytest.raises(fp8mla.InvalidArgumentError, match="`k_nope`: expected a contiguous last dim"):
        fp8mla.mla_kv_pack_quantize_fp8(rand((4, 2, 256), BF16, seed=2)[..., ::2], k_pe, v)
    with pytest.raises(fp8mla.InvalidArgumentError, match="`k_out` dtype"):
        fp8mla.mla_kv_pack_quantize_fp8(k_nope, k_pe, v, k_out=np.zeros((4, 2, 192), BF16))


# ---- mla_v_quantize_fp8 ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", IN_DTYPES, ids=IDS)
@pytest.mark.parametrize("v_layout", ["token_major", "transposed"])
@pytest.mark.parametrize("heads", [1, 16])
@pytest.mark.parametrize("n", [0, 1, 5, 64, 130])
def test_v_quantize_matches_pack(dtype, v_layout, heads, n):
    kv = rand((n, heads, 256), dtype, seed=n + heads, scale=100.0)  # strided v, as in kv_b_proj's
    v = kv[..., 128:]
    k_pe = rand((n, 64), dtype, seed=n + 1)
    _, v_pack = fp8mla.mla_kv_pack_quantize_fp8(kv[..., :128], k_pe, v, k_scale_inv=0.5,
                                                v_scale_inv=3.0, v_layout=v_layout)
    v_out = fp8mla.mla_v_quantize_fp8(v, v_scale_inv=3.0, v_layout=v_layout)
    assert v_out.dtype == E4M3 and v_out.shape == (n, heads, 128)
    if v_layout == "transposed" and n > 1:
        # [H][128][pitch] memory, pitch as C++'s transposed_v_pitch: n rounded up to 16, >= 16
        assert v_out.strides[0] == 1 and v_out.base.shape[2] == max(16, -(-n // 16) * 16)
    np.testing.assert_array_equal(u8(v_out), u8(v_pack))
    np.testing.assert_array_equal(u8(v_out), ref.quantize(v, 3.0))


def test_v_quantize_caller_output_and_errors():
    v = rand((5, 2, 128), BF16, seed=30)
    storage = np.zeros((2, 128, 32), np.uint8)  # transposed, pitch 32, as raw bytes
    v_out = storage[:, :, :5].transpose(2, 0, 1)
    assert fp8mla.mla_v_quantize_fp8(v, v_out=v_out, v_layout="transposed") is v_out
    np.testing.assert_array_equal(u8(v_out), ref.quantize(v, 1.0))
    assert not storage[:, :, 5:].any()  # the pitch padding stays untouched

    bad_dtype = r"mla_v_quantize_fp8: `v` dtype: expected one of \{bf16, f16\}, got f32"
    with pytest.raises(fp8mla.InvalidArgumentError, match=bad_dtype):
        fp8mla.mla_v_quantize_fp8(v.astype(np.float32))
    with pytest.raises(fp8mla.InvalidArgumentError, match="mla_v_quantize_fp8: `v_out` dtype"):
        fp8mla.mla_v_quantize_fp8(v, v_out=np.zeros((5, 2, 128), BF16))
    with pytest.raises(fp8mla.InvalidArgumentError, match="mla_v_quantize_fp8: expected v_layout"):
        fp8mla.mla_v_quantize_fp8(v, v_layout="head_major")
    with pytest.raises(fp8mla.InvalidArgumentError, match=r"`v_out` \(kTransposed\)"):
        fp8mla.mla_v_quantize_fp8(v, v_out=np.zeros((5, 2, 128), E4M3), v_layout="transposed")
    with pytest.raises(fp8mla.InvalidArgumentError, match="`v_out`: expected 5 tokens like `v`"):
        fp8mla.mla_v_quantize_fp8(v, v_out=np.zeros((4, 2, 128), E4M3))


def test_generic_arrays_need_outputs():
    cache = DLPackOnly(np.zeros((2, 576), np.uint8))
    with pytest.raises(TypeError, match="pass kv_c_out, k_pe_out explicitly"):
        fp8mla.mla_kv_gather(cache, np.zeros(1, np.int64), 1.0)
    kv = DLPackOnly(np.zeros((2, 4, 256), np.float32))
    with pytest.raises(TypeError, match="pass k_out, v_out explicitly"):
        fp8mla.mla_kv_pack_quantize_fp8(kv, kv, kv)
    with pytest.raises(TypeError, match="pass v_out explicitly"):
        fp8mla.mla_v_quantize_fp8(kv)
    with pytest.raises(TypeError, match="got list"):  # not an array at all
        fp8mla.mla_v_quantize_fp8([0])
