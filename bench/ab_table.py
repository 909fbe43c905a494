#!/usr/bin/env python3
"""The table of an A/B of attention builds (scripts/attention-ab.sh): for each shape and build,
the mean over processes of anchor time / fp8mla time (> 1: fp8mla faster), each process's value
in brackets, then the median SM clock (MHz) / mean power (W) of fp8mla and of the anchor; last,
each build's geometric mean over the shapes and its ratio to the first build's.

    python3 bench/ab_table.py OUT/ab_*.json [--impl fp8mla_e4m3] [--anchor fa3_e4m3]

File names are ab_LAP_BUILD.json; builds are listed in the order they first appear.
"""
import argparse
import json
import math
import os
import re
import statistics


def load(paths, impl, anchor):
    """({(build, shape): [(ratio, mhz, watts, anchor mhz, anchor watts)]}, builds, shapes)."""
    cells, builds, shapes = {}, [], []
    for path in paths:
        m = re.fullmatch(r"ab_(\d+)_(.+)\.json", os.path.basename(path))
        if not m:
            raise SystemExit(f"ab_table.py: expected ab_LAP_BUILD.json, got {path}")
        build = m.group(2)
        with open(path) as f:
            rows = {(r["shape"], r["impl"]): r for r in json.load(f)["rows"] if r["status"] == "ok"}
        if build not in builds:
            builds.append(build)
        for (shape, name), r in rows.items():
            a = rows.get((shape, anchor))
            if name != impl or a is None:
                continue
            if shape not in shapes:
                shapes.append(shape)
            cells.setdefault((build, shape), []).append(
                (a["us"] / r["us"], r["clock"].get("sm_mhz_median"), r["clock"].get("power_w_mean"),
                 a["clock"].get("sm_mhz_median"), a["clock"].get("power_w_mean")))
    return cells, builds, shapes


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else math.nan


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="+")
    ap.add_argument("--impl", default="fp8mla_e4m3")
    ap.add_argument("--anchor", default="fa3_e4m3")
    args = ap.parse_args()
    lap = re.compile(r"ab_(\d+)_")
    paths = sorted(args.json, key=lambda p: int(m.group(1)) if (m := lap.search(p)) else 0)
    cells, builds, shapes = load(paths, args.impl, args.anchor)
    print(f"{args.anchor} time / {args.impl} time, mean over processes [each]; "
          f"{args.impl} MHz/W ; {args.anchor} MHz/W")
    print("| shape | " + " | ".join(builds) + " |")
    print("|---" * (len(builds) + 1) + "|")
    for shape in shapes:
        row = []
        for build in builds:
            xs = cells.get((build, shape))
            if not xs:
                row.append("-")
                continue
            each = "/".join(f"{x[0]:.2f}" for x in xs)
            row.append(f"{statistics.mean(x[0] for x in xs):.3f} [{each}] "
                       f"{median(x[1] for x in xs):.0f}/{median(x[2] for x in xs):.0f} ; "
                       f"{median(x[3] for x in xs):.0f}/{median(x[4] for x in xs):.0f}")
        print(f"| {shape} | " + " | ".join(row) + " |")
    means = {}
    for build in builds:
        ratios = [statistics.mean(x[0] for x in cells[(build, s)]) for s in shapes
                  if (build, s) in cells]
        means[build] = statistics.geometric_mean(ratios) if ratios else math.nan
    first = means[builds[0]]
    print("| geometric mean (against " + builds[0] + ") | " +
          " | ".join(f"{means[b]:.4f} ({means[b] / first:.3f})" for b in builds) + " |")


if __name__ == "__main__":
    main()
