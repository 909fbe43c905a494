"""fp8mla.MlaLayer against transformers' DeepseekV3Attention, the model's own definition: a small
DeepSeek-V3 (random weights, the real MLA head dims, V3's YaRN) saved with save_pretrained and
loaded by fp8mla from that directory; the same hidden states and positions through both, without
a prefix and with a cached prefix (transformers' DynamicCache; fp8mla's FP8 latent cache written
by a first prefill). transformers runs in float32 on the checkpoint's bf16 weights."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("transformers", reason="transformers is not installed")
from transformers import DynamicCache  # noqa: E402
from transformers.models.deepseek_v3 import DeepseekV3Config, DeepseekV3ForCausalLM  # noqa: E402
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention  # noqa: E402

import fp8mla  # noqa: E402
from torch_helpers import needs_gpu  # noqa: E402

LAYER = 1
PAGE, PAGES = 16, 16
PREFIX, EXTEND = 90, 40

# Cosine bounds. The BF16 path without a prefix differs from float32 by bf16 roundings only:
# 0.9999. Each e4m3 stage (3 mantissa bits) is given the C++ layer tests' FP8 budget, 1 - 0.998:
# the FP8 path's q, k and v, and with a prefix the latent cache, which holds the prefix's
# latents in e4m3 for both paths. The errors are independent, so their budgets add.
BOUND = {("bf16", 0): 0.9999, ("fp8", 0): 0.998, ("bf16", PREFIX): 0.998, ("fp8", PREFIX): 0.996}
# The attention's cache argument: `cache` in later 5.x releases, `past_key_values` before.
CACHE_ARG = ("cache" if "cache" in inspect.signature(DeepseekV3Attention.forward).parameters
             else "past_key_values")
BACKENDS = {("cpu", "bf16"): "cpu-bf16", ("cpu", "fp8"): "cpu",
            ("cuda", "bf16"): "bf16-hopper", ("cuda", "fp8"): "fp8-hopper"}


V3_YARN = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
           "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}


def hf_config(rope_scaling=None) -> DeepseekV3Config:
    """V3's attention shapes and YaRN (or `rope_scaling`) with 4 heads, hidden 256, two dense
    layers (no MoE)."""
    config = DeepseekV3Config(
        vocab_size=64, hidden_size=256, intermediate_size=64, moe_intermediate_size=32,
        num_hidden_layers=2, first_k_dense_replace=2, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=96, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, max_position_embeddings=163840, rms_norm_eps=1e-6,
        rope_theta=10000.0, rope_scaling=dict(rope_scaling or V3_YARN))
    config._attn_implementation = "eager"  # the plain softmax(QK^T * scale + mask) V
    return config


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("deepseek-v3-small"))


def build_model(path, rope_scaling=None):
    """(model directory, float32 DeepseekV3Model). The attention weights are drawn with unit-gain
    scales and non-trivial norm weights so that the attention is peaked and every weight
    matters; transformers' default init (std 0.02) makes the attention nearly uniform."""
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(hf_config(rope_scaling))
    attn = model.model.layers[LAYER].self_attn
    with torch.no_grad():
        for linear in (attn.q_a_proj, attn.q_b_proj, attn.kv_a_proj_with_mqa, attn.kv_b_proj,
                       attn.o_proj):
            linear.weight.normal_(0.0, 1.0 / math.sqrt(linear.in_features))
        for norm in (attn.q_a_layernorm, attn.kv_a_layernorm):
            norm.weight.normal_(1.0, 0.2)
    model = model.to(torch.bfloat16)
    model.save_pretrained(path)
    return path, model.float().model


def hf_attention(model, hidden, start, cache=None):
    """DeepseekV3Attention of LAYER on tokens start.. (bf16 [T, hidden] rows), causal over the
    `start` tokens in `cache` and themselves. Returns float32 [T, hidden]."""
    x = hidden.float()[None]
    tokens = x.shape[1]
    positions = torch.arange(start, start + tokens)[None]
    mask = torch.full((tokens, start + tokens), float("-inf")).triu(start + 1)[None, None]
    with torch.no_grad():
        out, _ = model.layers[LAYER].self_attn(
            x, position_embeddings=model.rotary_emb(x, positions), attention_mask=mask,
            **{CACHE_ARG: cache})
    return out[0]


def cosine(a, b) -> float:
    a = a.detach().cpu().double().ravel()
    b = b.detach().cpu().double().ravel()
    return float(a @ b / (a.norm() * b.norm()))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_gpu)])
@pytest.mark.parametrize("path_kind", ["bf16", "fp8"])
@pytest.mark.parametrize("prefix", [0, PREFIX])
def test_layer_matches_transformers(model, device, path_kind, prefix):
    path, hf = model
    hidden = torch.randn(prefix + EXTEND, 256, generator=torch.Generator().manual_seed(1))
    hidden = hidden.to(torch.bfloat16)
    slots = np.random.default_rng(2).permutation(PAGES * PAGE)[:prefix + EXTEND].tolist()
    layer = fp8mla.MlaLayer(fp8mla.mla_config(path), fp8mla.load_mla_weights(path, LAYER),
                            device=device, backend=BACKENDS[device, path_kind])
    cache = torch.zeros(PAGES, PAGE, 576, dtype=torch.float8_e4m3fn, device=device)
    on_device = hidden.to(device)
    hf_cache = None
    if prefix:
        layer.prefill(on_device[:prefix], [fp8mla.MlaSequence(0, prefix, slots[:prefix])], cache)
        hf_cache = DynamicCache(config=hf.config)
        hf_attention(hf, hidden[:prefix], 0, hf_cache)
    out = layer.prefill(on_device[prefix:], [fp8mla.MlaSequence(prefix, EXTEND, slots)], cache)
    ref = hf_attention(hf, hidden[prefix:], prefix, hf_cache)
    assert out.shape == ref.shape and out.dtype == torch.bfloat16
    assert cosine(out, ref) >= BOUND[path_kind, prefix]


# YaRN keys a config may leave out: transformers scales cos and sin by the mscale ratio only when
# both mscale keys are given (and non-zero), else by mscale(factor, 1), and the softmax by
# mscale(factor, mscale_all_dim)^2 only with mscale_all_dim.
@pytest.mark.parametrize("keys", [{}, {"mscale": 0.707}, {"mscale_all_dim": 0.707},
                                  {"mscale": 1.0, "mscale_all_dim": 0.707}],
                         ids=["neither", "mscale", "mscale_all_dim", "both-unequal"])
def test_yarn_keys_left_out_read_as_transformers_does(tmp_path, keys):
    rope_scaling = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                    **keys}
    path, hf = build_model(tmp_path, rope_scaling)
    hidden = torch.randn(EXTEND, 256, generator=torch.Generator().manual_seed(3))
    hidden = hidden.to(torch.bfloat16)
    slots = list(range(EXTEND))
    layer = fp8mla.MlaLayer(fp8mla.mla_config(path), fp8mla.load_mla_weights(path, LAYER),
                            device="cpu", backend="cpu-bf16")
    cache = torch.zeros(PAGES, PAGE, 576, dtype=torch.float8_e4m3fn)
    out = layer.prefill(hidden, [fp8mla.MlaSequence(0, EXTEND, slots)], cache)
    assert cosine(out, hf_attention(hf, hidden, 0)) >= BOUND["bf16", 0]
