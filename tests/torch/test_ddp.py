#!/usr/bin/python3
"""DDP training through strata against the same training through gloo, in one job.

Run under `strata-run --torch -n N /usr/bin/python3 test_ddp.py [--steps S] [--kill-rank R
--kill-step K]`. The default group is strata; gloo is a second group over the same ranks. Two
copies of one model (same seed) train on the same batches, one wrapped in DDP over each group,
with small buckets so that communication overlaps backward and a BatchNorm whose buffers DDP
broadcasts every step. At the end: parameters of the two equal within 1e-4 relative, and the
strata model's parameters bit-identical on every rank.

With --kill-rank R --kill-step K, rank R kills itself (SIGKILL) at step K of a strata-only
training run (with --hang it stops instead: SIGSTOP); every other rank must raise a RuntimeError that names rank R, within the
process group's timeout (--timeout seconds), naming a rank, and exits 0; a rank that hangs is
killed by the launcher and fails the test. The launcher (--output) checks that the killed rank
is named: a survivor that waited on another survivor may name that one, which had given up and
exited by then."""

import argparse
import copy
import datetime
import os
import re
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import strata_torch  # noqa: F401

RANK = int(os.environ["RANK"])
N = int(os.environ["WORLD_SIZE"])


def make_model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 256), torch.nn.BatchNorm1d(256), torch.nn.ReLU(),
        torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))


def batch(step):
    g = torch.Generator().manual_seed(10_000 * step + RANK)
    x = torch.randn(16, 32, generator=g)
    y = torch.randint(0, 4, (16,), generator=g)
    return x, y


def train_step(model, opt, step):
    x, y = batch(step)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()


def compare(args):
    gloo = dist.new_group(backend="gloo")
    base = make_model()
    ddp_s = DDP(copy.deepcopy(base), bucket_cap_mb=0.1)  # the default group: strata
    ddp_g = DDP(copy.deepcopy(base), process_group=gloo, bucket_cap_mb=0.1)
    opt_s = torch.optim.SGD(ddp_s.parameters(), lr=0.05, momentum=0.9)
    opt_g = torch.optim.SGD(ddp_g.parameters(), lr=0.05, momentum=0.9)
    for step in range(args.steps):
        ls = train_step(ddp_s, opt_s, step)
        lg = train_step(ddp_g, opt_g, step)
        if step % 10 == 0 and RANK == 0:
            print(f"step {step}: loss strata {ls:.6f} gloo {lg:.6f}", flush=True)
    bad = []
    worst = 0.0
    for (name, ps), pg in zip(ddp_s.module.named_parameters(), ddp_g.module.parameters()):
        rel = ((ps - pg).abs() / pg.abs().clamp_min(1e-3)).max().item()
        worst = max(worst, rel)
        if not torch.allclose(ps, pg, rtol=1e-4, atol=1e-6):
            bad.append(f"{name}: relative difference {rel:.2e}")
        # Bit-identical on every rank: compare with rank 0's copy (sent over gloo).
        ref = ps.detach().clone()
        dist.broadcast(ref, src=0, group=gloo)
        if not torch.equal(ref, ps.detach()):
            bad.append(f"{name}: differs from rank 0's")
    moved = any(not torch.equal(p0, p1) for p0, p1 in
                zip(base.parameters(), ddp_s.module.parameters()))
    if not moved:
        bad.append("training did not change the parameters")
    print(f"rank {RANK}: {args.steps} steps, largest relative difference strata vs gloo "
          f"{worst:.2e}", flush=True)
    for b in bad:
        print(f"FAIL rank {RANK}: {b}", flush=True)
    return 1 if bad else 0


def killed(args):
    model = DDP(make_model(), bucket_cap_mb=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start = None
    try:
        for step in range(args.steps):
            if step == args.kill_step:
                dist.barrier()  # every rank is here: the kill comes mid-training, not mid-setup
                if RANK == args.kill_rank and args.hang:
                    print(f"rank {RANK}: stopping at step {step}", flush=True)
                    os.kill(os.getpid(), signal.SIGSTOP)
                elif RANK == args.kill_rank:
                    print(f"rank {RANK}: killing myself at step {step}", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                start = time.monotonic()
            train_step(model, opt, step)
    except RuntimeError as e:
        took = time.monotonic() - (start or time.monotonic())
        msg = str(e)
        print(f"rank {RANK}: RuntimeError after {took:.1f} s: {msg}", flush=True)
        # It names the rank it waited for: the dead or stopped one, or (a rank that waited on a
        # survivor which gave up and exited first) that survivor, also gone by then. The
        # launcher checks that some rank named the killed one.
        if not re.search(r"rank \d+", msg):
            print(f"FAIL rank {RANK}: the error names no rank", flush=True)
            return 1
        if args.hang and took < args.timeout * 0.5:
            print(f"FAIL rank {RANK}: gave up after {took:.1f} s, before the timeout",
                  flush=True)
            return 1
        if took > args.timeout + 5:
            print(f"FAIL rank {RANK}: took {took:.1f} s, the timeout is {args.timeout} s",
                  flush=True)
            return 1
        return 0
    print(f"FAIL rank {RANK}: training finished although rank {args.kill_rank} died",
          flush=True)
    return 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-step", type=int, default=5)
    p.add_argument("--hang", action="store_true",
                   help="the rank stops (SIGSTOP) instead of dying: the others time out")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("strata", init_method="env://",
                            timeout=datetime.timedelta(seconds=args.timeout))
    if args.kill_rank >= 0:
        rc = killed(args)
        sys.stdout.flush()
        os._exit(rc)  # the group cannot be torn down cleanly with a dead member
    rc = compare(args)
    dist.barrier()
    dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main())
