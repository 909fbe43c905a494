"""An engine's MLA prefill step through fp8mla's ops, on a small random model.

The engine owns the projections, the paged FP8 latent cache and the batch; fp8mla does the rest:

  1. the backend's prepare hook: q, q_pe, kv_a, k_pe, positions, ... -> FP8 Q, K and V (V in
     the layout the backend's attention reads) and the new tokens' latent rows in the cache;
  2. causal attention of the new tokens among themselves, with its LSE;
  3. attention of the new tokens over their cached prefix: the prefix rows gathered from the
     cache, expanded by kv_b_proj and packed to FP8 by the backend;
  4. that call folds its state into step 2's (prior_out / prior_lse, in place: no merge pass),
     then o_proj.

Two steps run: the first prefills a sequence's first tokens (no prefix), the second continues it
(its first tokens now a cached prefix) in a batch with a new sequence. Each step's output is
checked against fp8mla.mla_prefill_reference, the float64 reference of the whole layer.

    python examples/engine_prefill.py [--device cpu|cuda]

cpu runs on numpy arrays (numpy and ml_dtypes only) with the "cpu" backend; cuda on torch
tensors with "fp8-hopper" (a Hopper GPU). The default is cuda when torch sees a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import tempfile

import ml_dtypes
import numpy as np

import fp8mla

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
NOPE, ROPE, V_DIM, KV_LORA, LATENT = 128, 64, 128, 512, 576
PAGE_SIZE = 16
PAGES = 8
# The engine's static per-tensor FP8 scales (calibrated per layer; x = e4m3 * scale).
Q_SCALE, K_SCALE, V_SCALE, CACHE_SCALE = 0.5, 0.5, 0.25, 1.0
MIN_COSINE = 0.999  # the layer tests' bound for the FP8 path with bf16 weights
WEIGHT_NAMES = ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm",
                "kv_b_proj", "o_proj")


def read_safetensors(path: str) -> dict:
    """The tensors of a safetensors file as numpy arrays (an 8-byte header size, a JSON header,
    the raw bytes)."""
    dtypes = {"BF16": BF16, "F32": np.float32, "F8_E4M3": E4M3}
    with open(path, "rb") as f:
        data = f.read()
    (header_size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_size])
    body = memoryview(data)[8 + header_size:]
    return {name: np.frombuffer(body[entry["data_offsets"][0]:entry["data_offsets"][1]],
                                dtype=dtypes[entry["dtype"]]).reshape(entry["shape"])
            for name, entry in header.items() if name != "__metadata__"}


def model_weights(weights: fp8mla.MlaWeights) -> dict:
    """The layer's weight tensors by their DeepSeek names, as an engine loads them."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "layer.safetensors")
        weights.save(path, layer=0)
        tensors = read_safetensors(path)
    return {name: tensors[f"model.layers.0.self_attn.{name}.weight"] for name in WEIGHT_NAMES}


class NumpyArrays:
    """The engine's own math on numpy arrays: projections in f32, results in bf16."""

    backend = "cpu"

    def put(self, a):
        return a

    def numpy(self, a):
        return a

    def zeros(self, shape, dtype):
        return np.zeros(shape, dtype=dtype)

    def linear(self, x, w):
        return (x.astype(np.float32) @ w.astype(np.float32).T).astype(BF16)

    def rms_norm(self, x, w, eps):
        x = x.astype(np.float32)
        norm = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
        return (x * norm * w.astype(np.float32)).astype(BF16)


