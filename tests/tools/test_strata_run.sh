#!/usr/bin/env bash
# Tests of strata-run, the local launcher. Usage: test_strata_run.sh STRATA_RUN CASE
# Each CASE is registered as its own meson test (tests/tools/meson.build). Exit 0: pass,
# 1: fail, 77: cannot run here (reason printed).
set -u

RUN=${1:?usage: test_strata_run.sh STRATA_RUN CASE}
CASE=${2:?usage: test_strata_run.sh STRATA_RUN CASE}
RUN=$(realpath "$RUN")

WORK=$(mktemp -d "${TMPDIR:-/tmp}/strata-run-test.XXXXXX")
BG_PID=""
cleanup() {
  # Only what this test started: a strata-run left in the background, and its ranks' groups
  # (their pids were recorded by the ranks themselves).
  if [[ -n $BG_PID ]] && kill -0 "$BG_PID" 2>/dev/null; then kill -KILL "$BG_PID" 2>/dev/null; fi
  for f in "$WORK"/pid-*; do
    [[ -e $f ]] || continue
    local p
    p=$(cat "$f")
    [[ -n $p ]] && kill -KILL -- "-$p" "$p" 2>/dev/null
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

fail() {
  echo "FAIL [$CASE]: $*" >&2
  for f in "$WORK"/stdout "$WORK"/stderr; do
    [[ -e $f ]] && { echo "--- $f" >&2; head -c 4000 "$f" >&2; }
  done
  exit 1
}
need() { command -v "$1" >/dev/null || { echo "SKIP: $1 is not installed" >&2; exit 77; }; }

# Runs strata-run with the given arguments; sets RC, output in $WORK/stdout and $WORK/stderr.
run() {
  "$RUN" "$@" >"$WORK/stdout" 2>"$WORK/stderr"
  RC=$?
}
expect_rc() { [[ $RC == "$1" ]] || fail "expected exit status $1, got $RC"; }
expect_in() { grep -qE -- "$2" "$1" || fail "expected /$2/ in $(basename "$1")"; }

# Waits until the given files exist (up to 20 s).
wait_files() {
  local deadline=$((SECONDS + 20)) f
  for f in "$@"; do
    while [[ ! -e $f ]]; do
      ((SECONDS < deadline)) || fail "timed out waiting for $f"
      sleep 0.05
    done
  done
}
# True when no process with this pid exists (a zombie counts as gone).
gone() {
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null) || return 0
  [[ $state == Z* ]]
}
expect_gone_within() {  # SECONDS PID...
  local deadline=$((SECONDS + $1)) p
  shift
  for p in "$@"; do
    until gone "$p"; do
      ((SECONDS < deadline)) || fail "process $p still running"
      sleep 0.05
    done
  done
}

case $CASE in

env)
  # Every rank reports its contract; rank 0 also checks that STRATA_ROOT_FD is a listening
  # socket on the root port, the others that they hold no socket, and everybody that
  # strata-run itself no longer holds one.
  need python3
  cat >"$WORK/rank.py" <<'EOF'
import os, re, socket, sys
env = os.environ
r = env["STRATA_RANK"]
def sockets(pid):
    base = f"/proc/{pid}/fd"
    out = []
    for fd in os.listdir(base):
        try:
            if os.readlink(f"{base}/{fd}").startswith("socket:"):
                out.append(int(fd))
        except OSError:
            pass
    return out
fd = env.get("STRATA_ROOT_FD", "")
info = "none"
listener = None
if fd:
    listener = socket.socket(fileno=int(fd))
    listening = listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    host, port = listener.getsockname()[:2]
    info = f"fd={fd},listening={listening},{host}:{port}"
# Every rank connects to STRATA_ROOT; rank 0 accepts all of them on the inherited listener
# (and stays alive until then, so that the listener exists when the others connect).
host, port = env["STRATA_ROOT"].rsplit(":", 1)
c = socket.create_connection((host, int(port)), timeout=10)
c.sendall(r.encode() + b"\n")
if listener:
    listener.settimeout(20)
    got = set()
    for _ in range(int(env["STRATA_SIZE"])):
        a, _ = listener.accept()
        got.add(a.makefile().readline().strip())
        a.close()
    info += ",accepted=" + "+".join(sorted(got))
    listener.detach()
