#!/usr/bin/env python3
"""Prefill attention benchmark: fp8mla's Hopper kernel against FlashAttention-3 (the `fa3-fwd`
wheel) and cuDNN BF16 SDPA (anchors.cudnn_sdpa_bf16), in one process, on the same inputs, timed
interleaved.

Implementations (bench/report_attention.py ATTENTION_RATIOS pairs them):
- fp8mla_e4m3: fp8mla.prefill_attention on e4m3 q, k and e4m3 V transposed (a [Tk, H, 128]
  view of [H, 128, pitch] memory, keys contiguous: what the FP8 kernel reads), no LSE;
- fp8mla_e4m3_lse: the same with an `lse` output;
- fp8mla_e4m3_vtok: the same with e4m3 V token-major, [Tk, H, 128] contiguous (an error row
  where the build does not take that layout);
- fp8mla_e4m3_krope: fp8mla_e4m3 with K split as MLA has it: k [Tk, H, 128] (a view of the
  same k) and its RoPE part once per key, k_rope [Tk, 64] (an error row where the build does not
  take k_rope); fp8mla_e4m3_lse_krope: the same with an `lse` output;
- fa3_e4m3: FA3's varlen forward (fa3_fwd_interface._flash_attn_forward) on the same e4m3 q, k
  and the token-major V, with the same per-tensor descales expanded to (batch, heads), so both
  compute the same function;
- fp8mla_bf16, fa3_bf16: both on the bf16 inputs;
- cudnn_bf16: cuDNN SDPA on [B, H, S, D] copies, only where all sequences have one length and no
  prefix.
FA3 always writes its LSE (so fp8mla_e4m3_lse is the like-for-like row) and allocates its output:
its `out_` argument fails torch's custom-op aliasing check (Dao-AILab/flash-attention#2073); in a
CUDA graph that allocation is made at capture, so no replay pays for it. A failing
implementation (FA3 not importable, a layout not built) is an error row; the rest runs.

Shapes (bench/report_attention.py ATTENTION_SHAPES; Dqk 192, Dv 128): H = 128 causal 1k, 2k, 4k, 8k,
16k, 32k; 8k full; 16 x 1k causal and full; 8k new tokens on an 8k prefix; 4 x 4k, each on a 4k
prefix; the ragged batch of 3000/17/700/5000/1/2200 new tokens on prefixes of
4096/0/1000/2048/8191/512 (a one-token sequence on a long prefix, a sequence with none); H = 16
causal 8k, 32k, 64k. Sequence b has q_len = new[b] queries and k_len = prefix[b] + new[b] keys;
causal masking is bottom-right aligned in both kernels, so query i sees min(k_len, i + 1 + k_len -
q_len) keys, and FLOPs = 2 * H * visible (query, key) pairs * (Dqk + Dv). Inputs are randn bf16,
K's last 64 dims the same in every head (MLA's RoPE part, which fp8mla_e4m3_krope reads once), or
with `--inputs layer` the q, k, v the DeepSeek-V3 layer makes from random hidden states
(bench/layer.py's engine row: its projections, RMSNorm and RoPE; the timing rows only);
the e4m3 inputs are each tensor divided by its amax / 448 and cast, that scale the descale given
to both kernels. Softmax scale 1 / sqrt(192) (unit-variance scores).

Method, per shape: each implementation captured in a CUDA graph and one replay timed (the
estimate); WARM_S of replays of all of them in turn, so the card is at its power cap (700 W on
an H200: the sustained state); then ROUNDS rounds, in each every implementation in turn (the
order rotated by one each round) runs SETTLE_MS of replays untimed and then about LOOP_MS timed,
all queued back to back behind a gate (bench/common.py time_for: CUDA events around each,
median). The figure is the median over the rounds. The untimed lead is there because the power
limiter carries over: timed straight after another implementation, a kernel runs at the clock
that one left (under the cap, a few hundred MHz apart), and with the order rotated each kernel
always follows the same one (bench/analysis/attention-power-order-2026-12-03.md). NVML's SM
clock, power-cap state and power draw are sampled while the timed replays run (bench/common.py
ClockSampler); energy per call = mean power * time.

Accuracy, before the timings: one small ragged causal case with prefixes (ACCURACY), every
implementation's O against a float64 attention of the inputs it reads: the dequantized e4m3
inputs for the e4m3 rows, the bf16 inputs for the bf16 ones; max |O - O_ref|.

Exit status 1 if fp8mla_e4m3, fp8mla_e4m3_lse or fp8mla_bf16 failed anywhere; the other error
rows are reported only.

    python3 bench/attention.py --anchors ../shared/anchors --json out/attention_py.json \\
        --markdown bench/RESULTS_attention.md --plot out/attention.png
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import time
import types
import zlib

import report_attention
from common import ClockSampler, graphed, load_anchors, load_fa3, round_up, run_for, time_for, \
    time_ms, utc_now
from report_attention import ATTENTION_DQK as DQK, ATTENTION_DV as DV, ATTENTION_SHAPES as SHAPES

ROUNDS, LOOP_MS, WARM_S, SETTLE_MS, MIN_CALLS = 5, 30.0, 1.0, 300.0, 3
IMPLS = ["fp8mla_e4m3", "fp8mla_e4m3_lse", "fp8mla_e4m3_vtok", "fp8mla_e4m3_krope",
         "fp8mla_e4m3_lse_krope", "fa3_e4m3", "fp8mla_bf16", "fa3_bf16", "cudnn_bf16"]
REQUIRED = ("fp8mla_e4m3", "fp8mla_e4m3_lse", "fp8mla_bf16")
# The accuracy case: new tokens, prefixes, heads, causal.
ACCURACY = ([300, 77, 513], [200, 0, 1000], 16, True)


def error_text(e):
    return f"error: {type(e).__name__}: {e}"[:300]


def offsets(lens):
    return [0] + list(itertools.accumulate(lens))


def visible_pairs(q_len, k_len, causal):
    """(query, key) pairs of one sequence; causal (bottom-right): query i sees
    min(k_len, i + 1 + k_len - q_len) keys, none where that is below 1."""
    if not causal:
        return q_len * k_len
    first = max(0, q_len - k_len)  # the first query that sees a key; it sees one, the last k_len
    return (q_len - first) * (first + 1 + 2 * k_len - q_len) // 2


def tflop(x, causal):
    pairs = sum(visible_pairs(q, k, causal) for q, k in zip(x.q_lens, x.k_lens))
    return 2.0 * x.heads * pairs * (DQK + DV) / 1e12


def e4m3(torch, t):
    """t / (amax / 448) as e4m3, and amax / 448 (the descale) as a one-element f32 tensor."""
    s = t.abs().max().item() / 448.0
    return (t.float() / s).to(torch.float8_e4m3fn), torch.tensor([s], device=t.device)


def transposed(torch, v):
    """e4m3 v [Tk, H, 128] as the FP8 kernel reads it: a view of [H, 128, pitch] memory, keys
    contiguous, the pitch rounded up to 16 (TMA rows)."""
    n, heads, dim = v.shape
    store = torch.empty(heads, dim, round_up(max(n, 1), 16), dtype=v.dtype, device=v.device)
    store[:, :, :n].copy_(v.permute(1, 2, 0))
    return store[:, :, :n].permute(2, 0, 1)


def randn_qkv(torch, tq, tk, heads, seed):
    """bf16 q [tq, heads, 192], k [tk, heads, 192], v [tk, heads, 128] of unit normals, K's RoPE
    part (its last 64 dims) the same in every head, as MLA's."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(n, heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
               for n, dim in ((tq, DQK), (tk, DQK), (tk, DV)))
    k[:, 1:, DQK - 64:] = k[:, :1, DQK - 64:]
    return q, k, v


