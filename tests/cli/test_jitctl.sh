#!/usr/bin/env bash
# jitctl end to end on a machine with no GPU: info, precompile (twice: the
# second run is all hits), list/--json, show, verify, clear, usage errors, and
# 8 processes precompiling one manifest into one empty root at once.
# Usage: test_jitctl.sh JITCTL MANIFEST_DIR
set -euo pipefail
jitctl=$1
manifests=$2
source "$(dirname "$0")/check.sh"
export KJIT_CACHE_DIR=$work/cache
unset KJIT_CACHE_PATH

cat > "$work/small.json" <<'JSON'
{"kjit_manifest": 1, "name": "small", "kernels": [
  {"op": "fp8_dequant", "in": ["f8_e4m3fn", "f8_e5m2"], "out": "bf16", "cols": [512, 7168],
   "scale": "per_block", "block": [128, 128], "convention": "multiply"}]}
JSON

"$jitctl" info > "$work/info.txt"
check "info runs without a GPU and says so" grep -Eq "devices: no GPU|devices:" "$work/info.txt"
check "info shows the cache root" grep -q "$work/cache" "$work/info.txt"

"$jitctl" precompile --manifest "$work/small.json" --arch sm_90a,sm_100a,sm_120a -j 2 > "$work/p1.txt" 2> "$work/p1.err"
check "first precompile compiles all 12" grep -q "12 compiled, 0 already cached, 0 failed" "$work/p1.txt"
check "progress is shown line by line off a terminal" grep -q "^\[12/12\]" "$work/p1.err"
"$jitctl" precompile --manifest "$work/small.json" --arch sm_90a,sm_100a,sm_120a > "$work/p2.txt" 2>/dev/null
check "second precompile is all hits" grep -q "0 compiled, 12 already cached, 0 failed" "$work/p2.txt"

"$jitctl" list > "$work/list.txt"
check "list shows 12 entries" grep -q "^12 entries" "$work/list.txt"
"$jitctl" list --json --arch sm_100a > "$work/list.json"
check "list --json filters by arch" python3 -c "
import json,sys; e=json.load(open('$work/list.json'))
assert len(e)==4 and all(x['arch']=='sm_100a' and x['op']=='fp8_dequant' and x['state']=='ok' for x in e), e"
key=$(python3 -c "import json; print(json.load(open('$work/list.json'))[0]['key'])")
"$jitctl" show "${key:0:12}" > "$work/show.txt"
check "show prints the spec and the source" grep -q "kjit::fp8_dequant<Config>" "$work/show.txt"
"$jitctl" show "${key:0:12}" --cubin "$work/k.cubin" > /dev/null
check "show --cubin writes the cubin (an ELF file)" test "$(head -c 4 "$work/k.cubin" | tail -c 3)" = "ELF"
check "verify is clean" "$jitctl" verify

# Corrupt one entry: verify must fail and name it, --fix removes it, a precompile restores it.
entry=$(python3 -c "import json; print([x for x in json.load(open('$work/list.json'))][0]['key'])")
file=$(find "$work/cache" -name "$entry*" -type f ! -name '*.used' ! -name '*.lock' | head -1)
printf '\xff' | dd of="$file" bs=1 seek=200 conv=notrunc status=none
check "verify reports the flipped byte" bash -c "! '$jitctl' verify > '$work/verify.txt'"
check "verify names the bad key" grep -q "$entry" "$work/verify.txt"
check "verify --fix removes it" bash -c "! '$jitctl' verify --fix > /dev/null && '$jitctl' verify > /dev/null"
"$jitctl" precompile --manifest "$work/small.json" --arch sm_90a,sm_100a,sm_120a > "$work/p3.txt" 2>/dev/null
check "precompile restores the removed entry" grep -q "1 compiled, 11 already cached" "$work/p3.txt"

"$jitctl" clear --arch sm_120a > "$work/clear.txt"
check "clear --arch removes only that arch" grep -q "removed 4 entries" "$work/clear.txt"
"$jitctl" clear > /dev/null
check "clear empties the root" grep -q "no cached kernels" <("$jitctl" list)

