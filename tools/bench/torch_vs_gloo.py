#!/usr/bin/python3
"""Compares the "strata" torch.distributed backend (strata_torch) with "gloo" in one job.

  strata-run --torch -n N /usr/bin/python3 tools/bench/torch_vs_gloo.py [options]

Environment: PYTHONPATH=<build>/bindings/torch STRATA_BOOTSTRAP_TCP_INTERFACE=lo
GLOO_SOCKET_IFNAME=lo (strata-run --torch sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

Both process groups span the same ranks: gloo is the default group (it also carries the
barriers and the MAX reduction of the timings), strata is a second group from new_group().
Per size, rounds alternate strata and gloo (warm-up calls, barrier, timed calls); a round's
time per call is the slowest rank's wall time / iters. Reported: the median over rounds and
gloo/strata (> 1: strata is faster). Then the same for a DistributedDataParallel training step
of a small MLP. A benchmark, not a test: numbers on a loaded machine are noisy.
"""
import argparse
import json
import os
import platform
import statistics
import time

import torch
import torch.distributed as dist
import strata_torch  # noqa: F401  (registers the "strata" backend)
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B") or "0"
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def human(n):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="4K,1M,16M,64M", help="all_reduce sizes in bytes (float32)")
    p.add_argument("--rounds", type=int, default=5, help="rounds per backend (alternating)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls before each round")
    p.add_argument("--iters", type=int, default=0, help="timed calls per round (0: ~--target s)")
    p.add_argument("--target", type=float, default=0.3, help="seconds per measurement")
    p.add_argument("--ddp-dims", default="1024,2048,1024,1024",
                   help="MLP layer widths: input,hidden...,output (default ~5.2 M parameters)")
    p.add_argument("--ddp-batch", type=int, default=32)
    p.add_argument("--ddp-iters", type=int, default=10, help="timed training steps per round")
    p.add_argument("--ddp-rounds", type=int, default=0, help="DDP rounds (0: --rounds)")
    p.add_argument("--no-ddp", action="store_true", help="skip the DDP benchmark")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank")
    p.add_argument("--json", metavar="FILE", help="rank 0 also writes the results here")
    return p.parse_args()


def slowest(seconds, gloo):
    """The maximum of a per-rank time over all ranks (on the gloo group)."""
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
    return t.item()


def time_calls(fn, iters, warmup, gloo):
    for _ in range(warmup):
        fn()
    dist.barrier(group=gloo)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return slowest(time.perf_counter() - start, gloo) / iters


def check_allreduce(pg, numel, rank, size):
    """One SUM all_reduce whose result is known; raises if the backend gets it wrong."""
    t = torch.full((numel,), float(rank + 1), dtype=torch.float32)
    dist.all_reduce(t, group=pg)
    want = size * (size + 1) / 2
    if not torch.all(t == want):
        raise RuntimeError(f"{pg_name(pg)} all_reduce of {numel} floats: got {t[:4].tolist()}... "
                           f"want {want}")


def pg_name(pg):
    return pg.getBackendName() if hasattr(pg, "getBackendName") else str(pg)