else:
    c.settimeout(20)
    c.recv(1)  # returns once rank 0 closes the connection after reading it
c.close()
# One write() per line: the ranks share strata-run's stdout.
os.write(1, (" ".join([r, env["STRATA_SIZE"], env["STRATA_LOCAL_RANK"], env["STRATA_LOCAL_SIZE"],
                       env["STRATA_ROOT"], env["STRATA_SECRET"], info,
                       "sockets=" + ",".join(map(str, sorted(sockets("self")))),
                       "parent_sockets=" + ",".join(map(str, sockets(os.getppid()))),
                       "extra=" + env.get("EXTRA", "-")]) + "\n").encode())
EOF
  # Values a previous launcher left behind must be replaced.
  STRATA_RANK=9 STRATA_SIZE=99 STRATA_ROOT_FD=5 STRATA_SECRET=old \
    run -n 3 --env EXTRA=yes python3 "$WORK/rank.py"
  expect_rc 0
  [[ -s $WORK/stderr ]] && fail "strata-run printed on success"
  python3 - "$WORK/stdout" <<'EOF' || exit 1
import re, sys
lines = sorted(open(sys.argv[1]).read().split("\n")[:-1])
def fail(msg):
    print("FAIL [env]: " + msg + "\n" + "\n".join(lines), file=sys.stderr)
    sys.exit(1)
if len(lines) != 3:
    fail("expected 3 lines")
roots, secrets = set(), set()
for i, line in enumerate(lines):
    rank, size, lrank, lsize, root, secret, info, socks, psocks, extra = line.split(" ")
    if (rank, size, lrank, lsize) != (str(i), "3", str(i), "3"):
        fail(f"bad rank/size fields in line {i}")
    if not re.fullmatch(r"127\.0\.0\.1:[1-9][0-9]*", root):
        fail("bad STRATA_ROOT " + root)
    if not re.fullmatch(r"[0-9a-f]{64}", secret):
        fail("STRATA_SECRET is not 64 hex characters")
    if extra != "extra=yes":
        fail("--env EXTRA=yes not seen")
    if psocks != "parent_sockets=":
        fail("strata-run still holds a socket")
    roots.add(root)
    secrets.add(secret)
    if i == 0:
        port = root.split(":")[1]
        fd = info.split(",")[0].removeprefix("fd=")
        if info != f"fd={fd},listening=1,127.0.0.1:{port},accepted=0+1+2":
            fail("rank 0's STRATA_ROOT_FD is not a listener on the root port: " + info)
        if socks != "sockets=" + fd:
            fail("rank 0 should hold exactly one socket, the listener: " + socks)
    else:
        if info != "none":
            fail(f"rank {i} got STRATA_ROOT_FD")
        if socks != "sockets=":
            fail(f"rank {i} inherited a socket: {socks}")
if len(roots) != 1 or len(secrets) != 1:
    fail("ranks disagree on STRATA_ROOT or STRATA_SECRET")
EOF
  # A fresh secret per run.
  run -n 1 sh -c 'echo $STRATA_SECRET'
  s1=$(cat "$WORK/stdout")
  run -n 1 sh -c 'echo $STRATA_SECRET'
  [[ $s1 != "$(cat "$WORK/stdout")" ]] || fail "two runs got the same secret"
  # An explicit root port is used as given.
  # (The port stays held until strata-run binds it: tests/harness/hold-port.sh.)
  # shellcheck source=../harness/hold-port.sh
  . "$(dirname "${BASH_SOURCE[0]}")/../harness/hold-port.sh"
  hold_port
  port=$HOLD_PORT
  run -n 2 --root-port "$port" sh -c 'echo $STRATA_ROOT'
  release_port
  expect_rc 0
  [[ $(sort -u "$WORK/stdout") == "127.0.0.1:$port" ]] || fail "--root-port $port not used"
  ;;

