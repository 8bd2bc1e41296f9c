#!/usr/bin/env python3
"""Hostile neighbours for tests/stress/proc_faults.sh (loopback only).

  hostile_peer.py proxy PORT_FILE TARGET_PORT RECORD_FILE
      Listens on 127.0.0.1 (an ephemeral port, written to PORT_FILE), forwards each connection to
      127.0.0.1:TARGET_PORT both ways, and appends every byte the connecting side sent to
      RECORD_FILE (a real rank's handshake and check-in, to replay). Runs until killed.
  hostile_peer.py replay TARGET_PORT RECORD_FILE
      Connects to 127.0.0.1:TARGET_PORT, reads the listener's challenge (49 bytes), sends the
      recorded bytes, and prints what came back: "refused: REASON", "accepted" (a failure of the
      listener), or "closed".
  hostile_peer.py loris SECONDS PORT...
      Against every port at once for SECONDS: a port scan (connect and close), a connection that
      sends nothing, one that sends a byte a second, one that sends half a handshake header and
      stalls, and one of garbage. Reconnects whatever the listener closes, so the attack lasts.
      Prints a summary line.
"""

import os
import selectors
import socket
import struct
import sys
import time


def proxy(port_file, target, record):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(16)
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(ls.getsockname()[1]))
    os.rename(tmp, port_file)
    sel = selectors.DefaultSelector()
    sel.register(ls, selectors.EVENT_READ, None)
    out = open(record, "ab", buffering=0)
    while True:
        for key, _ in sel.select():
            if key.data is None:
                c, _ = ls.accept()
                s = socket.create_connection(("127.0.0.1", target))
                sel.register(c, selectors.EVENT_READ, (s, True))
                sel.register(s, selectors.EVENT_READ, (c, False))
                continue
            src = key.fileobj
            dst, from_client = key.data
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                for so in (src, dst):
                    try:
                        sel.unregister(so)
                    except (KeyError, ValueError):
                        pass
                    so.close()
                continue
            if from_client:
                out.write(data)
            try:
                dst.sendall(data)
            except OSError:
                pass


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        d = s.recv(n - len(buf))
        if not d:
            return buf
        buf += d
    return buf


def replay(target, record):
    data = open(record, "rb").read()
    if len(data) < 85:
        print(f"replay: only {len(data)} bytes were recorded; nothing to replay")
        return 2
    s = socket.create_connection(("127.0.0.1", target), timeout=30)
    challenge = recv_exact(s, 49)
    if len(challenge) != 49:
        print("replay: the listener sent no challenge")
        return 2
    s.sendall(data)
    head = recv_exact(s, 12)
    if len(head) < 12:
        print("replay: closed (no handshake result)")
        return 0
    length = struct.unpack_from("<I", head, 8)[0]
    body = recv_exact(s, min(length, 8192))
    ok = body[0] if body else 1
    if ok:
        print("replay: accepted (the listener took a replayed handshake)")
        return 1
    reason = body[1 + 32 + 4:].decode(errors="replace") if len(body) > 37 else ""
    print(f"replay: refused: {reason}")
    return 0


def loris(seconds, ports):
    end = time.monotonic() + seconds
    half_header = struct.pack("<I", 0x5254534E)[:2] + b"\x01\x00\x02"  # 5 of 12 header bytes
    kinds = ["silent", "drip", "half", "garbage"]
    conns = {}  # (port, kind) -> [socket, next byte time]
    stats = {"scans": 0, "opened": 0, "closed by listener": 0, "refused": 0}

    def open_one(port, kind):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
        except OSError:
            stats["refused"] += 1
            return
        s.setblocking(False)
        stats["opened"] += 1
        if kind == "half":
            s.send(half_header)
        elif kind == "garbage":
            s.send(b"GET / HTTP/1.0\r\n\r\n" * 4)
        conns[(port, kind)] = [s, time.monotonic()]

    while time.monotonic() < end:
        for port in ports:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
                stats["scans"] += 1
            except OSError:
                stats["refused"] += 1
            for kind in kinds:
                if (port, kind) not in conns:
                    open_one(port, kind)
        now = time.monotonic()
        for key, entry in list(conns.items()):
            s = entry[0]
            try:
                d = s.recv(4096)
                if d == b"":
                    raise OSError("closed")
            except BlockingIOError:
                pass
            except OSError:
                stats["closed by listener"] += 1
                s.close()
                del conns[key]
                continue
            if key[1] == "drip" and now >= entry[1]:
                try:
                    s.send(b"\x4e")
                except OSError:
                    pass
                entry[1] = now + 1.0
        time.sleep(0.05)
    for entry in conns.values():
        entry[0].close()
    print("loris: " + ", ".join(f"{k} {v}" for k, v in stats.items()) + f" on ports {ports}")
    return 0


def main(argv):
    if len(argv) >= 5 and argv[1] == "proxy":
        return proxy(argv[2], int(argv[3]), argv[4])
    if len(argv) == 4 and argv[1] == "replay":
        return replay(int(argv[2]), argv[3])
    if len(argv) >= 4 and argv[1] == "loris":
        return loris(float(argv[2]), [int(p) for p in argv[3:]])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
