#!/usr/bin/python3
"""The PyTorch recipe of docs/fault-tolerance.md: a DDP job that loses a rank and trains on.

Run under `strata-run --torch --keep-going -n 4 /usr/bin/python3 test_shrink.py [--kill-rank R
--kill-step K --steps S]`. Rank R kills itself (SIGKILL) at step K. Every other rank's step fails
with a RuntimeError naming a lost rank; it then shrinks the group (strata_torch.shrink_group),
rebuilds DDP on the survivors' group and trains on from the failed step to step S. At the end the
survivors' parameters must be bit-identical, and each survivor's new rank the number of survivors
below it. Prints "PASS rank r" on every survivor.

With --grow, rank R first forks its replacement (standing in for one the launcher starts), which
waits for the invitation the survivors' rank 0 writes to a file, joins (strata_torch.join_group),
learns the step and the parameters from the grown group (DDP broadcasts them) and trains with
the survivors to step S on the full size again; its parameters must equal theirs too."""

import argparse
import os
import signal
import sys
import time

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


def invitation_path():
    root = os.environ.get("STRATA_ROOT", "none").replace(":", "_").replace("/", "_")
    return os.path.join(os.environ.get("TMPDIR", "/tmp"), "strata-torch-grow-" + root)


def check_equal(model, group, what):
    flat = torch.cat([q.detach().reshape(-1) for q in model.module.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(group.size())]
    group.allgather([gathered], [flat]).wait()
    for r, other in enumerate(gathered):
        assert torch.equal(other, flat), f"{what}: parameters differ from rank {r}'s"


def replacement(args):
    """The newcomer: joins the grown group and trains on with it."""
    path = invitation_path()
    for _ in range(1200):
        if os.path.exists(path):
            break
        time.sleep(0.05)
    with open(path) as f:
        invitation = f.read().strip()
    group = strata_torch.join_group(invitation, 0)
    step = torch.zeros(1, dtype=torch.int64)
    group.broadcast([step]).wait()
    model = DDP(make_model(), process_group=group, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for s in range(int(step.item()), args.steps):
        train_step(model, opt, s)
    check_equal(model, group, "the replacement")
    print(f"PASS replacement: joined as rank {group.rank()} of {group.size()} at step "
          f"{int(step.item())}", flush=True)
    os._exit(0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kill-rank", type=int, default=2)
    p.add_argument("--kill-step", type=int, default=10)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--grow", action="store_true")
    args = p.parse_args()
    if args.grow and RANK == args.kill_rank:
        sys.stdout.flush()
        if os.fork() == 0:
            try:
                replacement(args)
            except BaseException as e:  # noqa: BLE001 - reported, then the process ends
                print(f"FAIL replacement: {e}", flush=True)
                os._exit(1)
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
            if args.grow:
                # Back to the full size: rank 0 invites, the replacement joins; it learns the
                # step here and the parameters from DDP's broadcast.
                if group.rank() == 0:
                    path = invitation_path()
                    with open(path + ".tmp", "w") as f:
                        f.write(group.grow_invitation(N) + "\n")
                    os.rename(path + ".tmp", path)
                group = strata_torch.grow_group(group, N)
                if group.rank() == 0:
                    os.remove(invitation_path())
                assert group.size() == N and group.rank() == RANK - (RANK > args.kill_rank)
                group.broadcast([torch.tensor([step], dtype=torch.int64)]).wait()
                model = DDP(model.module, process_group=group, bucket_cap_mb=0.001)
                opt = torch.optim.SGD(model.parameters(), lr=0.05)
    assert shrinks == 1, "no step failed although a rank died"
    check_equal(model, group, "a survivor")
    print(f"PASS rank {RANK}: trained to step {step} on {group.size()} ranks after the loss",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
