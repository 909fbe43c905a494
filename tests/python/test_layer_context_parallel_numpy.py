"""Context parallelism of fp8mla.MlaLayer through numpy on the CPU (docs/parallelism.md): the
rank layers on their own threads, their latent rows all-gathered through the in-process
communicators. Every rank's cache ends with the one-rank layer's bytes after the full prefill,
and every rank's output is, bit for bit, a plain prefill of the rank's batch over that cache.
Also the communicators' collectives from Python and the errors of bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
import fp8mla  # noqa: E402
from test_layer_parallel_numpy import inputs, on_threads  # noqa: E402

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint8)


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("fmt,backend", [("bf16", "cpu"), ("fp8", "cpu"), ("bf16", "cpu-bf16")])
def test_each_rank_is_its_own_prefill_over_the_full_cache(size, fmt, backend):
    config = fp8mla.mla_config("tiny")
    weights = fp8mla.generate_mla_weights(config, fmt, seed=5)
    # A sequence shorter than 2 * size leaves a rank without tokens of it; one without new
    # tokens is left out.
    hidden, batch, cache = inputs(config, [(0, 13), (24, 9), (0, 2), (7, 0)], seed=1)
    full_cache = cache.copy()
    fp8mla.MlaLayer(None, weights, backend=backend).prefill(hidden, batch, full_cache)

    comms = fp8mla.make_cpu_communicators(size)
    layers = [fp8mla.MlaLayer(None, weights, backend=backend) for _ in range(size)]
    cp = [fp8mla.context_parallel_batch(batch, r, size) for r in range(size)]
    caches = [cache.copy() for _ in range(size)]

    def rank(r):
        return layers[r].prefill_context_parallel(hidden[cp[r].tokens], cp[r], comms[r],
                                                  caches[r])

    outs = on_threads(rank, size)
    assert sorted(np.concatenate([c.tokens for c in cp]).tolist()) == list(range(len(hidden)))
    one_rank = fp8mla.MlaLayer(None, weights, backend=backend)
    for r in range(size):
        assert (cp[r].rank, cp[r].size) == (r, size)
        assert len(cp[r].gathered_slots) == size * cp[r].rows_per_rank
        assert cp[r].workspace_limits[3] == size * cp[r].rows_per_rank
        assert np.array_equal(bits(caches[r]), bits(full_cache)), r
        assert outs[r].shape == (len(cp[r].tokens), config.hidden) and outs[r].dtype == BF16
        own = one_rank.prefill(hidden[cp[r].tokens], cp[r].batch, full_cache.copy())
        assert np.array_equal(bits(outs[r]), bits(own)), r


def test_context_parallel_batch_splits_zigzag():
    slots = np.arange(8)
    cp = [fp8mla.context_parallel_batch([fp8mla.MlaSequence(0, 8, slots)], r, 2)
          for r in range(2)]
    # 4 chunks of 2 tokens: rank 0 takes chunks 0 and 3, rank 1 chunks 1 and 2 (one chunk).
    assert cp[0].tokens.tolist() == [0, 1, 6, 7]
    assert cp[0].batch == [(0, 2, [0, 1]), (6, 2, list(range(8)))]
    assert cp[1].tokens.tolist() == [2, 3, 4, 5]
    assert cp[1].batch == [(2, 4, list(range(6)))]
    assert cp[0].rows_per_rank == 4
    assert cp[0].gathered_slots.tolist() == [0, 1, 6, 7, 2, 3, 4, 5]
    assert cp[0].workspace_limits == (4, 2, 6, 8)


def test_collectives_from_python():
    comms = fp8mla.make_cpu_communicators(3)
    assert [(c.rank, c.size) for c in comms] == [(r, 3) for r in range(3)]
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((5, 7)).astype(BF16) for _ in range(3)]
    sums = on_threads(lambda r: comms[r].all_reduce_sum(xs[r].copy()), 3)
    expected = (xs[0].astype(np.float32) + xs[1].astype(np.float32)
                + xs[2].astype(np.float32)).astype(BF16)
    for s in sums:
        assert np.array_equal(bits(s), bits(expected))
    f32 = [rng.standard_normal((6, 4)).astype(np.float32) for _ in range(3)]
    shards = on_threads(lambda r: comms[r].reduce_scatter_sum(f32[r], np.empty((2, 4),
                                                                                np.float32)), 3)
    assert np.array_equal(np.concatenate(shards), f32[0] + f32[1] + f32[2])
    # The all-gather of e4m3 rows, out of place and in place (this rank's rows of out).
    rows = [rng.standard_normal((2, 576)).astype(E4M3) for _ in range(3)]
    gathered = on_threads(lambda r: comms[r].all_gather(rows[r], np.empty((6, 576), E4M3)), 3)

    def in_place(r):
        out = np.zeros((6, 576), E4M3)
        out[2 * r:2 * r + 2] = rows[r]
        return comms[r].all_gather(out[2 * r:2 * r + 2], out)

    for out in gathered + on_threads(in_place, 3):
        assert np.array_equal(bits(out), bits(np.concatenate(rows)))


def test_mismatched_collective_is_an_error_on_every_rank():
    comms = fp8mla.make_cpu_communicators(2)
    shapes = [(4, 8), (4, 9)]

    def rank(r):
        try:
            comms[r].all_reduce_sum(np.zeros(shapes[r], np.float32))
        except fp8mla.InvalidArgumentError as e:
            return str(e)
        return None

    messages = on_threads(rank, 2)
    assert all(m is not None for m in messages), messages


def test_bad_inputs_are_clear_errors():
    config = fp8mla.mla_config("tiny")
    layer = fp8mla.MlaLayer(None, fp8mla.generate_mla_weights(config, "bf16"))
    hidden, batch, cache = inputs(config, [(0, 6)])
    cp = fp8mla.context_parallel_batch(batch, 0, 2)
    comms = fp8mla.make_cpu_communicators(2)
    # Checked before the all-gather, so the rank raises instead of waiting for the others.
    with pytest.raises(fp8mla.InvalidArgumentError,
                       match="the communicator is rank 1 of 2; expected the batch's rank 0 of 2"):
        layer.prefill_context_parallel(hidden[cp.tokens], cp, comms[1], cache.copy())
    with pytest.raises(fp8mla.InvalidArgumentError, match="expected the batch's rank 0 of 2"):
        layer.prefill_context_parallel(hidden[cp.tokens], cp, fp8mla.make_cpu_communicators(1)[0],
                                       cache.copy())
    with pytest.raises(fp8mla.InvalidArgumentError, match="expected cp_batch an fp8mla."
                                                          "ContextParallelBatch, got list"):
        layer.prefill_context_parallel(hidden, batch, comms[0], cache.copy())
    with pytest.raises(fp8mla.InvalidArgumentError, match="hidden"):
        layer.prefill_context_parallel(hidden, cp, comms[0], cache.copy())  # all the rows
    with pytest.raises(fp8mla.InvalidArgumentError, match="rank"):
        fp8mla.context_parallel_batch(batch, 2, 2)
    with pytest.raises(fp8mla.InvalidArgumentError, match="size"):
        fp8mla.context_parallel_batch(batch, 0, 0)
    with pytest.raises(fp8mla.InvalidArgumentError, match="1 <= size <= 8, got 9"):
        fp8mla.make_cpu_communicators(9)
    with pytest.raises(fp8mla.InvalidArgumentError, match=r"got 0 \(null\)"):
        fp8mla.nccl_communicator(0)


def test_nccl_communicators_work_or_say_why():
    try:
        comms = fp8mla.make_nccl_communicators([0])
    except fp8mla.Error as e:  # no NCCL in this build, no libnccl, or no GPU
        assert e.category in ("unsupported", "cuda") and "nccl" in e.message.lower(), str(e)
        return
    assert [(c.rank, c.size) for c in comms] == [(0, 1)]
