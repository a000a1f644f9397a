#!/usr/bin/env bash
# One device call for the W8A16 grouped GEMM's benchmarks: the GEMM beside kjit
# dequant + bf16 and kjit bf16 (bench_w8a16_gemm.py, both weight orientations),
# then the FP8 MoE layer three ways (bench_moe_layer.py). Binaries come prebuilt
# in .devbin/ (see docs/benchmarks.md). Results go to $OUT. Exits non-zero when
# a benchmark failed (the MoE layer's exits 1 when the paths' outputs disagree).
set -uo pipefail
bin=.devbin
# The commit the binaries were built from (results files record it; this machine's tree may hold it as
# uncommitted changes on an older commit: docs/benchmarks.md).
[ -f "$bin/commit" ] && export KJIT_BENCH_COMMIT=${KJIT_BENCH_COMMIT:-$(cat "$bin/commit")}
out=${OUT:-/tmp/kjit-out}
mkdir -p "$out"
KJIT_CACHE_DIR=$(mktemp -d)/cache
export KJIT_CACHE_DIR
export KJIT_LIBRARY=$PWD/$bin/libkjit.so PYTHONPATH=runtime/python PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee "$out/device.txt"
rc=0
for weights in e_n_k e_k_n; do
  echo "== W8A16 grouped GEMM, weights $weights"
  timeout 240 python3 tools/bench/bench_w8a16_gemm.py --weights "$weights" \
    --json "$out/bench_w8a16_gemm_$weights.json" 2>&1 | tee "$out/bench_w8a16_gemm_$weights.log"
  status=${PIPESTATUS[0]}; echo "bench_w8a16_gemm ($weights) exit $status"; [ "$status" = 0 ] || rc=1
done
echo "== FP8 MoE layer, three ways"
timeout 300 python3 tools/bench/bench_moe_layer.py --json "$out/bench_moe_layer.json" 2>&1 | tee "$out/bench_moe_layer.log"
status=${PIPESTATUS[0]}; echo "bench_moe_layer exit $status"; [ "$status" = 0 ] || rc=1
exit $rc
