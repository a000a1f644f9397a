#!/usr/bin/env bash
# Installs kjit's build dependencies from Debian's packages (idempotent).
# The CUDA toolkit (headers; NVRTC to compile) is expected at /usr/local/cuda
# or $CUDA_HOME: kjit loads libnvrtc and libcuda at run time, never links them.
set -euo pipefail
packages=(cmake ninja-build g++ libfmt-dev nlohmann-json3-dev doctest-dev llvm-19-dev libzstd-dev zlib1g-dev python3)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ ! -f "${CUDA_HOME:-/usr/local/cuda}/include/cuda.h" ]; then
  echo "install-deps: the CUDA toolkit's headers were not found (set CUDA_HOME)" >&2
  exit 1
fi
