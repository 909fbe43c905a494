#!/usr/bin/env bash
# Builds fp8mla with CUDA, runs both MLA prep benchmarks on GPU 0 and writes bench/RESULTS_prep.md.
#   bench/run_prep.sh [options] BUILD_DIR OUT_DIR
#     --anchors PATH   anchors.py or its folder (default: prep.py looks in ../shared/anchors,
#                      bench/, anchors/ and the repository root)
#     --quick          T = 1, 64, 8192, 131072 only (one row per target)
#     --tokens LIST    T values for both benchmarks, e.g. 1,64,8192,131072
#     --no-build       use BUILD_DIR/fp8mla as it is
#     --no-pip         do not (re)install the Python package (it must already import)
# Writes OUT_DIR/prep_cli.{json,txt}, OUT_DIR/prep_py.{json,png,txt}, then bench/RESULTS_prep.md
# (also copied to OUT_DIR/RESULTS_prep.md). Exits non-zero if a benchmark failed, after the report.
set -uo pipefail
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$0")/.." || exit 1

anchors="" build=1 pip=1 pos=() tokens=""
while (($#)); do
  case "$1" in
    --anchors) anchors=$2; shift ;;
    --quick) tokens="1,64,8192,131072" ;;
    --tokens) tokens=$2; shift ;;
    --no-build) build=0 ;;
    --no-pip) pip=0 ;;
    -h|--help) sed -n '2,11p' "$self"; exit 0 ;;
    *) pos+=("$1") ;;
  esac
  shift
done
((${#pos[@]} == 2)) || { sed -n '2,11p' "$self"; exit 2; }
build_dir=${pos[0]} out=${pos[1]}
mkdir -p "$out" && out=$(cd "$out" && pwd)
status=0

if ((build)); then
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S . -B "$build_dir" "${gen[@]}" -DFP8MLA_CUDA=ON -DFP8MLA_BUILD_TESTS=OFF \
    >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
  cmake --build "$build_dir" --target fp8mla_cli -j"$(nproc)" >"$out/build.log" 2>&1 ||
    { tail -50 "$out/build.log"; exit 1; }
fi
if ((pip)); then
  FP8MLA_CUDA=ON python3 -m pip install --no-build-isolation --no-deps -q . >"$out/pip.log" 2>&1 ||
    { tail -30 "$out/pip.log"; echo "run_prep: pip install failed; prep.py runs the anchors only"; }
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv \
  >"$out/nvidia-smi.txt" 2>&1 || true

token_arg=(); [[ -n "$tokens" ]] && token_arg=(--tokens "$tokens")
"$build_dir/fp8mla" bench prep "${token_arg[@]}" --json "$out/prep_cli.json" 2>&1 |
  tee "$out/prep_cli.txt" || status=1

anchor_arg=(); [[ -n "$anchors" ]] && anchor_arg=(--anchors "$anchors")
python3 bench/prep.py "${anchor_arg[@]}" "${token_arg[@]}" --json "$out/prep_py.json" \
  --plot "$out/prep_py.png" 2>&1 | tee "$out/prep_py.txt" || status=1

report=()
[[ -f "$out/prep_cli.json" ]] && report+=(--cli "$out/prep_cli.json")
[[ -f "$out/prep_py.json" ]] && report+=(--py "$out/prep_py.json")
if ((${#report[@]})); then
  python3 bench/report.py --kind prep "${report[@]}" --out bench/RESULTS_prep.md &&
    cp bench/RESULTS_prep.md "$out/" || status=1
else
  echo "run_prep: no benchmark wrote its JSON; RESULTS_prep.md not updated"; status=1
fi
exit $status
