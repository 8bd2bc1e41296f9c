#!/usr/bin/env bash
# Faults between two "hosts" (issue 15, item 2): network namespaces A and B, two ranks each
# (shm inside a host, fabric tcp;ofi_rxm across, bootstrap tcp), joined through a third namespace
# R, the "switch", by one veth pair each:
#
#     A (ranks 0,1) 10.232.S.1 ---- 10.232.S.254  R  10.233.S.254 ---- 10.233.S.1 B (ranks 2,3)
#
# R routes between them; for the relay cases it terminates every TCP connection instead and
# tests/stress/fault_relay.py forwards it (see there). One fault per run, aimed at one phase of
# tests/stress/net_faults.cpp (create, allgather, allreduce); the ranks report reaching a phase by
# marker files and the fault is injected when all of them are there, so no sleep decides a
# verdict (only the 1 s flap and the stall are sleeps: they are the faults).
#
# usage: net_faults.sh CASE BINARY
#   CASE  down-PHASE   R's port to B goes down and stays down: every rank must fail with Timeout
#                      or PeerLost naming a rank of the other host, within the timeout + margin
#         flap-PHASE   R's port to B goes down for 1 s (less than the timeouts): every rank must
#                      complete with correct results
#         slow         relay: 5 ms per chunk each way, 8 MB/s per connection and direction, host B
#                      started first (the relay resets its connections until rank 0 listens): the
#                      job must complete correctly, and the relay must have carried the fabric's
#                      bytes
#         stall-PHASE  relay: nothing crosses for 3 s (less than the timeouts): must complete
#         cut-PHASE    relay: every connection between the hosts is reset: every rank must fail
#                      with Timeout or PeerLost naming a rank of the other host, as for down
#                      (cut-create: or complete, when the cut hit only check-ins, which are
#                      retried)
#   Success cases must end within 4 x the timeout + 60 s of the start.
#   PHASE create | allgather | connect | allreduce
# env:  NETFAULT_TIMEOUT  bootstrap.timeout, connect_timeout and transport.timeout (default 8)
#       NETFAULT_MARGIN   seconds a rank may take beyond the timeout after the fault (default 22)
#       NETFAULT_COUNT    doubles per allReduce (default 524288: 4 MiB)
# Exit status: 0 passed, 1 failed, 77 cannot run here (no root, no ip netns).
set -u
case=${1:?usage: net_faults.sh CASE BINARY}
bin=${2:?usage: net_faults.sh CASE BINARY}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
echo "case: net-faults $case"

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: net-faults $case: $*"; status=1; }
[[ $(id -u) == 0 ]] || skip "needs root to create network namespaces"
command -v ip >/dev/null || skip "needs ip (iproute2)"
command -v unshare >/dev/null || skip "needs unshare (util-linux)"
command -v hostname >/dev/null || skip "needs hostname"
[[ -x $bin ]] || { echo "net_faults: $bin is not an executable"; exit 2; }

fault=${case%%-*} phase=${case#*-}
[[ $case == slow ]] && phase=none
case $fault in down | flap | stall | cut | slow) ;; *) echo "net_faults: unknown case $case"; exit 2 ;; esac
case $phase in create | allgather | connect | allreduce | none) ;; *) echo "net_faults: unknown phase $phase"; exit 2 ;; esac
relay=0
[[ $fault == slow || $fault == stall || $fault == cut ]] && relay=1
if (( relay )); then
  python=/usr/bin/python3
  [[ -x $python ]] || skip "needs /usr/bin/python3 for the relay"
fi

timeout_s=${NETFAULT_TIMEOUT:-8}
margin=${NETFAULT_MARGIN:-22}
count=${NETFAULT_COUNT:-524288}

tag="nf$$"
nsA="${tag}a" nsB="${tag}b" nsR="${tag}r"
s=$(( $$ % 250 ))
addrA=10.232.$s.1 addrB=10.233.$s.1 gwA=10.232.$s.254 gwB=10.233.$s.254
ifA=${tag}a0 ifRA=${tag}ra ifB=${tag}b0 ifRB=${tag}rb
# The hosts' ephemeral ports (every listener strata and libfabric open there) and the root port:
# the ports the relay serves.
ports_lo=20000 ports_hi=20127 root_port=20200 ctl_port=20300
pids=() relay_pid= stall_pid=
work=$(mktemp -d)
sync=$work/sync
mkdir -p "$sync"
status=0
calc() { awk "BEGIN { print ($*) }"; }

cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  [[ -n $relay_pid ]] && { kill -KILL "$relay_pid"; wait "$relay_pid"; } 2>/dev/null
  for ns in "$nsA" "$nsB" "$nsR"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$nsA" || skip "ip netns add failed (no namespace support here)"