def bench_allreduce(args, groups, rank, size):
    rows = []
    for nbytes in [parse_size(s) for s in args.sizes.split(",") if s]:
        numel = max(1, nbytes // 4)
        buf = torch.zeros(numel, dtype=torch.float32)  # zeros: the sum never overflows
        calls = {name: (lambda pg=pg: dist.all_reduce(buf, group=pg)) for name, pg in groups.items()}
        for pg in groups.values():
            check_allreduce(pg, numel, rank, size)
        iters = args.iters
        if iters <= 0:  # calibrate: same count for both backends, from the slower one
            est = max(time_calls(fn, 2, 1, groups["gloo"]) for fn in calls.values())
            iters = max(3, min(10000, int(args.target / max(est, 1e-7))))
        times = {name: [] for name in groups}
        for _ in range(args.rounds):
            for name, fn in calls.items():
                times[name].append(time_calls(fn, iters, args.warmup, groups["gloo"]))
        med = {name: statistics.median(v) * 1e6 for name, v in times.items()}
        rows.append({"bytes": nbytes, "iters": iters, "strata_us": med["strata"],
                     "gloo_us": med["gloo"], "gloo_over_strata": med["gloo"] / med["strata"],
                     "strata_rounds_us": [t * 1e6 for t in times["strata"]],
                     "gloo_rounds_us": [t * 1e6 for t in times["gloo"]]})
    return rows


def make_mlp(dims):
    torch.manual_seed(1234)
    layers = []
    for i in range(len(dims) - 1):
        layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def bench_ddp(args, groups, rank):
    dims = [int(d) for d in args.ddp_dims.split(",")]
    gen = torch.Generator().manual_seed(99 + rank)  # every rank its own shard of data
    x = torch.randn(args.ddp_batch, dims[0], generator=gen)
    y = torch.randn(args.ddp_batch, dims[-1], generator=gen)
    steps = {}
    for name, pg in groups.items():
        model = DDP(make_mlp(dims), process_group=pg)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step(model=model, opt=opt):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        steps[name] = (model, step)
    params = sum(p.numel() for p in steps["gloo"][0].parameters())
    times = {name: [] for name in groups}
    for _ in range(args.ddp_rounds or args.rounds):
        for name, (_, step) in steps.items():
            times[name].append(time_calls(step, args.ddp_iters, 2, groups["gloo"]))
    # Same seeds, data and step count: both replicas must have ended with the same weights.
    diff = max((a - b).abs().max().item() for a, b in
               zip(steps["gloo"][0].parameters(), steps["strata"][0].parameters()))
    med = {name: statistics.median(v) * 1e3 for name, v in times.items()}
    return {"dims": dims, "params": params, "batch": args.ddp_batch, "iters": args.ddp_iters,
            "strata_ms": med["strata"], "gloo_ms": med["gloo"],
            "gloo_over_strata": med["gloo"] / med["strata"], "max_weight_diff": diff,
            "strata_rounds_ms": [t * 1e3 for t in times["strata"]],
            "gloo_rounds_ms": [t * 1e3 for t in times["gloo"]]}


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method="env://")
    rank, size = dist.get_rank(), dist.get_world_size()
    groups = {"strata": dist.new_group(backend="strata"), "gloo": dist.group.WORLD}
    header = {"torch": torch.__version__, "strata": getattr(strata_torch, "__version__", "?"),
              "ranks": size, "cpu": cpu_model(), "nproc": os.cpu_count(), "threads": args.threads}
    if rank == 0:
        print(f"# torch {header['torch']}, strata {header['strata']}, N={size}, "
              f"CPU: {header['cpu']}, nproc={header['nproc']}, torch threads/rank={args.threads}")
        print(f"# all_reduce SUM float32, median of {args.rounds} rounds, time per call "
              f"(slowest rank)", flush=True)
    rows = bench_allreduce(args, groups, rank, size)
    if rank == 0:
        print(f"{'size':>6} {'iters':>6} {'strata_us':>11} {'gloo_us':>11} {'gloo/strata':>12}")
        for r in rows:
            print(f"{human(r['bytes']):>6} {r['iters']:>6} {r['strata_us']:>11.1f} "
                  f"{r['gloo_us']:>11.1f} {r['gloo_over_strata']:>12.2f}", flush=True)
    ddp = None if args.no_ddp else bench_ddp(args, groups, rank)
    if rank == 0 and ddp:
        print(f"# DDP step (fwd+bwd+SGD), MLP {'x'.join(map(str, ddp['dims']))} "
              f"({ddp['params'] / 1e6:.2f} M params), batch {ddp['batch']}, "
              f"{ddp['iters']} steps/round, max weight diff strata vs gloo {ddp['max_weight_diff']:.2g}")
        print(f"{'ddp':>6} {'':>6} {'strata_ms':>11} {'gloo_ms':>11} {'gloo/strata':>12}")
        print(f"{'step':>6} {'':>6} {ddp['strata_ms']:>11.2f} {ddp['gloo_ms']:>11.2f} "
              f"{ddp['gloo_over_strata']:>12.2f}", flush=True)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"header": header, "allreduce": rows, "ddp": ddp}, f, indent=2)
    dist.barrier()
    dist.destroy_process_group(groups["strata"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
