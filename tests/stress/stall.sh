#!/usr/bin/env bash
# Stalled jobs (issue 16, item 4): one rank stopped with SIGSTOP during a Communicator allReduce,
# a bootstrap allGather or a PortChannel flush; one rank in broadcast while the others are in
# allReduce; `strata-info --job` on a healthy and on a stalled job; the issue's own strata-perf
# case. Every survivor's error must name the rank at fault FIRST (the first "rank K" of its
# message, and Error::peer()), within the configured timeout plus 2 s of the stop (the error path
# asks every peer for at most watch.query_timeout, 1 s). The ranks (tests/stress/stall.cpp) tell
# the script where they are through files; no pass/fail decision depends on a sleep.
#
# usage: stall.sh CASE STRATA_RUN STALL [STRATA_PERF] [STRATA_INFO]
#   CASE  allreduce-n4 allreduce-n16 allreduce-note-n4 allgather-n4 allgather-n16 flush-n4
#         flush-n16 mismatch missing missing-1m
#         info-healthy info-stalled perf-allreduce
# Exit status: 0 passed, 1 failed, 77 skipped (what the case needs is not here).
set -u

case_name=${1:?usage: stall.sh CASE STRATA_RUN STALL [STRATA_PERF] [STRATA_INFO]}
launcher=${2:?usage: stall.sh CASE STRATA_RUN STALL [STRATA_PERF] [STRATA_INFO]}
bin=${3:?usage: stall.sh CASE STRATA_RUN STALL [STRATA_PERF] [STRATA_INFO]}
perf=${4:-}
info=${5:-}
[[ -x $launcher && -x $bin ]] || { echo "stall: $launcher or $bin is not an executable" >&2; exit 2; }

export STRATA_BOOTSTRAP_TCP_INTERFACE=lo FI_TCP_IFACE=lo UCX_NET_DEVICES=lo
unset STRATA_SECRET STRATA_BOOTSTRAP_SECRET_FILE STRATA_ROOT
# The timeout of the stalled call; watch.query_timeout keeps its default (1 s).
T=3
export STRATA_TRANSPORT_TIMEOUT=$T
# Creation on a loaded machine (16 ranks on 2 cores) must not fail the case.
export STRATA_BOOTSTRAP_CONNECT_TIMEOUT=60
STOPPED=2  # the rank the cases stop

work=$(mktemp -d "${TMPDIR:-/tmp}/stall.XXXXXX")
bg_pids=()    # jobs and helpers we started
stopped=()    # ranks we stopped
# is_ours PID: PID still runs one of our programs (not a process that reused the pid).
is_ours() {
  local cmd
  cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline") || return 1
  [[ $cmd == *"$bin"* || ( -n $perf && $cmd == *"$perf"* ) ]]
}
cleanup() {
  local p f
  for p in "${stopped[@]}"; do is_ours "$p" && kill -CONT "$p" && kill -9 "$p"; done 2>/dev/null
  # Ranks whose pids they recorded (they may outlive a failing case), if still ours.
  for f in "$work"/pid.* "$work"/perf.pids; do
    [[ -r $f ]] || continue
    for p in $(cat "$f" 2>/dev/null); do
      [[ $p =~ ^[0-9]+$ ]] && is_ours "$p" && kill -CONT "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null
    done
  done
  for p in "${bg_pids[@]}"; do
    kill -9 "$p" 2>/dev/null && wait "$p" 2>/dev/null
  done
  [[ ${KEEP_WORK:-0} == 1 ]] || rm -rf "$work"
}
trap cleanup EXIT

note() { echo "  $*"; }
problem=""
fail() { problem+="    - $*"$'\n'; }

