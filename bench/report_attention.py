"""The prefill attention report (`report.py --kind attention`, bench/attention.py): the shape
table, the ratios against FlashAttention-3 and cuDNN, the targets, the RESULTS_attention.md section
and the ratio plot. The shared cells and target checks are report.py's."""
from __future__ import annotations

import os

from report import check, fmt, status_word, summary

# ---- Prefill attention (`--kind attention`): bench/attention.py ------------------------------

ATTENTION_DQK, ATTENTION_DV = 192, 128
# The ragged shape: new tokens per sequence, each on its own prefix (cached keys before them).
RAGGED_NEW, RAGGED_PREFIX = [3000, 17, 700, 5000, 1, 2200], [4096, 0, 1000, 2048, 8191, 512]
# The shapes bench/attention.py runs: (name, new tokens per sequence, prefix per sequence, heads,
# causal); sequence b has q_len = new[b] queries and k_len = prefix[b] + new[b] keys.
ATTENTION_SHAPES = [
    ("1k", [1024], [0], 128, True),
    ("2k", [2048], [0], 128, True),
    ("4k", [4096], [0], 128, True),
    ("8k", [8192], [0], 128, True),
    ("8k-full", [8192], [0], 128, False),
    ("16k", [16384], [0], 128, True),
    ("32k", [32768], [0], 128, True),
    ("16x1k", [1024] * 16, [0] * 16, 128, True),
    ("16x1k-full", [1024] * 16, [0] * 16, 128, False),
    ("8k+8k", [8192], [8192], 128, True),
    ("4x4k+4k", [4096] * 4, [4096] * 4, 128, True),
    ("ragged+prefix", RAGGED_NEW, RAGGED_PREFIX, 128, True),
    ("h16-8k", [8192], [0], 16, True),
    ("h16-32k", [32768], [0], 16, True),
    ("h16-64k", [65536], [0], 16, True),
]
# Ratios of one shape: baseline time / implementation time (> 1: the implementation is faster).
ATTENTION_RATIOS = {"e4m3_vs_fa3": ("fa3_e4m3", "fp8mla_e4m3"),
                    "bf16_vs_fa3": ("fa3_bf16", "fp8mla_bf16"),
                    "lse": ("fp8mla_e4m3", "fp8mla_e4m3_lse"),
                    "vtok": ("fp8mla_e4m3", "fp8mla_e4m3_vtok"),
                    "krope": ("fp8mla_e4m3", "fp8mla_e4m3_krope"),
                    "e4m3_vs_cudnn": ("cudnn_bf16", "fp8mla_e4m3"),
                    "bf16_vs_cudnn": ("cudnn_bf16", "fp8mla_bf16")}
# Targets: docs/design.md section 9 (FA3 bar and goal, 1,050 TFLOP/s at >= 16k causal H = 128,
# 650 at 16 x 1k causal), the bf16 kernel against FA3 bf16, and the two e4m3 variants (with an
# LSE, with token-major V) at most 3 % slower than fp8mla_e4m3.
FA3_BAR, FA3_GOAL, BF16_FA3_BAR = 1.00, 1.10, 1.00
LONG_CAUSAL = (("16k", "32k"), 1050.0)
RAGGED_CAUSAL = (("16x1k",), 650.0)
VARIANT_SLOWDOWN = 0.03
ATTENTION_HEADER = (
    "# Prefill attention benchmark results\n\nWritten by `bench/attention.py` (see its docstring "
    "for the method); newest run first. TFLOP/s counts only the visible (unmasked) half for "
    "causal rows.\n\n")


def attention_row(rows, shape, impl):
    """The row of `impl` at `shape` that ran, or None."""
    return next((r for r in rows if r["shape"] == shape and r["impl"] == impl
                 and r["status"] == "ok"), None)


def attention_shapes(rows):
    """The shapes of `rows`, in their order."""
    return list(dict.fromkeys(r["shape"] for r in rows))


def attention_ratios(rows):
    """{shape: {ratio key: baseline us / impl us, or None where either did not run}}."""
    out = {}
    for shape in attention_shapes(rows):
        out[shape] = {}
        for key, (base, impl) in ATTENTION_RATIOS.items():
            b, r = attention_row(rows, shape, base), attention_row(rows, shape, impl)
            out[shape][key] = b["us"] / r["us"] if b and r else None
    return out


