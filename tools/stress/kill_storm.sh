#!/usr/bin/env bash
# Kill storm for the on-disk cache: 16 writers publishing into one root (some
# dying mid-publish through the store's test-only hook), random SIGKILLs, a
# clear/prune/verify loop and a reader comparing every served payload with its
# reference, for SECONDS. Then one prune and a count of what is left.
#   tools/stress/kill_storm.sh build/tools/kjit_cache_stress [SECONDS=180] [ROOT]
# Prints: corrupt served, hangs, kills, mid-publish deaths, leftovers. Exit 0
# only when nothing corrupt was served, nothing hung and nothing was left.
# Run it under `nice` on a shared machine.
set -uo pipefail
bin=${1:?usage: kill_storm.sh CACHE_STRESS_BINARY [SECONDS] [ROOT]}
duration=${2:-180}
work=$(mktemp -d "${TMPDIR:-/tmp}/kjit-storm-XXXXXX")
root=${3:-$work/root}
writers=16
declare -a pid start limit killed
hangs=0 kills=0 deaths=0 spawned=0 corrupt_exits=0

spawn() {
  local i=$1 life=$((3 + RANDOM % 15))
  "$bin" writer "$root" "$life" "$RANDOM$RANDOM$i" >> "$work/writers.out" 2>> "$work/writers.err" &
  pid[$i]=$! start[$i]=$SECONDS limit[$i]=$((life + 30)) killed[$i]=0
  spawned=$((spawned + 1))
}

"$bin" reader "$root" "$duration" > "$work/reader.out" 2>&1 &
reader=$!
"$bin" maintain "$root" "$duration" "$RANDOM" > "$work/maintain.out" 2>&1 &
maintainer=$!
for ((i = 0; i < writers; ++i)); do spawn "$i"; done

# The shell's "Killed" notices of reaped writers would flood the terminal.
exec 3>&2 2> "$work/shell.err"
end=$((SECONDS + duration))
while ((SECONDS < end)); do
  sleep 0.1
  if ((RANDOM % 3 == 0)); then
    i=$((RANDOM % writers))
    kill -KILL "${pid[$i]}" 2> /dev/null && killed[$i]=1 && kills=$((kills + 1))
  fi
  for ((i = 0; i < writers; ++i)); do
    if ! kill -0 "${pid[$i]}" 2> /dev/null; then
      wait "${pid[$i]}" 2> /dev/null
      rc=$?
      ((rc == 137 && killed[i] == 0)) && deaths=$((deaths + 1))  # the mid-publish hook
      ((rc == 3)) && corrupt_exits=$((corrupt_exits + 1))
      spawn "$i"
    elif ((SECONDS - start[i] > limit[i])); then
      echo "HANG: writer ${pid[$i]} ran $((SECONDS - start[i])) s" | tee -a "$work/hangs"
      hangs=$((hangs + 1))
      kill -KILL "${pid[$i]}" 2> /dev/null
    fi
  done
done
for ((i = 0; i < writers; ++i)); do kill -KILL "${pid[$i]}" 2> /dev/null; done
wait "${pid[@]}" 2> /dev/null
for p in $reader $maintainer; do
  for ((t = 0; t < 600 && $(kill -0 "$p" 2> /dev/null && echo 1 || echo 0); ++t)); do sleep 0.1; done
  if kill -0 "$p" 2> /dev/null; then
    echo "HANG: reader or maintenance loop $p still running 60 s after the storm" | tee -a "$work/hangs"
    hangs=$((hangs + 1))
    kill -KILL "$p"
  fi
  wait "$p" 2> /dev/null
done

exec 2>&3
orphans() {  # files with suffix $1 whose entry is gone
  find "$root" -name "*$1" | while read -r f; do [ -e "${f%"$1"}.kjit" ] || echo "$f"; done | wc -l
}
left_raw="$(find "$root" -name '*.tmp-*' | wc -l) temp files, $(orphans .used) orphan .used, $(orphans .lock) orphan .lock"
"$bin" final "$root" > "$work/final.out" 2>&1
final_rc=$?
corrupt=$(cat "$work"/*.out | grep -c '^CORRUPT\|^VERIFY-BAD')
cat "$work/reader.out" "$work/maintain.out" "$work/final.out"
echo "storm: ${duration} s, $spawned writers started, $kills SIGKILLs, $deaths deaths mid-publish, $hangs hangs"
echo "storm: $corrupt corrupt served or found ($corrupt_exits writers exited on one)"
echo "storm: before the final prune (writers killed at the end leave these): $left_raw"
echo "storm: logs in $work"
((corrupt == 0 && corrupt_exits == 0 && hangs == 0 && final_rc == 0))
