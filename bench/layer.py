#!/usr/bin/env python3
"""The MLA layer's anchor: an eager PyTorch BF16 DeepSeek-V3 attention layer, written from
docs/design.md section 5 the way an engine would write it without fp8mla, timed on the shapes
`fp8mla bench layer` runs (a single sequence of T new tokens, T = 2k, 8k, 32k, with no prefix
or a cached prefix of T tokens); bench/report.py --kind layer puts both side by side.

The eager layer: q_a -> RMSNorm -> q_b; kv_a_with_mqa -> RMSNorm on kv_c -> kv_b; interleaved
RoPE on q_pe and k_pe; the FP8 latent cache write of the new tokens (e4m3 of [kv_c | k_pe] scattered
to their slots); the prefix keys gathered from the cache, dequantized and sent through kv_b; cuDNN
SDPA (anchors.cudnn_sdpa_bf16's backend) over [prefix | new] keys, bottom-right causal; o_proj.
Weights bf16 (random, U(-1, 1) / sqrt(in)). Timed with bench/common.py's timer (CUDA events,
warm-up, median, host-paced) in this process.

    python3 bench/layer.py --json out/layer_py.json
    python3 bench/report.py --kind layer --cli out/layer_cli.json --py out/layer_py.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import math

from common import time_ms

HIDDEN, HEADS, Q_LORA, KV_LORA, ROPE, NOPE, DV = 7168, 128, 1536, 512, 64, 128, 128
TOKENS = [2048, 8192, 32768]
TIMER = "CUDA events around each call, median (bench/common.py time_ms, host-paced)"


class EagerMlaLayer:
    """DeepSeek-V3's MLA attention layer in eager PyTorch, bf16."""

    def __init__(self, torch, device):
        self.torch = torch
        g = torch.Generator(device=device).manual_seed(1)

        def linear(out, inp):
            w = (torch.rand(out, inp, device=device, generator=g) * 2 - 1) / math.sqrt(inp)
            return w.to(torch.bfloat16)

        self.q_a = linear(Q_LORA, HIDDEN)
        self.q_b = linear(HEADS * (NOPE + ROPE), Q_LORA)
        self.kv_a = linear(KV_LORA + ROPE, HIDDEN)
        self.kv_b = linear(HEADS * (NOPE + DV), KV_LORA)
        self.o = linear(HIDDEN, HEADS * DV)
        self.q_norm = torch.ones(Q_LORA, device=device, dtype=torch.bfloat16)
        self.kv_norm = torch.ones(KV_LORA, device=device, dtype=torch.bfloat16)
        # YaRN as DeepSeek-V3 configures it only changes the tables and the softmax scale; plain
        # tables cost the same.
        pos = torch.arange(65536, device=device, dtype=torch.float32)
        inv = 1.0 / (10000.0 ** (torch.arange(0, ROPE, 2, device=device, dtype=torch.float32) / ROPE))
        freqs = torch.outer(pos, inv)
        self.cos, self.sin = freqs.cos(), freqs.sin()
        self.scale = 1.0 / math.sqrt(NOPE + ROPE)

    def rms_norm(self, x, w, eps=1e-6):
        xf = x.float()
        return (xf * self.torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w

    def rope(self, x, positions):  # interleaved pairs (2i, 2i + 1)
        torch = self.torch
        c, s = self.cos[positions], self.sin[positions]
        while c.dim() < x.dim():
            c, s = c.unsqueeze(-2), s.unsqueeze(-2)
        x0, x1 = x.float()[..., 0::2], x.float()[..., 1::2]
        return torch.stack((x0 * c - x1 * s, x1 * c + x0 * s), dim=-1).flatten(-2).to(x.dtype)

    def forward(self, hidden, cache, prefix_slots, slots, positions):
        torch = self.torch
        T = hidden.shape[0]
        q = (self.rms_norm(hidden @ self.q_a.t(), self.q_norm) @ self.q_b.t()).view(T, HEADS, -1)
        q_nope, q_pe = q.split([NOPE, ROPE], dim=-1)
        latent = hidden @ self.kv_a.t()
        kv_c = self.rms_norm(latent[:, :KV_LORA], self.kv_norm)
        k_pe = self.rope(latent[:, KV_LORA:], positions)
        q = torch.cat((q_nope, self.rope(q_pe, positions)), dim=-1)
        flat = cache.view(torch.uint8).view(-1, KV_LORA + ROPE)  # fp8 bytes: index_put on u8
        flat[slots] = torch.cat((kv_c, k_pe), dim=-1).to(torch.float8_e4m3fn).view(torch.uint8)
        if prefix_slots.numel() > 0:
            old = flat[prefix_slots].view(torch.float8_e4m3fn).to(torch.bfloat16)
            kv_c = torch.cat((old[:, :KV_LORA], kv_c))
            k_pe = torch.cat((old[:, KV_LORA:], k_pe))
        n = kv_c.shape[0]
        kv = (kv_c @ self.kv_b.t()).view(n, HEADS, NOPE + DV)
        k_nope, v = kv.split([NOPE, DV], dim=-1)
        k = torch.cat((k_nope, k_pe.unsqueeze(1).expand(n, HEADS, ROPE)), dim=-1)
        o = self.attention(q, k, v)
        return o.reshape(T, HEADS * DV) @ self.o.t()

    def attention(self, q, k, v):
        torch = self.torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.attention.bias import causal_lower_right

        qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
        if qh.shape[2] == kh.shape[2]:
            kwargs = {"is_causal": True}
        else:
            kwargs = {"attn_mask": causal_lower_right(qh.shape[2], kh.shape[2])}
        sdpa = torch.nn.functional.scaled_dot_product_attention
        # cuDNN first (the attention anchor); PyTorch's own choice where cuDNN declines the mask.
        for backends in ([SDPBackend.CUDNN_ATTENTION], None):
            try:
                if backends is None:
                    o = sdpa(qh, kh, vh, scale=self.scale, **kwargs)
                else:
                    with sdpa_kernel(backends):
                        o = sdpa(qh, kh, vh, scale=self.scale, **kwargs)
                self.attention_backend = "cudnn" if backends else "pytorch default"
                break
            except RuntimeError:
                if backends is None:
                    raise
        return o.squeeze(0).transpose(0, 1)


def run(args):
    import torch

    dev = torch.device("cuda")
    layer = EagerMlaLayer(torch, dev)
    rows = []
    for T in args.tokens:
        for prefix in (0, T):
            g = torch.Generator(device=dev).manual_seed(7)
            hidden = torch.randn(T, HIDDEN, device=dev, dtype=torch.bfloat16, generator=g)
            pages = (prefix + T + 63) // 64
            cache = torch.randn(pages, 64, KV_LORA + ROPE, device=dev, generator=g)
            cache = cache.to(torch.float8_e4m3fn)
            prefix_slots = torch.arange(prefix, device=dev)
            slots = torch.arange(prefix, prefix + T, device=dev)
            positions = slots.clone()
            row = {"path": "eager", "tokens": T, "prefix": prefix}
            try:
                row["ms"] = time_ms(
                    torch, lambda: layer.forward(hidden, cache, prefix_slots, slots, positions),
                    args.iters, args.warmup, queued=False)
                row["attention_backend"] = layer.attention_backend
            except (RuntimeError, torch.OutOfMemoryError) as e:  # report, do not hide
                row["error"] = str(e).splitlines()[0][:200]
            print(f"eager T={T:6d} prefix={prefix:6d} " +
                  (f"{row['ms']:9.3f} ms" if "ms" in row else "error: " + row["error"]), flush=True)
            rows.append(row)
            del hidden, cache
            torch.cuda.empty_cache()
    doc = {"bench": "layer", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": datetime.date.today().isoformat(), "timer": TIMER, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, nargs="+", default=TOKENS)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--json", help="write the eager timings here")
    run(p.parse_args())


if __name__ == "__main__":
    main()
