#!/usr/bin/env bash
# Issue 41's classes, end to end through jitctl (each check failed before its fix):
# 1. text that is not UTF-8 (a root, a --cubin path, an entry's bytes) never aborts a --json report, and
#    entry text never reaches the terminal as escape sequences (list --summary included);
# 2. precompile counts every outcome: its own kernels evicted under KJIT_CACHE_MAX_BYTES, unreadable shards and
#    an entry too large to read under ulimit -v are failures (exit 1, named); verify reports unreadable shards;
# 3. no file outside the rendered source enters a compile: planted toolkit headers change no key or cubin;
# 4. repeated --arch values are one arch;
# 5. no write where none was asked: show --cubin refuses the cache's own files, a hard link at a .used stamp is
#    never written through, clear --older-than 0s asks as clear does;
# 6. a file-size limit is an error with a message, not SIGXFSZ; a compile that dies (NVRTC aborts when out of
#    memory under ulimit -v) fails its kernel, never jitctl; KJIT_TEST_FAULT does nothing in a release jitctl.
# Usage: test_jitctl_reliability.sh JITCTL KJIT_MAKE_ENTRY
set -euo pipefail
jitctl=$1
make_entry=$2
source "$(dirname "$0")/check.sh"
unset KJIT_CACHE_PATH KJIT_CACHE_MAX_BYTES KJIT_CUDA_INCLUDE
key1=$(printf 'a1%.0s' {1..32})
key2=$(printf 'b2%.0s' {1..32})
valid_json() { python3 -c 'import json,sys; json.load(sys.stdin)'; }
run() {  # run OUT ARGS...: jitctl with stdin closed; sets $rc, stdout to OUT, stderr to OUT.err
  local out=$1; shift
  set +e
  "$jitctl" "$@" > "$out" 2> "$out.err" < /dev/null
  rc=$?
  set -e
}
meta() { printf '{"op":"%s","arch":"sm_90a","canonical":"%s","source":"s","log":"l"}' "$1" "$2" > "$work/meta.json"; }

# 1. Non-UTF-8 roots, paths and entry bytes; escape sequences in entry text.
root=$work/$'root\xff\x1b[2J'
meta 'fp8_dequant' 'spec'
"$make_entry" "$root" "$key1" "$work/meta.json"
printf '{"op": "\xff\xfe", "x": ' > "$work/raw.json"   # meta bytes that are neither JSON nor UTF-8
"$make_entry" "$root" "$key2" "$work/raw.json"
export KJIT_CACHE_DIR=$root
for args in "list --json" "list --summary --json" "verify --json" "prune --json" "info --json"; do
  run "$work/out" $args
  check "$args with a non-UTF-8 root exits without a signal" test "$rc" -lt 128
  check "$args with a non-UTF-8 root prints JSON" valid_json < "$work/out"
done
run "$work/show.json" show "$key1" --json --cubin "$work/"$'out\xff'
check "show --json --cubin to a non-UTF-8 path succeeds" test "$rc" -eq 0
check "show --json --cubin to a non-UTF-8 path prints JSON" valid_json < "$work/show.json"
check "the cubin was written" test -s "$work/"$'out\xff'
run "$work/verify.json" verify --fix --json
check "verify --fix --json over a non-UTF-8 problem prints JSON" valid_json < "$work/verify.json"
run "$work/out" list
check "list never prints an ESC byte" bash -c "! grep -qP '\x1b' '$work/out' '$work/out.err'"
meta '\u001b]0;owned\u0007\u009b31m' 'spec\u001b[2J'
rm -rf "$root"; "$make_entry" "$root" "$key1" "$work/meta.json"
run "$work/summary" list --summary
check "list --summary never prints an ESC, BEL or CSI" bash -c "! grep -qP '\x1b|\x07|\xc2\x9b' '$work/summary'"
check "list --summary shows the op escaped" grep -q '\\x1b\]0;owned' "$work/summary"
run "$work/out" clear --yes --json
check "clear --yes --json with a non-UTF-8 root prints JSON" valid_json < "$work/out"
unset KJIT_CACHE_DIR