class LayerQkv:
    """q, k, v as the DeepSeek-V3 layer makes them (bench/layer.py's engine row: FP8 projections
    of random hidden states with random weights, RMSNorm, RoPE), the first `heads` heads: the
    layer's value distributions in place of unit normals (--inputs layer). q is the last tq of
    the tk tokens, at their positions."""

    def __init__(self, torch, fp8mla, fa3_module):
        import layer
        self.torch, self.hidden = torch, layer.HIDDEN
        self.engine = layer.EngineFp8Layer(torch, torch.device("cuda"), fp8mla, fa3_module)

    def __call__(self, torch, tq, tk, heads, seed):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        hidden = torch.randn(tk, self.hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
        positions = torch.arange(tk, device="cuda")
        q, kv_c, k_pe = self.engine.queries_and_latent(hidden, positions)
        k, v = self.engine.keys_values(kv_c, k_pe)
        return (t[-n:, :heads].contiguous() for t, n in ((q, tq), (k, tk), (v, tk)))


def make_inputs(torch, q_lens, prefix_lens, heads, seed, source=randn_qkv):
    """One shape's tensors: bf16 q, k, v from `source` (randn_qkv or a LayerQkv), their e4m3
    forms and descales, the transposed e4m3 V, the offsets and the output buffers of fp8mla."""
    dev = torch.device("cuda")
    x = types.SimpleNamespace(q_lens=q_lens, prefix_lens=prefix_lens, heads=heads,
                              k_lens=[q + p for q, p in zip(q_lens, prefix_lens)],
                              scale=1.0 / math.sqrt(DQK))
    tq, tk = sum(q_lens), sum(x.k_lens)
    for name, t in zip(("q", "k", "v"), source(torch, tq, tk, heads, seed)):
        t8, descale = e4m3(torch, t)
        setattr(x, name, t)
        setattr(x, name + "8", t8)
        setattr(x, name + "s", descale)
    x.v8t = transposed(torch, x.v8)
    x.k8_nope, x.k8_rope = x.k8[..., :DQK - 64], x.k8[:, 0, DQK - 64:].contiguous()
    x.cu_q = torch.tensor(offsets(q_lens), dtype=torch.int32, device=dev)
    x.cu_k = torch.tensor(offsets(x.k_lens), dtype=torch.int32, device=dev)
    x.max_q, x.max_k = max(q_lens), max(x.k_lens)
    x.out = torch.empty(tq, heads, DV, device=dev, dtype=torch.bfloat16)
    x.lse = torch.empty(tq, heads, device=dev, dtype=torch.float32)
    return x


def implementations(torch, fp8mla, fa3, anchors, x, causal):
    """{impl: a function computing it on x (returning O, token-major but for cuDNN) or the
    reason it cannot run}; cuDNN only where every sequence has one length and no prefix. `fa3`:
    (fa3_fwd_interface or None, its version or why it does not import)."""
    def ours(q, k, v, fp8=True, lse=None, k_rope=None):
        kw = dict(q_descale=x.qs, k_descale=x.ks, v_descale=x.vs) if fp8 else {}
        if lse is not None:
            kw["lse"] = lse
        if k_rope is not None:
            kw["k_rope"] = k_rope

        def call():
            out = fp8mla.prefill_attention(q, k, v, x.cu_q, x.cu_k, x.max_q, x.max_k,
                                           softmax_scale=x.scale, causal=causal, out=x.out, **kw)
            return out[0] if lse is not None else out
        return call

    module, note = fa3

    def theirs(q, k, v, fp8):
        if module is None:
            return f"error: FA3 {note}"
        batch = len(x.q_lens)
        kw = {f"{n}_descale": s.view(1, 1).expand(batch, x.heads).contiguous()
              for n, s in (("q", x.qs), ("k", x.ks), ("v", x.vs))} if fp8 else {}

        def call():
            out, lse = module._flash_attn_forward(
                q, k, v, cu_seqlens_q=x.cu_q, cu_seqlens_k=x.cu_k, max_seqlen_q=x.max_q,
                max_seqlen_k=x.max_k, softmax_scale=x.scale, causal=causal, **kw)[:2]
            x.fa3_lse = lse  # [H, Tq]: the accuracy case reads it
            return out
        return call

    impls = {"fp8mla_e4m3": ours(x.q8, x.k8, x.v8t),
             "fp8mla_e4m3_lse": ours(x.q8, x.k8, x.v8t, lse=x.lse),
             "fp8mla_e4m3_vtok": ours(x.q8, x.k8, x.v8),
             "fp8mla_e4m3_krope": ours(x.q8, x.k8_nope, x.v8t, k_rope=x.k8_rope),
             "fp8mla_e4m3_lse_krope": ours(x.q8, x.k8_nope, x.v8t, lse=x.lse, k_rope=x.k8_rope),
             "fa3_e4m3": theirs(x.q8, x.k8, x.v8, fp8=True),
             "fp8mla_bf16": ours(x.q, x.k, x.v, fp8=False),
             "fa3_bf16": theirs(x.q, x.k, x.v, fp8=False)}
    batch, length = len(x.q_lens), x.q_lens[0]
    if set(x.q_lens) == {length} and not any(x.prefix_lens):
        qc, kc, vc = (t.view(batch, length, x.heads, t.shape[-1]).transpose(1, 2).contiguous()
                      for t in (x.q, x.k, x.v))
        impls["cudnn_bf16"] = lambda: anchors.cudnn_sdpa_bf16(qc, kc, vc, causal=causal)
    return impls


def capture(torch, impls):
    """({impl: CUDA graph replay}, {impl: estimated ms of one replay}, {impl: error})."""
    replays, estimates, errors = {}, {}, {}
    for impl, fn in impls.items():
        if isinstance(fn, str):
            errors[impl] = fn
            continue
        try:
            replays[impl] = graphed(torch, fn)
            estimates[impl] = time_ms(torch, replays[impl], 1, warmup=1)
        except Exception as e:  # noqa: BLE001 - a failing implementation is a row, not a crash
            replays.pop(impl, None)
            errors[impl] = error_text(e)
    return replays, estimates, errors


def time_rounds(torch, replays, estimates, sampler, args):
    """{impl: (median us of each round, calls of each round, NVML samples of all rounds)}: the
    warm-up, then args.rounds rounds of every implementation, order rotated each round."""
    names = list(replays)
    run_for(torch, lambda: [replays[n]() for n in names], args.warm_s)
    timed = {n: ([], [], []) for n in names}
    for rnd in range(args.rounds):
        shift = rnd % len(names)
        for n in names[shift:] + names[:shift]:
            ms, calls = time_for(torch, replays[n], args.loop_ms, estimates[n], MIN_CALLS,
                                 sampler.sampling, lead_ms=args.settle_ms)
            estimates[n] = ms
            us, counts, samples = timed[n]
            us.append(ms * 1e3)
            counts.append(calls)
            samples += sampler.samples
    return timed


def run_shape(torch, fp8mla, fa3, anchors, shape, sampler, args):
    """The rows of one shape of SHAPES: one per implementation that applies."""
    name, q_lens, prefix_lens, heads, causal = shape
    x = make_inputs(torch, q_lens, prefix_lens, heads, zlib.crc32(name.encode()), args.source)
    replays, estimates, errors = capture(torch, implementations(torch, fp8mla, fa3, anchors, x,
                                                                causal))
    timed = time_rounds(torch, replays, estimates, sampler, args) if replays else {}
    work = tflop(x, causal)
    rows = []
    for impl in (i for i in IMPLS if i in timed or i in errors):
        row = {"shape": name, "q_lens": q_lens, "prefix_lens": prefix_lens, "heads": heads,
               "causal": causal, "impl": impl, "tflop": work}
        if impl in errors:
            row["status"] = errors[impl]
            rows.append(row)
            continue
        us, calls, samples = timed[impl]
        t = statistics.median(us)
        clock = sampler.summary(samples)
        row.update(status="ok", us=t, us_rounds=us, calls=calls, tflops=work / (t * 1e-6),
                   clock=clock)
        power = (clock or {}).get("power_w_mean")
        if power:
            row.update(energy_j=power * t * 1e-6, tflop_per_j=work / (power * t * 1e-6))
        rows.append(row)
    return rows


def reference(torch, x, q, k, v, causal):
    """float64 attention of q [Tq, H, 192], k [Tk, H, 192], v [Tk, H, 128] (float64) over x's
    sequences, causal bottom-right: (O [Tq, H, 128], natural-log LSE [Tq, H])."""
    out = torch.zeros(q.shape[0], x.heads, DV, dtype=torch.float64, device=q.device)
    lse = torch.zeros(q.shape[0], x.heads, dtype=torch.float64, device=q.device)
    for q0, k0, ql, kl in zip(offsets(x.q_lens), offsets(x.k_lens), x.q_lens, x.k_lens):
        s = torch.einsum("qhd,khd->hqk", q[q0:q0 + ql], k[k0:k0 + kl]) * x.scale
        if causal:
            i = torch.arange(ql, device=q.device)[:, None]
            j = torch.arange(kl, device=q.device)[None, :]
            s = s.masked_fill(j > i + kl - ql, float("-inf"))
        out[q0:q0 + ql] = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v[k0:k0 + kl])
        lse[q0:q0 + ql] = torch.logsumexp(s, dim=-1).T
    return out, lse


