#!/usr/bin/env bash
# The SASS of what `jitctl precompile` caches, on a machine with no GPU:
# every SM90 grouped GEMM kernel runs on wgmma (HGMMA, no mma.sync HMMA), the
# portable kernel built for sm_100a and sm_120a on mma.sync (HMMA, no HGMMA),
# the FP8 GEMM's SM90 kernels on FP8 wgmma (QGMMA ... E4M3.E4M3) and its
# portable ones on FP8 mma.sync (QMMA.16832 ... E4M3.E4M3 on sm_120a; sm_100a
# has no FP8 mma.sync and runs it as f16 HMMA), the W8A16 GEMM's SM90
# kernels on bf16 wgmma with A from registers (HGMMA R, R, gdesc) and its
# portable ones on bf16 mma.sync (the W4A16 GEMM's, NVFP4 and MXFP4, alike),
# and no kernel
# touches local memory (LDL/STL: spills, or an array the compiler could not
# keep in registers). ptxas's report (test_nvrtc_compile)
# says how much it spilled; this reads the instructions themselves.
# Usage: test_sass.sh JITCTL NVDISASM   (exits 77, skipped, without nvdisasm)
set -euo pipefail
jitctl=$1
nvdisasm=$2
if [ ! -x "$nvdisasm" ]; then
  echo "SKIPPED: nvdisasm not found (scripts/install-deps.sh installs it from PyPI)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export KJIT_CACHE_DIR=$work/cache
unset KJIT_CACHE_PATH