def slowdown(ratio):
    """Time change of a variant from its ratio to fp8mla_e4m3 (0.03: 3 % slower)."""
    return None if ratio is None else 1.0 / ratio - 1.0


def attention_checks(rows):
    """The targets, judged on every shape of `rows` (a shape where an implementation a target
    needs did not run counts as missed, marked 'n/a')."""
    ratios, checks = attention_ratios(rows), {}

    def judge(c, value, ok, where):
        c.add(value is not None and ok(value), value, where if value is not None
              else f"{where} (n/a)")

    for shape, ratio in ratios.items():
        for key, what, bound, kind in (("e4m3_vs_fa3", "e4m3", FA3_BAR, "bar"),
                                       ("e4m3_vs_fa3", "e4m3", FA3_GOAL, "goal"),
                                       ("bf16_vs_fa3", "bf16", BF16_FA3_BAR, "bar")):
            c = check(checks, (key, kind), f"fp8mla {what} ≥ {bound:.2f}x FA3 {what} on every "
                      f"shape ({kind})", "time ratio", unit="x", fmt_spec=".2f")
            judge(c, ratio[key], lambda v, b=bound: v >= b, shape)
        for key, what in (("lse", "with an LSE"), ("vtok", "with token-major V")):
            c = check(checks, key, f"fp8mla e4m3 {what}: ≤ {VARIANT_SLOWDOWN:.0%} slower than "
                      "without, on every shape", "time change", unit="", fmt_spec="+.1%",
                      lower_is_worse=False)
            judge(c, slowdown(ratio[key]), lambda v: v <= VARIANT_SLOWDOWN, shape)
    for (shapes, bound), what in ((LONG_CAUSAL, "16k and 32k causal, H = 128"),
                                  (RAGGED_CAUSAL, "16 x 1k causal")):
        c = check(checks, ("tflops", shapes), f"fp8mla e4m3 ≥ {bound:,.0f} TFLOP/s at {what}",
                  "TFLOP/s", unit=" TFLOP/s", fmt_spec=".0f")
        for shape in (s for s in shapes if s in ratios):
            r = attention_row(rows, shape, "fp8mla_e4m3")
            judge(c, r["tflops"] if r else None, lambda v, b=bound: v >= b, shape)
    return checks


def shape_legend(rows):
    """One line per shape: new tokens, prefixes, heads, mask."""
    out = []
    for shape in attention_shapes(rows):
        r = next(r for r in rows if r["shape"] == shape)
        q, p = r["q_lens"], r["prefix_lens"]
        lens = f"{len(q)} x {q[0]}" if len(set(q)) == 1 and len(q) > 1 else "/".join(map(str, q))
        if len(set(p)) > 1:
            lens += " new on prefixes " + "/".join(map(str, p))
        elif p[0]:
            lens += f" new, {'each ' if len(p) > 1 else ''}on a prefix of {p[0]}"
        out.append(f"{shape}: {lens}, H = {r['heads']}, {'causal' if r['causal'] else 'full'}")
    return out


def tflops_cell(r):
    return "—" if r is None else f"{r['tflops']:.0f}"


def pair_cell(a, b, key, spec):
    """'a / b' of a clock key of two rows (fp8mla e4m3, FA3 e4m3)."""
    vals = [fmt(((r or {}).get("clock") or {}).get(key), spec) for r in (a, b)]
    return " / ".join(vals)


def ratio_cell(v, spec=".2f", suffix="x"):
    return "—" if v is None else f"{format(v, spec)}{suffix}"


