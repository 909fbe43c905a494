#!/usr/bin/env bash
# scripts/sanitize.sh --jobs, without a GPU or a sanitizer: a stand-in sanitizer runs stand-in
# test binaries (shell scripts that print gtest's summary). Each binary waits (5 s at most) until
# another one has started: with --jobs 3 every item but the failing binary is clean, in item order
# in the table, and the passed cases' seconds are in OUT/case_times.tsv; with --jobs 1 the first
# item, alone, fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/build/tests" "$work/started"

# The stand-in sanitizer: `SANITIZER --tool T ... BINARY --gtest_filter=F` runs BINARY and prints
# the sanitizer's summary line. It fails unless the output-quantization subset is set for exactly
# racecheck and synccheck.
cat >"$work/sanitizer" <<'EOF'
#!/usr/bin/env bash
exe="" filter="" tool="" prev=""
for a in "$@"; do
  case "$a" in
    --gtest_filter=*) filter=${a#--gtest_filter=} ;;
    */tests/*) exe=$a ;;
  esac
  [[ $prev == --tool ]] && tool=$a
  prev=$a
done
want=""
[[ $tool == racecheck || $tool == synccheck ]] && want=keys
[[ ${FP8MLA_QUANT_CASES:-} == "$want" ]] ||
  { echo "FP8MLA_QUANT_CASES='${FP8MLA_QUANT_CASES:-}' under $tool"; exit 3; }
"$exe" "$filter"; status=$?
echo "========= ERROR SUMMARY: 0 errors"
exit $status
EOF
# A stand-in test binary: marks its start, waits (at most 5 s) for a second item to have
# started, then passes its cases (fail_cuda_test fails them).
for name in alpha_cuda_test beta_cuda_test gamma_cuda_test fail_cuda_test; do
  cat >"$work/build/tests/$name" <<EOF
#!/usr/bin/env bash
touch "$work/started/$name-\$\$"
for ((i = 0; i < 50; ++i)); do
  (( \$(ls "$work/started" | wc -l) >= 2 )) && break
  sleep 0.1
done
(( \$(ls "$work/started" | wc -l) >= 2 )) || { echo "alone: nothing ran beside me"; exit 1; }
cases=\$(tr ':' '\n' <<<"\$1" | wc -l)
if [[ $name == fail_cuda_test ]]; then
  echo "[  FAILED  ] \$cases tests, listed below:"; exit 1
fi
tr ':' '\n' <<<"\$1" | while read -r c; do echo "[       OK ] \$c (1500 ms)"; done
echo "[  PASSED  ] \$cases tests."
EOF
  chmod +x "$work/build/tests/$name"
done
chmod +x "$work/sanitizer"
{
  echo "alpha_cuda_test A.One"
  echo "alpha_cuda_test A.Two"
  echo "beta_cuda_test B.One"
  echo "gamma_cuda_test G.One"
  echo "fail_cuda_test F.One"
} >"$work/cases.txt"

# sweep NAME JOBS TOOL [OPTION...]: the stand-in sweep's table into $work/tableNAME.txt (its output
# folder $work/outNAME), with every started mark cleared first; its exit status in $status.
sweep() {
  rm -f "$work/started"/*
  set +e
  SANITIZER="$work/sanitizer" "$root/scripts/sanitize.sh" --jobs "$2" --tools "$3" "${@:4}" \
    --list-file "$work/cases.txt" --no-pytest --out "$work/out$1" "$work/build" \
    >"$work/table$1.txt" 2>&1
  status=$?
  set -e
}
sweep "" 3 memcheck
cat "$work/table.txt"
((status == 1)) || { echo "expected exit 1 (the failing binary's row), got $status"; exit 1; }
clean=$(grep -c '| clean$' "$work/table.txt" || true)
((clean == 3)) || { echo "expected 3 clean rows (alpha, beta, gamma), got $clean"; exit 1; }
grep -q 'fail_cuda_test.*FAIL' "$work/table.txt" ||
  { echo "the failing binary's row is not FAIL"; exit 1; }
grep -q 'alpha_cuda_test.*2/2' "$work/table.txt" ||
  { echo "alpha's two cases are not one item"; exit 1; }
# Item order: the rows follow the plan (alphabetical binaries within memcheck), not completion.
order=$(grep -o '[a-z]*_cuda_test' "$work/table.txt" | tr '\n' ' ')
[[ $order == "alpha_cuda_test beta_cuda_test fail_cuda_test gamma_cuda_test " ]] ||
  { echo "rows out of item order: $order"; exit 1; }
# Every passed case's seconds, for the next plan (sanitize_plan.py --times).
grep -qx $'memcheck\talpha_cuda_test\tA.Two\t1.5' "$work/out/case_times.tsv" &&
  [[ $(wc -l <"$work/out/case_times.tsv") == 4 ]] ||
  { cat "$work/out/case_times.tsv"; echo "case_times.tsv: expected the 4 passed cases"; exit 1; }
# One at a time, the first item finds no other started and fails.
sweep 1 1 memcheck
grep -q 'alpha_cuda_test.*FAIL' "$work/table1.txt" ||
  { cat "$work/table1.txt"; echo "--jobs 1 ran the first item beside another"; exit 1; }
# Under racecheck the items get the output-quantization subset (the stand-in checks it).
sweep 2 3 racecheck
clean=$(grep -c '| clean$' "$work/table2.txt" || true)
((clean == 3)) || { cat "$work/table2.txt"; echo "racecheck: expected 3 clean rows"; exit 1; }
# A deadline of 2 s, one at a time: the first item (alone, it would wait 5 s) is cut at the
# deadline, the other three are not started, and the table and case times are still written.
start=$(date +%s)
sweep 3 1 memcheck --deadline-s 2
took=$(($(date +%s) - start))
((status == 1 && took <= 4)) ||
  { cat "$work/table3.txt"
    echo "deadline 2 s: expected exit 1 within 4 s, got $status in $took s"; exit 1; }
not_started=$(grep -c 'not started (deadline)$' "$work/table3.txt" || true)
grep -q 'alpha_cuda_test.*TIMEOUT' "$work/table3.txt" &&
  ((not_started == 3)) && [[ -f $work/out3/case_times.tsv ]] ||
  { cat "$work/table3.txt"; echo "deadline: expected alpha cut and 3 items not started"; exit 1; }
echo "sanitize --jobs: 4 items side by side, 3 clean, the failing one failed, rows in item order;"\
  "racecheck's items get FP8MLA_QUANT_CASES=keys; --deadline-s cuts the share and keeps its table"
