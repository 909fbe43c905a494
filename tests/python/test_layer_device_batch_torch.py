"""fp8mla.MlaLayer.prefill_device_batch with torch tensors on the GPU: a batch of new tokens
padded past its sequences (random hidden rows, position 0, slot -1) gives prefill's bytes of the
host batch on its real rows and in the cache; and, captured once in a torch.cuda.graph with
given `out` and `workspace`, replayed after another batch of the same padded shape (other
sequence lengths, hidden states and slots) was copied into the captured tensors, it gives that
batch's eager prefill. Both paths (fp8-hopper, bf16-hopper), as the C++ CUDA test runs them.
On the CPU and the GPU: its torch op (torch.ops.fp8mla.mla_layer_prefill_device_batch) and
torch.compile(fullgraph=True) of a function calling it give eager mode's bytes."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
ml_dtypes = pytest.importorskip("ml_dtypes")
import fp8mla  # noqa: E402
from torch_helpers import assert_same, capture, needs_gpu  # noqa: E402

PAGE = 16
PAGES = 16
TOKENS = 112  # the padded shape: rows, sequences, max_seqlen_q
MAX_SEQLEN_Q = 64
BATCH_A = [37, 20, 1, 9]  # new tokens per sequence (no cached prefix): 67 real rows
BATCH_B = [5, 64, 30, 2]  # the same padded shape: 101 real rows
PATHS = [("fp8", "fp8-hopper"), ("fp8", "bf16-hopper"), ("bf16", "fp8-hopper")]


class Padded:
    """A batch as prefill's host batch and as the device metadata of its padded shape: the rows
    past its sequences random, position 0, slot -1."""

    def __init__(self, lengths, width, seed, device="cuda"):
        rng = np.random.default_rng(seed)
        slots = rng.permutation(PAGES * PAGE)
        self.batch, cu, positions, slot_mapping = [], [0], [], []
        for n in lengths:
            mine = slots[cu[-1]:cu[-1] + n].tolist()
            self.batch.append(fp8mla.MlaSequence(0, n, mine))
            positions.extend(range(n))
            slot_mapping.extend(mine)
            cu.append(cu[-1] + n)
        self.real = cu[-1]
        pad = TOKENS - self.real
        assert pad > 0 and max(lengths) <= MAX_SEQLEN_Q
        hidden = rng.standard_normal((TOKENS, width)).astype(np.float32)
        self.hidden = torch.from_numpy(hidden).to(torch.bfloat16).to(device)
        self.cu_seqlens_q = torch.tensor(cu, dtype=torch.int32, device=device)
        self.positions = torch.tensor(positions + [0] * pad, dtype=torch.int64, device=device)
        self.slot_mapping = torch.tensor(slot_mapping + [-1] * pad, dtype=torch.int64,
                                         device=device)


def random_cache(device="cuda"):
    """Random e4m3 bytes (|x| < 2, no NaN), so that a stray write to any slot shows."""
    g = torch.Generator(device=device).manual_seed(2)
    bits = torch.randint(0, 0x40, (PAGES, PAGE, 576), generator=g, dtype=torch.uint8,
                         device=device)
    sign = torch.randint(0, 2, bits.shape, generator=g, dtype=torch.uint8, device=device) << 7
    return (bits | sign).view(torch.float8_e4m3fn)


def host_prefill(layer, p: Padded, cache_before):
    """(out of the real rows, cache after): the eager prefill of p's host batch."""
    cache = cache_before.clone()
    out = layer.prefill(p.hidden[:p.real], p.batch, cache)
    synchronize(cache)
    return out, cache


def synchronize(t):
    if t.is_cuda:
        torch.cuda.synchronize()


@needs_gpu
@pytest.mark.parametrize("fmt,backend", PATHS)
def test_real_rows_and_cache_equal_the_host_batch(fmt, backend):
    weights = fp8mla.generate_mla_weights("tiny", fmt, seed=3)
    layer = fp8mla.MlaLayer(None, weights, device="cuda", backend=backend)
    p = Padded(BATCH_A, weights.config.hidden, 1)
    cache_before = random_cache()
    want_out, want_cache = host_prefill(layer, p, cache_before)
    cache = cache_before.clone()
    out = layer.prefill_device_batch(p.hidden, p.cu_seqlens_q, p.positions, p.slot_mapping, cache,
                                     max_seqlen_q=MAX_SEQLEN_Q)
    torch.cuda.synchronize()
    assert out.shape == (TOKENS, weights.config.hidden) and out.dtype == torch.bfloat16
    assert out.device == p.hidden.device
    assert_same(out[:p.real], want_out)
    assert_same(cache, want_cache)  # the padding rows (slot -1) wrote nothing
    assert not torch.equal(cache.view(torch.uint8), cache_before.view(torch.uint8))


