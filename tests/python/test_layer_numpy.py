"""fp8mla.MlaLayer through numpy (+ ml_dtypes) on the CPU: both paths (FP8: backend "cpu", BF16:
"cpu-bf16") against the float64 reference with the C++ layer tests' cosine bounds (0.999; 0.998
for the FP8 path with FP8-block weights), a cached prefix written by a first prefill and read by
a second, one-shot against chunked prefixes, a Hugging Face model directory written here and
loaded with load_mla_weights, the weights' lifetime, calibrated static FP8 scales (a layer far
from 1 recovers its accuracy with them), and the errors for bad inputs."""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
import fp8mla  # noqa: E402

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
PAGE = 16

# A DeepSeek-V3-like config.json, small: 2 heads, hidden 256, V3's YaRN.
V3_CONFIG = {
    "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 256, "num_attention_heads": 2, "num_hidden_layers": 2, "q_lora_rank": 128,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-06, "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}


def cosine(a, b) -> float:
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def hidden_states(tokens, width, seed):
    return np.random.default_rng(seed).standard_normal((tokens, width)).astype(BF16)


def random_cache(pages, seed):
    """A latent cache of small random e4m3 values (|x| < 2), as the prefix rows a previous step
    wrote."""
    bits = np.random.default_rng(seed).integers(0, 0x40, size=(pages, PAGE, 576), dtype=np.uint8)
    sign = np.random.default_rng(seed + 1).integers(0, 2, size=bits.shape, dtype=np.uint8) << 7
    return (bits | sign).view(E4M3)


def batch_of(lengths, pages, seed=0):
    """[(prefix, extend, slots)] with distinct random slots of a cache of `pages` pages."""
    slots = np.random.default_rng(seed).permutation(pages * PAGE)
    batch, used = [], 0
    for prefix, extend in lengths:
        batch.append(fp8mla.MlaSequence(prefix, extend, slots[used:used + prefix + extend]))
        used += prefix + extend
    return batch


LENGTHS = [(0, 37), (130, 20), (5, 0), (17, 9)]
BOUND = {("bf16", "cpu"): 0.999, ("bf16", "cpu-bf16"): 0.999, ("fp8", "cpu"): 0.998,
         ("fp8", "cpu-bf16"): 0.999}


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_both_paths_match_the_reference(fmt):
    weights = fp8mla.generate_mla_weights("tiny", fmt, seed=3)
    config = weights.config
    tokens = sum(e for _, e in LENGTHS)
    hidden = hidden_states(tokens, config.hidden, 1)
    cache_before = random_cache(32, 2)
    batch = batch_of(LENGTHS, 32)
    ref = fp8mla.mla_prefill_reference(weights, hidden, batch, cache_before)
    assert ref.shape == (tokens, config.hidden) and ref.dtype == np.float64
    outputs = {}
    for backend in ("cpu", "cpu-bf16"):
        layer = fp8mla.MlaLayer(config, weights, backend=backend)
        assert layer.backend.name == backend
        for capacity in (8192, 64):  # one-shot, and chunks of 64 prefix keys
            cache = cache_before.copy()
            out = layer.prefill(hidden, batch, cache, one_shot_max_prefix=capacity,
                                chunk_capacity=capacity)
            assert out.shape == (tokens, config.hidden) and out.dtype == BF16
            assert cosine(out, ref) >= BOUND[fmt, backend], (backend, capacity)
            outputs[backend, capacity] = out.astype(np.float32)
    assert cosine(outputs["cpu", 8192], outputs["cpu-bf16", 8192]) >= 0.998


def fp8_cpu_case():
    """The tiny preset with FP8 weights on the "cpu" backend (the FP8 path), over LENGTHS: the
    weights, hidden states, the cache before the prefill, the batch and the layer."""
    weights = fp8mla.generate_mla_weights("tiny", "fp8", seed=3)
    hidden = hidden_states(sum(e for _, e in LENGTHS), weights.config.hidden, 1)
    return (weights, hidden, random_cache(32, 2), batch_of(LENGTHS, 32),
            fp8mla.MlaLayer(None, weights, backend="cpu"))


