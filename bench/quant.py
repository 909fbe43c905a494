#!/usr/bin/env python3
"""Quantization benchmark of fp8mla's Python ops against the anchors, in one process.

Every implementation runs on the SAME input tensors and is timed by the SAME timer
(bench/common.py: CUDA events around each call, warm-up, median, host-paced). Inputs are random
non-zero bf16, rotated through enough sets that they exceed 2x the L2 (one set when a set alone is
that large); one counter runs across all implementations of a shape, so no implementation reads an
input another one has just pulled into the L2. fp8mla writes into preallocated outputs (allocation
is not timed); the anchors allocate as they normally do.

    python3 bench/quant.py --anchors ../shared/anchors --json out/quant_py.json --plot out/quant_py.png

Bytes per shape are counted as in `fp8mla bench quant`: input read + output written + scales,
each once (bench/README.md). The anchor's TB/s uses the same byte count as fp8mla's, so the
TB/s columns and the ratio (anchor time / fp8mla time) tell the same story.
"""
from __future__ import annotations

import os

import report
from common import MemoryBench, memory_arguments, print_header, print_rows, round_up, selected, \
    start, write_document

TOKENS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 131072]
MILLION_ROWS = 1 << 20
HEADS = 128
SCALE_INV = 16.0          # inputs have |x| < 16: |x * 16| < 256, no saturation
NVFP4_GLOBAL_SCALE = 168.0  # 448 * 6 / 16
FP8_MAX = 448.0
MIN_DYNAMIC_SCALE = 1.0 / (448.0 * 512.0)

OPS = ["per_tensor_static", "per_tensor_dynamic", "group128_f32", "group128_packed_ue8m0",
       "nvfp4_swizzled"]


# ---- Shapes and byte counts (the same as tools/cli/bench/quant.cpp) ----------------------------

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

class Runner(MemoryBench):
    def __init__(self, torch, anchors, fp8mla, fp8mla_error, args):
        super().__init__(torch, anchors, fp8mla, fp8mla_error, args)
        self.static_eager, self.dynamic_eager, self.nvfp4_eager = make_torch_anchors(torch)
        self.global_scale = torch.full((1,), NVFP4_GLOBAL_SCALE, dtype=torch.float32,
                                       device=self.dev)

    def run_shape(self, op, family, label, m, k):
        """One op on one shape: a list of result rows (one per anchor)."""
        nbytes = count_bytes(op, m, k)
        sets = self.sets_for(nbytes)
        xs = list(self.random_bf16((sets, m, k)).unbind(0))
        base = {"op": op, "family": family, "label": label, "shape": f"{m}x{k}", "rows": m,
                "cols": k, "bytes": nbytes, "sets": sets}
        rows = self.compare(base, sets, lambda: self.fp8mla_callable(op, xs, sets),
                            self.anchor_callables(op, xs, m, k),
                            lambda ours, theirs: self.agreement(op, ours, theirs))
        del xs
        self.torch.cuda.empty_cache()
        return rows

    def fp8mla_callable(self, op, xs, sets):
        """(fn(set), outputs() -> set 0's outputs), outputs preallocated per set like those of a
        first call that lets fp8mla allocate (so their dtypes and layouts are the package's
        own)."""
        fp8mla = self.fp8mla

        def like(probe):
            if isinstance(probe, tuple):
                return list(zip(*(self.sets_like(t, sets) for t in probe)))
            return self.sets_like(probe, sets)

        if op == "per_tensor_static":
            outs = like(fp8mla.quantize_fp8(xs[0], SCALE_INV))
            return (lambda i: fp8mla.quantize_fp8(xs[i], SCALE_INV, out=outs[i])), lambda: outs[0]
        if op == "per_tensor_dynamic":
            outs = like(fp8mla.quantize_fp8_dynamic(xs[0]))
            return (lambda i: fp8mla.quantize_fp8_dynamic(xs[i], out=outs[i][0],
                                                          scale=outs[i][1])), lambda: outs[0]
        if op in ("group128_f32", "group128_packed_ue8m0"):
            layout = "row_major" if op == "group128_f32" else "packed_ue8m0"
            outs = like(fp8mla.quantize_fp8_per_token_group(xs[0], group_size=128,
                                                            scale_layout=layout))
            return (lambda i: fp8mla.quantize_fp8_per_token_group(
                xs[i], group_size=128, scale_layout=layout, out=outs[i][0],
                scales=outs[i][1])), lambda: outs[0]
        if op == "nvfp4_swizzled":
            g = self.global_scale
            outs = like(fp8mla.quantize_nvfp4(xs[0], g, layout="swizzled"))
            return (lambda i: fp8mla.quantize_nvfp4(xs[i], g, layout="swizzled", out=outs[i][0],
                                                    block_scales=outs[i][1])), \
                lambda: outs[0]
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
        """[({"anchor": name}, fn(set) or None, status, ref() -> set 0's outputs or None)]."""
        torch, anchors = self.torch, self.anchors

        def timed(name, fn):
            return {"anchor": name}, fn, "ok", lambda: fn(0)

        if op == "per_tensor_static":
            result = []
            if k & (k - 1) == 0:
                outs = self.sets_like(
                    torch.empty((m, k), dtype=torch.float8_e4m3fn, device=self.dev), len(xs))
                result.append(timed("seed_triton",
                                    lambda i: anchors.seed_fp8_quantize(xs[i], SCALE_INV, outs[i])))
            else:
                result.append(({"anchor": "seed_triton"}, None,
                               f"unsupported: the seed's kernel needs a power-of-two N, got {k}",
                               None))
            result.append(timed("torch_eager", lambda i: self.static_eager(xs[i], SCALE_INV)))
            return result
        if op == "per_tensor_dynamic":
            return [timed("torch_eager", lambda i: self.dynamic_eager(xs[i]))]
        if op in ("group128_f32", "group128_packed_ue8m0"):
            return [timed("torch_compile", lambda i: anchors.group_quant_compiled(xs[i]))]
        if op == "nvfp4_swizzled":
            return [timed("torch_eager", lambda i: self.nvfp4_eager(xs[i], self.global_scale))]
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


def main():
    p = memory_arguments(__doc__, "quant", OPS, "1..131072 in powers of 4, and 131072")
    p.add_argument("--no-million", action="store_true",
                   help="leave out the 1M x 512 and 1M x 384 per-tensor shapes")
    args = p.parse_args()
    ops, tokens = selected(args, "quant.py", OPS, TOKENS)

    runner, ceiling = start("quant.py", args, Runner)
    print(f"device copy ceiling {ceiling:.3f} TB/s (1 GiB, read + write)")
    print_header(22, 15)
    results = []
    for op in ops:
        shapes = shapes_for(op, tokens)
        if args.no_million:
            shapes = [s for s in shapes if s[0] != "1M rows"]
        for family, label, m, k in shapes:
            rows = runner.run_shape(op, family, label, m, k)
            results += rows
            print_rows(rows, 22, 15)
    doc = write_document(args.json, "bench/quant.py", runner, ceiling, results)
    png = args.plot or os.path.splitext(args.json)[0] + ".png"
    report.plot_bandwidth("quant", doc, png)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