success)
  run -n 4 true
  expect_rc 0
  [[ -s $WORK/stdout || -s $WORK/stderr ]] && fail "strata-run printed on success"
  # PROGRAM's own options pass through untouched, also after "--".
  run -n 2 sh -c 'printf "%s\n" "$*"' sh -n 5 --tag-output
  expect_rc 0
  [[ $(sort -u "$WORK/stdout") == "-n 5 --tag-output" ]] || fail "PROGRAM's arguments were changed"
  run -n 1 -- printf "%s\n" --version
  [[ $(cat "$WORK/stdout") == "--version" ]] || fail "'--' not handled"
  # Usage errors.
  run -n 0 true
  expect_rc 2
  run -n 4097 true
  expect_rc 2
  run true
  expect_rc 2
  run -n 2
  expect_rc 2
  expect_in "$WORK/stderr" "no PROGRAM"
  run --no-such-option -n 2 true
  expect_rc 2
  expect_in "$WORK/stderr" "unknown option"
  run --help
  expect_rc 0
  expect_in "$WORK/stdout" "PROGRAM"
  run --version
  expect_rc 0
  expect_in "$WORK/stdout" "^strata-run [0-9]"
  ;;

fail-status)
  # Rank 2 fails with status 3; the others finish normally within the grace period.
  run -n 4 sh -c '[ "$STRATA_RANK" = 2 ] && exit 3; sleep 0.2; exit 0'
  expect_rc 3
  expect_in "$WORK/stderr" "^strata-run: rank 2 \(pid [0-9]+\) exited with status 3$"
  [[ $(grep -c . "$WORK/stderr") == 1 ]] || fail "expected exactly one line on stderr"
  ;;

signal)
  # Rank 1 kills itself with SIGKILL: exit 128+9 and a line naming the signal.
  run -n 2 --grace 1 sh -c '[ "$STRATA_RANK" = 1 ] && kill -9 $$; exit 0'
  expect_rc 137
  expect_in "$WORK/stderr" "^strata-run: rank 1 \(pid [0-9]+\) killed by signal 9 \(SIGKILL\)$"
  ;;

keep-going)
  # --keep-going: rank 1 is killed, rank 0 runs on for 1.5 s (longer than --grace) and exits 0:
  # the job's status is 0 and the kill is reported as such.
  run -n 3 --keep-going --grace 0.5 sh -c \
    '[ "$STRATA_RANK" = 1 ] && kill -9 $$; sleep 1.5; echo "rank $STRATA_RANK done"; exit 0'
  expect_rc 0
  expect_in "$WORK/stderr" "rank 1 \(pid [0-9]+\) killed by signal 9 \(SIGKILL\); --keep-going"
  expect_in "$WORK/stdout" "^rank 0 done$"
  expect_in "$WORK/stdout" "^rank 2 done$"
  # A survivor that exits non-zero still fails the job; every rank killed: 137.
  run -n 2 --keep-going --grace 1 sh -c '[ "$STRATA_RANK" = 1 ] && kill -9 $$; exit 3'
  expect_rc 3
  run -n 2 --keep-going --grace 1 sh -c 'kill -9 $$'
  expect_rc 137
  ;;

grace)
  # Rank 0 fails; rank 1 sleeps 100 s in a child process (a grandchild of strata-run). Both
  # must be gone within the grace period plus a margin.
  start=$SECONDS
  run -n 2 --grace 1 sh -c \
    'if [ "$STRATA_RANK" = 0 ]; then sleep 0.5; exit 5; fi
     sleep 100 & echo $! > '"$WORK"'/sleeper; echo $$ > '"$WORK"'/pid-1; wait'
  expect_rc 5
  ((SECONDS - start <= 8)) || fail "took $((SECONDS - start)) s to end the job"
  expect_in "$WORK/stderr" "rank 0 \(pid [0-9]+\) exited with status 5"
  expect_gone_within 3 "$(cat "$WORK/sleeper")" "$(cat "$WORK/pid-1")"
  # A rank that ignores SIGTERM is killed after a second grace period.
  start=$SECONDS
  run -n 2 --grace 1 sh -c \
    'if [ "$STRATA_RANK" = 0 ]; then exit 4; fi
     trap "" TERM; echo $$ > '"$WORK"'/pid-1; sleep 100'
  expect_rc 4
  ((SECONDS - start <= 8)) || fail "took $((SECONDS - start)) s to end a rank ignoring SIGTERM"
  expect_in "$WORK/stderr" "SIGKILL"
  expect_gone_within 3 "$(cat "$WORK/pid-1")"
  ;;

