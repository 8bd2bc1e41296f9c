#!/usr/bin/env bash
# Faults of processes and hostile neighbours (issue 15, items 3 and 4): jobs of 4 ranks of
# proc-faults (tests/stress/proc_faults.cpp) where one rank is stopped, killed, leaves, is
# impersonated, or the launcher dies; and strangers (a wrong secret, a replayed handshake, port
# scans and slow-loris connections) on every listener. Each case prints its name, what every rank
# reported and PASS/FAIL. The ranks tell the script where they are through files, so the script
# stops or kills them at known points; pass/fail never depends on a sleep: the ranks' own errors
# (with the configured small timeouts below) and their exit statuses decide.
#
# usage: proc_faults.sh MODE BINARY [CASE...]
#   MODE  strata-run:PATH   (ranks started by strata-run)
#         srun              (tests/harness/run-srun.sh on the local Slurm; skips when none is up)
#   CASE  sigstop-long sigstop-short rank0-kill-rendezvous rank0-late exit-clean exit-_exit impostor
#         impostor-rendezvous launcher-kill wrong-secret replay loris loris-fabric secret-file-mode secret-in-logs
#         (default: all
#         that the MODE supports; the hostile ones run under strata-run only)
# Exit status: 0 all passed, 1 a case failed, 77 the launcher is not available (skip).
set -u

mode=${1:?usage: proc_faults.sh MODE BINARY [CASE...]}
bin=${2:?usage: proc_faults.sh MODE BINARY [CASE...]}
shift 2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
hostile="$here/hostile_peer.py"
py=$(command -v python3 || echo /usr/bin/python3)
[[ -x $bin ]] || { echo "proc_faults: $bin is not an executable" >&2; exit 2; }

export STRATA_BOOTSTRAP_TCP_INTERFACE=lo FI_TCP_IFACE=lo UCX_NET_DEVICES=lo
# Small configured timeouts: a fault must be reported within them (plus a margin for a loaded
# machine); the cases never wait on a sleep to decide.
T=5
export STRATA_BOOTSTRAP_TIMEOUT=$T STRATA_TRANSPORT_TIMEOUT=$T STRATA_BOOTSTRAP_CONNECT_TIMEOUT=$T
export STRATA_BOOTSTRAP_HANDSHAKE_TIMEOUT=2
unset STRATA_SECRET STRATA_BOOTSTRAP_SECRET_FILE
N=4
# Cases that hold a rank back before its create give the rendezvous more time, so that a loaded
# machine does not end it before the script has placed its fault.
HOLD_CT=8
BOUND=$((HOLD_CT * 2 + 5))  # the latest a rank may report a fault, in its own "after S s"

case $mode in
  strata-run:*) launcher=${mode#strata-run:}; lname=strata-run ;;
  srun) launcher=srun; lname=srun ;;
  *) echo "proc_faults: unknown MODE '$mode'" >&2; exit 2 ;;
esac

work=$(mktemp -d "${TMPDIR:-/tmp}/proc-faults.XXXXXX")
# srun gives no job secret: these jobs authenticate with bootstrap.secret_file, as users should.
secrets=$(mktemp -d "${TMPDIR:-/tmp}/proc-faults-secrets.XXXXXX")
if [[ $lname == srun ]]; then
  od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$secrets/job"
  chmod 600 "$secrets/job"
  export STRATA_BOOTSTRAP_SECRET_FILE=$secrets/job
fi
echo 0123456789abcdef0123456789abcdef >"$secrets/wrong"
chmod 600 "$secrets/wrong"
if [[ $lname == strata-run ]]; then
  wrong_secret=(STRATA_SECRET=0123456789abcdef0123456789abcdef)
else
  wrong_secret=("STRATA_BOOTSTRAP_SECRET_FILE=$secrets/wrong")