ip netns add "$nsB" || skip "ip netns add failed"
ip netns add "$nsR" || skip "ip netns add failed"
ip link add "$ifA" netns "$nsA" type veth peer name "$ifRA" netns "$nsR" ||
  skip "cannot create a veth pair"
ip link add "$ifB" netns "$nsB" type veth peer name "$ifRB" netns "$nsR" ||
  skip "cannot create a veth pair"
for ns in "$nsA" "$nsB" "$nsR"; do ip -n "$ns" link set lo up; done
ip -n "$nsA" addr add "$addrA/24" dev "$ifA"
ip -n "$nsB" addr add "$addrB/24" dev "$ifB"
ip -n "$nsR" addr add "$gwA/24" dev "$ifRA"
ip -n "$nsR" addr add "$gwB/24" dev "$ifRB"
for l in "$nsA $ifA" "$nsB $ifB" "$nsR $ifRA" "$nsR $ifRB"; do
  set -- $l
  ip -n "$1" link set "$2" up
done
ip -n "$nsA" route add default via "$gwA"
ip -n "$nsB" route add default via "$gwB"
for ns in "$nsA" "$nsB"; do
  ip netns exec "$ns" sysctl -qw net.ipv4.ip_local_port_range="$ports_lo $ports_hi"
done
ip netns exec "$nsR" sysctl -qw net.ipv4.ip_forward=1
if (( relay )); then
  # R delivers everything that arrives from a host locally, to the relay.
  ip netns exec "$nsR" sysctl -qw net.ipv4.ip_nonlocal_bind=1
  ip -n "$nsR" route add local 0.0.0.0/0 dev lo table 100
  ip -n "$nsR" rule add iif "$ifRA" lookup 100
  ip -n "$nsR" rule add iif "$ifRB" lookup 100
  relay_args=(--ports "$ports_lo-$ports_hi,$root_port" --control "$ctl_port")
  [[ $fault == slow ]] && relay_args+=(--delay-ms 5 --rate 8000000)
  ip netns exec "$nsR" "$python" "$here/fault_relay.py" "${relay_args[@]}" >"$work/relay.log" 2>&1 &
  relay_pid=$!
fi
# Both ends up before anyone connects (the bootstrap retries connects anyway).
wait_for() {  # wait_for WHAT SECONDS COMMAND...: polls COMMAND until it succeeds
  local what=$1 limit=$2 end=$(( $(date +%s) + $2 ))
  shift 2
  local p
  until "$@"; do
    if (( $(date +%s) > end )); then fail "$what did not happen within $limit s"; return 1; fi
    for p in "${pids[@]}"; do
      kill -0 "$p" 2>/dev/null || { fail "a rank exited before: $what"; return 1; }
    done
    sleep 0.05
  done
}
up() { ip -n "$1" link show "$2" 2>/dev/null | grep -q 'state UP'; }
wait_for "link up" 10 up "$nsA" "$ifA" && wait_for "link up" 10 up "$nsB" "$ifB" || exit 1
ctl() {  # ctl COMMAND: one command to the relay, prints its answer
  ip netns exec "$nsR" bash -c "exec 3<>/dev/tcp/127.0.0.1/$ctl_port && echo '$1' >&3 && head -n1 <&3"
}
if (( relay )); then
  wait_for "relay start" 20 grep -q ready "$work/relay.log" || { cat "$work/relay.log"; exit 1; }
fi