tag-output)
  # Short lines, stderr lines and a partial last line.
  run -n 3 --tag-output sh -c \
    'echo "one $STRATA_RANK"; echo "err $STRATA_RANK" >&2; echo "two $STRATA_RANK"; printf "tail $STRATA_RANK"'
  expect_rc 0
  for r in 0 1 2; do
    [[ $(grep "^\[$r\] " "$WORK/stdout") == "[$r] one $r"$'\n'"[$r] two $r"$'\n'"[$r] tail $r" ]] ||
      fail "stdout of rank $r not tagged as expected"
    [[ $(grep "^\[$r\] " "$WORK/stderr") == "[$r] err $r" ]] || fail "stderr of rank $r not tagged"
  done
  [[ $(grep -c . "$WORK/stdout") == 9 && $(grep -c . "$WORK/stderr") == 3 ]] || fail "extra lines"
  # Long lines written in many small pieces by 4 ranks at once must come out whole.
  need python3
  cat >"$WORK/lines.py" <<'EOF'
import os, sys
r = os.environ["STRATA_RANK"]
for i in range(300):
    body = f"{r}:{i}:" + chr(ord("a") + int(r)) * (1 + (i * 977) % 9000)
    line = (body + "\n").encode()
    for k in range(0, len(line), 1000):  # several writes per line, so reads see partial lines
        os.write(1, line[k:k + 1000])
EOF
  run -n 4 --tag-output python3 "$WORK/lines.py"
  expect_rc 0
  python3 - "$WORK/stdout" <<'EOF' || fail "tagged lines were mixed"
import re, sys
seen = {r: 0 for r in "0123"}
for line in open(sys.argv[1]).read().split("\n")[:-1]:
    m = re.fullmatch(r"\[([0-3])\] ([0-3]):([0-9]+):([a-d]+)", line)
    assert m and m[1] == m[2], line[:80]
    r, i = m[1], int(m[3])
    assert i == seen[r], (r, i)
    assert m[4] == chr(ord("a") + int(r)) * (1 + (i * 977) % 9000), (r, i)
    seen[r] += 1
assert all(v == 300 for v in seen.values()), seen
EOF
  ;;

output-dir)
  run -n 3 --output-dir "$WORK/out/nested" sh -c \
    'echo "out $STRATA_RANK"; echo "err $STRATA_RANK" >&2'
  expect_rc 0
  [[ -s $WORK/stdout || -s $WORK/stderr ]] && fail "output leaked to strata-run's own streams"
  for r in 0 1 2; do
    [[ $(cat "$WORK/out/nested/rank-$r.out") == "out $r" ]] || fail "rank-$r.out"
    [[ $(cat "$WORK/out/nested/rank-$r.err") == "err $r" ]] || fail "rank-$r.err"
  done
  # Both modes at once make no sense.
  run -n 1 --tag-output --output-dir "$WORK/out" true
  expect_rc 2
  ;;

sigterm)
  # SIGTERM and SIGUSR1 sent to strata-run reach every rank and a child of every rank (each
  # rank has its own process group). Ranks handle USR1 and go on; on TERM they exit 0.
  cat >"$WORK/rank.sh" <<EOF
