"""fp8mla through torch: CPU tensors against the numpy reference, and with a CUDA build on a GPU,
GPU vs CPU bit-exactness, torch.compile(fullgraph=True) of the custom ops and CUDA graph capture.
Skipped (visibly) without torch, or without CUDA for the GPU tests."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")
import fp8mla  # noqa: E402
import fp8mla.torch_ops  # noqa: E402,F401  (registers the custom ops even if fp8mla came first)
import fp8mla_reference as ref  # noqa: E402
from torch_helpers import as_bytes, assert_identical, capture, needs_gpu, to_numpy  # noqa: E402

def make_input(shape, dtype=torch.bfloat16, seed=0, device="cpu", spread=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    if spread:
        x *= torch.exp2(torch.randint(-10, 10, shape, generator=g).float())
    return x.to(dtype).to(device)


def nan_equal(a: np.ndarray, b: np.ndarray, np_type=ml_dtypes.float8_e4m3fn):
    an = np.isnan(a.view(np_type).astype(np.float32))
    bn = np.isnan(b.view(np_type).astype(np.float32))
    np.testing.assert_array_equal(an, bn)
    np.testing.assert_array_equal(np.where(an, 0, a), np.where(bn, 0, b))


# ---- CPU torch tensors -------------------------------------------------------------------------


def test_custom_ops_registered():
    for name in ["quantize_fp8", "quantize_fp8_scale_tensor", "quantize_fp8_dynamic",
                 "quantize_fp8_per_token_group", "quantize_nvfp4"]:
        assert hasattr(torch.ops.fp8mla, name)


def test_custom_op_through_dispatcher():
    """The registered op itself (what torch.compile calls), not the eager fast path."""
    x = make_input((3, 128), torch.bfloat16, seed=12)
    out = torch.empty(3, 128, dtype=torch.float8_e4m3fn)
    torch.ops.fp8mla.quantize_fp8(x, out, 2.0, "e4m3", 0)
    nan_equal(as_bytes(out), ref.quantize_fp8(to_numpy(x), 2.0))
    torch.library.opcheck(torch.ops.fp8mla.quantize_fp8.default, (x, out, 2.0, "e4m3", 0),
                          test_utils=("test_faketensor",))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_torch_cpu_matches_reference(dtype):
    x = make_input((6, 256), dtype, seed=1)
    xn = to_numpy(x)
    out = fp8mla.quantize_fp8(x, 0.5)
    assert out.dtype == torch.float8_e4m3fn and out.device == x.device
    nan_equal(as_bytes(out), ref.quantize_fp8(xn, 0.5))
    out, scale = fp8mla.quantize_fp8_dynamic(x, dtype="e5m2")
    expected, expected_scale = ref.quantize_fp8_dynamic(xn, "e5m2")
    assert out.dtype == torch.float8_e5m2 and scale.item() == expected_scale
    nan_equal(as_bytes(out), expected, ml_dtypes.float8_e5m2)
    out, scales = fp8mla.quantize_fp8_per_token_group(x, group_size=64, scale_layout="tma_aligned")
    q, s, _ = ref.quantize_fp8_per_token_group(xn, 64)
    assert scales.stride() == (1, 8)
    nan_equal(as_bytes(out), q)
    np.testing.assert_array_equal(scales.numpy(), s)
    if dtype != torch.float32:
        out, bs = fp8mla.quantize_nvfp4(x, 30.0)
        packed, sf = ref.quantize_nvfp4(xn, 30.0)
        np.testing.assert_array_equal(as_bytes(out), packed)
        np.testing.assert_array_equal(as_bytes(bs), sf)


def test_torch_error_propagates():
    with pytest.raises(fp8mla.Error, match=r"`input` dtype: expected one of \{bf16, f16, f32\}"):
        fp8mla.quantize_fp8(torch.zeros(4, 128, dtype=torch.int32), 1.0)


def test_torch_requires_grad_input():
    x = make_input((2, 128), torch.float32, seed=2).requires_grad_()
    out = fp8mla.quantize_fp8(x, 1.0)
    nan_equal(as_bytes(out), ref.quantize_fp8(to_numpy(x), 1.0))


# ---- CUDA --------------------------------------------------------------------------------------

LAYOUTS = ["row_major", "column_major", "tma_aligned", "ue8m0", "packed_ue8m0"]


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 128), (37, 384), (4, 16, 576), (0, 128)])
def test_gpu_matches_cpu_per_tensor(dtype, shape):
    x = make_input(shape, dtype, seed=3)
    xg = x.cuda()
    for fp8 in ["e4m3", "e5m2"]:
        assert_identical(fp8mla.quantize_fp8(xg, 0.25, dtype=fp8), fp8mla.quantize_fp8(x, 0.25, dtype=fp8))
        scale_inv = torch.tensor([3.0])
        assert_identical(fp8mla.quantize_fp8(xg, scale_inv.cuda(), dtype=fp8),
                    fp8mla.quantize_fp8(x, scale_inv, dtype=fp8))
        og, sg = fp8mla.quantize_fp8_dynamic(xg, dtype=fp8)
        oc, sc = fp8mla.quantize_fp8_dynamic(x, dtype=fp8)
        assert_identical(og, oc)
        assert_identical(sg, sc)


@needs_gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("group_size", [64, 128])
@pytest.mark.parametrize("rows", [1, 7, 130])
def test_gpu_matches_cpu_group(layout, group_size, rows):
    x = make_input((rows, 768), torch.bfloat16, seed=4)
    og, sg = fp8mla.quantize_fp8_per_token_group(x.cuda(), group_size=group_size, scale_layout=layout)
    oc, sc = fp8mla.quantize_fp8_per_token_group(x, group_size=group_size, scale_layout=layout)
    assert_identical(og, oc)
    assert_identical(sg, sc)


@needs_gpu
@pytest.mark.parametrize("layout", ["swizzled", "linear"])
@pytest.mark.parametrize("shape", [(1, 64), (130, 48), (3, 5, 256), (300, 7168)])
def test_gpu_matches_cpu_nvfp4(layout, shape):
    x = make_input(shape, torch.bfloat16, seed=5, spread=False)
    gs = torch.tensor([448.0 * 6.0 / 4.0])
    og, bg = fp8mla.quantize_nvfp4(x.cuda(), gs.cuda(), layout=layout)
    oc, bc = fp8mla.quantize_nvfp4(x, gs, layout=layout)
    assert_identical(og, oc)
    assert_identical(bg, bc)


@needs_gpu
def test_gpu_strided_input_and_side_stream():
    kv = make_input((33, 8, 256), torch.bfloat16, seed=6).cuda()
    x = kv[..., 128:]
    expected = fp8mla.quantize_fp8(x.cpu(), 2.0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = fp8mla.quantize_fp8(x, 2.0)  # runs on `stream`, torch's current stream
    stream.synchronize()
    assert_identical(out, expected)
    out2 = torch.empty_like(out)
    fp8mla.quantize_fp8(x, 2.0, out=out2, stream=stream.cuda_stream)  # explicit handle
    stream.synchronize()
    assert_identical(out2, expected)


@needs_gpu
@pytest.mark.parametrize("op", ["quantize_fp8", "prefill_attention"])
def test_gpu_ordered_on_current_stream(op):
    # The input is written on a side stream behind a long sleep: an op that ran on any other
    # stream than torch's current one would read it before it is written.
    assert fp8mla._C.torch_cuda_context()  # _C resolves the stream (torch_cuda_context.hpp)
    t, h = 64, 4
    q = make_input((t, h, 192), torch.bfloat16, seed=8).cuda()
    k = make_input((t, h, 192), torch.bfloat16, seed=9).cuda()
    v = make_input((t, h, 128), torch.bfloat16, seed=10).cuda()
    cu = torch.tensor([0, t], dtype=torch.int32, device="cuda")
    run = {
        "quantize_fp8": lambda x: fp8mla.quantize_fp8(x, 2.0),
        "prefill_attention": lambda x: fp8mla.prefill_attention(
            x, k, v, cu, cu, t, t, softmax_scale=0.1),
    }[op]
    expected = run(q)
    target = torch.zeros_like(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU clock cycles
        target.copy_(q)
        out = run(target)
    side.synchronize()
    assert_identical(out, expected)


@needs_gpu
def test_gpu_device_mismatch_error():
    x = make_input((4, 128), torch.float32).cuda()
    with pytest.raises(fp8mla.Error, match="`out`: expected a tensor on cuda:0"):
        fp8mla.quantize_fp8(x, 1.0, out=torch.empty(4, 128, dtype=torch.float8_e4m3fn))


def test_torch_compile_max_seqlen_stays_symbolic():
    """An engine passes max_seqlen per batch: the compiled graph takes each new value without
    recompiling (a SymInt in the op's schema), and gives eager's bytes."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(40, 2, 192, generator=gen).to(torch.bfloat16)
    k = torch.randn(40, 2, 192, generator=gen).to(torch.bfloat16)
    v = torch.randn(40, 2, 128, generator=gen).to(torch.bfloat16)
    cu = torch.tensor([0, 40], dtype=torch.int32)

    def attend(q, k, v, cu, max_seqlen):
        return fp8mla.prefill_attention(q, k, v, cu, cu, max_seqlen, max_seqlen,
                                        softmax_scale=0.08, return_lse=True)

    counter = CompileCounter()
    compiled = torch.compile(attend, backend=counter, fullgraph=True)
    for max_seqlen in range(40, 52):
        for got, want in zip(compiled(q, k, v, cu, max_seqlen), attend(q, k, v, cu, max_seqlen)):
            assert_identical(got, want)
    assert counter.frame_count <= 2  # the first value, then one symbolic graph


def test_torch_compile_not_invalidated_by_other_array_types():
    """fp8mla called on numpy arrays or a Parameter elsewhere in the process does not make
    compiled graphs on tensors recompile (their routing reads no per-type cache)."""
    import numpy as np
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(lambda x: fp8mla.quantize_fp8(x, 0.5), backend=counter,
                             fullgraph=True)
    x = make_input((8, 256), torch.bfloat16, seed=2)
    compiled(x)
    frames = counter.frame_count
    fp8mla.quantize_fp8(np.ones((8, 256), np.float32), 1.0)
    fp8mla.quantize_fp8(torch.nn.Parameter(torch.ones(8, 256), requires_grad=False), 1.0)
    assert_identical(compiled(x), fp8mla.quantize_fp8(x, 0.5))
    assert counter.frame_count == frames


@pytest.mark.skipif(not hasattr(torch, "float8_e8m0fnu"), reason="torch without float8_e8m0fnu")
def test_torch_compile_inductor_ue8m0_scales():
    """UE8M0 scales allocated as float8_e8m0fnu compile with Inductor (which fails on a custom op
    mutating such a tensor: the op takes their uint8 view) and give eager's dtype and bytes."""
    def quantize(x):
        return fp8mla.quantize_fp8_per_token_group(x, group_size=128, scale_layout="ue8m0")

    torch._dynamo.reset()
    x = make_input((16, 512), torch.bfloat16, seed=4)
    want_out, want_scales = quantize(x)
    got_out, got_scales = torch.compile(quantize, fullgraph=True)(x)
    assert got_scales.dtype == want_scales.dtype == torch.float8_e8m0fnu
    assert_identical(got_out, want_out)
    assert_identical(got_scales, want_scales)


@needs_gpu
def test_torch_compile_fullgraph():
    def fn(x, scale_inv):
        a = fp8mla.quantize_fp8(x, scale_inv)
        b, s = fp8mla.quantize_fp8_dynamic(x * 2)
        c, cs = fp8mla.quantize_fp8_per_token_group(x, scale_layout="packed_ue8m0")
        d, ds = fp8mla.quantize_nvfp4(x, 100.0)
        return a, b, s, c, cs, d, ds

    x = make_input((64, 512), torch.bfloat16, seed=7, device="cuda")
    scale_inv = torch.tensor([0.5], device="cuda")
    compiled = torch.compile(fn, fullgraph=True)
    got = compiled(x, scale_inv)
    expected = fn(x, scale_inv)
    for g, e in zip(got, expected):
        assert_identical(g, e)
    # A second shape works too (recompiles or dynamic shapes).
    x2 = make_input((3, 256), torch.bfloat16, seed=8, device="cuda")
    for g, e in zip(compiled(x2, scale_inv), fn(x2, scale_inv)):
        assert_identical(g, e)


@needs_gpu
def test_cuda_graph_capture_and_replay():
    x = make_input((128, 1024), torch.bfloat16, seed=9, device="cuda")
    scale_inv = torch.tensor([1.0], device="cuda")
    out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device="cuda")
    group_out = torch.empty_like(out)
    group_scales = torch.empty(8, 128, device="cuda").t()  # column-major
    fp4 = torch.empty(128, 512, dtype=torch.uint8, device="cuda")
    fp4_scales = torch.empty(128, 64, dtype=torch.float8_e4m3fn, device="cuda")
    gs = torch.tensor([10.0], device="cuda")

    def step():
        fp8mla.quantize_fp8(x, scale_inv, out=out)
        fp8mla.quantize_fp8_per_token_group(x, out=group_out, scales=group_scales)
        fp8mla.quantize_nvfp4(x, gs, out=fp4, block_scales=fp4_scales)

    graph = capture(step)

    for value in [0.5, 2.0, 37.0]:
        scale_inv.fill_(value)
        x.copy_(make_input((128, 1024), torch.bfloat16, seed=int(value * 10), device="cuda"))
        out.fill_(0)  # replay must rewrite every element
        graph.replay()
        torch.cuda.synchronize()
        assert_identical(out, fp8mla.quantize_fp8(x.cpu(), value))
        oc, sc = fp8mla.quantize_fp8_per_token_group(x.cpu(), scales=torch.empty(8, 128).t())
        assert_identical(group_out, oc)
        assert_identical(group_scales, sc)
        pc, bc = fp8mla.quantize_nvfp4(x.cpu(), gs.cpu(), out=torch.empty(128, 512, dtype=torch.uint8))
        assert_identical(fp4, pc)
        assert_identical(fp4_scales, bc)
