#!/usr/bin/python3
"""The PyTorch recipe of docs/fault-tolerance.md: a DDP job that loses a rank and trains on.

Run under `strata-run --torch --keep-going -n 4 /usr/bin/python3 test_shrink.py [--kill-rank R
--kill-step K --steps S]`. Rank R kills itself (SIGKILL) at step K. Every other rank's step fails
with a RuntimeError naming a lost rank; it then shrinks the group (strata_torch.shrink_group),
rebuilds DDP on the survivors' group and trains on from the failed step to step S. At the end the
survivors' parameters must be bit-identical, and each survivor's new rank the number of survivors
below it. Prints "PASS rank r" on every survivor."""

import argparse
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import strata_torch

RANK = int(os.environ["RANK"])
N = int(os.environ["WORLD_SIZE"])


def make_model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def train_step(model, opt, step):
    g = torch.Generator().manual_seed(1000 * step + RANK)
    x = torch.randn(8, 16, generator=g)
    y = torch.randint(0, 4, (8,), generator=g)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kill-rank", type=int, default=2)
    p.add_argument("--kill-step", type=int, default=10)
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args()
    dist.init_process_group("strata")
    group = dist.group.WORLD
    model = DDP(make_model(), process_group=group, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step, shrinks = 0, 0
    while step < args.steps:
        if RANK == args.kill_rank and step == args.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            train_step(model, opt, step)
            step += 1
        except RuntimeError as e:
            # The recipe: shrink, rebuild DDP on the survivors (it broadcasts the parameters of
            # the new rank 0, so every survivor starts from the same state), retry the step.
            print(f"rank {RANK}: step {step} failed: {str(e)[:300]}", flush=True)
            assert str(args.kill_rank) in str(e), "the error does not name the lost rank"
            assert shrinks == 0, "a second failure"
            group = strata_torch.shrink_group(group)
            shrinks += 1
            assert group.size() == N - 1, group.size()
            assert group.rank() == RANK - (RANK > args.kill_rank), group.rank()
            model = DDP(model.module, process_group=group, bucket_cap_mb=0.001)
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
    assert shrinks == 1, "no step failed although a rank died"
    flat = torch.cat([q.detach().reshape(-1) for q in model.module.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(group.size())]
    group.allgather([gathered], [flat]).wait()
    for r, other in enumerate(gathered):
        assert torch.equal(other, flat), f"parameters differ from the survivors' rank {r}"
    print(f"PASS rank {RANK}: trained to step {step} on {group.size()} ranks after the loss",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
