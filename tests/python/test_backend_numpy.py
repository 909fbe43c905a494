"""fp8mla's attention backends through numpy (+ ml_dtypes): what they declare (as the C++ test
holds them to), check_backend's errors, and the hook and pack against the public ops they are
made of, byte for byte on the CPU: prepare_prefill_qkv = mla_rope_quantize_fp8 with the latent
cache write + mla_v_quantize_fp8, pack_prefix_chunk_kv = mla_kv_pack_quantize_fp8."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
import fp8mla  # noqa: E402

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
FUSED_KEYS = ("fp8_static", "fp8_group128", "fp8_group64", "nvfp4")
CPU_HEAD_DIMS = ((192, 128), (128, 128), (64, 64), (128, 64))


def rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32).astype(BF16)


def u8(a) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


def engine_inputs(tokens, heads, seed=0, max_pos=64):
    """The hook's inputs as an engine's MLA prefill has them: slices of q_b_proj's [T, H, 192],
    of the compressed kv [T, 576] (latent | k_pe) and of kv_b_proj's [T, H, 256] (k_nope | v)."""
    q = rand((tokens, heads, 192), seed)
    ckv = rand((tokens, 576), seed + 1)
    kv = rand((tokens, heads, 256), seed + 2)
    positions = np.random.default_rng(seed + 3).integers(0, max_pos, size=tokens)
    return dict(q=q[..., :128], q_pe=q[..., 128:], k_nope=kv[..., :128], k_pe=ckv[:, 512:],
                positions=positions.astype(np.int32), v=kv[..., 128:], kv_a=ckv[:, :512])


