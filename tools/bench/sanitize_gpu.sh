#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck (shared-memory hazards) and synccheck
# over small calls of every kernel family: one GPU test case per family, run
# first without a tool ("plain": the case passes, and NVRTC fills the kernel
# cache outside the sanitizers), then under each tool. Prints one line per
# tool x family (also to OUT_DIR/summary.txt), puts the logs of failed runs
# in OUT_DIR/failures.log, and exits 1 on any report, failed case or timeout.
#     tools/bench/sanitize_gpu.sh BUILD_DIR OUT_DIR
# BUILD_DIR holds kjit_gpu_tests, directly (.devbin/) or in tests/ (a build
# folder). KJIT_CACHE_DIR is used if set, else a fresh one; JOBS runs at once
# (default 5), TIMEOUT seconds each (default 300); ONLY, a regex, picks families
# (e.g. ONLY='mx_.*|w4a16_gemm').
set -uo pipefail
build=$1 out=$2
bin=$build/kjit_gpu_tests
[[ -x $bin ]] || bin=$build/tests/kjit_gpu_tests
[[ -x $bin ]] || { echo "sanitize_gpu.sh: no kjit_gpu_tests in $build or $build/tests" >&2; exit 2; }
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[[ -x $sanitizer ]] || { echo "sanitize_gpu.sh: compute-sanitizer not found" >&2; exit 2; }
mkdir -p "$out"
logs=$(mktemp -d)
export KJIT_CACHE_DIR=${KJIT_CACHE_DIR:-$(mktemp -d)/cache}
export KJIT_LINEINFO=1  # the reports' source lines
export bin sanitizer logs TIMEOUT=${TIMEOUT:-300}

# family|doctest suite|test case (its name exactly as in tests/gpu). On Hopper
# the grouped GEMM case runs every kernel path: SM90 (both buckets, clusters),
# swap AB (with and without a workspace), decode, short K (where K <= 32) and the portable kernel; the FP8
# GEMM's case runs its SM90 tiles, pairs and portable tiles; the W8A16 GEMM's
# its default (SM90) kernel and the portable one, both orientations; the
# W4A16 GEMM's both formats on both kernels; the W8A16 fused activation over
# block scales its SM90 row tiles and the portable kernel, both gate/up layouts.
cases=(
  "dequant|dequant|every dtype, granularity and convention is bit-exact on odd shapes with partial blocks"
  "grouped_gemm|grouped_gemm|one expert owning every row, and a single expert"
  "gemm_activation|grouped_gemm|the fused activation with N a multiple of every tile and a tall expert (cluster paths)"
  "w8a16_block_activation|grouped_gemm_mixed|fused activation over 128 x 128 block scales: a wider stack (I = 520, up rows off the block grid), e5m2 codes, one expert owning most rows, the rows gathered"
  "gemm_gather|grouped_gemm|a gather entry past tokens * top_k reads zeros and is reported"
  "gemm_addend|grouped_gemm|an addend (bf16 or fp32, out itself or not): every kernel path, layout, output type and row scale"
  "gemm_addend_rank|grouped_gemm|an addend at K a LoRA rank (16: the short-K kernel's), every kernel path, layout, output type and row scale"
  "gemm_short_k|grouped_gemm|K a LoRA rank (8 to 32): every kernel path (the short-K kernel's among them), layout, convention, output type and row scale, a gathered A, bad offsets"
  "w8a16_gather|grouped_gemm_mixed|a gathered A (sorted_to_flat) gives the bytes of the W8A16 GEMM on the gathered copy: every row tile, the portable kernel, K no multiple of the k-block, zero rows, both orientations"
  "routing_one_block|moe_routing|routing equals the CPU reference: prefill, decode, both offset conventions, many experts"
  "routing_many_blocks|moe_routing|with a workspace, large batches route over many blocks to the same result"
  "combine|moe_combine|combine sums weighted expert rows back in token order, skipping other ranks' rows"
  "quantize|fp8_quantize|gather through a real routing: row r quantizes token sorted_to_flat[r] / top_k, -1 rows are zero"
  "fp8_gemm|grouped_gemm_fp8|one expert owning every row (333, no multiple of any tile), and a single expert"
  "w8a16_gemm|grouped_gemm_mixed|one expert owning every row (333, no multiple of any tile), and one expert with partial scale blocks"
  "gemm_decode|grouped_gemm_decode|one token, top 8 over 128 experts: its 8 experts all distinct, and all equal (8 rows of one expert)"
  "gemm_decode_one_pair|grouped_gemm_decode|256 experts with one routed pair, both conventions, e5m2 codes, fp32 output"
  "fp8_gemm_decode|grouped_gemm_fp8|decode sizes: one token's 8 rows on 8 experts or on one, 256 experts with one row, K of 3 and 57 k-blocks"
  "w4a16_gemm|grouped_gemm_mixed|W4A16: both formats, NVFP4's global multiplied and divided, uneven routing with empty experts"
  "w4a16_gemm_kn|grouped_gemm_mixed|W4A16 read [E, K, N] (the stored [E, N, K / 2] for the backward pass's dX): both formats, uneven routing with empty experts, N no multiple of the 128-column tile, K of the 64-row stage"
  "mx_dequant|mx_dequant|DeepSeek-V3 and gpt-oss shapes are bit-exact: NVFP4 K 7168 / 2048 swizzled, MXFP4 K 2880 linear"
  "mx_quantize|mx_quantize|a swizzled layout writes every padding byte 0 and each expert at its 128-row-padded base"
  "mx_scale_layout|mx_scale_layout|device offsets of both conventions, empty experts and rows past the last offset"
  "grouped_gemm_wgrad|grouped_gemm_wgrad|tiny N (LoRA ranks 8, 16, 40, 64) on the narrow tile, and tiny K"
  "grouped_gemm_wgrad_uneven|grouped_gemm_wgrad|uneven experts (empty ones, odd row counts) match fp64 in fp32 and bf16 out, both conventions"
  "moe_activation|moe_activation|valid_rows: rows at or past it are zeros (FP8: codes 0, scale 0), read from the device, any value"
  "activation_gradient|moe_activation|the gradient (grad given) is bit-exact for both activations and every layout, the models' I, valid_rows, a padded input stride and the edge values"
  "combine_gradient|moe_combine|the weights' gradient is bit-exact: a dot product per pair in kjit.h's order, +0 for other ranks' pairs"
  "dispatch|moe_combine|the dispatch copies each token's row to its rows in expert order, zeroes the rows past the routed ones, and skips other ranks' pairs"
)