class TorchArrays:
    """The same on CUDA torch tensors."""

    device, backend = "cuda", "fp8-hopper"

    def __init__(self):
        import torch

        self.torch = torch
        self.dtypes = {BF16: torch.bfloat16, E4M3: torch.float8_e4m3fn, np.float32: torch.float32,
                       np.int32: torch.int32, np.int64: torch.int64}

    def put(self, a):
        if a.dtype in (BF16, E4M3):  # torch.from_numpy knows neither
            view = np.uint16 if a.dtype == BF16 else np.uint8
            bits = self.torch.from_numpy(np.ascontiguousarray(a).view(view).astype(np.int32))
            as_bits = self.torch.int16 if a.dtype == BF16 else self.torch.uint8
            return bits.to(as_bits).view(self.dtypes[a.dtype.type]).to(self.device)
        return self.torch.from_numpy(np.ascontiguousarray(a)).to(self.device)

    def numpy(self, a):
        if a.dtype == self.torch.bfloat16:
            return a.float().cpu().numpy().astype(BF16)
        if a.dtype == self.torch.float8_e4m3fn:
            return a.view(self.torch.uint8).cpu().numpy().view(E4M3)
        return a.cpu().numpy()

    def zeros(self, shape, dtype):
        return self.torch.zeros(shape, dtype=self.dtypes[dtype], device=self.device)

    def linear(self, x, w):
        return (x.float() @ w.float().T).to(self.torch.bfloat16)

    def rms_norm(self, x, w, eps):
        x = x.float()
        return (x * self.torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(
            self.torch.bfloat16)


def prefill_step(xp, config, w, backend, cos_sin, hidden, batch, cache):
    """One layer's prefill of `batch` ((prefix, extend, slots) per sequence) as an engine writes
    it; writes the new tokens' latent rows into `cache` and returns the o_proj output."""
    tokens, heads = hidden.shape[0], config.heads
    prefixes = np.array([prefix for prefix, _, _ in batch])
    extends = np.array([extend for _, extend, _ in batch])
    positions = np.concatenate([np.arange(p, p + e) for p, e, _ in batch]).astype(np.int32)
    slot_mapping = np.concatenate([np.asarray(s[p:]) for p, _, s in batch]).astype(np.int64)
    cu_new = xp.put(np.concatenate([[0], np.cumsum(extends)]).astype(np.int32))
    descales = dict(q_descale=Q_SCALE, k_descale=K_SCALE, v_descale=V_SCALE)

    # The projections of the new tokens (the engine's GEMMs).
    q_a = xp.rms_norm(xp.linear(hidden, w["q_a_proj"]), w["q_a_layernorm"], config.rms_norm_eps)
    q = xp.linear(q_a, w["q_b_proj"]).reshape(tokens, heads, NOPE + ROPE)
    latent = xp.linear(hidden, w["kv_a_proj_with_mqa"])  # [T, 576] = [kv_c | k_pe]
    kv_a = xp.rms_norm(latent[:, :KV_LORA], w["kv_a_layernorm"], config.rms_norm_eps)
    kv = xp.linear(kv_a, w["kv_b_proj"]).reshape(tokens, heads, NOPE + V_DIM)

    # 1. BF16 -> FP8: RoPE and e4m3 Q/K, e4m3 V in the backend's layout, the latent rows cached.
    q8, k8, v8 = backend.prepare_prefill_qkv(
        q[..., :NOPE], q[..., NOPE:], kv[..., :NOPE], latent[:, KV_LORA:], xp.put(positions),
        cos_sin, kv[..., NOPE:], kv_a=kv_a, cache=cache, slot_mapping=xp.put(slot_mapping),
        q_scale_inv=1 / Q_SCALE, k_scale_inv=1 / K_SCALE, v_scale_inv=1 / V_SCALE,
        cache_scale_inv=1 / CACHE_SCALE)

    # 2. The new tokens among themselves: causal, with the LSE the fold needs.
    out, lse = fp8mla.prefill_attention(
        q8, k8, v8, cu_new, cu_new, int(extends.max()), int(extends.max()),
        softmax_scale=config.softmax_scale, causal=True, return_lse=True, **descales)

    if prefixes.sum() > 0:
        # 3. The cached prefix: gather its latent rows, expand them, pack them to FP8.
        prefix_slots = np.concatenate([np.asarray(s[:p]) for p, _, s in batch]).astype(np.int64)
        kv_c, k_pe = fp8mla.mla_kv_gather(cache, xp.put(prefix_slots), CACHE_SCALE)
        kv_prefix = xp.linear(kv_c, w["kv_b_proj"]).reshape(-1, heads, NOPE + V_DIM)
        k8_prefix, v8_prefix = backend.pack_prefix_chunk_kv(
            kv_prefix[..., :NOPE], k_pe, kv_prefix[..., NOPE:], k_scale_inv=1 / K_SCALE,
            v_scale_inv=1 / V_SCALE)
        cu_prefix = xp.put(np.concatenate([[0], np.cumsum(prefixes)]).astype(np.int32))
        # 4. Folded into the new tokens' state in place by the same call (a sequence without a
        # prefix sees no key there and stays as it is).
        fp8mla.prefill_attention(
            q8, k8_prefix, v8_prefix, cu_new, cu_prefix, int(extends.max()),
            int(prefixes.max()), softmax_scale=config.softmax_scale, causal=False, out=out,
            lse=lse, prior_out=out, prior_lse=lse, **descales)

    return xp.linear(out.reshape(tokens, heads * V_DIM), w["o_proj"])


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="cuda when torch sees a GPU, else cpu")
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch_has_cuda() else "cpu")
    xp = NumpyArrays() if device == "cpu" else TorchArrays()

    config = fp8mla.mla_config("tiny")
    weights = fp8mla.generate_mla_weights(config, "bf16", seed=1)
    w = {name: xp.put(tensor) for name, tensor in model_weights(weights).items()}
    backend = fp8mla.make_attention_backend(xp.backend)
    backend.check_backend(attention_dtype="e4m3", page_size=PAGE_SIZE, prepare_prefill_qkv=True,
                          pack_prefix_chunk_kv=True, device=device)
    cos_sin = xp.put(fp8mla.make_cos_sin_cache(config.max_position, theta=config.rope_theta,
                                               yarn=config.yarn))
    cache = xp.zeros((PAGES, PAGE_SIZE, LATENT), E4M3)
    free_slots = np.random.default_rng(2).permutation(PAGES * PAGE_SIZE)
    slots_a, slots_b = free_slots[:64], free_slots[64:81]  # 40 + 24 tokens, 17 tokens

    steps = [[(0, 40, slots_a[:40])],                   # a sequence's first 40 tokens
             [(40, 24, slots_a), (0, 17, slots_b)]]     # its next 24, and a new sequence
    print(f"fp8mla {fp8mla.__version__}: model {config!r}, backend {backend.name!r} "
          f"(V {backend.capabilities.v_layout}), device {device}")
    rng = np.random.default_rng(3)
    worst = 1.0
    for step, batch in enumerate(steps):
        hidden = rng.standard_normal((sum(e for _, e, _ in batch), config.hidden)).astype(BF16)
        cache_before = xp.numpy(cache).copy()
        out = prefill_step(xp, config, w, backend, cos_sin, xp.put(hidden), batch, cache)
        reference = fp8mla.mla_prefill_reference(weights, hidden, batch, cache_before,
                                                 cache_scale_inv=1 / CACHE_SCALE)
        score = cosine(xp.numpy(out).astype(np.float64), reference)
        worst = min(worst, score)
        shapes = ", ".join(f"prefix {p} + {e} new" for p, e, _ in batch)
        print(f"step {step}: {shapes}: cosine to the float64 reference {score:.6f}")
    ok = worst >= MIN_COSINE
    print(f"{'ok' if ok else 'FAILED'}: worst cosine {worst:.6f} (bound {MIN_COSINE})")
    return 0 if ok else 1


def torch_has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
