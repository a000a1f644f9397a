#!/usr/bin/env bash
# One device call for the grouped GEMM: the GPU tests, the SASS check (HGMMA in
# the SM90 kernel), and the benchmark against torch._grouped_mm (with the tile
# sweep when given --sweep). Binaries come prebuilt in .devbin/ (see
# docs/benchmarks.md). Results go to $OUT.
set -uo pipefail
bin=.devbin
# The commit the binaries were built from (results files record it; this machine's tree may hold it as
# uncommitted changes on an older commit: docs/benchmarks.md).
[ -f "$bin/commit" ] && export KJIT_BENCH_COMMIT=${KJIT_BENCH_COMMIT:-$(cat "$bin/commit")}
out=${OUT:-/tmp/kjit-out}
mkdir -p "$out"
export KJIT_CACHE_DIR=$(mktemp -d)/cache
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/device.txt"
echo "== GPU tests (every case, in parallel processes)"
tools/bench/gpu_ctest.sh "$bin/kjit_gpu_tests" "$out/gpu_tests"
rc=$?
echo "gpu tests exit $rc"
grep -h -B2 -A6 "ERROR" "$out/gpu_tests/ctest.log" | head -40
grep -q "\*\*\*Timeout" "$out/gpu_tests/ctest.log" && { echo "a case timed out: a hang; no benchmark"; exit 1; }
echo "== SASS of the SM90 kernel"
tools/bench/sass_check.sh "$bin/jitctl" "$out"
echo "== grouped GEMM benchmark"
KJIT_LIBRARY=$PWD/$bin/libkjit.so PYTHONPATH=runtime/python PYTHONUNBUFFERED=1 \
  timeout 400 python3 tools/bench/bench_grouped_gemm.py --json "$out/bench_grouped_gemm.json" "$@" 2>&1 | tee "$out/bench_grouped_gemm.log"
