#!/usr/bin/env python3
"""The resources of the prefill attention kernels of a build: for each instantiation of
`prefill_attention_kernel` (or of any kernel whose name holds --kernel) in a library, a Python
extension or an executable, its registers per thread, stack and local memory, static shared
memory, the STL / LDL instructions of its SASS (local stores and loads: spills, and any stack
frame), and its warpgroup MMA instructions: QGMMA (FP8) and HGMMA (bf16/f16), with their shapes and
where their A operand comes from (RS: registers, SS: shared memory).

From `cuobjdump -res-usage` and `cuobjdump -sass` (the CUDA toolkit's; found on PATH, under
$CUDA_HOME/bin or /usr/local/cuda/bin, or given with --cuobjdump); names demangled by c++filt.
The dynamic shared memory a kernel runs with is set at launch (cudaFuncSetAttribute), so the
binary does not hold it: the table shows the static part only.

    python3 bench/kernel_resources.py build/libfp8mla.a [--markdown bench/analysis/F.md]
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary", help="a built library (.a, .so), Python extension or executable")
    ap.add_argument("--kernel", default="prefill_attention_kernel",
                    help="the kernels whose mangled name holds this (default %(default)s)")
    ap.add_argument("--cuobjdump", help="the cuobjdump to run")
    ap.add_argument("--markdown", help="file to append the table to")
    args = ap.parse_args()
    cuobjdump = find_cuobjdump(args.cuobjdump)
    rows = table_rows(cuobjdump, args.binary, args.kernel)
    if not rows:
        sys.exit(f"kernel_resources.py: no kernel named *{args.kernel}* in {args.binary}")
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in COLUMNS}
    for r in [dict(zip(COLUMNS, COLUMNS))] + rows:
        print("  ".join(f"{str(r[c]):<{widths[c]}}" for c in COLUMNS))
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write(markdown(args.binary, rows, cuobjdump))
        print(f"appended the table to {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
