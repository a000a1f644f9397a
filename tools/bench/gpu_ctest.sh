#!/usr/bin/env bash
# Runs every GPU test case as its own ctest (gpu.<suite>.<case>, as in a build
# folder: tests/cmake/DoctestSuites.cmake discovers them), several at once
# (most of the time is NVRTC compiling kernels on the host CPU; the processes
# share the kernel cache), from a test binary carried without its build folder.
# Extra arguments go to ctest (e.g. -R '^gpu\.grouped_gemm\.'). The log (with
# the output of failed cases) and a JUnit file go to OUT_DIR; exits non-zero if
# any case failed or timed out.
#     tools/bench/gpu_ctest.sh TEST_BINARY OUT_DIR [JOBS] [CTEST_ARGS...]
set -uo pipefail
bin=$(realpath "$1") out=$2 jobs=${3:-8}
shift $(( $# < 3 ? $# : 3 ))
root=$(dirname "$(realpath "$0")")/../..
mkdir -p "$out"
tests=$(mktemp -d)  # a ctest folder for the binary (kept out of OUT_DIR: only results travel back)
cmake -D "EXECUTABLE=$bin" -D PREFIX=gpu. -D "PROPERTIES=SKIP_RETURN_CODE;77;LABELS;gpu" \
  -D "OUT=$tests/gpu_tests.cmake" -P "$root/tests/cmake/DoctestSuites.cmake" || exit
echo 'include(gpu_tests.cmake)' > "$tests/CTestTestfile.cmake"
ctest --test-dir "$tests" -L gpu -j "$jobs" --timeout 500 --output-on-failure \
  --output-junit "$(realpath "$out")/gpu_tests.xml" "$@" 2>&1 | tee "$out/ctest.log"