secret=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
declare -A start_at end_at
start_rank() {
  local rank=$1 ns host iface
  if (( rank < 2 )); then ns=$nsA host=hostA-$tag iface=$ifA; else ns=$nsB host=hostB-$tag iface=$ifB; fi
  ip netns exec "$ns" env \
    STRATA_RANK=$rank STRATA_SIZE=4 STRATA_LOCAL_RANK=$(( rank % 2 )) STRATA_LOCAL_SIZE=2 \
    STRATA_ROOT="$addrA:$root_port" STRATA_SECRET="$secret" \
    STRATA_BOOTSTRAP_BACKEND=tcp STRATA_BOOTSTRAP_TCP_INTERFACE="=$iface" \
    STRATA_BOOTSTRAP_TIMEOUT="$timeout_s" STRATA_BOOTSTRAP_CONNECT_TIMEOUT="$timeout_s" \
    STRATA_TRANSPORT_TIMEOUT="$timeout_s" \
    FI_TCP_IFACE="$iface" \
    STRATA_TRANSPORT_INTRA_NODE=shm STRATA_TRANSPORT_INTER_NODE=fabric \
    STRATA_TRANSPORT_FABRIC_PROVIDER="tcp;ofi_rxm" \
    NETFAULT_SYNC="$sync" NETFAULT_PHASE="$phase" NETFAULT_COUNT="$count" \
    NETFAULT_WAIT=$(( 3 * timeout_s + margin + 30 )) \
    unshare --uts sh -c 'hostname "$0" && exec "$@"' "$host" "$bin" \
    >"$work/rank$rank.log" 2>&1 &
  pids[$rank]=$!
  start_at[$rank]=$(date +%s.%N)
}
markers() {  # markers NAME RANK...: every rank named has created SYNC/NAME.RANK
  local name=$1 r
  shift
  for r in "$@"; do [[ -e $sync/$name.$r ]] || return 1; done
}
fault_at=
link_down() { ip -n "$nsR" link set "$ifRB" down; fault_at=$(date +%s.%N); echo "fault: R's port to host B down at $fault_at"; }
link_up() { ip -n "$nsR" link set "$ifRB" up; echo "fault: R's port to host B up at $(date +%s.%N)"; }
# The fault, as the case says; flap and stall end with the link or path healed.
inject() {
  case $fault in
    down) link_down ;;
    flap) link_down; sleep 1; link_up ;;
    stall) answer=$(ctl "stall 3"); fault_at=${answer##* }; echo "fault: relay stall 3 s: $answer" ;;
    cut) answer=$(ctl cut); fault_at=${answer##* }; echo "fault: relay $answer" ;;
  esac
}

job_start=$(date +%s.%N)
marker_limit=$(( 2 * timeout_s + 60 ))
if [[ $phase == create ]]; then
  # Host A's ranks wait in the rendezvous for host B's.
  start_rank 0; start_rank 1
  wait_for "ranks 0 and 1 entering create" "$marker_limit" markers create 0 1
  # Host B's ranks start during the fault, so every connection between the hosts is made in it.
  case $fault in
    down) link_down; start_rank 2; start_rank 3 ;;
    flap) link_down; start_rank 2; start_rank 3; sleep 1; link_up ;;
    stall) { inject & stall_pid=$!; }; start_rank 2; start_rank 3 ;;
    cut) start_rank 2; start_rank 3
         wait_for "ranks 2 and 3 entering create" "$marker_limit" markers create 2 3 && inject ;;
  esac
elif [[ $phase == connect ]]; then
  # The link goes down before the ranks set up their fabric connections (Communicator::create).
  for r in 0 1 2 3; do start_rank $r; done
  if wait_for "all ranks before Communicator::create" "$marker_limit" markers connect 0 1 2 3; then
    case $fault in
      down) link_down; touch "$sync/go" ;;
      flap) link_down; touch "$sync/go"; sleep 1; link_up ;;
      *) touch "$sync/go"; inject ;;
    esac
  fi
elif [[ $phase == none ]]; then
  # Host B first: its ranks reach the relay before rank 0 listens, so the relay accepts their
  # connections and resets them when its own connection is refused (as a proxy would).
  start_rank 2; start_rank 3
  wait_for "ranks 2 and 3 entering create" "$marker_limit" markers create 2 3
  start_rank 0; start_rank 1
else
  for r in 0 1 2 3; do start_rank $r; done
  # Every rank completed one call of the phase and loops on it until told to stop.
  wait_for "all ranks in the $phase loop" "$marker_limit" markers "$phase" 0 1 2 3 && inject
  touch "$sync/stop"
fi
[[ -n $stall_pid ]] && wait "$stall_pid"  # a stall in the background

