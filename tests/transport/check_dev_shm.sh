#!/usr/bin/env bash
# Runs after the transport tests (lowest priority, alone): nothing they created may be left in
# /dev/shm. strata's shm transport never names anything there (memfd); libfabric's shm provider
# backs each endpoint with a 16 MiB file, which the fabric transport names
# "strata-fabric-<pidns>-<pid>-<n>" and removes for dead processes of its PID namespace. A
# leftover of a process that no longer exists is a leak; so is libfabric's own name
# "<pid>:<n>:<n>" of a dead process (the fabric transport always names its shm endpoints).
set -u
ns=$(stat -L -c %i /proc/self/ns/pid 2>/dev/null || echo 0)
leaks=()
for f in /dev/shm/*; do
  [[ -e $f ]] || continue
  name=${f#/dev/shm/}
  if [[ $name =~ ^strata-fabric-([0-9]+)-([0-9]+)-[0-9]+$ ]]; then
    [[ ${BASH_REMATCH[1]} == "$ns" ]] || continue   # another PID namespace: its pid means nothing here
    pid=${BASH_REMATCH[2]}
    [[ -O $f ]] || continue                   # another user's: not ours to judge
    kill -0 "$pid" 2>/dev/null && continue    # its process is alive
    leaks+=("$name (fabric shm region of exited process $pid)")
  elif [[ $name == strata* ]]; then
    leaks+=("$name (strata)")
  elif [[ $name =~ ^([0-9]+):[0-9]+:[0-9]+$ ]]; then
    pid=${BASH_REMATCH[1]}
    [[ -O $f ]] || continue
    kill -0 "$pid" 2>/dev/null && continue
    leaks+=("$name (libfabric shm region of exited process $pid)")
  fi
done
if (( ${#leaks[@]} )); then
  echo "FAIL: left in /dev/shm after the transport tests:"
  printf '  %s\n' "${leaks[@]}"
  exit 1
fi
echo "/dev/shm: nothing left behind ($(ls /dev/shm | wc -l) entries, none from a dead process)"
