#!/usr/bin/env bash
# jitctl's command line as a user meets it, on a machine with no GPU: help on
# every subcommand, --version, --json on every command that reports, usage
# errors (exit 2) for unknown options and bad values, values that must never
# destroy a cache (durations without a unit, overflowing sizes and durations,
# signs, 20-digit numbers), `clear` of a large cache without --yes off a
# terminal, and `selftest` with nothing to run (exit 77, skipped, saying why);
# the aliases (help, version, -V), "did you mean" for commands, options, filter
# values and manifest names, and bundled manifests found by name.
# Usage: test_jitctl_args.sh JITCTL KJIT_VERSION
set -euo pipefail
jitctl=$1
version=$2
source "$(dirname "$0")/check.sh"
export KJIT_CACHE_DIR=$work/cache
unset KJIT_CACHE_PATH
run() {  # run OUT ERR ARGS...: runs jitctl with stdin closed, sets $rc
  local out=$1 err=$2; shift 2
  set +e
  "$jitctl" "$@" > "$out" 2> "$err" < /dev/null
  rc=$?
  set -e
}
entries() { "$jitctl" list --json | python3 -c "import json,sys; print(len(json.load(sys.stdin)))"; }
is_json() { python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$1"; }

# --- help and version --------------------------------------------------------
run "$work/out" "$work/err" --version
check "--version exits 0" test "$rc" -eq 0
check "--version prints kjit's version" grep -qF "$version" "$work/out"
run "$work/out" "$work/err" --help
check "--help exits 0" test "$rc" -eq 0
for cmd in info list show clear prune verify precompile selftest; do
  check "--help lists $cmd" grep -q "^  $cmd" "$work/out"
done
for cmd in info list show clear prune verify precompile selftest; do
  run "$work/out" "$work/err" "$cmd" --help
  check "$cmd --help exits 0" test "$rc" -eq 0
  check "$cmd --help prints its own usage" grep -q "jitctl $cmd" "$work/out"
  check "$cmd --help documents --json" grep -q -- '--json' "$work/out"
done
run "$work/out" "$work/err"
check "no command is a usage error (exit 2)" test "$rc" -eq 2

# --- unknown options and bad values: exit 2, nothing run ---------------------
usage_error() {  # usage_error NAME ARGS...: exit 2 and a message naming the problem
  local name=$1; shift
  run "$work/out" "$work/err" "$@"
  check "$name: exit 2 (got $rc)" test "$rc" -eq 2
  check "$name: says why on stderr" grep -qi "error" "$work/err"
}
usage_error "an unknown command" frobnicate
usage_error "an unknown option of list" list --frobnicate
usage_error "an unknown option of info" info --all
usage_error "a stray argument to verify" verify now
usage_error "a -j that is not a number" precompile --manifest x.json --arch sm_90a -j many
usage_error "a -j of 0" precompile --manifest x.json --arch sm_90a -j 0
usage_error "a --cubin with no value" show abc --cubin

# --- aliases, "did you mean", checked filter values -------------------------------
run "$work/out" "$work/err" help
check "help exits 0 (got $rc)" test "$rc" -eq 0
check "help prints the usage with every command" grep -q "^  precompile" "$work/out"
run "$work/out" "$work/err" help list
check "help list is list --help" grep -q "jitctl list" "$work/out"
check "help list documents --summary" grep -q -- "--summary" "$work/out"
for alias in version -V; do
  run "$work/out" "$work/err" $alias
  check "$alias exits 0 (got $rc)" test "$rc" -eq 0
  check "$alias prints kjit's version" grep -qF "$version" "$work/out"
done
did_you_mean() {  # did_you_mean NAME EXPECTED ARGS...: exit 2 and the nearest name suggested on stderr
  local name=$1 expected=$2; shift 2
  run "$work/out" "$work/err" "$@"
  check "$name: exit 2 (got $rc)" test "$rc" -eq 2
  check "$name: suggests $expected" grep -qF "did you mean '$expected'?" "$work/err"
}
did_you_mean "jitctl lst" list lst
did_you_mean "jitctl precompil" precompile precompil
did_you_mean "jitctl help lsit" list help lsit
did_you_mean "list --sumary" --summary list --sumary
did_you_mean "list --jsn" --json list --jsn
did_you_mean "precompile --manfest" --manifest precompile --manfest x --arch sm_90a
did_you_mean "--verison" --version --verison
did_you_mean "list --arch sm_90" sm_90a list --arch sm_90
check "list --arch sm_90: says sm_90 is not a known arch" grep -qF "'sm_90' is not a known arch" "$work/err"
did_you_mean "list --op fp8_deqant" fp8_dequant list --op fp8_deqant
did_you_mean "clear --arch sm100a" sm_100a clear --arch sm100a --yes
did_you_mean "precompile --arch sm_90a,sm_100" sm_100a precompile --manifest default --arch sm_90a,sm_100
usage_error "list --arch sm_91zz (nothing near)" list --arch sm_91zz
check "an unknown arch lists the known ones" grep -q "known: sm_80" "$work/err"
usage_error "list --op nonsense" list --op nonsense
check "an unknown op lists the known ones" grep -q "known: fp8_dequant" "$work/err"
usage_error "show KEY that is not hex" show not-a-key
check "show says what a key is" grep -q "hex" "$work/err"
run "$work/out" "$work/err" frobnicate
check "an unknown command far from any lists the commands" grep -q "commands: info, list" "$work/err"

# --- bundled manifests by name ---------------------------------------------------
run "$work/out" "$work/err" precompile --manifest deepseek --arch sm_90a
check "an unknown manifest name fails (got $rc)" test "$rc" -eq 1
check "an unknown manifest name suggests the nearest" grep -qF "did you mean 'deepseek-v3'?" "$work/err"
check "an unknown manifest name lists the bundled ones" grep -q "bundled: deepseek-v3, default, " "$work/err"
# A name resolves to the bundled manifest: the run gets past reading it and
# stops at the cache root, which cannot be written (nothing is compiled).
for name in deepseek-v3 default.json; do
  KJIT_CACHE_DIR=/dev/null/cache run "$work/out" "$work/err" precompile --manifest "$name" --arch sm_90a
  check "--manifest $name is read (stops at the unwritable root; got $rc)" grep -q "cannot be written" "$work/err"
done

# --- a cache of 24 entries to (not) destroy ------------------------------------
cat > "$work/small.json" <<'JSON'
{"kjit_manifest": 1, "name": "small", "kernels": [
  {"op": "fp8_dequant", "in": ["f8_e4m3fn", "f8_e5m2"], "out": "bf16", "cols": [512, 1024, 2048, 7168],
   "scale": "per_block", "block": [128, 128], "convention": "multiply"}]}
JSON
run "$work/out" "$work/err" precompile --manifest "$work/small.json" --arch sm_90a,sm_100a,sm_120a -j 2
check "the fixture precompiles" test "$rc" -eq 0
n=$(entries)
check "the fixture holds more than 20 entries" test "$n" -gt 20

destructive_refused() {  # destructive_refused NAME ARGS...: exit 2 and every entry still there
  local name=$1; shift
  run "$work/out" "$work/err" "$@"
  check "$name: exit 2 (got $rc)" test "$rc" -eq 2
  check "$name: removes nothing" test "$(entries)" -eq "$n"
}
destructive_refused "clear --older-than 7 (a duration needs a unit)" clear --older-than 7
destructive_refused "clear --older-than 999999999999999999d (overflow)" clear --older-than 999999999999999999d
destructive_refused "clear --older-than -5d" clear --older-than -5d
destructive_refused "clear --older-than 7days" clear --older-than 7days
destructive_refused "clear --older-than with no value" clear --older-than
destructive_refused "prune --max-bytes 17179869184G (wraps to 0)" prune --max-bytes 17179869184G
destructive_refused "prune --max-bytes -5" prune --max-bytes -5
destructive_refused "prune --max-bytes of 20 digits" prune --max-bytes 99999999999999999999
destructive_refused "prune --max-bytes 1.5G" prune --max-bytes 1.5G
destructive_refused "clear of a cache of $n entries without --yes and no terminal" clear
check "the refusal says --yes is needed" grep -q -- "--yes" "$work/err"
run "$work/out" "$work/err" clear --older-than 1w
check "clear --older-than 1w is accepted and keeps the fresh entries" test "$rc" -eq 0 -a "$(entries)" -eq "$n"
run "$work/out" "$work/err" prune --max-bytes 16E
check "prune --max-bytes 16E (too big) is refused" test "$rc" -eq 2 -a "$(entries)" -eq "$n"
run "$work/out" "$work/err" prune --max-bytes 1G
check "prune --max-bytes 1G keeps everything" test "$rc" -eq 0 -a "$(entries)" -eq "$n"

# --- --json on every command that reports ------------------------------------
key=$("$jitctl" list --json | python3 -c "import json,sys; print(json.load(sys.stdin)[0]['key'])")
for args in "info" "list" "list --summary" "show ${key:0:12}" "verify" "prune" "clear --arch sm_100a --op grouped_gemm" \
            "precompile --manifest $work/small.json --arch sm_90a"; do
  # shellcheck disable=SC2086
  run "$work/out.json" "$work/err" $args --json
  check "$args --json exits 0 (got $rc)" test "$rc" -eq 0
  check "$args --json prints one JSON document" is_json "$work/out.json"
done
"$jitctl" info --json > "$work/info.json"
check "info --json has the version and the writable root" python3 -c "
import json; j=json.load(open('$work/info.json'))
assert j['version']=='$version' and j['cache']['writable_root']=='$work/cache', j"
"$jitctl" list --summary > "$work/summary.txt"
check "list --summary counts per op and arch" grep -Eq "fp8_dequant +sm_90a +8( |$)" "$work/summary.txt"
check "list --summary is short" test "$(wc -l < "$work/summary.txt")" -lt 10
"$jitctl" verify --json > "$work/verify.json"
check "verify --json counts the entries" python3 -c "
import json; j=json.load(open('$work/verify.json')); assert j['bad']==[] and j['verified']==$n, j"

cp -a "$work/cache" "$work/copy"
if command -v script > /dev/null; then
  # On a terminal (script(1) gives one, fed from our stdin) clear asks; only "y" removes.
  printf 'n\n' | KJIT_CACHE_DIR=$work/copy script -qec "'$jitctl' clear" "$work/ask.log" > /dev/null || true
  check "clear of a large cache asks on a terminal" grep -q "remove all $n entries of $work/copy? \[y/N\]" "$work/ask.log"
  check "answering n removes nothing" test "$(KJIT_CACHE_DIR=$work/copy entries)" -eq "$n"
  printf 'y\n' | KJIT_CACHE_DIR=$work/copy script -qec "'$jitctl' clear" "$work/ask.log" > /dev/null
  check "answering y removes everything" test "$(KJIT_CACHE_DIR=$work/copy entries)" -eq 0
  rm -rf "$work/copy"
  cp -a "$work/cache" "$work/copy"
else
  echo "note: script(1) not found; the terminal confirmation was not tested"
fi
run "$work/out" "$work/err" clear --arch sm_120a --op fp8_dequant --json
check "clear --json says how many it removed" python3 -c "
import json; j=json.load(open('$work/out')); assert j['removed']==8, j"
KJIT_CACHE_DIR=$work/copy run "$work/out" "$work/err" clear --yes
check "clear --yes removes a large cache off a terminal" test "$rc" -eq 0 -a "$(KJIT_CACHE_DIR=$work/copy entries)" -eq 0

# --- selftest with nothing to run: skipped (77), saying why -------------------
run "$work/out" "$work/err" selftest
check "selftest with nothing to run exits 77 (got $rc)" test "$rc" -eq 77
check "selftest says it skipped and why" grep -Eq "skipped: (no GPU|no cached kernel)" "$work/out"
run "$work/out" "$work/err" selftest --json --exhaustive --filter 'grouped_gemm.*bf16' -j 3
check "selftest --json with nothing to run exits 77 (got $rc)" test "$rc" -eq 77
check "selftest --json prints one skipped document, saying why" python3 -c "
import json; j=json.load(open('$work/out'))
assert j['skipped'] is True and j['passed'] == 0 and j['failed'] == 0 and j['kernels'] == [], j
assert j['reason'].startswith(('no GPU', 'no cached kernel')) and j['depth'] == 'exhaustive' and j['jobs'] == 3, j"
run "$work/out" "$work/err" selftest --json
check "selftest --json is quick by default" python3 -c "
import json; j=json.load(open('$work/out')); assert j['depth'] == 'quick' and j['filter'] is None, j"
usage_error "a selftest --filter that is no regular expression" selftest --filter '(['
usage_error "a selftest -j of 0" selftest -j 0
usage_error "a selftest --filter with no value" selftest --filter

finish
