#!/usr/bin/env bash
# Two builds of libkjit side by side on one GPU: bench_grouped_gemm.py with
# each library in turn, alternating (A B A B), each run beside torch, so that
# a change is judged against the clock drift of a power-capped GPU. Build the
# baseline in a worktree (git worktree add /tmp/base REV; cmake --preset
# default there; cmake --build --preset default --target kjit) and copy its
# library into .devbin/ as well.
#     tools/bench/ab_libraries.sh LIB_A LIB_B [bench_grouped_gemm.py options]
set -uo pipefail
a=$1 b=$2
shift 2
out=${OUT:-/tmp/kjit-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
for round in 1 2; do
  for side in A B; do
    lib=$a
    [ $side = B ] && lib=$b
    KJIT_CACHE_DIR=/tmp/kjit-ab-$side KJIT_LIBRARY=$(realpath "$lib") PYTHONPATH=runtime/python PYTHONUNBUFFERED=1 \
      timeout 300 python3 tools/bench/bench_grouped_gemm.py --json "$out/ab-$side-$round.json" "$@" \
      > "$out/ab-$side-$round.log" 2>&1 ||
      { echo "$side$round: the benchmark failed:"; tail -5 "$out/ab-$side-$round.log"; }
    grep -E "^ +e_" "$out/ab-$side-$round.log" | sed "s/^/$side$round /"
  done
done
