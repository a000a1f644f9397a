#!/usr/bin/env bash
# Two builds of libkjit side by side on one GPU: a benchmark script with each
# library in turn, alternating (A B A B), each run beside its own peers (torch,
# kjit's bf16 kernel), so that a change is judged against the clock drift of a
# power-capped GPU. Build the baseline in a worktree (git worktree add
# /tmp/base REV; cmake --preset default there; cmake --build --preset default
# --target kjit) and copy its library into .devbin/ as well. BENCH picks the
# script in tools/bench (default bench_grouped_gemm.py; e.g.
# BENCH=bench_w8a16_gemm.py), and the lines of its table are printed with the
# side and round in front (with the geometric means where it prints them).
#     [BENCH=script.py] tools/bench/ab_libraries.sh LIB_A LIB_B [the script's options]
set -uo pipefail
a=$1 b=$2
shift 2
bench=${BENCH:-bench_grouped_gemm.py}
out=${OUT:-/tmp/kjit-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
for round in 1 2; do
  for side in A B; do
    lib=$a
    [ $side = B ] && lib=$b
    KJIT_CACHE_DIR=/tmp/kjit-ab-$side KJIT_LIBRARY=$(realpath "$lib") PYTHONPATH=runtime/python:tools/bench \
      PYTHONUNBUFFERED=1 timeout 300 python3 "tools/bench/$bench" --json "$out/ab-$side-$round.json" "$@" \
      > "$out/ab-$side-$round.log" 2>&1 ||
      { echo "$side$round: the benchmark failed:"; tail -5 "$out/ab-$side-$round.log"; }
    # Table rows: a layout name (bench_grouped_gemm's e_n_k / e_k_n) or a number (the others' E) first.
    grep -E "^ +(e_|[0-9])|geometric mean" "$out/ab-$side-$round.log" | sed "s/^/$side$round /"
  done
done
