#!/bin/bash
# run_nccl_test.sh STRATA_RUN N PROGRAM file|comm-id: the NCCL API test at N ranks, the id
# passed through a file rank 0 writes, or through NCCL_COMM_ID (a free port on 127.0.0.1).
set -euo pipefail
run=$1 n=$2 prog=$3 mode=$4
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
if [ "$mode" = comm-id ]; then
  port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  export NCCL_COMM_ID=127.0.0.1:$port
  exec "$run" -n "$n" --tag-output --timeout 240 "$prog"
fi
exec "$run" -n "$n" --tag-output --timeout 240 "$prog" "$dir/id"
