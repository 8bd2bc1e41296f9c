#!/usr/bin/env bash
# Runs after the transport tests (lowest priority, alone): nothing they created may be left in
# /dev/shm. strata's shm transport never names anything there (memfd); libfabric's shm provider
# names a 16 MiB file "<pid>:<n>:<n>" per endpoint, which the fabric transport removes for dead
# processes. A leftover of a process that no longer exists is a leak.
set -u
leaks=()
for f in /dev/shm/*; do
  [[ -e $f ]] || continue
  name=${f#/dev/shm/}
  if [[ $name == strata* ]]; then
    leaks+=("$name (strata)")
  elif [[ $name =~ ^([0-9]+):[0-9]+:[0-9]+$ ]]; then
    pid=${BASH_REMATCH[1]}
    [[ -O $f ]] || continue                   # another user's: not ours to judge
    kill -0 "$pid" 2>/dev/null && continue    # its process is alive
    leaks+=("$name (libfabric shm region of exited process $pid)")
  fi
done
if (( ${#leaks[@]} )); then
  echo "FAIL: left in /dev/shm after the transport tests:"
  printf '  %s\n' "${leaks[@]}"
  exit 1
fi
echo "/dev/shm: nothing left behind ($(ls /dev/shm | wc -l) entries, none from a dead process)"
