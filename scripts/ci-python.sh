#!/usr/bin/env bash
# CI's packaging checks for Python users (called by .ci/run after scripts/test.sh):
# - a fresh clone of this commit, its wheel built as `pip install .` builds it
#   (scikit-build-core builds libkjit and jitctl with the project's CMake) and
#   tagged by auditwheel (scripts/build-wheel.sh: manylinux_2_36 from Debian
#   12), installed into a new virtual environment;
# - from that environment, outside the source tree: kjit.__version__ (equal to
#   the package's metadata version), jitctl, the licence in the metadata,
#   libkjit once, the bundled manifests (files, and by name in jitctl);
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

step "fresh clone, its wheel (pip wheel ., auditwheel repair), installed into the new virtual environment"
git clone --quiet "$root" "$work/kjit"
start=$SECONDS
PATH=$venv:$PATH "$work/kjit/scripts/build-wheel.sh" "$work/dist"
wheels=("$work"/dist/kjit-*.whl)
echo "building and tagging the wheel took $((SECONDS - start)) s: $(basename "${wheels[0]}")"
[[ ${wheels[0]} == *-py3-none-manylinux_*_x86_64.whl ]] || { echo "the wheel has no manylinux tag" >&2; exit 1; }
"$venv/python" -m pip install --quiet --disable-pip-version-check "${wheels[0]}"

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
# Every module of the source package (kjit/_abi.py, the areas, the subpackages) is in the installed one.
"$venv/python" - "$work/kjit/runtime/python/kjit" <<'PY'
import pathlib, sys
import kjit
source, installed = pathlib.Path(sys.argv[1]), pathlib.Path(kjit.__file__).parent
missing = sorted(str(p.relative_to(source)) for p in source.rglob("*.py")
                 if not (installed / p.relative_to(source)).is_file())
assert not missing, f"modules of runtime/python/kjit missing from the installed package: {missing}"
print(f"every module of runtime/python/kjit is installed ({len(list(source.rglob('*.py')))} files)")
PY
"$venv/python" - <<'PY'
import importlib.metadata as m, pathlib
import kjit
meta = m.metadata("kjit")
assert meta["License-Expression"] == "Apache-2.0", f"License-Expression: {meta['License-Expression']}"
licences = [f for f in m.files("kjit") if f.name == "LICENSE"]
assert licences and "Apache License" in licences[0].read_text(), "no LICENSE in the wheel's metadata"
package = pathlib.Path(kjit.__file__).parent
libraries = sorted(p.name for p in package.rglob("libkjit*"))
assert libraries == ["libkjit.so"], f"libkjit in the wheel: {libraries}"
manifests = sorted(p.stem for p in (package / "manifests").glob("*.json"))
assert "deepseek-v3" in manifests and "default" in manifests, f"manifests in the wheel: {manifests}"
print(f"License-Expression {meta['License-Expression']}, {licences[0]}; {libraries}; manifests {manifests}")
PY
KJIT_CACHE_DIR=/dev/null/cache "$venv/jitctl" precompile --manifest deepseek-v3 --arch sm_90a > "$work/by_name.log" 2>&1 || true
grep -q "cannot be written" "$work/by_name.log" ||
  { echo "jitctl precompile --manifest deepseek-v3 did not find the bundled manifest:" >&2; cat "$work/by_name.log" >&2; exit 1; }
echo "jitctl precompile --manifest deepseek-v3: the bundled manifest is read (stopped at an unwritable cache root)"

step "the Python tests against the installed package"
# -p no:cacheprovider: nothing written into the clone; rootdir is the clone
# (its pyproject.toml), but kjit is the installed one (no PYTHONPATH).
"$venv/python" -m pytest -p no:cacheprovider -rs "$work/kjit/tests/python"
