#!/usr/bin/env bash
# The hostile re-run of issue 41's classes against a built jitctl: crafted roots, paths, entries, shards, stamps,
# manifests, arguments, environment variables and resource limits. Each case states what must happen; the tally
# per class counts crashes (a signal), exit-0 failures (a failure reported as success), data lost (a file outside
# what was asked changed or an entry vanished) and wrong results (a cubin from other headers, a bad JSON report).
# Needs NVRTC (no GPU). Usage: tools/hostile/hostile.sh BUILD_DIR   (e.g. build-h41; ~1 minute)
set -uo pipefail
build=${1:?usage: hostile.sh BUILD_DIR}
jitctl=$(realpath "$build/tools/jitctl")
make_entry=$(realpath "$build/tests/kjit_make_entry")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset KJIT_CACHE_PATH KJIT_CACHE_MAX_BYTES KJIT_CUDA_INCLUDE KJIT_LOG KJIT_TEST_FAULT
declare -A cases crashes exit0 lost wrong
class=""
key() { printf "$1%.0s" $(seq 1 $((64 / ${#1}))); }
meta() { printf '{"op":"%s","arch":"sm_90a","canonical":"%s","source":"s","log":"l"}' "$1" "$2" > "$work/meta.json"; }
fresh_root() { rm -rf "$1"; mkdir -p "$1"; chmod 700 "$1"; meta fp8_dequant spec; "$make_entry" "$1" "$(key a1)" "$work/meta.json"; }
# hostile EXPECT NAME CMD...: EXPECT is ok (exit 0), fail (exit 1 or 2) or any (no signal, exit < 128).
hostile() {
  local expect=$1 name=$2; shift 2
  cases[$class]=$(( ${cases[$class]:-0} + 1 ))
  "$@" > "$work/out" 2> "$work/err" < /dev/null
  rc=$?
  if [ "$rc" -ge 124 ]; then crashes[$class]=$(( ${crashes[$class]:-0} + 1 )); echo "CRASH ($rc) [$class] $name"; return; fi
  if [ "$expect" = fail ] && [ "$rc" -eq 0 ]; then exit0[$class]=$(( ${exit0[$class]:-0} + 1 )); echo "EXIT 0 [$class] $name"; fi
  if [ "$expect" = ok ] && [ "$rc" -ne 0 ]; then wrong[$class]=$(( ${wrong[$class]:-0} + 1 )); echo "FAILED ($rc) [$class] $name"; head -3 "$work/err"; fi
}
json_ok() { python3 -c 'import json,sys; json.load(sys.stdin)' < "$work/out" 2> /dev/null; }
expect_json() { if ! json_ok; then wrong[$class]=$(( ${wrong[$class]:-0} + 1 )); echo "BAD JSON [$class] $1"; fi; }
expect_no_escape() { if grep -qP '\x1b|\x07|\xc2\x9b' "$work/out" "$work/err"; then wrong[$class]=$(( ${wrong[$class]:-0} + 1 )); echo "ESCAPE [$class] $1"; fi; }
expect_same() { if [ "$(sha256sum < "$1")" != "$2" ]; then lost[$class]=$(( ${lost[$class]:-0} + 1 )); echo "DATA LOST [$class] $3"; fi; }

class="1 text"
for r in $'r\xff' $'r\x1b[2J' $'r\xc3\x28' $'r\xed\xa0\x80' $'r\xf8\x88\x80\x80\x80' $'r\xc2\x9b' $'r\n' $'r\t\x7f'; do
  root=$work/$r; fresh_root "$root"
  printf '{"op":"\xff\xfe","x":' > "$work/raw.json"; "$make_entry" "$root" "$(key b2)" "$work/raw.json"
  for args in "list --json" "list --summary --json" "verify --json" "verify --fix --json" "prune --json" "info --json" \
              "show $(key a1) --json" "clear --yes --json"; do
    export KJIT_CACHE_DIR=$root; hostile any "$args in $(printf %q "$r")" "$jitctl" $args; expect_json "$args $(printf %q "$r")"
  done
  fresh_root "$root"
  for args in "list" "list --summary" "verify" "show $(key a1)" "info"; do
    hostile any "$args in $(printf %q "$r")" "$jitctl" $args; expect_no_escape "$args $(printf %q "$r")"
  done
  for out in $'o\xff' $'o\x1b[2J' $'o\n'; do
    hostile ok "show --json --cubin $(printf %q "$out")" "$jitctl" show "$(key a1)" --json --cubin "$work/$out"; expect_json "show --cubin"
  done
  export KJIT_CACHE_PATH=$root:$work/$'ro\xff'
  hostile any "list --json with a non-UTF-8 KJIT_CACHE_PATH" "$jitctl" list --json; expect_json "KJIT_CACHE_PATH"
  unset KJIT_CACHE_PATH KJIT_CACHE_DIR
done
for op in '\u001b]0;title\u0007' '\u009b31m' '\u001b[2J\u001b[H' 'a\nb' '\u202eevil'; do
  root=$work/esc; rm -rf "$root"; mkdir -m 700 "$root"; meta "$op" "$op"; "$make_entry" "$root" "$(key a1)" "$work/meta.json"
  export KJIT_CACHE_DIR=$root
  for args in "list" "list --summary" "show $(key a1)" "verify"; do hostile any "$args with op $op" "$jitctl" $args; expect_no_escape "$args $op"; done
  hostile any "list --json with op $op" "$jitctl" list --json; expect_json "list --json $op"
  unset KJIT_CACHE_DIR
done

class="2 exit 0 with kernels missing"
cat > "$work/m.json" <<'JSON'
{"kjit_manifest": 1, "name": "m", "kernels": [
  {"op": "fp8_dequant", "in": "f8_e4m3fn", "out": "bf16", "cols": [512, 1024, 2048], "scale": "per_tensor", "convention": "multiply"}]}
JSON
for cap in 1 100 2K 8K; do
  rm -rf "$work/c2"; KJIT_CACHE_DIR=$work/c2 KJIT_CACHE_MAX_BYTES=$cap hostile fail "precompile under cap $cap" "$jitctl" precompile --manifest "$work/m.json" --arch sm_90a -j 2
done
for shard in file link dir-link fifo; do
  rm -rf "$work/c2"; mkdir -m 700 "$work/c2"; mkdir -m 700 "$work/elsewhere" 2> /dev/null
  KJIT_CACHE_DIR=$work/c2 "$jitctl" precompile --manifest "$work/m.json" --arch sm_90a > /dev/null 2>&1
  for s in $(ls "$work/c2"); do rm -rf "$work/c2/$s"; case $shard in
    file) : > "$work/c2/$s";; link) ln -s /etc "$work/c2/$s";; dir-link) ln -s "$work/elsewhere" "$work/c2/$s";; fifo) mkfifo "$work/c2/$s";; esac; done
  KJIT_CACHE_DIR=$work/c2 hostile fail "verify with shards that are a $shard" "$jitctl" verify
  KJIT_CACHE_DIR=$work/c2 hostile fail "verify --json with shards that are a $shard" "$jitctl" verify --json
  KJIT_CACHE_DIR=$work/c2 hostile fail "precompile with shards that are a $shard" "$jitctl" precompile --manifest "$work/m.json" --arch sm_90a
done
rm -rf "$work/c2"
# Under a memory limit a precompile may build everything or fail, but exit 0 only with every kernel stored.
# The grouped GEMMs with two threads at 140-170 MB: NVRTC's LLVM aborts, in the compile process, never in jitctl.
cat > "$work/g.json" <<'JSON'
{"kjit_manifest": 1, "name": "g", "kernels": [
 {"op": "grouped_gemm", "out": "bf16", "weights": "e_n_k", "offsets": "cumulative_end", "experts": 32, "n": 4096, "k": 7168}]}
JSON
for run in "m 150000 6 sm_90a,sm_100a" "m 250000 6 sm_90a,sm_100a" "m 400000 6 sm_90a,sm_100a" \
           "g 140000 4 sm_90a -j 2" "g 150000 4 sm_90a -j 2" "g 170000 4 sm_90a -j 2"; do
  read -r manifest limit kernels args <<< "$run"
  rm -rf "$work/c2v"
  KJIT_CACHE_DIR=$work/c2v hostile any "precompile $manifest.json under ulimit -v $limit" bash -c "ulimit -v $limit; exec '$jitctl' precompile --manifest '$work/$manifest.json' --arch $args"
  stored=$(find "$work/c2v" -name '*.kjit' 2> /dev/null | wc -l)
  if [ "$rc" -eq 0 ] && [ "$stored" -ne "$kernels" ]; then exit0[$class]=$(( ${exit0[$class]:-0} + 1 )); echo "EXIT 0 [$class] $manifest.json ulimit -v $limit with $stored of $kernels stored"; fi
done
class="3 key covers every input"
rm -rf "$work/c3"; export KJIT_CACHE_DIR=$work/c3
"$jitctl" precompile --manifest "$work/m.json" --arch sm_90a > /dev/null 2>&1
# NVRTC compiles with no include path (ad13af7): no header on the machine can change a cubin, so headers
# edited, planted (an #error) or touched beside the toolkit's change no key and are never read.
include=$(dirname "$(sed -n 's/^nvrtc: [^(]*(\(.*\))$/\1/p' <("$jitctl" info))")/../include
cp -r "$include" "$work/inc"
for edit in append-comment change-macro touch-only planted-error; do
  rm -rf "$work/inc2"; cp -r "$work/inc" "$work/inc2"
  case $edit in
    append-comment) echo "// x" >> "$work/inc2/cuda_fp16.h";; change-macro) echo "#define KJIT_HOSTILE 1" >> "$work/inc2/cuda_bf16.h";;
    touch-only) touch "$work/inc2/cuda_fp16.h";; planted-error) echo "#error planted" > "$work/inc2/cuda_fp16.h";; esac
  KJIT_CUDA_INCLUDE=$work/inc2 CUDA_HOME=$work/inc2/.. hostile ok "precompile with headers: $edit" "$jitctl" precompile --manifest "$work/m.json" --arch sm_90a
  if ! grep -q "0 compiled, 3 already cached" "$work/out"; then wrong[$class]=$(( ${wrong[$class]:-0} + 1 )); echo "WRONG KEY [$class] $edit: $(cat "$work/out")"; fi
  hostile ok "the toolkit's headers after $edit find their own" "$jitctl" precompile --manifest "$work/m.json" --arch sm_90a
  if ! grep -q "0 compiled, 3 already cached" "$work/out"; then wrong[$class]=$(( ${wrong[$class]:-0} + 1 )); echo "WRONG KEY [$class] back from $edit"; fi
