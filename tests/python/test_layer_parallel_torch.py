"""Tensor and context parallelism with torch CUDA tensors through NCCL, one GPU: a torch.distributed
process group of world size 1, its NCCL communicator wrapped by fp8mla.nccl_communicator (as an
engine does). prefill_context_parallel of the one-rank CP batch is the plain prefill bit for bit
(output and cache), a TP "shard" of size 1 with the communicator is the plain layer, and the
communicator's collectives on CUDA tensors are the identity at size 1. Skipped (visibly) without
torch, a GPU, torch's NCCL backend or an fp8mla built with NCCL."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
ml_dtypes = pytest.importorskip("ml_dtypes")
import fp8mla  # noqa: E402
from torch_helpers import assert_same, needs_gpu  # noqa: E402

PAGE = 16

pytestmark = needs_gpu


@pytest.fixture(scope="module")
def nccl(tmp_path_factory):
    """(process group, fp8mla communicator) of world size 1; the group is destroyed at the end,
    after the communicator (which borrows its ncclComm_t) is no longer used."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("torch.distributed has no NCCL backend")
    torch.cuda.set_device(0)
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        pg = dist.group.WORLD
        # torch creates the NCCL communicator lazily: a first collective makes it.
        dist.all_reduce(torch.ones(1, device="cuda"), group=pg)
        torch.cuda.synchronize()
        backend = pg._get_backend(torch.device("cuda"))
        if not hasattr(backend, "_comm_ptr"):
            pytest.skip("ProcessGroupNCCL._comm_ptr needs PyTorch >= 2.2")
        ptr = backend._comm_ptr()
        try:
            comm = fp8mla.nccl_communicator(ptr)
        except fp8mla.UnsupportedError as e:  # fp8mla built without NCCL
            pytest.skip(str(e))
        yield pg, comm
        del comm
    finally:
        torch.cuda.synchronize()
        dist.destroy_process_group()


def inputs(config, lengths, seed=0):
    rng = np.random.default_rng(seed)
    pages = 16
    slots = rng.permutation(pages * PAGE)
    batch, used = [], 0
    for prefix, extend in lengths:
        batch.append(fp8mla.MlaSequence(prefix, extend, slots[used:used + prefix + extend]))
        used += prefix + extend
    tokens = sum(e for _, e in lengths)
    hidden = rng.standard_normal((tokens, config.hidden)).astype(np.float32)
    cache = rng.standard_normal((pages, PAGE, 576)).astype(ml_dtypes.float8_e4m3fn)
    hidden = torch.from_numpy(hidden).to(torch.bfloat16).cuda()
    cache = torch.from_numpy(cache.view(np.uint8)).view(torch.float8_e4m3fn).cuda()
    return hidden, batch, cache


def test_communicator_is_the_groups(nccl):
    _, comm = nccl
    assert (comm.rank, comm.size) == (0, 1)


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_one_rank_context_parallel_is_the_plain_prefill(nccl, fmt):
    _, comm = nccl
    config = fp8mla.mla_config("tiny")
    weights = fp8mla.generate_mla_weights(config, fmt, seed=5)
    layer = fp8mla.MlaLayer(None, weights, device="cuda")
    hidden, batch, cache = inputs(config, [(0, 13), (24, 9), (7, 0)], seed=1)
    cp = fp8mla.context_parallel_batch(batch, 0, 1)
    assert cp.tokens.tolist() == list(range(len(hidden)))
    plain_cache = cache.clone()
    plain = layer.prefill(hidden, batch, plain_cache)
    cp_cache = cache.clone()
    rows = hidden[torch.from_numpy(cp.tokens).cuda()]
    out = layer.prefill_context_parallel(rows, cp, comm, cp_cache)
    torch.cuda.synchronize()
    assert_same(out, plain)
    assert_same(cp_cache, plain_cache)
    # The workspace sized from the batch's limits, given explicitly.
    nbytes = layer.workspace_bytes(*cp.workspace_limits)
    workspace = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    again = layer.prefill_context_parallel(rows, cp, comm, cache.clone(), workspace=workspace)
    torch.cuda.synchronize()
    assert_same(again, plain)


def test_one_rank_tensor_parallel_with_the_communicator_is_the_plain_layer(nccl):
    _, comm = nccl
    config = fp8mla.mla_config("tiny")
    full = fp8mla.generate_mla_weights(config, "bf16", seed=3)
    shard = fp8mla.shard_mla_weights(full, 0, 1)
    hidden, batch, cache = inputs(config, [(0, 11), (40, 6)])
    plain = fp8mla.MlaLayer(None, full, device="cuda").prefill(hidden, batch, cache.clone())
    layer = fp8mla.MlaLayer(None, shard, device="cuda", communicator=comm)
    out = layer.prefill(hidden, batch, cache.clone())
    torch.cuda.synchronize()
    assert_same(out, plain)


def test_collectives_on_cuda_tensors(nccl):
    _, comm = nccl
    x = torch.randn(6, 40, device="cuda").bfloat16()
    before = x.clone()
    comm.all_reduce_sum(x)
    f32 = torch.randn(4, 8, device="cuda")
    shard = comm.reduce_scatter_sum(f32, torch.empty_like(f32))
    rows = torch.randn(3, 576, device="cuda").to(torch.float8_e4m3fn)
    gathered = comm.all_gather(rows, torch.empty_like(rows))
    in_place = torch.zeros_like(rows)
    in_place.copy_(rows)
    comm.all_gather(in_place, in_place)  # this rank's rows of out: the whole of it at size 1
    torch.cuda.synchronize()
    assert_same(x, before)
    assert_same(shard, f32)
    assert_same(gathered, rows)
    assert_same(in_place, rows)


def test_bad_arguments_are_errors(nccl):
    _, comm = nccl
    with pytest.raises(fp8mla.InvalidArgumentError):
        comm.all_reduce_sum(torch.zeros(4, dtype=torch.int32, device="cuda"))  # bf16 or f32 only
    with pytest.raises(fp8mla.InvalidArgumentError, match="expected the batch's rank 0 of 2"):
        config = fp8mla.mla_config("tiny")
        layer = fp8mla.MlaLayer(None, fp8mla.generate_mla_weights(config, "bf16"), device="cuda")
        hidden, batch, cache = inputs(config, [(0, 8)])
        cp = fp8mla.context_parallel_batch(batch, 0, 2)
        layer.prefill_context_parallel(hidden[torch.from_numpy(cp.tokens).cuda()], cp, comm, cache)
