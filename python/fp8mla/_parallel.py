"""Tensor and context parallelism from Python (fp8mla/mla_parallel.hpp; docs/parallelism.md).

    make_cpu_communicators(size) -> [MlaCommunicator]   (one in-process group, host tensors)
    make_nccl_communicators(devices) -> [MlaCommunicator]   (a group of this process's GPUs)
    nccl_communicator(comm_ptr) -> MlaCommunicator   (over an engine's ncclComm_t, borrowed)
    comm.rank, comm.size
    comm.all_reduce_sum(inout, *, stream=None) / comm.reduce_scatter_sum(in_, out, *, stream=None)
    comm.all_gather(in_, out, *, stream=None)
    context_parallel_batch(batch, rank, size) -> ContextParallelBatch

Every call of a communicator is a rendezvous of its group's ranks: each rank calls from its own
thread (the GIL is released while it waits). MlaLayer(..., communicator=) reduces a
tensor-parallel shard's output; MlaLayer.prefill_context_parallel gathers the latent rows of a
context-parallel group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import _C
from ._arrays import adapter_for
from ._common import invalid_argument


class MlaCommunicator:
    """One rank's communicator (make_cpu_communicators, make_nccl_communicators,
    nccl_communicator): `rank` and `size`, and the collectives, each called by every rank of the
    group with tensors of the same dtype and shape. CPU groups take host (numpy or torch CPU)
    tensors, NCCL ones CUDA tensors on their device; `stream` (an int cudaStream_t) defaults to
    torch's current stream for CUDA tensors."""

    def __init__(self, communicator: _C.MlaCommunicator):
        self._c = communicator

    @property
    def rank(self) -> int:
        return self._c.rank

    @property
    def size(self) -> int:
        return self._c.size

    def all_reduce_sum(self, inout, *, stream=None):
        """In place: every rank's `inout` (bf16 or f32, contiguous) gets the sum over the ranks,
        rounded once to its dtype (the CPU group sums in f32 in rank order). Returns inout."""
        arrays = adapter_for(inout)
        self._c.all_reduce_sum(arrays.tensor(inout), _stream(inout, stream))
        return inout

    def reduce_scatter_sum(self, in_, out, *, stream=None):
        """`in_` [rows, ...] on every rank, rows divisible by size; `out` [rows / size, ...]
        gets this rank's rows of the sum. Returns out."""
        arrays = adapter_for(in_)
        self._c.reduce_scatter_sum(arrays.tensor(in_), arrays.tensor(out), _stream(in_, stream))
        return out

    def all_gather(self, in_, out, *, stream=None):
        """`in_` [rows, ...] of any dtype on every rank; `out` [size * rows, ...] gets rank q's
        `in_` at rows [q * rows, (q + 1) * rows), the bytes unchanged. In place when `in_` is
        this rank's rows of `out`. Returns out."""
        arrays = adapter_for(in_)
        self._c.all_gather(arrays.tensor(in_), arrays.tensor(out), _stream(in_, stream))
        return out

    def __repr__(self) -> str:
        return f"fp8mla.MlaCommunicator(rank={self.rank}, size={self.size})"


def _stream(tensor, stream) -> int:
    if stream is None and getattr(getattr(tensor, "device", None), "type", None) == "cuda":
        import torch

        return torch.cuda.current_stream(tensor.device).cuda_stream
    return int(stream or 0)


def make_cpu_communicators(size: int) -> list:
    """`size` (1 to 8) communicators of one in-process group for host tensors, rank i at index
    i. Each call is a rendezvous: it blocks until every rank has made it, so each rank runs on
    its own thread; the last to arrive sums in f32 in rank order and rounds once, so every rank
    gets the same, deterministic result. Calls that differ between ranks are an error on every
    rank."""
    return [MlaCommunicator(c) for c in _C.make_cpu_communicators(int(size))]


def make_nccl_communicators(devices) -> list:
    """NCCL communicators of one group over CUDA `devices` (1 to 8 ordinals) of this process
    (ncclCommInitAll), rank i on devices[i], each owning its NCCL communicator; each rank calls
    from its own thread. A build without NCCL, or a process that cannot load libnccl.so.2, raises
    fp8mla.UnsupportedError saying which."""
    return [MlaCommunicator(c) for c in _C.make_nccl_communicators([int(d) for d in devices])]


def nccl_communicator(comm_ptr: int) -> MlaCommunicator:
    """A communicator over the caller's initialized ncclComm_t, given as its address (an int).
    Borrowed: the NCCL communicator must outlive this object (and every layer using it), which
    never destroys it. rank and size are the NCCL communicator's.

    An engine on torch.distributed gets the address from its process group's NCCL backend
    (ProcessGroupNCCL._comm_ptr, PyTorch >= 2.2). torch creates the NCCL communicator lazily, so
    a first collective on the group must have run:

        pg = torch.distributed.group.WORLD          # or the engine's TP / CP group
        torch.distributed.all_reduce(torch.zeros(1, device="cuda"), group=pg)  # creates it
        comm = fp8mla.nccl_communicator(pg._get_backend(torch.device("cuda"))._comm_ptr())
    """
    ptr = int(comm_ptr)
    if ptr == 0:
        raise invalid_argument("nccl_communicator: expected the address of an initialized "
                               "ncclComm_t, got 0 (null)")
    return MlaCommunicator(_C.nccl_communicator(ptr))


@dataclass(frozen=True)
class ContextParallelBatch:
    """Rank `rank` of `size`'s share of a batch (context_parallel_batch): `batch` its chunks as
    (prefix, extend, slots) sequences (a prefill batch), `tokens` each of its rows as a row of
    the full batch (its `hidden` rows are hidden[tokens]), `rows_per_rank` the most tokens any
    rank has, `gathered_slots` the cache slot of every row of the all-gather, rank by rank (-1
    past a rank's tokens), `workspace_limits` (max_tokens, max_sequences, max_prefix_tokens,
    max_gathered_rows) of its prefill_context_parallel."""
    rank: int
    size: int
    batch: list
    tokens: np.ndarray
    rows_per_rank: int
    gathered_slots: np.ndarray
    workspace_limits: tuple
    _c: _C.MlaContextParallelBatch = field(repr=False, compare=False)


def context_parallel_batch(batch, rank: int, size: int) -> ContextParallelBatch:
    """Rank `rank` of `size`'s share of `batch` (MlaLayer.prefill's batch form), every rank
    passing the same batch (docs/parallelism.md): each sequence's new tokens are cut into
    2 * size chunks and rank r takes chunks r and 2 * size - 1 - r (rank size - 1's two are one),
    each a sequence whose prefix is everything before it. Sequences without new tokens are left
    out. A bad rank or size, or slots that are not prefix + extend, is an InvalidArgumentError."""
    from ._layer import _batch

    c = _C.mla_context_parallel_batch(_batch(batch), int(rank), int(size))
    return ContextParallelBatch(c.rank, c.size, list(c.batch), np.asarray(c.tokens, np.int64),
                                c.rows_per_rank, np.asarray(c.gathered_slots, np.int64),
                                tuple(c.workspace_limits), c)
