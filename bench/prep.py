#!/usr/bin/env python3
"""MLA prep benchmark of fp8mla's Python ops against the anchors, in one process.

Every implementation runs on the SAME input tensors and is timed by the SAME timer
(bench/common.py: CUDA events around each call, warm-up, median, host-paced). Layouts are an engine's
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
                          anchor of docs/design.md section 9) and anchors._rope_quant run eagerly
  rope_quant_interleaved  fp8mla style="interleaved" (DeepSeek's) vs the same math, interleaved
                          pairs, written here: torch.compile'd and eager
  kv_pack                 fp8mla.mla_kv_pack_quantize_fp8 vs cat(k_nope, broadcast k_pe), scale,
                          clamp, cast to float8_e4m3fn: torch.compile'd and eager
  kv_pack_transposed      the same with v_layout="transposed" (V written as FP8 attention reads
                          it on Hopper, keys contiguous; the layer's and the backends' layout)
                          vs the same anchors (token-major V, compared element by element)
  kv_cache_write          fp8mla.mla_kv_cache_write vs eager index_copy_ into the cache
  kv_gather               fp8mla.mla_kv_gather vs eager index_select of the cache rows
Bytes per shape are counted as in `fp8mla bench prep` (bench/README.md): every input read once
and every output written once; the anchors' TB/s uses the same count.
"""
from __future__ import annotations

import os
import sys
import traceback

import report
from common import MemoryBench, byte_agreement, memory_arguments, print_header, print_rows, \
    selected, start, write_document

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

OPS = ["rope_quant_neox", "rope_quant_interleaved", "kv_pack", "kv_pack_transposed",
       "kv_cache_write", "kv_gather"]


# ---- Byte counts (the same as tools/cli/bench/prep.cpp) ----------------------------------------

