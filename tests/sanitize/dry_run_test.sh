#!/usr/bin/env bash
# The share splitting of scripts/sanitize.sh, without a GPU or a sanitizer: on a fixed case list,
# shares 1..4 together hold every (tool, binary) pair the list allows exactly once per case, each
# share the same on every call, the excluded cases (past 2^31, the failing-launch test, racecheck
# of the cases that run cuBLASLt, initcheck of the layer's cases) in none, the layer's own kernels
# under every tool, and a share's chunks join cases with ':'
# (gtest) or ' ' (pytest ids).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
list=$root/tests/sanitize/sample_cases.txt
items() { "$root/scripts/sanitize.sh" --dry-run --share "$1/4" --list-file "$list" no-build-dir; }
all=""
for k in 1 2 3 4; do
  first=$(items $k)
  [[ $first == "$(items $k)" ]] || { echo "share $k differs between calls"; exit 1; }
  grep -q 'shares partition the work list: yes' <<<"$first" || { echo "share $k: no partition"; exit 1; }
  all+=$(grep -E $'^(memcheck|racecheck|initcheck|synccheck)\t' <<<"$first" || true)$'\n'
done
# Every (tool, case) once: expand each chunk's filter into its cases.
pairs=$(awk -F'\t' 'NF { n = split($5, c, $2 ~ /^pytest:/ ? " " : ":");
  for (i = 1; i <= n; ++i) print $1, $2, c[i] }' <<<"$all" | sort)
dups=$(uniq -d <<<"$pairs")
[[ -z $dups ]] || { echo "cases in more than one item: $dups"; exit 1; }
count=$(wc -l <<<"$pairs")
# 18 cases: 3 excluded for every tool (2^31, the failing launch), 3 more for racecheck (cuBLASLt),
# 1 more for initcheck (the layer's NCCL case reads cuBLASLt's block-scaled GEMM outputs).
want=$(((18 - 3) * 4 - 3 - 1))
((count == want)) || { echo "expected $want (tool, case) pairs, got $count:"; echo "$pairs"; exit 1; }
grep -q 'Past2To31\|StridesPast\|LaunchError' <<<"$pairs" && { echo "an excluded case is listed"; exit 1; }
grep -q '^racecheck mla_model_cuda_test [CM]' <<<"$pairs" && { echo "racecheck of cuBLASLt listed"; exit 1; }
[[ $(grep -c ' mla_model_cuda_test LayerKernelsCuda' <<<"$pairs") == 4 ]] ||
  { echo "the layer's own kernels lack a tool"; exit 1; }
grep -q '^initcheck mla_model_cuda_test Mla' <<<"$pairs" &&
  { echo "initcheck of a layer case listed"; exit 1; }
grep -q '^initcheck mla_model_cuda_test CublasLinearCuda' <<<"$pairs" ||
  { echo "initcheck of the CublasLinearCuda cases missing"; exit 1; }
# The NCCL case runs with its option, alone in its item; the cases around it without.
nccl=$(grep 'MlaContextParallelCudaNccl' <<<"$all")
[[ $(wc -l <<<"$nccl") == 2 && $(grep -c $'\t--report-api-errors no$' <<<"$nccl") == 2 ]] ||
  { echo "the NCCL case's items lack their option: $nccl"; exit 1; }
awk -F'\t' '$5 ~ /Nccl/ && $5 ~ /:/ { bad = 1 } $5 !~ /Nccl/ && $6 != "" { bad = 1 }
  END { exit bad }' <<<"$all" || { echo "an option leaked into another case's item"; exit 1; }
# A measured time replaces the table's estimate (x 1.5).
times=$(mktemp)
trap 'rm -f "$times"' EXIT
printf 'memcheck\tmerge_states_cuda_test\tMergeStatesCuda.MatchesCpu\t1000\n' >"$times"
est=$("$root/scripts/sanitize.sh" --dry-run --tools memcheck --list-file "$list" --times "$times" \
  no-build-dir | awk -F'\t' '$2 == "merge_states_cuda_test" && $5 ~ /MatchesCpu/ { print $4 }')
[[ $est == "1510 s (estimate)" ]] ||
  { echo "measured 1000 s: expected 1510 s (x 1.5 + 10 s start), got '$est'"; exit 1; }
echo "sanitize dry run: $count (tool, case) pairs in 4 shares, each once"