# wait_files SECONDS NAME...: until every $work/NAME exists.
wait_files() {
  local secs=$1 end=$((SECONDS + $1)) f
  shift
  for f in "$@"; do
    until [[ -e $work/$f ]]; do
      if ((SECONDS >= end)); then
        fail "$f did not appear within $secs s"
        return 1
      fi
      if [[ -n ${job_pid:-} ]] && ! kill -0 "$job_pid" 2>/dev/null; then
        fail "the job ended before $f appeared: $(tail -n 5 "$work"/launcher.err "$work"/out/rank-*.out 2>/dev/null | tr '\n' ' ')"
        return 1
      fi
      sleep 0.02
    done
  done
}

ranks_from() { local s=$1 n=$2 r out=(); for ((r = 0; r < n; r++)); do out+=("$s$r"); done; echo "${out[@]}"; }

# start_job N MODE COUNT [VAR=VALUE...]: N ranks of stall under strata-run; job_pid.
start_job() {
  local n=$1 mode=$2 count=$3
  shift 3
  mkdir -p "$work/out"
  (exec env "$@" "$launcher" -n "$n" --grace 60 --output-dir "$work/out" "$bin" "$work" "$mode" \
    "$count" 2>"$work/launcher.err") &
  job_pid=$!
  bg_pids+=("$job_pid")
}

# end_job: kills what is left of the job (the stopped rank first) and waits for the launcher.
end_job() {
  local p
  for p in "${stopped[@]}"; do is_ours "$p" && kill -CONT "$p" && kill -9 "$p"; done 2>/dev/null
  stopped=()
  touch "$work/end"
  local end=$((SECONDS + 30))
  while kill -0 "$job_pid" 2>/dev/null && ((SECONDS < end)); do sleep 0.05; done
  if kill -0 "$job_pid" 2>/dev/null; then
    for f in "$work"/pid.*; do is_ours "$(cat "$f")" && kill -9 "$(cat "$f")" 2>/dev/null; done
    kill -9 "$job_pid" 2>/dev/null
  fi
  wait "$job_pid" 2>/dev/null
}

result_line() { grep -h "RESULT" "$work/out/rank-$1.out" 2>/dev/null | head -n 1; }

# stop_rank R: SIGSTOP rank R; t_stop is the wall-clock time just before the signal.
stop_rank() {
  local p
  p=$(cat "$work/pid.$1")
  t_stop=$EPOCHREALTIME
  kill -STOP "$p"
  stopped+=("$p")
  echo "$t_stop" >"$work/stop.time"
}

# wait_results SECONDS R...: until every rank R printed its RESULT line or exited.
wait_results() {
  local end=$((SECONDS + $1)) r p
  shift
  for r in "$@"; do
    p=$(cat "$work/pid.$r")
    until [[ -n $(result_line "$r") ]] || ! kill -0 "$p" 2>/dev/null; do
      if ((SECONDS >= end)); then
        fail "rank $r reported nothing within $1 s of the stop (hang)"
        break
      fi
      sleep 0.05
    done
  done
}

