#!/usr/bin/env bash
# A/B of prefill-attention builds against FlashAttention-3: each build is its own Python package,
# each bench/attention.py process imports one build and times it with FA3 on the same inputs, and
# the processes alternate over the builds, lap after lap (the method of bench/analysis/*.md).
#   scripts/attention-ab.sh pack DIR NAME=REF [NAME=REF ...]
#       here, with git: the sources of each commit (or branch, tag) REF into DIR/NAME. A diagnostic
#       build is a commit on a scratch branch; DIR is carried to the GPU machine.
#   scripts/attention-ab.sh run DIR OUT [--shapes LIST] [--laps N] [--rounds R] [--settle-ms MS]
#                              [--anchors PATH] [--accuracy LENGTHS] [--digest]
#       on the GPU machine: builds every DIR/* in parallel (CUTLASS from .deps; a build whose
#       wgmmas ptxas serialized fails, FP8MLA_WGMMA_GUARD), installs the FA3
#       wheel of .whl/ if there, runs the laps (bench/attention.py of this tree, --json
#       OUT/ab_LAP_NAME.json) and prints bench/ab_table.py's table of them; --accuracy runs
#       bench/attention_long_accuracy.py --lengths LENGTHS on every build (OUT/acc_NAME.json);
#       --digest runs bench/attention_digest.py on every build first (OUT/digest_NAME.json) and
#       says which outputs differ from the first build's (a change meant to keep every byte).
# Defaults: --shapes 8k,16k,8k+8k,h16-32k,16x1k, --laps 2, --rounds 3, --settle-ms as
# bench/attention.py's (300: each implementation's untimed lead before its timed replays).
# --anchors: anchors.py or its folder, where ../shared/anchors is absent (checked before the
# builds). On an H200: four builds took 60 s together; a process of bench/attention.py with the
# settle took 83 s for 7 shapes (five took ~25 s a build without it); --accuracy 8192,32768
# about 10 s a build.
set -uo pipefail
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
usage() { sed -n '2,22p' "$self"; }
cd "$(dirname "$0")/.." || exit 1

pack() {
  local dir=$1; shift
  (($#)) || { usage; exit 2; }
  mkdir -p "$dir"
  for spec in "$@"; do
    local name=${spec%%=*} ref=${spec#*=}
    [[ "$spec" == *=* && "$name" =~ ^[A-Za-z0-9.+-]+$ ]] ||
      { echo "attention-ab.sh: expected NAME=REF (NAME: letters, digits, . + -), got '$spec'"
        exit 2; }
    git rev-parse --verify -q "$ref^{commit}" >/dev/null ||
      { echo "attention-ab.sh: '$ref' is not a commit of this repository"; exit 2; }
    rm -rf "${dir:?}/$name" && mkdir -p "$dir/$name"
    git archive "$ref" CMakeLists.txt cmake include src python pyproject.toml README.md |
      tar -x -C "$dir/$name" || exit 1
    echo "$name: $(git rev-parse --short "$ref") $(git log -1 --format=%s "$ref" | cut -c1-80)"
  done
}

run() {
  local dir=${1:-} out=${2:-}
  [[ -d "$dir" && -n "$out" ]] || { usage; exit 2; }
  shift 2
  local shapes=8k,16k,8k+8k,h16-32k,16x1k laps=2 rounds=3 settle=() anchors=() accuracy= digest=0
  while (($#)); do
    case "$1" in
      --shapes) shapes=$2; shift ;;
      --laps) laps=$2; shift ;;
      --rounds) rounds=$2; shift ;;
      --settle-ms) settle=(--settle-ms "$2"); shift ;;
      --anchors) anchors=(--anchors "$2"); shift ;;
      --accuracy) accuracy=$2; shift ;;
      --digest) digest=1 ;;
      *) usage; exit 2 ;;
    esac
    shift
  done
  mkdir -p "$out" && out=$(cd "$out" && pwd) && dir=$(cd "$dir" && pwd)
  # bench/attention.py stops without anchors.py (its cuDNN rows): find it before any build.
  python3 -c 'import sys; sys.path.insert(0, "bench"); import common
common.find_anchors(sys.argv[1] or None, "attention-ab.sh")' "${anchors[1]:-}" >/dev/null || exit 2
  local cutlass; cutlass=$(ls -d "$PWD"/.deps/cutlass-*/include 2>/dev/null | head -1)
  [[ -n "$cutlass" ]] ||
    { echo "attention-ab.sh: no CUTLASS in .deps (scripts/setup.sh fetches it)"; exit 1; }
  local site=/tmp/ab-site
  if compgen -G '.whl/fa3_fwd-*.whl' >/dev/null; then
    python3 -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile \
      --no-cache-dir --upgrade --target "$site/fa3" .whl/fa3_fwd-*.whl ||
      echo "attention-ab.sh: the FA3 wheel did not install"
  fi
  local names=() jobs=$(($(nproc) > 2 ? $(nproc) / 2 : 1)) name
  for src in "$dir"/*/; do names+=("$(basename "$src")"); done
  ((${#names[@]})) || { echo "attention-ab.sh: no builds in $dir"; exit 2; }
  for name in "${names[@]}"; do
    (cd "$dir/$name" && CMAKE_BUILD_PARALLEL_LEVEL=$jobs FP8MLA_CUDA=ON python3 -m pip install -q \
      --root-user-action=ignore --no-build-isolation --no-deps --target "$site/$name" . \
      -C build-dir="/tmp/ab-build/$name" -C cmake.define.FP8MLA_CUTLASS_INCLUDE_DIR="$cutlass" \
      -C cmake.define.FP8MLA_WGMMA_GUARD=ON >"$out/pip_$name.log" 2>&1 ||
      echo "attention-ab.sh: build $name failed, see $out/pip_$name.log") &
  done
  wait
  ((digest)) && digests "$site" "$out" "${names[@]}"
  for ((lap = 1; lap <= laps; ++lap)); do
    for name in "${names[@]}"; do
      PYTHONPATH="$site/$name:$site/fa3" python3 bench/attention.py "${anchors[@]}" \
        --shapes "$shapes" --rounds "$rounds" "${settle[@]}" --json "$out/ab_${lap}_$name.json" \
        >"$out/ab_${lap}_$name.log" 2>&1 || echo "lap $lap $name: exit $? (see its log)"
    done
  done
  compgen -G "$out/ab_*.json" >/dev/null ||
    { echo "attention-ab.sh: no lap wrote its JSON"; exit 1; }
  python3 bench/ab_table.py "$out"/ab_*.json
  [[ -n $accuracy ]] || return 0
  for name in "${names[@]}"; do
    echo "accuracy of $name (max |O - O_ref| against float64):"
    PYTHONPATH="$site/$name:$site/fa3" python3 bench/attention_long_accuracy.py \
      --lengths "$accuracy" --json "$out/acc_$name.json" 2>&1 | tee "$out/acc_$name.log" |
      grep '^|' || echo "accuracy $name: failed (see its log)"
  done
}

# Each build's output digests, and which differ from the first build's.
digests() {
  local site=$1 out=$2 name files=(); shift 2
  for name in "$@"; do
    files+=("$out/digest_$name.json")
    PYTHONPATH="$site/$name" python3 bench/attention_digest.py --json "$out/digest_$name.json" \
      >"$out/digest_$name.log" 2>&1 || echo "digest $name: exit $? (see its log)"
  done
  python3 bench/attention_digest.py --compare "${files[@]}"
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  -h | --help) usage ;;
  *) usage; exit 2 ;;
esac