done
unset KJIT_CACHE_DIR

class="4 bounded work"
export KJIT_CACHE_DIR=$work/c4
archs=$(printf 'sm_90a,%.0s' $(seq 1 18000)); archs=${archs%,}
hostile ok "--arch sm_90a x 18000" "$jitctl" precompile --manifest "$work/m.json" --arch "$archs"
grep -q "for 1 arch" "$work/err" || { wrong[$class]=$(( ${wrong[$class]:-0} + 1 )); echo "NOT DEDUPLICATED [$class]"; }
python3 -c "
import json; print(json.dumps({'kjit_manifest': 1, 'kernels': [{'op': 'grouped_gemm', 'out': 'bf16', 'n': list(range(8, 8*400, 8)),
 'k': list(range(8, 8*300, 8)), 'experts': 8, 'weights': 'e_n_k', 'offsets': 'cumulative_end'}]}))" > "$work/big.json"
hostile fail "a manifest of 119,600 specs" "$jitctl" precompile --manifest "$work/big.json" --arch sm_90a,sm_100a
python3 -c "
import json; print(json.dumps({'kjit_manifest': 1, 'kernels': [{'op': 'grouped_gemm', 'out': 'bf16', 'n': list(range(8, 8*300, 8)),
 'k': list(range(8, 8*300, 8)), 'experts': 8, 'weights': 'e_n_k', 'offsets': 'cumulative_end'}]}))" > "$work/big2.json"
