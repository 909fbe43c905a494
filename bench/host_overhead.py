#!/usr/bin/env python3
"""Host time per call of fp8mla's Python ops on torch tensors at a tiny prefill (T = 4 tokens;
DeepSeek-V3's MLA dims: H = 16 heads by default, qk 192, v 128, kv_lora 512, rope 64), against
torch's own cast and FA3's forward (fa3_fwd_interface._flash_attn_forward, when it imports) on the
same shapes.

Per row: --calls calls issued back to back (no synchronization between them; on CUDA they queue,
the queue far from full), timed on the host clock, then one synchronization; the median over
--reps of the time per call (the JSON has the minimum too). Columns:
  given  every output passed (out=..., the engine's way with its own buffers)
  alloc  the outputs allocated by the call (torch.empty on the input's device)
  _C     the nanobind call alone, with the arguments the `given` call hands it: the binding's
         conversions and the C++ op's checks and launch (`fp8mla bench host` times the C++ API
         without the binding)
Anchors: torch's cast x.to(float8_e4m3fn) of the quantize_fp8 input (given: out.copy_(x)), and
FA3's e4m3 forward on prefill_attention's tensors (FA3 allocates its output). The target is
<= 10 us for every fp8mla row (given and alloc). make_cos_sin_cache is set-up work (a blocking
fill) and is not timed.

On CPU torch the ops compute as they are called (the library's CPU path, which starts threads):
their time includes that work; --tokens 0 leaves the host overhead alone.

    python3 bench/host_overhead.py --results out/bench          # -> out/bench/host_overhead.json
    python3 bench/host_overhead.py --device cpu --tokens 0,4 --results out/cpu
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import types

from common import load_fa3, utc_now

TARGET_US = 10.0
COLUMNS = ("given", "alloc", "_C")


def host_us(fn, calls, reps, sync):
    """(median, minimum) over `reps` of the host time per call of `calls` back-to-back calls,
    in us."""
    for _ in range(20):
        fn()
    sync()
    per_call = []
    for _ in range(reps):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        end = time.perf_counter_ns()
        sync()
        per_call.append((end - start) / calls / 1e3)
    return statistics.median(per_call), min(per_call)


def c_call(torch_ops, op, call):
    """The nanobind call of op `op` that `call()` makes, with the arguments it makes it with
    (captured from one call of the eager entry)."""
    scope = torch_ops._EAGER[op].__globals__
    c_op, seen = scope["_c_op"], []
    scope["_c_op"] = lambda *args: seen.append(args)
    try:
        call()
    finally:
        scope["_c_op"] = c_op
    args = seen[0]
    return lambda: c_op(*args)


def tensors(torch, device, t, h):
    """The inputs and the given outputs of every row; the q/k/v inputs are slices of one
    projection's output, as an engine has them."""
    def rand(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device=device).to(dtype)

    e4m3, pitch = torch.float8_e4m3fn, max((t + 15) // 16 * 16, 16)
    q, ckv, kv = rand(t, h, 192), rand(t, 576), rand(t, h, 256)
    x = types.SimpleNamespace(
        x=rand(t, 512), x8=torch.empty(t, 512, dtype=e4m3, device=device),
        one=torch.ones(1, device=device), scale=torch.empty(1, device=device),
        hidden=rand(t, 7168), hidden8=torch.empty(t, 7168, dtype=e4m3, device=device),
        group_scales=torch.empty(t, 56, device=device),
        fp4=torch.empty(t, 3584, dtype=torch.uint8, device=device),
        fp4_scales=torch.empty((t + 127) // 128 * 128, 448, dtype=e4m3, device=device),
        q_nope=q[..., :128], q_pe=q[..., 128:], k_nope=kv[..., :128], v=kv[..., 128:],
        kv_c=ckv[:, :512], k_pe=ckv[:, 512:], positions=torch.arange(t, device=device),
        slots=torch.arange(t, device=device), cache=torch.zeros(4, 64, 576, dtype=e4m3,
                                                                device=device),
        q8=torch.empty(t, h, 192, dtype=e4m3, device=device),
        k8=torch.empty(t, h, 192, dtype=e4m3, device=device),
        v8=torch.empty(h, 128, pitch, dtype=e4m3, device=device)[:, :, :t].permute(2, 0, 1),
        v8_tokens=torch.zeros(t, h, 128, dtype=e4m3, device=device),
        gathered_c=torch.empty(t, 512, dtype=torch.bfloat16, device=device),
        gathered_pe=torch.empty(t, 64, dtype=torch.bfloat16, device=device),
        cu=torch.tensor([0, t], dtype=torch.int32, device=device),
        o=torch.zeros(t, h, 128, dtype=torch.bfloat16, device=device),
        lse=torch.zeros(t, h, device=device),
        merged=torch.empty(t, h, 128, dtype=torch.bfloat16, device=device),
        merged_lse=torch.empty(t, h, device=device))
    return x


def fp8mla_rows(fp8mla, x):
    """{row: (op, given call, alloc call or None)}."""
    rope = (x.q_nope, x.q_pe, x.k_nope, x.k_pe, x.positions, x.cos_sin)
    cache = dict(cache=x.cache, slot_mapping=x.slots, kv_c=x.kv_c)
    attention = (x.q8, x.k8, x.v8, x.cu, x.cu, x.t, x.t)
    descales = dict(softmax_scale=0.07, q_descale=x.one, k_descale=x.one, v_descale=x.one)
    f = fp8mla
    return {
        "quantize_fp8": ("quantize_fp8", lambda: f.quantize_fp8(x.x, 2.0, out=x.x8),
                         lambda: f.quantize_fp8(x.x, 2.0)),
        "quantize_fp8[scale tensor]": (
            "quantize_fp8", lambda: f.quantize_fp8(x.x, x.one, out=x.x8),
            lambda: f.quantize_fp8(x.x, x.one)),
        "quantize_fp8_dynamic": (
            "quantize_fp8_dynamic", lambda: f.quantize_fp8_dynamic(x.x, out=x.x8, scale=x.scale),
            lambda: f.quantize_fp8_dynamic(x.x)),
        "quantize_fp8_per_token_group": (
            "quantize_fp8_per_token_group",
            lambda: f.quantize_fp8_per_token_group(x.hidden, out=x.hidden8, scales=x.group_scales),
            lambda: f.quantize_fp8_per_token_group(x.hidden)),
        "quantize_nvfp4": (
            "quantize_nvfp4",
            lambda: f.quantize_nvfp4(x.hidden, x.one, out=x.fp4, block_scales=x.fp4_scales),
            lambda: f.quantize_nvfp4(x.hidden, x.one)),
        "mla_rope_quantize_fp8": (
            "mla_rope_quantize_fp8",
            lambda: f.mla_rope_quantize_fp8(*rope, q_out=x.q8, k_out=x.k8),
            lambda: f.mla_rope_quantize_fp8(*rope)),
        "mla_rope_quantize_fp8+cache": (
            "mla_rope_quantize_fp8",
            lambda: f.mla_rope_quantize_fp8(*rope, q_out=x.q8, k_out=x.k8, **cache),
            lambda: f.mla_rope_quantize_fp8(*rope, **cache)),
        "mla_kv_cache_write": (
            "mla_kv_cache_write", lambda: f.mla_kv_cache_write(x.kv_c, x.k_pe, x.cache, x.slots),
            None),
        "mla_kv_gather": (
            "mla_kv_gather",
            lambda: f.mla_kv_gather(x.cache, x.slots, 1.0, kv_c_out=x.gathered_c,
                                    k_pe_out=x.gathered_pe),
            lambda: f.mla_kv_gather(x.cache, x.slots, 1.0)),
        "mla_kv_pack_quantize_fp8": (
            "mla_kv_pack_quantize_fp8",
            lambda: f.mla_kv_pack_quantize_fp8(x.k_nope, x.k_pe, x.v, k_out=x.k8, v_out=x.v8,
                                               v_layout="transposed"),
            lambda: f.mla_kv_pack_quantize_fp8(x.k_nope, x.k_pe, x.v, v_layout="transposed")),
        "mla_v_quantize_fp8": (
            "mla_v_quantize_fp8",
            lambda: f.mla_v_quantize_fp8(x.v, v_out=x.v8, v_layout="transposed"),
            lambda: f.mla_v_quantize_fp8(x.v, v_layout="transposed")),
        "prefill_attention": (
            "prefill_attention", lambda: f.prefill_attention(*attention, out=x.o, **descales),
            lambda: f.prefill_attention(*attention, **descales)),
        "merge_attention_states": (
            "merge_attention_states",
            lambda: f.merge_attention_states(x.o, x.lse, x.o, x.lse, out=x.merged,
                                             out_lse=x.merged_lse),
            lambda: f.merge_attention_states(x.o, x.lse, x.o, x.lse)),
        "detect_output_quant_key": (
            None, lambda: f.detect_output_quant_key(x.x8, x.one), None),
    }


def anchor_rows(torch, x, fa3):
    """{row: (given call or None, alloc call or None, status)} of torch's cast and FA3."""
    rows = {"torch cast x.to(e4m3)": (lambda: x.x8.copy_(x.x),
                                      lambda: x.x.to(torch.float8_e4m3fn), "ok")}
    module, note = fa3
    if module is None or not x.x.is_cuda:
        why = note if module is None else "needs CUDA tensors"
        rows["FA3 _flash_attn_forward e4m3"] = (None, None, why)
    else:
        descale = x.one.view(1, 1).expand(1, x.q8.shape[1]).contiguous()
        rows["FA3 _flash_attn_forward e4m3"] = (None, lambda: module._flash_attn_forward(
            x.q8, x.k8, x.v8_tokens, cu_seqlens_q=x.cu, cu_seqlens_k=x.cu, max_seqlen_q=x.t,
            max_seqlen_k=x.t, softmax_scale=0.07, causal=True, q_descale=descale,
            k_descale=descale, v_descale=descale), note)
    return rows


def measure(torch, fp8mla, fa3, args, t):
    """The rows of T = t tokens: {"row", "tokens", "given", "alloc", "_C" (us or None),
    "status"}."""
    device = args.device
    x = tensors(torch, device, t, args.heads)
    x.t, x.cos_sin = t, fp8mla.make_cos_sin_cache(4096, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    from fp8mla import torch_ops

    def timed(row, column, fn):
        if fn is not None:
            row[column], row[column + "_min"] = host_us(fn, args.calls, args.reps, sync)

    rows = []
    for name, (given, alloc, status) in anchor_rows(torch, x, fa3).items():
        row = dict.fromkeys(COLUMNS, None) | {"row": name, "anchor": True, "tokens": t,
                                              "status": status}
        timed(row, "given", given)
        timed(row, "alloc", alloc)
        rows.append(row)
    for name, (op, given, alloc) in fp8mla_rows(fp8mla, x).items():
        row = dict.fromkeys(COLUMNS, None) | {"row": name, "anchor": False, "tokens": t,
                                              "status": "ok"}
        try:
            timed(row, "given", given)
            timed(row, "alloc", alloc)
            timed(row, "_C", c_call(torch_ops, op, given) if op else None)
        except Exception as e:  # noqa: BLE001 - a failing op is a row that says so
            row["status"] = f"{type(e).__name__}: {e}"[:200]
        rows.append(row)
    return rows


def print_rows(rows):
    def cell(v):
        return f"{v:8.2f}" if v is not None else f"{'-':>8}"
    print(f"{'':32} {'T':>3} " + " ".join(f"{c:>8}" for c in COLUMNS) + "   (us per call)")
    for r in rows:
        over = [c for c in ("given", "alloc") if not r["anchor"] and (r[c] or 0) > TARGET_US]
        note = "" if r["status"] == "ok" else r["status"]
        note += f" over {TARGET_US:g} us: {', '.join(over)}" if over else ""
        print(f"{r['row']:<32} {r['tokens']:>3} " + " ".join(cell(r[c]) for c in COLUMNS) +
              f"  {note}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", required=True, help="folder of host_overhead.json")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="default: cuda when torch sees a GPU, else cpu")
    p.add_argument("--tokens", default="4", help="comma-separated T values (default 4)")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args()
    import torch

    import fp8mla

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("host_overhead.py: --device cuda needs a GPU torch can see")
    fa3 = load_fa3()
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    reader = fp8mla._C.torch_tensor_reader()
    print(f"{device_name}: torch {torch.__version__}, fp8mla {fp8mla.__version__}, {fa3[1]}; "
          f"torch tensors read by {reader}; H = {args.heads}, {args.calls} calls x "
          f"{args.reps} reps, median")
    rows = []
    for t in (int(v) for v in args.tokens.split(",")):
        rows += measure(torch, fp8mla, fa3, args, t)
    print_rows(rows)
    doc = {"benchmark": "host_overhead", "date": utc_now(), "device": device_name,
           "torch": torch.__version__, "fp8mla_version": fp8mla.__version__, "fa3": fa3[1],
           "torch_tensor_reader": reader,
           "heads": args.heads, "calls": args.calls, "reps": args.reps,
           "timer": "host clock around --calls back-to-back calls, then one sync; median (and "
                    "<column>_min: minimum) of --reps, us per call", "target_us": TARGET_US,
           "rows": rows}
    os.makedirs(args.results, exist_ok=True)
    path = os.path.join(args.results, "host_overhead.json")
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
