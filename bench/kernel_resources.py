#!/usr/bin/env python3
"""The resources of the prefill attention kernels of a build: for each instantiation of
`prefill_attention_kernel` (or of any kernel whose name holds --kernel) in a library, a Python
extension or an executable, its registers per thread, stack and local memory, static shared
memory, the STL / LDL instructions of its SASS (local stores and loads: spills, and any stack
frame), and its warpgroup MMA instructions: QGMMA (FP8) and HGMMA (bf16/f16), with their shapes and
where their A operand comes from (RS: registers, SS: shared memory).

With --loops, a second table: each kernel's innermost loops that issue MMAs (a backward branch
whose body holds a QGMMA or HGMMA and no such loop inside), their instructions, the sum of their
stall counts (the control field's cycles before the next instruction of the warp may issue: what
one warp needs to issue the body with nothing else waiting), and their MMA, MUFU, ldmatrix /
stmatrix and shuffle instructions. A body holds every arm of its branches, so this compares builds
of one kernel, statically, without a GPU. --loop-sass FILE writes those loops' instructions, each
with its stall count, to read a turn's schedule in.

From `cuobjdump -res-usage` and `cuobjdump -sass` (the CUDA toolkit's; found on PATH, under
$CUDA_HOME/bin or /usr/local/cuda/bin, or given with --cuobjdump); names demangled by c++filt.
The dynamic shared memory a kernel runs with is set at launch (cudaFuncSetAttribute), so the
binary does not hold it: the table shows the static part only.

    python3 bench/kernel_resources.py build/libfp8mla.a [--loops] [--loop-sass F.txt]
        [--markdown bench/analysis/F.md]
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys

from common import utc_now

FUNCTION_RES = re.compile(r"^\s*Function (\S+):\s*$")
FUNCTION_SASS = re.compile(r"^\s*Function : (\S+)\s*$")
HEADER = re.compile(r"^(arch|identifier) = (.*)$")
# An instruction line of the SASS: /*addr*/ [@predicate] OPCODE[.modifiers] operands ;
INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.\S+)?")
A_REGISTER = re.compile(r"^\s*R\d+,\s*R\d+,")
COLUMNS = ["kernel", "source", "arch", "REG", "STACK", "LOCAL", "SHARED", "STL", "LDL", "QGMMA",
           "HGMMA", "MMA shapes"]
# An instruction of `cuobjdump -sass` with its two words: /*addr*/ text ; /* low */, then a line
# holding /* high */, whose bits 41-44 are the stall count (bits 105-108 of the instruction).
SASS_LINE = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;\s*/\* 0x[0-9a-f]+ \*/\s*$")
HIGH_WORD = re.compile(r"^\s*/\* (0x[0-9a-f]+) \*/\s*$")
# A branch and its target (ncu_source.py reads the same SASS text).
BRANCH_TARGET = re.compile(r"\bBRA(?:\.\w+)*\s+(?:!?U?P\w+,\s*)?(0x[0-9a-f]+)")
LOOP_COLUMNS = ["kernel", "SASS", "instructions", "stall cycles", "MMA", "MUFU", "LDSM/STSM",
                "SHFL"]


def find_cuobjdump(given):
    home = os.environ.get("CUDA_HOME")
    candidates = [given] if given else [shutil.which("cuobjdump"),
                                        home and os.path.join(home, "bin", "cuobjdump"),
                                        "/usr/local/cuda/bin/cuobjdump"]
    candidates = list(dict.fromkeys(c for c in candidates if c))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    sys.exit(f"kernel_resources.py: cuobjdump not found (tried {candidates}); pass --cuobjdump")


def lines_of(cmd):
    """The output lines of `cmd` (exits with its error if it fails)."""
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"kernel_resources.py: {' '.join(cmd)} failed: {run.stderr.strip()[:500]}")
    return run.stdout.splitlines()


def sections(lines, function_re):
    """(arch, identifier, mangled function name, its lines) for each function of a dump."""
    arch = identifier = name = None
    body = []
    for line in lines:
        header = HEADER.match(line)
        function = function_re.match(line)
        if (header or function) and name:
            yield arch, identifier, name, body
            name, body = None, []
        if header:
            if header.group(1) == "arch":
                arch = header.group(2).strip()
            else:
                identifier = header.group(2).strip()
        elif function:
            name = function.group(1)
        elif name:
            body.append(line)
    if name:
        yield arch, identifier, name, body


def resource_usage(cuobjdump, path, kernel):
    """{(arch, identifier, name): {"REG": .., "STACK": .., "SHARED": .., "LOCAL": ..}}."""
    out = {}
    for arch, identifier, name, body in sections(lines_of([cuobjdump, "-res-usage", path]),
                                                 FUNCTION_RES):
        if kernel in name:
            fields = dict(re.findall(r"([A-Z]+(?:\[\d+\])?):(\d+)", " ".join(body)))
            out[(arch, identifier, name)] = {k: int(fields[k]) for k in
                                             ("REG", "STACK", "SHARED", "LOCAL") if k in fields}
    return out


def sass_counts(cuobjdump, path, kernel):
    """{(arch, identifier, name): Counter of STL, LDL, QGMMA, HGMMA and each MMA opcode with its
    shape}."""
    out = {}
    for arch, identifier, name, body in sections(lines_of([cuobjdump, "-sass", path]),
                                                 FUNCTION_SASS):
        if kernel not in name:
            continue
        counts = collections.Counter()
        for line in body:
            m = INSTRUCTION.match(line)
            if not m:
                continue
            op = m.group(1)
            if op in ("STL", "LDL", "QGMMA", "HGMMA"):
                counts[op] += 1
            if op.endswith("GMMA"):
                shape = (m.group(2) or "").split(".")[1:2]
                # A from registers (RS: "D, Ra, gdesc[..]") or shared memory (SS: "D, gdesc[..]").
                a_from = "RS" if A_REGISTER.search(line[m.end():]) else "SS"
                counts[f"{op}.{shape[0]} {a_from}" if shape else op] += 1
        out[(arch, identifier, name)] = counts
    return out


def instructions(body):
    """[(address, text, stall count)] of a function's SASS lines."""
    out = []
    for line, nxt in zip(body, body[1:]):
        m, high = SASS_LINE.match(line), HIGH_WORD.match(nxt)
        if m and high:
            out.append((int(m.group(1), 16), m.group(2), (int(high.group(1), 16) >> 41) & 0xF))
    return out