# Every rank ends: within the timeout + margin after the fault for the failing cases (a hang
# fails the test), within a generous limit otherwise.
if [[ $fault == down || $fault == cut ]]; then limit=$(( timeout_s + margin )); ref=${fault_at:-$job_start}
else limit=$(( 4 * timeout_s + 60 )); ref=$job_start; fi
running=(0 1 2 3)
while (( ${#running[@]} )); do
  now=$(date +%s.%N) still=()
  for r in "${running[@]}"; do
    if ! kill -0 "${pids[$r]}" 2>/dev/null; then
      wait "${pids[$r]}"; rc[$r]=$?; end_at[$r]=$now
    elif (( $(calc "$now - $ref > $limit") )); then
      fail "rank $r still running $limit s after $([[ $ref == "$job_start" ]] && echo start || echo the fault) (a hang); killing it"
      kill -KILL "${pids[$r]}"; wait "${pids[$r]}"; rc[$r]=$?; end_at[$r]=$now
    else
      still+=("$r")
    fi
  done
  running=("${still[@]}")
  (( ${#running[@]} )) && sleep 0.05
done
pids=()

for r in 0 1 2 3; do sed "s/^/[rank $r] /" "$work/rank$r.log"; done
if (( relay )); then
  stats=$(ctl stats)
  echo "relay: $stats"
  sed 's/^/[relay] /' "$work/relay.log"
  # The fabric's traffic went through the relay, not only the bootstrap's (a few KiB).
  relayed=$(sed -n 's/.* bytes \([0-9]*\) .*/\1/p' <<<"$stats")
  if [[ $fault != cut && $phase != create ]] && (( ${relayed:-0} < count * 8 )); then
    fail "the relay carried ${relayed:-no} bytes, less than one allReduce ($(( count * 8 )) bytes)"
  fi
fi

# Verdicts.
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }
for r in 0 1 2 3; do
  line=$(grep '^RESULT ' "$work/rank$r.log" | tail -n1)
  st=$(field status "$line")
  if [[ -z $line ]]; then fail "rank $r printed no RESULT (exit status ${rc[$r]})"; continue; fi
  case $fault in
    flap | slow | stall)
      [[ $st == ok && ${rc[$r]} == 0 ]] || fail "rank $r: expected success, got: $line (exit ${rc[$r]})"
      ;;
    down | cut)
      # A cut during creation may hit only check-ins, which a rank retries until
      # bootstrap.connect_timeout: then the job completes (the results are checked by the ranks).
      if [[ $fault == cut && $phase == create && $st == ok && ${rc[$r]} == 0 ]]; then
        echo "rank $r: completed: the cut hit the rendezvous only, and the check-in was retried"
        continue
      fi
      code=$(field code "$line") peer=$(field peer "$line") at=$(field at "$line")
      msg=${line#* msg=}
      if [[ $st != error ]]; then fail "rank $r: expected a Timeout or PeerLost error, got: $line"; continue; fi
      [[ $code == Timeout || $code == PeerLost ]] || fail "rank $r: code $code, expected Timeout or PeerLost"
      # The message must name a rank of the other host: "rank 2", or "missing ranks: 2, 3" (the
      # rendezvous). peer() is that rank, the first missing one (rank 0 of the rendezvous), or
      # the rank that reports the failure (rank 0 of the rendezvous, to rank 1).
      named=$(grep -oE 'rank [0-9]+|missing ranks: [0-9, ]+' <<<"$msg" | grep -oE '[0-9]+' | sort -u)
      other=
      for n in $named; do (( n / 2 != r / 2 )) && other+=" $n"; done
      # A rank of this host may fail first (its own connection across broke) and exit; a rank
      # whose next bootstrap step needed it then fails naming it ("cannot connect to rank 2 ...
      # the listener closed the connection"), which is true: seen in about 1 run in 20-60 with
      # the CPUs busy, before and after stop 44. Accepted when that rank's own error names a
      # rank of the other host (the chain leads there); otherwise a failure.
      if [[ -z $other ]]; then
        for n in $named; do
          (( n / 2 == r / 2 && n != r )) || continue
          nmsg=$(grep '^RESULT ' "$work/rank$n.log" | tail -n1)
          nmsg=${nmsg#* msg=}
          for m in $(grep -oE 'rank [0-9]+|missing ranks: [0-9, ]+' <<<"$nmsg" | grep -oE '[0-9]+' | sort -u); do
            if (( m / 2 != r / 2 )); then
              echo "rank $r: names rank $n of its own host, which failed first naming rank $m of the other host"
              other+=" $n>$m"
              break 2
            fi
          done
        done
      fi
      [[ -n $other ]] || fail "rank $r: the message names no rank of the other host: $msg"
      [[ $peer == -1 && $msg != *"missing ranks"* ]] &&
        fail "rank $r: peer() is -1 although one rank is involved: $msg"
      if [[ $peer =~ ^[0-9]+$ ]] && (( peer / 2 != r / 2 )); then
        # "rank 2", or one of "missing ranks: 2, 3" (rank 0's rendezvous sets peer() to the first).
        grep -qE "rank $peer\b" <<<"$msg" || grep -qx "$peer" <<<"$named" ||
          fail "rank $r: the message does not name rank $peer (peer()): $msg"
      fi
      detect=$(calc "$at - $fault_at")
      printf 'rank %d: %s peer %s (names%s), detected %.1f s after the fault, exited %.1f s after it (%s call started %.2f s before the fault)\n' \
        "$r" "$code" "$peer" "$other" "$detect" "$(calc "${end_at[$r]} - $fault_at")" "$(field phase "$line")" \
        "$(calc "$fault_at - $(field call_start "$line")")"
      ;;
  esac
done
printf 'net-faults %s: job took %.1f s\n' "$case" "$(calc "$(date +%s.%N) - $job_start")"
(( status == 0 )) && echo "PASS: net-faults $case" || echo "FAIL: net-faults $case"
exit $status