#!/usr/bin/env bash
r=\$STRATA_RANK
echo \$\$ > "$WORK/pid-\$r"
trap 'echo usr1 >> "$WORK/usr1-\$r"' USR1
trap 'echo term > "$WORK/term-\$r"; exit 0' TERM
bash -c 'trap "echo usr1 >> $WORK/child-usr1-\$0" USR1; trap "echo term > $WORK/child-term-\$0; exit 0" TERM; touch $WORK/child-ready-\$0; while :; do sleep 0.1; done' \$r &
touch "$WORK/ready-\$r"
while :; do sleep 0.1 & wait \$!; done
EOF
  chmod +x "$WORK/rank.sh"
  "$RUN" -n 3 "$WORK/rank.sh" >"$WORK/stdout" 2>"$WORK/stderr" &
  BG_PID=$!
  wait_files "$WORK"/ready-{0,1,2} "$WORK"/child-ready-{0,1,2}
  kill -USR1 "$BG_PID"
  wait_files "$WORK"/usr1-{0,1,2} "$WORK"/child-usr1-{0,1,2}
  kill -0 "$BG_PID" 2>/dev/null || fail "strata-run ended on SIGUSR1"
  kill -TERM "$BG_PID"
  wait "$BG_PID"
  RC=$?
  BG_PID=""
  expect_rc 0
  # The ranks' children run on after strata-run ends; give them a moment to write their file.
  wait_files "$WORK"/child-term-{0,1,2}
  for r in 0 1 2; do
    [[ -e $WORK/term-$r ]] || fail "rank $r did not get SIGTERM"
    [[ $(grep -c . "$WORK/usr1-$r") == 1 ]] || fail "rank $r got SIGUSR1 more than once"
  done
  # Ranks that do not handle SIGTERM die of it: exit 128+15, no complaint about it.
  "$RUN" -n 2 sh -c 'echo $$ > '"$WORK"'/plain-$STRATA_RANK; exec sleep 100' \
    >"$WORK/stdout" 2>"$WORK/stderr" &
  BG_PID=$!
  wait_files "$WORK"/plain-{0,1}
  kill -TERM "$BG_PID"
  wait "$BG_PID"
  RC=$?
  BG_PID=""
  expect_rc 143
  [[ -s $WORK/stderr ]] && fail "strata-run complained about ranks ended by the user's SIGTERM"
  expect_gone_within 3 "$(cat "$WORK/plain-0")" "$(cat "$WORK/plain-1")"
  ;;

exec-fail)
  run -n 3 "$WORK/no-such-program"
  expect_rc 127
  expect_in "$WORK/stderr" "cannot execute '.*no-such-program'"
  run -n 2 no-such-program-in-path-strata
  expect_rc 127
  expect_in "$WORK/stderr" "not found in PATH"
  touch "$WORK/not-executable"
  run -n 2 "$WORK/not-executable"
  expect_rc 127
  ;;

timeout)
  start=$SECONDS
  run -n 3 --timeout 1 --grace 1 sh -c \
    '[ "$STRATA_RANK" = 1 ] && exit 0; echo $$ > '"$WORK"'/pid-$STRATA_RANK; exec sleep 100'
  expect_rc 124
  ((SECONDS - start <= 8)) || fail "took $((SECONDS - start)) s"
  expect_in "$WORK/stderr" "timeout after 1 s; rank\(s\) still running: 0,2"
  expect_gone_within 3 "$(cat "$WORK/pid-0")" "$(cat "$WORK/pid-2")"
  ;;