# children_of PID [NAME]: the pids of PID's children (named NAME), from /proc.
children_of() {
  local f line rest comm fields
  for f in /proc/[0-9]*/stat; do
    { read -r line <"$f"; } 2>/dev/null || continue
    rest=${line##*) }
    read -ra fields <<<"$rest"
    [[ ${fields[1]} == "$1" ]] || continue
    comm=${line#*(}
    comm=${comm%)*}
    [[ -z ${2:-} || $comm == "$2" ]] && echo "${line%% *}"
  done
}

# first_rank TEXT: the first "rank K" in TEXT ("ranks 0-2" does not count).
first_rank() { grep -oE '(^|[^a-z])rank [0-9]+' <<<"$1" | head -n 1 | grep -oE '[0-9]+$'; }

# check_named CULPRIT BOUND R...: every rank R failed with a message whose first rank is CULPRIT,
# peer() CULPRIT, within BOUND s of the stop (BOUND < 0: no time check).
check_named() {
  local culprit=$1 bound=$2 r line msg code peer at first late
  shift 2
  for r in "$@"; do
    line=$(result_line "$r")
    if [[ $line != *"RESULT FAILED"* ]]; then
      fail "rank $r did not fail: ${line:-$(tail -n 3 "$work/out/rank-$r.out" "$work/out/rank-$r.err" 2>/dev/null | tr '\n' ' ')}"
      continue
    fi
    msg=${line#*msg: }
    code=$(sed -n 's/.* code=\([A-Za-z]*\) .*/\1/p' <<<"$line")
    peer=$(sed -n 's/.* peer=\(-\?[0-9]*\) .*/\1/p' <<<"$line")
    at=$(sed -n 's/.* at=\([0-9.]*\) .*/\1/p' <<<"$line")
    first=$(first_rank "$msg")
    late=""
    [[ $bound -ge 0 ]] && late=$(awk -v a="$at" -v s="$t_stop" 'BEGIN { printf "%.1f", a - s }')
    note "rank $r: code=$code peer=$peer${late:+ after ${late} s}: ${msg:0:600}"
    [[ $first == "$culprit" ]] || fail "rank $r's message names rank ${first:-none} first, not rank $culprit"
    # The rank at fault itself (a mismatched call) keeps the peer whose data showed it.
    [[ $peer == "$culprit" || $r == "$culprit" ]] || fail "rank $r's Error::peer() is $peer, not $culprit"
    if [[ $bound -ge 0 ]]; then
      awk -v l="$late" -v b="$bound" 'BEGIN { exit !(l <= b) }' ||
        fail "rank $r's error came $late s after the stop (bound: timeout + 2 = $bound s)"
    fi
  done
}

survivors() { local n=$1 r out=(); for ((r = 0; r < n; r++)); do ((r == STOPPED)) || out+=("$r"); done; echo "${out[@]}"; }

# Cases 1-3: SIGSTOP of rank 2 during MODE; every survivor names it first within T + 2 s.
sigstop() {
  local n=$1 mode=$2 count=$3
  shift 3
  start_job "$n" "$mode" "$count" "$@"
  wait_files 90 $(ranks_from at. "$n") || return
  stop_rank $STOPPED
  wait_results $((T + 30)) $(survivors "$n")
  check_named $STOPPED $((T + 2)) $(survivors "$n")
  # The wait-for graph: the survivors' waits lead to rank 2 ("ranks 0, 1, 3 waited for it").
  local r
  for r in $(survivors "$n"); do
    [[ $(result_line "$r") == *"rank $STOPPED on host "*"; ranks "*" waited for it. This rank"* ]] ||
      fail "rank $r's message does not say which ranks waited for rank $STOPPED"
  done
  end_job
}

case_allreduce_n4() { sigstop 4 allreduce 1024; }
case_allreduce_n16() { sigstop 16 allreduce 256; }
# Rank 3 is held in its own code before its 2nd allReduce; ranks 0-2 enter theirs (waiting for
# rank 3), and rank 2 is stopped once strata-info shows it waiting there with its part sent.
# Ranks 0 and 1 time out (naming rank 2 first, then rank 3 as in no call) and exit; then rank 3
# is let go: its 2nd allReduce completes with the parts already delivered, and its 3rd finds
# ranks 0 and 1 gone (PeerLost): it must name the same rank first, from a failure note, at once.
# (Stopped before it had sent its part, rank 2 is what rank 3's 2nd allReduce waits for: rank 3
# then names it after its own timeout, not through a note.) transport.timeout is 6 s here, so
# that ranks 0-2 do not time out waiting for rank 3 before the script has stopped rank 2.
# collectives.revoke_on_error is off: with it, ranks 0 and 1 revoke when they time out and rank 3
# hears the same culprit from the revoke at once (docs/fault-tolerance.md, tests/ft); this case
# is about the note, which is what a rank reads when nobody revoked.
case_allreduce_note_n4() {
  need_info
  local t6=6
  start_job 4 allreduce 1024 STALL_HOLD=3 STRATA_TRANSPORT_TIMEOUT=$t6 \
    STRATA_COLLECTIVES_REVOKE_ON_ERROR=false
  wait_files 90 $(ranks_from at. 4) || return
  touch "$work/go.all"
  local out="" p0 end=$((SECONDS + 20))
  p0=$(cat "$work/pid.0")
  until grep -qE "^rank +2 .*allReduce #2 .*waiting for rank 3 .*0 pieces to it not yet sent" <<<"$out"; do
    ((SECONDS < end)) || { fail "rank 2 was never seen waiting for rank 3 in allReduce #2: $out"; return; }
    out=$(timeout -k 2 10 "$info" --job --pid "$p0" 2>&1)
  done
  stop_rank $STOPPED
  wait_results $((t6 + 30)) 0 1
  # Two ranks are at fault for ranks 0 and 1: rank 2 (stopped) and rank 3 (in its own code, the
  # rank they wait for). The analysis puts a rank that does not answer first (rank 2); what this
  # case checks is that rank 3 names first the same rank as the note it reads.
  local named
  named=$(first_rank "$(result_line 0 | sed 's/.*msg: //')")
  [[ $named == 2 || $named == 3 ]] || fail "rank 0 names rank ${named:-none} first, not rank 2 or 3"
  check_named "${named:-2}" $((t6 + 2)) 0 1
  local r p
  end=$((SECONDS + 30))
  for r in 0 1; do
    p=$(cat "$work/pid.$r")
    while kill -0 "$p" 2>/dev/null && [[ $(ps -o stat= -p "$p" 2>/dev/null) != Z* ]]; do
      ((SECONDS < end)) || { fail "rank $r did not exit after its error"; break; }
      sleep 0.05
    done
  done
  t_stop=$EPOCHREALTIME  # rank 3's bound runs from its release
  touch "$work/go.3"
  wait_results 30 3
  check_named "${named:-2}" $((t6 + 2)) 3
  [[ $(result_line 3) == *"code=PeerLost"*"(found by rank "[01]" before it failed and exited)"* ]] ||
    fail "rank 3 did not name rank ${named:-2} through a failure note (PeerLost ... found by rank 0 or 1)"
  end_job
}

# The bootstrap's own timeout bounds each collective.
case_allgather_n4() { sigstop 4 allgather 64 STRATA_BOOTSTRAP_TIMEOUT=$T; }
case_allgather_n16() { sigstop 16 allgather 64 STRATA_BOOTSTRAP_TIMEOUT=$T; }
# The fabric transport (tcp provider on lo): a write completes only with the peer's progress, so
# a flush to a stopped peer blocks until the proxy's flush timeout (transport.timeout).
case_flush_n16() {
  sigstop 16 flush 65536 STRATA_TRANSPORT_INTRA_NODE=fabric "STRATA_TRANSPORT_FABRIC_PROVIDER=tcp;ofi_rxm"
}
case_flush_n4() {
  sigstop 4 flush 262144 STRATA_TRANSPORT_INTRA_NODE=fabric "STRATA_TRANSPORT_FABRIC_PROVIDER=tcp;ofi_rxm"
}

# Case 4: rank 3 calls broadcast while the others call allReduce (#3 for all): every rank,
# the odd one too, names rank 3 first, as "rank 3 ... is in broadcast #3 while ranks 0-2 are in
# allReduce #3".
case_mismatch() {
  start_job 4 mismatch 1024 STALL_ODD=3
  wait_files 90 $(ranks_from at. 4) || return
  t_stop=$EPOCHREALTIME
  wait_results $((T + 30)) 0 1 2 3
  check_named 3 -1 0 1 2 3
  local r line
  for r in 0 1 2 3; do
    line=$(result_line "$r")
    # "ranks 0-2" (a rank still on its way into allReduce #3 when rank 3 asked would be left
    # out of that list, and named as in no call).
    [[ $line =~ rank\ 3(\ \(this\ rank\))?\ on\ host\ [^\ ]+\ \(pid\ [0-9]+\)\ is\ in\ broadcast\ \#3\ while\ ranks\ [0-2][-,\ 0-2]*\ are\ in\ allReduce\ \#3 ]] ||
      fail "rank $r's message does not say 'rank 3 ... is in broadcast #3 while ranks 0-2 are in allReduce #3'"
    [[ $line == *"while ranks 0-2 are in allReduce #3"* ]] ||
      note "(rank $r: not every other rank was in allReduce #3 yet when rank 3 asked)"
  done
  end_job
}

# Case 4b: rank 3 waits in a bootstrap barrier while the others call allReduce (#1): every one
# of them names rank 3 first, "... is in bootstrap barrier #K while ranks 0-2 are in allReduce
# #1", within transport.timeout + 2 s, even when another rank gave up first and went on into the
# barrier (it must not be taken for a rank in another call).
# Two sizes: one piece per peer through the slots, and 1 MiB by single copy (the ranks' timeouts
# then fire further apart: collectives-failures-n3 missing_rank failed so before the watch kept
# failed calls, 2 of 2 runs).
case_missing() { missing 1024; }
case_missing_1m() { missing 262144; }
missing() {
  start_job 4 missing "$1" STALL_ODD=3
  wait_files 90 $(ranks_from at. 4) || return
  t_stop=$EPOCHREALTIME
  wait_results $((T + 30)) 0 1 2 3
  check_named 3 $((T + 2)) 0 1 2
  local r line
  for r in 0 1 2; do
    line=$(result_line "$r")
    [[ $line =~ rank\ 3\ on\ host\ [^\ ]+\ \(pid\ [0-9]+\)\ is\ in\ bootstrap\ barrier\ \#[0-9]+\ while\ ranks\ 0-2\ are\ in\ allReduce\ \#1 ]] ||
      fail "rank $r's message does not say 'rank 3 ... is in bootstrap barrier #K while ranks 0-2 are in allReduce #1'"
  done
  [[ $(result_line 3) == *"RESULT ok"* ]] || fail "rank 3's barrier did not complete: $(result_line 3)"
  end_job
}

need_info() {
  [[ -n $info && -x $info ]] || { echo "SKIP: no strata-info given"; exit 77; }
}

# Case 5a: strata-info --job on a healthy job whose ranks wait in their own code.
case_info_healthy() {
  need_info
  start_job 4 idle 1024
  wait_files 90 $(ranks_from idle. 4) || return
  local out p0 root r
  p0=$(cat "$work/pid.0")
  out=$(timeout -k 2 30 "$info" --job --pid "$p0" 2>&1)
  note "strata-info --job --pid $p0 (exit $?):"
  sed 's/^/    /' <<<"$out"
  for r in 0 1 2 3; do
    grep -qE "^rank +$r .*pid $(cat "$work/pid.$r")  not in any call" <<<"$out" ||
      fail "rank $r is not listed as 'not in any call'"
  done
  grep -q "^verdict: every rank answered; none is in a strata call" <<<"$out" ||
    fail "no verdict 'every rank answered; none is in a strata call'"
  # Under the job's launcher environment (its STRATA_ROOT), without --pid.
  root=$(tr '\0' '\n' <"/proc/$p0/environ" | sed -n 's/^STRATA_ROOT=//p')
  out=$(STRATA_ROOT=$root timeout -k 2 30 "$info" --job 2>&1)
  note "STRATA_ROOT=$root strata-info --job (exit $?): $(grep -c '^rank ' <<<"$out") rank lines"
  [[ $(grep -c '^rank ' <<<"$out") -eq 4 ]] || fail "strata-info --job under STRATA_ROOT did not list 4 ranks: $out"
  # From anywhere, through a rank's status address, with the job secret (from a rank's
  # environment, as strata-run gave it); a wrong secret and none are refused.
  local secret addr rc
  secret=$(tr '\0' '\n' <"/proc/$p0/environ" | sed -n 's/^STRATA_SECRET=//p')
  addr=$(timeout -k 2 30 "$info" --job --pid "$p0" 2>&1 | grep -oE '\[status [^]]+\]' | sed -n '2s/\[status \(.*\)\]/\1/p')
  out=$(env -u STRATA_ROOT STRATA_SECRET="$secret" timeout -k 2 30 "$info" --job --address "$addr" 2>&1)
  note "strata-info --job --address $addr (exit $?): $(grep -c '^rank ' <<<"$out") rank lines"
  [[ $(grep -c '^rank ' <<<"$out") -eq 4 ]] || fail "strata-info --job --address did not list 4 ranks: $out"
  out=$(env -u STRATA_ROOT STRATA_SECRET=wrong timeout -k 2 30 "$info" --job --address "$addr" 2>&1)
  rc=$?
  note "with a wrong secret (exit $rc): $out"
  [[ $rc -ne 0 && $out == *AuthFailed* ]] || fail "a wrong secret was not refused with AuthFailed: $out"
  out=$(env -u STRATA_ROOT -u STRATA_SECRET timeout -k 2 30 "$info" --job --address "$addr" 2>&1)
  rc=$?
  [[ $rc -ne 0 && $out == *"needs the job secret"* ]] || fail "no secret: $out"
  touch "$work/go"
  local end=$((SECONDS + 60))
  while kill -0 "$job_pid" 2>/dev/null && ((SECONDS < end)); do sleep 0.05; done
  for r in 0 1 2 3; do
    [[ $(result_line $r) == *"RESULT ok"* ]] || fail "rank $r did not finish: $(result_line $r)"
  done
  end_job
}

# Case 5b: strata-info --job on a stalled job: rank 2 stopped in an allReduce loop while
# transport.timeout is long (nothing fails while we ask).
case_info_stalled() {
  need_info
  start_job 4 allreduce 1024 STRATA_TRANSPORT_TIMEOUT=120
  wait_files 90 $(ranks_from at. 4) || return
  stop_rank $STOPPED
  local out p0 r
  p0=$(cat "$work/pid.0")
  # The survivors block in an allReduce as soon as they need rank 2: ask until every one of
  # them is seen waiting (the first answer may come before the last of them got there).
  local end=$((SECONDS + 30)) waiting
  while :; do
    out=$(timeout -k 2 30 "$info" --job --pid "$p0" 2>&1)
    waiting=$(grep -cE '^rank +[0-9]+ .*allReduce #[0-9]+ for [0-9.]+ s, waiting for rank' <<<"$out")
    ((waiting >= 1)) && grep -q "NOT ANSWERING" <<<"$out" && break
    ((SECONDS < end)) || break
    sleep 0.2
  done
  note "strata-info --job --pid $p0:"
  sed 's/^/    /' <<<"$out"
  grep -qE "^rank +$STOPPED .*NOT ANSWERING" <<<"$out" || fail "rank $STOPPED is not shown NOT ANSWERING"
  for r in $(survivors 4); do
    grep -qE "^rank +$r .*communicator [0-9]+ allReduce #[0-9]+ for [0-9.]+ s" <<<"$out" ||
      fail "rank $r is not shown in an allReduce"
  done
  ((waiting >= 1)) || fail "no rank is shown waiting for another"
  grep -qE "^verdict: rank $STOPPED on host .* made no progress: it is not answering" <<<"$out" ||
    fail "the verdict does not name rank $STOPPED first as not answering"
  for r in $(survivors 4); do
    [[ -z $(result_line "$r") ]] || fail "rank $r failed while it was asked: $(result_line "$r")"
  done
  end_job
}

# Case 6, the issue's own: 4 ranks of strata-perf allreduce -b 1M -n 100000 under strata-run
# --tag-output with transport.timeout = 5, rank 2 stopped once the run is going: the three
# survivors name rank 2 first, within 7 s of the stop.
case_perf_allreduce() {
  [[ -n $perf && -x $perf ]] || { echo "SKIP: no strata-perf given"; exit 77; }
  local pt=5
  mkdir -p "$work"
  # Each line with the wall-clock time it arrived.
  ( env STRATA_TRANSPORT_TIMEOUT=$pt "$launcher" -n 4 --grace 60 --tag-output \
      "$perf" allreduce -b 1M -n 100000 2>&1 |
    while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done >"$work/perf.log" ) &
  local sub=$!
  bg_pids+=("$sub")
  local end=$((SECONDS + 90)) lpid=""
  # strata-run's pid: the parent of the ranks; the ranks are its children with STRATA_RANK.
  # Rank 0 prints the column header after the set-up: then every rank is in the allReduces.
  until grep -qE '^[0-9.]+ \[0\] # +size +count +type' "$work/perf.log" 2>/dev/null; do
    if ((SECONDS >= end)); then fail "strata-perf printed no header within 90 s"; return; fi
    sleep 0.05
  done
  lpid=$(children_of "$sub" strata-run | head -n 1)
  [[ -n $lpid ]] || { fail "no strata-run under the job's shell $sub"; return; }
  local c p2="" pids=()
  for c in $(children_of "$lpid"); do
    pids+=("$c")
    tr '\0' '\n' <"/proc/$c/environ" 2>/dev/null | grep -qx "STRATA_RANK=$STOPPED" && p2=$c
  done
  echo "${pids[*]}" >"$work/perf.pids"
  [[ -n $p2 ]] || { fail "no rank $STOPPED among strata-run's children (${pids[*]})"; return; }
  t_stop=$EPOCHREALTIME
  kill -STOP "$p2"
  stopped+=("$p2")
  note "ranks ${pids[*]}; stopped rank $STOPPED (pid $p2)"
  local r
  end=$((SECONDS + pt + 30))
  for r in $(survivors 4); do
    until grep -qE "^[0-9.]+ \[$r\] strata-perf: .*error" "$work/perf.log"; do
      if ((SECONDS >= end)); then fail "rank $r reported no error within $((pt + 30)) s"; break; fi
      sleep 0.05
    done
  done
  local line at msg first peer late
  for r in $(survivors 4); do
    line=$(grep -E "^[0-9.]+ \[$r\] strata-perf: .*error" "$work/perf.log" | head -n 1)
    [[ -n $line ]] || continue
    at=${line%% *}
    msg=${line#*error }
    peer=$(sed -n 's/^[A-Za-z]* (peer rank \([0-9]*\)): .*/\1/p' <<<"$msg")
    msg=${msg#*: }
    first=$(first_rank "$msg")
    late=$(awk -v a="$at" -v s="$t_stop" 'BEGIN { printf "%.1f", a - s }')
    note "rank $r after $late s: ${line#* }"
    [[ $first == "$STOPPED" ]] || fail "rank $r names rank ${first:-none} first, not rank $STOPPED"
    [[ $peer == "$STOPPED" ]] || fail "rank $r's peer is ${peer:-none}, not $STOPPED"
    awk -v l="$late" -v b="$((pt + 2))" 'BEGIN { exit !(l <= b) }' ||
      fail "rank $r's error came $late s after the stop (bound $((pt + 2)) s)"
  done
  kill -CONT "$p2" 2>/dev/null
  kill -9 "$p2" 2>/dev/null
  stopped=()
  wait "$sub" 2>/dev/null
}

fn=case_${case_name//-/_}
declare -F "$fn" >/dev/null || { echo "stall: unknown case '$case_name'" >&2; exit 2; }
echo "=== case $case_name"
t0=$SECONDS
$fn
if [[ -z $problem ]]; then
  echo "--- PASS $case_name ($((SECONDS - t0)) s)"
  exit 0
fi
echo "--- FAIL $case_name ($((SECONDS - t0)) s):"
printf '%s' "$problem"
[[ ${KEEP_WORK:-0} == 1 ]] && echo "(work kept in $work)"
exit 1
