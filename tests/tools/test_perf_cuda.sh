#!/usr/bin/env bash
# strata-perf's collective modes with --memory cuda, on any machine: --help documents --memory
# cuda and -G; -G with host memory and --alloc strata with cuda memory are usage errors (exit 2
# in every rank, with a message); and `strata-run -n 2 strata-perf allreduce --memory cuda`
# either skips at once, every rank exiting 77 with one line saying why (no CUDA device or
# driver, or built without CUDA), or, where a device and the CUDA collectives work, runs with 0
# wrong elements and names the devices. A hang fails through the timeouts. No timing is checked.
#
# With a third argument 'fake', STRATA_PERF is strata-perf-fake-cuda (tests/tools/
# perf_fake_device.cpp: host memory behind strata-perf's device calls), and instead of the
# real CUDA run every op runs at 2 and 3 ranks through --memory cuda's code (staging buffers,
# in-place offsets, -G, -z, devices per local rank, header and JSON lines) with 0 wrong elements.
#
# Usage: test_perf_cuda.sh STRATA_RUN STRATA_PERF [fake]
set -uo pipefail
run=$1 perf=$2 fake=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export STRATA_BOOTSTRAP_TCP_INTERFACE=lo FI_TCP_IFACE=lo
fail() { echo "FAIL: $*"; exit 1; }

help=$("$perf" allreduce --help 2>&1) || fail "allreduce --help exited $?"
echo "$help"
grep -q -- '--memory.*cuda' <<<"$help" || fail "--help does not document --memory cuda"
grep -q -- '-G,--cudagraph' <<<"$help" || fail "--help does not document -G,--cudagraph"
grep -q 'CUDA graph' <<<"$help" || fail "--help does not say what -G does"

expect_usage() {  # PATTERN ARGS...
  local pattern=$1 out rc
  shift
  out=$(timeout 60 "$run" -n 2 "$perf" "$@" 2>&1)
  rc=$?
  echo "$out"
  [[ $rc -eq 2 ]] || fail "'$*' should exit 2 (strata-run rc $rc)"
  [[ $(grep -c "exited with status 2" <<<"$out") -eq 2 ]] || fail "'$*': both ranks should exit 2"
  [[ $(grep -c -- "$pattern" <<<"$out") -eq 2 ]] || fail "'$*' should say '$pattern' in each rank"
}
expect_usage "-G/--cudagraph needs --memory cuda" allreduce -G 2 -b 8 -e 8
expect_usage "--alloc strata allocates host memory" allreduce --memory cuda --alloc strata -b 8 -e 8
"$perf" allreduce --memory cuda -G -1 >/dev/null 2>&1
[[ $? -eq 2 ]] || fail "-G -1 should exit 2"

