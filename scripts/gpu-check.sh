#!/usr/bin/env bash
# What a developer runs on a Hopper machine: builds fp8mla with CUDA, runs every test (the CUDA-
# labelled ones included) and compute-sanitizer on the CUDA tests, then prints a summary table.
#   scripts/gpu-check.sh [--no-build] [--out DIR] [--labels cpu,long,cuda,install]
#                        [--sanitize EXE,EXE] [--sanitize-share K/N] [BUILD_DIR]
# --no-build runs a build tree made elsewhere at the same absolute path (the tests' paths are
# absolute). Logs and the JUnit report go to DIR (default BUILD_DIR/gpu-check).
# Its compute-sanitizer pass covers chosen cases only and takes longer than 10 minutes; the full
# sweep (every CUDA test binary and the CUDA pytest files, all four tools) is scripts/sanitize.sh,
# split into shares that each fit a time budget: scripts/sanitize.sh --share K/N BUILD_DIR (run
# with --dry-run first to see a share's work list and the N its estimates suggest);
# --sanitize-share K/N runs that share here in place of the chosen cases, --sanitize none runs no
# sanitizer here.
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/options.sh
no_build=0 out="" labels=cpu,long,cuda,install sanitize=all sanitize_share=""
parse_options "out labels sanitize sanitize-share" "no-build" "$@"
dir=${positional[0]:-build-gpu}
out=${out:-$dir/gpu-check}
mkdir -p "$out" && out=$(cd "$out" && pwd)

if ((!no_build)); then
  scripts/setup.sh
  cmake -S . -B "$dir" -G Ninja -DFP8MLA_CUDA=ON >"$out/configure.log" 2>&1 || { cat "$out/configure.log"; exit 1; }
  start=$(date +%s)
  cmake --build "$dir" -j"$(nproc)" >"$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }
  echo "build: $(($(date +%s) - start)) s on $(nproc) cores"
fi

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
"$dir/fp8mla" info

ctest_status=0
IFS=, read -ra label_list <<<"$labels"
for label in "${label_list[@]}"; do
  ctest --test-dir "$dir" -L "^$label\$" --output-on-failure --no-tests=ignore \
    --output-junit "$out/ctest-$label.xml" >"$out/ctest-$label.log" 2>&1 || ctest_status=1
done

# compute-sanitizer on the CUDA tests, each binary with the cases that fit under instrumentation:
# left out are the exhaustive 2^32 sweep and the 2^31-element cases (hours when instrumented) and
# the tests that make a launch or a tensor-map encode fail on purpose (the sanitizer reports
# those API errors); racecheck loses track of launches from several host threads at once (an
# internal sanitizer error, not a hazard: LaunchFromFreshThreads' kernel has no shared memory). A third
# field limits the tools: racecheck reports hazards inside cuBLASLt's own kernels (the layer's
# GEMMs), and initcheck does not see what cuBLASLt's block-scaled FP8 GEMMs write (every read of
# the layer's projections would be reported).
sanitize_cases=(
  "cuda_runtime_test -CudaRuntime.LaunchErrorBecomesFp8mlaError:CudaRuntime.RejectedTensorMapIsAnErrorAndNotCached memcheck,initcheck,synccheck"
  "cuda_runtime_test -CudaRuntime.LaunchErrorBecomesFp8mlaError:CudaRuntime.RejectedTensorMapIsAnErrorAndNotCached:CudaRuntime.LaunchFromFreshThreads racecheck"
  "numerics_cuda_test -NumericsCuda.HardwareConversionsEqualSoftwareCodec"
  "quantize_cuda_test QuantizeCuda.*MatchesCpu:QuantizeCuda.PdlOnAndOffBitIdentical"
  "mla_prep_cuda_test MlaKvCuda.WriteMatchesCpu:MlaKvCuda.GatherMatchesCpu:MlaKvCuda.*BadSlots*:MlaKvCuda.PackMatchesCpuForEveryTokenCount:MlaRopeCuda.MatrixEqualsCpu:MlaRopeCuda.BadPositionAndSlot:MlaKvCuda.VQuantize*"
  "merge_states_cuda_test *"
  "prefill_attention_cuda_test Dtypes/PrefillCuda.RaggedBatch*:Dtypes/PrefillCuda.PrefixLonger*:Dtypes/PrefillCuda.AllOnes*:Dtypes/PrefillCuda.WithoutLse*"
  "mla_model_cuda_test *tiny*:MlaLayerCudaArgs.*:CublasLinearCuda.ChangingRowCounts* memcheck,synccheck"
)
sanitizer_rows=()
if [[ -n $sanitize_share ]]; then
  scripts/sanitize.sh --share "$sanitize_share" --out "$out/sanitize" "$dir" || ctest_status=1
elif command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck initcheck synccheck; do
    for case in "${sanitize_cases[@]}"; do
      read -r exe filter tools <<<"$case"
      [[ -x "$dir/tests/$exe" ]] || continue
      [[ -z $tools || ",$tools," == *",$tool,"* ]] || continue
      [[ $sanitize == all || ",$sanitize," == *",$exe,"* ]] || continue
      log="$out/sanitizer-$tool-$exe.log"
      timeout "${SANITIZER_TIMEOUT:-300}" compute-sanitizer --tool "$tool" --error-exitcode 99 \
        "$dir/tests/$exe" --gtest_filter="$filter" >"$log" 2>&1
      status=$?
      ((status == 0)) || ctest_status=1
      sanitizer_rows+=("$tool $exe $([[ $status == 0 ]] && echo clean || echo "FAILED($status)")")
    done
  done
fi

echo
python3 - "$out" "${label_list[@]}" <<'PY'
import os, sys, xml.etree.ElementTree as ET
out, labels = sys.argv[1], sys.argv[2:]
print(f"{'tests':<10}{'passed':>8}{'failed':>8}{'skipped':>9}{'seconds':>10}")
for label in labels:
    path = os.path.join(out, f"ctest-{label}.xml")
    if not os.path.exists(path):
        print(f"{label:<10}  (no report)")
        continue
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    seconds = 0.0
    for case in ET.parse(path).getroot().iter("testcase"):
        status = case.get("status", "run")
        if status in ("notrun", "disabled") or case.find("skipped") is not None:
            counts["skipped"] += 1
        elif status == "fail" or case.find("failure") is not None:
            counts["failed"] += 1
        else:
            counts["passed"] += 1
        seconds += float(case.get("time", 0))
    print(f"{label:<10}{counts['passed']:>8}{counts['failed']:>8}{counts['skipped']:>9}{seconds:>10.1f}")
PY
for row in "${sanitizer_rows[@]}"; do echo "sanitizer $row"; done
exit $ctest_status