hostile fail "89,401 specs x 3 archs" "$jitctl" precompile --manifest "$work/big2.json" --arch sm_90a,sm_100a,sm_120a
unset KJIT_CACHE_DIR

class="5 writes where none was asked"
root=$work/c5; fresh_root "$root"; export KJIT_CACHE_DIR=$root
entry=$root/$(key a1 | cut -c1-2)/$(key a1).kjit; sum=$(sha256sum < "$entry")
for target in "$entry" "$root/$(key a1 | cut -c1-2)/new.cubin" "$root/x.cubin" "$root/$(key a1 | cut -c1-2)/../$(key a1 | cut -c1-2)/$(key a1).kjit"; do
  hostile fail "show --cubin $target" "$jitctl" show "$(key a1)" --cubin "$target"; expect_same "$entry" "$sum" "show --cubin $target"
done
ln -s "$root" "$work/rootlink"
hostile fail "show --cubin through a link to the root" "$jitctl" show "$(key a1)" --cubin "$work/rootlink/$(key a1 | cut -c1-2)/$(key a1).kjit"
expect_same "$entry" "$sum" "through a link"
echo precious > "$work/outside"; osum=$(sha256sum < "$work/outside")
ln "$entry" "$work/hardlink.cubin"
hostile ok "show --cubin onto a hard link of the entry" "$jitctl" show "$(key a1)" --cubin "$work/hardlink.cubin"; expect_same "$entry" "$sum" "hard link of the entry"
ln -s "$work/outside" "$work/sym.cubin"
hostile ok "show --cubin onto a symlink" "$jitctl" show "$(key a1)" --cubin "$work/sym.cubin"; expect_same "$work/outside" "$osum" "symlink target"
used=${entry%.kjit}.used
for kind in hard sym fifo dir; do
  rm -rf "$used"; case $kind in hard) ln "$work/outside" "$used";; sym) ln -s "$work/outside" "$used";; fifo) mkfifo "$used";; dir) mkdir "$used";; esac
  hostile ok "a load with a $kind link at .used" "$jitctl" show "$(key a1)"; expect_same "$work/outside" "$osum" ".used $kind"
