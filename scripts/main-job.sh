#!/usr/bin/env bash
# The main job (README): install, build, precompile the bundled default
# manifest for sm_90a, sm_100a and sm_120a into the cache and list it; on a
# machine with a GPU, also launch every cached kernel kind once and verify it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset default
cmake --build --preset default
jitctl=build/tools/jitctl
"$jitctl" info
"$jitctl" precompile --manifest tools/manifests/default.json --arch sm_90a,sm_100a,sm_120a
"$jitctl" list
"$jitctl" verify
"$jitctl" selftest
