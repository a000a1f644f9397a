#!/usr/bin/env bash
# The whole test suite (README): install dependencies, build, run ctest.
# GPU tests run when a GPU is present and show as skipped otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset default
cmake --build --preset default
ctest --preset default -j "$(nproc)"