if [[ $fake == fake ]]; then
  for n in 2 3; do
    for op in allreduce allgather reducescatter broadcast alltoall sendrecv; do
      out=$(STRATA_PERF_FAKE_DEVICES=2 timeout 120 "$run" -n "$n" "$perf" "$op" --memory cuda \
        -b 8 -e 64K -f 32 -n 2 -w 1 -c 1 -r $((n - 1)) --json "$work/$op.$n.json" 2>&1)
      rc=$?
      echo "$out"
      [[ $rc -eq 0 ]] || fail "$op --memory cuda with $n ranks exited $rc"
      grep -q '^# Out of bounds values : 0 OK$' <<<"$out" || fail "$op with $n ranks: wrong results"
      awk '$1 ~ /^[0-9]+$/ && ($9 != "0" || ($13 != "0" && $13 != "N/A")) { exit 1 }' <<<"$out" ||
        fail "$op with $n ranks: a row has wrong elements"
      [[ $(awk '$1 ~ /^[0-9]+$/' <<<"$out" | wc -l) -eq 4 ]] || fail "$op with $n ranks: expected 4 rows"
      grep -q '^# backend: tcp  nranks: '"$n"'  memory: cuda (device 0, fake device (host memory))  label: strata$' <<<"$out" ||
        fail "$op: no '# backend: ... memory: cuda (device 0, name)' line"
      grep -q '^# cuda: calls enqueued back to back on one stream per rank' <<<"$out" || fail "$op: no '# cuda:' line"
      # Two fake devices: local rank r gets device r % 2.
      for r in $(seq 0 $((n - 1))); do
        grep -q "^#  Rank  $r Group  0 Pid  *[0-9]* on  *[^ ]* device  $((r % 2)) \[0x4$((2 + r % 2))\] fake device (host memory)\$" <<<"$out" ||
          fail "$op: rank $r is not listed on device $((r % 2))"
      done
      grep -q 'host memory$' <<<"$(grep '^#  Rank' <<<"$out" | sed 's/fake device (host memory)//')" &&
        fail "$op: a rank is listed with host memory"
      grep -v -q '"memory":"cuda"' "$work/$op.$n.json" && fail "$op: a JSON line has not \"memory\":\"cuda\""
      grep -q '"graph":' "$work/$op.$n.json" && fail "$op: \"graph\" without -G"
    done
  done

  # -G and -z: the header says so, the JSON lines carry "graph", results are checked through
  # the graph path (a graph of one call).
  out=$(timeout 120 "$run" -n 2 "$perf" allreduce --memory cuda -b 8 -e 64K -f 32 -n 3 -w 1 -G 4 -z 1 \
    --json "$work/graph.json" 2>&1)
  rc=$?
  echo "$out"
  [[ $rc -eq 0 ]] || fail "-G 4 -z 1 exited $rc"
  grep -q '^# nThread 1 nGpus 1 minBytes 8 maxBytes 65536 .* validation: 1 graph: 4$' <<<"$out" || fail "-G 4: no 'graph: 4'"
  grep -q '^# Blocking Enabled: cudaStreamSynchronize after each graph launch$' <<<"$out" || fail "-z 1 -G: no 'Blocking Enabled' line"
  grep -q '^# cuda: each row.s timed calls captured once in a CUDA graph, launched 4 times' <<<"$out" || fail "-G 4: no '# cuda:' graph line"
  grep -q '^# Out of bounds values : 0 OK$' <<<"$out" || fail "-G 4: wrong results"
  [[ $(grep -c '"memory":"cuda",.*"algorithm":"host/[a-z]*","graph":4,"inplace":' "$work/graph.json") -eq 8 ]] ||
    { cat "$work/graph.json"; fail "-G 4: the JSON lines lack \"graph\":4"; }
  out=$(timeout 120 "$run" -n 2 "$perf" sendrecv --memory cuda -b 8 -e 64 -n 2 -w 1 -z 1 2>&1) || fail "-z 1: $out"
  grep -q '^# Blocking Enabled: cudaStreamSynchronize after each collective$' <<<"$out" || fail "-z 1: no 'Blocking Enabled' line"

  # -c 0: no staging buffers (nothing is prepared or checked), '#wrong' is N/A.
  out=$(timeout 60 "$run" -n 2 "$perf" reducescatter --memory cuda -b 1K -e 1K -n 2 -w 1 -c 0 2>&1) || fail "-c 0: $out"
  awk '$1 ~ /^[0-9]+$/ { print $9, $13 }' <<<"$out" | grep -qx 'N/A N/A' || { echo "$out"; fail "-c 0 should print N/A"; }

  # Every type and reduction through the staging buffers; one rank (sendrecv copies on the stream).
  out=$(timeout 300 "$run" -n 2 "$perf" allreduce --memory cuda -b 8 -e 1K -f 128 -n 1 -w 0 -d all -o all 2>&1)
  rc=$?
  echo "$out" | tail -3
  [[ $rc -eq 0 ]] || { echo "$out"; fail "-d all -o all exited $rc"; }
  grep -q '^# Out of bounds values : 0 OK$' <<<"$out" || fail "-d all -o all: wrong results"
  for op in sendrecv allgather; do
    out=$(timeout 60 "$run" -n 1 "$perf" "$op" --memory cuda -b 8 -e 4K -f 8 -n 2 -w 1 -G 2 2>&1) ||
      fail "$op with one rank: $out"
    grep -q '^# Out of bounds values : 0 OK$' <<<"$out" || fail "$op with one rank: wrong results"
  done

  # No device: every rank skips with the one-line reason.
  out=$(STRATA_PERF_FAKE_DEVICES=0 timeout 60 "$run" -n 2 "$perf" allreduce --memory cuda 2>&1)
  rc=$?
  echo "$out"
  [[ $rc -eq 77 ]] || fail "no device: exit $rc, not 77"
  [[ $(grep -c '^strata-perf: --memory cuda needs a CUDA device: fake: STRATA_PERF_FAKE_DEVICES=0 (skipped)$' <<<"$out") -eq 2 ]] ||
    fail "no device: not one line per rank"
  echo ok
  exit 0
fi

# The CUDA run. The skip is decided before the bootstrap: it takes well under a second.
for extra in "" "-G 2"; do
  start=$SECONDS
  # shellcheck disable=SC2086  # $extra is meant to split
  out=$(timeout 120 "$run" -n 2 "$perf" allreduce --memory cuda -b 8 -e 64K -f 64 -n 3 -w 1 $extra 2>&1)
  rc=$?
  echo "$out"
  echo "(rc $rc after $((SECONDS - start)) s)"
  case $rc in
    77)
      lines=$(grep '^strata-perf: ' <<<"$out")
      [[ $(wc -l <<<"$lines") -eq 2 ]] || fail "--memory cuda $extra: expected one strata-perf line per rank"
      while IFS= read -r line; do
        [[ $line =~ ^strata-perf:\ --memory\ cuda(\ needs\ a\ CUDA\ device:\ .+|:\ this\ strata-perf\ was\ built\ without\ CUDA.*)\ \(skipped\)$ ]] ||
          fail "--memory cuda $extra: not the one-line reason: '$line'"
      done <<<"$lines"
      [[ $(grep -c 'exited with status 77' <<<"$out") -eq 2 ]] || fail "--memory cuda $extra: both ranks should exit 77"
      grep -q 'error' <<<"$out" && fail "--memory cuda $extra: a skip is not an error"
      [[ $((SECONDS - start)) -lt 30 ]] || fail "--memory cuda $extra: the skip took $((SECONDS - start)) s"
      ;;
    0)
      grep -q '^# backend: .*memory: cuda (device [0-9]*, ' <<<"$out" || fail "no 'memory: cuda (device N, name)'"
      [[ $(grep -c '^#  Rank  [01] Group  0 Pid .* device  *[0-9]* \[0x[0-9a-f]*\] ' <<<"$out") -eq 2 ]] ||
        fail "'# Using devices' does not list 2 devices"
      grep -q '^# algorithm: cuda/' <<<"$out" || fail "no '# algorithm: cuda/...' line"
      grep -q '^# Out of bounds values : 0 OK$' <<<"$out" || fail "wrong results"
      ;;
    124) fail "--memory cuda $extra hung (killed after 120 s)" ;;
    *) fail "--memory cuda $extra exited $rc" ;;
  esac
done
echo ok
