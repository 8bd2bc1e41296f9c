#!/usr/bin/python3
"""A small env:// launcher for the torch tests: starts N copies of a script with RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT, waits
for all of them (killing what is left after --timeout seconds) and checks their exit codes.

    launch.py -n 3 --timeout 120 --expect 0,-9,0 script.py args...

--output REGEX: some rank's output (stdout and stderr, shown after the run) must match it.
--expect lists each rank's expected exit code (-9: killed by SIGKILL; "hang": a rank that is
meant to stop responding, killed once every other rank has exited); default all 0."""

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-n", type=int, required=True)
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--expect", default="")
    p.add_argument("--output", default="")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    expect = [x if x == "hang" else int(x) for x in a.expect.split(",")] if a.expect \
        else [0] * a.n
    assert len(expect) == a.n, "--expect needs one code per rank"
    # The port stays bound (SO_REUSEADDR, not listening) until the ranks are done, so that no
    # other process takes it before rank 0's TCPStore binds it (which SO_REUSEADDR allows);
    # strata-run --torch does the same.
    hold = socket.socket()
    hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    hold.bind(("127.0.0.1", 0))
    port = hold.getsockname()[1]
    procs = []
    logs = [tempfile.TemporaryFile(mode="w+") for _ in range(a.n)]
    for r in range(a.n):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.n), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(a.n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, a.script] + a.args, env=env,
                                      stdout=logs[r], stderr=subprocess.STDOUT))
    deadline = time.monotonic() + a.timeout
    codes = [None] * a.n
    def waiting():
        return any(codes[r] is None and expect[r] != "hang" for r in range(a.n))

    while waiting() and time.monotonic() < deadline:
        for r, pr in enumerate(procs):
            if codes[r] is None:
                codes[r] = pr.poll()
        time.sleep(0.05)
    hung = [r for r in range(a.n) if codes[r] is None and expect[r] != "hang"]
    for r in range(a.n):
        if codes[r] is None:
            procs[r].kill()
            procs[r].wait()
            if expect[r] == "hang":
                codes[r] = "hang"
    output = ""
    for r in range(a.n):
        logs[r].seek(0)
        text = logs[r].read()
        output += text
        for line in text.splitlines():
            print(f"[{r}] {line}")
    if hung:
        print(f"launch: ranks {hung} still ran after {a.timeout} s (a hang)", flush=True)
        return 1
    if a.output and not re.search(a.output, output):
        print(f"launch: no rank printed a line matching '{a.output}'", flush=True)
        return 1
    if codes != expect:
        print(f"launch: exit codes {codes}, expected {expect}", flush=True)
        return 1
    print(f"launch: exit codes {codes} as expected", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