def mma_loops(ins):
    """[(first, last) address] of the innermost loops that issue MMAs, in address order. A
    backward branch over an EXIT is no loop: the out-of-line retry of a barrier wait, placed after
    the function's body, branches back into it."""
    loops = []
    for address, text, _ in ins:
        m = BRANCH_TARGET.search(text)
        if m and int(m.group(1), 16) <= address:
            first = int(m.group(1), 16)
            body = [t for a, t, _ in ins if first <= a <= address]
            if any("GMMA" in t for t in body) and not any(t.split()[-1] == "EXIT" for t in body):
                loops.append((first, address))
    return sorted(loop for loop in set(loops) if not any(
        other != loop and loop[0] <= other[0] and other[1] <= loop[1] for other in loops))


def loop_rows(cuobjdump, path, kernel):
    """One dict per MMA loop of each kernel (LOOP_COLUMNS), and each loop's instructions under
    "listing": [(address, stall count, text)]."""
    rows, named = [], []
    for _, _, name, body in sections(lines_of([cuobjdump, "-sass", path]), FUNCTION_SASS):
        if kernel not in name:
            continue
        ins = instructions(body)
        for first, last in mma_loops(ins):
            loop = [(a, stall, t) for a, t, stall in ins if first <= a <= last]
            ops = [t.split()[1] if t.startswith("@") else t.split()[0] for _, _, t in loop]
            rows.append({"kernel": name, "SASS": f"{first:#x}-{last:#x}",
                         "instructions": len(loop), "stall cycles": sum(s for _, s, _ in loop),
                         "MMA": sum("GMMA" in o for o in ops),
                         "MUFU": sum(o.startswith("MUFU") for o in ops),
                         "LDSM/STSM": sum(o.startswith(("LDSM", "STSM")) for o in ops),
                         "SHFL": sum(o.startswith("SHFL") for o in ops), "listing": loop})
            named.append(name)
    names = demangle(sorted(set(named)))
    for r in rows:
        r["kernel"] = names[r["kernel"]]
    return rows


def loop_listing(rows):
    """The loops' instructions as text: a header a loop, then one line an instruction with its
    address and stall count (the cycles before the warp's next instruction may issue), the form
    to read a turn's schedule in (runs of MUFU.EX2 at 8 cycles each with nothing between, where
    the warp's chain waits on the XU)."""
    out = []
    for r in rows:
        out.append(f"# {r['kernel']} {r['SASS']}: {r['instructions']} instructions, "
                   f"{r['stall cycles']} stall cycles")
        out += [f"{a:#07x} {stall:2d}  {text}" for a, stall, text in r["listing"]]
    return "\n".join(out) + "\n"


