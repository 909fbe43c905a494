#!/usr/bin/env python3
"""The one report writer of the benchmarks: the RESULTS*.md sections and the plots, from the JSON
files the benchmarks write (every number comes from those files; needs only the Python standard
library, and matplotlib for the plots).

    python3 bench/report.py --kind quant --cli OUT/quant_cli.json --py OUT/quant_py.json
    python3 bench/report.py --kind prep --cli OUT/prep_cli.json --py OUT/prep_py.json
    python3 bench/report.py --kind attention --py OUT/attention_py.json
    python3 bench/report.py --kind layer --cli OUT/layer_cli.json --py OUT/layer_py.json

- quant (`fp8mla bench quant --json`, bench/quant.py) into bench/RESULTS.md: one dated section
  (date and device from the JSON) with, per op, the measured tables and the targets of
  docs/design.md section 9, marked met / MISSED. The section replaces one for the same runs (same dates and device)
  if the file has it, else it goes first; the others stay.
- prep (`fp8mla bench prep --json`, bench/prep.py) into bench/RESULTS_prep.md, the same way:
  RoPE + FP8 Q/K and K/V pack >= 3.8 TB/s at T >= 8k (C++ and Python), <= 8 us at T <= 64 (C++
  kernel time) and >= 1.6x the torch.compile anchor at T >= 8k (Python), each marked met /
  MISSED; the latent cache write and gather have no target and are reported only.
- attention (bench/attention.py --json) into bench/RESULTS_attention.md: the run's section goes
  first (attention.py --markdown writes the same section as it runs): fp8mla against
  FlashAttention-3 and cuDNN per shape, the accuracy case, and the targets (docs/design.md
  section 9: >= 1.00x FA3 e4m3 on every shape (bar), >= 1.10x (goal), >= 1,050 TFLOP/s at 16k
  and 32k causal H = 128, >= 650 at 16 x 1k causal; the bf16 kernel >= 1.00x FA3 bf16; the LSE
  and token-major V variants at most 3 % slower), each marked met / MISSED.
- layer (`fp8mla bench layer --json`, bench/layer.py --json) into bench/RESULTS_layer.md (the
  file is rewritten: one run).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys

OPS = ["per_tensor_static", "per_tensor_dynamic", "group128_f32", "group128_packed_ue8m0",
       "nvfp4_swizzled"]

# docs/design.md section 9. Bandwidth targets are judged at sizes >= LARGE_BYTES (bytes moved:
# input + output + scales): section 9 states that size for per-tensor quantization, and the same size is
# used for the other ops (smaller tensors are bound by launch latency, not bandwidth).
LARGE_BYTES = 256e6
BANDWIDTH_TARGETS = {
    "per_tensor_static": 4.1,
    "per_tensor_dynamic": 4.1,
    "group128_f32": 3.8,
    "group128_packed_ue8m0": 3.8,
    "nvfp4_swizzled": 3.5,
}
SEED_ANCHOR = "seed_triton"  # "never slower than the seed Triton kernel where it runs"
NOTES = {
    "per_tensor_dynamic": "Section 9's per-tensor target, judged on the same byte count as the "
                          "static op (one read of the input). The dynamic op must find amax "
                          "before it writes, so at these sizes it reads the input twice: at "
                          "copy speed that is 3/5 of the counted bandwidth.",
    "group128_packed_ue8m0": "The torch.compile anchor writes f32 row-major scales (4x the scale "
                             "bytes of packed UE8M0, under 1.2% of the total); TB/s of both use "
                             "fp8mla's byte count.",
}

BEGIN = "<!-- run: {} -->"
END = "<!-- end run -->"
TITLE = "# Quantization benchmark results"
PREAMBLE = (
    "Written by `bench/report.py` from the JSON files of `fp8mla bench quant` (C++, CUDA events "
    "around each launch) and `bench/quant.py` (Python, fp8mla and the anchors in one process, "
    "same tensors, same timer); do not edit by hand. Newest run first. How to run: "
    "`bench/README.md`. Bytes = input read + output written + scales, each once; TB/s = bytes / "
    "time; ratio = anchor time / fp8mla time (> 1: fp8mla faster).")


def fmt(v, spec, none="—"):
    return none if v is None else format(v, spec)


def mb(b):
    return f"{b / 1e6:,.3f}"


def shape_cell(r):
    return f"{r['shape']} ({r['label']})"


def status_word(ok):
    return "met" if ok else "**MISSED**"


class Check:
    """One target judged over a set of rows: (rows judged, rows missed, worst value); the worst
    is shown with `fmt_spec` and `unit`."""

    def __init__(self, what, source, unit=" TB/s", fmt_spec=".3f", lower_is_worse=True):
        self.what, self.source = what, source
        self.unit, self.fmt_spec, self.lower_is_worse = unit, fmt_spec, lower_is_worse
        self.judged, self.missed, self.worst = 0, [], None

    def add(self, ok, value, where):
        self.judged += 1
        if not ok:
            self.missed.append(where)
        if value is not None and (self.worst is None or (value < self.worst if self.lower_is_worse
                                                         else value > self.worst)):
            self.worst = value


def check(checks, key, *args, **kwargs):
    """checks[key], made with Check(*args, **kwargs) the first time."""
    if key not in checks:
        checks[key] = Check(*args, **kwargs)
    return checks[key]


def summary(checks, title="### Targets (docs/design.md section 9)\n"):
    """The targets table: one line per check, in the order they were made."""
    out = [title,
           "| target | measured by | rows judged | worst | missed at | status |",
           "|---|---|---:|---:|---|---|"]
    for c in checks.values():
        if c.judged == 0:
            out.append(f"| {c.what} | {c.source} | 0 | — | — | not measured (no row at that "
                       f"size) |")
            continue
        missed = ", ".join(c.missed) if c.missed else "—"
        out.append(f"| {c.what} | {c.source} | {c.judged} | {fmt(c.worst, c.fmt_spec)}{c.unit} | "
                   f"{missed} | {status_word(not c.missed)} |")
    return out


def python_timer(py):
    """How the Python benchmark timed (runs before bench/common.py name anchors.bench)."""
    return "anchors.bench" if str(py.get("timer", "")).startswith("anchors.bench") else \
        "bench/common.py, host-paced"


def run_section(run_id, cli, py, cli_path, py_path, cli_setup, cli_timing, py_setup):
    """The start of a quant or prep section: its marker, title and one line per run."""
    device = (cli or py)["device"]
    dates = [d["date"] for d in (cli, py) if d]
    lines = [BEGIN.format(run_id), f"## {dates[0][:10]} — {device}", ""]
    if cli:
        lines.append(f"- C++: `{os.path.basename(cli_path)}`, {cli['date']}, fp8mla "
                     f"{cli.get('fp8mla_version')}, CUDA {cli.get('cuda_version')}, {cli_setup}"
                     f"{cli.get('iters')} timed launches after {cli.get('warmup')} warm-up "
                     f"(median{cli_timing}), PDL {'on' if cli.get('pdl') else 'off'}, L2 "
                     f"{cli.get('l2_bytes', 0) / 2**20:.0f} MiB; device copy ceiling "
                     f"{fmt(cli.get('copy_ceiling_tbps'), '.3f')} TB/s (1 GiB copied).")
    if py:
        lines.append(f"- Python: `{os.path.basename(py_path)}`, {py['date']}, torch "
                     f"{py.get('torch')}, triton {py.get('triton')}, fp8mla "
                     f"{py.get('fp8mla_version')}, {py_setup}{py.get('iters')} timed calls after "
                     f"{py.get('warmup')} warm-up (median, {python_timer(py)}); device copy "
                     f"ceiling {fmt(py.get('copy_ceiling_tbps'), '.3f')} TB/s (1 GiB copied).")
    if cli and py and cli["device"] != py["device"]:
        lines.append(f"- **Note:** the two runs name different devices ({cli['device']} / "
                     f"{py['device']}).")
    lines.append("")
    return lines


def section_end(lines, checks, body, analysis, plot, extra_summary=()):
    """The rest of a quant or prep section: targets, plot, analysis, tables, end marker."""
    lines += summary(checks) + list(extra_summary) + [""]
    if plot:
        lines += [f"![TB/s against bytes moved, fp8mla and the anchors]({plot})", ""]
    if analysis:
        lines += ["### Why targets are missed (analysis, written by hand)", "", analysis.strip(), ""]
    lines += body
    lines.append(END)
    return "\n".join(lines) + "\n"


CLI_TABLE = ["| shape | MB | µs | TB/s | copy TB/s (same bytes) | % of copy | check | target |",
             "|---|---:|---:|---:|---:|---:|---|---|"]
PY_TABLE = ["| shape | MB | fp8mla µs | fp8mla TB/s | anchor | anchor µs | anchor TB/s | ratio | "
            "output agreement | target |",
            "|---|---:|---:|---:|---|---:|---:|---:|---:|---|"]


def cli_row(r, shape, target):
    """A row of a C++ table (CLI_TABLE)."""
    if r.get("status") != "ok":
        return f"| {shape} | {mb(r['bytes'])} | — | — | — | — | {r.get('status')} | {target} |"
    return (f"| {shape} | {mb(r['bytes'])} | {fmt(r.get('us'), '.2f')} | "
            f"{fmt(r.get('tbps'), '.3f')} | {fmt(r.get('copy_tbps'), '.3f')} | "
            f"{fmt(r.get('pct_of_copy'), '.1f')}% | {r.get('check', '')} | {target} |")


def py_row(r, shape, targets):
    """A row of a Python table (PY_TABLE): fp8mla and one anchor."""
    fp8_us = fmt(r.get("fp8mla_us"), ".2f") if r.get("fp8mla_status") == "ok" else \
        r.get("fp8mla_status", "—")
    anchor_us = fmt(r.get("anchor_us"), ".2f") if r.get("anchor_status") == "ok" else \
        r.get("anchor_status", "—")
    return (f"| {shape} | {mb(r['bytes'])} | {fp8_us} | {fmt(r.get('fp8mla_tbps'), '.3f')} | "
            f"{r['anchor']} | {anchor_us} | {fmt(r.get('anchor_tbps'), '.3f')} | "
            f"{fmt(r.get('ratio'), '.2f')} | {fmt(r.get('output_agreement'), '.4f')} | "
            f"{'; '.join(targets)} |")


def bandwidth_row_status(op, nbytes, tbps):
    """'' when the row is not judged, else 'met ≥ x' / '**MISSED** ≥ x'."""
    target = BANDWIDTH_TARGETS.get(op)
    if target is None or nbytes < LARGE_BYTES:
        return None, ""
    ok = tbps is not None and tbps >= target
    return ok, f"{status_word(ok)} (≥ {target} TB/s)"


def cli_section(op, rows, checks):
    out = [f"#### {op} — C++ (`fp8mla bench quant`)\n", *CLI_TABLE]
    bw = check(checks, (op, "bandwidth", "C++"),
               f"{op}: ≥ {BANDWIDTH_TARGETS.get(op)} TB/s at ≥ {LARGE_BYTES / 1e6:.0f} MB", "C++")
    for r in rows:
        tbps = r.get("tbps") if r.get("status") == "ok" else None
        ok, target = bandwidth_row_status(op, r["bytes"], tbps)
        if ok is not None:
            bw.add(ok, tbps, r["shape"])
        out.append(cli_row(r, shape_cell(r), target))
    out.append("")
    return out


def py_section(op, rows, checks):
    out = [f"#### {op} — Python (`bench/quant.py`), fp8mla vs anchors\n", *PY_TABLE]
    bw = check(checks, (op, "bandwidth", "Python"),
               f"{op}: ≥ {BANDWIDTH_TARGETS.get(op)} TB/s at ≥ {LARGE_BYTES / 1e6:.0f} MB",
               "Python")
    judged_bw = set()
    for r in rows:
        targets = []
        ok, text = bandwidth_row_status(op, r["bytes"], r.get("fp8mla_tbps"))
        if ok is not None and r["shape"] not in judged_bw:
            # One fp8mla time per shape, shown on its first row (the others repeat it).
            judged_bw.add(r["shape"])
            targets.append(text)
            bw.add(ok, r.get("fp8mla_tbps"), r["shape"])
        if op == "per_tensor_static" and r["anchor"] == SEED_ANCHOR:
            seed = check(
                checks, (op, "seed", "Python"),
                f"{op}: never slower than the seed Triton kernel where it runs (ratio ≥ 1)",
                "Python", unit="", fmt_spec=".2f")
            if r.get("anchor_status") == "ok":
                ratio = r.get("ratio")
                ok = ratio is not None and ratio >= 1.0
                seed.add(ok, ratio, r["shape"])
                targets.append(f"{status_word(ok)} (≥ seed)")
            else:
                targets.append("seed n/a")
        out.append(py_row(r, shape_cell(r), targets))
    out.append("")
    return out


def build_section(cli, py, cli_path, py_path, analysis=None, plot=None):
    device = (cli or py)["device"]
    run_id = f"{device} | " + " | ".join(d["date"] for d in (cli, py) if d)
    lines = run_section(run_id, cli, py, cli_path, py_path, "", "", "")
    checks = {}
    body = []
    for op in OPS:
        part = []
        for doc, section in ((cli, cli_section), (py, py_section)):
            rows = [r for r in doc["results"] if r["op"] == op] if doc else []
            if rows:
                part += section(op, rows, checks)
        if part:
            body.append(f"### {op}\n")
            if op in NOTES:
                body.append(f"{NOTES[op]}\n")
            body += part
    return run_id, section_end(lines, checks, body, analysis, plot)


def update(path, run_id, section, title=TITLE, preamble=PREAMBLE):
    old = open(path).read() if os.path.exists(path) else ""
    pattern = re.compile(re.escape(BEGIN.format(run_id)) + r".*?" + re.escape(END) + r"\n?",
                         re.S)
    if pattern.search(old):
        new = pattern.sub(lambda _: section, old, count=1)
    else:
        first = old.find("<!-- run: ")
        if first >= 0:
            new = old[:first] + section + "\n" + old[first:]
        else:
            new = f"{title}\n\n{preamble}\n\n{section}"
    with open(path, "w") as fh:
        fh.write(new)


# ---- MLA prep ops (`--kind prep`): fp8mla bench prep and bench/prep.py -------------------------

# docs/design.md section 9, row "RoPE+quant Q/K, KV pack": >= 3.8 TB/s at T >= 8k, <= 8 us at
# T <= 64 (kernel time: the C++ harness) and, from the issue, >= 1.6x the torch.compile anchor at
# T >= 8k.
PREP_LARGE_TOKENS = 8192
PREP_BANDWIDTH_TBPS = 3.8
PREP_SMALL_TOKENS = 64
PREP_LATENCY_US = 8.0
PREP_COMPILE_RATIO = 1.6
PREP_COMPILE_ANCHOR = "torch_compile"
# Ops judged, per source. The latent cache write and gather have no target (reported only).
PREP_CLI_JUDGED = ["rope_quant", "rope_quant_cache", "kv_pack"]
PREP_PY_BANDWIDTH = ["rope_quant_neox", "rope_quant_interleaved", "kv_pack"]
PREP_PY_COMPILE = ["rope_quant_neox", "kv_pack"]  # where torch_compile is the anchor of section 9
PREP_GROUPS = [
    ("RoPE + FP8 Q/K (op 4)", ["rope_quant", "rope_quant_cache"],
     ["rope_quant_neox", "rope_quant_interleaved"]),
    ("K/V pack (op 7)", ["kv_pack"], ["kv_pack"]),
    ("Latent cache write (op 5)", ["kv_cache_write"], ["kv_cache_write"]),
    ("Latent cache gather (op 6)", ["kv_gather"], ["kv_gather"]),
]
PREP_NOTES = {
    "rope_quant_cache": "The fused form: the same pass also writes kv_c and the RoPE'd k_pe into "
                        "the paged FP8 cache (page size from the run). Judged by the same targets "
                        "as rope_quant, since the prefill hook calls this form.",
    "rope_quant_neox": "fp8mla with style=\"neox\", so that it computes what the anchor "
                       "(anchors.rope_quant_compiled, NeoX pairs) computes; this row carries the "
                       "≥ 1.6x torch.compile target.",
    "rope_quant_interleaved": "fp8mla's DeepSeek style against the same math with interleaved "
                              "pairs written in bench/prep.py (torch.compile'd and eager); not "
                              "the section 9 anchor, so its ratio is not judged.",
    "kv_pack": "The torch.compile and eager versions are written in bench/prep.py (anchors.py "
               "has none): cat(k_nope, k_pe broadcast to every head), scale, clamp, cast.",
}
PREP_TITLE = "# MLA prep benchmark results"
PREP_PREAMBLE = (
    "Written by `bench/report.py --kind prep` from the JSON files of `fp8mla bench prep` (C++, "
    "CUDA events around each launch) and `bench/prep.py` (Python, fp8mla and the anchors in one "
    "process, same tensors, same timer); do not edit by hand. Newest run first. How to run: "
    "`bench/README.md`. Bytes = every input read once + every output written once (cos/sin rows, "
    "positions and slots included); TB/s = bytes / time; ratio = anchor time / fp8mla time "
    "(> 1: fp8mla faster). Python times include the host time of the call (a floor of tens of "
    "µs), so the ≤ 8 µs target is judged on the C++ kernel times only.")


def prep_cli_rows(op, rows, checks):
    out = [f"#### {op} — C++ (`fp8mla bench prep`)\n", *CLI_TABLE]
    judged = op in PREP_CLI_JUDGED
    if judged:
        bw = check(checks, (op, "bandwidth", "C++"),
                   f"{op}: ≥ {PREP_BANDWIDTH_TBPS} TB/s at T ≥ {PREP_LARGE_TOKENS // 1024}k", "C++")
        lat = check(checks, (op, "latency", "C++"),
                    f"{op}: ≤ {PREP_LATENCY_US:g} µs at T ≤ {PREP_SMALL_TOKENS}", "C++", " µs", ".2f",
                    lower_is_worse=False)
    for r in sorted(rows, key=lambda r: r["tokens"]):
        ok_run = r.get("status") == "ok"
        targets = []
        if judged and r["tokens"] >= PREP_LARGE_TOKENS:
            tbps = r.get("tbps") if ok_run else None
            ok = tbps is not None and tbps >= PREP_BANDWIDTH_TBPS
            bw.add(ok, tbps, r["shape"])
            targets.append(f"{status_word(ok)} (≥ {PREP_BANDWIDTH_TBPS} TB/s)")
        if judged and r["tokens"] <= PREP_SMALL_TOKENS:
            us = r.get("us") if ok_run else None
            ok = us is not None and us <= PREP_LATENCY_US
            lat.add(ok, us, r["shape"])
            targets.append(f"{status_word(ok)} (≤ {PREP_LATENCY_US:g} µs)")
        out.append(cli_row(r, r["shape"], "; ".join(targets)))
    out.append("")
    return out


def prep_py_rows(op, rows, checks):
    out = [f"#### {op} — Python (`bench/prep.py`), fp8mla vs anchors\n", *PY_TABLE]
    if op in PREP_PY_BANDWIDTH:
        bw = check(checks, (op, "bandwidth", "Python"),
                   f"{op}: ≥ {PREP_BANDWIDTH_TBPS} TB/s at T ≥ {PREP_LARGE_TOKENS // 1024}k",
                   "Python")
    if op in PREP_PY_COMPILE:
        ratio_check = check(
            checks, (op, "compile", "Python"),
            f"{op}: ≥ {PREP_COMPILE_RATIO}x the torch.compile anchor at T ≥ "
            f"{PREP_LARGE_TOKENS // 1024}k", "Python", "x", ".2f")
    judged_bw = set()
    for r in sorted(rows, key=lambda r: r["tokens"]):
        targets = []
        large = r["tokens"] >= PREP_LARGE_TOKENS
        fp8_ok = r.get("fp8mla_status") == "ok"
        if op in PREP_PY_BANDWIDTH and large and r["shape"] not in judged_bw:
            # One fp8mla time per shape, judged on its first row (the others repeat it).
            judged_bw.add(r["shape"])
            tbps = r.get("fp8mla_tbps") if fp8_ok else None
            ok = tbps is not None and tbps >= PREP_BANDWIDTH_TBPS
            bw.add(ok, tbps, r["shape"])
            targets.append(f"{status_word(ok)} (≥ {PREP_BANDWIDTH_TBPS} TB/s)")
        if op in PREP_PY_COMPILE and large and r["anchor"] == PREP_COMPILE_ANCHOR:
            if r.get("anchor_status") == "ok" or not fp8_ok:
                ratio = r.get("ratio")
                ok = ratio is not None and ratio >= PREP_COMPILE_RATIO
                ratio_check.add(ok, ratio, r["shape"])
                targets.append(f"{status_word(ok)} (≥ {PREP_COMPILE_RATIO}x)")
            else:
                targets.append("anchor n/a")
        out.append(py_row(r, r["shape"], targets))
    out.append("")
    return out


def prep_row_checks(cli):
    """The summary line that every C++ row ran and matched the CPU."""
    rows = cli.get("results", [])
    bad = [f"{r['op']} {r['shape']}" for r in rows
           if r.get("status") != "ok" or not (str(r.get("check", "")).startswith("ok") or
                                              r.get("check") == "not checked")]
    unchecked = sum(1 for r in rows if r.get("check") == "not checked")
    note = f" ({unchecked} not checked)" if unchecked else ""
    return [f"| every C++ row ran and is bit-exact vs the CPU on its first tokens{note} | "
            f"C++ | {len(rows)} | — | {', '.join(bad) if bad else '—'} | {status_word(not bad)} |"]


def prep_build_section(cli, py, cli_path, py_path, analysis=None, plot=None):
    device = (cli or py)["device"]
    run_id = f"prep | {device} | " + " | ".join(d["date"] for d in (cli, py) if d)
    cli_setup = (f"H = {cli.get('heads')}, page size {cli.get('page_size')}, RoPE "
                 f"{cli.get('rope_style')}, ") if cli else ""
    cli_timing = f"; {'queued, run back to back' if cli.get('queued') else 'host-paced'}" \
        if cli else ""
    py_setup = f"H = {py.get('heads')}, page size {py.get('page_size')}, " if py else ""
    lines = run_section(run_id, cli, py, cli_path, py_path, cli_setup, cli_timing, py_setup)
    checks = {}
    body = []
    for title, cli_ops, py_ops in PREP_GROUPS:
        part, noted = [], set()
        for source, ops, rows_of in ((cli, cli_ops, prep_cli_rows), (py, py_ops, prep_py_rows)):
            for op in ops if source else []:
                rows = [r for r in source["results"] if r["op"] == op]
                if not rows:
                    continue
                if op in PREP_NOTES and op not in noted:
                    noted.add(op)
                    part.append(f"{PREP_NOTES[op]}\n")
                part += rows_of(op, rows, checks)
        if part:
            body.append(f"### {title}\n")
            body += part
    return run_id, section_end(lines, checks, body, analysis, plot,
                               prep_row_checks(cli) if cli else ())


# ---- MLA layer (`--kind layer`): fp8mla bench layer and bench/layer.py ------------------------

# docs/design.md section 9 / the layer issue: the FP8 path against the BF16 path and eager PyTorch.
LAYER_TARGET_VS_BF16, LAYER_TARGET_VS_EAGER = 1.5, 2.0


def layer_markdown(cli, py, markdown_path, analysis=None):
    """RESULTS_layer.md of one run: the fp8 path against bf16, bf16w and eager, then stages."""
    eager = {(r["tokens"], r["prefix"]): r for r in py["rows"] if r.get("path", "eager") == "eager"}
    ours = {(r["path"], r["tokens"], r["prefix"]): r for r in cli["rows"]}
    timer = py.get("timer", "anchors.bench")
    lines = [
        "# MLA layer prefill benchmark results",
        "",
        "Written by `bench/report.py --kind layer` from `fp8mla bench layer --json` (C++, CUDA "
        "events around `MlaLayer::prefill`) and `bench/layer.py --json` (the layer from Python, "
        f"an engine's layer and eager PyTorch BF16; {timer}), both run in one device session on the same shapes. DeepSeek-V3 preset, "
        "one sequence of T new tokens, with no prefix or a cached prefix of T tokens (one-shot "
        "up to 8192 prefix keys, chunks of 8192 above). Paths: **fp8** = FP8 block-scaled "
        "weights + the `fp8-hopper` backend (FP8 GEMMs, FP8 attention); **bf16** = the same "
        "weights + `bf16-hopper` (FP8 GEMMs, BF16 attention); **bf16w** = bf16 weights + "
        "`bf16-hopper` (all BF16). Ratios are times divided (> 1: the fp8 path is faster). "
        f"Targets: fp8 >= {LAYER_TARGET_VS_BF16}x the BF16 path, >= {LAYER_TARGET_VS_EAGER}x "
        "eager PyTorch.",
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
            f"{e_ms if e_ms is None else f'{e_ms:.2f}'} | {ratio(b['ms'], LAYER_TARGET_VS_BF16)} | "
            f"{ratio(bw['ms'], LAYER_TARGET_VS_BF16)} | {ratio(e_ms, LAYER_TARGET_VS_EAGER)} | "
            f"{tflops:.0f} |")
    lines += ["", "Per-stage milliseconds (one run with stage events):", "",
              "| path | T | prefix | projections | prep | prefix keys | attention | merge | o_proj |",
              "|---|---|---|---|---|---|---|---|---|"]
    for (path, T, prefix), r in sorted(ours.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        lines.append(f"| {path} | {T} | {prefix} | {r['projections_ms']:.2f} | {r['prep_ms']:.2f} | "
                     f"{r['prefix_ms']:.2f} | {r['attention_ms']:.2f} | {r['merge_ms']:.2f} | "
                     f"{r['output_ms']:.2f} |")
    lines += python_twin_table(py)
    used = sorted({r.get("attention_backend", "") for r in eager.values() if "ms" in r})
    lines += ["", f"Eager attention ran on: {', '.join(used)} (cuDNN where it takes the mask)."]
    if analysis:
        link = os.path.relpath(analysis, os.path.dirname(markdown_path))
        lines += ["", f"Analysis of this run: [{link}]({link})."]
    errors = [r for r in py["rows"] if "error" in r]
    if errors:
        lines += ["", "Python rows that failed (reported, not hidden):", ""]
        lines += [f"- {r.get('path', 'eager')} T={r['tokens']} prefix={r['prefix']}: {r['error']}"
                  for r in errors]
    return "\n".join(lines) + "\n"


def python_twin_table(py):
    """bench/layer.py's rows, all timed in its one process: fp8mla's two paths from Python, the
    engine row (FP8 GEMMs + FA3 bf16) and eager PyTorch, and the FP8 path against each."""
    rows = {(r["path"], r["tokens"], r["prefix"]): r for r in py["rows"] if "path" in r}
    if not any(p == "engine" or p == "fp8" for p, _, _ in rows):
        return []
    names = ["fp8", "bf16", "engine", "eager"]
    lines = ["", f"From Python, one process, {py.get('rounds', 1)} interleaved rounds (bench/layer.py; "
             "engine = the same FP8 block-scaled GEMMs through torch's scaled_mm, q_a and kv_a as "
             "one GEMM, torch.compile'd RMSNorm and RoPE, K assembled in torch, FA3 bf16 "
             "attention), ms:", "",
             "| T | prefix | " + " | ".join(names) + " | fp8 vs bf16 | fp8 vs engine | fp8 vs eager |",
             "|---|---|" + "---:|" * (len(names) + 3)]
    shapes = sorted({(T, prefix) for _, T, prefix in rows})
    for T, prefix in shapes:
        ms = {n: rows.get((n, T, prefix), {}).get("ms") for n in names}
        cells = [f"{ms[n]:.3f}" if ms[n] else "—" for n in names]
        ratios = [f"{ms[n] / ms['fp8']:.2f}x" if ms[n] and ms["fp8"] else "—"
                  for n in ("bf16", "engine", "eager")]
        lines.append(f"| {T} | {prefix} | " + " | ".join(cells + ratios) + " |")
    return lines


# ---- Plots ------------------------------------------------------------------------------------

def plot_bandwidth(kind, doc, path):
    """TB/s against bytes moved (log x), one panel per op, fp8mla and each anchor, the device
    copy (and for prep the 3.8 TB/s target) as lines: the PNG of bench/quant.py or prep.py."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results, ceiling, device = doc["results"], doc["copy_ceiling_tbps"], doc["device"]
    order = OPS if kind == "quant" else [g for _, _, ops in PREP_GROUPS for g in ops]
    ops = [op for op in dict.fromkeys(order) if any(r["op"] == op for r in results)]
    cols = 2
    nrows = max(1, math.ceil(len(ops) / cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(7 * cols, 4.5 * nrows), squeeze=False)
    markers = {"kv_c": "o", "kv_c+k_pe": "s", "per_head": "^", "1M rows": "*", "hidden": "o",
               "attn_out": "s"}
    colors = {"fp8mla": "tab:red", "seed_triton": "tab:blue", "torch_eager": "tab:gray",
              "torch_compile": "tab:green"}
    for ax, op in zip(axes.flat, ops):
        series = {}
        for r in (r for r in results if r["op"] == op):
            fam = r["family"] if kind == "quant" else None
            if r["fp8mla_tbps"]:
                series.setdefault(("fp8mla", fam), {})[r["bytes"]] = r["fp8mla_tbps"]
            if r["anchor_tbps"]:
                series.setdefault((r["anchor"], fam), {})[r["bytes"]] = r["anchor_tbps"]
        for (impl, fam), pts in sorted(series.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
            xs = sorted(pts)
            ax.plot(xs, [pts[x] for x in xs], marker=markers.get(fam, "o" if fam is None else "x"),
                    color=colors.get(impl), label=impl if fam is None else f"{impl} ({fam})",
                    linewidth=1, markersize=4)
        if ceiling:
            ax.axhline(ceiling, color="black", linestyle="--", linewidth=1,
                       label=f"device copy {ceiling:.2f} TB/s")
        if kind == "prep" and op in PREP_PY_BANDWIDTH:
            ax.axhline(PREP_BANDWIDTH_TBPS, color="tab:red", linestyle=":", linewidth=1,
                       label=f"target {PREP_BANDWIDTH_TBPS} TB/s")
        ax.set_xscale("log")
        ax.set_xlabel("bytes moved (input + output + scales)" if kind == "quant" else
                      "bytes moved (inputs read + outputs written)")
        ax.set_ylabel("TB/s")
        ax.set_title(op)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6 if kind == "quant" else 7)
    for ax in list(axes.flat)[len(ops):]:
        ax.axis("off")
    fig.suptitle(f"fp8mla quantization vs anchors, {device}" if kind == "quant" else
                 f"fp8mla MLA prep ops vs anchors, H={doc.get('heads')}, {device}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", choices=["quant", "prep", "attention", "layer"], default="quant",
                   help="which benchmark's results (default quant)")
    p.add_argument("--cli", help="JSON of `fp8mla bench KIND --json` (quant, prep, layer)")
    p.add_argument("--py", help="JSON of bench/KIND.py")
    p.add_argument("--out", default=None,
                   help="markdown file to update (default bench/RESULTS.md for quant, else "
                        "bench/RESULTS_KIND.md)")
    p.add_argument("--analysis", help="markdown file explaining the misses, placed under the "
                                      "targets (layer: linked)")
    p.add_argument("--plot", help="the run's PNG, linked from the section (path relative to --out)")
    args = p.parse_args()
    out = args.out or os.path.join(
        here, "RESULTS.md" if args.kind == "quant" else f"RESULTS_{args.kind}.md")
    docs = []
    for path in (args.cli, args.py):
        if path:
            with open(path) as fh:
                docs.append(json.load(fh))
        else:
            docs.append(None)
    cli, py = docs
    if args.kind == "attention":
        # Imported here: report_attention imports this module's cells and checks.
        from report_attention import attention_section, prepend_attention_section
        if not py:
            sys.exit("report.py: --kind attention needs --py")
        prepend_attention_section(out, attention_section(py))
        print(f"report.py: put the attention run of {py['meta']['date']} first in {out}")
        return
    if args.kind == "layer":
        if not cli or not py:
            sys.exit("report.py: --kind layer needs --cli and --py")
        with open(out, "w") as fh:
            fh.write(layer_markdown(cli, py, out, args.analysis))
        print(f"report.py: wrote {out}")
        return
    if not cli and not py:
        sys.exit("report.py: give --cli and/or --py")
    analysis = open(args.analysis).read() if args.analysis else None
    if args.kind == "prep":
        run_id, section = prep_build_section(cli, py, args.cli, args.py, analysis, args.plot)
        update(out, run_id, section, PREP_TITLE, PREP_PREAMBLE)
    else:
        run_id, section = build_section(cli, py, args.cli, args.py, analysis, args.plot)
        update(out, run_id, section)
    print(f"report.py: wrote the section '{run_id}' into {out}")


if __name__ == "__main__":
    main()
