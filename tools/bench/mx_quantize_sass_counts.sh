#!/usr/bin/env bash
# The MX quantizer's common-path SASS instructions (sass_hot_path.py) for
# every form at K 7168, no GPU needed: precompiles them into a fresh cache,
# disassembles each and prints the count, the threads' elements and the count
# per element (elements per thread: 8 per 16-byte chunk, 4 chunks, 8 for MX
# with swizzled scales).
#     tools/bench/mx_quantize_sass_counts.sh JITCTL NVDISASM [ARCH]   (ARCH default sm_90a)
set -euo pipefail
jitctl=$1 nvdisasm=$2 arch=${3:-sm_90a}
here=$(dirname "$(realpath "$0")")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export KJIT_CACHE_DIR=$work/cache
unset KJIT_CACHE_PATH
cat > "$work/m.json" <<'JSON'
{"kjit_manifest": 1, "name": "mx quantize SASS counts", "kernels": [
  {"op": "mx_quantize", "format": "nvfp4", "k": 7168, "scale_layout": ["linear", "swizzled_128x4"],
   "global_scale": ["given", "compute"], "convention": ["multiply", "divide"]},
  {"op": "mx_quantize", "format": "mxfp4", "k": 7168, "scale_layout": ["linear", "swizzled_128x4"]},
  {"op": "mx_quantize", "format": "mxfp8", "element": ["f8_e4m3fn", "f8_e5m2"], "k": 7168,
   "scale_layout": ["linear", "swizzled_128x4"]}]}
JSON
"$jitctl" precompile --manifest "$work/m.json" --arch "$arch" -j 2 > /dev/null 2>&1
"$jitctl" list --json | python3 -c '
import json, sys
for e in json.load(sys.stdin):
    print(e["key"], e["canonical"].replace("mx_quantize in=bf16 ", "").replace(" ", "_"))' |
  sort -k2 | while read -r key name; do
    "$jitctl" show "$key" --cubin "$work/k.cubin" > /dev/null
    "$nvdisasm" "$work/k.cubin" > "$work/k.sass"
    count=$(python3 "$here/sass_hot_path.py" "$work/k.sass" | awk '{print $1}')
    elements=32
    case $name in *mxfp*scales=swizzled*) elements=64 ;; esac
    printf '%6d / %2d = %5.1f  %s\n' "$count" "$elements" "$(echo "$count / $elements" | bc -l)" "$name"
  done
