#!/usr/bin/env bash
# The share splitting of scripts/sanitize.sh, without a GPU or a sanitizer: on a fixed case list,
# shares 1..4 together hold every (tool, binary) pair the list allows exactly once per case, each
# share the same on every call, the excluded cases (past 2^31, the failing-launch test, racecheck
# of cuBLASLt) in none, and a share's chunks join cases with ':' (gtest) or ' ' (pytest ids).
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
# 15 cases: 3 excluded for every tool (2^31, the failing launch), 1 more for racecheck (cuBLASLt).
want=$(((15 - 3) * 4 - 1))
((count == want)) || { echo "expected $want (tool, case) pairs, got $count:"; echo "$pairs"; exit 1; }
grep -q 'Past2To31\|StridesPast\|LaunchError' <<<"$pairs" && { echo "an excluded case is listed"; exit 1; }
grep -q '^racecheck mla_model_cuda_test' <<<"$pairs" && { echo "racecheck of cuBLASLt listed"; exit 1; }
echo "sanitize dry run: $count (tool, case) pairs in 4 shares, each once"
