#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, initcheck, synccheck) over every CUDA test binary of a
# build tree (BUILD_DIR/tests/*_cuda_test) and over the CUDA pytest files (tests/python/*_torch.py),
# split into shares that each fit a time budget:
#   scripts/sanitize.sh [--share K/N] [--budget-s 600] [--jobs 1] [--tools memcheck,...]
#                       [--out DIR] [--list-file FILE] [--dry-run] [--no-pytest] BUILD_DIR
# The work list is (tool, binary, gtest filter) items: each binary's cases (--gtest_list_tests)
# minus the exclusions below, cut into chunks whose estimated time fits half the budget, for every
# tool. The items are dealt to N shares by estimated time (largest first, to the least loaded
# share; ties to the lower share), so a share is the same list on every machine; share K runs its
# items, --jobs at a time side by side on the one GPU (how many a device host sustains is not
# measured yet), each under `timeout` of the budget, and prints a table in item order:
#   tool | binary | cases | launched kernels | errors | seconds | status
# An item is clean only when the sanitizer printed its "ERROR SUMMARY: 0 errors" line (it ran to
# the end), the process exited 0, and more than 0 cases ran and passed: a chunk whose cases all
# skipped (no GPU, wrong arch) FAILS, it does not pass. "launched kernels" counts the sanitizer's
# per-launch lines at --print-level info when the tool prints them; "-" when it printed none, and
# then the passed (not skipped) CUDA cases are what shows kernels ran.
# The rerun tests run FP8MLA_RERUNS=3 times here (1000 without the sanitizer): the same code
# paths, checked, in a few runs; the random-shape agreement test FP8MLA_RANDOM_CASES=3 cases an op
# (a few hundred without).
# The time estimates are a per-case weight table (seconds under memcheck on an H200) times a
# per-tool factor: the rerun, graph, PDL-chain and batch-invariance rows from a run of theirs
# (2026-12-01: 0.4-2 s a case under memcheck, synccheck and initcheck, up to 4 s under racecheck,
# 26 s for the prefill batch-invariance case under racecheck), the others from plain run times and
# a 10-30x instrumentation cost, not measured.
# --list-file FILE takes the case list from FILE ("BINARY CASE" lines; BINARY pytest:PATH for
# pytest ids) instead of running the binaries; --dry-run prints the share's work list (tab-separated
# tool, binary, cases, estimate, filter), checks that
# the N shares partition the whole list, and runs nothing. SANITIZER (default compute-sanitizer)
# is the sanitizer command. The pytest items need CUDA torch and the package installed with CUDA
# (PIP_BREAK_SYSTEM_PACKAGES=1 FP8MLA_CUDA=ON python3 -m pip install --no-build-isolation .);
# without, their tests skip and the item fails. --no-pytest leaves them out.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/options.sh"
share=1/1 budget_s=600 jobs=1 tools=memcheck,racecheck,initcheck,synccheck out="" list_file=""
dry_run=0 no_pytest=0
parse_options "share budget-s jobs tools out list-file" "dry-run no-pytest" "$@"
dir=${positional[0]:-build-gpu}
[[ $share =~ ^([0-9]+)/([0-9]+)$ ]] && ((BASH_REMATCH[1] >= 1 && BASH_REMATCH[1] <= BASH_REMATCH[2])) ||
  { echo "--share: expected K/N with 1 <= K <= N, got $share" >&2; exit 2; }
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "--jobs: expected a count >= 1, got $jobs" >&2; exit 2; }
sanitizer=${SANITIZER:-compute-sanitizer}
out=${out:-$dir/sanitize-${share/\//-of-}}

# ---- The case list: "BINARY CASE" lines -----------------------------------------------------------
cases=$(mktemp)
trap 'rm -f "$cases"' EXIT
if [[ -n $list_file ]]; then
  grep -v '^\s*\(#\|$\)' "$list_file" >"$cases"
else
  for exe in "$dir"/tests/*_cuda_test "$dir"/tests/cuda_*_test; do
    [[ -x $exe ]] || continue
    # Suite lines end with '.', case lines are indented ("  Name  # GetParam() = ...").
    "$exe" --gtest_list_tests 2>/dev/null | awk -v b="$(basename "$exe")" '
      /^[^ ]/ { suite = $1; next }
      /^  / { print b, suite $1 }' >>"$cases"
  done
  # With CUDA torch the pytest ids are listed, so that a file's tests split into chunks too;
  # without, each file is one item.
  has_torch=0
  python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null && has_torch=1
  for py in "$here"/../tests/python/*_torch.py; do
    [[ -f $py ]] && ((!no_pytest)) || continue
    file=tests/python/$(basename "$py")
    if ((has_torch)); then
      (cd "$here/.." && python3 -m pytest --collect-only -q -p no:cacheprovider "$file" 2>/dev/null) |
        grep '::' | sed "s|^|pytest:$file |" >>"$cases"
    else
      echo "pytest:$file *" >>"$cases"
    fi
  done
fi

plan=$(python3 - "$cases" "$share" "$budget_s" "$tools" "$dry_run" "$jobs" <<'PY'
import fnmatch, sys
cases_file, share, budget, tools, dry_run, jobs = sys.argv[1:]
k, n = map(int, share.split('/'))
budget, jobs = float(budget), int(jobs)
tools = tools.split(',')
# Seconds per case under memcheck (estimates, see the header), first match wins.
WEIGHTS = [
    ('pytest:*', '*::*', 30),
    ('pytest:*', '*', 300),  # a whole file
    ('*', 'RerunCuda.AttentionWithOtherWorkOnTheGpu', 30),
    ('*', 'RerunCuda.*', 5),
    ('*', 'PdlChainCuda.*', 5),
    ('*', 'BatchInvarianceCuda.Prefill*', 20),
    ('*', 'BatchInvarianceCuda.*', 5),
    ('*', 'GraphCaptureCuda.*', 5),
    ('quantize_cuda_test', '*MatchesCpu', 60),
    ('quantize_cuda_test', '*StridedAndManyRows', 60),
    ('prefill_attention_cuda_test', '*', 40),
    ('output_quant*', '*', 40),
    ('mla_model_cuda_test', '*', 60),
    ('mla_prep_cuda_test', '*EveryTokenCount*', 60),
    ('random_agreement_cuda_test', '*', 20),
    ('*', '*', 10),
]
FACTOR = {'memcheck': 1.0, 'racecheck': 3.0, 'initcheck': 2.0, 'synccheck': 1.0}
STARTUP = 10  # seconds to start a binary under the sanitizer
# (binary, case, tools or '*', why): cases no sanitizer run takes.
EXCLUDE = [
    ('*', '*Big*', '*', 'tensors past 2^31: hours under instrumentation; run them plainly'),
    ('*', '*Past2To31*', '*', 'more than 2^31 elements: hours under instrumentation'),
    ('*', '*Beyond2GiB*', '*', 'a cache past 2 GiB: hours under instrumentation'),
    ('cuda_runtime_test', 'CudaRuntime.LaunchErrorBecomesFp8mlaError', '*',
     'fails a launch on purpose: the sanitizer reports that API error'),
    ('numerics_cuda_test', 'NumericsCuda.HardwareConversionsEqualSoftwareCodec', '*',
     'the 2^32-value sweep'),
    ('mla_model_cuda_test', '*', 'racecheck', "racecheck reports hazards inside cuBLASLt's kernels"),
]

def weight(binary, case):
    return next(w for b, c, w in WEIGHTS if fnmatch.fnmatch(binary, b) and fnmatch.fnmatch(case, c))

def excluded(binary, case, tool):
    return any(fnmatch.fnmatch(binary, b) and fnmatch.fnmatch(case, c) and t in ('*', tool)
               for b, c, t, _ in EXCLUDE)

by_binary = {}
for line in open(cases_file):
    binary, case = line.split()[:2]
    by_binary.setdefault(binary, []).append(case)

# Items: (tool, binary, [cases], estimate), cases in listed order, chunks within budget / 2.
items, left_out = [], 0
for tool in tools:
    for binary in sorted(by_binary):
        chunk, total = [], STARTUP
        for case in by_binary[binary]:
            if excluded(binary, case, tool):
                left_out += 1
                continue
            w = weight(binary, case) * FACTOR.get(tool, 2.0)
            if chunk and total + w > budget / 2:
                items.append((tool, binary, chunk, total))
                chunk, total = [], STARTUP
            chunk.append(case)
            total += w
        if chunk:
            items.append((tool, binary, chunk, total))

# Largest first to the least loaded share; ties by listed order and lower share.
order = sorted(range(len(items)), key=lambda i: (-items[i][3], i))
load, owner = [0.0] * n, {}
for i in order:
    s = min(range(n), key=lambda j: (load[j], j))
    owner[i] = s
    load[s] += items[i][3]
mine = [items[i] for i in range(len(items)) if owner[i] == k - 1]
covered = sorted(i for i in range(len(items)) if 0 <= owner[i] < n)
assert covered == list(range(len(items))), 'shares do not partition the work list'
for tool, binary, chunk, est in mine:
    filt = (' ' if binary.startswith('pytest:') else ':').join(chunk)
    print(f'ITEM\t{tool}\t{binary}\t{len(chunk)}\t{est:.0f}\t{filt}')
print(f'INFO\t{len(items)} items in {n} shares ({left_out} excluded tool/case pairs); share {k}: '
      f'{len(mine)} items, estimated {load[k - 1]:.0f} s of {max(load):.0f} s in the largest share')
total = sum(load)
# A share runs `jobs` items at a time: it holds about jobs x budget seconds of items.
capacity = budget * jobs
print(f'INFO\tall shares: estimated {total:.0f} s; shares of at most {budget:.0f} s each, {jobs} '
      f'item(s) at a time, would need N >= {max(1, int(-(-total // capacity)))} (estimates: '
      f'calibrate with a run\'s seconds)')
over = [f'{t} {b} ({e:.0f} s)' for t, b, _, e in mine if e > budget]
if over:
    print(f'INFO\testimated over the {budget:.0f} s budget (one case or a whole pytest file): '
          + ', '.join(over))
if int(dry_run):
    print('INFO\tshares partition the work list: yes')
    for b, c, t, why in EXCLUDE:
        print(f'INFO\texcluded {b}:{c} ({t}): {why}')
PY
) || { echo "planning failed" >&2; exit 2; }

if ((dry_run)); then
  printf '%s\n' "$plan" | awk -F'\t' '
    $1 == "INFO" { print $2; next }
    $1 == "ITEM" { printf "%s\t%s\t%d cases\t%d s (estimate)\t%s\n", $2, $3, $4, $5, $6 }'
  exit 0
fi

# ---- Run the share ------------------------------------------------------------------------------
mkdir -p "$out" && out=$(cd "$out" && pwd)
rows="$out/rows.tsv"

# Item n: its log, and its row (tool, binary, cases, status, seconds, log) in $out/n.row.
run_item() {
  local n=$1 tool=$2 binary=$3 count=$4 filter=$5 start status
  local log="$out/$n-$tool-${binary//[:\/]/_}.log"
  start=$(date +%s)
  if [[ $binary == pytest:* ]]; then
    local ids
    read -ra ids <<<"$filter"
    [[ $filter == '*' ]] && ids=("${binary#pytest:}")
    (cd "$here/.." && FP8MLA_RERUNS=3 timeout "$budget_s" $sanitizer --tool "$tool" \
      --target-processes all --print-level info --error-exitcode 99 \
      python3 -m pytest -q -p no:cacheprovider "${ids[@]}") >"$log" 2>&1
  else
    FP8MLA_RERUNS=3 FP8MLA_RANDOM_CASES=3 timeout "$budget_s" $sanitizer --tool "$tool" \
      --print-level info --error-exitcode 99 "$dir/tests/$binary" --gtest_filter="$filter" \
      >"$log" 2>&1
  fi
  status=$?
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$tool" "$binary" "$count" "$status" \
    "$(($(date +%s) - start))" "$log" >"$out/$n.row"
}

n=0 running=0
while IFS=$'\t' read -r kind tool binary count est filter; do
  [[ $kind == ITEM ]] || { [[ $kind == INFO ]] && echo "$tool"; continue; }
  n=$((n + 1))
  run_item "$n" "$tool" "$binary" "$count" "$filter" &
  if ((++running >= jobs)); then
    wait -n
    running=$((running - 1))
  fi
done <<<"$plan"
wait
: >"$rows"
for ((i = 1; i <= n; ++i)); do cat "$out/$i.row" >>"$rows" && rm -f "$out/$i.row"; done

python3 "$here/sanitize_table.py" "$rows"