# Runs one case under one tool ("plain": none) and prints its summary line.
run_one() {
  local tool=$1 family=$2 suite=$3 name=$4 log="$logs/$1.$2.log" rc start verdict
  local -a tool_args=()
  case $tool in
    memcheck) tool_args=(--tool memcheck) ;;
    racecheck) tool_args=(--tool racecheck --racecheck-report hazard) ;;
    synccheck) tool_args=(--tool synccheck) ;;
  esac
  start=$SECONDS
  # doctest filters are comma-separated: a comma in a name is escaped.
  if [[ $tool == plain ]]; then
    timeout "$TIMEOUT" "$bin" "--test-suite=$suite" "--test-case=${name//,/\\,}" > "$log" 2>&1
  else
    timeout "$TIMEOUT" "$sanitizer" "${tool_args[@]}" --error-exitcode 1 --print-limit 20 \
      "$bin" "--test-suite=$suite" "--test-case=${name//,/\\,}" > "$log" 2>&1
  fi
  rc=$?
  local errors hazards
  errors=$(grep -oE 'ERROR SUMMARY: [0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
  hazards=$(grep -oE 'RACECHECK SUMMARY: [0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
  if [[ $rc == 124 ]]; then verdict="FAIL: timed out after ${TIMEOUT}s"
  elif [[ $tool != plain && -z $errors$hazards ]]; then verdict="FAIL: no sanitizer summary (exit $rc)"
  elif [[ ${errors:-0} != 0 || ${hazards:-0} != 0 ]]; then
    verdict="FAIL: ${hazards:-$errors} reported; first: $(grep -m1 -E '^========= +(Error|Warning|Invalid|Barrier|Race)' "$log" | cut -c1-160)"
  elif [[ $rc != 0 ]]; then verdict="FAIL: the test case failed (exit $rc)"
  elif ! grep -qE 'test cases: *1 \| *1 passed' "$log"; then verdict="FAIL: the test case did not run (renamed?)"
  else verdict="clean"
  fi
  printf '%-10s %-20s %s (%ds)\n' "$tool" "$family" "$verdict" $((SECONDS - start))
}
export -f run_one

list_runs() {  # TOOL...: one line "tool|family|suite|name" per tool and case (ONLY: a regex of families)
  local tool c
  for tool in "$@"; do for c in "${cases[@]}"; do
    [[ -z ${ONLY:-} || ${c%%|*} =~ ^(${ONLY})$ ]] && printf '%s|%s\n' "$tool" "$c"
  done; done
}
run_all() { tr '\n' '\0' | xargs -0 -P "${JOBS:-5}" -I{} bash -c 'IFS="|" read -r t f s n <<< "$1"; run_one "$t" "$f" "$s" "$n"' _ {}; }

{
  list_runs plain | run_all
  list_runs memcheck racecheck synccheck | run_all
} | tee "$out/summary.txt"
: > "$out/failures.log"
grep 'FAIL' "$out/summary.txt" | while read -r tool family _; do
  { echo "==== $tool $family"; head -c 20000 "$logs/$tool.$family.log"; echo; } >> "$out/failures.log"
done
! grep -q 'FAIL' "$out/summary.txt"