def test_fused_output_quant_gives_the_separate_bytes():
    """On the FP8 path with FP8 weights the attention (or the last merge, with chunks) writes
    o_proj's FP8 input itself: the bytes a separate quantization makes, so the same output."""
    weights, hidden, cache_before, batch, layer = fp8_cpu_case()
    mode, note = layer.output_quant_plan()
    assert mode == "fused" and "fused fp8_group128" in note, note
    assert layer.output_quant_plan(fuse_output_quant=False)[0] == "separate"
    for capacity in (8192, 64):
        outs = [layer.prefill(hidden, batch, cache_before.copy(), one_shot_max_prefix=capacity,
                              chunk_capacity=capacity, fuse_output_quant=fuse)
                for fuse in (True, False)]
        assert np.array_equal(outs[0].view(np.uint16), outs[1].view(np.uint16)), capacity
        assert np.any(outs[0].view(np.uint16) != 0)
    bf16_path = fp8mla.MlaLayer(None, weights, backend="cpu-bf16").output_quant_plan()
    assert bf16_path[0] == "separate" and "BF16 path" in bf16_path[1], bf16_path
    bf16_weights = fp8mla.generate_mla_weights("tiny", "bf16", seed=3)
    assert fp8mla.MlaLayer(None, bf16_weights).output_quant_plan()[0] == "none"


def test_fold_and_kv_from_projection_options():
    """fold_chunks off merges each prefix chunk after its call: the same bytes. With
    fp8_kv_from_projection kv_b's GEMMs write e4m3 K-nope and V themselves (rounded once from
    their f32 sums): an output as close to the float64 reference, not the same bytes."""
    weights, hidden, cache_before, batch, layer = fp8_cpu_case()
    ref = fp8mla.mla_prefill_reference(weights, hidden, batch, cache_before.copy())
    chunked = dict(one_shot_max_prefix=64, chunk_capacity=64)
    base = layer.prefill(hidden, batch, cache_before.copy(), **chunked)
    merged = layer.prefill(hidden, batch, cache_before.copy(), fold_chunks=False, **chunked)
    assert np.array_equal(base.view(np.uint16), merged.view(np.uint16))
    direct = layer.prefill(hidden, batch, cache_before.copy(), fp8_kv_from_projection=True,
                           **chunked)
    assert not np.array_equal(base.view(np.uint16), direct.view(np.uint16))
    assert cosine(direct, ref) >= cosine(base, ref) - 1e-4
    assert cosine(direct, ref) >= BOUND["fp8", "cpu"]


def test_written_cache_serves_the_next_prefill():
    """A sequence prefilled in two steps (the second reading the prefix the first wrote) matches
    the reference of the second step on that cache, and the two steps together match one
    prefill of the whole sequence."""
    weights = fp8mla.generate_mla_weights("tiny", "bf16", seed=5)
    layer = fp8mla.MlaLayer(None, weights)
    hidden = hidden_states(48, weights.config.hidden, 7)
    slots = np.arange(48) + 3
    cache = np.zeros((4, PAGE, 576), dtype=E4M3)
    first = layer.prefill(hidden[:32], [(0, 32, slots[:32])], cache)
    assert np.any(cache.view(np.uint8)[0, 3] != 0)  # the first step's rows are written
    second_batch = [(32, 16, slots)]
    ref = fp8mla.mla_prefill_reference(weights, hidden[32:], second_batch, cache)
    second = layer.prefill(hidden[32:], second_batch, cache)
    assert cosine(second, ref) >= 0.999
    whole = layer.prefill(hidden, [(0, 48, slots)], np.zeros_like(cache))
    assert cosine(np.concatenate([first, second]).astype(np.float32), whole) >= 0.999


def test_one_layer_from_two_threads_errors_or_gives_the_serial_bytes():
    """One prefill at a time per layer: a second thread's call while another runs is a clear
    error, never corrupted memory; the calls that run give the bytes of a call made alone."""
    import threading

    weights = fp8mla.generate_mla_weights("tiny", "fp8", seed=2)
    layer = fp8mla.MlaLayer(None, weights)
    hidden = hidden_states(96, weights.config.hidden, 3)
    batch = [(0, 96, np.arange(96))]
    want = layer.prefill(hidden, batch, np.zeros((6, PAGE, 576), E4M3))
    outcomes = []

    def run():
        for _ in range(6):
            try:
                got = layer.prefill(hidden, batch, np.zeros((6, PAGE, 576), E4M3))
                outcomes.append(got.tobytes() == want.tobytes())
            except fp8mla.InvalidArgumentError as e:
                assert "another prefill or calibration of this layer is running" in str(e)
                outcomes.append("refused")

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(outcomes) == 18 and False not in outcomes