fi
bg_pids=()  # helpers and jobs we started
cleanup() {
  local p f
  for p in "${bg_pids[@]}"; do
    kill -9 "$p" 2>/dev/null && wait "$p" 2>/dev/null
  done
  # Ranks whose pids we recorded (they may outlive a killed launcher in a failing case).
  for f in "$work"/*/pid.*; do
    [[ -r $f ]] || continue
    p=$(cat "$f" 2>/dev/null)
    [[ $p =~ ^[0-9]+$ ]] && kill -CONT "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null
  done
  [[ ${KEEP_WORK:-0} == 1 ]] || rm -rf "$work"
  rm -rf "$secrets"
}
trap cleanup EXIT

note() { echo "  $*"; }
problem=""
fail() { problem+="    - $*"$'\n'; }

# wait_files SECONDS DIR NAME...: until every DIR/NAME exists.
wait_files() {
  local secs=$1 d=$2 end=$((SECONDS + $1)) f
  shift 2
  for f in "$@"; do
    until [[ -e $d/$f ]]; do
      if ((SECONDS >= end)); then
        fail "$f did not appear within $secs s"
        return 1
      fi
      sleep 0.02
    done
  done
}

pid_of() { cat "$1/pid.$2"; }

# tcp_ports PID STATE: the local ports of PID's TCP sockets in STATE (0A listening, 01
# established), from /proc (ss -p scans every process, which takes seconds on a busy machine).
tcp_ports() {
  local f l inodes=" "
  for f in /proc/"$1"/fd/*; do
    l=$(readlink "$f" 2>/dev/null) || continue
    [[ $l == socket:\[*\] ]] && inodes+="${l:8:-1} "
  done
  [[ $inodes == " " ]] && return
  local hex
  for hex in $(awk -v st="$2" -v inodes="$inodes" \
    'FNR > 1 && $4 == st && index(inodes, " " $10 " ") { n = split($2, a, ":"); print a[n] }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null); do
    echo $((16#$hex))
  done
}

# The TCP ports process PID listens on.
listen_ports() { tcp_ports "$1" 0A | sort -un; }

# wait_connected SECONDS PID: until PID has an established TCP connection (it is checking in).
wait_connected() {
  local end=$((SECONDS + $1))
  until [[ -n $(tcp_ports "$2" 01) ]]; do
    if ! kill -0 "$2" 2>/dev/null; then
      fail "pid $2 exited before it connected anywhere"
      return 1
    fi
    if ((SECONDS >= end)); then
      fail "pid $2 made no TCP connection within $1 s"
      return 1
    fi
    sleep 0.02
  done
}

# start_job DIR STEPS [VAR=VALUE...]: starts N ranks of proc-faults; job_pid is the launcher's.
start_job() {
  local d=$1 steps=$2
  shift 2
  mkdir -p "$d/out"
  if [[ $lname == strata-run ]]; then
    (exec env "$@" "$launcher" -n $N --grace 30 ${launcher_verbose:+-v} --output-dir "$d/out" \
      "$bin" "$d" "$steps" \
      2>"$d/launcher.err") &
  else
    (exec env "$@" bash "$here/../harness/run-srun.sh" --kill-on-bad-exit=0 \
      --output="$d/out/rank-%t.out" --error="$d/out/rank-%t.err" $N "$bin" "$d" "$steps" \
      >"$d/launcher.out" 2>"$d/launcher.err") &
  fi
  job_pid=$!
  bg_pids+=("$job_pid")
}

# wait_job SECONDS: waits for the launcher; job_rc is its status (kills it past SECONDS).
wait_job() {
  local end=$((SECONDS + $1))
  while kill -0 "$job_pid" 2>/dev/null; do
    if ((SECONDS >= end)); then
      fail "the job did not end within $1 s (hang); killed"
      kill -9 "$job_pid" 2>/dev/null
      wait "$job_pid" 2>/dev/null
      job_rc=124
      return 1
    fi
    sleep 0.05
  done
  wait "$job_pid"
  job_rc=$?
}

# The FAILED line of rank R in DIR (empty if none).
failed_line() { grep -h "FAILED" "$1/out/rank-$2.out" 2>/dev/null | head -n 1; }

# expect_failure DIR RANK WHERE CODES NAMED: rank RANK reported a FAILED line in WHERE (a
# prefix), with a code among CODES (a regex), naming rank NAMED (-1: any), within BOUND s.
expect_failure() {
  local d=$1 r=$2 where=$3 codes=$4 named=$5 line code after
  line=$(failed_line "$d" "$r")
  if [[ -z $line ]]; then
    fail "rank $r reported no failure; its output: $(tail -n 3 "$d/out/rank-$r.out" "$d/out/rank-$r.err" 2>/dev/null | tr '\n' ' ')"
    return
  fi
  note "rank $r: ${line#proc-faults: }"
  [[ $line == *": $where"* ]] || fail "rank $r failed elsewhere than in $where"
  code=$(sed -n 's/.*FAILED code=\([A-Za-z]*\).*/\1/p' <<<"$line")
  [[ $code =~ ^($codes)$ ]] || fail "rank $r: code $code, expected $codes"
  after=$(sed -n 's/.* after \([0-9.]*\) s:.*/\1/p' <<<"$line")
  awk -v a="$after" -v b="$BOUND" 'BEGIN { exit !(a != "" && a <= b) }' ||
    fail "rank $r took $after s to report it (bound $BOUND s)"
  if [[ $named -ge 0 ]]; then
    local msg=${line#*: FAILED }
    grep -qE "(peer=$named |rank $named([^0-9]|$))" <<<"$msg" ||
      fail "rank $r's error does not name rank $named"
  fi
}

# expect_named DIR CULPRIT CODES RANK...: every RANK failed in a step with a code among CODES,
# and its message names CULPRIT: directly (the rank it waited for), or through the failure note
# of a neighbour that gave up first and exited ("... it exited ... (rank 0 failed first: ...
# waiting for rank 2 ...)").
expect_named() {
  local d=$1 culprit=$2 codes=$3 r direct=0 line
  shift 3
  for r in "$@"; do
    expect_failure "$d" "$r" "step" "$codes" "$culprit"
    line=$(failed_line "$d" "$r")
    [[ $line == *"FAILED code="*" peer=$culprit "* ]] && direct=$((direct + 1))
  done
  note "$direct of $# ranks name rank $culprit as the peer; the others through a failure note"
}

# expect_success DIR STEPS: the job exited 0 and every rank ran every step and finished.
expect_success() {
  local d=$1 steps=$2 r
  [[ $job_rc -eq 0 ]] || fail "the job exited $job_rc"
  for ((r = 0; r < N; r++)); do
    grep -q "rank $r: done" "$d/out/rank-$r.out" 2>/dev/null ||
      fail "rank $r did not finish: $(tail -n 3 "$d/out/rank-$r.out" "$d/out/rank-$r.err" 2>/dev/null | tr '\n' ' ')"
    [[ $(grep -c "rank $r: step [0-9]* ok" "$d/out/rank-$r.out" 2>/dev/null) -eq $steps ]] ||
      fail "rank $r did not complete $steps steps"
  done
}

# gone_within SECONDS PID...: every PID has exited within SECONDS.
gone_within() {
  local end=$((SECONDS + $1)) p
  shift
  for p in "$@"; do
    while kill -0 "$p" 2>/dev/null && [[ $(ps -o stat= -p "$p" 2>/dev/null) != Z* ]]; do
      if ((SECONDS >= end)); then
        fail "pid $p still runs $1 s after the launcher died"
        return 1
      fi
      sleep 0.05
    done
  done
}

all_ranks() { local s=$1 r out=(); for ((r = 0; r < N; r++)); do out+=("$s$r${2:-}"); done; echo "${out[@]}"; }

# Runs a process with rank R's launch environment (from /proc/PID/environ), plus VAR=VALUE
# overrides, as proc-faults in DIR; its output goes to DIR/out/rank-R.out. Sets other_rc.
run_as_rank() {
  local pid=$1 d=$2 r=$3 secs=$4
  shift 4
  local vars=()
  mapfile -d '' vars </proc/"$pid"/environ
  local keep=() v
  for v in "${vars[@]}"; do
    [[ $v == STRATA_ROOT_FD=* || $v == LD_PRELOAD=* ]] && continue
    keep+=("$v")
  done
  mkdir -p "$d/out"
  timeout -k 5 "$secs" env -i "${keep[@]}" "$@" "$bin" "$d" 1 \
    >"$d/out/rank-$r.out" 2>"$d/out/rank-$r.err"
  other_rc=$?
}

# ---------------------------------------------------------------------------------------------
# Item 3: faults of processes.

case_sigstop_long() {  # a rank frozen longer than the timeout: the others name it
  local d=$work/sigstop-long p2
  start_job "$d" 1
  wait_files 60 "$d" $(all_ranks at. .0) || return
  p2=$(pid_of "$d" 2)
  kill -STOP "$p2"
  touch "$d/go.0"
  local r
  for r in 0 1 3; do
    local end=$((SECONDS + 40))
    until [[ -n $(failed_line "$d" $r) ]] || ! kill -0 "$(pid_of "$d" $r)" 2>/dev/null; do
      ((SECONDS < end)) || break
      sleep 0.05
    done
  done
  kill -CONT "$p2"
  wait_job 40
  expect_named "$d" 2 "Timeout|PeerLost" 0 1 3
  local l2
  l2=$(failed_line "$d" 2)
  note "rank 2 (continued after the others failed): ${l2:-$(tail -n 1 "$d/out/rank-2.out")}"
}

case_sigstop_short() {  # a rank frozen shorter than the timeout: the job completes
  local d=$work/sigstop-short p2
  start_job "$d" 2
  wait_files 60 "$d" $(all_ranks at. .0) || return
  p2=$(pid_of "$d" 2)
  kill -STOP "$p2"
  touch "$d/go.0"
  sleep 1.5  # the length of the fault (T is 5 s), not a pass/fail decision
  kill -CONT "$p2"
  touch "$d/go.all"
  wait_job 60
  expect_success "$d" 2
}

case_rank0_kill_rendezvous() {  # rank 0 dies while the others check in: they fail, no hang
  local d=$work/rank0-kill
  mkdir -p "$d"
  touch "$d/hold.3"  # rank 3 stays out, so the rendezvous cannot finish before the kill
  start_job "$d" 1 STRATA_BOOTSTRAP_CONNECT_TIMEOUT=$HOLD_CT
  wait_files 60 "$d" $(all_ranks pid.) || return
  wait_connected 30 "$(pid_of "$d" 1)" || return
  wait_connected 30 "$(pid_of "$d" 2)" || return
  kill -9 "$(pid_of "$d" 0)"
  touch "$d/release.3" "$d/go.all"
  wait_job 60
  local r
  for r in 1 2 3; do expect_failure "$d" $r create "Timeout|PeerLost" 0; done
}

case_rank0_late() {  # rank 0 starts 1.5 s late and rank 3 never comes: all name rank 3
  local d=$work/rank0-late
  mkdir -p "$d"
  touch "$d/hold.0" "$d/hold.3"
  start_job "$d" 1 STRATA_BOOTSTRAP_CONNECT_TIMEOUT=$HOLD_CT
  wait_files 60 "$d" pid.1 pid.2 || return
  sleep 1.5  # the fault: rank 0 starts serving 1.5 s after ranks 1 and 2 began to check in
  touch "$d/release.0"
  local r end=$((SECONDS + 40))
  for r in 0 1 2; do
    until [[ -n $(failed_line "$d" $r) ]] || ((SECONDS >= end)); do sleep 0.05; done
  done
  kill -9 "$(pid_of "$d" 3)"  # it never took part
  wait_job 60
  # Ranks 1 and 2 checked in before rank 0 served: they report rank 0's verdict, which names
  # the missing rank, not a timeout of their own.
  for r in 0 1 2; do
    expect_failure "$d" $r create Timeout -1
    [[ $(failed_line "$d" $r) == *"missing ranks: 3."* ]] || fail "rank $r's error does not name the missing rank 3"
  done
}

exit_between() {  # HOW: a rank leaves between two collectives; the others' next call names it
  local how=$1 d=$work/exit-$1
  start_job "$d" 2 PF_EXIT="2:1:$how"
  touch "$d/go.all"
  wait_job 60
  grep -q "rank 2: leaving before step 1" "$d/out/rank-2.out" || fail "rank 2 did not leave"
  local r
  expect_named "$d" 2 "PeerLost" 0 1 3
}
case_exit_clean() { exit_between clean; }
case_exit__exit() { exit_between _exit; }

case_impostor() {  # a second process with a live rank's identity: refused, the job unaffected
  local d=$work/impostor
  start_job "$d" 2
  wait_files 60 "$d" $(all_ranks up.) || return
  touch "$d/go.0"
  wait_files 60 "$d" $(all_ranks at. .1) || return
  run_as_rank "$(pid_of "$d" 1)" "$d/imp" 1 40
  local line
  line=$(failed_line "$d/imp" 1)
  note "impostor of rank 1 (exit $other_rc): ${line#proc-faults: }"
  [[ $other_rc -eq 3 ]] || fail "the impostor exited $other_rc, expected 3 (a strata error)"
  [[ $line == *"code=Timeout peer=0 "* && $line == *"the rank of a live one"* ]] ||
    fail "the impostor did not get a Timeout naming rank 0 that says the rank may be taken"
  touch "$d/go.1"
  wait_job 60
  expect_success "$d" 2
}

case_impostor_rendezvous() {  # the same, while rank 0 still collects check-ins: all fail, clearly
  local d=$work/impostor-rdv
  mkdir -p "$d"
  touch "$d/hold.3"
  start_job "$d" 1 STRATA_BOOTSTRAP_CONNECT_TIMEOUT=$HOLD_CT
  wait_files 60 "$d" $(all_ranks pid.) || return
  wait_connected 30 "$(pid_of "$d" 1)" || return
  wait_connected 30 "$(pid_of "$d" 2)" || return
  run_as_rank "$(pid_of "$d" 1)" "$d/imp" 1 40
  local line
  line=$(failed_line "$d/imp" 1)
  note "impostor of rank 1 (exit $other_rc): ${line#proc-faults: }"
  [[ $line == *"code=InvalidConfig"*"checked in twice"* ]] ||
    fail "the impostor was not told that rank 1 checked in twice"
  local r end=$((SECONDS + 40))
  for r in 0 1 2; do
    until [[ -n $(failed_line "$d" $r) ]] || ((SECONDS >= end)); do sleep 0.05; done
  done
  kill -9 "$(pid_of "$d" 3)"  # held back all along; it would only time out
  wait_job 60
  # Rank 0 cannot tell the real rank 1 from the impostor: the job fails, saying why.
  expect_failure "$d" 0 create InvalidConfig 1
  expect_failure "$d" 1 create InvalidConfig 1
  expect_failure "$d" 2 create InvalidConfig 1
}

case_launcher_kill() {  # the launcher dies while ranks wait in a collective: none lingers
  local d=$work/launcher-kill
  start_job "$d" 2
  wait_files 60 "$d" $(all_ranks at. .0) || return
  touch "$d/go.0"
  wait_files 60 "$d" $(all_ranks at. .1) || return
  # Ranks 0-2 enter the step-1 allReduce and wait there for rank 3, which waits for a file.
  touch "$d/go.1.0" "$d/go.1.1" "$d/go.1.2"
  local pids=() r
  for ((r = 0; r < N; r++)); do pids+=("$(pid_of "$d" $r)"); done
  kill -9 "$job_pid"
  wait "$job_pid" 2>/dev/null
  local t0=$SECONDS
  gone_within $((T + 10)) "${pids[@]}" && note "every rank was gone $((SECONDS - t0)) s after the launcher was killed"
  for r in 0 1 2 3; do
    local l
    l=$(failed_line "$d" $r)
    [[ -n $l ]] && note "rank $r: ${l#proc-faults: }"
  done
}

# ---------------------------------------------------------------------------------------------
# Item 4: hostile neighbours (strata-run).

case_wrong_secret() {  # at the rendezvous: AuthFailed at the stranger only; after it: Timeout
  local d=$work/wrong-secret
  mkdir -p "$d"
  touch "$d/hold.3"
  start_job "$d" 1 STRATA_BOOTSTRAP_CONNECT_TIMEOUT=$HOLD_CT
  wait_files 60 "$d" $(all_ranks pid.) || return
  wait_connected 30 "$(pid_of "$d" 1)" || return
  run_as_rank "$(pid_of "$d" 3)" "$d/during" 3 30 "${wrong_secret[@]}"
  local line
  line=$(failed_line "$d/during" 3)
  note "stranger during the rendezvous (exit $other_rc): ${line#proc-faults: }"
  [[ $line == *"code=AuthFailed"* ]] || fail "the stranger during the rendezvous did not get AuthFailed"
  touch "$d/release.3"
  wait_files 60 "$d" $(all_ranks at. .0) || return
  run_as_rank "$(pid_of "$d" 3)" "$d/after" 3 30 "${wrong_secret[@]}" \
    STRATA_BOOTSTRAP_CONNECT_TIMEOUT=3
  line=$(failed_line "$d/after" 3)
  note "stranger after the rendezvous (exit $other_rc): ${line#proc-faults: }"
  # Nobody answers on the root port once the rendezvous is over: the stranger learns nothing and
  # times out (it never reaches a step where the secret is checked).
  [[ $line == *"code=Timeout peer=0 "* ]] || fail "the stranger after the rendezvous did not time out naming rank 0"
  touch "$d/go.all"
  wait_job 60
  expect_success "$d" 1
  grep -h "failed authentication" "$d"/out/rank-0.err | head -n 2 | sed 's/^/  rank 0 log: /'
}

case_replay() {  # a real rank's handshake, recorded by a proxy and replayed: refused
  local d=$work/replay rootport pport
  mkdir -p "$d"
  touch "$d/hold.3" "$d/hold.2"
  start_job "$d" 1 STRATA_BOOTSTRAP_CONNECT_TIMEOUT=$HOLD_CT
  wait_files 60 "$d" $(all_ranks pid.) || return
  rootport=$(tr '\0' '\n' </proc/"$(pid_of "$d" 0)"/environ | sed -n 's/^STRATA_ROOT=.*://p')
  "$py" "$hostile" proxy "$d/proxy.port" "$rootport" "$d/record" &
  local proxy=$!
  bg_pids+=("$proxy")
  wait_files 20 "$d" proxy.port || return
  pport=$(cat "$d/proxy.port")
  echo "127.0.0.1:$pport" >"$d/root.3"
  touch "$d/release.3"
  # Rank 3's handshake (85 bytes) and its check-in record pass the proxy.
  local end=$((SECONDS + 30))
  until [[ $(stat -c %s "$d/record" 2>/dev/null || echo 0) -gt 97 ]]; do
    ((SECONDS < end)) || { fail "rank 3's check-in never went through the proxy"; return; }
    sleep 0.02
  done
  local out
  out=$(timeout -k 2 20 "$py" "$hostile" replay "$rootport" "$d/record")
  note "replay to the rendezvous: $out"
  [[ $out == "replay: refused: "* ]] || fail "the replayed handshake was not refused"
  touch "$d/release.2" "$d/go.all"
  wait_job 60
  expect_success "$d" 1
  kill "$proxy" 2>/dev/null
  wait "$proxy" 2>/dev/null
}

loris() {  # port scans and slow-loris connections on every listener: the job completes
  local d=$work/$1 ports=() p r
  shift
  mkdir -p "$d"
  touch "$d/hold.3"
  start_job "$d" 2 "$@" STRATA_BOOTSTRAP_CONNECT_TIMEOUT=$HOLD_CT
  wait_files 60 "$d" $(all_ranks pid.) || return
  wait_connected 30 "$(pid_of "$d" 1)" || return
  # strata-run's root socket is rank 0's after the start; srun's own ports are Slurm's business.
  for p in $(pid_of "$d" 0) $(pid_of "$d" 1) $(pid_of "$d" 2); do
    ports+=($(listen_ports "$p"))
  done
  ports=($(printf '%s\n' "${ports[@]}" | sort -un))
  note "during the rendezvous: attacking ports ${ports[*]}"
  "$py" "$hostile" loris 4 "${ports[@]}" >"$d/loris1.out" &
  local l1=$!
  bg_pids+=($l1)
  sleep 1  # let the attack start first; the job's result decides, not this
  touch "$d/release.3"
  wait_files 60 "$d" $(all_ranks at. .0) || return
  wait "$l1"
  note "$(cat "$d/loris1.out")"
  ports=()
  for p in $(for ((r = 0; r < N; r++)); do pid_of "$d" $r; done); do
    ports+=($(listen_ports "$p"))
  done
  ports=($(printf '%s\n' "${ports[@]}" | sort -un))
  note "during the collectives: attacking ports ${ports[*]}"
  "$py" "$hostile" loris 4 "${ports[@]}" >"$d/loris2.out" &
  local l2=$!
  bg_pids+=($l2)
  sleep 1
  touch "$d/go.0"
  wait_files 60 "$d" $(all_ranks at. .1) || return
  touch "$d/go.1"
  wait_job 60
  wait "$l2"
  note "$(cat "$d/loris2.out")"
  expect_success "$d" 2
  # A scan (connect, then close without a byte) is not worth a warning per connection: every
  # warning must come from a connection that sent or held something.
  local opened=0 scans=0 warns f
  for f in "$d/loris1.out" "$d/loris2.out"; do
    opened=$((opened + $(sed -n 's/.* opened \([0-9]*\),.*/\1/p' "$f")))
    scans=$((scans + $(sed -n 's/.*scans \([0-9]*\),.*/\1/p' "$f")))
  done
  warns=$(cat "$d"/out/rank-*.err | grep -c "WARN.*rejected a connection")
  note "$warns warnings in the ranks' logs for $opened hostile connections and $scans scans"
  ((warns <= opened)) || fail "$warns warnings for $opened hostile connections: scans are warned about"
}
case_loris() { loris loris; }
# The fabric transport's tcp provider (its own listeners) carries the collectives.
case_loris_fabric() {
  loris loris-fabric STRATA_TRANSPORT_INTRA_NODE=fabric "STRATA_TRANSPORT_FABRIC_PROVIDER=tcp;ofi_rxm"
}

case_secret_file_mode() {  # a secret file others can read: a warning naming it
  local d=$work/secret-file f
  mkdir -p "$d/out"
  touch "$d/go.all"
  f=$d/secret
  echo "s3cr3t-for-the-mode-test" >"$f"
  chmod 644 "$f"
  STRATA_RANK=0 STRATA_SIZE=1 STRATA_BOOTSTRAP_SECRET_FILE=$f timeout -k 2 30 "$bin" "$d" 1 \
    >"$d/out/644.out" 2>"$d/out/644.err"
  grep -q "rank 0: done" "$d/out/644.out" || fail "the mode-644 run did not finish"
  local w
  w=$(grep -F "$f" "$d/out/644.err" | head -n 1)
  note "mode 644: ${w:-no warning}"
  [[ -n $w ]] || fail "no warning names $f (mode 644)"
  chmod 600 "$f"
  STRATA_RANK=0 STRATA_SIZE=1 STRATA_BOOTSTRAP_SECRET_FILE=$f timeout -k 2 30 "$bin" "$d" 1 \
    >"$d/out/600.out" 2>"$d/out/600.err"
  [[ ! -s $d/out/600.err ]] || fail "mode 600 printed: $(head -n 2 "$d/out/600.err")"
  grep -q "rank 0: done" "$d/out/600.out" || fail "the mode-600 run did not finish"
}

case_secret_in_logs() {  # no secret in any log line at trace level
  local d=$work/secret-logs secret outer=""
  mkdir -p "$d"
  touch "$d/hold.0"
  if [[ $lname == strata-run ]]; then
    # strata-run inherits an outer STRATA_SECRET (a nested launch): it replaces it, and must not
    # print that one either.
    outer=5ec2e7f00dfeedc0ffee5ec2e7f00dfeedc0ffee5ec2e7f00dfeedc0ffee0001
    launcher_verbose=1 start_job "$d" 2 STRATA_LOG_LEVEL=trace \
      STRATA_BOOTSTRAP_CONNECT_TIMEOUT=$HOLD_CT STRATA_SECRET=$outer
    wait_files 60 "$d" pid.0 || return
    secret=$(tr '\0' '\n' </proc/"$(pid_of "$d" 0)"/environ | sed -n 's/^STRATA_SECRET=//p')
    [[ -n $secret ]] || { fail "rank 0 has no STRATA_SECRET"; return; }
    [[ $secret != "$outer" ]] || fail "strata-run passed the outer STRATA_SECRET on"
  else
    start_job "$d" 2 STRATA_LOG_LEVEL=trace STRATA_BOOTSTRAP_CONNECT_TIMEOUT=$HOLD_CT
    secret=$(cat "$STRATA_BOOTSTRAP_SECRET_FILE")
  fi
  touch "$d/release.0" "$d/go.all"
  wait_job 60
  expect_success "$d" 2
  local lines
  lines=$(cat "$d"/out/* "$d"/launcher.* | wc -l)
  note "trace output of the job ($lname, log.level=trace): $lines lines"
  [[ $lines -gt 50 ]] || fail "only $lines lines at trace level: is log.level=trace in effect?"
  local form leaks=0
  for form in "$secret" "${secret^^}" "${secret:0:16}" "${secret: -16}" ${outer:+"$outer"}; do
    if grep -rqiF -- "$form" "$d/out" "$d"/launcher.*; then
      fail "the secret (as '$form') appears in the output: $(grep -rhiF -- "$form" "$d/out" "$d"/launcher.* | head -n 1)"
      leaks=1
    fi
  done
  [[ $leaks -eq 0 ]] && note "the secret appears in none of the $lines lines"
}

# ---------------------------------------------------------------------------------------------

all=(sigstop-long sigstop-short rank0-kill-rendezvous rank0-late exit-clean exit-_exit impostor
  impostor-rendezvous launcher-kill)
if [[ $lname == strata-run ]]; then
  all+=(wrong-secret replay loris loris-fabric secret-file-mode secret-in-logs)
else
  all+=(wrong-secret loris secret-in-logs)
fi
cases=("$@")
[[ ${#cases[@]} -gt 0 ]] || cases=("${all[@]}")

if [[ $lname == srun ]]; then
  probe=$(bash "$here/../harness/run-srun.sh" 1 true 2>&1)
  if [[ $? -eq 77 ]]; then
    echo "$probe"
    exit 77
  fi
fi

failed=()
start=$SECONDS
for c in "${cases[@]}"; do
  fn=case_${c//-/_}
  if ! declare -F "$fn" >/dev/null; then
    echo "proc_faults: unknown case '$c'" >&2
    exit 2
  fi
  echo "=== case $c ($lname)"
  problem=""
  t0=$SECONDS
  $fn
  # Nothing of a case may outlive it: a rank still running now lingers (after wait_job).
  for f in "$work"/*/pid.* "$work"/*/*/pid.*; do
    [[ -r $f ]] || continue
    p=$(cat "$f" 2>/dev/null)
    if [[ $p =~ ^[0-9]+$ ]] && kill -0 "$p" 2>/dev/null && [[ $(ps -o stat= -p "$p") != Z* ]] &&
      [[ $(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null) == *"$bin"* ]]; then
      fail "$(basename "$(dirname "$f")") ${f##*/} ($p) still runs after the case"
      kill -CONT "$p" 2>/dev/null
      kill -9 "$p" 2>/dev/null
    fi
  done
  # The next case starts with a clean directory (a case may run twice).
  ncase=$((${ncase:-0} + 1))
  for f in "$work"/*; do
    [[ $f == "$work/kept" ]] && continue
    if [[ ${KEEP_WORK:-0} == 1 ]]; then
      mkdir -p "$work/kept/$ncase"
      mv "$f" "$work/kept/$ncase/"
    else
      rm -rf "$f"
    fi
  done
  if [[ -z $problem ]]; then
    echo "--- PASS $c ($((SECONDS - t0)) s)"
  else
    echo "--- FAIL $c ($((SECONDS - t0)) s):"
    printf '%s' "$problem"
    failed+=("$c")
  fi
done
echo "proc faults ($lname): $((${#cases[@]} - ${#failed[@]})) of ${#cases[@]} cases passed in $((SECONDS - start)) s"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "FAIL: ${failed[*]} (KEEP_WORK=1 keeps $work)"
  exit 1
fi