def attention_shape_table(rows):
    """The table of one line per shape."""
    ratios = attention_ratios(rows)
    out = ["| shape | fp8mla e4m3 | FA3 e4m3 | ratio | LSE | vtok | fp8mla bf16 | FA3 bf16 | "
           "ratio | cuDNN | MHz | W |", "|---|" + "---:|" * 11]
    for shape, ratio in ratios.items():
        get = {impl: attention_row(rows, shape, impl) for impl in
               ("fp8mla_e4m3", "fa3_e4m3", "fp8mla_bf16", "fa3_bf16", "cudnn_bf16")}
        cudnn = "—" if get["cudnn_bf16"] is None else (
            f"{tflops_cell(get['cudnn_bf16'])} ({ratio_cell(ratio['e4m3_vs_cudnn'])} / "
            f"{ratio_cell(ratio['bf16_vs_cudnn'])})")
        out.append("| " + " | ".join([
            shape, tflops_cell(get["fp8mla_e4m3"]), tflops_cell(get["fa3_e4m3"]),
            ratio_cell(ratio["e4m3_vs_fa3"]), ratio_cell(slowdown(ratio["lse"]), "+.1%", ""),
            ratio_cell(slowdown(ratio["vtok"]), "+.1%", ""), tflops_cell(get["fp8mla_bf16"]),
            tflops_cell(get["fa3_bf16"]), ratio_cell(ratio["bf16_vs_fa3"]), cudnn,
            pair_cell(get["fp8mla_e4m3"], get["fa3_e4m3"], "sm_mhz_median", ".0f"),
            pair_cell(get["fp8mla_e4m3"], get["fa3_e4m3"], "power_w_mean", ".0f")]) + " |")
    return out


def attention_impl_table(rows):
    """The table of one line per shape and implementation."""
    out = ["| shape | impl | TFLOP | µs | µs per round (min–max) | calls per round | TFLOP/s | "
           "MHz | capped | W | J per call | TFLOP/J |", "|---|---|" + "---:|" * 10]
    for r in rows:
        head = [r["shape"], r["impl"], f"{r['tflop']:.3f}"]
        if r["status"] != "ok":
            out.append("| " + " | ".join(head + [r["status"].replace("|", "/")] + [""] * 9) + " |")
            continue
        c = r.get("clock") or {}
        out.append("| " + " | ".join(head + [
            f"{r['us']:.1f}", f"{min(r['us_rounds']):.1f}–{max(r['us_rounds']):.1f}",
            "/".join(map(str, sorted(set(r["calls"])))), f"{r['tflops']:.0f}",
            fmt(c.get("sm_mhz_median"), ".0f"), fmt(c.get("power_capped_share"), ".0%"),
            fmt(c.get("power_w_mean"), ".0f"), fmt(r.get("energy_j"), ".4g"),
            fmt(r.get("tflop_per_j"), ".3f")]) + " |")
    return out


def accuracy_lines(acc):
    """The accuracy case's lines: max abs error of each implementation against its float64."""
    if not acc:
        return ["- Accuracy: not run."]
    case = (f"new {'/'.join(map(str, acc['q_lens']))} on prefixes "
            f"{'/'.join(map(str, acc['prefix_lens']))}, H = {acc['heads']}, "
            f"{'causal' if acc['causal'] else 'full'}")
    out = [f"- Accuracy ({case}): max |O − O_ref| against a float64 attention of the inputs each "
           "kernel reads (dequantized e4m3, or bf16):"]
    for ref, what in (("e4m3", "dequantized e4m3 inputs"), ("bf16", "bf16 inputs")):
        cells = [f"{r['impl']} {fmt(r.get('max_abs_err'), '.3g')}" if r["status"] == "ok"
                 else f"{r['impl']} {r['status']}" for r in acc["rows"] if r["reference"] == ref]
        out.append(f"  - float64 of the {what} (max |O_ref| "
                   f"{fmt(acc['ref_max_abs'].get(ref), '.3g')}): " + "; ".join(cells) + ".")
    lse = [f"{r['impl']} {fmt(r['lse_max_abs_err'], '.2g')}" for r in acc["rows"]
           if r.get("lse_max_abs_err") is not None]
    if lse:
        out.append("  - max |LSE − LSE_ref| (natural log; the design's rule: 1e-3): "
                   + "; ".join(lse) + ".")
    return out


