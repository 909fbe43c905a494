#!/usr/bin/env python3
"""Quantization benchmark of fp8mla's Python ops against the anchors, in one process.

Every implementation runs on the SAME input tensors and is timed by the SAME timer
(anchors.bench: CUDA events around each call, warm-up, median). Inputs are random non-zero bf16,
rotated through enough sets that they exceed 2x the L2 (one set when a set alone is that large);
one counter runs across all implementations of a shape, so no implementation reads an input
another one has just pulled into the L2. fp8mla writes into preallocated outputs (allocation is
not timed); the anchors allocate as they normally do.

    python3 bench/quant.py --anchors ../shared/anchors --json out/quant_py.json --plot out/quant_py.png

Bytes per shape are counted as in `fp8mla bench quant`: input read + output written + scales,
each once (bench/README.md). The anchor's TB/s uses the same byte count as fp8mla's, so the
TB/s columns and the ratio (anchor time / fp8mla time) tell the same story.
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

TOKENS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 131072]
MILLION_ROWS = 1 << 20
HEADS = 128
SCALE_INV = 16.0          # inputs have |x| < 16: |x * 16| < 256, no saturation
NVFP4_GLOBAL_SCALE = 168.0  # 448 * 6 / 16
FP8_MAX = 448.0
MIN_DYNAMIC_SCALE = 1.0 / (448.0 * 512.0)

OPS = ["per_tensor_static", "per_tensor_dynamic", "group128_f32", "group128_packed_ue8m0",
       "nvfp4_swizzled"]


def round_up(x, to):
    return (x + to - 1) // to * to


# ---- Shapes and byte counts (the same as tools/cli/bench_quant.cpp) ----------------------------

def shapes_for(op, tokens):
    shapes = []
    for t in tokens:
        if op.startswith("per_tensor"):
            shapes += [("kv_c", f"kv_c T={t}", t, 512), ("kv_c+k_pe", f"kv_c+k_pe T={t}", t, 576),
                       ("per_head", f"per_head T={t} [T*128,128]", t * HEADS, 128)]
        else:
            shapes += [("hidden", f"hidden T={t}", t, 7168),
                       ("attn_out", f"attn_out T={t}", t, 16384)]
    if op.startswith("per_tensor"):
        shapes += [("1M rows", "1M rows x 512", MILLION_ROWS, 512),
                   ("1M rows", "1M rows x 384", MILLION_ROWS, 384)]
    return shapes


def count_bytes(op, m, k):
    n = m * k
    if op == "per_tensor_static":
        return 2 * n + n
    if op == "per_tensor_dynamic":
        return 2 * n + n + 4
    if op == "group128_f32":
        return 2 * n + n + m * (k // 128) * 4
    if op == "group128_packed_ue8m0":
        return 2 * n + n + m * ((k // 128 + 3) // 4) * 4
    if op == "nvfp4_swizzled":
        return 2 * n + n // 2 + round_up(m, 128) * round_up(k // 16, 4) + 4
    raise ValueError(op)


# ---- Eager torch anchors written here ---------------------------------------------------------

def make_torch_anchors(torch):
    fp8 = torch.float8_e4m3fn

    def static_eager(x, scale_inv):
        return (x.float() * scale_inv).to(fp8)  # does not saturate; a timing anchor only

    def dynamic_eager(x):
        s = (x.abs().amax().float() / FP8_MAX).clamp_min(MIN_DYNAMIC_SCALE)
        return (x.float() * (1.0 / s)).to(fp8), s

    # e2m1 magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 are codes 0..7; nearest-even at the midpoints:
    # (threshold, ties go up).
    e2m1_steps = [(0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False),
                  (3.5, True), (5.0, False)]

    def nvfp4_eager(x, global_scale):
        """The NVFP4 math of fp8mla.quantize_nvfp4 in eager torch: (packed uint8 [M, K/2],
        swizzled e4m3 scales as uint8 [M/128, K/64, 32, 4, 4])."""
        m, k = x.shape
        xb = x.float().view(m, k // 16, 16)
        amax = xb.abs().amax(-1)
        sf = (global_scale * (amax / 6.0)).to(fp8)
        sf32 = sf.float()
        inv = torch.where(sf32 == 0, torch.zeros_like(sf32), 1.0 / (sf32 * (1.0 / global_scale)))
        y = xb * inv[..., None]
        a = y.abs()
        code = torch.zeros(a.shape, dtype=torch.uint8, device=x.device)
        for threshold, ties_up in e2m1_steps:
            code += (a >= threshold) if ties_up else (a > threshold)
        code |= (y < 0).to(torch.uint8) << 3
        nib = code.view(m, k // 2, 2)
        packed = nib[..., 0] | (nib[..., 1] << 4)
        mp, kp = round_up(m, 128), round_up(k // 16, 4)
        sfu = torch.nn.functional.pad(sf.view(torch.uint8), (0, kp - k // 16, 0, mp - m))
        swizzled = sfu.view(mp // 128, 4, 32, kp // 4, 4).permute(0, 3, 2, 1, 4).contiguous()
        return packed, swizzled

    return static_eager, dynamic_eager, nvfp4_eager


# ---- The benchmark ----------------------------------------------------------------------------

class Runner:
    def __init__(self, torch, anchors, fp8mla, fp8mla_error, args):
        self.torch, self.anchors, self.fp8mla, self.fp8mla_error = torch, anchors, fp8mla, fp8mla_error
        self.args = args
        props = torch.cuda.get_device_properties(0)
        self.l2 = int(getattr(props, "L2_cache_size", 0) or 60 * 2**20)
        self.dev = torch.device("cuda", 0)
        self.static_eager, self.dynamic_eager, self.nvfp4_eager = make_torch_anchors(torch)
        self.global_scale = torch.full((1,), NVFP4_GLOBAL_SCALE, dtype=torch.float32,
                                       device=self.dev)

    def time_us(self, fn):
        return self.anchors.bench(fn, warmup=self.args.warmup, iters=self.args.iters) * 1e3

    def random_bf16(self, shape):
        """Random non-zero bf16, |x| in [1/32, 16): magnitude in [1/32, 4), times 0.5..4 per
        block of 64 (so group and block scales differ), random sign."""
        torch = self.torch
        x = torch.empty(shape, dtype=torch.float32, device=self.dev).uniform_(1 / 32, 4)
        flat = x.view(-1, 64) if x.numel() % 64 == 0 else x.view(1, -1)
        blocks = torch.randint(0, 4, (flat.shape[0], 1), device=self.dev)
        flat.mul_(torch.pow(2.0, blocks.float() - 1))
        sign = torch.randint(0, 2, x.shape, device=self.dev, dtype=torch.int8)
        x = torch.where(sign.bool(), -x, x)
        return x.to(torch.bfloat16)

    def copy_ceiling(self):
        torch = self.torch
        n = 1 << 30
        a = torch.empty(n, dtype=torch.uint8, device=self.dev).random_()
        b = torch.empty_like(a)
        us = self.time_us(lambda: b.copy_(a))
        del a, b
        torch.cuda.empty_cache()
        return 2 * n / us / 1e6

    # -- one op on one shape: a list of result rows (one per anchor) --
    def run_shape(self, op, family, label, m, k):
        torch, fp8mla = self.torch, self.fp8mla
        nbytes = count_bytes(op, m, k)
        in_bytes = 2 * m * k
        # fp8mla's output bytes per set, for the rotation size.
        out_bytes = nbytes - in_bytes
        sets = max(1, (2 * self.l2) // max(in_bytes + out_bytes, 1) + 1)
        xs = list(self.random_bf16((sets, m, k)).unbind(0))
        counter = itertools.count()

        def nxt():
            return next(counter) % sets

        base = {"op": op, "family": family, "label": label, "shape": f"{m}x{k}", "rows": m,
                "cols": k, "bytes": nbytes, "sets": sets}

        # fp8mla: probe once (fp8mla allocates), then preallocate one output set per input set
        # with the probe's dtypes, shapes and strides.
        fp8mla_fn, fp8mla_status, fp8mla_out = None, "ok", None
        if fp8mla is None:
            fp8mla_status = f"unavailable: {self.fp8mla_error}"
        else:
            try:
                fp8mla_fn, fp8mla_out = self.fp8mla_callable(op, xs, sets)
            except Exception as e:  # recorded, the anchors still run
                fp8mla_status = f"error: {type(e).__name__}: {e}"
                traceback.print_exc()
        fp8mla_us = None
        if fp8mla_fn is not None:
            try:
                fp8mla_us = self.time_us(lambda: fp8mla_fn(nxt()))
            except Exception as e:
                fp8mla_status = f"error: {type(e).__name__}: {e}"
                traceback.print_exc()

        rows = []
        for name, fn, status, ref in self.anchor_callables(op, xs, m, k):
            anchor_us = None
            agreement = None
            if fn is not None:
                try:
                    anchor_us = self.time_us(lambda: fn(nxt()))
                    if fp8mla_us is not None and ref is not None:
                        agreement = self.agreement(op, fp8mla_out, ref(0))
                except Exception as e:
                    status = f"error: {type(e).__name__}: {e}"
                    traceback.print_exc()
            row = dict(base)
            row.update({
                "fp8mla_status": fp8mla_status,
                "fp8mla_us": fp8mla_us,
                "fp8mla_tbps": nbytes / fp8mla_us / 1e6 if fp8mla_us else None,
                "anchor": name,
                "anchor_status": status,
                "anchor_us": anchor_us,
                "anchor_tbps": nbytes / anchor_us / 1e6 if anchor_us else None,
                "ratio": anchor_us / fp8mla_us if (anchor_us and fp8mla_us) else None,
                "output_agreement": agreement,
            })
            rows.append(row)
        del xs
        torch.cuda.empty_cache()
        return rows

    def fp8mla_callable(self, op, xs, sets):
        """(fn(set), outputs of set 0), outputs preallocated per set like those of a first call
        that lets fp8mla allocate (so their dtypes and layouts are the package's own)."""
        fp8mla = self.fp8mla

        def like(probe):
            if isinstance(probe, tuple):
                return list(zip(*(self.sets_like(t, sets) for t in probe)))
            return self.sets_like(probe, sets)

        if op == "per_tensor_static":
            outs = like(fp8mla.quantize_fp8(xs[0], SCALE_INV))
            return (lambda i: fp8mla.quantize_fp8(xs[i], SCALE_INV, out=outs[i])), outs[0]
        if op == "per_tensor_dynamic":
            outs = like(fp8mla.quantize_fp8_dynamic(xs[0]))
            return (lambda i: fp8mla.quantize_fp8_dynamic(xs[i], out=outs[i][0],
                                                          scale=outs[i][1])), outs[0]
        if op in ("group128_f32", "group128_packed_ue8m0"):
            layout = "row_major" if op == "group128_f32" else "packed_ue8m0"
            outs = like(fp8mla.quantize_fp8_per_token_group(xs[0], group_size=128,
                                                            scale_layout=layout))
            return (lambda i: fp8mla.quantize_fp8_per_token_group(
                xs[i], group_size=128, scale_layout=layout, out=outs[i][0],
                scales=outs[i][1])), outs[0]
        if op == "nvfp4_swizzled":
            g = self.global_scale
            outs = like(fp8mla.quantize_nvfp4(xs[0], g, layout="swizzled"))
            return (lambda i: fp8mla.quantize_nvfp4(xs[i], g, layout="swizzled", out=outs[i][0],
                                                    block_scales=outs[i][1])), outs[0]
        raise ValueError(op)

    def sets_like(self, t, sets):
        """`sets` tensors with t's dtype, shape and strides, carved out of one allocation, each
        starting 256-byte aligned (many small allocations would be slow to make)."""
        torch = self.torch
        item = t.element_size()
        span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
        step = round_up(span * item, 256) // item
        slab = torch.empty(step * sets, dtype=t.dtype, device=t.device)
        return [slab.as_strided(t.shape, t.stride(), i * step) for i in range(sets)]

    def anchor_callables(self, op, xs, m, k):
        """[(name, fn(set) or None, status, ref(set) -> outputs or None)]."""
        torch, anchors = self.torch, self.anchors
        if op == "per_tensor_static":
            result = []
            if k & (k - 1) == 0:
                outs = self.sets_like(
                    torch.empty((m, k), dtype=torch.float8_e4m3fn, device=self.dev), len(xs))

                def seed(i):
                    return anchors.seed_fp8_quantize(xs[i], SCALE_INV, outs[i])

                result.append(("seed_triton", seed, "ok", seed))
            else:
                result.append(("seed_triton", None,
                               f"unsupported: the seed's kernel needs a power-of-two N, got {k}",
                               None))
            eager = lambda i: self.static_eager(xs[i], SCALE_INV)
            result.append(("torch_eager", eager, "ok", eager))
            return result
        if op == "per_tensor_dynamic":
            eager = lambda i: self.dynamic_eager(xs[i])
            return [("torch_eager", eager, "ok", eager)]
        if op in ("group128_f32", "group128_packed_ue8m0"):
            compiled = lambda i: anchors.group_quant_compiled(xs[i])
            return [("torch_compile", compiled, "ok", compiled)]
        if op == "nvfp4_swizzled":
            eager = lambda i: self.nvfp4_eager(xs[i], self.global_scale)
            return [("torch_eager", eager, "ok", eager)]
        raise ValueError(op)

    def agreement(self, op, ours, theirs):
        """Fraction of equal bytes of the quantized output (set 0), fp8mla vs the anchor (and of
        the block scales for NVFP4). Informational: the anchors' semantics differ at the edges
        (torch's fp8 cast does not saturate)."""
        torch = self.torch

        def as_bytes(t):
            return t.contiguous().view(torch.uint8).reshape(-1)

        q_ours = ours if isinstance(ours, torch.Tensor) else ours[0]
        q_theirs = theirs if isinstance(theirs, torch.Tensor) else theirs[0]
        a, b = as_bytes(q_ours), as_bytes(q_theirs)
        if op == "nvfp4_swizzled":
            a = torch.cat([a, as_bytes(ours[1])])
            b = torch.cat([b, as_bytes(theirs[1])])
        if a.numel() != b.numel():
            return None
        return float((a == b).float().mean())


def plot(results, ceiling, path, device):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = [op for op in OPS if any(r["op"] == op for r in results)]
    cols = 2
    nrows = max(1, math.ceil(len(ops) / cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(7 * cols, 4.5 * nrows), squeeze=False)
    markers = {"kv_c": "o", "kv_c+k_pe": "s", "per_head": "^", "1M rows": "*", "hidden": "o",
               "attn_out": "s"}
    colors = {"fp8mla": "tab:red", "seed_triton": "tab:blue", "torch_eager": "tab:gray",
              "torch_compile": "tab:green"}
    for ax, op in zip(axes.flat, ops):
        rows = [r for r in results if r["op"] == op]
        series = {}
        for r in rows:
            fam = r["family"]
            if r["fp8mla_tbps"]:
                series.setdefault(("fp8mla", fam), {})[r["bytes"]] = r["fp8mla_tbps"]
            if r["anchor_tbps"]:
                series.setdefault((r["anchor"], fam), {})[r["bytes"]] = r["anchor_tbps"]
        for (impl, fam), pts in sorted(series.items()):
            xs = sorted(pts)
            ax.plot(xs, [pts[x] for x in xs], marker=markers.get(fam, "x"),
                    color=colors.get(impl, None), label=f"{impl} ({fam})", linewidth=1,
                    markersize=4)
        if ceiling:
            ax.axhline(ceiling, color="black", linestyle="--", linewidth=1,
                       label=f"device copy {ceiling:.2f} TB/s")
        ax.set_xscale("log")
        ax.set_xlabel("bytes moved (input + output + scales)")
        ax.set_ylabel("TB/s")
        ax.set_title(op)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(ops):]:
        ax.axis("off")
    fig.suptitle(f"fp8mla quantization vs anchors, {device}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--anchors", help="anchors.py or its folder (default: ../shared/anchors)")
    p.add_argument("--json", default="quant_py.json", help="output JSON (default quant_py.json)")
    p.add_argument("--plot", default=None, help="output PNG (default: the JSON path with .png)")
    p.add_argument("--op", default="all",
                   help="comma-separated ops: all, " + ", ".join(OPS))
    p.add_argument("--tokens", default=None,
                   help="comma-separated T values (default 1..131072 in powers of 4, and 131072)")
    p.add_argument("--no-million", action="store_true",
                   help="leave out the 1M x 512 and 1M x 384 per-tensor shapes")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=30)
    args = p.parse_args()

    ops = OPS if args.op == "all" else args.op.split(",")
    for op in ops:
        if op not in OPS:
            sys.exit(f"quant.py: unknown op {op!r}; expected one of {OPS}")
    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else TOKENS

    import torch
    import triton
    if not torch.cuda.is_available():
        sys.exit("quant.py: needs a CUDA GPU")
    anchors, anchors_path = load_anchors(args.anchors, "quant.py")
    try:
        import fp8mla
        fp8mla_error = None
    except Exception as e:  # the anchors are still timed; fp8mla rows say why they are empty
        fp8mla, fp8mla_error = None, f"{type(e).__name__}: {e}"
        print(f"quant.py: fp8mla not importable ({fp8mla_error})", file=sys.stderr)

    runner = Runner(torch, anchors, fp8mla, fp8mla_error, args)
    device = torch.cuda.get_device_name(0)
    ceiling = runner.copy_ceiling()
    print(f"{device}: torch {torch.__version__}, triton {triton.__version__}, anchors {anchors_path}")
    print(f"device copy ceiling {ceiling:.3f} TB/s (1 GiB, read + write)")
    header = (f"{'op':<22} {'shape':<15} {'MB':>10} {'fp8mla us':>10} {'TB/s':>6} "
              f"{'anchor':<14} {'anchor us':>10} {'TB/s':>6} {'ratio':>6}  agree")
    print(header)
    results = []
    for op in ops:
        shapes = shapes_for(op, tokens)
        if args.no_million:
            shapes = [s for s in shapes if s[0] != "1M rows"]
        for family, label, m, k in shapes:
            rows = runner.run_shape(op, family, label, m, k)
            results += rows
            for r in rows:
                def f(v, fmt):
                    return format(v, fmt) if v is not None else "-"
                note = "" if r["anchor_status"] == "ok" else r["anchor_status"]
                if r["fp8mla_status"] != "ok":
                    note += " fp8mla " + r["fp8mla_status"]
                print(f"{op:<22} {r['shape']:<15} {r['bytes'] / 1e6:10.3f} "
                      f"{f(r['fp8mla_us'], '10.2f')} {f(r['fp8mla_tbps'], '6.3f')} "
                      f"{r['anchor']:<14} {f(r['anchor_us'], '10.2f')} "
                      f"{f(r['anchor_tbps'], '6.3f')} {f(r['ratio'], '6.2f')}  "
                      f"{f(r['output_agreement'], '.4f')} {note}", flush=True)

    doc = {
        "benchmark": "bench/quant.py",
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
        "copy_ceiling_tbps": ceiling,
        "ratio": "anchor us / fp8mla us (> 1: fp8mla faster)",
        "results": results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"wrote {args.json}")
    png = args.plot or os.path.splitext(args.json)[0] + ".png"
    plot(results, ceiling, png, device)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
