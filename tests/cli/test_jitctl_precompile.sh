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
# - where mounts may be made (a private mount namespace), a read-only bind
#   mount and a full tmpfs fail up front, and a tmpfs that fills up part way
#   exits 1 naming the kernels it could not keep.
# Tests run as root in CI, and root ignores mode bits: every case here stops
# root too (mode 0500 is tried only when not root).
# Usage: test_jitctl_precompile.sh JITCTL
set -euo pipefail
jitctl=$1
source "$(dirname "$0")/check.sh"
unset KJIT_CACHE_PATH
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

# --- a read-only mount and a tmpfs that fills up, where mounts may be made ---
# (a private mount namespace: needs root or user namespaces; skipped otherwise)
if unshare -m true 2> /dev/null; then
  mkdir -m 0700 "$work/ro" "$work/full" "$work/small-fs"
  set +e
  unshare -m bash -c "
    mount --bind '$work/ro' '$work/ro' && mount -o remount,bind,ro '$work/ro' &&
    mount -t tmpfs -o size=16k,mode=0700 tmpfs '$work/full' && { cat /dev/zero > '$work/full/fill' 2> /dev/null; true; } &&
    mount -t tmpfs -o size=96k,mode=0700 tmpfs '$work/small-fs' || exit 99
    KJIT_CACHE_DIR='$work/ro' '$jitctl' precompile --manifest '$work/small.json' --arch sm_90a > /dev/null 2> '$work/ro.err'
    echo \$? > '$work/ro.rc'
    KJIT_CACHE_DIR='$work/full' '$jitctl' precompile --manifest '$work/small.json' --arch sm_90a > /dev/null 2> '$work/full.err'
    echo \$? > '$work/full.rc'
    KJIT_CACHE_DIR='$work/small-fs' '$jitctl' precompile --manifest '$work/small.json' --arch sm_90a \
      > '$work/small-fs.out' 2> '$work/small-fs.err'
    echo \$? > '$work/small-fs.rc'
    find '$work/small-fs' -name '*.kjit' | wc -l > '$work/small-fs.count'"
  mounted=$?
  set -e
  if [ "$mounted" -eq 99 ]; then
    echo "note: mounts not permitted here; the read-only and full tmpfs cases were not run"
  else
    check "precompile into a read-only bind mount exits 1" test "$(cat "$work/ro.rc")" -eq 1
    check "precompile into a read-only bind mount says so up front" grep -q "cannot be written" "$work/ro.err"
    check "precompile into a full tmpfs exits 1" test "$(cat "$work/full.rc")" -eq 1
    check "precompile into a full tmpfs says so up front" grep -q "cannot be written" "$work/full.err"
    kept=$(cat "$work/small-fs.count")
    check "precompile into a tmpfs that fills up exits 1 (kept $kept of 8)" test "$(cat "$work/small-fs.rc")" -eq 1
    check "the summary counts the $((8 - kept)) kernels not stored" grep -q "$((8 - kept)) not stored" "$work/small-fs.out"
    check "each kernel not stored is named" test "$(grep -c '^not stored in' "$work/small-fs.err")" -eq $((8 - kept))
  fi
else
  echo "note: unshare -m not permitted; the read-only mount and full tmpfs cases were not run"
fi

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

# --- the default thread count: the CPUs the process may use, not the machine's --
# (std::thread::hardware_concurrency() ignores the affinity mask and cgroup quotas)
precompile "$work/progress" "$work/out" "$work/default.err" --arch sm_90a
threads=$(sed -n 's/.* with \([0-9]*\) threads\{0,1\}$/\1/p' "$work/default.err")
affinity=$(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')
check "by default at most one thread per CPU of the affinity mask ($affinity, got '$threads')" \
  test -n "$threads" -a "${threads:-0}" -ge 1 -a "${threads:-0}" -le "$affinity"
if command -v taskset > /dev/null && taskset -c 0 true 2> /dev/null; then
  set +e
  KJIT_CACHE_DIR=$work/progress taskset -c 0 "$jitctl" precompile --manifest "$work/small.json" --arch sm_90a \
    > /dev/null 2> "$work/taskset.err" < /dev/null
  set -e
  check "pinned to one CPU (taskset -c 0), precompile uses 1 thread" grep -q ' with 1 thread$' "$work/taskset.err"
else
  echo "note: taskset not usable; the affinity case was not run"
fi

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

finish