def demangle(names):
    """{mangled: readable} through c++filt, namespaces dropped (the names as given without
    c++filt)."""
    if not names or not shutil.which("c++filt"):
        return {n: n for n in names}
    run = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    plain = run.stdout.splitlines() if run.returncode == 0 else names
    return {n: re.sub(r"\b(?:\w+::)+", "", p).removeprefix("void ")
            for n, p in zip(names, plain)}


def table_rows(cuobjdump, path, kernel):
    """One dict per kernel (COLUMNS), in the order of the binary."""
    res = resource_usage(cuobjdump, path, kernel)
    sass = sass_counts(cuobjdump, path, kernel)
    keys = list(dict.fromkeys(list(res) + list(sass)))
    names = demangle(sorted({k[2] for k in keys}))
    rows = []
    for key in keys:
        arch, identifier, name = key
        r, c = res.get(key, {}), sass.get(key, collections.Counter())
        shapes = ", ".join(f"{op} x{n}" for op, n in sorted(c.items()) if "GMMA." in op)
        rows.append({"kernel": names[name], "source": os.path.basename(identifier or "") or "—",
                     "arch": arch or "—", **{k: r.get(k, "—") for k in
                                             ("REG", "STACK", "LOCAL", "SHARED")},
                     **{k: c[k] for k in ("STL", "LDL", "QGMMA", "HGMMA")},
                     "MMA shapes": shapes or "—"})
    return rows


def markdown(path, rows, cuobjdump):
    version = (lines_of([cuobjdump, "--version"]) or ["?"])[-1]
    out = [f"### Kernel resources of `{path}` ({utc_now()})", "",
           f"`cuobjdump -res-usage` and `-sass` ({version}). REG: registers per thread; STACK, "
           "LOCAL, SHARED: bytes (SHARED static only: the dynamic shared memory is set at "
           "launch); STL / LDL: local stores / loads in the SASS (spills and stack frames); "
           "QGMMA / HGMMA: FP8 / bf16 warpgroup MMA instructions in the SASS; MMA shapes: each with "
           "its A operand from registers (RS) or shared memory (SS).", "",
           "| " + " | ".join(COLUMNS) + " |", "|---|---|---|" + "---:|" * 8 + "---|"]
    out += ["| " + " | ".join(str(r[c]).replace("|", "/") for c in COLUMNS) + " |" for r in rows]
    return "\n".join(out) + "\n"


def print_table(rows, columns):
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    for r in [dict(zip(columns, columns))] + rows:
        print("  ".join(f"{str(r[c]):<{widths[c]}}" for c in columns))


def loops_markdown(rows):
    out = ["", "The innermost loops that issue MMAs (`--loops`): instructions of the loop body "
           "(every arm of its branches), the sum of their stall counts, and their MMA, MUFU, "
           "ldmatrix / stmatrix and shuffle instructions.", "",
           "| " + " | ".join(LOOP_COLUMNS) + " |", "|---|---|" + "---:|" * 6]
    out += ["| " + " | ".join(str(r[c]) for c in LOOP_COLUMNS) + " |" for r in rows]
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary", help="a built library (.a, .so), Python extension or executable")
    ap.add_argument("--kernel", default="prefill_attention_kernel",
                    help="the kernels whose mangled name holds this (default %(default)s)")
    ap.add_argument("--cuobjdump", help="the cuobjdump to run")
    ap.add_argument("--markdown", help="file to append the table to")
    ap.add_argument("--loops", action="store_true", help="also the table of MMA loops")
    ap.add_argument("--loop-sass", metavar="FILE",
                    help="write each MMA loop's instructions with their stall counts to FILE")
    args = ap.parse_args(argv)
    cuobjdump = find_cuobjdump(args.cuobjdump)
    rows = table_rows(cuobjdump, args.binary, args.kernel)
    if not rows:
        sys.exit(f"kernel_resources.py: no kernel named *{args.kernel}* in {args.binary}")
    print_table(rows, COLUMNS)
    want_loops = args.loops or args.loop_sass
    loops = loop_rows(cuobjdump, args.binary, args.kernel) if want_loops else []
    if args.loop_sass:
        with open(args.loop_sass, "w") as f:
            f.write(loop_listing(loops))
    if loops:
        print()
        print_table(loops, LOOP_COLUMNS)
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write(markdown(args.binary, rows, cuobjdump))
            if loops:
                f.write(loops_markdown(loops))
        print(f"appended the table{'s' if loops else ''} to {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
