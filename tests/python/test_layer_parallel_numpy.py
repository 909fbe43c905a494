"""Tensor parallelism of fp8mla.MlaLayer through numpy on the CPU (docs/parallelism.md): the
shards' slices of the full weights (through save), the sum of the rank layers' partial outputs
against the one-rank layer within the bound of the C++ tests, size 1 bit-identical, the rank
layers with an in-process communicator on their own threads (the once-rounded f32 sum of the
partials, bit for bit, on every rank), and the errors for bad specs."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
import fp8mla  # noqa: E402

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
PAGE = 16


def inputs(config, lengths, seed=0):
    rng = np.random.default_rng(seed)
    pages = 16
    slots = rng.permutation(pages * PAGE)
    batch, used = [], 0
    for prefix, extend in lengths:
        batch.append(fp8mla.MlaSequence(prefix, extend, slots[used:used + prefix + extend]))
        used += prefix + extend
    tokens = sum(e for _, e in lengths)
    hidden = rng.standard_normal((tokens, config.hidden)).astype(BF16)
    cache = rng.standard_normal((pages, PAGE, 576)).astype(E4M3)
    return hidden, batch, cache


def run(layer, hidden, batch, cache, **options):
    return layer.prefill(hidden, batch, cache.copy(), **options).astype(np.float32)


@pytest.mark.parametrize("fmt,sizes", [("bf16", (1, 2, 4)), ("fp8", (1, 2))])
@pytest.mark.parametrize("backend", ["cpu", "cpu-bf16"])
def test_sum_of_partials_matches_the_one_rank_layer(fmt, sizes, backend):
    config = fp8mla.mla_config("tiny")
    full = fp8mla.generate_mla_weights(config, fmt, seed=3)
    hidden, batch, cache = inputs(config, [(0, 11), (40, 6)])
    y = run(fp8mla.MlaLayer(None, full, backend=backend), hidden, batch, cache)
    for size in sizes:
        shards = [fp8mla.shard_mla_weights(full, r, size) for r in range(size)]
        layers = [fp8mla.MlaLayer(None, s, backend=backend) for s in shards]
        assert [layer.tensor_parallel for layer in layers] == [(r, size) for r in range(size)]
        partials = [run(layer, hidden, batch, cache) for layer in layers]
        # The CPU communicator's sum: f32 in rank order, rounded once to bf16.
        total = np.zeros_like(y)
        for p in partials:
            total += p
        y_tp = total.astype(BF16).astype(np.float32)
        if size == 1:
            assert np.array_equal(partials[0], y)
            continue
        u = 2.0 ** -8
        bound = u * (sum(np.abs(p) for p in partials) + np.abs(y) + np.abs(y_tp)) * (1 + 2 ** -4)
        assert np.all(np.abs(y_tp - y) <= bound), np.max(np.abs(y_tp - y) / bound)
        # Without the last rank the sum is far outside it.
        assert np.any(np.abs(total - partials[-1] - y) > bound)


def read_safetensors(path):
    """{name: array} of a safetensors file's bf16 / f32 tensors (bf16 read as uint16 bits)."""
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    body = data[8 + size:]
    dtypes = {"BF16": np.uint16, "F32": np.float32, "F8_E4M3": np.uint8}
    return {name: np.frombuffer(body[t["data_offsets"][0]:t["data_offsets"][1]],
                                dtype=dtypes[t["dtype"]]).reshape(t["shape"])
            for name, t in header.items() if name != "__metadata__"}


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_shards_are_the_full_weights_slices(tmp_path, fmt):
    config = fp8mla.mla_config("tiny")
    full = fp8mla.generate_mla_weights(config, fmt, seed=1)
    full.save(str(tmp_path / "full.safetensors"))
    f = read_safetensors(tmp_path / "full.safetensors")
    name = "model.layers.0.self_attn.{}".format
    for rank in range(2):
        shard = fp8mla.shard_mla_weights(full, rank, 2)
        assert shard.tensor_parallel == (rank, 2) and full.tensor_parallel == (0, 1)
        assert shard.config.heads == config.heads  # the full config; the layer runs heads / 2
        shard.save(str(tmp_path / f"rank{rank}.safetensors"))
        s = read_safetensors(tmp_path / f"rank{rank}.safetensors")
        hl = config.heads // 2
        rows = {"q_b_proj": 192, "kv_b_proj": 256}
        for proj, per_head in rows.items():
            w = f[name(proj + ".weight")]
            assert np.array_equal(s[name(proj + ".weight")],
                                  w[rank * hl * per_head:(rank + 1) * hl * per_head])
            if fmt == "fp8":
                sc = f[name(proj + ".weight_scale_inv")]
                b = hl * per_head // 128
                assert np.array_equal(s[name(proj + ".weight_scale_inv")],
                                      sc[rank * b:(rank + 1) * b])
        o = f[name("o_proj.weight")]
        assert np.array_equal(s[name("o_proj.weight")], o[:, rank * hl * 128:(rank + 1) * hl * 128])
        if fmt == "fp8":
            assert np.array_equal(s[name("o_proj.weight_scale_inv")],
                                  f[name("o_proj.weight_scale_inv")][:, rank * hl:(rank + 1) * hl])
        for replicated in ("q_a_proj.weight", "kv_a_proj_with_mqa.weight", "q_a_layernorm.weight",
                           "kv_a_layernorm.weight"):
            assert np.array_equal(s[name(replicated)], f[name(replicated)])