def attention_section(doc):
    """The markdown section of one bench/attention.py run (its JSON document)."""
    meta, rows = doc["meta"], doc["rows"]
    out = [f"<!-- run: attention | {meta['device']} | {meta['date']} -->",
           f"## {meta['date'][:10]} {meta['date'][11:16]}Z — {meta['device']}", "",
           f"- `bench/attention.py`, {meta['date']}, torch {meta['torch']}, fp8mla "
           f"{meta['fp8mla']}, FA3 {meta['fa3']}, Dqk = {ATTENTION_DQK}, Dv = {ATTENTION_DV}. "
           f"{meta['method']}",
           "- Per-shape table: TFLOP/s of each implementation; ratio = FA3 time / fp8mla time "
           "(> 1: fp8mla faster); LSE and vtok: the time of fp8mla e4m3 with an LSE and with "
           "token-major V against fp8mla e4m3; cuDNN: its TFLOP/s (fp8mla e4m3 and bf16 time "
           "ratios against it), where all sequences have one length and no prefix; MHz and W: "
           "fp8mla e4m3 / FA3 e4m3, NVML while their timed replays ran (median SM clock, mean "
           f"power from {meta['power_source']}).",
           "- Shapes: " + "; ".join(shape_legend(rows)) + ".",
           *accuracy_lines(doc.get("accuracy")), ""]
    out += summary(attention_checks(rows), "### Targets\n") + [""]
    out += attention_shape_table(rows) + ["", "Every implementation:", ""]
    out += attention_impl_table(rows)
    return "\n".join(out) + "\n"


def attention_text(doc):
    """The short console table of a run: one line per shape, then the targets."""
    rows = doc["rows"]
    out = [f"{'shape':<14} {'e4m3':>6} {'FA3':>6} {'ratio':>6} {'LSE':>7} {'vtok':>7} "
           f"{'bf16':>6} {'FA3':>6} {'ratio':>6} {'cuDNN':>6}"]
    for shape, ratio in attention_ratios(rows).items():
        cells = [tflops_cell(attention_row(rows, shape, impl)) for impl in
                 ("fp8mla_e4m3", "fa3_e4m3", "fp8mla_bf16", "fa3_bf16", "cudnn_bf16")]
        out.append(f"{shape:<14} {cells[0]:>6} {cells[1]:>6} "
                   f"{ratio_cell(ratio['e4m3_vs_fa3']):>6} "
                   f"{ratio_cell(slowdown(ratio['lse']), '+.1%', ''):>7} "
                   f"{ratio_cell(slowdown(ratio['vtok']), '+.1%', ''):>7} {cells[2]:>6} "
                   f"{cells[3]:>6} {ratio_cell(ratio['bf16_vs_fa3']):>6} {cells[4]:>6}")
    for c in attention_checks(rows).values():
        worst = fmt(c.worst, c.fmt_spec) + c.unit if c.judged else "not measured"
        status = status_word(not c.missed).replace("*", "") if c.judged else ""
        out.append(f"target {c.what}: worst {worst} {status}".rstrip())
    return out


def prepend_attention_section(path, section):
    """Puts `section` first in RESULTS_attention.md (under its header)."""
    old = open(path).read() if os.path.exists(path) else ATTENTION_HEADER
    body = old[len(ATTENTION_HEADER):] if old.startswith(ATTENTION_HEADER) else old
    with open(path, "w") as f:
        f.write(ATTENTION_HEADER + section + "\n" + body)


def plot_attention(path, doc):
    """Time ratios per shape (fp8mla against FA3 and cuDNN, and the e4m3 variants against
    fp8mla e4m3), with the 1.00x bar and the 1.10x goal as lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ratios = attention_ratios(doc["rows"])
    shapes = list(ratios)
    series = [("e4m3_vs_fa3", "fp8mla e4m3 / FA3 e4m3"), ("bf16_vs_fa3", "fp8mla bf16 / FA3 bf16"),
              ("lse", "e4m3 with LSE / without"), ("vtok", "e4m3 token-major V / transposed"),
              ("e4m3_vs_cudnn", "fp8mla e4m3 / cuDNN bf16")]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(shapes)), 4.5))
    for i, (key, label) in enumerate(series):
        ax.bar([x + width * (i - (len(series) - 1) / 2) for x in range(len(shapes))],
               [ratios[s][key] or 0 for s in shapes], width, label=label)
    ax.axhline(FA3_BAR, color="black", linewidth=1)
    ax.axhline(FA3_GOAL, color="black", linestyle="--", linewidth=1, label=f"goal {FA3_GOAL}x")
    ax.set_xticks(range(len(shapes)), shapes, rotation=30, ha="right")
    ax.set_ylabel("time ratio (> 1: fp8mla faster)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=3, loc="upper left")
    meta = doc["meta"]
    ax.set_title(f"Prefill attention, Dqk={ATTENTION_DQK}, Dv={ATTENTION_DV}, {meta['device']}, "
                 f"{meta['date'][:10]}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