def pages_of(t, page_size=PAGE_SIZE):
    return max(1, -(-t // page_size))


def count_bytes(op, t, h=HEADS):
    """(bytes read, bytes written), each input and output once."""
    if op.startswith("rope_quant"):
        # q_nope + q_pe + k_nope, k_pe once per token, positions, one cos_sin row per token.
        return (t * h * (NOPE + ROPE + NOPE) * 2 + t * ROPE * 2 + t * INDEX_BYTES +
                t * COS_SIN_ROW, 2 * t * h * QK)
    if op.startswith("kv_pack"):
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

class Runner(MemoryBench):
    def __init__(self, torch, anchors, fp8mla, fp8mla_error, args):
        super().__init__(torch, anchors, fp8mla, fp8mla_error, args)
        self.heads = args.heads
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
            elif op.startswith("kv_pack"):
                kv = self.random_bf16((t, h, KV_WIDTH))
                v_out = torch.empty((t, h, VD), dtype=fp8, device=self.dev)
                if op == "kv_pack_transposed":  # [t, h, VD] view of [h, VD, pitch] memory
                    pitch = (t + 15) // 16 * 16
                    v_out = torch.empty((h, VD, pitch), dtype=fp8,
                                        device=self.dev)[:, :, :t].permute(2, 0, 1)
                d.update(k_nope=kv[..., :NOPE], v=kv[..., NOPE:], k_pe=self.random_bf16((t, ROPE)),
                         k_out=torch.empty((t, h, QK), dtype=fp8, device=self.dev), v_out=v_out)
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

    def run_shape(self, op, t):
        """One op at one T: a list of result rows (one per anchor)."""
        nin, nout = count_bytes(op, t, self.heads)
        nbytes = nin + nout
        sets = self.sets_for(nbytes)
        xs = self.make_sets(op, t, sets)
        base = {"op": op, "family": op, "label": f"T={t}", "shape": f"T={t} H={self.heads}",
                "tokens": t, "heads": self.heads, "bytes": nbytes, "bytes_in": nin,
                "bytes_out": nout, "sets": sets}
        rows = self.compare(base, sets, lambda: self.fp8mla_callable(op, xs),
                            self.anchor_callables(op, xs),
                            lambda ours, theirs: byte_agreement(self.torch, ours, theirs))
        del xs
        self.torch.cuda.empty_cache()
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
        if op.startswith("kv_pack"):
            layout = "transposed" if op == "kv_pack_transposed" else "token_major"

            def fn(i):
                x = xs[i]
                return f.mla_kv_pack_quantize_fp8(x["k_nope"], x["k_pe"], x["v"],
                                                  k_scale_inv=SCALE_INV, v_scale_inv=SCALE_INV,
                                                  k_out=x["k_out"], v_out=x["v_out"],
                                                  v_layout=layout)
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
        """[({"anchor": name, "anchor_source": source}, fn(set), "ok", ref() -> set 0's
        outputs)]."""
        anchors, v = self.anchors, self.versions
        cs = self.cos_sin

        def timed(name, source, fn, ref=None):
            return {"anchor": name, "anchor_source": source}, fn, "ok", ref or (lambda: fn(0))

        def rope(name, source, f):
            return timed(name, source, lambda i: f(xs[i]["q_nope"], xs[i]["q_pe"], xs[i]["k_nope"],
                                                   xs[i]["k_pe"], xs[i]["pos"], cs))

        def pack(name, source, f):
            return timed(name, source, lambda i: f(xs[i]["k_nope"], xs[i]["k_pe"], xs[i]["v"],
                                                   SCALE_INV, SCALE_INV))

        if op == "rope_quant_neox":
            result = [rope("torch_compile", "anchors.rope_quant_compiled",
                           anchors.rope_quant_compiled)]
            eager = getattr(anchors, "_rope_quant", None)
            if eager is not None:
                result.append(rope("torch_eager", "anchors._rope_quant (eager)", eager))
            return result
        if op == "rope_quant_interleaved":
            return [rope("torch_compile", "bench/prep.py, torch.compile",
                         v["rope_quant_interleaved_compiled"]),
                    rope("torch_eager", "bench/prep.py, eager", v["rope_quant_interleaved_eager"])]
        if op.startswith("kv_pack"):
            return [pack("torch_compile", "bench/prep.py, torch.compile", v["kv_pack_compiled"]),
                    pack("torch_eager", "bench/prep.py, eager", v["kv_pack_eager"])]
        if op == "kv_cache_write":
            f = v["cache_write_eager"]

            def write(i):
                f(xs[i]["kv_c"], xs[i]["k_pe"], xs[i]["cache"], xs[i]["slots"], SCALE_INV)

            def ref():
                write(0)
                return (self.cache_rows(xs[0]),)
            return [timed("torch_eager", "bench/prep.py, eager index_copy_", write, ref)]
        if op == "kv_gather":
            f = v["gather_eager"]
            return [timed("torch_eager", "bench/prep.py, eager index_select",
                          lambda i: f(xs[i]["cache"], xs[i]["slots"], GATHER_SCALE))]
        raise ValueError(op)


def main():
    p = memory_arguments(__doc__, "prep", OPS, ",".join(map(str, TOKENS)))
    p.add_argument("--heads", type=int, default=HEADS)
    args = p.parse_args()
    ops, tokens = selected(args, "prep.py", OPS, TOKENS)
    if any(t < 1 or t > MAX_POS for t in tokens):
        sys.exit(f"prep.py: --tokens must lie in 1..{MAX_POS}")

    runner, ceiling = start("prep.py", args, Runner)
    print(f"device copy ceiling {ceiling:.3f} TB/s (1 GiB, read + write); H={args.heads}, "
          f"page size {PAGE_SIZE}; cos_sin from {runner.cos_sin_source}")
    print_header(23, 16)
    results = []
    for op in ops:
        for t in tokens:
            rows = runner.run_shape(op, t)
            results += rows
            print_rows(rows, 23, 16)
    doc = write_document(args.json, "bench/prep.py", runner, ceiling, results, heads=args.heads,
                         page_size=PAGE_SIZE, max_positions=MAX_POS, cos_sin=runner.cos_sin_source)
    png = args.plot or os.path.splitext(args.json)[0] + ".png"
    try:
        report.plot_bandwidth("prep", doc, png)
        print(f"wrote {png}")
    except Exception:  # the JSON is what the report reads
        traceback.print_exc()


if __name__ == "__main__":
    main()
