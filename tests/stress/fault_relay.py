#!/usr/bin/python3
"""A fault-injecting TCP relay for tests/stress/net_faults.sh (tc netem is not in this kernel).

It runs in the "router" namespace, which terminates every TCP connection between the two hosts:
the router treats every packet arriving from a host as local (`ip rule iif ... lookup 100`,
table 100 `local 0.0.0.0/0`), so a connection from host A to host B's address:port is accepted by
this relay's listener on that port; getsockname() is the address A asked for. The relay connects
to it with A's address as the source (IP_TRANSPARENT), so B sees A's address, as without it. The
hosts' ephemeral ports (ip_local_port_range) are narrowed to the range given here, so every
listener strata or libfabric opens on a host is on a port the relay listens on; a connection to
any other port is refused by the router (and the job fails, loudly).

Faults, for every relayed connection and both directions:
  --delay-ms D     every chunk is forwarded D ms after it arrived (order kept)
  --rate BYTES     at most BYTES per second per direction
  control commands (one line on the control port, one line answered):
  stall S          nothing is forwarded for S seconds (reads stop too, so the senders' TCP
                   windows fill); answers "resumed, stalled from TIME" when they are over
  cut              every open connection is reset (RST to both ends); new ones are relayed;
                   answers "cut N at TIME"
  stats            "connections N open M bytes B ports P1,P2,..."
"""

import argparse
import asyncio
import socket
import struct
import sys
import time

IP_TRANSPARENT = 19


class Relay:
    def __init__(self, delay, rate):
        self.delay = delay
        self.rate = rate
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.open = set()  # (client socket, server socket, tasks)
        self.connections = 0
        self.bytes = 0
        self.ports = set()
        self.failed = set()

    def log(self, text):
        print(f"relay {time.time():.3f}: {text}", flush=True)

    async def pump(self, reader, writer):
        """Forwards one direction; returns "eof" after passing a clean end on, else "error"."""
        queue = asyncio.Queue(maxsize=16)

        async def read_side():
            try:
                while True:
                    await self.flowing.wait()
                    data = await reader.read(65536)
                    await queue.put((time.monotonic(), data))
                    if not data:
                        return
            except (ConnectionError, OSError):
                await queue.put((time.monotonic(), None))

        async def write_side():
            try:
                while True:
                    arrived, data = await queue.get()
                    if data is None:
                        return "error"
                    if not data:
                        if writer.can_write_eof():
                            writer.write_eof()
                        return "eof"
                    if self.delay:
                        wait = arrived + self.delay - time.monotonic()
                        if wait > 0:
                            await asyncio.sleep(wait)
                    await self.flowing.wait()
                    writer.write(data)
                    await writer.drain()
                    self.bytes += len(data)
                    if self.rate:
                        await asyncio.sleep(len(data) / self.rate)
            except (ConnectionError, OSError):
                return "error"

        r = asyncio.ensure_future(read_side())
        try:
            return await write_side()
        finally:
            r.cancel()

    async def handle(self, creader, cwriter):
        csock = cwriter.get_extra_info("socket")
        src = cwriter.get_extra_info("peername")
        dst = cwriter.get_extra_info("sockname")
        self.connections += 1
        self.ports.add(dst[1])
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)
            s.bind((src[0], 0))
            s.setblocking(False)
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(s, dst), 10)
        except (OSError, asyncio.TimeoutError) as e:
            # Once per destination: a provider that retries every 100 ms would flood the log.
            if dst not in self.failed:
                self.failed.add(dst)
                self.log(f"{src[0]}:{src[1]} -> {dst[0]}:{dst[1]}: connect failed: {e} "
                         "(further failures to it not logged)")
            s.close()
            self.reset(csock)
            cwriter.close()
            return
        sreader, swriter = await asyncio.open_connection(sock=s)
        entry = (csock, s)
        self.open.add(entry)
        tasks = {asyncio.ensure_future(self.pump(creader, swriter)),
                 asyncio.ensure_future(self.pump(sreader, cwriter))}
        # Until both directions ended (EOF passed on) or one broke: then the other end is reset
        # too, as a broken connection would be.
        while tasks:
            finished, tasks = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if any(t.result() == "error" for t in finished):
                self.reset(csock)
                self.reset(s)
                for t in tasks:
                    t.cancel()
                break
        self.open.discard(entry)
        for w in (cwriter, swriter):
            w.close()

    @staticmethod
    def reset(sock):
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    async def control(self, reader, writer):
        line = (await reader.readline()).decode().strip()
        words = line.split()
        answer = "error: unknown command"
        if words[:1] == ["stall"] and len(words) == 2:
            self.log(f"stall {words[1]} s begins ({len(self.open)} connections open)")
            self.flowing.clear()
            began = time.time()
            await asyncio.sleep(float(words[1]))
            self.flowing.set()
            self.log("stall ends")
            answer = f"resumed, stalled from {began:.3f}"
        elif words == ["cut"]:
            n = len(self.open)
            for c, s in list(self.open):
                self.reset(c)
                self.reset(s)
            self.log(f"cut {n} connections")
            answer = f"cut {n} at {time.time():.3f}"
        elif words == ["stats"]:
            answer = (f"connections {self.connections} open {len(self.open)} bytes {self.bytes} "
                      f"ports {','.join(str(p) for p in sorted(self.ports))}")
        writer.write((answer + "\n").encode())
        await writer.drain()
        writer.close()


def ports(spec):
    out = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ports", required=True, help="ports to relay: 20000-20127,20200")
    ap.add_argument("--control", type=int, required=True, help="control port on 127.0.0.1")
    ap.add_argument("--delay-ms", type=float, default=0)
    ap.add_argument("--rate", type=float, default=0, help="bytes per second per direction")
    args = ap.parse_args()
    relay = Relay(args.delay_ms / 1000, args.rate)
    servers = []
    for p in ports(args.ports):
        # Transparent: the answers to a host come from the address it connected to, which is
        # not one of the router's own.
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)
        s.bind(("0.0.0.0", p))
        servers.append(await asyncio.start_server(relay.handle, sock=s, backlog=64))
    servers.append(await asyncio.start_server(relay.control, "127.0.0.1", args.control))
    relay.log(f"ready: {len(servers) - 1} ports, delay {args.delay_ms} ms, rate {args.rate} B/s")
    await asyncio.Event().wait()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
