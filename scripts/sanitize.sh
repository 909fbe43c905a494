#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, initcheck, synccheck) over every CUDA test binary of a
# build tree (BUILD_DIR/tests/*_cuda_test) and over the CUDA pytest files (tests/python/test_*torch*.py),
# split into shares that each fit a time budget:
#   scripts/sanitize.sh [--share K/N] [--budget-s 600] [--jobs 1] [--tools memcheck,...]
#                       [--deadline-s S] [--out DIR] [--list-file FILE] [--times FILE]
#                       [--dry-run] [--no-pytest] BUILD_DIR
# The work list is (tool, binary, gtest filter) items, planned by scripts/sanitize_plan.py: each
# binary's cases (--gtest_list_tests) minus its exclusions, cut into chunks whose estimated time
# fits half the budget, for every tool, dealt to N shares by estimated time, so a share is the
# same list on every machine. Share K runs its items, --jobs at a time side by side on the one GPU
# (4 ran side by side on an H200, 2026-12-02), each under `timeout` of the budget, and prints a
# table in item order:
#   tool | binary | cases | launched kernels | errors | seconds | status
# An item is clean only when the sanitizer printed its "ERROR SUMMARY: 0 errors" line (it ran to
# the end), the process exited 0, and more than 0 cases ran and passed: a chunk whose cases all
# skipped (no GPU, wrong arch) FAILS, it does not pass. "launched kernels" counts the sanitizer's
# per-launch lines at --print-level info when the tool prints them; "-" when it printed none, and
# then the passed (not skipped) CUDA cases are what shows kernels ran.
# The rerun tests run FP8MLA_RERUNS=3 times here (1000 without the sanitizer): the same code
# paths, checked, in a few runs; the random-shape agreement test FP8MLA_RANDOM_CASES=3 cases an op
# (a few hundred without). Under racecheck and synccheck the output-quantization tests walk one
# case a key (FP8MLA_QUANT_CASES=keys) instead of every scale layout and output stride: those
# move global stores only, which neither tool checks (memcheck and initcheck walk them all).
# --deadline-s S: the share starts no item once S seconds have passed and cuts a running item's
# budget to what is left of them, so that its table and case times are written by then (a caller
# with a hard limit of its own loses nothing); items left out are rows "not started (deadline)".
# Estimates: the measured seconds of each (tool, case) in --times FILE (default
# scripts/sanitize_times.tsv), else sanitize_plan.py's weight table. After a run, OUT/case_times.tsv
# holds every passed gtest case's seconds in that form, to merge into the default.
# --list-file FILE takes the case list from FILE ("BINARY CASE" lines; BINARY pytest:PATH for
# pytest ids) instead of running the binaries; --dry-run prints the share's work list (tab-separated
# tool, binary, cases, estimate, filter, extra sanitizer options), checks that the N shares
# partition the whole list, and runs nothing. SANITIZER (default compute-sanitizer)
# is the sanitizer command. The pytest items need CUDA torch and the package installed with CUDA
# (PIP_BREAK_SYSTEM_PACKAGES=1 FP8MLA_CUDA=ON python3 -m pip install --no-build-isolation .);
# without, their tests skip and the item fails. --no-pytest leaves them out.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/options.sh"
share=1/1 budget_s=600 jobs=1 tools=memcheck,racecheck,initcheck,synccheck out="" list_file="" times=""
dry_run=0 no_pytest=0 deadline_s=0
parse_options "share budget-s jobs tools deadline-s out list-file times" "dry-run no-pytest" "$@"
dir=${positional[0]:-build-gpu}
[[ $share =~ ^([0-9]+)/([0-9]+)$ ]] && ((BASH_REMATCH[1] >= 1 && BASH_REMATCH[1] <= BASH_REMATCH[2])) ||
  { echo "--share: expected K/N with 1 <= K <= N, got $share" >&2; exit 2; }
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "--jobs: expected a count >= 1, got $jobs" >&2; exit 2; }
[[ $deadline_s =~ ^[0-9]+$ ]] ||
  { echo "--deadline-s: expected whole seconds (0: none), got $deadline_s" >&2; exit 2; }
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
  for py in "$here"/../tests/python/test_*torch*.py; do
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

