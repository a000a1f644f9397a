#!/usr/bin/env bash
# A seeded fuzz of jitctl's command line and environment: every subcommand with arguments drawn from a pool
# (valid ones, garbage, huge numbers, escape sequences, bytes that are not UTF-8) under a random environment
# (cache roots and paths that are odd or not UTF-8, bad sizes, log levels, no HOME), over a root holding a valid
# entry, a corrupt one and one whose meta bytes are not UTF-8. Nothing may end on a signal; exit codes are
# 0, 1, 2 or 77; a --json run that exits 0 or 1 prints one JSON document. Nothing compiles (the manifests given
# are broken, or their kernels already cached).
# Usage: test_jitctl_fuzz.sh JITCTL KJIT_MAKE_ENTRY [ITERATIONS [SEED]]
set -euo pipefail
jitctl=$1
make_entry=$2
iterations=${3:-${KJIT_CLI_FUZZ_ITERATIONS:-150}}
RANDOM=${4:-4141}
source "$(dirname "$0")/check.sh"
unset KJIT_CACHE_PATH KJIT_CACHE_MAX_BYTES KJIT_CUDA_INCLUDE KJIT_LOG
mkdir -m 700 "$work/root"
printf '{"op":"fp8_dequant","arch":"sm_90a","canonical":"c\\u001b[2J","source":"s"}' > "$work/ok.json"
printf '{"op": "\xff' > "$work/raw.json"
"$make_entry" "$work/root" "$(printf 'a%.0s' {1..64})" "$work/ok.json"
"$make_entry" "$work/root" "$(printf 'b%.0s' {1..64})" "$work/raw.json"
mkdir -p "$work/root/cc"; printf 'junk' > "$work/root/cc/$(printf 'c%.0s' {1..64}).kjit"
cp -a "$work/root" "$work/"$'r\xff\x1b[2J'   # the same entries under a root that is not UTF-8
printf '{"kjit_manifest": 1, "kernels": [{"op": "fp8_dequant", "in": "f8_e4m3fn"' > "$work/broken.json"
printf '{"kjit_manifest": 1, "kernels": [{"op": "\xff"}]}' > "$work/nonutf8.json"

# pick POOL: sets $picked (no subshell, so that RANDOM stays one seeded sequence).
pick() { local -n pool=$1; picked=${pool[RANDOM % ${#pool[@]}]}; }
commands=(info list list show show clear prune verify verify precompile selftest help version bogus none)
# Each command's own options (values drawn from the pools below) and, now and then, anything at all.
declare -A own=([info]="" [list]="--summary --op --arch" [show]="KEY --cubin" [clear]="--yes --op --arch --older-than"
                [prune]="--max-bytes" [verify]="--fix" [precompile]="--manifest --arch -j" [selftest]="--json --exhaustive" [help]=""
                [version]="" [bogus]="" [none]="")
ops=(fp8_dequant grouped_gemm $'\xff' $'op\x1b[2J' "")
archs=(sm_90a sm_90a,sm_90a,sm_90a sm_100a,sm_90a $'sm_\x1b[2J' sm_90 "")
durations=(0s 7d 99999999999999999999w -1s 1 $'1\xffs')
sizes=(0 1 16E $'4G\xff' 1K -1 "")
keys=(aaaa bbbb cccc "$(printf 'a%.0s' {1..64})" $'a\xff' ABCD "")
cubins=("$work/out.cubin" "$work/"$'o\xff\x1b[2J' /proc/version "$work/root/aa/x.cubin" "$work/nodir/x" "")
manifests=("$work/broken.json" "$work/nonutf8.json" $'\xff' /dev/null "$work" bogus-name "")
jobs=(0 1 99999 -3 x)
garbage=(--bogus $'\x1b]0;t\x07' $'\xff\xfe' -- --help -V "" --json=1 -j)
add_option() {  # add_option OPTION: appends it and a value for it to cmd
  case $1 in
    KEY) pick keys; cmd+=("$picked");; --op) pick ops; cmd+=("$1" "$picked");; --arch) pick archs; cmd+=("$1" "$picked");;
    --older-than) pick durations; cmd+=("$1" "$picked");; --max-bytes) pick sizes; cmd+=("$1" "$picked");;
    --cubin) pick cubins; cmd+=("$1" "$picked");; --manifest) pick manifests; cmd+=("$1" "$picked");;
    -j) pick jobs; cmd+=("$1" "$picked");; *) cmd+=("$1");;
  esac
}
roots=("$work/root" "$work/"$'r\xff\x1b[2J' "$work/"$'r\xff\x1b[2J' "$work/"$'r\xff' "$work/root/aa" /proc/self ""
       relative/dir "$work/root/../root")
env_sizes=("" 1 0 4G $'1\xff' -5 99999999999999999999 1K)
logs=("" debug info $'\xff' bogus)
signals=0 bad_exit=0 bad_json=0
for i in $(seq 1 "$iterations"); do
  cmd=(); pick commands; c=$picked; [ "$c" != none ] && cmd+=("$c")
  read -r -a options <<< "${own[$c]}"
  for _ in $(seq 1 $((RANDOM % 3))); do
    [ ${#options[@]} -gt 0 ] && add_option "${options[RANDOM % ${#options[@]}]}"
  done
  [ $((RANDOM % 2)) -eq 0 ] && cmd+=(--json)
  [ $((RANDOM % 10)) -eq 0 ] && { pick garbage; cmd+=("$picked"); }
  pick roots; root=$picked; pick env_sizes; size=$picked; pick logs
  env=(KJIT_CACHE_DIR="$root" KJIT_CACHE_MAX_BYTES="$size" KJIT_LOG="$picked")
  [ $((RANDOM % 4)) -eq 0 ] && env+=(KJIT_CACHE_PATH="$work/root:"$'\xff'":/nonexistent")
  [ $((RANDOM % 6)) -eq 0 ] && env+=(HOME= XDG_CACHE_HOME=relative)
  [ $((RANDOM % 6)) -eq 0 ] && env+=(COLUMNS=$'\xff' TERM=xterm)
  set +e
  env "${env[@]}" timeout 60 "$jitctl" "${cmd[@]}" > "$work/out" 2> "$work/err" < /dev/null
  rc=$?
  set -e
  what="$(printf '%q ' "${env[@]}" "${cmd[@]}")"
  if [ "$rc" -ge 124 ]; then signals=$((signals + 1)); echo "signal or timeout ($rc): $what"; cat "$work/err";
  elif [[ ! " 0 1 2 77 " =~ " $rc " ]]; then bad_exit=$((bad_exit + 1)); echo "exit $rc: $what"; fi
  # --help wins over --json (CLI11's and every CLI's convention): its text is not a report
  if [[ " ${cmd[*]} " == *" --json "* ]] && [[ " ${cmd[*]} " != *" --help "* ]] && [ "$rc" -le 1 ] &&
     [ -s "$work/out" ] &&
     ! python3 -c 'import json,sys; json.load(sys.stdin)' < "$work/out" 2> /dev/null; then
    bad_json=$((bad_json + 1)); echo "not JSON: $what"
  fi
done
echo "$iterations invocations: $signals signals, $bad_exit other exits, $bad_json bad JSON"
check "no invocation ended on a signal" test "$signals" -eq 0
check "every exit code is 0, 1, 2 or 77" test "$bad_exit" -eq 0
check "every --json report is JSON" test "$bad_json" -eq 0
finish