# 5. No writes where none was asked.
export KJIT_CACHE_DIR=$work/c5
meta fp8_dequant spec
"$make_entry" "$KJIT_CACHE_DIR" "$key1" "$work/meta.json"
entry=$KJIT_CACHE_DIR/${key1:0:2}/$key1.kjit
before=$(sha256sum < "$entry")
run "$work/out" show "$key1" --cubin "$entry"
check "show --cubin refuses the entry's own file" test "$rc" -eq 1
check "show --cubin says why" grep -q "inside the cache root" "$work/out.err"
check "the entry is intact" test "$(sha256sum < "$entry")" = "$before"
echo "precious" > "$work/outside"
ln "$work/outside" "$KJIT_CACHE_DIR/${key1:0:2}/$key1.used"
ln -s "$work/outside" "$work/link.cubin"
run "$work/out" show "$key1" --cubin "$work/link.cubin"
check "a load does not write through a hard link at its .used stamp" test "$(cat "$work/outside")" = "precious"
check "show --cubin replaces a symlink, never writes through it" test ! -L "$work/link.cubin"
check "the file the symlink named is untouched" test "$(cat "$work/outside")" = "precious"
for i in $(seq 1 21); do "$make_entry" "$KJIT_CACHE_DIR" "$(printf '%02x' "$i")$(printf 'c%.0s' {1..62})" "$work/meta.json"; done
run "$work/out" clear --older-than 0s
check "clear --older-than 0s refuses without --yes off a terminal" test "$rc" -eq 2
check "clear --older-than 0s removed nothing" test "$(find "$KJIT_CACHE_DIR" -name '*.kjit' | wc -l)" -eq 22
run "$work/out" clear --op fp8_dequant --arch sm_90a
check "a filter that selects everything asks too" test "$rc" -eq 2

# 6. A file-size limit: an error with a message, not SIGXFSZ.
set +e
# stderr through a pipe: a file would be under the limit too.
(ulimit -f 0; exec "$jitctl" show "$key1" --cubin "$work/big.cubin" 2>&1 > /dev/null < /dev/null) | cat > "$work/fsize.err"
rc=${PIPESTATUS[0]}
set -e
check "show --cubin under ulimit -f 0 fails with exit 1, not a signal" test "$rc" -eq 1
check "and says why" grep -q "cannot write" "$work/fsize.err"

# 2. Unreadable shards: verify and precompile name them.
mkdir -p "$work/c2"; chmod 700 "$work/c2"
export KJIT_CACHE_DIR=$work/c2
: > "$work/c2/ab"                              # a file at a shard's name
ln -s "$work/c5/${key1:0:2}" "$work/c2/cd"     # a link at a shard's name
run "$work/out" verify
check "verify fails on unreadable shards" test "$rc" -eq 1
check "verify names them" bash -c "grep -q 'c2/ab' '$work/out' && grep -q 'c2/cd' '$work/out'"
run "$work/out" verify --json
check "verify --json lists them" python3 -c "import json; assert len(json.load(open('$work/out'))['unreadable_shards']) == 2"
rm -rf "$work/c2"

# Precompiles (NVRTC, no GPU): few kernels each.
cat > "$work/three.json" <<'JSON'
{"kjit_manifest": 1, "name": "three", "kernels": [
  {"op": "fp8_dequant", "in": "f8_e4m3fn", "out": "bf16", "cols": [512, 1024],
   "scale": "per_tensor", "convention": "multiply"}]}
JSON
export KJIT_CACHE_DIR=$work/c3
run "$work/p" precompile --manifest "$work/three.json" --arch sm_90a -j 1 --json
check "a precompile that fits its cap succeeds" test "$rc" -eq 0
run "$work/p" precompile --manifest "$work/three.json" --arch sm_90a,sm_90a,sm_90a
check "repeated --arch values are one arch" grep -q "(2 specs for 1 arch)" "$work/p.err"
check "and one kernel each" grep -q "0 compiled, 2 already cached" "$work/p"
KJIT_TEST_FAULT=kill-during-publish run "$work/p" precompile --manifest "$work/three.json" --arch sm_90a
check "a release jitctl ignores KJIT_TEST_FAULT" test "$rc" -eq 0

# 3. No file outside the rendered source enters a compile (NVRTC gets no include path): headers planted where
# a toolkit is looked for change no key, and the kernels are served from their entries.
mkdir -p "$work/cuda/include/cuda"
printf '#error planted\n' | tee "$work/cuda/include/cuda_fp16.h" "$work/cuda/include/cuda/ptx" > /dev/null
CUDA_HOME=$work/cuda CUDA_PATH=$work/cuda KJIT_CUDA_INCLUDE=$work/cuda/include \
  run "$work/p" precompile --manifest "$work/three.json" --arch sm_90a
check "planted headers change no key" grep -q "0 compiled, 2 already cached" "$work/p"
KJIT_CACHE_DIR=$work/c5 CUDA_HOME=$work/cuda KJIT_CUDA_INCLUDE=$work/cuda/include \
  run "$work/p" precompile --manifest "$work/three.json" --arch sm_90a
check "and compiling beside them never reads them" grep -q "2 compiled, 0 already cached" "$work/p"

