"""The two torch paths of every op: the eager one (plain torch.Tensor arguments, not compiling, no
dispatch mode: the implementation called directly, tensors read by _C without DLPack) and the
custom op through torch's dispatcher (tensor subclasses, dispatch modes, torch.compile) give the
same bytes; the eager one never enters the dispatcher. On CPU tensors, and on a GPU with a CUDA
build. Skipped (visibly) without torch."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("ml_dtypes")
import fp8mla  # noqa: E402
import fp8mla.torch_ops as torch_ops  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch_helpers import assert_identical, assert_same, needs_gpu  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=needs_gpu)]
T, H, PAGE = 5, 2, 4
E4M3 = torch.float8_e4m3fn


def rand(shape, seed, device, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) * 4 - 2).to(dtype).to(device)


def inputs(device):
    q = rand((T, H, 192), 1, device)
    ckv = rand((T, 576), 2, device)
    kv = rand((T, H, 256), 3, device)
    return dict(q=q, ckv=ckv, kv=kv, x=rand((T, 256), 4, device), positions=torch.arange(
        T, device=device), cos_sin=fp8mla.make_cos_sin_cache(16, device=device),
        **{name: torch.zeros(3, PAGE, 576, dtype=E4M3, device=device)
           for name in ("cache", "cache_written", "cache_prepared")},
        slots=torch.tensor([0, 5, -1, 9, 2], device=device),
        cu=torch.tensor([0, 2, T], dtype=torch.int32, device=device),
        one=torch.ones(1, device=device))


def step(a):
    """Every tensor op once, as an engine's prefill step uses them; returns what they wrote.
    Each op that writes a cache writes its own, read after the last write: torch 2.11's Inductor
    drops a clone taken between two custom ops that mutate the same graph input and returns the
    input itself (docs/user-guide.md, "CUDA graphs and torch.compile")."""
    x, q, kv, ckv = a["x"], a["q"], a["kv"], a["ckv"]
    out = [fp8mla.quantize_fp8(x, 2.0), fp8mla.quantize_fp8(x, a["one"])]
    out += fp8mla.quantize_fp8_dynamic(x)
    out += fp8mla.quantize_fp8_per_token_group(x, scale_layout="packed_ue8m0")
    out += fp8mla.quantize_nvfp4(x, 40.0)
    q8, k8 = fp8mla.mla_rope_quantize_fp8(q[..., :128], q[..., 128:], kv[..., :128],
                                          ckv[:, 512:], a["positions"], a["cos_sin"],
                                          q_scale_inv=4.0, k_scale_inv=4.0, cache=a["cache"],
                                          slot_mapping=a["slots"], kv_c=ckv[:, :512])
    fp8mla.mla_kv_cache_write(ckv[:, :512], ckv[:, 512:], a["cache_written"], a["slots"].flip(0))
    out += [q8, k8]
    out += fp8mla.mla_kv_gather(a["cache"], a["slots"][:2], 0.5)
    k_pack, v8 = fp8mla.mla_kv_pack_quantize_fp8(kv[..., :128], ckv[:, 512:], kv[..., 128:],
                                                 v_layout="transposed")
    out += [k_pack, v8, fp8mla.mla_v_quantize_fp8(kv[..., 128:])]
    o, lse = fp8mla.prefill_attention(q8, k8, v8, a["cu"], a["cu"], 3, 3,
                                      softmax_scale=1 / math.sqrt(192), q_descale=0.25,
                                      k_descale=0.25, v_descale=a["one"], return_lse=True)
    out += [o, lse, *fp8mla.merge_attention_states(o, lse, o, lse)]
    backend = fp8mla.make_attention_backend("fp8-hopper" if x.is_cuda else "cpu")
    out += backend.prepare_prefill_qkv(q[..., :128], q[..., 128:], kv[..., :128], ckv[:, 512:],
                                       a["positions"], a["cos_sin"], kv[..., 128:],
                                       kv_a=ckv[:, :512], cache=a["cache_prepared"],
                                       slot_mapping=a["slots"])
    out += backend.pack_prefix_chunk_kv(kv[..., :128], ckv[:, 512:], kv[..., 128:])
    return out + [a[name].clone() for name in ("cache", "cache_written", "cache_prepared")]


class Recorder(TorchDispatchMode):
    """A dispatch mode that records the fp8mla ops it sees (so every call takes the dispatcher)."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "fp8mla":
            self.seen.add(func._opname)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device", DEVICES)
