#!/usr/bin/env python3
"""Where a kernel's instructions and warp-state samples go, from Nsight Compute's source view
exported as CSV: `ncu --import R.ncu-rep --csv --page source --print-source sass > F.csv` (the
report taken with `--section SourceCounters`; one section per profiled launch). For each kernel:

- totals: instructions executed (warp-level) and warp-state samples;
- bands: the SASS grouped by how often each instruction ran, to two significant digits. In a
  kernel that runs key tile after key tile, the code of a key tile, of a work tile and of a CTA
  fall into separate bands; an inner loop meant to run once a tile shows as a band of its own;
- regions: the largest runs of consecutive instructions of one band, with their samples;
- opcodes: the largest band's instructions by opcode, per run of the band (what a key tile's
  turn is made of, where the band is the main loop);
- retry loops: each mbarrier wait (`SYNCS.PHASECHK ... TRYWAIT`) that sleeps and tries again
  (NANOSLEEP after it), how often it ran, and how often the first try that branches to it ran:
  a wait meant to pass at once that retries is the sign of a role waiting for another.

With --diff, two launches of one kernel (the same SASS, other arguments: a variant picked at run
time) are compared block by block of --block instructions.

    python3 bench/ncu_source.py F.csv [--kernel I] [--top N] [--diff I J] [--block 100]

bench/analysis/attention-vtok-transpose-2026-12-04.md is a reading made this way.
"""
from __future__ import annotations

import argparse
import csv
import io
import math
import sys

from kernel_resources import BRANCH_TARGET

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def read_kernels(text):
    """[(kernel name, [row dicts])] of the CSV, one entry a profiled launch."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith('"Kernel Name"')]
    kernels = []
    for a, b in zip(starts, starts[1:] + [len(lines)]):
        name = next(csv.reader([lines[a]]))[1]
        rows = list(csv.DictReader(io.StringIO("\n".join(lines[a + 1:b]))))
        kernels.append((name, rows))
    return kernels


def number(text):
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return 0.0


def executed(row):
    return number(row.get(EXECUTED, 0))


def samples(row):
    return number(row.get(SAMPLES, 0))


def band_of(count):
    """count to two significant digits (0 for code that never ran)."""
    if count <= 0:
        return 0.0
    digits = math.floor(math.log10(count)) - 1
    return round(count / 10**digits) * 10**digits


def bands(rows):
    """[(band, instructions executed in it, SASS lines)], most instructions first."""
    totals = {}
    for r in rows:
        b = band_of(executed(r))
        if b:
            n, lines = totals.get(b, (0.0, 0))
            totals[b] = (n + executed(r), lines + 1)
    return sorted(((b, n, lines) for b, (n, lines) in totals.items()), key=lambda t: -t[1])


def opcode(source):
    """The mnemonic of a SASS line without its predicate and modifiers (`FADD` of
    `@!P0 FADD.FTZ R1, R2, R3`)."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def opcodes(rows, band):
    """[(opcode, instructions per run, samples)] of the SASS lines of `band`, most first."""
    totals = {}
    for r in rows:
        if band_of(executed(r)) == band:
            n, s = totals.get(opcode(r["Source"]), (0.0, 0.0))
            totals[opcode(r["Source"])] = (n + executed(r) / band, s + samples(r))
    return sorted(((op, n, s) for op, (n, s) in totals.items()), key=lambda t: -t[1])


def regions(rows):
    """[(first, last, band, instructions, samples)] of the runs of one band, largest first."""
    runs, current = [], None
    for i, r in enumerate(rows):
        b = band_of(executed(r))
        if current and b and current[2] == b and current[1] == i - 1:
            current[1] = i
            current[3] += executed(r)
            current[4] += samples(r)
        elif b:
            current = [i, i, b, executed(r), samples(r)]
            runs.append(current)
    return sorted((tuple(run) for run in runs), key=lambda t: -t[3])


def retry_loops(rows):
    """[(address, wait source, retries, first tries)]: waits followed by a NANOSLEEP, and the
    count of the wait whose failure branches into the loop (0 where none is found)."""
    address_of = {r["Address"]: i for i, r in enumerate(rows)}
    entries = {}  # branch target row -> rows that branch there
    for i, r in enumerate(rows):
        m = BRANCH_TARGET.search(r["Source"])
        if m and m.group(1) in address_of:
            entries.setdefault(address_of[m.group(1)], []).append(i)
    loops = []
    for i, r in enumerate(rows):
        if "TRYWAIT" not in r["Source"] or executed(r) <= 0:
            continue
        if not any("NANOSLEEP" in rows[j]["Source"] for j in range(i + 1, min(i + 3, len(rows)))):
            continue
        first = 0.0
        for entry in range(i, max(i - 4, -1), -1):
            # The branches into the loop from outside it (its own back branch excluded).
            outside = [j for j in entries.get(entry, []) if not entry <= j <= i + 3]
            for source in outside:
                tries = [rows[j] for j in range(max(source - 3, 0), source) if
                         "TRYWAIT" in rows[j]["Source"]]
                first += sum(executed(t) for t in tries[-1:])
            if outside:
                break
        loops.append((r["Address"], r["Source"].strip(), executed(r), first))
    return sorted(loops, key=lambda t: -t[2])


