#!/usr/bin/env bash
# CI's packaging checks for Python users (called by .ci/run after scripts/test.sh):
# - a fresh clone of this commit, `pip install .` into a new virtual environment
#   (scikit-build-core builds libkjit and jitctl with the project's CMake);
# - from that environment, outside the source tree: kjit.__version__ (equal to
#   the package's metadata version) and jitctl;
# - the Python tests (tests/python) against the installed package, with torch
#   and pytest from PyPI: the argument checks, and the torch.compile test, which
#   traces a tiny MoE block of kjit ops with fullgraph=True (on fake CUDA
#   tensors without a GPU; on a GPU it also runs it and compares with eager).
#
#     scripts/ci-python.sh VENV   # a new virtual environment with torch and pytest installed
#                                 # (.ci/run installs them while the suite builds)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$(cd "$1" && pwd)/bin
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
step() { printf '\n== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

step "fresh clone, pip install . into the new virtual environment"
git clone --quiet "$root" "$work/kjit"
start=$SECONDS
(cd "$work/kjit" && "$venv/python" -m pip install --quiet --disable-pip-version-check .)
echo "pip install . took $((SECONDS - start)) s"

step "the installed package, from outside the source tree"
cd "$work"
version=$("$venv/python" -c "import kjit; print(kjit.__version__)")
metadata=$("$venv/python" -c "import importlib.metadata as m; print(m.version('kjit'))")
echo "kjit.__version__ = $version, package metadata $metadata"
[ "$version" = "$metadata" ] || { echo "kjit.__version__ differs from the package's version" >&2; exit 1; }
jitctl_version=$("$venv/jitctl" --version)
echo "jitctl --version: $jitctl_version"
[[ $jitctl_version == *"$version"* ]] || { echo "jitctl --version does not name kjit $version" >&2; exit 1; }
# The subpackage kjit.torch (MoEExperts) ships with the package (wheel.packages copies the tree).
"$venv/python" -c "from kjit.torch import MoEExperts; print('kjit.torch.MoEExperts from', MoEExperts.__module__)"

step "the Python tests against the installed package"
# -p no:cacheprovider: nothing written into the clone; rootdir is the clone
# (its pyproject.toml), but kjit is the installed one (no PYTHONPATH).
"$venv/python" -m pytest -p no:cacheprovider -rs "$work/kjit/tests/python"
