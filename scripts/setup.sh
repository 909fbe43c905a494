#!/usr/bin/env bash
# Installs every build and test dependency of fp8mla, pinned. Idempotent: silent when all is there.
#   scripts/setup.sh            # everything, CUTLASS headers too when nvcc is on the PATH
#   FP8MLA_CUDA=OFF scripts/setup.sh   # skip the CUDA-only dependencies
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian 12 (bookworm) packages, pinned to the versions this project is tested with.
APT_PACKAGES=(
  cmake=3.25.1-1
  ninja-build=1.11.1-2~deb12u1
  g++=4:12.2.0-3
  googletest=1.12.1-0.2
  libgtest-dev=1.12.1-0.2
  libgmock-dev=1.12.1-0.2
  libbenchmark-dev=1.7.1-1
  libcli11-dev=2.1.2+ds-1
  nlohmann-json3-dev=3.11.2-2
  clang-format=1:14.0-55.7~deb12u1
)
# PyPI packages for the Python package (pip install . --no-build-isolation) and its tests.
PIP_PACKAGES=(
  nanobind==3.1.0
  scikit-build-core==1.1.2
  numpy==2.4.6
  ml-dtypes==0.6.0
  pytest==9.2.0
)
# PyPI nvidia-cutlass wheel (it ships the CUTLASS/CuTe headers); the pin lives in cmake/cutlass.cmake.
CUTLASS_VERSION=$(sed -n 's/^set(FP8MLA_CUTLASS_VERSION \(.*\))$/\1/p' cmake/cutlass.cmake)
CUTLASS_DIR=.deps/cutlass-${CUTLASS_VERSION}

missing=()
for spec in "${APT_PACKAGES[@]}"; do
  name=${spec%%=*} version=${spec#*=}
  installed=$(dpkg-query -W -f='${Status} ${Version}' "$name" 2>/dev/null || true)
  [[ "$installed" == "install ok installed $version" ]] || missing+=("$spec")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""; [[ $(id -u) == 0 ]] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

missing_pip=$(python3 - "${PIP_PACKAGES[@]}" <<'PY'
import sys
from importlib import metadata
for spec in sys.argv[1:]:
    name, version = spec.split("==")
    try:
        installed = metadata.version(name)
    except metadata.PackageNotFoundError:
        installed = None
    if installed != version:
        print(spec)
PY
)
if [[ -n "$missing_pip" ]]; then
  echo "setup: pip installing" $missing_pip
  # A Debian-managed Python refuses pip installs unless told otherwise (PEP 668).
  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --disable-pip-version-check \
    --root-user-action=ignore $missing_pip
fi

want_cuda=${FP8MLA_CUDA:-AUTO}
if [[ "$want_cuda" != OFF ]] && command -v nvcc >/dev/null && [[ ! -f "$CUTLASS_DIR/include/cute/tensor.hpp" ]]; then
  echo "setup: fetching CUTLASS headers (nvidia-cutlass==${CUTLASS_VERSION})"
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "nvidia-cutlass==${CUTLASS_VERSION}"
  mkdir -p "$CUTLASS_DIR"
  python3 - "$tmp"/nvidia_cutlass-*.whl "$CUTLASS_DIR" <<'PY'
import os, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(wheel) as zf:
    for name in zf.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            target = dest + "/include/" + name[len(prefix):]
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with zf.open(name) as src, open(target, "wb") as out:
                out.write(src.read())
PY
  rm -rf "$tmp"
fi