def test_bad_specs_are_clear_errors():
    config = fp8mla.mla_config("tiny")
    bf16 = fp8mla.generate_mla_weights(config, "bf16")
    with pytest.raises(fp8mla.InvalidArgumentError, match="expected size 1, 2, 4 or 8"):
        fp8mla.shard_mla_weights(bf16, 0, 3)
    with pytest.raises(fp8mla.InvalidArgumentError, match="expected 0 <= rank < 2"):
        fp8mla.shard_mla_weights(bf16, 2, 2)
    with pytest.raises(fp8mla.InvalidArgumentError, match="128-row blocks"):
        fp8mla.shard_mla_weights(fp8mla.generate_mla_weights(config, "fp8"), 0, 4)
    shard = fp8mla.shard_mla_weights(bf16, 0, 2)
    with pytest.raises(fp8mla.InvalidArgumentError, match="expected full weights"):
        fp8mla.shard_mla_weights(shard, 0, 2)
    hidden, batch, cache = inputs(config, [(0, 3)])
    with pytest.raises(fp8mla.InvalidArgumentError, match="tensor-parallel shard"):
        fp8mla.mla_prefill_reference(shard, hidden, batch, cache)


def on_threads(fn, size, timeout=120):
    """fn(rank) for every rank on its own thread (a rendezvous needs them all); the results in
    rank order, or the first rank's exception."""
    results, errors = [None] * size, [None] * size

    def body(rank):
        try:
            results[rank] = fn(rank)
        except Exception as e:  # noqa: BLE001  (re-raised below, on the test's thread)
            errors[rank] = e

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a rank is still waiting in a rendezvous"
    for e in errors:
        if e is not None:
            raise e
    return results


@pytest.mark.parametrize("fmt,size", [("bf16", 2), ("bf16", 4), ("fp8", 2)])
@pytest.mark.parametrize("backend", ["cpu", "cpu-bf16"])
def test_communicator_all_reduces_the_partials(fmt, size, backend):
    config = fp8mla.mla_config("tiny")
    full = fp8mla.generate_mla_weights(config, fmt, seed=3)
    hidden, batch, cache = inputs(config, [(0, 11), (40, 6)])
    shards = [fp8mla.shard_mla_weights(full, r, size) for r in range(size)]
    partials = [run(fp8mla.MlaLayer(None, s, backend=backend), hidden, batch, cache)
                for s in shards]
    # The layers keep their communicators: the group's list is not kept here.
    layers = [fp8mla.MlaLayer(None, s, backend=backend, communicator=c)
              for s, c in zip(shards, fp8mla.make_cpu_communicators(size))]
    outs = on_threads(lambda r: layers[r].prefill(hidden, batch, cache.copy()), size)
    # The CPU communicator's sum: f32 in rank order, rounded once to bf16.
    total = np.zeros_like(partials[0])
    for p in partials:
        total += p
    expected = total.astype(BF16)
    for out in outs:
        assert out.dtype == BF16
        assert np.array_equal(out.view(np.uint16), expected.view(np.uint16))


def test_communicator_of_another_rank_is_an_error():
    config = fp8mla.mla_config("tiny")
    shard = fp8mla.shard_mla_weights(fp8mla.generate_mla_weights(config, "bf16"), 0, 2)
    comms = fp8mla.make_cpu_communicators(2)
    with pytest.raises(fp8mla.InvalidArgumentError,
                       match="communicator is rank 1 of 2; the layer's tensor parallel is rank 0 "
                             "of 2"):
        fp8mla.MlaLayer(None, shard, communicator=comms[1])
    with pytest.raises(fp8mla.InvalidArgumentError, match="rank 0 of 2"):
        fp8mla.MlaLayer(None, shard, communicator=fp8mla.make_cpu_communicators(4)[0])
    with pytest.raises(fp8mla.InvalidArgumentError, match="expected communicator an fp8mla."
                                                          "MlaCommunicator or None, got int"):
        fp8mla.MlaLayer(None, shard, communicator=3)
