#!/usr/bin/env bash
# Two "hosts" in one machine: two network namespaces joined by a veth pair, each with its own
# address and host name (a UTS namespace per rank), two ranks in each. Runs a multi-process test
# binary (the transport suite, later the collectives suite) with ranks 0,1 on host A and 2,3 on
# host B: same-host pairs must use shm, cross-host pairs fabric over the veth, and the bootstrap
# must select the veth interface. The namespaces are removed on exit, also on failure.
#
# usage: two_hosts.sh BINARY [ARGS...]      (exit 77 without root, ip netns or unshare)
# env:   TWO_HOSTS_TIMEOUT (seconds, default 300)
#        TWO_HOSTS_KEEP_GOING=1: a rank killed by SIGKILL (status 137: the fault-tolerance suite's
#        victims kill themselves) is not a failure, as with strata-run --keep-going; the job
#        fails when another status is non-zero or when every rank was killed.
set -u
bin=${1:?usage: two_hosts.sh BINARY [ARGS...]}
shift

skip() { echo "SKIP: $*"; exit 77; }
[[ $(id -u) == 0 ]] || skip "needs root to create network namespaces"
command -v ip >/dev/null || skip "needs ip (iproute2)"
command -v unshare >/dev/null || skip "needs unshare (util-linux)"
command -v hostname >/dev/null || skip "needs hostname"

tag="st$$"
nsA="${tag}a" nsB="${tag}b"
vethA="${tag}va" vethB="${tag}vb"
addrA=10.231.$(( $$ % 250 )).1 addrB=10.231.$(( $$ % 250 )).2
port=$(( 20000 + $$ % 20000 ))
pids=()

cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  ip netns del "$nsA" 2>/dev/null
  ip netns del "$nsB" 2>/dev/null
  ip link del "$vethA" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$nsA" || skip "ip netns add failed (no namespace support here)"
ip netns add "$nsB" || skip "ip netns add failed"
ip link add "$vethA" type veth peer name "$vethB" || skip "cannot create a veth pair"
ip link set "$vethA" netns "$nsA"
ip link set "$vethB" netns "$nsB"
ip -n "$nsA" addr add "$addrA/24" dev "$vethA"
ip -n "$nsB" addr add "$addrB/24" dev "$vethB"
for ns in "$nsA" "$nsB"; do ip -n "$ns" link set lo up; done
ip -n "$nsA" link set "$vethA" up
ip -n "$nsB" link set "$vethB" up
# Both ends up before anyone connects (the bootstrap retries connects anyway).
for _ in $(seq 50); do
  ip -n "$nsB" link show "$vethB" | grep -q 'state UP' && break
  sleep 0.1
done

secret=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
size=4
out=$(mktemp -d)
for rank in 0 1 2 3; do
  if (( rank < 2 )); then ns=$nsA host=hostA-$tag iface=$vethA; else ns=$nsB host=hostB-$tag iface=$vethB; fi
  ip netns exec "$ns" env \
    STRATA_RANK=$rank STRATA_SIZE=$size STRATA_LOCAL_RANK=$(( rank % 2 )) STRATA_LOCAL_SIZE=2 \
    STRATA_ROOT="$addrA:$port" STRATA_SECRET="$secret" \
    STRATA_BOOTSTRAP_BACKEND=tcp STRATA_BOOTSTRAP_TCP_INTERFACE="=$iface" \
    FI_TCP_IFACE="$iface" \
    STRATA_TRANSPORT_INTRA_NODE=shm STRATA_TRANSPORT_INTER_NODE=fabric \
    STRATA_TRANSPORT_FABRIC_PROVIDER="tcp;ofi_rxm" \
    STRATA_TEST_EXPECT_INTRA=shm STRATA_TEST_EXPECT_INTER=fabric STRATA_TEST_EXPECT_HOSTS=2 \
    unshare --uts sh -c 'hostname "$0" && exec "$@"' "$host" "$bin" "$@" \
    >"$out/rank$rank.log" 2>&1 &
  pids+=($!)
done

deadline=$(( $(date +%s) + ${TWO_HOSTS_TIMEOUT:-300} ))
status=0
killed=0
for i in "${!pids[@]}"; do
  p=${pids[$i]}
  while kill -0 "$p" 2>/dev/null; do
    if (( $(date +%s) > deadline )); then
      echo "FAIL: rank $i still running after ${TWO_HOSTS_TIMEOUT:-300} s; killing the job"
      status=1
      for q in "${pids[@]}"; do kill -KILL "$q" 2>/dev/null; done
      break
    fi
    sleep 0.2
  done
  wait "$p"; rc=$?
  if (( rc == 137 )) && [[ ${TWO_HOSTS_KEEP_GOING:-0} == 1 ]]; then
    echo "rank $i was killed (SIGKILL); going on without it"
    killed=$(( killed + 1 ))
  elif (( rc != 0 )); then
    echo "rank $i exited with status $rc"; status=1
  fi
done
for rank in 0 1 2 3; do sed "s/^/[rank $rank] /" "$out/rank$rank.log"; done
if (( killed == size )); then echo "FAIL: every rank was killed"; status=1; fi
rm -rf "$out"
pids=()
if (( status != 0 )); then
  echo "FAIL: two hosts"
elif (( killed > 0 )); then
  echo "two hosts: the $(( size - killed )) surviving ranks passed ($killed killed)"
else
  echo "two hosts: all $size ranks passed"
fi
exit $status