def test_eager_and_dispatcher_paths_agree(device):
    eager = step(inputs(device))
    with Recorder() as recorder:
        dispatched = step(inputs(device))
    assert recorder.seen == set(torch_ops._EAGER) | {"quantize_fp8_scale_tensor"}
    for e, d in zip(eager, dispatched):
        assert_same(e, d)


def test_eager_path_does_not_enter_the_dispatcher(monkeypatch):
    def refuse(*args):
        raise AssertionError("the eager path called the custom op")

    for entry in torch_ops._EAGER.values():
        for name in ("_custom", "_custom_scale_tensor"):
            if name in entry.__globals__:
                monkeypatch.setitem(entry.__globals__, name, refuse)
    step(inputs("cpu"))


def test_tensor_subclass_takes_the_custom_op(monkeypatch):
    class Marked(torch.Tensor):
        pass

    calls = []
    entry = torch_ops._EAGER["quantize_fp8"]
    custom = entry.__globals__["_custom"]
    monkeypatch.setitem(entry.__globals__, "_custom",
                        lambda *args: calls.append(args) or custom(*args))
    x = rand((3, 128), 5, "cpu")
    got = fp8mla.quantize_fp8(x.as_subclass(Marked), 2.0)
    assert len(calls) == 1
    assert_same(got.as_subclass(torch.Tensor), fp8mla.quantize_fp8(x, 2.0))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph_matches_eager(device):
    a = inputs(device)
    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(step, fullgraph=True, backend=backend)
    got = compiled(inputs(device))
    for g, e in zip(got, step(a)):
        assert_same(g, e)


def test_raw_bytes_strided_views_and_empty_tensors():
    x = rand((4, 384), 6, "cpu")
    expected = fp8mla.quantize_fp8(x[1:, 128:].contiguous(), 2.0)
    assert_same(fp8mla.quantize_fp8(x[1:, 128:], 2.0), expected)  # storage offset, row stride
    as_bytes = torch.empty(3, 256, dtype=torch.uint8)
    fp8mla.quantize_fp8(x[1:, 128:], 2.0, out=as_bytes)
    assert_same(as_bytes.view(E4M3), expected)
    assert fp8mla.quantize_fp8(x[:0], 2.0).shape == (0, 384)
    grad = x.float().requires_grad_()
    assert_same(fp8mla.quantize_fp8(grad, 2.0), fp8mla.quantize_fp8(x.float(), 2.0))
    # _C reads a subclass through its attributes by name (nn.Parameter: the weights' type).
    out = torch.empty(4, 384, dtype=E4M3)
    fp8mla._C.quantize_fp8(torch.nn.Parameter(x, requires_grad=False), out, 2.0, 0)
    assert_same(out, fp8mla.quantize_fp8(x, 2.0))


def test_unsupported_tensors_are_named():
    with pytest.raises(fp8mla.InvalidArgumentError, match="`input`: dtype float64 has no fp8mla"):
        fp8mla.quantize_fp8(torch.zeros(2, 128, dtype=torch.float64), 1.0)
    with pytest.raises(fp8mla.InvalidArgumentError, match="`out`: dtype uint16 has no fp8mla"):
        fp8mla.quantize_fp8(torch.zeros(2, 128), 1.0, out=torch.zeros(2, 128, dtype=torch.uint16))
    with pytest.raises(fp8mla.InvalidArgumentError, match="`input`: expected an array that"):
        fp8mla.quantize_fp8(torch.zeros(2, 128, device="meta"), 1.0,
                            out=torch.empty(2, 128, dtype=E4M3))