@needs_gpu
@pytest.mark.parametrize("fmt,backend", PATHS)
def test_cuda_graph_replays_for_another_batch_of_the_padded_shape(fmt, backend):
    weights = fp8mla.generate_mla_weights("tiny", fmt, seed=3)
    layer = fp8mla.MlaLayer(None, weights, device="cuda", backend=backend)
    width = weights.config.hidden
    a, b = Padded(BATCH_A, width, 1), Padded(BATCH_B, width, 4)
    assert len(BATCH_A) == len(BATCH_B)
    cache_before = random_cache()
    want = {"a": host_prefill(layer, a, cache_before), "b": host_prefill(layer, b, cache_before)}

    # The tensors the graph captures: a's metadata at first, then each batch's copied in place.
    static = Padded(BATCH_A, width, 1)
    cache = cache_before.clone()
    out = torch.empty((TOKENS, width), dtype=torch.bfloat16, device="cuda")
    workspace = torch.empty(layer.workspace_bytes(TOKENS, len(BATCH_A), 0), dtype=torch.uint8,
                            device="cuda")

    def step():  # stream: the current one, the graph's own while capturing
        layer.prefill_device_batch(static.hidden, static.cu_seqlens_q, static.positions,
                                   static.slot_mapping, cache, max_seqlen_q=MAX_SEQLEN_Q,
                                   out=out, workspace=workspace)

    graph = capture(step)  # warmed up once on a side stream, then captured
    for name, p in (("b", b), ("a", a)):
        for field in ("hidden", "cu_seqlens_q", "positions", "slot_mapping"):
            getattr(static, field).copy_(getattr(p, field))
        cache.copy_(cache_before)
        out.fill_(0)
        graph.replay()
        torch.cuda.synchronize()
        want_out, want_cache = want[name]
        assert_same(out[:p.real], want_out)
        assert_same(cache, want_cache)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_gpu)])
def test_torch_op_and_torch_compile_give_eager_bytes(device):
    weights = fp8mla.generate_mla_weights("tiny", "fp8", seed=3)
    layer = fp8mla.MlaLayer(None, weights, device=device)
    p = Padded(BATCH_A, weights.config.hidden, 1, device)
    cache_before = random_cache(device)
    want_out, want_cache = host_prefill(layer, p, cache_before)

    def step(cache):
        return layer.prefill_device_batch(p.hidden, p.cu_seqlens_q, p.positions, p.slot_mapping,
                                          cache, max_seqlen_q=MAX_SEQLEN_Q)

    eager_cache = cache_before.clone()
    eager = step(eager_cache)
    op_cache, op_out = cache_before.clone(), torch.empty_like(eager)
    op_args = (layer.number, p.hidden, p.cu_seqlens_q, p.positions, p.slot_mapping, op_cache,
               op_out, None, MAX_SEQLEN_Q, None, None, 0, 8192, 8192, 1.0, 1.0, 1.0, 1.0, True, True,
               False, 0)
    torch.ops.fp8mla.mla_layer_prefill_device_batch(*op_args)
    # fullgraph: the layer's C++ call would break the graph; the torch op does not.
    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled_cache = cache_before.clone()
    compiled = torch.compile(step, fullgraph=True, backend=backend)(compiled_cache)
    synchronize(compiled)
    assert_same(eager[:p.real], want_out)
    assert_same(eager_cache, want_cache)
    for out, cache in ((op_out, op_cache), (compiled, compiled_cache)):
        assert_same(out[:p.real], want_out)
        assert_same(cache, want_cache)
    if device == "cpu":
        torch.library.opcheck(torch.ops.fp8mla.mla_layer_prefill_device_batch.default, op_args,
                              test_utils=("test_faketensor",))


def test_torch_op_of_a_layer_that_is_gone_is_an_error():
    weights = fp8mla.generate_mla_weights("tiny", "fp8", seed=3)
    layer = fp8mla.MlaLayer(None, weights)
    p = Padded(BATCH_A, weights.config.hidden, 1, "cpu")
    cache, out = random_cache("cpu"), torch.empty(TOKENS, weights.config.hidden,
                                                  dtype=torch.bfloat16)
    number = layer.number
    del layer
    with pytest.raises(fp8mla.InvalidArgumentError, match=f"no live fp8mla.MlaLayer has number "
                                                          f"{number}"):
        torch.ops.fp8mla.mla_layer_prefill_device_batch(
            number, p.hidden, p.cu_seqlens_q, p.positions, p.slot_mapping, cache, out, None,
            MAX_SEQLEN_Q, None, None, 0, 8192, 8192, 1.0, 1.0, 1.0, 1.0, True, True, False, 0)