def millions(x):
    return f"{x / 1e6:.2f} M"


def report(name, rows, top):
    total, sampled = sum(map(executed, rows)), sum(map(samples, rows))
    out = [f"## {name[:120]}", "",
           f"{len(rows)} SASS lines, {millions(total)} instructions executed, "
           f"{sampled:.0f} warp-state samples", "",
           "| runs per instruction | instructions | share | SASS lines |", "|---:|---:|---:|---:|"]
    for b, n, lines in bands(rows)[:top]:
        out.append(f"| {b:.3g} | {millions(n)} | {100 * n / total:.1f} % | {lines} |")
    top_band = bands(rows)[0][0] if total else 0.0
    by_op = opcodes(rows, top_band)
    out += ["", f"| opcode (band {top_band:.3g}) | per run | samples |", "|---|---:|---:|"]
    out += [f"| {op} | {n:.0f} | {s:.0f} |" for op, n, s in by_op[:top]]
    out.append(f"| all | {sum(n for _, n, _ in by_op):.0f} | {sum(s for _, _, s in by_op):.0f} |")
    out += ["", "| SASS lines | runs per instruction | instructions | samples | first / last |",
            "|---|---:|---:|---:|---|"]
    for first, last, b, n, s in regions(rows)[:top]:
        head, tail = rows[first]["Source"].strip()[:40], rows[last]["Source"].strip()[:40]
        out.append(f"| {first}-{last} | {b:.3g} | {millions(n)} | {s:.0f} | `{head}` / `{tail}` |")
    loops = retry_loops(rows)
    out += ["", "| retry loop | wait | retries | first tries |", "|---|---|---:|---:|"]
    out += [f"| {a} | `{src[:60]}` | {millions(n)} | {millions(f)} |" for a, src, n, f in loops]
    if not loops:
        out.append("| (none ran) | | | |")
    return "\n".join(out)


def diff(a, b, block, top):
    """Blocks of `block` SASS lines whose samples or instructions differ most between a and b."""
    if len(a) != len(b):
        raise SystemExit(f"ncu_source.py --diff: the kernels differ in SASS ({len(a)} and {len(b)} "
                         "lines): expected two launches of one kernel")
    out = ["| SASS lines | instructions a / b | samples a / b | first line |",
           "|---|---:|---:|---|"]
    rows = []
    for i in range(0, len(a), block):
        ia, ib = sum(map(executed, a[i:i + block])), sum(map(executed, b[i:i + block]))
        sa, sb = sum(map(samples, a[i:i + block])), sum(map(samples, b[i:i + block]))
        rows.append((abs(sb - sa) + abs(ib - ia) / 1e3, i, ia, ib, sa, sb))
    for _, i, ia, ib, sa, sb in sorted(rows, reverse=True)[:top]:
        out.append(f"| {i}-{min(i + block, len(a)) - 1} | {millions(ia)} / {millions(ib)} | "
                   f"{sa:.0f} / {sb:.0f} | `{a[i]['Source'].strip()[:40]}` |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--kernel", type=int, action="append", help="launch index (default: all)")
    ap.add_argument("--top", type=int, default=12, help="rows of each table")
    ap.add_argument("--diff", type=int, nargs=2, metavar=("I", "J"))
    ap.add_argument("--block", type=int, default=100)
    args = ap.parse_args(argv)
    with open(args.csv, encoding="utf-8") as f:
        kernels = read_kernels(f.read())
    if not kernels:
        raise SystemExit(f"ncu_source.py: no kernel section in {args.csv}: expected ncu's source "
                         "page as CSV (--csv --page source --print-source sass)")
    for i in args.kernel or range(len(kernels)):
        print(f"# launch {i}\n\n" + report(*kernels[i], args.top) + "\n")
    if args.diff:
        i, j = args.diff
        print(f"# launch {i} against launch {j}\n\n" +
              diff(kernels[i][1], kernels[j][1], args.block, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