def accuracy(torch, fp8mla, fa3, anchors):
    """The ACCURACY case: each implementation's max |O - O_ref| against float64 of its inputs,
    and of the LSE where it writes one (fp8mla's LSE rows, FA3)."""
    q_lens, prefix_lens, heads, causal = ACCURACY
    x = make_inputs(torch, q_lens, prefix_lens, heads, seed=1)

    def wide(t8, s):
        return t8.float().double() * s.double()

    refs = {"e4m3": reference(torch, x, wide(x.q8, x.qs), wide(x.k8, x.ks), wide(x.v8, x.vs),
                              causal),
            "bf16": reference(torch, x, x.q.double(), x.k.double(), x.v.double(), causal)}
    lses = {"fp8mla_e4m3_lse": lambda: x.lse, "fp8mla_e4m3_lse_krope": lambda: x.lse,
            "fa3_e4m3": lambda: x.fa3_lse.T, "fa3_bf16": lambda: x.fa3_lse.T}
    rows = []
    for impl, fn in implementations(torch, fp8mla, fa3, anchors, x, causal).items():
        row = {"impl": impl, "reference": "bf16" if impl.endswith("bf16") else "e4m3"}
        if isinstance(fn, str):
            row["status"] = fn
        else:
            try:
                o_ref, lse_ref = refs[row["reference"]]
                err = (fn().double() - o_ref).abs().max().item()
                row.update(status="ok", max_abs_err=err)
                if impl in lses:
                    row["lse_max_abs_err"] = (lses[impl]().double() - lse_ref).abs().max().item()
            except Exception as e:  # noqa: BLE001 - a failing implementation is a row
                row["status"] = error_text(e)
        rows.append(row)
    return {"q_lens": q_lens, "prefix_lens": prefix_lens, "heads": heads, "causal": causal,
            "ref_max_abs": {k: v[0].abs().max().item() for k, v in refs.items()}, "rows": rows}


