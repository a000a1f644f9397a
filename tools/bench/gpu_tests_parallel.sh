#!/usr/bin/env bash
# Runs every GPU test case in its own process, several at once (most of the
# suite's time is NVRTC compiling kernels on the host CPU; the processes share
# the kernel cache). Prints each case's result line; exits non-zero if any
# case failed.
#     tools/bench/gpu_tests_parallel.sh TEST_BINARY OUT_DIR [JOBS]
set -uo pipefail
bin=$1 out=$2 jobs=${3:-8}
mkdir -p "$out/cases"
# Each case's name up to its first comma (doctest splits filters on commas), as a prefix filter.
grep -ho 'TEST_CASE[A-Z_]*(\(GemmFixture, \)\?"[^"]*"' tests/gpu/*.cpp | sed 's/.*"\([^"]*\)"/\1/' | cut -d, -f1 |
  sort -u > "$out/cases.txt"
run_case() {
  local name=$1 log
  log="$2/cases/$(echo "$name" | tr -c 'A-Za-z0-9' '_' | cut -c1-60).log"
  timeout 500 "$3" -tc="$name*" > "$log" 2>&1
  echo "rc=$? $(grep -E '^\[doctest\] (test cases|assertions)' "$log" | tr '\n' ' ') :: $name"
}
export -f run_case
xargs -P "$jobs" -I{} bash -c 'run_case "$@"' _ {} "$out" "$bin" < "$out/cases.txt" | tee "$out/summary.txt"
! grep -qv '^rc=0 ' "$out/summary.txt"