def test_out_is_written_in_place():
    weights = fp8mla.generate_mla_weights("tiny", "bf16", seed=1)
    layer = fp8mla.MlaLayer("tiny", weights)
    hidden = hidden_states(4, 512, 0)
    out = np.full((4, 512), np.nan, dtype=BF16)
    assert layer.prefill(hidden, [(0, 4, [0, 1, 2, 3])], np.zeros((1, PAGE, 576), E4M3),
                         out=out) is out
    assert not np.isnan(out.astype(np.float32)).any()


def test_config_sources_and_fields(tmp_path):
    tiny = fp8mla.mla_config("tiny")
    assert (tiny.hidden, tiny.heads, tiny.kv_lora_rank) == (512, 4, 512)
    assert "deepseek-v3" in fp8mla.MlaConfig.preset_names()
    v3 = fp8mla.mla_config("deepseek-v3")
    assert v3.hidden == 7168 and v3.heads == 128 and v3.yarn["factor"] == 40
    from_dict = fp8mla.mla_config(V3_CONFIG)
    assert (from_dict.hidden, from_dict.heads, from_dict.q_lora_rank) == (256, 2, 128)
    assert from_dict.yarn["original_max_position"] == 4096
    assert from_dict.softmax_scale == pytest.approx(v3.softmax_scale)
    (tmp_path / "config.json").write_text(json.dumps(V3_CONFIG))
    for source in (tmp_path, tmp_path / "config.json", str(tmp_path / "config.json")):
        assert fp8mla.mla_config(source).hidden == 256
    with pytest.raises(fp8mla.InvalidArgumentError, match="deepseek-v3"):
        fp8mla.mla_config("no-such-preset")
    with pytest.raises(fp8mla.UnsupportedError, match="llama"):
        fp8mla.mla_config({**V3_CONFIG, "model_type": "llama"})
    # What transformers' attention reads and the layer does not model is refused, not ignored.
    for changed, message in [({"rope_interleave": False}, "rope_interleave false"),
                             ({"attention_bias": True}, "attention_bias true"),
                             ({"rope_scaling": {**V3_CONFIG["rope_scaling"], "truncate": False}},
                              "truncate false")]:
        with pytest.raises(fp8mla.UnsupportedError, match=message):
            fp8mla.mla_config({**V3_CONFIG, **changed})
    assert fp8mla.mla_config({**V3_CONFIG, "rope_interleave": True, "attention_bias": False})


def tensor_names(path) -> list:
    """The tensor names of a safetensors file, from its header (8-byte length, then JSON)."""
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return [name for name in header if name != "__metadata__"]


