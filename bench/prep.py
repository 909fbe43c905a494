#!/usr/bin/env python3
"""MLA prep benchmark of fp8mla's Python ops against the anchors, in one process.

Every implementation runs on the SAME input tensors and is timed by the SAME timer
(anchors.bench: CUDA events around each call, warm-up, median). Layouts are an engine's
(DeepSeek-V3, H = 128): q [T, H, 192] bf16 read as q_nope = q[..., :128], q_pe = q[..., 128:];
kv [T, H, 256] read as k_nope = kv[..., :128], v = kv[..., 128:]; kv_a [T, 576] read as
kv_c = kv_a[:, :512], k_pe = kv_a[:, 512:]; the FP8 latent cache [pages, 64, 576]. Inputs are
random non-zero bf16, rotated through enough sets that the bytes counted exceed 2x the L2 (one
set when a set alone is that large); one counter runs across all implementations of a shape, so
none reads an input another one has just pulled into the L2. fp8mla writes into preallocated
outputs (allocation is not timed); the anchors allocate as they normally do.

    python3 bench/prep.py --anchors ../shared/anchors --json out/prep_py.json --plot out/prep_py.png

Ops and anchors (ratio = anchor time / fp8mla time, > 1: fp8mla faster):
  rope_quant_neox         fp8mla style="neox"   vs anchors.rope_quant_compiled (torch.compile, the
                          anchor of DESIGN section 9) and anchors._rope_quant run eagerly
  rope_quant_interleaved  fp8mla style="interleaved" (DeepSeek's) vs the same math, interleaved
                          pairs, written here: torch.compile'd and eager
  kv_pack                 fp8mla.mla_kv_pack_quantize_fp8 vs cat(k_nope, broadcast k_pe), scale,
                          clamp, cast to float8_e4m3fn: torch.compile'd and eager
  kv_cache_write          fp8mla.mla_kv_cache_write vs eager index_copy_ into the cache
  kv_gather               fp8mla.mla_kv_gather vs eager index_select of the cache rows
Bytes per shape are counted as in `fp8mla bench prep` (bench/README.md): every input read once
and every output written once; the anchors' TB/s uses the same count.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import sys
import traceback

from anchors_loader import load_anchors

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TOKENS = [1, 16, 64, 256, 1024, 4096, 8192, 16384, 65536, 131072]
HEADS = 128
PAGE_SIZE = 64
MAX_POS = 163840            # DeepSeek-V3's max_position_embeddings
NOPE, ROPE, QK, VD, KV_LORA, LATENT = 128, 64, 192, 128, 512, 576
KV_WIDTH = NOPE + VD        # kv [T, H, 256]
SCALE_INV = 16.0            # pack and cache write: |x| < 16, |x * 16| < 256 < 448
GATHER_SCALE = 1.0 / 16.0
INDEX_BYTES = 8             # positions and slots are int64
COS_SIN_ROW = ROPE * 4      # one f32 row of cos_sin

OPS = ["rope_quant_neox", "rope_quant_interleaved", "kv_pack", "kv_cache_write", "kv_gather"]
# The anchor of DESIGN section 9's ">= 1.6x torch.compile" target, per op.
COMPILE_TARGET_ANCHOR = {"rope_quant_neox": "torch_compile", "kv_pack": "torch_compile"}


# ---- Byte counts (the same as tools/cli/bench_prep.cpp) ----------------------------------------

def pages_of(t, page_size=PAGE_SIZE):
    return max(1, -(-t // page_size))


def count_bytes(op, t, h=HEADS):
    """(bytes read, bytes written), each input and output once."""
    if op.startswith("rope_quant"):
        # q_nope + q_pe + k_nope, k_pe once per token, positions, one cos_sin row per token.
        return (t * h * (NOPE + ROPE + NOPE) * 2 + t * ROPE * 2 + t * INDEX_BYTES +
                t * COS_SIN_ROW, 2 * t * h * QK)
    if op == "kv_pack":
        return t * h * KV_WIDTH * 2 + t * ROPE * 2, t * h * (QK + VD)
    if op == "kv_cache_write":
        return t * LATENT * 2 + t * INDEX_BYTES, t * LATENT
    if op == "kv_gather":
        return t * LATENT + t * INDEX_BYTES, t * LATENT * 2
    raise ValueError(op)


# ---- Torch versions written here -------------------------------------------------------------

def make_torch_versions(torch):
    fp8 = torch.float8_e4m3fn

    def rope_quant_interleaved(q_nope, q_pe, k_nope, k_pe, pos, cos_sin):
        """anchors._rope_quant with interleaved pairs (2i, 2i+1), as fp8mla's default style."""
        H, DR = q_pe.shape[1], q_pe.shape[-1]
        cs = cos_sin[pos]
        c, s = cs[:, None, :DR // 2], cs[:, None, DR // 2:]

        def rot(x):
            x = x.float()
            x0, x1 = x[..., 0::2], x[..., 1::2]
            return torch.stack([x0 * c - x1 * s, x1 * c + x0 * s], -1).flatten(-2)
        qr, kr = rot(q_pe), rot(k_pe).expand(-1, H, -1)
        q = torch.cat([q_nope.float(), qr], -1).clamp(-448, 448).to(fp8)
        k = torch.cat([k_nope.float(), kr], -1).clamp(-448, 448).to(fp8)
        return q, k

    def kv_pack(k_nope, k_pe, v, k_scale_inv, v_scale_inv):
        """k = fp8([k_nope | k_pe broadcast to every head] * k_scale_inv), v = fp8(v * v_scale_inv),
        saturating like fp8mla."""
        H = k_nope.shape[1]
        k = torch.cat([k_nope, k_pe[:, None, :].expand(-1, H, -1)], -1)
        k = (k.float() * k_scale_inv).clamp(-448, 448).to(fp8)
        v = (v.float() * v_scale_inv).clamp(-448, 448).to(fp8)
        return k, v

    def cache_write(kv_c, k_pe, cache, slots, scale_inv):
        rows = (torch.cat([kv_c, k_pe], -1).float() * scale_inv).clamp(-448, 448).to(fp8)
        cache.view(torch.uint8).view(-1, LATENT).index_copy_(0, slots, rows.view(torch.uint8))

    def gather(cache, slots, scale):
        rows = cache.view(torch.uint8).view(-1, LATENT).index_select(0, slots).view(fp8)
        rows = (rows.float() * scale).to(torch.bfloat16)
        return rows[:, :KV_LORA], rows[:, KV_LORA:]

    return {
        "rope_quant_interleaved_eager": rope_quant_interleaved,
        "rope_quant_interleaved_compiled": torch.compile(rope_quant_interleaved),
        "kv_pack_eager": kv_pack,
        "kv_pack_compiled": torch.compile(kv_pack),
        "cache_write_eager": cache_write,
        "gather_eager": gather,
    }


# ---- The benchmark ----------------------------------------------------------------------------

class Runner:
    def __init__(self, torch, anchors, fp8mla, fp8mla_error, args):
        self.torch, self.anchors, self.fp8mla, self.fp8mla_error = torch, anchors, fp8mla, fp8mla_error
        self.args = args
        self.heads = args.heads
        props = torch.cuda.get_device_properties(0)
        self.l2 = int(getattr(props, "L2_cache_size", 0) or 60 * 2**20)
        self.dev = torch.device("cuda", 0)
        self.versions = make_torch_versions(torch)
        self.cos_sin = None
        if fp8mla is not None:
            try:
                self.cos_sin = fp8mla.make_cos_sin_cache(MAX_POS, rope_dim=ROPE, device=self.dev)
                self.cos_sin_source = "fp8mla.make_cos_sin_cache"
            except Exception:
                traceback.print_exc()
        if self.cos_sin is None:
            self.cos_sin = anchors.make_cos_sin_cache(MAX_POS, rope_dim=ROPE, device=self.dev)
            self.cos_sin_source = "anchors.make_cos_sin_cache"

    def time_us(self, fn):
        return self.anchors.bench(fn, warmup=self.args.warmup, iters=self.args.iters) * 1e3

    def random_bf16(self, shape):
        """Random non-zero bf16, |x| in [1/32, 16): magnitude in [1/32, 4), times 0.5..4 per
        block of 64, random sign (as bench/quant.py), made in chunks to bound the float32
        scratch."""
        torch = self.torch
        out = torch.empty(shape, dtype=torch.bfloat16, device=self.dev)
        flat = out.view(-1)
        chunk = 1 << 26
        for start in range(0, flat.numel(), chunk):
            part = flat[start:start + chunk]
            n = part.numel()
            x = torch.empty(n, dtype=torch.float32, device=self.dev).uniform_(1 / 32, 4)
            if n % 64 == 0:
                blocks = torch.randint(0, 4, (n // 64, 1), device=self.dev).float()
                x.view(-1, 64).mul_(torch.pow(2.0, blocks - 1))
            sign = torch.randint(0, 2, (n,), device=self.dev, dtype=torch.int8).bool()
            x = torch.where(sign, -x, x)
            part.copy_(x)
            del x, sign
        return out

    def copy_ceiling(self):
        torch = self.torch
        n = 1 << 30
        a = torch.empty(n, dtype=torch.uint8, device=self.dev).random_()
        b = torch.empty_like(a)
        us = self.time_us(lambda: b.copy_(a))
        del a, b
        torch.cuda.empty_cache()
        return 2 * n / us / 1e6

    # -- inputs of one set --
    def positions(self, t, s):
        torch = self.torch
        return (torch.arange(t, device=self.dev, dtype=torch.int64) + s * t) % MAX_POS

    def slots(self, t, s):
        """The set's cache pages in a random order, tokens in order within a page."""
        torch = self.torch
        g = torch.Generator(device="cpu").manual_seed(1000003 * s + t)
        perm = torch.randperm(pages_of(t), generator=g).to(self.dev)
        i = torch.arange(t, device=self.dev, dtype=torch.int64)
        return perm[i // PAGE_SIZE] * PAGE_SIZE + i % PAGE_SIZE

    def make_sets(self, op, t, sets):
        torch, h = self.torch, self.heads
        fp8 = torch.float8_e4m3fn
        out = []
        for s in range(sets):
            d = {}
            if op.startswith("rope_quant"):
                q = self.random_bf16((t, h, QK))
                kv = self.random_bf16((t, h, KV_WIDTH))
                kv_a = self.random_bf16((t, LATENT))
                d.update(q_nope=q[..., :NOPE], q_pe=q[..., NOPE:], k_nope=kv[..., :NOPE],
                         k_pe=kv_a[:, None, KV_LORA:], pos=self.positions(t, s),
                         q_out=torch.empty((t, h, QK), dtype=fp8, device=self.dev),
                         k_out=torch.empty((t, h, QK), dtype=fp8, device=self.dev))
            elif op == "kv_pack":
                kv = self.random_bf16((t, h, KV_WIDTH))
                d.update(k_nope=kv[..., :NOPE], v=kv[..., NOPE:], k_pe=self.random_bf16((t, ROPE)),
                         k_out=torch.empty((t, h, QK), dtype=fp8, device=self.dev),
                         v_out=torch.empty((t, h, VD), dtype=fp8, device=self.dev))
            elif op == "kv_cache_write":
                kv_a = self.random_bf16((t, LATENT))
                cache = torch.empty((pages_of(t), PAGE_SIZE, LATENT), dtype=fp8, device=self.dev)
                cache.view(torch.uint8).fill_(0xFF)
                d.update(kv_c=kv_a[:, :KV_LORA], k_pe=kv_a[:, KV_LORA:], slots=self.slots(t, s),
                         cache=cache)
            elif op == "kv_gather":
                cache = self.random_bf16((pages_of(t), PAGE_SIZE, LATENT)).to(fp8)
                rows = torch.empty((t, LATENT), dtype=torch.bfloat16, device=self.dev)
                d.update(cache=cache, slots=self.slots(t, s), kv_c_out=rows[:, :KV_LORA],
                         k_pe_out=rows[:, KV_LORA:])
            out.append(d)
        return out

    # -- one op at one T: a list of result rows (one per anchor) --
    def run_shape(self, op, t):
        torch = self.torch
        nin, nout = count_bytes(op, t, self.heads)
        nbytes = nin + nout
        sets = max(1, (2 * self.l2) // max(nbytes, 1) + 1)
        xs = self.make_sets(op, t, sets)
        counter = itertools.count()

        def nxt():
            return next(counter) % sets

        base = {"op": op, "family": op, "label": f"T={t}", "shape": f"T={t} H={self.heads}",
                "tokens": t, "heads": self.heads, "bytes": nbytes, "bytes_in": nin,
                "bytes_out": nout, "sets": sets}

        fp8mla_fn, fp8mla_status, fp8mla_out = None, "ok", None
        if self.fp8mla is None:
            fp8mla_status = f"unavailable: {self.fp8mla_error}"
        else:
            try:
                fp8mla_fn, fp8mla_snapshot = self.fp8mla_callable(op, xs)
            except Exception as e:  # recorded, the anchors still run
                fp8mla_status = f"error: {type(e).__name__}: {e}"
                traceback.print_exc()
        fp8mla_us = None
        if fp8mla_fn is not None:
            try:
                fp8mla_us = self.time_us(lambda: fp8mla_fn(nxt()))
                fp8mla_out = fp8mla_snapshot()  # set 0, written by the first timed call
            except Exception as e:  # recorded, the anchors still run
                fp8mla_status = f"error: {type(e).__name__}: {e}"
                traceback.print_exc()

        rows = []
        for name, source, fn, ref in self.anchor_callables(op, xs):
            anchor_us, agreement, status = None, None, "ok"
            try:
                anchor_us = self.time_us(lambda: fn(nxt()))
                if fp8mla_out is not None:
                    agreement = self.agreement(fp8mla_out, ref())
            except Exception as e:
                status = f"error: {type(e).__name__}: {e}"
                traceback.print_exc()
            torch.cuda.empty_cache()
            row = dict(base)
            row.update({
                "fp8mla_status": fp8mla_status,
                "fp8mla_us": fp8mla_us,
                "fp8mla_tbps": nbytes / fp8mla_us / 1e6 if fp8mla_us else None,
                "anchor": name,
                "anchor_source": source,
                "anchor_status": status,
                "anchor_us": anchor_us,
                "anchor_tbps": nbytes / anchor_us / 1e6 if anchor_us else None,
                "ratio": anchor_us / fp8mla_us if (anchor_us and fp8mla_us) else None,
                "output_agreement": agreement,
            })
            rows.append(row)
        del xs, fp8mla_out
        torch.cuda.empty_cache()
        return rows

    def fp8mla_callable(self, op, xs):
        """(fn(set), snapshot() -> set 0's outputs, cloned). Outputs are preallocated per set."""
        f, cs = self.fp8mla, self.cos_sin
        if op.startswith("rope_quant"):
            style = "neox" if op == "rope_quant_neox" else "interleaved"

            def fn(i):
                x = xs[i]
                return f.mla_rope_quantize_fp8(x["q_nope"], x["q_pe"], x["k_nope"], x["k_pe"],
                                               x["pos"], cs, style=style, q_scale_inv=1.0,
                                               k_scale_inv=1.0, q_out=x["q_out"],
                                               k_out=x["k_out"])
            return fn, lambda: (xs[0]["q_out"].clone(), xs[0]["k_out"].clone())
        if op == "kv_pack":
            def fn(i):
                x = xs[i]
                return f.mla_kv_pack_quantize_fp8(x["k_nope"], x["k_pe"], x["v"],
                                                  k_scale_inv=SCALE_INV, v_scale_inv=SCALE_INV,
                                                  k_out=x["k_out"], v_out=x["v_out"])
            return fn, lambda: (xs[0]["k_out"].clone(), xs[0]["v_out"].clone())
        if op == "kv_cache_write":
            def fn(i):
                x = xs[i]
                f.mla_kv_cache_write(x["kv_c"], x["k_pe"], x["cache"], x["slots"],
                                     scale_inv=SCALE_INV)
            return fn, lambda: (self.cache_rows(xs[0]),)
        if op == "kv_gather":
            def fn(i):
                x = xs[i]
                return f.mla_kv_gather(x["cache"], x["slots"], GATHER_SCALE,
                                       kv_c_out=x["kv_c_out"], k_pe_out=x["k_pe_out"])
            return fn, lambda: (xs[0]["kv_c_out"].clone(), xs[0]["k_pe_out"].clone())
        raise ValueError(op)

    def cache_rows(self, x):
        """The cache rows of the set's slots (what the write produced), as uint8 [T, 576]."""
        torch = self.torch
        return x["cache"].view(torch.uint8).view(-1, LATENT).index_select(0, x["slots"])

    def anchor_callables(self, op, xs):
        """[(name, source, fn(set), ref() -> set 0's outputs)]."""
        anchors, v = self.anchors, self.versions
        cs = self.cos_sin

        def rope(f):
            fn = lambda i: f(xs[i]["q_nope"], xs[i]["q_pe"], xs[i]["k_nope"], xs[i]["k_pe"],
                             xs[i]["pos"], cs)
            return fn, lambda: fn(0)

        if op == "rope_quant_neox":
            result = [("torch_compile", "anchors.rope_quant_compiled",
                       *rope(anchors.rope_quant_compiled))]
            eager = getattr(anchors, "_rope_quant", None)
            if eager is not None:
                result.append(("torch_eager", "anchors._rope_quant (eager)", *rope(eager)))
            return result
        if op == "rope_quant_interleaved":
            return [("torch_compile", "bench/prep.py, torch.compile",
                     *rope(v["rope_quant_interleaved_compiled"])),
                    ("torch_eager", "bench/prep.py, eager", *rope(v["rope_quant_interleaved_eager"]))]
        if op == "kv_pack":
            def pack(f):
                fn = lambda i: f(xs[i]["k_nope"], xs[i]["k_pe"], xs[i]["v"], SCALE_INV, SCALE_INV)
                return fn, lambda: fn(0)
            return [("torch_compile", "bench/prep.py, torch.compile", *pack(v["kv_pack_compiled"])),
                    ("torch_eager", "bench/prep.py, eager", *pack(v["kv_pack_eager"]))]
        if op == "kv_cache_write":
            f = v["cache_write_eager"]
            fn = lambda i: f(xs[i]["kv_c"], xs[i]["k_pe"], xs[i]["cache"], xs[i]["slots"],
                             SCALE_INV)

            def ref():
                fn(0)
                return (self.cache_rows(xs[0]),)
            return [("torch_eager", "bench/prep.py, eager index_copy_", fn, ref)]
        if op == "kv_gather":
            f = v["gather_eager"]
            fn = lambda i: f(xs[i]["cache"], xs[i]["slots"], GATHER_SCALE)
            return [("torch_eager", "bench/prep.py, eager index_select", fn, lambda: fn(0))]
        raise ValueError(op)

    def agreement(self, ours, theirs):
        """Fraction of equal output bytes (set 0), fp8mla vs the anchor. Informational: RoPE in
        torch rounds x0*c and x1*s separately where fp8mla uses one fma (mla_prep.hpp), so a few
        FP8 values can differ by one step; the rest should be identical."""
        torch = self.torch

        def as_bytes(ts):
            return torch.cat([t.contiguous().view(torch.uint8).reshape(-1) for t in ts])
        a, b = as_bytes(ours), as_bytes(theirs)
        if a.numel() != b.numel():
            return None
        return (a == b).sum().item() / a.numel()  # no float copy of a 10 GB mask


def plot(results, ceiling, path, device):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = [op for op in OPS if any(r["op"] == op for r in results)]
    cols = 2
    nrows = max(1, math.ceil(len(ops) / cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(7 * cols, 4.5 * nrows), squeeze=False)
    colors = {"fp8mla": "tab:red", "torch_compile": "tab:green", "torch_eager": "tab:gray"}
    for ax, op in zip(axes.flat, ops):
        series = {}
        for r in (r for r in results if r["op"] == op):
            if r["fp8mla_tbps"]:
                series.setdefault("fp8mla", {})[r["bytes"]] = r["fp8mla_tbps"]
            if r["anchor_tbps"]:
                series.setdefault(r["anchor"], {})[r["bytes"]] = r["anchor_tbps"]
        for impl, pts in sorted(series.items()):
            xs = sorted(pts)
            ax.plot(xs, [pts[x] for x in xs], marker="o", color=colors.get(impl),
                    label=impl, linewidth=1, markersize=4)
        if ceiling:
            ax.axhline(ceiling, color="black", linestyle="--", linewidth=1,
                       label=f"device copy {ceiling:.2f} TB/s")
        if op in ("rope_quant_neox", "rope_quant_interleaved", "kv_pack"):
            ax.axhline(3.8, color="tab:red", linestyle=":", linewidth=1, label="target 3.8 TB/s")
        ax.set_xscale("log")
        ax.set_xlabel("bytes moved (inputs read + outputs written)")
        ax.set_ylabel("TB/s")
        ax.set_title(op)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(ops):]:
        ax.axis("off")
    fig.suptitle(f"fp8mla MLA prep ops vs anchors, H={results[0]['heads'] if results else HEADS}, "
                 f"{device}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--anchors", help="anchors.py or its folder (default: ../shared/anchors)")
    p.add_argument("--json", default="prep_py.json", help="output JSON (default prep_py.json)")
    p.add_argument("--plot", default=None, help="output PNG (default: the JSON path with .png)")
    p.add_argument("--op", default="all", help="comma-separated ops: all, " + ", ".join(OPS))
    p.add_argument("--tokens", default=None,
                   help="comma-separated T values (default " + ",".join(map(str, TOKENS)) + ")")
    p.add_argument("--heads", type=int, default=HEADS)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=30)
    args = p.parse_args()

    ops = OPS if args.op == "all" else args.op.split(",")
    for op in ops:
        if op not in OPS:
            sys.exit(f"prep.py: unknown op {op!r}; expected one of {OPS}")
    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else TOKENS
    if any(t < 1 or t > MAX_POS for t in tokens):
        sys.exit(f"prep.py: --tokens must lie in 1..{MAX_POS}")

    import torch
    import triton
    if not torch.cuda.is_available():
        sys.exit("prep.py: needs a CUDA GPU")
    anchors, anchors_path = load_anchors(args.anchors, "prep.py")
    try:
        import fp8mla
        fp8mla_error = None
    except Exception as e:  # the anchors are still timed; fp8mla rows say why they are empty
        fp8mla, fp8mla_error = None, f"{type(e).__name__}: {e}"
        print(f"prep.py: fp8mla not importable ({fp8mla_error})", file=sys.stderr)

    runner = Runner(torch, anchors, fp8mla, fp8mla_error, args)
    device = torch.cuda.get_device_name(0)
    ceiling = runner.copy_ceiling()
    print(f"{device}: torch {torch.__version__}, triton {triton.__version__}, anchors {anchors_path}")
    print(f"device copy ceiling {ceiling:.3f} TB/s (1 GiB, read + write); H={args.heads}, "
          f"page size {PAGE_SIZE}; cos_sin from {runner.cos_sin_source}")
    print(f"{'op':<23} {'shape':<16} {'MB':>10} {'fp8mla us':>10} {'TB/s':>6} "
          f"{'anchor':<14} {'anchor us':>10} {'TB/s':>6} {'ratio':>6}  agree")
    results = []
    for op in ops:
        for t in tokens:
            rows = runner.run_shape(op, t)
            results += rows
            for r in rows:
                def f(v, fmt):
                    return format(v, fmt) if v is not None else "-"
                note = "" if r["anchor_status"] == "ok" else r["anchor_status"]
                if r["fp8mla_status"] != "ok":
                    note += " fp8mla " + r["fp8mla_status"]
                print(f"{op:<23} {r['shape']:<16} {r['bytes'] / 1e6:10.3f} "
                      f"{f(r['fp8mla_us'], '10.2f')} {f(r['fp8mla_tbps'], '6.3f')} "
                      f"{r['anchor']:<14} {f(r['anchor_us'], '10.2f')} "
                      f"{f(r['anchor_tbps'], '6.3f')} {f(r['ratio'], '6.2f')}  "
                      f"{f(r['output_agreement'], '.4f')} {note}", flush=True)

    doc = {
        "benchmark": "bench/prep.py",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": device,
        "l2_bytes": runner.l2,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "fp8mla_version": getattr(fp8mla, "__version__", None),
        "anchors": anchors_path,
        "timer": "anchors.bench: CUDA events around each call, median",
        "warmup": args.warmup,
        "iters": args.iters,
        "heads": args.heads,
        "page_size": PAGE_SIZE,
        "max_positions": MAX_POS,
        "cos_sin": runner.cos_sin_source,
        "copy_ceiling_tbps": ceiling,
        "ratio": "anchor us / fp8mla us (> 1: fp8mla faster)",
        "results": results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"wrote {args.json}")
    png = args.plot or os.path.splitext(args.json)[0] + ".png"
    try:
        plot(results, ceiling, png, device)
        print(f"wrote {png}")
    except Exception:  # the JSON is what the report reads
        traceback.print_exc()


if __name__ == "__main__":
    main()
