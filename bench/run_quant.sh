#!/usr/bin/env bash
# Builds fp8mla with CUDA, runs both quantization benchmarks on GPU 0 and writes bench/RESULTS.md.
#   bench/run_quant.sh [options] BUILD_DIR OUT_DIR
#     --anchors PATH   anchors.py or its folder (default: quant.py looks in ../shared/anchors,
#                      bench/, anchors/ and the repository root)
#     --quick          T = 1, 4k, 128k only (and the 1M-row per-tensor shapes)
#     --tokens LIST    T values for the Python benchmark, e.g. 1,256,4096,131072
#     --no-build       use BUILD_DIR/fp8mla as it is
#     --no-pip         do not (re)install the Python package (it must already import)
# Writes OUT_DIR/quant_cli.{json,txt}, OUT_DIR/quant_py.{json,png,txt}, then bench/RESULTS.md
# (also copied to OUT_DIR/RESULTS.md). Exits non-zero if a benchmark failed, after the report.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

anchors="" quick=0 build=1 pip=1 pos=() tokens=()
while (($#)); do
  case "$1" in
    --anchors) anchors=$2; shift ;;
    --quick) quick=1 ;;
    --tokens) tokens=(--tokens "$2"); shift ;;
    --no-build) build=0 ;;
    --no-pip) pip=0 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) pos+=("$1") ;;
  esac
  shift
done
((${#pos[@]} == 2)) || { sed -n '2,12p' "$0"; exit 2; }
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
    { tail -30 "$out/pip.log"; echo "run_quant: pip install failed; quant.py runs the anchors only"; }
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv \
  >"$out/nvidia-smi.txt" 2>&1 || true

shapes=()
((quick)) && shapes=(--shapes quick) && tokens=(--tokens "1,4096,131072")
"$build_dir/fp8mla" bench quant "${shapes[@]}" --json "$out/quant_cli.json" 2>&1 |
  tee "$out/quant_cli.txt" || status=1

anchor_arg=(); [[ -n "$anchors" ]] && anchor_arg=(--anchors "$anchors")
python3 bench/quant.py "${anchor_arg[@]}" "${tokens[@]}" --json "$out/quant_py.json" \
  --plot "$out/quant_py.png" 2>&1 | tee "$out/quant_py.txt" || status=1

report=()
[[ -f "$out/quant_cli.json" ]] && report+=(--cli "$out/quant_cli.json")
[[ -f "$out/quant_py.json" ]] && report+=(--py "$out/quant_py.json")
if ((${#report[@]})); then
  python3 bench/report.py "${report[@]}" --out bench/RESULTS.md && cp bench/RESULTS.md "$out/" ||
    status=1
else
  echo "run_quant: no benchmark wrote its JSON; RESULTS.md not updated"; status=1
fi
exit $status
