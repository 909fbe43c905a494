#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite. CUDA-labelled tests run on a Hopper GPU and report
# themselves skipped elsewhere.   FP8MLA_CUDA=AUTO|ON|OFF (default AUTO)   BUILD_DIR (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
scripts/setup.sh
cmake -S . -B "$build" -G Ninja -DFP8MLA_CUDA="${FP8MLA_CUDA:-AUTO}" >/dev/null
start=$(date +%s)
cmake --build "$build"
echo "build: $(($(date +%s) - start)) s"
ctest --test-dir "$build" -j"$(nproc)" --output-on-failure
