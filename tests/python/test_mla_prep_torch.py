"""The MLA prefill preparation ops through torch: the custom ops' schemas and fake
implementations (opcheck), CPU torch tensors against the numpy front end and references,
torch.compile(fullgraph=True) on the CPU, and with a CUDA build on a GPU: GPU vs CPU
bit-exactness of every op, the error flag, torch.compile and CUDA graph capture + replay.
Skipped (visibly) without torch, or without CUDA for the GPU tests."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
ml_dtypes = pytest.importorskip("ml_dtypes")
import fp8mla  # noqa: E402
import fp8mla.torch_ops  # noqa: E402,F401  (registers the custom ops even if fp8mla came first)
import mla_prep_reference as ref  # noqa: E402
from torch_helpers import as_bytes, assert_same, capture, needs_gpu, to_numpy  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=needs_gpu)]
YARN = {"factor": 40, "original_max_position_embeddings": 4096, "type": "yarn"}
OPS = ["make_cos_sin_cache", "mla_rope_quantize_fp8", "mla_kv_cache_write", "mla_kv_gather",
       "mla_kv_pack_quantize_fp8", "mla_v_quantize_fp8"]


def rand(shape, dtype=torch.bfloat16, seed=0, device="cpu", scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * scale
    x *= torch.exp2(torch.randint(-3, 4, shape, generator=g).float())
    return x.to(dtype).to(device)


def random_cache(num_pages, page_size, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 0x7F, (num_pages, page_size, ref.LATENT), generator=g,
                          dtype=torch.uint8)
    codes |= torch.randint(0, 2, codes.shape, generator=g, dtype=torch.uint8) << 7  # no NaN
    return codes.view(torch.float8_e4m3fn).to(device)


def rope_inputs(tokens, heads, dtype=torch.bfloat16, seed=0, device="cpu", max_pos=128):
    """Strided views as an engine has them (q [T, H, 192] split, ckv [T, 576] split, kv_b_proj
    output [T, H, 256] sliced)."""
    q = rand((tokens, heads, ref.QK), dtype, seed, device)
    ckv = rand((tokens, ref.LATENT), dtype, seed + 1, device)
    kv = rand((tokens, heads, 256), dtype, seed + 2, device)
    g = torch.Generator().manual_seed(seed + 3)
    positions = torch.randint(0, max_pos, (tokens,), generator=g).to(device)
    return dict(q_nope=q[..., :128], q_pe=q[..., 128:], k_nope=kv[..., :128], k_pe=ckv[:, 512:],
                kv_c=ckv[:, :512], positions=positions, v=kv[..., 128:])


def rope_args(inp, cos_sin):
    return (inp["q_nope"], inp["q_pe"], inp["k_nope"], inp["k_pe"], inp["positions"], cos_sin)


# ---- custom ops ----------------------------------------------------------------------------------


def test_custom_ops_registered_with_mutations():
    for name in OPS:
        assert hasattr(torch.ops.fp8mla, name)
    mutated = {
        "make_cos_sin_cache": {"cos_sin"},
        "mla_rope_quantize_fp8": {"q_out", "k_out", "cache", "error_flag", "k_rope_out"},
        "mla_kv_cache_write": {"cache", "error_flag"},
        "mla_kv_gather": {"kv_c_out", "k_pe_out", "error_flag"},
        "mla_kv_pack_quantize_fp8": {"k_out", "v_out", "k_rope_out"},
        "mla_v_quantize_fp8": {"v_out"},
    }
    for name, expected in mutated.items():
        schema = getattr(torch.ops.fp8mla, name).default._schema
        got = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        assert got == expected, name


def opcheck(op, args):
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


def test_opcheck_all_ops():
    """Schemas (declared mutations match what the ops write) and fake implementations. FP8
    outputs as raw uint8 (the schema test compares values, which torch cannot for float8)."""
    inp = rope_inputs(5, 2, seed=1, max_pos=16)
    cos_sin = torch.empty(16, 64)
    opcheck(torch.ops.fp8mla.make_cos_sin_cache.default, (cos_sin, 64, 10000.0, None, 0))
    opcheck(torch.ops.fp8mla.make_cos_sin_cache.default,
            (cos_sin, 64, 10000.0, [40.0, 4096.0, 32.0, 1.0, 1.0, 1.0], 0))
    q_out = torch.empty(5, 2, 192, dtype=torch.uint8)
    k_out = torch.empty(5, 2, 192, dtype=torch.uint8)
    cache = random_cache(2, 4, seed=2).view(torch.uint8)
    slots = torch.tensor([0, 3, -1, 7, 2])
    flag = torch.zeros(1, dtype=torch.int32)
    opcheck(torch.ops.fp8mla.mla_rope_quantize_fp8.default,
            (*rope_args(inp, cos_sin), "interleaved", 1.0, 1.0, q_out, k_out, None, None, 1.0,
             None, None, None, 0))
    opcheck(torch.ops.fp8mla.mla_rope_quantize_fp8.default,
            (*rope_args(inp, cos_sin), "neox", 2.0, 0.5, q_out, k_out, cache, slots, 0.5, flag,
             inp["kv_c"], None, 0))
    k_split = torch.empty(5, 2, 128, dtype=torch.uint8)
    k_rope = torch.empty(5, 64, dtype=torch.uint8)
    opcheck(torch.ops.fp8mla.mla_rope_quantize_fp8.default,
            (*rope_args(inp, cos_sin), "interleaved", 1.0, 1.0, q_out, k_split, None, None, 1.0,
             None, None, k_rope, 0))
    opcheck(torch.ops.fp8mla.mla_kv_cache_write.default,
            (inp["kv_c"], inp["k_pe"], cache, slots, 1.0, flag, 0))
    opcheck(torch.ops.fp8mla.mla_kv_cache_write.default,
            (inp["kv_c"], inp["k_pe"], cache, slots, 1.0, None, 0))
    kv_out = torch.empty(3, 512, dtype=torch.bfloat16)
    pe_out = torch.empty(3, 64, dtype=torch.bfloat16)
    opcheck(torch.ops.fp8mla.mla_kv_gather.default,
            (cache, torch.tensor([1, 0, 7], dtype=torch.int32), 2.0, kv_out, pe_out, flag, 0))
    pk = torch.empty(5, 2, 192, dtype=torch.uint8)
    pv = torch.empty(5, 2, 128, dtype=torch.uint8)
    opcheck(torch.ops.fp8mla.mla_kv_pack_quantize_fp8.default,
            (inp["k_nope"], inp["k_pe"], inp["v"], 1.0, 2.0, pk, pv, None, "token_major", 0))
    opcheck(torch.ops.fp8mla.mla_kv_pack_quantize_fp8.default,
            (inp["k_nope"], inp["k_pe"], inp["v"], 1.0, 2.0, k_split, pv, k_rope, "token_major", 0))
    opcheck(torch.ops.fp8mla.mla_v_quantize_fp8.default, (inp["v"], pv, 2.0, "token_major", 0))
    pv_t = torch.empty(2, 128, 16, dtype=torch.uint8)[:, :, :5].permute(2, 0, 1)
    opcheck(torch.ops.fp8mla.mla_v_quantize_fp8.default, (inp["v"], pv_t, 2.0, "transposed", 0))


# ---- CPU torch tensors ---------------------------------------------------------------------------


def test_cos_sin_cache_torch_cpu():
    table = fp8mla.make_cos_sin_cache(100, yarn=YARN, device="cpu")
    assert isinstance(table, torch.Tensor) and table.dtype == torch.float32
    assert table.shape == (100, 64) and table.device.type == "cpu"
    np.testing.assert_array_equal(table.numpy(), fp8mla.make_cos_sin_cache(100, yarn=YARN))
    out = torch.empty(100, 64)
    assert fp8mla.make_cos_sin_cache(100, yarn=YARN, out=out) is out
    assert_same(out, table)
    assert isinstance(fp8mla.make_cos_sin_cache(4), np.ndarray)  # device None: numpy


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("style", ["interleaved", "neox"])
def test_rope_quantize_torch_cpu(dtype, style):
    tokens, heads = 19, 8
    cos_sin = fp8mla.make_cos_sin_cache(128, yarn=YARN, device="cpu")
    inp = rope_inputs(tokens, heads, dtype, seed=4)
    cache = random_cache(3, 16, seed=5)
    cache_np = to_numpy(cache.view(torch.uint8)).copy()
    slots = torch.randperm(48, generator=torch.Generator().manual_seed(6))[:tokens]
    slots[4] = -1
    q_out, k_out = fp8mla.mla_rope_quantize_fp8(
        *rope_args(inp, cos_sin), style=style, q_scale_inv=0.5, k_scale_inv=2.0,
        kv_c=inp["kv_c"], cache=cache, slot_mapping=slots, cache_scale_inv=2.0)
    assert q_out.dtype == torch.float8_e4m3fn and q_out.shape == (tokens, heads, 192)
    # The numpy front end on the same data gives the same bytes (one C++ implementation) ...
    nq, nk = fp8mla.mla_rope_quantize_fp8(
        *[to_numpy(t) for t in rope_args(inp, cos_sin)], style=style, q_scale_inv=0.5,
        k_scale_inv=2.0, kv_c=to_numpy(inp["kv_c"]), cache=cache_np,
        slot_mapping=slots.numpy(), cache_scale_inv=2.0)
    np.testing.assert_array_equal(as_bytes(q_out), nq.view(np.uint8))
    np.testing.assert_array_equal(as_bytes(k_out), nk.view(np.uint8))
    np.testing.assert_array_equal(as_bytes(cache), cache_np)
    # ... and it is within one e4m3 rounding of the float64 reference.
    q_rope, bound = ref.rope(to_numpy(inp["q_pe"]), inp["positions"].numpy(), cos_sin.numpy(), style)
    ref.assert_e4m3_near(as_bytes(q_out)[..., 128:], q_rope, bound, 0.5)
    np.testing.assert_array_equal(as_bytes(q_out)[..., :128],
                                  ref.quantize(to_numpy(inp["q_nope"]), 0.5))


def test_kv_ops_torch_cpu():
    n, heads = 21, 4
    inp = rope_inputs(n, heads, seed=7)
    cache = random_cache(4, 8, seed=8)
    before = as_bytes(cache).copy()
    slots = torch.tensor(list(range(31, 31 - n, -1)), dtype=torch.int32)
    slots[0] = -1
    assert fp8mla.mla_kv_cache_write(inp["kv_c"], inp["k_pe"], cache, slots, scale_inv=0.5) is None
    rows = ref.latent_rows(to_numpy(inp["kv_c"]), to_numpy(inp["k_pe"]), 0.5)
    expected = before.copy()
    for t, s in enumerate(slots.tolist()):
        if s != -1:
            ref.slot_row(expected, s)[:] = rows[t]
    np.testing.assert_array_equal(as_bytes(cache), expected)

    kv_out, pe_out = fp8mla.mla_kv_gather(cache, slots[1:].long(), 4.0)
    assert kv_out.dtype == torch.bfloat16 and kv_out.shape == (n - 1, 512)
    gathered = expected.reshape(-1, 576)[slots[1:].numpy()]
    np.testing.assert_array_equal(as_bytes(kv_out).view(np.uint16),
                                  ref.dequantize_bf16(gathered[:, :512], 4.0))
    np.testing.assert_array_equal(as_bytes(pe_out).view(np.uint16),
                                  ref.dequantize_bf16(gathered[:, 512:], 4.0))

    k_out, v_out = fp8mla.mla_kv_pack_quantize_fp8(inp["k_nope"], inp["k_pe"], inp["v"],
                                                   k_scale_inv=2.0, v_scale_inv=0.25)
    k_exp, v_exp = ref.pack(to_numpy(inp["k_nope"]), to_numpy(inp["k_pe"]), to_numpy(inp["v"]),
                            2.0, 0.25)
    np.testing.assert_array_equal(as_bytes(k_out), k_exp)
    np.testing.assert_array_equal(as_bytes(v_out), v_exp)


@pytest.mark.parametrize("v_layout", ["token_major", "transposed"])
@pytest.mark.parametrize("n,heads", [(0, 16), (5, 1), (130, 16)])
def test_v_quantize_torch_cpu(v_layout, n, heads):
    inp = rope_inputs(n, heads, seed=30)
    v_out = fp8mla.mla_v_quantize_fp8(inp["v"], v_scale_inv=0.25, v_layout=v_layout)
    assert v_out.dtype == torch.float8_e4m3fn and v_out.shape == (n, heads, 128)
    if v_layout == "transposed" and n > 1:
        assert v_out.stride(0) == 1
    _, v_pack = fp8mla.mla_kv_pack_quantize_fp8(inp["k_nope"], inp["k_pe"], inp["v"],
                                                v_scale_inv=0.25, v_layout=v_layout)
    assert_same(v_out, v_pack)
    np.testing.assert_array_equal(as_bytes(v_out), ref.quantize(to_numpy(inp["v"]), 0.25))
    with pytest.raises(fp8mla.InvalidArgumentError, match="`v` dtype"):
        fp8mla.mla_v_quantize_fp8(inp["v"].float(), v_layout=v_layout)


def test_torch_errors_and_flags():
    inp = rope_inputs(4, 2, seed=9, max_pos=8)
    cos_sin = fp8mla.make_cos_sin_cache(8, device="cpu")
    positions = inp["positions"].clone()
    positions[1] = 8
    q_out = torch.zeros(4, 2, 192, dtype=torch.float8_e4m3fn)
    with pytest.raises(fp8mla.InvalidArgumentError, match=r"`positions`\[1\] = 8 is outside"):
        fp8mla.mla_rope_quantize_fp8(inp["q_nope"], inp["q_pe"], inp["k_nope"], inp["k_pe"],
                                     positions, cos_sin, q_out=q_out)
    assert not as_bytes(q_out).any()
    cache = random_cache(1, 4, seed=10)
    flag = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(fp8mla.InvalidArgumentError, match=r"`slot_mapping`\[3\] = 4 is outside"):
        fp8mla.mla_kv_cache_write(inp["kv_c"], inp["k_pe"], cache, torch.tensor([0, 1, 2, 4]),
                                  error_flag=flag)
    assert flag.item() == 0  # the CPU path raises instead
    with pytest.raises(fp8mla.Error, match="`kv_c` dtype"):
        fp8mla.mla_kv_cache_write(inp["kv_c"].float(), inp["k_pe"], cache, torch.arange(4))
    with pytest.raises(fp8mla.Error, match="`slots`"):
        torch.ops.fp8mla.mla_kv_gather(cache, torch.tensor([[0]]), 1.0,
                                       torch.empty(1, 512, dtype=torch.bfloat16),
                                       torch.empty(1, 64, dtype=torch.bfloat16), None, 0)


def prep_step(inp, cos_sin, cache, slots, prefix, prefix_pe):
    """What a prepare_prefill_qkv hook does: RoPE + FP8 Q/K with the cache write, then the K/V
    pack of a prefix chunk (and V alone, transposed, as a backend with its own K does)."""
    q, k = fp8mla.mla_rope_quantize_fp8(
        *rope_args(inp, cos_sin), q_scale_inv=0.5, kv_c=inp["kv_c"], cache=cache,
        slot_mapping=slots, cache_scale_inv=0.25)
    pk, pv = fp8mla.mla_kv_pack_quantize_fp8(prefix[..., :128], prefix_pe, prefix[..., 128:],
                                             v_scale_inv=2.0)
    return q, k, pk, pv, fp8mla.mla_v_quantize_fp8(prefix[..., 128:], v_scale_inv=2.0,
                                                   v_layout="transposed")


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    inp = rope_inputs(24, 4, seed=11, device=device)
    cos_sin = fp8mla.make_cos_sin_cache(128, yarn=YARN, device=device)
    prefix = rand((40, 4, 256), seed=12, device=device)
    prefix_pe = rand((40, 64), seed=13, device=device)
    slots = torch.randperm(64, generator=torch.Generator().manual_seed(14))[:24].to(device)
    cache_eager = random_cache(4, 16, seed=15, device=device)
    cache_compiled = cache_eager.clone()
    expected = prep_step(inp, cos_sin, cache_eager, slots, prefix, prefix_pe)
    compiled = torch.compile(prep_step, fullgraph=True)
    got = compiled(inp, cos_sin, cache_compiled, slots, prefix, prefix_pe)
    for g, e in zip(got, expected):
        assert_same(g, e)
    assert_same(cache_compiled, cache_eager)  # the in-place cache write survives compilation


# ---- CUDA ----------------------------------------------------------------------------------------


@needs_gpu
def test_gpu_cos_sin_cache_matches_cpu():
    for yarn in [None, YARN]:
        assert_same(fp8mla.make_cos_sin_cache(4096, yarn=yarn, device="cuda").cpu(),
                    fp8mla.make_cos_sin_cache(4096, yarn=yarn, device="cpu"))


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("style", ["interleaved", "neox"])
@pytest.mark.parametrize("tokens,heads", [(1, 1), (77, 16), (300, 128)])
@pytest.mark.parametrize("page_size", [1, 64])
def test_gpu_rope_quantize_matches_cpu(dtype, style, tokens, heads, page_size):
    cos_sin = fp8mla.make_cos_sin_cache(4096, yarn=YARN, device="cpu")
    inp = rope_inputs(tokens, heads, dtype, seed=tokens, max_pos=4096)
    num_pages = (tokens + 10 + page_size - 1) // page_size
    cache = random_cache(num_pages, page_size, seed=16)
    slots = torch.randperm(num_pages * page_size, generator=torch.Generator().manual_seed(17))
    slots = slots[:tokens].int()
    slots[tokens // 2] = -1
    gpu = {k: v.cuda() for k, v in inp.items()}
    cache_gpu = cache.cuda()
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    qg, kg = fp8mla.mla_rope_quantize_fp8(
        *rope_args(gpu, cos_sin.cuda()), style=style, q_scale_inv=0.5, k_scale_inv=2.0,
        kv_c=gpu["kv_c"], cache=cache_gpu, slot_mapping=slots.cuda(), cache_scale_inv=4.0,
        error_flag=flag)
    qc, kc = fp8mla.mla_rope_quantize_fp8(
        *rope_args(inp, cos_sin), style=style, q_scale_inv=0.5, k_scale_inv=2.0,
        kv_c=inp["kv_c"], cache=cache, slot_mapping=slots, cache_scale_inv=4.0)
    torch.cuda.synchronize()
    assert_same(qg, qc)
    assert_same(kg, kc)
    assert_same(cache_gpu, cache)
    assert flag.item() == 0


@needs_gpu
@pytest.mark.parametrize("page_size", [1, 16, 128])
def test_gpu_kv_ops_match_cpu(page_size):
    n, heads = 150, 16
    inp = rope_inputs(n, heads, seed=18)
    num_pages = (2 * n + page_size - 1) // page_size
    cache = random_cache(num_pages, page_size, seed=19)
    slots = torch.randperm(num_pages * page_size, generator=torch.Generator().manual_seed(20))[:n]
    slots[[3, 99]] = -1
    cache_gpu = cache.cuda()
    fp8mla.mla_kv_cache_write(inp["kv_c"].cuda(), inp["k_pe"].cuda(), cache_gpu, slots.cuda(),
                              scale_inv=0.5)
    fp8mla.mla_kv_cache_write(inp["kv_c"], inp["k_pe"], cache, slots, scale_inv=0.5)
    torch.cuda.synchronize()
    assert_same(cache_gpu, cache)

    read = torch.randint(0, num_pages * page_size, (n,), generator=torch.Generator().manual_seed(21))
    for g, c in zip(fp8mla.mla_kv_gather(cache_gpu, read.cuda(), 3.0),
                    fp8mla.mla_kv_gather(cache, read, 3.0)):
        assert_same(g, c)
    for g, c in zip(fp8mla.mla_kv_pack_quantize_fp8(inp["k_nope"].cuda(), inp["k_pe"].cuda(),
                                                    inp["v"].cuda(), k_scale_inv=0.5,
                                                    v_scale_inv=8.0),
                    fp8mla.mla_kv_pack_quantize_fp8(inp["k_nope"], inp["k_pe"], inp["v"],
                                                    k_scale_inv=0.5, v_scale_inv=8.0)):
        assert_same(g, c)
    for v_layout in ("token_major", "transposed"):
        assert_same(fp8mla.mla_v_quantize_fp8(inp["v"].cuda(), v_scale_inv=8.0,
                                              v_layout=v_layout).cpu(),
                    fp8mla.mla_v_quantize_fp8(inp["v"], v_scale_inv=8.0, v_layout=v_layout))


@needs_gpu
def test_gpu_bad_slots_and_positions_set_error_flag():
    inp = rope_inputs(4, 2, seed=22, device="cuda", max_pos=8)
    cos_sin = fp8mla.make_cos_sin_cache(8, device="cuda")
    cache = random_cache(1, 4, seed=23, device="cuda")
    before = cache.clone()
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    # Bad slot: that token is skipped, the others written, the flag set; no exception.
    fp8mla.mla_kv_cache_write(inp["kv_c"], inp["k_pe"], cache,
                              torch.tensor([0, 9, -1, 2], device="cuda"), error_flag=flag)
    torch.cuda.synchronize()
    assert flag.item() == 1
    np.testing.assert_array_equal(as_bytes(cache)[0, [1, 3]], as_bytes(before)[0, [1, 3]])
    # Bad position: that token's q/k rows are zeros, its cache row skipped.
    flag.zero_()
    positions = inp["positions"].clone()
    positions[2] = 100
    cache2 = before.clone()
    q, k = fp8mla.mla_rope_quantize_fp8(
        inp["q_nope"], inp["q_pe"], inp["k_nope"], inp["k_pe"], positions, cos_sin,
        kv_c=inp["kv_c"], cache=cache2, slot_mapping=torch.arange(4, device="cuda"),
        error_flag=flag)
    torch.cuda.synchronize()
    assert flag.item() == 1
    assert not as_bytes(q[2]).any() and not as_bytes(k[2]).any()
    assert_same(cache2[0, 2], before[0, 2])
    # Gather of a bad slot: zeros and the flag.
    flag.zero_()
    kv, pe = fp8mla.mla_kv_gather(cache, torch.tensor([1, 4], device="cuda"), 1.0, error_flag=flag)
    torch.cuda.synchronize()
    assert flag.item() == 1 and not as_bytes(kv[1]).any() and not as_bytes(pe[1]).any()


@needs_gpu
def test_gpu_side_stream():
    inp = rope_inputs(64, 16, seed=24, device="cuda")
    cos_sin = fp8mla.make_cos_sin_cache(128, device="cuda")
    expected = fp8mla.mla_rope_quantize_fp8(*rope_args({k: v.cpu() for k, v in inp.items()},
                                                       cos_sin.cpu()))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got = fp8mla.mla_rope_quantize_fp8(*rope_args(inp, cos_sin))
    stream.synchronize()
    for g, e in zip(got, expected):
        assert_same(g.cpu(), e)


@needs_gpu
def test_cuda_graph_capture_and_replay_rope():
    tokens, heads = 96, 16
    inp = rope_inputs(tokens, heads, seed=25, device="cuda", max_pos=4096)
    cos_sin = fp8mla.make_cos_sin_cache(4096, yarn=YARN, device="cuda")  # not inside the capture
    cache = random_cache(8, 64, seed=26, device="cuda")
    slots = torch.arange(tokens, device="cuda")
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    q_out = torch.empty(tokens, heads, 192, dtype=torch.float8_e4m3fn, device="cuda")
    k_out = torch.empty_like(q_out)

    def step():
        fp8mla.mla_rope_quantize_fp8(*rope_args(inp, cos_sin), q_scale_inv=0.5, q_out=q_out,
                                     k_out=k_out, kv_c=inp["kv_c"], cache=cache,
                                     slot_mapping=slots, cache_scale_inv=2.0, error_flag=flag)

    graph = capture(step)

    for seed in [1, 2, 3]:
        new = rope_inputs(tokens, heads, seed=100 + seed, max_pos=4096)
        for name in ("q_nope", "q_pe", "k_nope", "k_pe", "kv_c", "positions"):
            inp[name].copy_(new[name])
        slots.copy_(torch.randperm(512, generator=torch.Generator().manual_seed(seed))[:tokens])
        q_out.fill_(0)
        graph.replay()
        torch.cuda.synchronize()
        # The CPU op rewrites every row the replay wrote: equal bytes mean equal rows.
        expected_cache = cache.cpu()
        expected_cache.view(torch.uint8).view(-1, 576)[slots.cpu()] = 0
        qc, kc = fp8mla.mla_rope_quantize_fp8(
            *rope_args({k: v.cpu() for k, v in inp.items()}, cos_sin.cpu()), q_scale_inv=0.5,
            kv_c=inp["kv_c"].cpu(), cache=expected_cache, slot_mapping=slots.cpu(),
            cache_scale_inv=2.0)
        assert_same(q_out.cpu(), qc)
        assert_same(k_out.cpu(), kc)
        assert_same(cache.cpu(), expected_cache)
        assert flag.item() == 0


@needs_gpu
def test_gpu_split_k_matches_cpu_and_attention_reads_it():
    """The rope op's and the pack's k_rope_out on CUDA give the CPU's bytes, and attention over
    (k_out, k_rope_out) the bytes of attention over the whole K."""
    cos_sin = fp8mla.make_cos_sin_cache(4096, yarn=YARN, device="cpu")
    inp = rope_inputs(300, 16, torch.bfloat16, seed=8, max_pos=4096)
    gpu = {k: v.cuda() for k, v in inp.items()}
    rope_g = torch.empty(300, 64, dtype=torch.float8_e4m3fn, device="cuda")
    rope_c = torch.empty(300, 64, dtype=torch.float8_e4m3fn)
    qg, kg = fp8mla.mla_rope_quantize_fp8(*rope_args(gpu, cos_sin.cuda()), k_scale_inv=2.0,
                                          k_rope_out=rope_g)
    qc, kc = fp8mla.mla_rope_quantize_fp8(*rope_args(inp, cos_sin), k_scale_inv=2.0,
                                          k_rope_out=rope_c)
    _, k_whole = fp8mla.mla_rope_quantize_fp8(*rope_args(gpu, cos_sin.cuda()), k_scale_inv=2.0)
    torch.cuda.synchronize()
    assert_same(kg, kc)
    assert_same(rope_g, rope_c)
    assert_same(kg, k_whole[..., :128])
    assert_same(rope_g, k_whole[:, 0, 128:])
    kv = gpu["q_nope"].new_empty(300, 16, 256).normal_()
    pack_rope = torch.empty(300, 1, 64, dtype=torch.float8_e4m3fn, device="cuda")
    k_pack, v_pack = fp8mla.mla_kv_pack_quantize_fp8(kv[..., :128], gpu["k_pe"], kv[..., 128:],
                                                     k_rope_out=pack_rope, v_layout="transposed")
    k_pack_whole, _ = fp8mla.mla_kv_pack_quantize_fp8(kv[..., :128], gpu["k_pe"], kv[..., 128:])
    assert_same(k_pack, k_pack_whole[..., :128])
    assert_same(pack_rope[:, 0], k_pack_whole[:, 0, 128:])
    cu = torch.tensor([0, 100, 300], dtype=torch.int32, device="cuda")
    one = torch.ones(1, device="cuda")
    attend = lambda k, k_rope: fp8mla.prefill_attention(  # noqa: E731
        qg, k, v_pack, cu, cu, 200, 200, softmax_scale=0.07, q_descale=one, k_descale=one,
        v_descale=one, k_rope=k_rope)
    assert_same(attend(k_pack, pack_rope), attend(k_pack_whole, None))
