#!/usr/bin/env bash
# Runs binaries built elsewhere (copied into BIN_DIR: the fp8mla tool and test executables) on a
# Hopper machine that cannot build them: each test binary, compute-sanitizer memcheck on chosen
# cases, `fp8mla run`, and the named benchmarks with their anchors; logs and JSON into OUT_DIR,
# a summary table last.
#   scripts/device-run.sh BIN_DIR OUT_DIR [--tests a,b] [--memcheck 'exe filter;exe filter']
#                         [--bench layer,attention] [--anchors DIR]
# --bench attention also pip-installs the Python package with CUDA (CUTLASS must be in .deps) and,
# when .whl/fa3_fwd-*.whl is there, the FlashAttention-3 wheel into /tmp/site (on PYTHONPATH).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/options.sh
tests="" memcheck="" bench="" anchors=.anchors
parse_options "tests memcheck bench anchors" "" "$@"
bin=${positional[0]} out=${positional[1]}
mkdir -p "$out"
rows=()
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/gpu: /'

IFS=, read -ra test_list <<<"$tests"
for t in "${test_list[@]}"; do
  start=$(date +%s)
  "$bin/$t" >"$out/$t.log" 2>&1
  status=$?
  summary=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$t.log" | tr -s ' ' | paste -sd';')
  rows+=("test $t: $([[ $status == 0 ]] && echo ok || echo "FAILED($status)") $summary ($(($(date +%s) - start)) s)")
  [[ $status == 0 ]] || grep -E '^\[  FAILED|Failure|Expected|actual|Which is' "$out/$t.log" | head -20
done

IFS=';' read -ra memcheck_list <<<"$memcheck"
for c in "${memcheck_list[@]}"; do
  read -r exe filter <<<"$c"
  log="$out/memcheck-$exe.log"
  timeout 240 compute-sanitizer --tool memcheck --error-exitcode 99 "$bin/$exe" \
    --gtest_filter="$filter" >"$log" 2>&1
  status=$?
  rows+=("memcheck $exe $filter: $([[ $status == 0 ]] && echo clean || echo "FAILED($status)")")
  [[ $status == 0 ]] || tail -20 "$log"
done

if [[ -x $bin/fp8mla ]]; then
  "$bin/fp8mla" run --json "$out/run.json" >"$out/run.log" 2>&1
  status=$?
  rows+=("fp8mla run: $([[ $status == 0 ]] && echo ok || echo "FAILED($status)")")
  cat "$out/run.log"
fi

IFS=, read -ra bench_list <<<"$bench"
for b in "${bench_list[@]}"; do
  case "$b" in
    layer)
      "$bin/fp8mla" bench layer --json "$out/layer_cli.json" 2>&1 | tee "$out/layer_cli.log"
      python3 bench/layer.py --json "$out/layer_py.json" 2>&1 | tee "$out/layer_py.log"
      python3 bench/report.py --kind layer --cli "$out/layer_cli.json" --py "$out/layer_py.json" \
        --out "$out/RESULTS_layer.md" >/dev/null &&
        rows+=("bench layer: $out/RESULTS_layer.md") || rows+=("bench layer: FAILED")
      ;;
    attention)
      "$bin/fp8mla" bench attention --json "$out/attention_cli.json" 2>&1 |
        tee "$out/attention_cli.log"
      # The Python benchmark needs fp8mla's torch ops built with CUDA (CUTLASS from .deps).
      PIP_BREAK_SYSTEM_PACKAGES=1 FP8MLA_CUDA=ON python3 -m pip install --no-build-isolation \
        --no-deps -q . >"$out/pip.log" 2>&1 || { tail -20 "$out/pip.log"; rows+=("pip: FAILED"); }
      # FlashAttention-3, the Python benchmark's anchor, from the wheel carried in .whl/ if any.
      if compgen -G '.whl/fa3_fwd-*.whl' >/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
          --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} ||
          rows+=("pip fa3: FAILED")
      fi
      cp bench/RESULTS_attention.md "$out/RESULTS_attention.md"
      python3 bench/attention.py --anchors "$anchors" --json "$out/attention_py.json" \
        --markdown "$out/RESULTS_attention.md" --plot "$out/attention.png" 2>&1 |
        tee "$out/attention_py.log" &&
        rows+=("bench attention: $out/RESULTS_attention.md") || rows+=("bench attention: FAILED")
      ;;
    *) rows+=("bench $b: unknown") ;;
  esac
done

echo
printf '%s\n' "${rows[@]}"