def cache_and_slots(tokens, page_size=16, seed=5):
    num_pages = (2 * tokens + page_size - 1) // page_size
    cache = np.random.default_rng(seed).integers(0, 0x7F, size=(num_pages, page_size, 576),
                                                 dtype=np.uint8).view(E4M3)
    slots = np.random.default_rng(seed + 1).permutation(num_pages * page_size)[:tokens]
    slots = slots.astype(np.int64)
    slots[tokens // 2] = -1  # a token without a cache row
    return cache, slots


# ---- what the backends declare -------------------------------------------------------------------


def test_names_and_cpu_capabilities():
    assert fp8mla.attention_backend_names() == ["cpu", "cpu-bf16", "fp8-hopper", "bf16-hopper"]
    cpu = fp8mla.make_attention_backend("cpu")
    assert cpu.name == "cpu" and repr(cpu) == "fp8mla.AttentionBackend('cpu')"
    assert fp8mla.make_attention_backend("cpu") is cpu  # one object per backend
    caps = cpu.capabilities
    assert isinstance(caps, fp8mla.BackendCapabilities)
    assert caps == fp8mla.BackendCapabilities(
        name="cpu", attention_dtypes=("e4m3", "bf16"), head_dims=CPU_HEAD_DIMS, min_page_size=1,
        max_page_size=128, output_quant=FUSED_KEYS, architectures=("cpu",),
        prepare_prefill_qkv=True, pack_prefix_chunk_kv=True, v_layout="token_major",
        fold_prior_state=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.name = "other"
    bf16 = fp8mla.make_attention_backend("cpu-bf16").capabilities
    assert bf16.attention_dtypes == ("bf16",) and bf16.head_dims == CPU_HEAD_DIMS
    assert bf16.output_quant == FUSED_KEYS
    assert not bf16.prepare_prefill_qkv and not bf16.pack_prefix_chunk_kv
    assert bf16.fold_prior_state


def test_hopper_capabilities():
    fp8 = fp8mla.make_attention_backend("fp8-hopper").capabilities
    bf16 = fp8mla.make_attention_backend("bf16-hopper").capabilities
    assert fp8.prepare_prefill_qkv and fp8.pack_prefix_chunk_kv and fp8.v_layout == "transposed"
    assert not bf16.prepare_prefill_qkv and not bf16.pack_prefix_chunk_kv
    if not fp8mla.info()["cuda"]:
        # A build without CUDA names them and declares nothing they could serve.
        for caps in (fp8, bf16):
            assert caps.attention_dtypes == () and caps.head_dims == ()
            assert caps.architectures == () and caps.output_quant == ()
            assert not caps.fold_prior_state
    else:
        assert "bf16" in fp8.attention_dtypes and "e4m3" not in bf16.attention_dtypes
        assert fp8.fold_prior_state and bf16.fold_prior_state


def test_unknown_backend_lists_the_known_ones():
    with pytest.raises(fp8mla.InvalidArgumentError,
                       match="unknown attention backend 'flashinfer'; known: cpu, cpu-bf16, "
                             "fp8-hopper, bf16-hopper"):
        fp8mla.make_attention_backend("flashinfer")


def test_check_backend():
    cpu = fp8mla.make_attention_backend("cpu")
    cpu.check_backend()
    cpu.check_backend(attention_dtype="bf16", head_dim_qk=64, head_dim_v=64, page_size=1,
                      output_quant="nvfp4", prepare_prefill_qkv=True, pack_prefix_chunk_kv=True)
    fp8mla.check_backend("cpu", page_size=128)
    with pytest.raises(fp8mla.UnsupportedError) as e:
        fp8mla.check_backend("cpu-bf16", prepare_prefill_qkv=True, page_size=256)
    assert e.value.category == "unsupported"
    assert e.value.message.startswith("attention backend 'cpu-bf16' cannot serve this layer on cpu")
    assert e.value.message.endswith(
        "Missing: attention dtype e4m3fn, page size 256, prepare_prefill_qkv.")
    with pytest.raises(fp8mla.UnsupportedError) as e:
        fp8mla.make_attention_backend("bf16-hopper").check_backend(attention_dtype="bf16")
    assert "Missing: " in e.value.message and e.value.message.endswith("architecture cpu.")
    with pytest.raises(fp8mla.UnsupportedError, match="Missing: fused output quantization fp8"):
        cpu.check_backend(output_quant="fp8")
    with pytest.raises(fp8mla.InvalidArgumentError,
                       match="expected attention_dtype 'e4m3' or 'bf16', got 'f16'"):
        cpu.check_backend(attention_dtype="f16")
    with pytest.raises(fp8mla.InvalidArgumentError,
                       match="expected device_type 'cpu' or 'cuda', got 'tpu'"):
        cpu.check_backend(device="tpu:0")


# ---- prepare_prefill_qkv -------------------------------------------------------------------------


@pytest.mark.parametrize("tokens,heads", [(1, 1), (7, 3), (33, 16)])
def test_prepare_prefill_qkv_is_the_ops(tokens, heads):
    backend = fp8mla.make_attention_backend("cpu")
    cos_sin = fp8mla.make_cos_sin_cache(64, yarn={})
    inp = engine_inputs(tokens, heads, seed=tokens)
    cache, slots = cache_and_slots(tokens)
    expected_cache = cache.copy()
    flag = np.zeros((1,), np.int32)
    q_out, k_out, v_out = backend.prepare_prefill_qkv(
        inp["q"], inp["q_pe"], inp["k_nope"], inp["k_pe"], inp["positions"], cos_sin, inp["v"],
        q_scale_inv=0.5, k_scale_inv=2.0, cache=cache, slot_mapping=slots, cache_scale_inv=4.0,
        error_flag=flag, kv_a=inp["kv_a"], v_scale_inv=0.25)
    for out, shape in ((q_out, (tokens, heads, 192)), (k_out, (tokens, heads, 192)),
                       (v_out, (tokens, heads, 128))):
        assert out.dtype == E4M3 and out.shape == shape
    q_ref, k_ref = fp8mla.mla_rope_quantize_fp8(
        inp["q"], inp["q_pe"], inp["k_nope"], inp["k_pe"], inp["positions"], cos_sin,
        q_scale_inv=0.5, k_scale_inv=2.0, cache=expected_cache, slot_mapping=slots,
        cache_scale_inv=4.0, kv_c=inp["kv_a"])
    v_ref = fp8mla.mla_v_quantize_fp8(inp["v"], v_scale_inv=0.25)
    np.testing.assert_array_equal(u8(q_out), u8(q_ref))
    np.testing.assert_array_equal(u8(k_out), u8(k_ref))
    np.testing.assert_array_equal(u8(v_out), u8(v_ref))
    np.testing.assert_array_equal(u8(cache), u8(expected_cache))
    assert flag[0] == 0


def test_prepare_prefill_qkv_without_cache_and_caller_outputs():
    tokens, heads = 5, 2
    backend = fp8mla.make_attention_backend("cpu")
    cos_sin = fp8mla.make_cos_sin_cache(64)
    inp = engine_inputs(tokens, heads, seed=3)
    # q_out and k_out in one [T, 2, H, 192] buffer, v_out a slice of a wider one: caller-owned
    # memory is written where it is and returned as it is.
    qk = np.zeros((tokens, 2, heads, 192), np.uint8)
    v_storage = np.zeros((tokens, heads, 160), np.uint8)
    q_out, k_out, v_out = qk[:, 0], qk[:, 1], v_storage[..., :128]
    got = backend.prepare_prefill_qkv(inp["q"], inp["q_pe"], inp["k_nope"], inp["k_pe"][:, None],
                                      inp["positions"], cos_sin, inp["v"], q_out=q_out,
                                      k_out=k_out, v_out=v_out)
    assert got[0] is q_out and got[1] is k_out and got[2] is v_out
    q_ref, k_ref = fp8mla.mla_rope_quantize_fp8(inp["q"], inp["q_pe"], inp["k_nope"], inp["k_pe"],
                                                inp["positions"], cos_sin)
    np.testing.assert_array_equal(q_out, u8(q_ref))
    np.testing.assert_array_equal(k_out, u8(k_ref))
    np.testing.assert_array_equal(v_out, u8(fp8mla.mla_v_quantize_fp8(inp["v"])))
    assert not v_storage[..., 128:].any()


def test_prepare_prefill_qkv_errors():
    tokens, heads = 4, 2
    cos_sin = fp8mla.make_cos_sin_cache(64)
    inp = engine_inputs(tokens, heads, seed=9)
    args = (inp["q"], inp["q_pe"], inp["k_nope"], inp["k_pe"], inp["positions"], cos_sin, inp["v"])
    with pytest.raises(fp8mla.UnsupportedError,
                       match="attention backend 'cpu-bf16' has no prepare_prefill_qkv"):
        fp8mla.make_attention_backend("cpu-bf16").prepare_prefill_qkv(*args)
    cpu = fp8mla.make_attention_backend("cpu")
    with pytest.raises(fp8mla.InvalidArgumentError,
                       match="prepare_prefill_qkv: `kv_a`, `slot_mapping` and `error_flag` belong "
                             "to the latent cache write: pass `cache` too"):
        cpu.prepare_prefill_qkv(*args, kv_a=inp["kv_a"])
    with pytest.raises(fp8mla.InvalidArgumentError, match="style 'interleaved' or 'neox'"):
        cpu.prepare_prefill_qkv(*args, style="gptj")
    with pytest.raises(fp8mla.InvalidArgumentError,
                       match=r"`v_out`: expected \[tokens, heads, 128\], got e4m3fn\[4, 2, 64\]"):
        cpu.prepare_prefill_qkv(*args, v_out=np.zeros((tokens, heads, 64), E4M3))
    with pytest.raises(fp8mla.InvalidArgumentError,
                       match=r"`v`: expected \[tokens, heads, 128\], got bf16\[4, 2, 64\]"):
        cpu.prepare_prefill_qkv(*args[:6], inp["v"][..., :64])


# ---- pack_prefix_chunk_kv ------------------------------------------------------------------------


@pytest.mark.parametrize("n,heads", [(1, 1), (19, 4)])
def test_pack_prefix_chunk_kv_is_the_op(n, heads):
    kv = rand((n, heads, 256), seed=n)
    k_pe = rand((n, 64), seed=n + 1)
    k_out, v_out = fp8mla.make_attention_backend("cpu").pack_prefix_chunk_kv(
        kv[..., :128], k_pe, kv[..., 128:], k_scale_inv=2.0, v_scale_inv=0.5)
    k_ref, v_ref = fp8mla.mla_kv_pack_quantize_fp8(kv[..., :128], k_pe, kv[..., 128:],
                                                   k_scale_inv=2.0, v_scale_inv=0.5)
    assert k_out.dtype == E4M3 and k_out.shape == (n, heads, 192) and v_out.shape == (n, heads, 128)
    np.testing.assert_array_equal(u8(k_out), u8(k_ref))
    np.testing.assert_array_equal(u8(v_out), u8(v_ref))
    k_given, v_given = np.zeros((n, heads, 192), E4M3), np.zeros((n, heads, 128), E4M3)
    got = fp8mla.make_attention_backend("cpu").pack_prefix_chunk_kv(
        kv[..., :128], k_pe, kv[..., 128:], k_scale_inv=2.0, v_scale_inv=0.5, k_out=k_given,
        v_out=v_given)
    assert got[0] is k_given and got[1] is v_given
    np.testing.assert_array_equal(u8(k_given), u8(k_ref))


def test_pack_prefix_chunk_kv_errors():
    kv = rand((3, 2, 256), seed=1)
    with pytest.raises(fp8mla.UnsupportedError,
                       match="attention backend 'cpu-bf16' has no pack_prefix_chunk_kv"):
        fp8mla.make_attention_backend("cpu-bf16").pack_prefix_chunk_kv(
            kv[..., :128], rand((3, 64), 2), kv[..., 128:])
    with pytest.raises(fp8mla.InvalidArgumentError,
                       match=r"`k_pe`: expected \[tokens, 64\] or \[tokens, 1, 64\]"):
        fp8mla.make_attention_backend("cpu").pack_prefix_chunk_kv(
            kv[..., :128], rand((3, 32), 2), kv[..., 128:])
