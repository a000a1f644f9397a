#!/usr/bin/env bash
# jitctl precompile where it cannot store what it builds, and its progress
# output, on a machine with no GPU:
# - a writable root that is not usable at all (a path under a file, under
#   /proc, a read-only directory) fails up front, exit 1, naming the root;
# - a root where some kernels cannot be stored (their shard is a file, which
#   stops root as well as anyone) exits 1 and names each kernel not stored;
# - progress: on a terminal one line redrawn with \r that fits COLUMNS and
#   shows the rate and an ETA; on a pipe or TERM=dumb plain lines, about one
#   per 10% rather than one per kernel.
# Tests run as root in CI, and root ignores mode bits: every case here stops
# root too (mode 0500 is tried only when not root).
# Usage: test_jitctl_precompile.sh JITCTL
set -euo pipefail
jitctl=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset KJIT_CACHE_PATH
passed=0
failed=0
check() {  # check NAME COMMAND...: the command must succeed
  local name=$1; shift
  if "$@"; then passed=$((passed + 1)); else echo "FAILED: $name"; failed=$((failed + 1)); fi
}
precompile() {  # precompile ROOT OUT ERR ARGS...: sets $rc
  local root=$1 out=$2 err=$3; shift 3
  set +e
  KJIT_CACHE_DIR=$root "$jitctl" precompile --manifest "$work/small.json" "$@" > "$out" 2> "$err" < /dev/null
  rc=$?
  set -e
}
cat > "$work/small.json" <<'JSON'
{"kjit_manifest": 1, "name": "small", "kernels": [
  {"op": "fp8_dequant", "in": ["f8_e4m3fn", "f8_e5m2"], "out": "bf16", "cols": [512, 1024, 2048, 7168],
   "scale": "per_block", "block": [128, 128], "convention": "multiply"}]}
JSON

# --- no usable writable root: fail before compiling anything ------------------
touch "$work/a-file"
unusable=("$work/a-file/cache" "/dev/null/x" "/proc/kjit-cache")
if [ "$(id -u)" -ne 0 ]; then
  mkdir -m 0500 "$work/mode-0500"
  unusable+=("$work/mode-0500/cache" "$work/mode-0500")
fi
for root in "${unusable[@]}"; do
  precompile "$root" "$work/out" "$work/err" --arch sm_90a
  check "precompile into $root exits 1 (got $rc)" test "$rc" -eq 1
  check "precompile into $root names the root" grep -qF "$root" "$work/err"
  check "precompile into $root compiles nothing" bash -c "! grep -qE '^precompiling|^\[' '$work/err'"
done

# --- some kernels cannot be stored: exit 1 and name them ----------------------
precompile "$work/reference" "$work/ref.out" "$work/ref.err" --arch sm_90a --json
check "precompile into a fresh root succeeds" test "$rc" -eq 0
python3 -c "
import json; j=json.load(open('$work/ref.out'))
assert j['compiled']==8 and j['not_stored']==[], j" || { echo "FAILED: precompile --json reports 8 compiled"; failed=$((failed + 1)); }
mkdir -p "$work/partial"
chmod 0700 "$work/partial"
# Block the shards of two keys with files (the kernels stay in the reference root).
for shard in $(find "$work/reference" -name '*.kjit' | sort | head -2 | xargs -n1 dirname | xargs -n1 basename); do
  touch "$work/partial/$shard"
done
blocked_keys=$(for shard in "$work"/partial/*; do
  find "$work/reference/$(basename "$shard")" -name '*.kjit' -printf '%f\n'; done | sed 's/\.kjit$//')
blocked=$(echo "$blocked_keys" | wc -l)
precompile "$work/partial" "$work/out" "$work/err" --arch sm_90a
check "precompile with $blocked kernels it cannot store exits 1 (got $rc)" test "$rc" -eq 1
check "the summary counts the kernels not stored" grep -q "$blocked not stored" "$work/out"
for key in $blocked_keys; do
  spec=$(KJIT_CACHE_DIR=$work/reference "$jitctl" show "$key" | sed -n 's/^spec: *//p')
  check "the kernel not stored is named: $spec" grep -qF "$spec" "$work/err"
done
check "the other kernels were stored" test "$(find "$work/partial" -name '*.kjit' | wc -l)" -eq $((8 - blocked))

# --- progress ------------------------------------------------------------------
# 24 kernels, all cached: the progress output alone is under test.
precompile "$work/progress" "$work/out" "$work/err" --arch sm_90a,sm_100a,sm_120a -j 2
check "the progress fixture precompiles" test "$rc" -eq 0
precompile "$work/progress" "$work/out" "$work/pipe.err" --arch sm_90a,sm_100a,sm_120a
check "on a pipe progress has no carriage returns" bash -c "! grep -q $'\r' '$work/pipe.err'"
lines=$(grep -c '^\[' "$work/pipe.err" || true)
check "on a pipe progress is about one line per 10% (got $lines for 24 kernels)" test "$lines" -ge 5 -a "$lines" -le 12
check "on a pipe the last progress line is complete" grep -q '^\[24/24\]' "$work/pipe.err"
check "progress lines show a rate" grep -q '/s' "$work/pipe.err"

if command -v script > /dev/null; then
  # script(1) gives jitctl a terminal; with no window size it must fall back to COLUMNS.
  KJIT_CACHE_DIR=$work/progress COLUMNS=50 TERM=xterm script -qec \
    "'$jitctl' precompile --manifest '$work/small.json' --arch sm_90a,sm_100a,sm_120a -j 1 2>&1 >/dev/null" \
    "$work/tty.log" > /dev/null < /dev/null
  # (the terminal itself turns each \n into \r\n: only a \r inside a line is a redraw)
  check "on a terminal progress is redrawn with carriage returns" grep -q $'\r[^\r]' "$work/tty.log"
  widest=$(tr '\r' '\n' < "$work/tty.log" | grep -v '^Script ' | sed 's/\x1b\[K//g' | awk '/^\[/ { if (length($0) > w) w = length($0) } END { print w + 0 }')
  check "on a 50-column terminal no progress line is wider than 49 (got $widest)" test "$widest" -le 49
  check "on a terminal progress shows an ETA" grep -q 'ETA' "$work/tty.log"
  KJIT_CACHE_DIR=$work/progress COLUMNS=50 TERM=dumb script -qec \
    "'$jitctl' precompile --manifest '$work/small.json' --arch sm_90a,sm_100a,sm_120a -j 1 2>&1 >/dev/null" \
    "$work/dumb.log" > /dev/null < /dev/null
  check "with TERM=dumb progress is plain lines" bash -c "! sed 's/\r$//' '$work/dumb.log' | grep -q $'\r'"
  check "with TERM=dumb no escape sequences are written" bash -c "! grep -q $'\x1b' '$work/dumb.log'"
else
  echo "note: script(1) not found; the terminal cases were not run"
fi

echo "$passed passed, $failed failed"
test "$failed" -eq 0
