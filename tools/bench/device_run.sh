#!/usr/bin/env bash
# One device call: GPU tests, the main job's GPU part (precompile, list,
# selftest), host-side launch costs, and the dequant benchmark. Binaries come
# prebuilt in .devbin/ (built on the dev machine; see docs/benchmarks.md).
# Results go to $OUT.
set -uo pipefail
bin=.devbin
out=${OUT:-/tmp/kjit-out}
mkdir -p "$out"
export KJIT_CACHE_DIR=$(mktemp -d)/cache
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/device.txt"
echo "== gpu tests"
timeout 300 "$bin/kjit_gpu_tests" > "$out/gpu_tests.log" 2>&1; echo "gpu tests exit $?"; tail -4 "$out/gpu_tests.log"
echo "== main job (GPU part)"
"$bin/jitctl" info
"$bin/jitctl" precompile --manifest tools/manifests/default.json --arch sm_90a,sm_100a,sm_120a 2>/dev/null
"$bin/jitctl" list | tail -3
timeout 240 "$bin/jitctl" selftest > "$out/selftest.log" 2>&1; echo "selftest exit $?"; tail -1 "$out/selftest.log"
echo "== launch costs (cold process, empty cache; then a fresh process with a warm disk cache)"
export KJIT_CACHE_DIR=$(mktemp -d)/cache
"$bin/kjit_bench_launch" | tee "$out/launch_cold.json"
"$bin/kjit_bench_launch" | tee "$out/launch_warm.json"
echo "== dequant benchmark"
KJIT_LIBRARY=$PWD/$bin/libkjit.so PYTHONPATH=runtime/python PYTHONUNBUFFERED=1 \
  python3 tools/bench/bench_dequant.py --json "$out/bench_dequant.json" 2>&1 | tee "$out/bench_dequant.log"
echo "== grouped GEMM benchmark"
KJIT_LIBRARY=$PWD/$bin/libkjit.so PYTHONPATH=runtime/python PYTHONUNBUFFERED=1 \
  python3 tools/bench/bench_grouped_gemm.py --json "$out/bench_grouped_gemm.json" 2>&1 | tee "$out/bench_grouped_gemm.log"