# 2. An entry claiming a 2 GiB payload (a sparse file of that size) under ulimit -v 1G: reading it runs out of
#    memory; the kernel is a failure, named, never a job dropped with exit 0.
export KJIT_CACHE_DIR=$work/c2g
cat > "$work/one.json" <<'JSON'
{"kjit_manifest": 1, "name": "one", "kernels": [
  {"op": "fp8_dequant", "in": "f8_e4m3fn", "out": "bf16", "cols": [512], "scale": "per_tensor", "convention": "multiply"}]}
JSON
run "$work/p" precompile --manifest "$work/one.json" --arch sm_90a -j 1
big=$(find "$KJIT_CACHE_DIR" -name '*.kjit')
python3 - "$big" <<'PY'
import os, struct, sys
path = sys.argv[1]
data = bytearray(open(path, 'rb').read())
meta = struct.unpack_from('<Q', data, 16)[0]
struct.pack_into('<Q', data, 24, 2**31)  # payload bytes: 2 GiB
open(path, 'wb').write(data[:64 + meta])
os.truncate(path, 64 + meta + 2**31)    # sparse: the sizes agree, the hash is checked after the read
PY
set +e
(ulimit -v 1000000; exec "$jitctl" precompile --manifest "$work/one.json" --arch sm_90a -j 1 > "$work/p" 2> "$work/p.err" < /dev/null)
rc=$?
set -e
check "a 2 GiB entry under ulimit -v 1G fails the precompile (exit 1, no signal)" test "$rc" -eq 1
check "and counts the kernel failed" grep -q "0 compiled, 0 already cached, 1 failed" "$work/p"
check "and names it, out of memory" bash -c "grep -q '^failed: sm_90a fp8_dequant' '$work/p.err' && grep -q 'out of memory' '$work/p.err'"
rm -rf "$KJIT_CACHE_DIR"

# 6. NVRTC aborts (SIGABRT or a fault in its LLVM) when an allocation fails: under ulimit -v 150 MB two threads'
#    grouped GEMM compiles did, and took jitctl with them (exit 134 or 139). Each compile runs in a compile
#    process: one that dies fails its kernel, named with the signal; jitctl exits 1.
cat > "$work/gemm.json" <<'JSON'
{"kjit_manifest": 1, "name": "gemm", "kernels": [
  {"op": "grouped_gemm", "out": "bf16", "weights": "e_n_k", "offsets": "cumulative_end", "experts": 32,
   "n": 4096, "k": 7168}]}
JSON
export KJIT_CACHE_DIR=$work/c6v
set +e
(ulimit -v 150000; exec "$jitctl" precompile --manifest "$work/gemm.json" --arch sm_90a -j 2 > "$work/p" 2> "$work/p.err" < /dev/null)
rc=$?
set -e
check "precompile under ulimit -v 150000 ends without a signal" test "$rc" -lt 128
check "and fails (exit 1): these kernels do not fit" test "$rc" -eq 1
check "and names the failed kernels" grep -q "^failed: sm_90a grouped_gemm" "$work/p.err"
# A compile process killed mid-run (SIGABRT, as NVRTC's abort): its kernel fails with the signal named, the
# others are built by a new one.
rm -rf "$KJIT_CACHE_DIR"
cat > "$work/nine.json" <<'JSON'
{"kjit_manifest": 1, "name": "nine", "kernels": [
  {"op": "fp8_dequant", "in": "f8_e4m3fn", "out": "bf16", "cols": [512, 1024, 2048], "scale": "per_tensor",
   "convention": "multiply"}]}
JSON
"$jitctl" precompile --manifest "$work/nine.json" --arch sm_90a,sm_100a,sm_120a -j 1 > "$work/p" 2> "$work/p.err" < /dev/null &
parent=$!
worker=""
for _ in $(seq 1 500); do
  worker=$(pgrep -P "$parent" || true)
  [ -n "$worker" ] && break
  sleep 0.01
done
[ -n "$worker" ] && kill -ABRT "$worker"
set +e
wait "$parent"
rc=$?
set -e
check "a compile process was started" test -n "$worker"
check "its death fails the precompile (exit 1, no signal)" test "$rc" -eq 1
check "one kernel failed, the others were built" grep -q "8 compiled, 0 already cached, 1 failed" "$work/p"
check "the failure names the signal" grep -q "died with SIGABRT" "$work/p.err"
rm -rf "$KJIT_CACHE_DIR"

# 2. Eviction of the manifest's own kernels: exit 1, named.
KJIT_CACHE_DIR=$work/c4 KJIT_CACHE_MAX_BYTES=1 run "$work/p" precompile --manifest "$work/three.json" --arch sm_90a -j 1
check "a cap below the manifest fails the precompile" test "$rc" -eq 1
check "and names the cap" grep -q "KJIT_CACHE_MAX_BYTES" "$work/p.err"
check "and the kernels not kept" test "$(grep -c '^not stored in' "$work/p.err")" -ge 1
finish