done
rm -rf "$used"
for i in $(seq 1 24); do "$make_entry" "$root" "$(printf '%02x' "$i")$(key c)" "$work/meta.json"; done
before=$(find "$root" -name '*.kjit' | wc -l)
# Each of these selects every entry of a root of 25: each must ask (refused off a terminal), removing nothing.
for args in "clear" "clear --older-than 0s" "clear --op fp8_dequant" "clear --arch sm_90a" "clear --op fp8_dequant --arch sm_90a --older-than 0s"; do
  hostile fail "$args without --yes" "$jitctl" $args
  after=$(find "$root" -name '*.kjit' | wc -l); [ "$after" -eq "$before" ] || { lost[$class]=$(( ${lost[$class]:-0} + 1 )); echo "DATA LOST [$class] $args"; }
done
unset KJIT_CACHE_DIR

class="6 resource limits and hooks"
root=$work/c6; fresh_root "$root"; export KJIT_CACHE_DIR=$root
hostile fail "show --cubin under ulimit -f 0" bash -c "ulimit -f 0; exec '$jitctl' show $(key a1) --cubin '$work/f.cubin'"
rm -rf "$work/c6b"
KJIT_CACHE_DIR=$work/c6b hostile fail "precompile under ulimit -f 0" bash -c "ulimit -f 0; exec '$jitctl' precompile --manifest '$work/m.json' --arch sm_90a"
KJIT_CACHE_DIR=$work/c6b hostile any "precompile under ulimit -f 1" bash -c "ulimit -f 1; exec '$jitctl' precompile --manifest '$work/m.json' --arch sm_90a"
for v in 200000 300000; do
  hostile any "list under ulimit -v $v" bash -c "ulimit -v $v; exec '$jitctl' list --json"
done
KJIT_CACHE_DIR=$work/c6c hostile any "precompile under ulimit -u 1" bash -c "ulimit -u 1; exec '$jitctl' precompile --manifest '$work/m.json' --arch sm_90a -j 8"
for fault in kill-during-publish kill-during-publish; do
  rm -rf "$work/c6d"
  KJIT_CACHE_DIR=$work/c6d KJIT_TEST_FAULT=$fault hostile ok "KJIT_TEST_FAULT=$fault in a release jitctl" "$jitctl" precompile --manifest "$work/m.json" --arch sm_90a
done
unset KJIT_CACHE_DIR

total=0
printf '\n%-34s %6s %8s %8s %6s %6s\n' class cases crashes "exit 0" lost wrong
for c in "1 text" "2 exit 0 with kernels missing" "3 key covers every input" "4 bounded work" "5 writes where none was asked" "6 resource limits and hooks"; do
  printf '%-34s %6d %8d %8d %6d %6d\n' "$c" "${cases[$c]:-0}" "${crashes[$c]:-0}" "${exit0[$c]:-0}" "${lost[$c]:-0}" "${wrong[$c]:-0}"
  total=$(( total + ${crashes[$c]:-0} + ${exit0[$c]:-0} + ${lost[$c]:-0} + ${wrong[$c]:-0} ))
done
exit $(( total > 0 ))
