#!/usr/bin/env bash
# Builds fp8mla with CUDA, runs one benchmark family in C++ and in Python on GPU 0 and writes its
# report into bench/.
#   bench/run.sh KIND [options] BUILD_DIR OUT_DIR      KIND: quant, prep, attention or layer
#     --anchors PATH   anchors.py or its folder (default: the scripts look in ../shared/anchors,
#                      bench/, anchors/ and the repository root; layer needs none)
#     --quick          quant: T = 1, 4k, 128k only (and the 1M-row per-tensor shapes);
#                      prep: T = 1, 64, 8192, 131072 only (one row per target)
#     --tokens LIST    T values, e.g. 1,64,8192,131072 (quant: the Python benchmark only)
#     --no-build       use BUILD_DIR/fp8mla as it is
#     --no-pip         do not (re)install the Python package (it must already import)
# Writes OUT_DIR/KIND_cli.{json,txt}, OUT_DIR/KIND_py.{json,txt} (and .png but for layer), then
# the report (bench/RESULTS.md for quant, else bench/RESULTS_KIND.md), also copied to OUT_DIR.
# Exits non-zero if a benchmark failed, after the report.
set -uo pipefail
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
usage() { sed -n '2,14p' "$self"; }
cd "$(dirname "$0")/.." || exit 1

kind=${1:-}
case "$kind" in
  quant | prep | attention | layer) shift ;;
  -h | --help) usage; exit 0 ;;
  *) usage; exit 2 ;;
esac
anchors="" quick=0 build=1 pip=1 pos=() tokens=""
while (($#)); do
  case "$1" in
    --anchors) anchors=$2; shift ;;
    --quick) quick=1 ;;
    --tokens) tokens=$2; shift ;;
    --no-build) build=0 ;;
    --no-pip) pip=0 ;;
    -h | --help) usage; exit 0 ;;
    *) pos+=("$1") ;;
  esac
  shift
done
((${#pos[@]} == 2)) || { usage; exit 2; }
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
    { tail -30 "$out/pip.log"; echo "run.sh: pip install failed; $kind.py may run the anchors only"; }
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv \
  >"$out/nvidia-smi.txt" 2>&1 || true

# Each family's arguments: C++ (cli), Python (py), and the report's markdown (results).
cli=() py=() results=bench/RESULTS_$kind.md
anchor_arg=(); [[ -n "$anchors" ]] && anchor_arg=(--anchors "$anchors")
case "$kind" in
  quant)
    results=bench/RESULTS.md
    ((quick)) && cli=(--shapes quick) && [[ -z "$tokens" ]] && tokens=1,4096,131072
    py=("${anchor_arg[@]}"); [[ -n "$tokens" ]] && py+=(--tokens "$tokens")
    ;;
  prep)
    ((quick)) && [[ -z "$tokens" ]] && tokens=1,64,8192,131072
    [[ -n "$tokens" ]] && cli=(--tokens "$tokens")
    py=("${anchor_arg[@]}" "${cli[@]}")
    ;;
  attention)
    py=("${anchor_arg[@]}")
    # FlashAttention-3, the Python benchmark's anchor, from the wheel carried in .whl/ if any.
    if compgen -G '.whl/fa3_fwd-*.whl' >/dev/null; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} ||
        echo "run.sh: the FA3 wheel did not install; its rows will be error rows"
    fi
    ;;
  layer) [[ -n "$tokens" ]] && cli=(--tokens ${tokens//,/ }) && py=("${cli[@]}") ;;
esac
plot=(); [[ $kind != layer ]] && plot=(--plot "$out/${kind}_py.png")

"$build_dir/fp8mla" bench "$kind" "${cli[@]}" --json "$out/${kind}_cli.json" 2>&1 |
  tee "$out/${kind}_cli.txt" || status=1
python3 "bench/$kind.py" "${py[@]}" --json "$out/${kind}_py.json" "${plot[@]}" 2>&1 |
  tee "$out/${kind}_py.txt" || status=1

report=()
[[ $kind != attention && -f "$out/${kind}_cli.json" ]] && report+=(--cli "$out/${kind}_cli.json")
[[ -f "$out/${kind}_py.json" ]] && report+=(--py "$out/${kind}_py.json")
if ((${#report[@]})); then
  python3 bench/report.py --kind "$kind" "${report[@]}" --out "$results" &&
    cp "$results" "$out/" || status=1
else
  echo "run.sh: no benchmark wrote its JSON; $results not updated"; status=1
fi
exit $status