# Both layouts in every sm_90a bucket, the f32 output with a row scale (another
# epilogue), a dequant, the routing kernels, the fp8 quantizer, the FP8
# GEMM in both weight scalings (its rows-on-M kernel too, 128 and 256 weight
# rows wide), the W8A16 (also fused over block scales, both gate/up layouts) and W4A16
# GEMMs (MXFP4 read both ways), the MX quantizer in every form, the MX dequant and scale-layout kernels, the MoE activation in every
# form, and the gathering (sorted_to_flat) bf16 and W8A16 / W4A16 GEMMs.
cat > "$work/sass.json" <<'JSON'
{"kjit_manifest": 1, "name": "sass check", "kernels": [
  {"op": "grouped_gemm", "out": "bf16", "n": 4096, "k": 7168, "experts": 32,
   "weights": ["e_n_k", "e_k_n"], "offsets": "cumulative_end"},
  {"op": "grouped_gemm", "out": "f32", "n": 4096, "k": 7168, "experts": 32,
   "weights": "e_n_k", "offsets": "with_leading_zero", "row_scale": true},
  {"op": "fp8_dequant", "in": "f8_e4m3fn", "out": "bf16", "cols": 7168,
   "scale": "per_block", "block": [128, 128], "convention": "multiply"},
  {"op": "moe_routing", "experts": 256, "offsets": "cumulative_end"},
  {"op": "moe_combine", "top_k": 8, "hidden": 7168, "out": "bf16"},
  {"op": "fp8_quantize", "k": 7168, "scale_format": ["fp32", "ue8m0"], "gather": [false, true]},
  {"op": "grouped_gemm_fp8", "out": "bf16", "n": 4096, "k": 7168, "experts": 32, "weight_scale": "block_128",
   "offsets": "cumulative_end"},
  {"op": "grouped_gemm_fp8", "out": "f32", "n": 2816, "k": 1408, "experts": 128, "weight_scale": "channel",
   "offsets": "with_leading_zero", "row_scale": true},
  {"op": "grouped_gemm_fp8", "out": "bf16", "n": 4096, "k": 7168, "experts": 32, "weight_scale": "block_128",
   "offsets": "cumulative_end", "kernel": "wgmma_sm90_rows_on_m", "tile": [128, 128], "stages": 6, "cluster": 1},
  {"op": "grouped_gemm_fp8", "out": "f32", "n": 2816, "k": 1408, "experts": 128, "weight_scale": "block_128",
   "offsets": "with_leading_zero", "row_scale": true, "kernel": "wgmma_sm90_rows_on_m", "tile": [128, 256],
   "stages": 4, "cluster": 1},
  {"op": "grouped_gemm_mixed", "out": "bf16", "n": 4096, "k": 7168, "experts": 32, "weights": "e_n_k",
   "weight": "f8_e4m3fn", "weight_scale": "per_block", "scale_convention": "multiply", "offsets": "cumulative_end"},
  {"op": "grouped_gemm_mixed", "out": "f32", "n": 7168, "k": 2048, "experts": 32, "weights": "e_k_n",
   "weight": "f8_e5m2", "weight_scale": "per_row", "scale_convention": "divide", "offsets": "with_leading_zero",
   "row_scale": true},
  {"op": "grouped_gemm_mixed", "out": "bf16", "n": 4096, "k": 7168, "experts": 32, "weights": "e_n_k",
   "weight": "f8_e4m3fn", "weight_scale": "per_block", "scale_convention": "multiply", "offsets": "cumulative_end",
   "activation": "silu_mul", "gate_up_layout": ["halves", "alternating"]},
  {"op": "grouped_gemm_mixed", "out": "bf16", "n": 4096, "k": 7168, "experts": 32, "weights": "e_n_k",
   "weight": "nvfp4", "weight_scale": "per_block", "scale_convention": "divide", "offsets": "cumulative_end"},
  {"op": "grouped_gemm", "out": "bf16", "n": 4096, "k": 7168, "experts": 32, "weights": "e_n_k",
   "offsets": "cumulative_end", "gather": true},
  {"op": "grouped_gemm_mixed", "out": "bf16", "n": 4096, "k": 7168, "experts": 32, "weights": "e_n_k",
   "weight": ["f8_e4m3fn", "mxfp4"], "weight_scale": "per_block", "scale_convention": "multiply",
   "offsets": "cumulative_end", "gather": true},
  {"op": "grouped_gemm_mixed", "out": "f32", "n": 2880, "k": 2880, "experts": 128, "weights": ["e_n_k", "e_k_n"],
   "weight": "mxfp4", "weight_scale": "per_block", "scale_convention": "multiply", "offsets": "cumulative_end",
   "row_scale": true},
  {"op": "mx_quantize", "format": "nvfp4", "k": 7168, "scale_layout": ["linear", "swizzled_128x4"],
   "global_scale": ["given", "compute"], "convention": ["multiply", "divide"]},
  {"op": "mx_quantize", "format": "mxfp4", "k": 2880, "scale_layout": "swizzled_128x4"},
  {"op": "mx_quantize", "format": "mxfp8", "element": ["f8_e4m3fn", "f8_e5m2"], "k": 2880,
   "scale_layout": "linear"},
  {"op": "mx_dequant", "format": "nvfp4", "convention": ["multiply", "divide"], "out": ["bf16", "f32"], "k": 7168,
   "scale_layout": "swizzled_128x4"},
  {"op": "mx_dequant", "format": "nvfp4", "convention": "divide", "out": "bf16", "k": 48, "scale_layout": "linear",
   "selected_experts": true},
  {"op": "mx_dequant", "format": "mxfp4", "out": "bf16", "k": 2880, "scale_layout": "linear"},
  {"op": "mx_dequant", "format": "mxfp8", "element": ["f8_e4m3fn", "f8_e5m2"], "out": "f16", "k": 2880,
   "scale_layout": "swizzled_128x4"},
  {"op": "mx_scale_layout", "from": "linear", "to": "swizzled_128x4", "scale_cols": 90,
   "offsets": "cumulative_end"},
  {"op": "mx_scale_layout", "from": "swizzled_128x4", "to": "linear", "scale_cols": 448},
  {"op": "moe_activation", "activation": ["silu_mul", "swiglu_oai"], "layout": ["halves", "alternating"],
   "intermediate": 2048, "out": "f8_e4m3fn", "scale_format": ["fp32", "ue8m0"]},
  {"op": "moe_activation", "activation": ["silu_mul", "swiglu_oai"], "layout": ["halves", "alternating"],
   "intermediate": 2880, "out": "bf16"}]}
JSON
"$jitctl" precompile --manifest "$work/sass.json" --arch sm_90a,sm_100a,sm_120a -j "$(nproc)" > "$work/precompile.txt" 2>/dev/null
cat "$work/precompile.txt"
grep -q " 0 failed" "$work/precompile.txt"

"$jitctl" list --json > "$work/list.json"
python3 - "$work/list.json" > "$work/entries.txt" <<'PY'
import json, sys
for e in json.load(open(sys.argv[1])):
    print(e["key"], e["arch"], e["op"], e["spec"].get("kernel", "-"), e["canonical"].replace(" ", "_"))
PY
sort -k2,2 -k5,5 -o "$work/entries.txt" "$work/entries.txt"

