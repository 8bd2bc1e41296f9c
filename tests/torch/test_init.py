#!/usr/bin/python3
"""init_process_group("strata") through each init method in turn, in one process: tcp://,
file://, and a store passed as store=; each group runs one all_reduce and is destroyed before
the next is made. Run under `strata-run --torch -n N` (which also sets STRATA_RANK and friends:
the store's rank and size must win over them)."""

import datetime
import os
import sys
import tempfile

import torch
import torch.distributed as dist

import strata_torch  # noqa: F401

RANK = int(os.environ["RANK"])
N = int(os.environ["WORLD_SIZE"])
ADDR = os.environ["MASTER_ADDR"]
PORT = int(os.environ["MASTER_PORT"])
TIMEOUT = datetime.timedelta(seconds=60)


def one_call(what):
    t = torch.full((3,), float(RANK + 1))
    dist.all_reduce(t)
    want = float(N * (N + 1) // 2)
    if t.tolist() != [want] * 3:
        print(f"FAIL {what}: got {t.tolist()}, want {want}", flush=True)
        return 1
    dist.destroy_process_group()
    print(f"rank {RANK}: {what} ok", flush=True)
    return 0


def main():
    failed = 0
    dist.init_process_group("strata", init_method=f"tcp://{ADDR}:{PORT}", rank=RANK,
                            world_size=N, timeout=TIMEOUT)
    failed += one_call("tcp://")
    # One file per job: every rank derives the same name from the job's MASTER_PORT.
    path = os.path.join(tempfile.gettempdir(), f"strata-torch-init-{PORT}")
    dist.init_process_group("strata", init_method=f"file://{path}", rank=RANK, world_size=N,
                            timeout=TIMEOUT)
    failed += one_call("file://")
    store = dist.FileStore(path + "-store", N)
    dist.init_process_group("strata", store=store, rank=RANK, world_size=N, timeout=TIMEOUT)
    failed += one_call("store=FileStore")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
