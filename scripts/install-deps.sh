#!/usr/bin/env bash
# Installs kjit's build dependencies from Debian's packages (idempotent).
# The CUDA toolkit (headers; NVRTC to compile) is expected at /usr/local/cuda
# or $CUDA_HOME: kjit loads libnvrtc and libcuda at run time, never links them.
set -euo pipefail
packages=(cmake ninja-build g++ libfmt-dev nlohmann-json3-dev doctest-dev libcli11-dev llvm-19-dev libzstd-dev zlib1g-dev
  python3 python3-pip python3-venv python3-pytest pkgconf)
missing=()
sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ ! -f "${CUDA_HOME:-/usr/local/cuda}/include/cuda.h" ]; then
  echo "install-deps: the CUDA toolkit's headers were not found (set CUDA_HOME)" >&2
  exit 1
fi
# nvdisasm, for the test suite's SASS check: a full toolkit has it; where the
# toolkit has none, NVIDIA's wheel from PyPI, unpacked into .deps/ (no
# environment is touched; tests/CMakeLists.txt looks there).
root=$(cd "$(dirname "$0")/.." && pwd)
if ! command -v nvdisasm > /dev/null && [ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvdisasm" ] &&
   [ ! -x "$root/.deps/nvdisasm/nvidia/cu13/bin/nvdisasm" ]; then
  if ! python3 -m pip --version > /dev/null 2>&1; then
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends python3-pip
  fi
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    --target "$root/.deps/nvdisasm" 'nvidia-cuda-nvdisasm>=13,<14' || {
    # Only the SASS test needs it: warn, build on, and let ctest show it skipped.
    echo "install-deps: warning: could not install nvdisasm from PyPI (nvidia-cuda-nvdisasm); the SASS test will be skipped" >&2
  }
fi