def reader_cases(device):
    """Tensors of every kind an op reads: each dtype, offsets, steps, transposes, broadcast,
    empty and 0-dim shapes, a tensor that requires grad."""
    base = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32, device=device).reshape(2, 3, 4, 5)
    cases = [base, base[1:, :, 2:], base.transpose(0, 3), base[..., ::2], base.select(2, 1),
             base[:0], torch.zeros(3, device=device).expand(5, 3), torch.tensor(2.0, device=device),
             base.clone().requires_grad_(), base.view(torch.int32)[:, 1:]]
    names = ("bfloat16", "float16", "float32", "float64", "int8", "int16", "int32", "int64",
             "uint8", "uint16", "bool", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu",
             "float4_e2m1fn_x2")
    for name in names:
        if hasattr(torch, name):
            cases.append(torch.empty(6, 8, dtype=getattr(torch, name), device=device)[2:, 1::3])
    return cases


@pytest.mark.parametrize("device", DEVICES)
def test_both_torch_readers_see_the_same_tensor(device):
    """The shim reader (torch's C shim on the TensorImpl) and the attribute reader agree on
    every tensor kind, and both agree with torch's own answers."""
    assert fp8mla._C.torch_tensor_reader() == "shim", "torch 2.11's shim should pass its check"
    for t in reader_cases(device):
        by_shim = fp8mla._C._read_torch_tensor(t, "shim")
        assert by_shim == fp8mla._C._read_torch_tensor(t, "attributes"), (t.dtype, t.shape)
        data, _, shape, strides, (kind, index) = by_shim
        assert (data, shape, strides) == (t.data_ptr(), tuple(t.shape), t.stride())
        assert kind == t.device.type and index == (t.device.index or 0)
    # Not a CPU or CUDA tensor: neither reader takes it (DLPack then names what is wrong).
    meta = torch.empty(2, 3, device="meta")
    assert fp8mla._C._read_torch_tensor(meta, "shim") is None
    assert fp8mla._C._read_torch_tensor(meta, "attributes") is None
    # A sparse tensor has no strides: the shim's error hands it to the attributes, which raise
    # torch's own error.
    sparse = torch.zeros(2, 3, device=device).to_sparse()
    for reader in ("shim", "attributes"):
        with pytest.raises(RuntimeError):
            fp8mla._C._read_torch_tensor(sparse, reader)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_allocator_makes_what_torch_empty_makes(device):
    """_C.torch_empty (libtorch's allocation from C++, torch's wrapper): an exact torch.Tensor of
    the dtype, shape and device asked for, row-major, not requiring grad; None where torch
    allocates instead (a subclass, a shape that is not a tuple of ints, a size libtorch refuses)."""
    assert fp8mla._C.torch_allocator() == "grouped", "torch 2.11 should pass the allocator's check"
    like = torch.zeros(6, 7, device=device).requires_grad_()
    for dtype in set(torch_ops._DTYPES.values()) | {torch.uint8, torch.bfloat16}:
        for shape in ((3, 5), (0, 4, 2), (9,), (), None):
            made = fp8mla._C.torch_empty(like, dtype, shape)
            want = torch.empty(like.shape if shape is None else shape, dtype=dtype, device=device)
            assert made.__class__ is torch.Tensor and made.dtype == dtype
            assert (made.shape, made.stride(), made.device) == (want.shape, want.stride(),
                                                                 want.device)
            assert not made.requires_grad
    words = fp8mla._C.torch_empty(like, torch.int32, (1000,))
    words.fill_(-7)
    assert bool((words == -7).all())
    assert fp8mla._C.torch_empty(torch.nn.Parameter(like), torch.float32, (2,)) is None
    assert fp8mla._C.torch_empty(like, torch.float32, [2, 3]) is None
    assert fp8mla._C.torch_empty(like, torch.float32, (2, -1)) is None
    assert fp8mla._C.torch_empty(like, torch.complex64, (2,)) is None
    # A view of the allocation (a transposed V): torch's as_strided of an allocation that size.
    view = fp8mla._C.torch_empty(like, E4M3, (2, 128, 40), (33, 2, 128), (1, 128 * 40, 40))
    want = torch.empty(2, 128, 40, dtype=E4M3, device=device).as_strided((33, 2, 128),
                                                                         (1, 128 * 40, 40))
    assert view.__class__ is torch.Tensor and view.dtype == E4M3
    assert (view.shape, view.stride(), view.device) == (want.shape, want.stride(), want.device)
    assert view.untyped_storage().nbytes() == 2 * 128 * 40
    assert view.untyped_storage().data_ptr() == view.data_ptr()
    # A view past its allocation, or shape and strides of different lengths: torch's to refuse.
    assert fp8mla._C.torch_empty(like, E4M3, (2, 3), (3, 3), (3, 1)) is None
    assert fp8mla._C.torch_empty(like, E4M3, (2, 3), (2, 3), (3,)) is None