def write_model_dir(path, fmt) -> list:
    """A Hugging Face model directory: config.json, and two layers in two shards listed by
    model.safetensors.index.json, written by MlaWeights.save. Returns the layers' weights."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps(V3_CONFIG))
    config = fp8mla.mla_config(V3_CONFIG)
    weight_map, layers = {}, []
    for layer in range(2):
        layers.append(fp8mla.generate_mla_weights(config, fmt, seed=100 + layer))
        shard = f"model-{layer + 1:05d}-of-00002.safetensors"
        layers[-1].save(str(path / shard), layer)
        weight_map.update({name: shard for name in tensor_names(path / shard)})
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return layers


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_model_directory_loads_and_runs(tmp_path, fmt):
    """Layer 1 loaded from the directory runs as the weights it was written from."""
    written = write_model_dir(tmp_path / "model", fmt)
    assert "model.layers.1.self_attn.kv_b_proj.weight" in tensor_names(
        tmp_path / "model" / "model-00002-of-00002.safetensors")
    loaded = fp8mla.load_mla_weights(tmp_path / "model", 1)
    assert loaded.format == fmt and loaded.config.hidden == 256 and loaded.config.yarn
    hidden = hidden_states(14, 256, 3)
    batch = batch_of([(10, 14)], 4)
    cache = random_cache(4, 9)
    out = fp8mla.MlaLayer(None, loaded).prefill(hidden, batch, cache.copy())
    expected = fp8mla.MlaLayer(None, written[1]).prefill(hidden, batch, cache.copy())
    np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))
    ref = fp8mla.mla_prefill_reference(loaded, hidden, batch, cache)
    assert cosine(out, ref) >= BOUND[fmt, "cpu"]


def test_loaded_weights_outlive_their_python_names(tmp_path):
    """The layer keeps the weights, and they the mapped shards, alive."""
    write_model_dir(tmp_path / "model", "bf16")
    layer = fp8mla.MlaLayer(None, fp8mla.load_mla_weights(tmp_path / "model", 0))
    gc.collect()
    out = layer.prefill(hidden_states(3, 256, 0), [(0, 3, [0, 1, 2])],
                        np.zeros((1, PAGE, 576), E4M3))
    assert np.isfinite(out.astype(np.float32)).all()


def test_model_directory_errors(tmp_path):
    write_model_dir(tmp_path / "model", "bf16")
    with pytest.raises(fp8mla.InvalidArgumentError, match="layer"):
        fp8mla.load_mla_weights(tmp_path / "model", 2)  # num_hidden_layers is 2
    (tmp_path / "model" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(fp8mla.Error, match="model-00002-of-00002"):
        fp8mla.load_mla_weights(tmp_path / "model", 1)
    with pytest.raises(fp8mla.Error, match="config.json"):
        fp8mla.load_mla_weights(tmp_path, 0)


def test_slots_in_any_host_form_give_the_same_bytes():
    weights = fp8mla.generate_mla_weights("tiny", "bf16", seed=1)
    layer = fp8mla.MlaLayer("tiny", weights)
    hidden = hidden_states(12, 512, 3)
    slots = np.random.default_rng(4).permutation(2 * PAGE)[:16]
    forms = [slots.tolist(), tuple(slots.tolist()), slots.astype(np.int64),
             slots.astype(np.int32), np.repeat(slots, 2)[::2], slots[::-1].copy()[::-1]]
    results = []
    for form in forms:
        cache = random_cache(2, 7)
        out = layer.prefill(hidden, [fp8mla.MlaSequence(4, 12, form)], cache)
        results.append((out.view(np.uint16).copy(), cache.view(np.uint8).copy()))
    for out, cache in results[1:]:
        assert np.array_equal(out, results[0][0]) and np.array_equal(cache, results[0][1])
    with pytest.raises(fp8mla.InvalidArgumentError, match="slots 1-d"):
        layer.prefill(hidden, [(4, 12, slots.reshape(2, 8))], random_cache(2, 7))


# ---- bad inputs --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_layer():
    return fp8mla.MlaLayer(None, fp8mla.generate_mla_weights("tiny", "bf16", seed=0))


def test_wrong_hidden_width(tiny_layer):
    with pytest.raises(fp8mla.InvalidArgumentError, match="hidden"):
        tiny_layer.prefill(hidden_states(4, 256, 0), [(0, 4, range(4))],
                           np.zeros((1, PAGE, 576), E4M3))


def test_slot_out_of_range(tiny_layer):
    with pytest.raises(fp8mla.InvalidArgumentError, match="slot"):
        tiny_layer.prefill(hidden_states(4, 512, 0), [(0, 4, [0, 1, 2, PAGE])],
                           np.zeros((1, PAGE, 576), E4M3))


def test_token_count_not_matching_hidden_rows(tiny_layer):
    with pytest.raises(fp8mla.InvalidArgumentError, match="extend tokens"):
        tiny_layer.prefill(hidden_states(4, 512, 0), [(0, 5, range(5))],
                           np.zeros((1, PAGE, 576), E4M3))


def test_slots_not_prefix_plus_extend(tiny_layer):
    with pytest.raises(fp8mla.InvalidArgumentError, match="slots"):
        tiny_layer.prefill(hidden_states(4, 512, 0), [(0, 4, range(3))],
                           np.zeros((1, PAGE, 576), E4M3))


def test_bad_layer_arguments():
    weights = fp8mla.generate_mla_weights("tiny", "bf16", seed=0)
    with pytest.raises(fp8mla.InvalidArgumentError, match="format"):
        fp8mla.generate_mla_weights("tiny", "int4", seed=0)
    with pytest.raises(fp8mla.InvalidArgumentError, match="not the one the weights"):
        fp8mla.MlaLayer("deepseek-v3", weights)
    with pytest.raises(fp8mla.InvalidArgumentError, match="cpu-bf16"):
        fp8mla.MlaLayer(None, weights, backend="no-such-backend")
    if not fp8mla.info()["cuda"]:
        with pytest.raises(fp8mla.UnsupportedError, match="no CUDA"):
            fp8mla.MlaLayer(None, weights, device="cuda")


# ---- calibration -------------------------------------------------------------------------------


def scale_tensor(path, name, gain):
    """Multiplies bf16 tensor `name` of a safetensors file by `gain`, in place."""
    with open(path, "r+b") as f:
        header_len = int.from_bytes(f.read(8), "little")
        entry = json.loads(f.read(header_len))[name]
        assert entry["dtype"] == "BF16", entry
        begin, end = entry["data_offsets"]
        f.seek(8 + header_len + begin)
        values = np.frombuffer(f.read(end - begin), dtype=BF16).astype(np.float32) * gain
        f.seek(8 + header_len + begin)
        f.write(values.astype(BF16).tobytes())


def expected_scale_inv(amax, headroom):
    return 1.0 if amax == 0 else 1.0 / max(amax * headroom / 448.0, 1.0 / (448.0 * 512.0))


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_calibrated_scales_recover_a_layer_far_from_one(tmp_path, fmt):
    """Q x 512 (the q_a norm's weight) and the latent rows, so K and V, / 512 (the kv_a norm's
    weight and the hidden states): the FP8 path with the unit scales saturates Q and sinks K, V
    and the cache into e4m3's subnormals; with scales calibrated on another batch it is back at
    the unscaled layer's accuracy (0.999 with bf16 weights). The scales follow amax by the
    documented rule."""
    unscaled_weights = write_model_dir(tmp_path / "model", fmt)[0]
    shard = tmp_path / "model" / "model-00001-of-00002.safetensors"  # layer 0
    scale_tensor(shard, "model.layers.0.self_attn.q_a_layernorm.weight", 512.0)
    scale_tensor(shard, "model.layers.0.self_attn.kv_a_layernorm.weight", 1 / 512)
    weights = fp8mla.load_mla_weights(tmp_path / "model", 0)
    layer = fp8mla.MlaLayer(None, weights)
    width = weights.config.hidden
    sample = (hidden_states(60, width, 4).astype(np.float32) / 512).astype(BF16)
    cal = layer.calibrate(sample, batch_of([(0, 40), (100, 20)], 16, seed=3))
    assert set(cal.amax) == {"q", "k", "v", "cache"} and cal.headroom == 2.0
    for key in ("q", "k", "v", "cache"):
        assert cal.amax[key] > 0
        assert getattr(cal, f"{key}_scale_inv") == pytest.approx(
            expected_scale_inv(cal.amax[key], 2.0), rel=1e-6)
    assert cal.amax["q"] > 448 and cal.amax["v"] < 1 / 64, cal.amax  # far from 1

    unscaled_hidden = hidden_states(120, width, 5)
    slots = np.arange(120) + 5

    def cosine_in_two(layer_weights, hidden, **scales):
        """80 tokens into the cache, then 40 over them, against the float64 reference."""
        ref = fp8mla.mla_prefill_reference(layer_weights, hidden, [(0, 120, slots)],
                                           np.zeros((9, PAGE, 576), E4M3))[80:]
        run = fp8mla.MlaLayer(None, layer_weights)
        cache = np.zeros((9, PAGE, 576), dtype=E4M3)
        run.prefill(hidden[:80], [(0, 80, slots[:80])], cache, **scales)
        return cosine(run.prefill(hidden[80:], [(80, 40, slots)], cache, **scales), ref)

    hidden = (unscaled_hidden.astype(np.float32) / 512).astype(BF16)
    unscaled = cosine_in_two(unscaled_weights, unscaled_hidden)
    unit = cosine_in_two(weights, hidden)
    calibrated = cosine_in_two(weights, hidden, **cal.prefill_options())
    print(f"fp8 path cosine: unscaled {unscaled:.6f}; unit scales {unit:.6f}, "
          f"calibrated {calibrated:.6f}")
    assert unit < 0.9
    assert calibrated >= unscaled - 5e-4
    if fmt == "bf16":
        assert calibrated >= 0.999


def test_calibration_errors(tiny_layer):
    hidden = hidden_states(4, 512, 0)
    with pytest.raises(fp8mla.InvalidArgumentError, match="headroom >= 1"):
        tiny_layer.calibrate(hidden, [(0, 4, range(4))], headroom=0.5)
    with pytest.raises(fp8mla.InvalidArgumentError, match="at least one extend token"):
        tiny_layer.calibrate(hidden[:0], [(3, 0, range(3))])
    with pytest.raises(fp8mla.InvalidArgumentError, match="hidden"):
        tiny_layer.calibrate(hidden_states(4, 256, 0), [(0, 4, range(4))])
    bad = hidden.copy()
    bad[1, 7] = np.nan
    with pytest.raises(fp8mla.InvalidArgumentError, match="non-finite"):
        tiny_layer.calibrate(bad, [(0, 4, range(4))])
    calibration = tiny_layer.calibrate(hidden, [(0, 4, range(4))], headroom=4.0)
    assert calibration.headroom == 4.0
    assert calibration.q_scale_inv == pytest.approx(
        expected_scale_inv(calibration.amax["q"], 4.0), rel=1e-6)