passed=0
failed=0
fail() { echo "FAILED: $1"; failed=$((failed + 1)); }
count() { grep -cE "$1" "$work/k.sass" || true; }
gemm_sm90=0
gemm_portable=0
fp8_sm90=0
fp8_portable=0
fp8_decode=0
gemm_decode=0
mixed_decode=0
mixed_sm90=0
mixed_portable=0
while read -r key arch op kernel canonical; do
  "$jitctl" show "$key" --cubin "$work/k.cubin" > /dev/null
  "$nvdisasm" "$work/k.cubin" > "$work/k.sass"
  hgmma=$(count '\bHGMMA\.')
  hmma=$(count '\bHMMA\.')
  local_memory=$(count '\b(LDL|STL)\b')
  functions=$(count '^\s*\.text\.')
  echo "$arch $canonical: HGMMA $hgmma, HMMA $hmma, LDL/STL $local_memory"
  # The disassembly is real: it has a kernel's text section.
  [ "$functions" -ge 1 ] || fail "$key: nvdisasm printed no kernel"
  [ "$local_memory" -eq 0 ] || fail "$arch $canonical uses local memory"
  if [ "$op" = grouped_gemm ]; then
    case "$kernel" in
      wgmma_sm90*)
        gemm_sm90=$((gemm_sm90 + 1))
        [ "$arch" = sm_90a ] || fail "$canonical was built for $arch"
        [ "$hgmma" -gt 0 ] || fail "$canonical has no HGMMA"
        [ "$hmma" -eq 0 ] || fail "$canonical has HMMA" ;;
      mma_sync)
        gemm_portable=$((gemm_portable + 1))
        [ "$hmma" -gt 0 ] || fail "$arch $canonical has no HMMA"
        [ "$hgmma" -eq 0 ] || fail "$arch $canonical has HGMMA" ;;
      mma_decode)
        # The decode kernel (docs/decisions/0023): mma.sync on sm_90a, weights through a cp.async ring.
        gemm_decode=$((gemm_decode + 1))
        [ "$hmma" -gt 0 ] || fail "$arch $canonical has no mma.sync (HMMA)"
        [ "$hgmma" -eq 0 ] || fail "$arch $canonical has wgmma" ;;
      *) fail "$canonical: unknown kernel $kernel" ;;
    esac
  fi
  if [ "$op" = grouped_gemm_fp8 ]; then
    qgmma=$(count '\bQGMMA\.64x[0-9]+x32\.F32\.E4M3\.E4M3\b')
    qmma=$(count '\bQMMA\.16832\.F32\.E4M3\.E4M3\b')
    echo "  FP8 forms: QGMMA $qgmma, QMMA $qmma"
    case "$kernel" in
      wgmma_sm90 | wgmma_sm90_rows_on_m)
        fp8_sm90=$((fp8_sm90 + 1))
        [ "$arch" = sm_90a ] || fail "$canonical was built for $arch"
        [ "$qgmma" -gt 0 ] || fail "$canonical has no FP8 wgmma (QGMMA E4M3)"
        [ "$qmma" -eq 0 ] && [ "$hmma" -eq 0 ] || fail "$canonical has mma.sync" ;;
      mma_sync)
        # sm_120a has FP8 mma.sync (QMMA); sm_100a (like sm_90a) has it only
        # through wgmma/tcgen05, and ptxas lowers mma.sync .e4m3 to f16 HMMA.
        fp8_portable=$((fp8_portable + 1))
        if [ "$arch" = sm_120a ]; then
          [ "$qmma" -gt 0 ] || fail "$arch $canonical has no FP8 mma.sync (QMMA E4M3)"
        else
          [ "$hmma" -gt 0 ] || fail "$arch $canonical has no mma.sync (HMMA)"
        fi
        [ "$qgmma" -eq 0 ] || fail "$arch $canonical has wgmma" ;;
      wgmma_decode)
        # sm_90a's W8A8 decode kernel (docs/decisions/0023): FP8 wgmma on the codes as stored, no mma.sync.
        fp8_decode=$((fp8_decode + 1))
        [ "$arch" = sm_90a ] || fail "$canonical was built for $arch"
        [ "$qgmma" -gt 0 ] || fail "$canonical has no FP8 wgmma (QGMMA E4M3)"
        [ "$qmma" -eq 0 ] && [ "$hmma" -eq 0 ] || fail "$canonical has mma.sync" ;;
      *) fail "$canonical: unknown kernel $kernel" ;;
    esac
  fi
  if [ "$op" = grouped_gemm_mixed ]; then
    register_a=$(count '\bHGMMA\.64x[0-9]+x16\.F32\.BF16 R[0-9]+, R[0-9]+, gdesc')
    echo "  HGMMA with A from registers: $register_a"
    case "$kernel" in
      wgmma_sm90)
        mixed_sm90=$((mixed_sm90 + 1))
        [ "$arch" = sm_90a ] || fail "$canonical was built for $arch"
        [ "$register_a" -gt 0 ] && [ "$register_a" -eq "$hgmma" ] || fail "$canonical: not every HGMMA reads A from registers"
        [ "$hmma" -eq 0 ] || fail "$canonical has mma.sync" ;;
      wgmma_sm90_converter)
        # The converted bf16 tiles in shared memory: every HGMMA reads both operands there. fp8 weights have
        # converter warps, which keep 88 registers (the consumers 208); FP4 weights are converted by the
        # consumers, with the bf16 kernel's split (56, 224).
        mixed_sm90=$((mixed_sm90 + 1))
        [ "$arch" = sm_90a ] || fail "$canonical was built for $arch"
        [ "$hgmma" -gt 0 ] && [ "$register_a" -eq 0 ] || fail "$canonical: HGMMA missing or reading A from registers"
        [ "$hmma" -eq 0 ] || fail "$canonical has mma.sync"
        case "$canonical" in
          *b=nvfp4/* | *b=mxfp4/*) producer=0x38 consumer=0xe0 ;;
          *) producer=0x58 consumer=0xd0 ;;
        esac
        released=$(count "USETMAXREG\.DEALLOC\.CTAPOOL $producer ;")
        taken=$(count "USETMAXREG\.TRY_ALLOC\.CTAPOOL (UP[0-9], )?$consumer ;")
        echo "  register split: producer $producer x $released, consumers $consumer x $taken"
        [ "$released" -eq 1 ] && [ "$taken" -eq 1 ] || fail "$canonical: not the register split $producer/$consumer" ;;
      mma_sync)
        mixed_portable=$((mixed_portable + 1))
        [ "$hmma" -gt 0 ] || fail "$arch $canonical has no mma.sync (HMMA)"
        [ "$hgmma" -eq 0 ] || fail "$arch $canonical has wgmma" ;;
      mma_decode)
        # The decode kernel (docs/decisions/0023): mma.sync on sm_90a, fp8 weights through a cp.async ring, FP4
        # ones by bulk copies.
        mixed_decode=$((mixed_decode + 1))
        [ "$hmma" -gt 0 ] || fail "$arch $canonical has no mma.sync (HMMA)"
        [ "$hgmma" -eq 0 ] || fail "$arch $canonical has wgmma" ;;
      *) fail "$canonical: unknown kernel $kernel" ;;
    esac
  fi
  passed=$((passed + 1))
done < "$work/entries.txt"

# Four problems (one gathering): 3 sm_90a configurations each (the heuristic's
# buckets: 64x256, swap AB alone, swap AB in pairs along N), one portable kernel
# each on sm_100a and sm_120a.
[ "$gemm_sm90" -eq 12 ] || fail "expected 12 SM90 GEMM kernels, read $gemm_sm90"
[ "$gemm_portable" -eq 8 ] || fail "expected 8 portable GEMM kernels, read $gemm_portable"
# The decode bucket's kernel for the three problems that read [E, N, K] on sm_90a; for W8A16 / W4A16 the four
# fp8 ones and the three FP4 ones that read [E, N, K].
[ "$gemm_decode" -eq 3 ] || fail "expected 3 decode GEMM kernels, read $gemm_decode"
# FP8: two problems, three sm_90a buckets each (swap AB with 64- and 128-row
# tiles, rows on M), and two rows-on-M configurations named in full (one of them
# a bucket's too); one portable kernel per problem on sm_100a and sm_120a.
[ "$fp8_sm90" -eq 8 ] || fail "expected 8 SM90 FP8 GEMM kernels, read $fp8_sm90"
[ "$fp8_portable" -eq 4 ] || fail "expected 4 portable FP8 GEMM kernels, read $fp8_portable"
# And the decode bucket's kernel for each on sm_90a.
[ "$fp8_decode" -eq 2 ] || fail "expected 2 decode FP8 GEMM kernels, read $fp8_decode"
# W8A16 five problems (two fused over block scales, one gathering), W4A16 four (one gathering, one read
# [E, K, N]), three sm_90a buckets each (row tiles of 32 and 64; prefill the converter kernel's 256, either
# orientation; FP4 [E, K, N] the converter kernel's 64, 128, 256); one portable kernel per problem on sm_100a
# and sm_120a.
[ "$mixed_sm90" -eq 27 ] || fail "expected 27 SM90 W8A16/W4A16 GEMM kernels, read $mixed_sm90"
[ "$mixed_portable" -eq 18 ] || fail "expected 18 portable W8A16/W4A16 GEMM kernels, read $mixed_portable"
[ "$mixed_decode" -eq 7 ] || fail "expected 7 decode W8A16/W4A16 GEMM kernels, read $mixed_decode"
echo "$passed kernels read, $failed failures"
[ "$failed" -eq 0 ]