plan_args=("$cases" "$share" "$budget_s" "$tools" "$jobs")
[[ -n $times ]] && plan_args+=(--times "$times")
((dry_run)) && plan_args+=(--dry-run)
plan=$(python3 "$here/sanitize_plan.py" "${plan_args[@]}") || { echo "planning failed" >&2; exit 2; }

if ((dry_run)); then
  printf '%s\n' "$plan" | awk -F'\t' '
    $1 == "INFO" { print $2; next }
    $1 == "ITEM" { printf "%s\t%s\t%d cases\t%d s (estimate)\t%s\t%s\n", $2, $3, $4, $5, $6, $7 }'
  exit 0
fi

# ---- Run the share ------------------------------------------------------------------------------
mkdir -p "$out" && out=$(cd "$out" && pwd)
rows="$out/rows.tsv"

# Item n: its log, and its row (tool, binary, cases, status, seconds, log) in $out/n.row; it runs
# for `limit` seconds at most.
run_item() {
  local n=$1 tool=$2 binary=$3 count=$4 filter=$5 limit=$7 start status opts
  read -ra opts <<<"${6:-}"  # the item's extra sanitizer options (sanitize_plan.py OPTIONS)
  local item_env=(FP8MLA_RERUNS=3 FP8MLA_RANDOM_CASES=3)
  # Shared-memory and barrier checks: one output-quantization case a key (see the header).
  [[ $tool == racecheck || $tool == synccheck ]] && item_env+=(FP8MLA_QUANT_CASES=keys)
  local log="$out/$n-$tool-${binary//[:\/]/_}.log"
  start=$(date +%s)
  if [[ $binary == pytest:* ]]; then
    local ids
    read -ra ids <<<"$filter"
    [[ $filter == '*' ]] && ids=("${binary#pytest:}")
    (cd "$here/.." && env "${item_env[@]}" timeout "$limit" $sanitizer --tool "$tool" "${opts[@]}" \
      --target-processes all --print-level info --error-exitcode 99 \
      python3 -m pytest -q -rs -p no:cacheprovider "${ids[@]}") >"$log" 2>&1
  else
    env "${item_env[@]}" timeout "$limit" $sanitizer --tool "$tool" "${opts[@]}" \
      --print-level info --error-exitcode 99 "$dir/tests/$binary" --gtest_filter="$filter" \
      >"$log" 2>&1
  fi
  status=$?
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$tool" "$binary" "$count" "$status" \
    "$(($(date +%s) - start))" "$log" >"$out/$n.row"
}

n=0 running=0 share_start=$(date +%s)
while IFS=$'\t' read -r kind tool binary count est filter opts; do
  [[ $kind == ITEM ]] || { [[ $kind == INFO ]] && echo "$tool"; continue; }
  n=$((n + 1))
  limit=$budget_s
  if ((deadline_s > 0)); then
    left=$((deadline_s - ($(date +%s) - share_start)))
    if ((left <= 0)); then
      printf '%s\t%s\t%s\t-\t0\t-\n' "$tool" "$binary" "$count" >"$out/$n.row"
      continue
    fi
    ((left < limit)) && limit=$left
  fi
  run_item "$n" "$tool" "$binary" "$count" "$filter" "$opts" "$limit" &
  if ((++running >= jobs)); then
    wait -n
    running=$((running - 1))
  fi
done <<<"$plan"
wait
: >"$rows"
for ((i = 1; i <= n; ++i)); do cat "$out/$i.row" >>"$rows" && rm -f "$out/$i.row"; done

python3 "$here/sanitize_table.py" "$rows"
status=$?
# Each gtest case's seconds, for the next plan's estimates (sanitize_plan.py --times).
for ((i = 1; i <= n; ++i)); do
  for log in "$out/$i"-*.log; do
    [[ -f $log ]] || continue
    f=${log##*/}; f=${f#*-}; tool=${f%%-*}; binary=${f#*-}; binary=${binary%.log}
    sed -n 's/^\[       OK \] \([^ ]*\) (\([0-9]*\) ms)$/\1 \2/p' "$log" |
      awk -v t="$tool" -v b="$binary" '{ printf "%s\t%s\t%s\t%.1f\n", t, b, $1, $2 / 1000 }'
  done
done >"$out/case_times.tsv"
exit $status
