#!/usr/bin/env bash
# Disassembles up to two cached SM90 grouped GEMM kernels whose spec matches
# PATTERN (an awk regex over `jitctl list`) and counts their wgmma (HGMMA),
# mma.sync (HMMA) and local-memory (LDL/STL) instructions. Needs cuobjdump
# (the GPU machine's toolkit) and KJIT_CACHE_DIR pointing at the cache.
#     tools/bench/sass_check.sh JITCTL OUT_DIR [PATTERN]
set -uo pipefail
jitctl=$1 out=$2 pattern=${3:-kernel=wgmma_sm90}
for key in $("$jitctl" list --arch sm_90a | awk -v p="$pattern" '$0 ~ p && /kernel=wgmma_sm90/ {print $1}' | head -2); do
  "$jitctl" show "$key" --cubin "$out/k.cubin" | grep -E "^spec"
  cuobjdump -sass "$out/k.cubin" > "$out/k.sass"
  echo "HGMMA: $(grep -c HGMMA "$out/k.sass"), HMMA: $(grep -c ' HMMA' "$out/k.sass"), local memory ops: $(grep -cE 'LDL|STL' "$out/k.sass")"
  rm -f "$out/k.cubin" "$out/k.sass"
done