bind-to)
  # Each rank prints its CPU list; --bind-to core gives rank r the r-th CPU of strata-run's set
  # (round-robin), the default leaves every rank with strata-run's whole set.
  need taskset
  mapfile -t allowed < <(taskset -cp $$ | sed 's/.*: //' | tr ',' '\n' | while IFS=- read -r a b; do
    seq "$a" "${b:-$a}"; done)
  ((${#allowed[@]} >= 1)) || fail "cannot read this shell's CPU list"
  n=$((${#allowed[@]} + 1))  # one more rank than CPUs: the last one wraps around
  show='echo "rank $STRATA_RANK cpus $(taskset -cp $$ | sed "s/.*: //")"'
  run -n "$n" --bind-to core sh -c "$show"
  expect_rc 0
  for ((r = 0; r < n; r++)); do
    expect_in "$WORK/stdout" "^rank $r cpus ${allowed[r % ${#allowed[@]}]}\$"
  done
  whole=$(taskset -cp $$ | sed 's/.*: //')
  run -n 2 sh -c "$show"
  expect_rc 0
  [[ $(grep -c "cpus $whole\$" "$WORK/stdout") == 2 ]] || fail "without --bind-to, ranks did not keep CPUs $whole"
  run -n 2 --bind-to socket true
  expect_rc 2
  expect_in "$WORK/stderr" "--bind-to: socket not in \{none,core\}"
  ;;

torch)
  # --torch: every rank gets torch.distributed's env:// variables; MASTER_PORT is one free port
  # for the whole job, not strata's root port. Inherited values are replaced; the flag may be
  # repeated.
  show='echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $STRATA_ROOT"'
  RANK=9 WORLD_SIZE=99 MASTER_PORT=5 run --torch -n 3 --tag-output sh -c "$show"
  expect_rc 0
  [[ -s $WORK/stderr ]] && fail "strata-run printed on success"
  [[ $(grep -c . "$WORK/stdout") == 3 ]] || fail "expected 3 lines"
  ports=()
  for r in 0 1 2; do
    line=$(grep "^\[$r\] " "$WORK/stdout") || fail "no line from rank $r"
    [[ $line =~ ^\[$r\]\ $r\ 3\ $r\ 3\ 127\.0\.0\.1\ ([0-9]+)\ 127\.0\.0\.1:([0-9]+)$ ]] ||
      fail "bad torch variables for rank $r: $line"
    port=${BASH_REMATCH[1]}
    ((port >= 1 && port <= 65535)) || fail "MASTER_PORT $port out of range"
    [[ $port != "${BASH_REMATCH[2]}" ]] || fail "MASTER_PORT is strata's root port $port"
    ports+=("$port")
  done
  [[ ${ports[0]} == "${ports[1]}" && ${ports[0]} == "${ports[2]}" ]] ||
    fail "ranks got different MASTER_PORTs: ${ports[*]}"
  # --verbose names the rendezvous; --torch twice is accepted.
  run --torch --torch -v -n 1 true
  expect_rc 0
  expect_in "$WORK/stderr" "^strata-run: --torch: MASTER_ADDR:MASTER_PORT 127\.0\.0\.1:[0-9]+$"
  # MASTER_ADDR is --root-host.
  run --torch --root-host ::1 -n 1 sh -c 'echo "$MASTER_ADDR"'
  if [[ $RC == 0 ]]; then
    [[ $(cat "$WORK/stdout") == "::1" ]] || fail "MASTER_ADDR is not --root-host ::1"
  else
    expect_in "$WORK/stderr" "::1"  # a host without IPv6 loopback
  fi
  # MASTER_PORT stays reserved while the job runs: a bind without SO_REUSEADDR (any other
  # process) fails, a bind and listen with it (what torch's TCPStore does in rank 0) works.
  need python3
  cat >"$WORK/hold.py" <<'EOF'
import errno, os, socket
port = int(os.environ["MASTER_PORT"])
plain = socket.socket()
try:
    plain.bind(("127.0.0.1", port))
    print("plain bind took the port")
except OSError as e:
    print("plain bind:", errno.errorcode[e.errno])
store = socket.socket()
store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
store.bind(("127.0.0.1", port))
store.listen(1)
print("reuse bind and listen: ok")
EOF
  run --torch -n 1 python3 "$WORK/hold.py"
  expect_rc 0
  [[ $(cat "$WORK/stdout") == $'plain bind: EADDRINUSE\nreuse bind and listen: ok' ]] ||
    fail "MASTER_PORT not reserved for torch: $(cat "$WORK/stdout")"
  ;;

torch-env)
  # --env values of the six variables win over the generated ones, and over inherited ones.
  MASTER_PORT=5 run --torch -n 2 --tag-output --env MASTER_PORT=1234 --env LOCAL_RANK=7 \
    sh -c 'echo "$RANK $WORLD_SIZE $LOCAL_RANK $MASTER_ADDR $MASTER_PORT"'
  expect_rc 0
  for r in 0 1; do
    [[ $(grep "^\[$r\] " "$WORK/stdout") == "[$r] $r 2 7 127.0.0.1 1234" ]] ||
      fail "--env values did not win for rank $r"
  done
  run --torch -v -n 1 --env MASTER_ADDR=127.0.0.1 --env MASTER_PORT=1234 true
  expect_rc 0
  expect_in "$WORK/stderr" "MASTER_ADDR:MASTER_PORT 127\.0\.0\.1:1234 \(with --env values\)"
  ;;

no-torch)
  # Without --torch none of the variables is set, and inherited ones pass through unchanged.
  unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
  run -n 2 sh -c 'echo "${RANK-unset} ${WORLD_SIZE-unset} ${MASTER_ADDR-unset} ${MASTER_PORT-unset}"'
  expect_rc 0
  [[ $(sort -u "$WORK/stdout") == "unset unset unset unset" ]] || fail "torch variables set without --torch"
  RANK=5 run -n 2 sh -c 'echo "$RANK"'
  expect_rc 0
  [[ $(sort -u "$WORK/stdout") == "5" ]] || fail "inherited RANK changed without --torch"
  ;;

*)
  echo "unknown case '$CASE'" >&2
  exit 2
  ;;
esac
echo "PASS [$CASE]"
