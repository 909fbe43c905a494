#!/usr/bin/env python3
"""Prefill attention benchmark: fp8mla's Hopper kernel (e4m3 and bf16) against cuDNN BF16 SDPA
(anchors.cudnn_sdpa_bf16), in one process on the same inputs and the same timer.

Shapes (DeepSeek MLA prefill): H = 128, Dqk = 192, Dv = 128, causal and not; single sequences of
1k, 4k, 8k, 16k tokens and a ragged batch of 16 x 1k (cuDNN gets it as batch 16, the same work).
Inputs are randn bf16; fp8mla's e4m3 inputs are those divided by a per-tensor scale and cast
(V transposed, as the FP8 kernel reads it), with the scale as descale. No LSE is asked for.

Each implementation is captured in a CUDA graph and timed by bench/common.py: replays queued
back to back behind a gate, CUDA events around each, median, the SM clock read meanwhile. The card
lowers its clock once it reaches its power limit, so every implementation is timed in two states
of the card (MODES): `burst`, rested and then briefly warmed (the state of a short benchmark, and
of the cuDNN reference figure in docs/design.md section 9), and `sustained`, after a second of
back-to-back load (the state of a busy server). FLOPs = 2 * H * sum over rows of visible keys *
(Dqk + Dv); causal counts only the visible half. Ratio = cuDNN time / fp8mla time in the same
mode (> 1: fp8mla faster).

    python3 bench/attention.py --anchors ../shared/anchors --json out/attention.json \\
        --markdown bench/RESULTS_attention.md --plot out/attention.png
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time

import report
from common import ClockSampler, graphed, load_anchors, run_for, time_ms, utc_now
from report import ATTENTION_HEADS as HEADS, ATTENTION_SHAPES as SHAPES, ATTENTION_DQK as DQK, \
    ATTENTION_DV as DV

BURST_REST_S = 0.5  # idle before each burst timing, so every implementation starts rested
BURST_WARM_UP_S = 0.05  # lifts the clock out of idle without reaching the power limit
SUSTAINED_LOAD_S = 1.0
MODES = {"burst": f"{BURST_REST_S} s idle, {BURST_WARM_UP_S} s of replays, then timed",
         "sustained": f"{SUSTAINED_LOAD_S} s of replays, then timed"}


def flops(lens, causal):
    visible = sum(n * (n + 1) // 2 if causal else n * n for n in lens)
    return 2.0 * HEADS * visible * (DQK + DV)


def measure(torch, replay, mode, iters, sampler):
    """(ms, clock summary) of one replay in `mode` (see MODES)."""
    if mode == "burst":
        time.sleep(BURST_REST_S)
        run_for(torch, replay, BURST_WARM_UP_S)
    else:
        run_for(torch, replay, SUSTAINED_LOAD_S)
    with sampler.sampling():
        ms = time_ms(torch, replay, iters)
    return ms, sampler.summary()


def run_shape(torch, fp8mla, anchors, name, lens, causal, iters, modes, sampler):
    dev = torch.device("cuda")
    T = sum(lens)
    gen = torch.Generator(device=dev).manual_seed(len(lens) * 100003 + T)
    q = torch.randn(T, HEADS, DQK, device=dev, dtype=torch.bfloat16, generator=gen)
    k = torch.randn(T, HEADS, DQK, device=dev, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(T, HEADS, DV, device=dev, dtype=torch.bfloat16, generator=gen)
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device=dev)
    max_len = max(lens)
    scale = 1.0 / math.sqrt(DQK)

    def fp8(x, amax):
        s = amax / 448.0
        return (x.float() / s).to(torch.float8_e4m3fn), torch.tensor([s], device=dev)

    q8, qs = fp8(q, q.abs().max().item())
    k8, ks = fp8(k, k.abs().max().item())
    v8, vs = fp8(v, v.abs().max().item())
    v8t = v8.permute(1, 2, 0).contiguous().permute(2, 0, 1)  # [T, H, 128] view, keys contiguous
    out8 = torch.empty(T, HEADS, DV, device=dev, dtype=torch.bfloat16)
    out16 = torch.empty_like(out8)

    B, S = len(lens), max_len
    equal = all(n == S for n in lens)
    qc = q.view(B, S, HEADS, DQK).transpose(1, 2).contiguous() if equal else None
    kc = k.view(B, S, HEADS, DQK).transpose(1, 2).contiguous() if equal else None
    vc = v.view(B, S, HEADS, DV).transpose(1, 2).contiguous() if equal else None

    impls = {
        "fp8mla_e4m3": lambda: fp8mla.prefill_attention(
            q8, k8, v8t, cu, cu, max_len, max_len, softmax_scale=scale, causal=causal,
            q_descale=qs, k_descale=ks, v_descale=vs, out=out8),
        "fp8mla_bf16": lambda: fp8mla.prefill_attention(
            q, k, v, cu, cu, max_len, max_len, softmax_scale=scale, causal=causal, out=out16),
        "cudnn_bf16": lambda: anchors.cudnn_sdpa_bf16(qc, kc, vc, causal=causal),
    }
    f = flops(lens, causal)
    replays, errors = {}, {}
    for impl, fn in impls.items():
        try:
            replays[impl] = graphed(torch, fn)
        except Exception as e:  # noqa: BLE001 - a failing implementation is a row, not a crash
            errors[impl] = f"error: {type(e).__name__}: {e}"[:300]
    rows = []
    for mode in modes:
        for impl in impls:
            row = {"shape": name, "lens": lens, "causal": causal, "impl": impl, "mode": mode,
                   "tflop": f / 1e12}
            if impl in errors:
                row.update(status=errors[impl])
            else:
                ms, clock = measure(torch, replays[impl], mode, iters, sampler)
                row.update(status="ok", us=ms * 1e3, tflops=f / (ms * 1e-3) / 1e12, clock=clock)
            rows.append(row)
        base = next((r for r in rows if r["impl"] == "cudnn_bf16" and r["mode"] == mode
                     and r["status"] == "ok"), None)
        for r in rows:
            if base and r["mode"] == mode and r["status"] == "ok":
                r["ratio_vs_cudnn"] = base["us"] / r["us"]
    if "cudnn_bf16" in replays:
        cudnn_out = impls["cudnn_bf16"]().transpose(1, 2).reshape(T, HEADS, DV)
        torch.cuda.synchronize()
        for r in rows:
            out = {"fp8mla_e4m3": out8, "fp8mla_bf16": out16}.get(r["impl"])
            if out is not None and r["status"] == "ok":
                r["max_abs_diff_vs_cudnn"] = (out.float() - cudnn_out.float()).abs().max().item()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--anchors")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    ap.add_argument("--plot")
    ap.add_argument("--shapes", help="comma-separated subset of " + ",".join(s for s, _ in SHAPES))
    ap.add_argument("--modes", default=",".join(MODES),
                    help="comma-separated subset of " + ",".join(MODES))
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        ap.error(f"--modes: expected a subset of {','.join(MODES)}, got {args.modes!r}")
    import torch
    import fp8mla
    anchors, _ = load_anchors(args.anchors, "attention.py")
    sampler = ClockSampler(torch)
    if not sampler.available:
        print("no NVML: clocks are not recorded")
    chosen = [s for s in SHAPES if not args.shapes or s[0] in args.shapes.split(",")]
    rows = []
    for name, lens in chosen:
        for causal in (True, False):
            new = run_shape(torch, fp8mla, anchors, name, lens, causal, args.iters, modes, sampler)
            rows += new
            for r in new:
                tf = (f"{r['tflops']:7.0f} TFLOP/s {r['us']:9.1f} us {report.clock_cell(r):>12} MHz"
                      if r["status"] == "ok" else r["status"])
                print(f"{name:>6} {'causal' if causal else 'full':>6} {r['mode']:<9} "
                      f"{r['impl']:<12} {tf} {r.get('ratio_vs_cudnn', float('nan')):5.2f}x "
                      f"diff {r.get('max_abs_diff_vs_cudnn', float('nan')):.3g}", flush=True)
    meta = {"date": utc_now(),
            "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "fp8mla": fp8mla.__version__, "iters": args.iters,
            "modes": {m: MODES[m] for m in modes}}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    if args.markdown:
        report.prepend_attention_section(args.markdown, report.attention_section(meta, rows))
    if args.plot:
        try:
            report.plot_attention(args.plot, rows, modes)
        except ImportError as e:
            print(f"no plot: {e}")
    print("\n".join(report.attention_judgement(rows, modes)))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
