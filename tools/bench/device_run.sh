#!/usr/bin/env bash
# One device call: GPU tests (C++ and the Python MoE pipeline), the
# sanitizers over every kernel family, the main job's GPU part (precompile,
# list, selftest), the SASS check of the SM90 grouped GEMM, host-side launch
# costs, and the dequant and grouped GEMM benchmarks. Binaries come prebuilt in .devbin/ (built on the dev machine;
# see docs/benchmarks.md). Results go to $OUT.
set -uo pipefail
bin=.devbin
# The commit the binaries were built from (results files record it; this machine's tree may hold it as
# uncommitted changes on an older commit: docs/benchmarks.md).
[ -f "$bin/commit" ] && export KJIT_BENCH_COMMIT=${KJIT_BENCH_COMMIT:-$(cat "$bin/commit")}
out=${OUT:-/tmp/kjit-out}
mkdir -p "$out"
export KJIT_CACHE_DIR=$(mktemp -d)/cache
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/device.txt"
echo "== gpu tests"
tools/bench/gpu_ctest.sh "$bin/kjit_gpu_tests" "$out/gpu_tests"; echo "gpu tests exit $?"
echo "== compute-sanitizer memcheck, racecheck, synccheck (every family)"
tools/bench/sanitize_gpu.sh "$bin" "$out/sanitize"; echo "sanitizers exit $?"
echo "== Python MoE pipeline test"
KJIT_LIBRARY=$PWD/$bin/libkjit.so PYTHONPATH=runtime/python timeout 120 python3 tests/python/test_moe_pipeline_gpu.py "$PWD/$bin/libkjit.so" 2>&1 | tail -3
echo "== main job (GPU part)"
"$bin/jitctl" info
"$bin/jitctl" precompile --manifest tools/manifests/default.json --arch sm_90a,sm_100a,sm_120a 2>/dev/null
"$bin/jitctl" list | tail -3
timeout 240 "$bin/jitctl" selftest > "$out/selftest.log" 2>&1; echo "selftest exit $?"; tail -1 "$out/selftest.log"
grep -E ": error|wrong elements|relative error [1-9]\.[0-9]e-0[01]|relative error [0-9.]+e\+|nan" "$out/selftest.log" | head -5
echo "== SASS of the SM90 grouped GEMM (both token-count buckets)"
tools/bench/sass_check.sh "$bin/jitctl" "$out" "n=4096 k=7168"
echo "== launch costs (cold process, empty cache; then a fresh process with a warm disk cache)"
export KJIT_CACHE_DIR=$(mktemp -d)/cache
"$bin/kjit_bench_launch" | tee "$out/launch_cold.json"
"$bin/kjit_bench_launch" | tee "$out/launch_warm.json"
echo "== dequant benchmark"
KJIT_LIBRARY=$PWD/$bin/libkjit.so PYTHONPATH=runtime/python PYTHONUNBUFFERED=1 \
  python3 tools/bench/bench_dequant.py --json "$out/bench_dequant.json" 2>&1 | tee "$out/bench_dequant.log"
echo "== grouped GEMM benchmark"
KJIT_LIBRARY=$PWD/$bin/libkjit.so PYTHONPATH=runtime/python PYTHONUNBUFFERED=1 \
  python3 tools/bench/bench_grouped_gemm.py --layouts e_n_k,e_k_n --json "$out/bench_grouped_gemm.json" 2>&1 | tee "$out/bench_grouped_gemm.log"
