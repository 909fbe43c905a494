#!/usr/bin/env python3
"""The MLA layer's anchor: an eager PyTorch BF16 DeepSeek-V3 attention layer, written from DESIGN
section 5 the way an engine would write it without fp8mla, timed on the shapes `fp8mla bench
layer` runs (a single sequence of T new tokens, T = 2k, 8k, 32k, with no prefix or a cached prefix
of T tokens), then the report that puts both side by side.

The eager layer: q_a -> RMSNorm -> q_b; kv_a_with_mqa -> RMSNorm on kv_c -> kv_b; interleaved
RoPE on q_pe and k_pe; the FP8 latent cache write of the new tokens (e4m3 of [kv_c | k_pe] scattered
to their slots); the prefix keys gathered from the cache, dequantized and sent through kv_b; cuDNN
SDPA (anchors.cudnn_sdpa_bf16's backend) over [prefix | new] keys, bottom-right causal; o_proj.
Weights bf16 (random, U(-1, 1) / sqrt(in)). Timed with anchors.bench (CUDA events, warm-up,
median) in this process.

    python3 bench/layer.py --anchors ../shared/anchors --json out/layer_py.json
    python3 bench/layer.py --report --cli out/layer_cli.json --py out/layer_py.json \\
        --markdown bench/RESULTS_layer.md
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os

from anchors_loader import load_anchors

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HIDDEN, HEADS, Q_LORA, KV_LORA, ROPE, NOPE, DV = 7168, 128, 1536, 512, 64, 128, 128
TOKENS = [2048, 8192, 32768]
# DESIGN section 9 / the layer issue: the FP8 path against the BF16 path and eager PyTorch.
TARGET_VS_BF16, TARGET_VS_EAGER = 1.5, 2.0


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

    anchors, _ = load_anchors(args.anchors, "layer.py")
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
                row["ms"] = anchors.bench(
                    lambda: layer.forward(hidden, cache, prefix_slots, slots, positions),
                    warmup=args.warmup, iters=args.iters)
                row["attention_backend"] = layer.attention_backend
            except (RuntimeError, torch.OutOfMemoryError) as e:  # report, do not hide
                row["error"] = str(e).splitlines()[0][:200]
            print(f"eager T={T:6d} prefix={prefix:6d} " +
                  (f"{row['ms']:9.3f} ms" if "ms" in row else "error: " + row["error"]), flush=True)
            rows.append(row)
            del hidden, cache
            torch.cuda.empty_cache()
    doc = {"bench": "layer", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": datetime.date.today().isoformat(), "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


def report(args):
    with open(args.cli) as f:
        cli = json.load(f)
    with open(args.py) as f:
        py = json.load(f)
    eager = {(r["tokens"], r["prefix"]): r for r in py["rows"]}
    ours = {(r["path"], r["tokens"], r["prefix"]): r for r in cli["rows"]}
    lines = [
        "# MLA layer prefill benchmark results",
        "",
        "Written by `bench/layer.py --report` from `fp8mla bench layer --json` (C++, CUDA events "
        "around `MlaLayer::prefill`) and `bench/layer.py --json` (the eager PyTorch BF16 layer, "
        "anchors.bench), both run in one device session on the same shapes. DeepSeek-V3 preset, "
        "one sequence of T new tokens, with no prefix or a cached prefix of T tokens (one-shot "
        "up to 8192 prefix keys, chunks of 8192 above). Paths: **fp8** = FP8 block-scaled "
        "weights + the `fp8-hopper` backend (FP8 GEMMs, FP8 attention); **bf16** = the same "
        "weights + `bf16-hopper` (FP8 GEMMs, BF16 attention); **bf16w** = bf16 weights + "
        "`bf16-hopper` (all BF16). Ratios are times divided (> 1: the fp8 path is faster). "
        f"Targets: fp8 >= {TARGET_VS_BF16}x the BF16 path, >= {TARGET_VS_EAGER}x eager PyTorch.",
        "",
        f"## Run of {py['date']} on {cli['device']} (torch {py['torch']})",
        "",
        "| T | prefix | fp8 ms | bf16 ms | bf16w ms | eager ms | fp8 vs bf16 | fp8 vs bf16w | "
        "fp8 vs eager | fp8 attention TFLOP/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (path, T, prefix), r in sorted(ours.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        if path != "fp8":
            continue
        b, bw, e = ours.get(("bf16", T, prefix)), ours.get(("bf16w", T, prefix)), eager.get((T, prefix))
        e_ms = e.get("ms") if e else None

        def ratio(other, target=None):
            if other is None:
                return "—"
            x = other / r["ms"]
            mark = "" if target is None else (" ✅" if x >= target else " ❌")
            return f"{x:.2f}x{mark}"

        tflops = r["attention_tflop"] / (r["attention_ms"] * 1e-3)
        lines.append(
            f"| {T} | {prefix} | {r['ms']:.2f} | {b['ms']:.2f} | {bw['ms']:.2f} | "
            f"{e_ms if e_ms is None else f'{e_ms:.2f}'} | {ratio(b['ms'], TARGET_VS_BF16)} | "
            f"{ratio(bw['ms'], TARGET_VS_BF16)} | {ratio(e_ms, TARGET_VS_EAGER)} | {tflops:.0f} |")
    lines += ["", "Per-stage milliseconds (one run with stage events):", "",
              "| path | T | prefix | projections | prep | prefix keys | attention | merge | o_proj |",
              "|---|---|---|---|---|---|---|---|---|"]
    for (path, T, prefix), r in sorted(ours.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        lines.append(f"| {path} | {T} | {prefix} | {r['projections_ms']:.2f} | {r['prep_ms']:.2f} | "
                     f"{r['prefix_ms']:.2f} | {r['attention_ms']:.2f} | {r['merge_ms']:.2f} | "
                     f"{r['output_ms']:.2f} |")
    used = sorted({r.get("attention_backend", "") for r in py["rows"] if "ms" in r})
    lines += ["", f"Eager attention ran on: {', '.join(used)} (cuDNN where it takes the mask)."]
    if args.analysis:
        lines += ["", f"Analysis of this run: [{os.path.relpath(args.analysis, os.path.dirname(args.markdown))}]"
                      f"({os.path.relpath(args.analysis, os.path.dirname(args.markdown))})."]
    errors = [r for r in py["rows"] if "error" in r]
    if errors:
        lines += ["", "Eager PyTorch failures (reported, not hidden):", ""]
        lines += [f"- T={r['tokens']} prefix={r['prefix']}: {r['error']}" for r in errors]
    with open(args.markdown, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--anchors", help="directory or file of anchors.py")
    p.add_argument("--tokens", type=int, nargs="+", default=TOKENS)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--json", help="write the eager timings here")
    p.add_argument("--report", action="store_true", help="write the markdown from --cli and --py")
    p.add_argument("--cli", help="JSON of fp8mla bench layer")
    p.add_argument("--py", help="JSON of this script's timing run")
    p.add_argument("--markdown", default=os.path.join(REPO, "bench", "RESULTS_layer.md"))
    p.add_argument("--analysis", help="with --report: a written analysis of the run to link")
    args = p.parse_args()
    report(args) if args.report else run(args)


if __name__ == "__main__":
    main()
