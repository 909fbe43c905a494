"""fp8mla.MlaLayer.prefill_device_batch through numpy on the CPU: a batch of new tokens given as
cu_seqlens_q, positions and slot_mapping, padded past its sequences (random hidden rows,
position 0, slot -1), gives prefill's bytes of the same batch on its real rows and in the cache
(the padding writes nothing), on both paths, with and without cached prefixes (then prefill's
bytes with every prefix key in one chunk); and the C++ checks of the metadata."""

from __future__ import annotations

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
import fp8mla  # noqa: E402

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
PAGE = 16
PAGES = 16
LENGTHS = [37, 20, 1, 9]  # new tokens per sequence, no cached prefix
TOKENS = 72  # the padded row count: 67 real rows, 5 padding
MAX_SEQLEN_Q = 40


def hidden_states(tokens, width, seed):
    return np.random.default_rng(seed).standard_normal((tokens, width)).astype(BF16)


def random_cache(pages, seed):
    """Random e4m3 bytes (|x| < 2), so that a stray write to any slot shows."""
    bits = np.random.default_rng(seed).integers(0, 0x40, size=(pages, PAGE, 576), dtype=np.uint8)
    sign = np.random.default_rng(seed + 1).integers(0, 2, size=bits.shape, dtype=np.uint8) << 7
    return (bits | sign).view(E4M3)


def padded_batch(lengths, tokens, width, seed=0):
    """(host batch, hidden [tokens, width], cu_seqlens_q, positions, slot_mapping): distinct
    random slots for the real rows; the rows past them random, position 0, slot -1."""
    slots = np.random.default_rng(seed).permutation(PAGES * PAGE)
    batch, cu, positions, slot_mapping = [], [0], [], []
    for n in lengths:
        mine = slots[cu[-1]:cu[-1] + n]
        batch.append(fp8mla.MlaSequence(0, n, mine))
        positions.extend(range(n))
        slot_mapping.extend(mine)
        cu.append(cu[-1] + n)
    pad = tokens - cu[-1]
    assert pad > 0
    return (batch, hidden_states(tokens, width, seed + 1), np.array(cu, dtype=np.int32),
            np.array(positions + [0] * pad, dtype=np.int64),
            np.array(slot_mapping + [-1] * pad, dtype=np.int64))


@pytest.fixture(scope="module")
def weights():
    return fp8mla.generate_mla_weights("tiny", "fp8", seed=3)


@pytest.mark.parametrize("backend", ["cpu", "cpu-bf16"])
def test_real_rows_and_cache_equal_the_host_batch(weights, backend):
    layer = fp8mla.MlaLayer(None, weights, backend=backend)
    batch, hidden, cu, positions, slots = padded_batch(LENGTHS, TOKENS, weights.config.hidden)
    real = int(cu[-1])
    cache_before = random_cache(PAGES, 2)
    host_cache = cache_before.copy()
    host_out = layer.prefill(hidden[:real], batch, host_cache)
    cache = cache_before.copy()
    out = layer.prefill_device_batch(hidden, cu, positions, slots, cache,
                                     max_seqlen_q=MAX_SEQLEN_Q)
    assert out.shape == (TOKENS, weights.config.hidden) and out.dtype == BF16
    np.testing.assert_array_equal(out[:real].view(np.uint16), host_out.view(np.uint16))
    np.testing.assert_array_equal(cache.view(np.uint8), host_cache.view(np.uint8))
    assert np.any(cache.view(np.uint8) != cache_before.view(np.uint8))

    given = np.empty_like(out)  # an `out` given is written and returned
    cache = cache_before.copy()
    assert layer.prefill_device_batch(hidden, cu, positions, slots, cache,
                                      max_seqlen_q=MAX_SEQLEN_Q, out=given) is given
    np.testing.assert_array_equal(given[:real].view(np.uint16), host_out.view(np.uint16))


def test_metadata_errors(weights):
    layer = fp8mla.MlaLayer(None, weights)
    _, hidden, cu, positions, slots = padded_batch(LENGTHS, TOKENS, weights.config.hidden)
    cache = np.zeros((PAGES, PAGE, 576), E4M3)

    def run(cu=cu, positions=positions, slots=slots, max_seqlen_q=MAX_SEQLEN_Q):
        layer.prefill_device_batch(hidden, cu, positions, slots, cache, max_seqlen_q=max_seqlen_q)

    with pytest.raises(fp8mla.InvalidArgumentError, match="cu_seqlens_q from 0"):
        run(cu=cu + 1)
    with pytest.raises(fp8mla.InvalidArgumentError,
                       match="sequence 0: expected 0 to max_seqlen_q 36 in cu_seqlens_q, got 37"):
        run(max_seqlen_q=36)
    with pytest.raises(fp8mla.InvalidArgumentError, match=r"MlaLayer::prefill \(device batch\): "
                       r"expected `positions` contiguous i64 \[72\] on cpu, got i32\[72\]"):
        run(positions=positions.astype(np.int32))
    with pytest.raises(fp8mla.InvalidArgumentError, match="`cu_seqlens_q` contiguous i32"):
        run(cu=cu.astype(np.int64))
    with pytest.raises(fp8mla.InvalidArgumentError, match="`slot_mapping` contiguous i64"):
        run(slots=slots[:-1])
    assert not np.any(cache.view(np.uint8))  # a rejected batch wrote nothing


@pytest.mark.parametrize("backend", ["cpu", "cpu-bf16"])
def test_with_prefixes_equals_the_host_batchs_one_chunk(weights, backend):
    layer = fp8mla.MlaLayer(None, weights, backend=backend)
    prefixes, lengths = [12, 0, 30, 5], [20, 9, 1, 14]
    slots = np.random.default_rng(7).permutation(PAGES * PAGE)
    batch, cu, cu_prefix, positions, slot_mapping, prefix_slots = [], [0], [0], [], [], []
    at = 0
    for p, n in zip(prefixes, lengths):
        mine = slots[at:at + p + n]
        at += p + n
        batch.append(fp8mla.MlaSequence(p, n, mine))
        prefix_slots.extend(mine[:p])
        positions.extend(range(p, p + n))
        slot_mapping.extend(mine[p:])
        cu.append(cu[-1] + n)
        cu_prefix.append(cu_prefix[-1] + p)
    tokens, prefix_tokens = cu[-1] + 3, cu_prefix[-1] + 4
    hidden = hidden_states(tokens, weights.config.hidden, 8)
    cache_before = random_cache(PAGES, 9)
    host_cache = cache_before.copy()
    host_out = layer.prefill(hidden[:cu[-1]], batch, host_cache, one_shot_max_prefix=0,
                             chunk_capacity=1 << 20)
    cache = cache_before.copy()
    out = layer.prefill_device_batch(
        hidden, np.array(cu, np.int32), np.array(positions + [0] * 3, np.int64),
        np.array(slot_mapping + [-1] * 3, np.int64), cache, max_seqlen_q=32,
        cu_seqlens_prefix=np.array(cu_prefix, np.int32),
        prefix_slots=np.array(prefix_slots + [-1] * 4, np.int64), max_seqlen_prefix=30)
    np.testing.assert_array_equal(out[:cu[-1]].view(np.uint16), host_out.view(np.uint16))
    np.testing.assert_array_equal(cache.view(np.uint8), host_cache.view(np.uint8))