def progress(r):
    """One console line of a row, as it is measured."""
    head = f"{r['shape']:<14} {r['impl']:<17}"
    if r["status"] != "ok":
        return f"{head} {r['status']}"
    c = r.get("clock") or {}
    return (f"{head} {r['tflops']:7.0f} TFLOP/s {r['us']:10.1f} us "
            f"{report_attention.fmt(c.get('sm_mhz_median'), '5.0f')} MHz "
            f"{report_attention.fmt(c.get('power_w_mean'), '4.0f')} W")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--anchors", help="anchors.py or its folder (default: ../shared/anchors)")
    ap.add_argument("--json")
    ap.add_argument("--markdown", help="RESULTS_attention.md to put this run's section first in")
    ap.add_argument("--plot", help="PNG of the ratios per shape (needs matplotlib)")
    ap.add_argument("--shapes", help="comma-separated subset of " + ",".join(s[0] for s in SHAPES))
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--loop-ms", type=float, default=LOOP_MS,
                    help="replays timed per implementation and round, in ms")
    ap.add_argument("--warm-s", type=float, default=WARM_S)
    ap.add_argument("--settle-ms", type=float, default=SETTLE_MS,
                    help="untimed replays of an implementation right before its timed ones, in ms "
                         "(0: the timed replays follow the previous implementation's)")
    ap.add_argument("--inputs", choices=["randn", "layer"], default="randn",
                    help="q, k, v of unit normals, or as the DeepSeek-V3 layer makes them "
                         "(bench/layer.py's engine row on random hidden states; needs FA3)")
    args = ap.parse_args()
    names = [s[0] for s in SHAPES]
    wanted = args.shapes.split(",") if args.shapes else names
    if any(w not in names for w in wanted):
        ap.error(f"--shapes: expected names among {','.join(names)}, got {args.shapes!r}")
    import torch
    import fp8mla
    anchors, _ = load_anchors(args.anchors, "attention.py")
    fa3 = load_fa3()
    args.source = randn_qkv if args.inputs == "randn" else LayerQkv(torch, fp8mla, fa3[0])
    sampler = ClockSampler(torch)
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, fp8mla "
          f"{fp8mla.__version__}, FA3 {fa3[1]}, NVML "
          f"{sampler.power_source if sampler.available else 'unavailable'}", flush=True)
    start = time.perf_counter()
    acc = accuracy(torch, fp8mla, fa3, anchors)
    print("\n".join(report_attention.accuracy_lines(acc)), flush=True)
    rows = []
    for shape in (s for s in SHAPES if s[0] in wanted):
        new = run_shape(torch, fp8mla, fa3, anchors, shape, sampler, args)
        torch.cuda.empty_cache()
        print("\n".join(progress(r) for r in new), flush=True)
        rows += new
    meta = {"date": utc_now(), "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "fp8mla": fp8mla.__version__, "fa3": fa3[1], "inputs": args.inputs,
            "rounds": args.rounds,
            "loop_ms": args.loop_ms, "warm_s": args.warm_s, "settle_ms": args.settle_ms,
            "power_source": sampler.power_source or "no NVML power reading",
            "wall_s": time.perf_counter() - start,
            "method": (f"Each implementation a CUDA graph; per shape {args.warm_s:g} s of replays "
                       f"of all in turn, then {args.rounds} rounds, each implementation in turn "
                       f"(order rotated): ~{args.settle_ms:g} ms of its replays untimed, then "
                       f"~{args.loop_ms:g} ms timed, queued back to back (CUDA events, median); "
                       "the figure is the median over rounds.")}
    doc = {"meta": meta, "rows": rows, "ratios": report_attention.attention_ratios(rows), "accuracy": acc}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    if args.markdown:
        report_attention.prepend_attention_section(args.markdown, report_attention.attention_section(doc))
    if args.plot:
        try:
            report_attention.plot_attention(args.plot, doc)
        except ImportError as e:
            print(f"no plot: {e}")
    print("\n".join(report_attention.attention_text(doc)))
    failed = [r for r in rows + acc["rows"] if r["impl"] in REQUIRED and r["status"] != "ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
