#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite. CUDA-labelled tests run on a Hopper GPU and report
# themselves skipped elsewhere.   FP8MLA_CUDA=AUTO|ON|OFF (default AUTO)   BUILD_DIR (default build)
# Then installs the Python package from this tree (same FP8MLA_CUDA; its CMake build is kept in
# PY_BUILD_DIR, default $BUILD_DIR/pip) and runs pytest on tests/python.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
scripts/setup.sh
# The wgmma guard: a kernel whose wgmmas ptxas serialized fails the build (cmake/wgmma_guard.sh).
cmake -S . -B "$build" -G Ninja -DFP8MLA_CUDA="${FP8MLA_CUDA:-AUTO}" -DFP8MLA_WGMMA_GUARD=ON \
  >/dev/null
start=$(date +%s)
cmake --build "$build"
echo "build: $(($(date +%s) - start)) s"
ctest --test-dir "$build" -j"$(nproc)" --output-on-failure

py_build=${PY_BUILD_DIR:-$build/pip}
start=$(date +%s)
python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore \
  --no-build-isolation --no-deps . -C build-dir="$py_build" \
  -C cmake.define.FP8MLA_CUDA="${FP8MLA_CUDA:-AUTO}"
echo "python build: $(($(date +%s) - start)) s"
python3 -m pytest tests/python -q -rs