# Usage errors: exit 2 with a message.
set +e
"$jitctl" precompile --arch sm_90a 2> "$work/usage.err"; rc=$?
set -e
check "missing --manifest is a usage error (exit 2)" test "$rc" -eq 2
check "the usage error says what is missing" grep -q "needs --manifest" "$work/usage.err"
set +e
"$jitctl" precompile --manifest "$work/small.json" --arch sm_99q 2> "$work/arch.err"; rc=$?
set -e
check "an unknown arch is a usage error" test "$rc" -eq 2
check "the unknown arch is named" grep -q "'sm_99q' is not a known arch" "$work/arch.err"
echo '{"kjit_manifest": 1, "kernels": [{"op": "fp8_dequant", "in": "f8_e4m3fn", "out": "bf16", "cols": 100, "vec": 16, "scale": "per_tensor", "convention": "multiply"}]}' > "$work/bad.json"
set +e
"$jitctl" precompile --manifest "$work/bad.json" --arch sm_90a 2> "$work/bad.err"; rc=$?
set -e
check "a bad manifest fails with exit 1" test "$rc" -eq 1
check "the bad manifest error names the kernel" grep -q "kernels\[0\]" "$work/bad.err"

# 8 processes precompiling the default manifest's first model into one empty root at once.
export KJIT_CACHE_DIR=$work/shared-cache
pids=()
for i in 1 2 3 4 5 6 7 8; do
  "$jitctl" precompile --manifest "$manifests/qwen3-30b-a3b.json" --arch sm_90a -j 1 > "$work/par$i.txt" 2>&1 &
  pids+=($!)
done
all_ok=1
for pid in "${pids[@]}"; do wait "$pid" || all_ok=0; done
check "8 concurrent precompiles all succeed" test "$all_ok" -eq 1
check "verify is clean after the concurrent precompiles" "$jitctl" verify
check "no temp files remain" test -z "$(find "$work/shared-cache" -name '*.tmp*' -print -quit)"
# 5 dequant kernels + 6 grouped GEMM problems (gate_up with and without the fused activation, each with and
# without the gather; down with and without the row scale) x 3 sm_90a token-count buckets + routing + combine
# + dispatch + 3
# fp8 quantize kernels + 3 FP8 GEMM problems x 3 sm_90a buckets (swap AB with 64- and 128-row tiles, rows on M)
# + 6 W8A16 GEMM problems (gate_up fused over the block scales and not, each with and without the gather; down
# with and without the row scale) x 3 sm_90a buckets (row tiles of 32, 64, 128) + 5 W4A16 (NVFP4) GEMM problems
# (gate_up fused and not, each gathering and not; down) x 3 buckets + 4 NVFP4 quantize kernels + 2 NVFP4
# dequant kernels + 2 moe_activation kernels (bf16 and FP8 out) + 4 grouped_gemm_wgrad kernels (gate_up and down,
# fp32 and bf16 out; one configuration each); the bf16, W8A16, W4A16 and FP8 problems have a fourth bucket each,
# the decode kernel's (+20).
check "one entry per kernel" grep -q "^103 entries" <("$jitctl" list)
check "the model's routing and combine are precompiled" \
  grep -q "moe_routing experts=128 offsets=cumulative_end" <("$jitctl" list)

# The same FP8 model for an A100 (sm_80, no FP8 tensor cores or conversions):
# the FP8 kernels are skipped and named, the rest is built, and the run succeeds
# (it exited 1, each FP8 kernel "failed").
export KJIT_CACHE_DIR=$work/ampere-cache
set +e
"$jitctl" precompile --manifest "$manifests/qwen3-30b-a3b.json" --arch sm_80 -j 2 > "$work/a100.txt" 2> "$work/a100.err"
rc=$?
set -e
check "kernels an arch cannot run do not fail the precompile" test "$rc" -eq 0
# Skipped: 5 fp8 dequant + 3 fp8 quantize kernels + 3 FP8 and 4 W8A16 GEMM problems (one portable
# configuration each) + 5 W4A16 GEMM problems (one portable configuration each) + 4 NVFP4 quantize kernels
# (e4m3 scales) + 2 NVFP4 dequant kernels + the FP8-out activation; built: the 6 bf16 GEMM problems' portable
# kernels, routing, combine, dispatch, the bf16-out activation and the 4 wgrad kernels.
check "the summary counts the skipped kernels" grep -q "14 compiled, 0 already cached, 0 failed.*; 29 skipped" "$work/a100.txt"
check "each skipped kernel is named with the reason" \
  grep -q "needs FP8 tensor cores (compute capability 8.9 or newer); sm_80" "$work/a100.err"
check "nothing of the skipped families is cached" bash -c "! '$jitctl' list | grep -q 'fp8_'"

finish
