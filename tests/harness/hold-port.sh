# shellcheck shell=bash
# Sourced by test scripts: a free TCP port on 127.0.0.1 that nobody else can take while a test
# hands it to a program which binds it later.
#
#   hold_port         sets HOLD_PORT; the port stays bound (SO_REUSEADDR, not listening) by a
#                     helper process until release_port
#   release_port      ends the helper (by its PID)
#
# Binding port 0, reading the number and closing the socket leaves a window in which another
# process of a parallel test run (or an outgoing connection's ephemeral port) takes it. While the
# helper holds the port, Linux gives it to no other bind and no ephemeral port, yet a listener that
# sets SO_REUSEADDR itself (strata's: lib/net listenOn, strata-run's root socket) can still bind
# and listen on it. The helper also exits when its stdin closes (this shell gone).

hold_port() {
  coproc HOLD_PORT_PROC {
    exec /usr/bin/python3 -c '
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1], flush=True)
sys.stdin.read()
'
  }
  HOLD_PORT=
  read -r -t 10 HOLD_PORT <&"${HOLD_PORT_PROC[0]}" || true
  [[ $HOLD_PORT =~ ^[0-9]+$ ]] || { echo "hold_port: the helper gave no port" >&2; return 1; }
}

release_port() {
  [[ -n ${HOLD_PORT_PROC_PID:-} ]] || return 0
  kill "$HOLD_PORT_PROC_PID" 2>/dev/null || true
  wait "$HOLD_PORT_PROC_PID" 2>/dev/null || true
  HOLD_PORT_PROC_PID=
  return 0
}
