"""The attention backends' hook and pack on torch tensors: the same bytes as the ops they are made
of ("cpu" on the CPU; with a CUDA build on a GPU, "fp8-hopper", which writes V transposed), the
torch custom ops' schemas and fake implementations (opcheck), and torch.compile(fullgraph=True).
Skipped (visibly) without torch, or without CUDA for the GPU tests."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import fp8mla  # noqa: E402
import fp8mla.torch_ops  # noqa: E402,F401  (registers the custom ops even if fp8mla came first)
from torch_helpers import assert_same, needs_gpu  # noqa: E402

# The FP8 backend of each device.
BACKENDS = [pytest.param("cpu", "cpu", id="cpu"),
            pytest.param("cuda", "fp8-hopper", id="cuda", marks=needs_gpu)]


def inputs(tokens, heads, device, seed=0):
    """Slices of q_b_proj's, the compressed kv's and kv_b_proj's outputs, as an engine has them."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, heads, 192, generator=g).bfloat16().to(device)
    ckv = torch.randn(tokens, 576, generator=g).bfloat16().to(device)
    kv = torch.randn(tokens, heads, 256, generator=g).bfloat16().to(device)
    positions = torch.randint(0, 64, (tokens,), generator=g, dtype=torch.int32).to(device)
    return dict(q=q[..., :128], q_pe=q[..., 128:], k_nope=kv[..., :128], k_pe=ckv[:, 512:],
                positions=positions, v=kv[..., 128:], kv_a=ckv[:, :512])


def hook_args(inp, cos_sin):
    return (inp["q"], inp["q_pe"], inp["k_nope"], inp["k_pe"], inp["positions"], cos_sin,
            inp["v"])


@pytest.mark.parametrize("device,name", BACKENDS)
def test_prepare_prefill_qkv_is_the_ops(device, name):
    tokens, heads = 9, 4
    backend = fp8mla.make_attention_backend(name)
    layout = backend.capabilities.v_layout
    cos_sin = fp8mla.make_cos_sin_cache(64, device=device)
    inp = inputs(tokens, heads, device)
    cache = torch.zeros(2, 16, 576, dtype=torch.float8_e4m3fn, device=device)
    expected_cache = cache.clone()
    slots = torch.arange(tokens, dtype=torch.int64, device=device) * 3
    q_out, k_out, v_out = backend.prepare_prefill_qkv(
        *hook_args(inp, cos_sin), q_scale_inv=0.5, cache=cache, slot_mapping=slots,
        cache_scale_inv=2.0, kv_a=inp["kv_a"], v_scale_inv=4.0)
    q_ref, k_ref = fp8mla.mla_rope_quantize_fp8(
        *hook_args(inp, cos_sin)[:6], q_scale_inv=0.5, cache=expected_cache, slot_mapping=slots,
        cache_scale_inv=2.0, kv_c=inp["kv_a"])
    v_ref = fp8mla.mla_v_quantize_fp8(inp["v"], v_scale_inv=4.0, v_layout=layout)
    for got, want in ((q_out, q_ref), (k_out, k_ref), (v_out, v_ref), (cache, expected_cache)):
        assert got.device == want.device
        assert_same(got, want)
    assert v_out.stride() == v_ref.stride()  # the backend's layout


@pytest.mark.parametrize("device,name", BACKENDS)
def test_pack_prefix_chunk_kv_is_the_op(device, name):
    backend = fp8mla.make_attention_backend(name)
    inp = inputs(7, 2, device, seed=1)
    k_out, v_out = backend.pack_prefix_chunk_kv(inp["k_nope"], inp["k_pe"], inp["v"],
                                                k_scale_inv=2.0)
    k_ref, v_ref = fp8mla.mla_kv_pack_quantize_fp8(inp["k_nope"], inp["k_pe"], inp["v"],
                                                   k_scale_inv=2.0,
                                                   v_layout=backend.capabilities.v_layout)
    assert_same(k_out, k_ref)
    assert_same(v_out, v_ref)


def test_custom_ops_opcheck():
    """Schemas (declared mutations match what the ops write) and fake implementations; FP8
    outputs as raw uint8 (the schema test compares values, which torch cannot for float8)."""
    inp = inputs(3, 2, "cpu", seed=2)
    cos_sin = fp8mla.make_cos_sin_cache(64, device="cpu")
    q_out, k_out, v_out = (torch.empty(3, 2, d, dtype=torch.uint8) for d in (192, 192, 128))
    cache = torch.zeros(1, 8, 576, dtype=torch.uint8)
    slots, flag = torch.tensor([5, -1, 0]), torch.zeros(1, dtype=torch.int32)
    tests = ("test_schema", "test_faketensor")
    for cache_args in ((None, None, 1.0, None, None), (cache, slots, 2.0, flag, inp["kv_a"])):
        torch.library.opcheck(torch.ops.fp8mla.backend_prepare_prefill_qkv.default, (
            "cpu", *hook_args(inp, cos_sin)[:6], "interleaved", 1.0, 1.0, q_out, k_out,
            *cache_args, None, inp["v"], 1.0, v_out, 0), test_utils=tests)
    torch.library.opcheck(torch.ops.fp8mla.backend_pack_prefix_chunk_kv.default, (
        "cpu", inp["k_nope"], inp["k_pe"], inp["v"], 1.0, 1.0, k_out, v_out, None, 0),
        test_utils=tests)
    k_split = torch.empty(3, 2, 128, dtype=torch.uint8)
    k_rope = torch.empty(3, 64, dtype=torch.uint8)
    torch.library.opcheck(torch.ops.fp8mla.backend_prepare_prefill_qkv.default, (
        "cpu", *hook_args(inp, cos_sin)[:6], "interleaved", 1.0, 1.0, q_out, k_split,
        None, None, 1.0, None, None, k_rope, inp["v"], 1.0, v_out, 0), test_utils=tests)
    torch.library.opcheck(torch.ops.fp8mla.backend_pack_prefix_chunk_kv.default, (
        "cpu", inp["k_nope"], inp["k_pe"], inp["v"], 1.0, 1.0, k_split, v_out, k_rope, 0),
        test_utils=tests)


def test_prepare_prefill_qkv_compiles():
    backend = fp8mla.make_attention_backend("cpu")
    inp = inputs(5, 2, "cpu", seed=3)
    cos_sin = fp8mla.make_cos_sin_cache(64, device="cpu")

    def step(q, q_pe, k_nope, k_pe, positions, cos_sin, v):
        return backend.prepare_prefill_qkv(q, q_pe, k_nope, k_pe, positions, cos_sin, v)

    compiled = torch.compile(step, fullgraph=True)
    for got, want in zip(compiled(*hook_args(inp, cos_sin)), step(*hook_args(inp, cos_sin))):
        assert_same(got, want)