@pytest.mark.parametrize("device", DEVICES)
def test_torch_empty_group_is_torch_empty_in_one_allocation(device):
    """_C.torch_empty_group: each output is what _C.torch_empty makes of its spec (dtype, shape,
    strides, device, not requiring grad), all in one storage at 256-byte-aligned offsets in the
    order given, apart from each other; None where each output must be allocated alone."""
    like = torch.zeros(6, 7, dtype=torch.bfloat16, device=device)
    specs = ((like, "e4m3", (3, 5, 7), None, None),
             (like, "f32", (2, 4), None, None),
             (like, "e4m3", (2, 128, 40), (33, 2, 128), (1, 128 * 40, 40)),
             (like, None, None, None, None))
    made = fp8mla._C.torch_empty_group(specs)
    assert len(made) == len(specs)
    storage = made[0].untyped_storage().data_ptr()
    end = storage
    for out, (spec_like, name, shape, view_shape, view_strides) in zip(made, specs):
        dtype = spec_like.dtype if name is None else torch_ops._DTYPES[name]
        want = fp8mla._C.torch_empty(spec_like, dtype, shape, view_shape, view_strides)
        assert out.__class__ is torch.Tensor and not out.requires_grad
        assert (out.dtype, out.shape, out.stride(), out.device) == (
            want.dtype, want.shape, want.stride(), want.device)
        assert out.untyped_storage().data_ptr() == storage
        assert out.data_ptr() >= end and (out.data_ptr() - storage) % 256 == 0
        end = out.data_ptr() + want.untyped_storage().nbytes()
    # Apart: each keeps what was written into it after the others were written.
    words = fp8mla._C.torch_empty_group(tuple((like, "i32", (n,), None, None) for n in (1, 70, 3)))
    for i, w in enumerate(words):
        w.fill_(i + 1)
    assert all(bool((w == i + 1).all()) for i, w in enumerate(words))
    # None: a non-row-major like for its own dtype (torch.empty_like keeps its strides), a
    # dtype name the table lacks, more than four outputs, a spec torch_empty refuses.
    assert fp8mla._C.torch_empty_group(((like.t(), None, None, None, None),)) is None
    assert fp8mla._C.torch_empty_group(((like, "f64", (2,), None, None),)) is None
    assert fp8mla._C.torch_empty_group(((like, "f32", (2,), None, None),) * 5) is None
    assert fp8mla._C.torch_empty_group(((like, "f32", (2, -1), None, None),)) is None
    if device == "cuda":
        cpu = torch.zeros(2)
        assert fp8mla._C.torch_empty_group(((like, "f32", (2,), None, None),
                                            (cpu, "f32", (2,), None, None))) is None


@pytest.mark.parametrize("device", DEVICES)
def test_every_allocator_gives_the_same_outputs(device, monkeypatch):
    """Every op with its outputs allocated together by _C.torch_empty_group, then one by one by
    _C.torch_empty, then by torch: the same bytes, shapes, strides and dtypes. Under a dispatch
    mode the mode sees torch's own allocations."""
    grouped = step(inputs(device))
    monkeypatch.setattr(torch_ops, "_TORCH_EMPTY_GROUP", None)
    one_by_one = step(inputs(device))
    monkeypatch.setattr(torch_ops, "_TORCH_EMPTY", None)
    by_torch = step(inputs(device))
    for g, o, t in zip(grouped, one_by_one, by_torch):
        assert_identical(g, o)
        assert_identical(g, t)
    monkeypatch.undo()

    class Allocations(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(func.__name__)
            return func(*args, **(kwargs or {}))

    x = rand((3, 128), 7, device)
    with Allocations() as mode:
        fp8mla.quantize_fp8(x, 2.0)
    assert any(name.startswith(("empty", "new_empty")) for name in mode.seen), mode.seen
