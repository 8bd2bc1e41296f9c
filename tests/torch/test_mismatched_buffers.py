#!/usr/bin/python3
"""Issue 23, as a user hit it: rank 1 runs with STRATA_COLLECTIVES_BUFFER_BYTES=1048576, rank 0
with the default, and both call all_reduce on 4 MiB. That killed rank 0 with SIGSEGV (it wrote
into rank 1's smaller slots with its own geometry) while rank 1 reported a chunk of the wrong
size. Every rank must now fail with a clear error naming collectives.buffer_bytes and both
ranks, and go on to exit normally.

Run under `strata-run --torch -n 2` (env:// variables). Each rank prints what it got and exits 0
only for that error; a crash, a hang (strata-run --timeout) or a success fails the test."""

import datetime
import os
import re
import sys

RANK = int(os.environ["RANK"])
N = int(os.environ["WORLD_SIZE"])
ODD_RANK = 1
# Before strata_torch reads its configuration: the odd rank's environment differs, as a user's
# job script might make it.
if RANK == ODD_RANK:
    os.environ["STRATA_COLLECTIVES_BUFFER_BYTES"] = "1048576"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import strata_torch  # noqa: E402,F401  (registers the backend)


def names_rank(message, rank):
    # The word rank, then within the same clause the number standing alone (as the C++ tests'
    # namesRank): "rank 1", "ranks 0 and 1".
    return re.search(rf"rank[^.;:]*?[^0-9]{rank}([^0-9]|$)", message, re.IGNORECASE) is not None


def main():
    if N != 2:
        print(f"rank {RANK}: needs 2 ranks, has {N}", flush=True)
        return 1
    try:
        dist.init_process_group("strata", timeout=datetime.timedelta(seconds=60))
        t = torch.ones(1 << 20, dtype=torch.float32)  # 4 MiB
        dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001 - whatever type strata_torch raises, the text counts
        message = str(e)
        problems = []
        if "collectives.buffer_bytes" not in message:
            problems.append("does not name collectives.buffer_bytes")
        for r in (0, ODD_RANK):
            if not names_rank(message, r):
                problems.append(f"does not name rank {r}")
        for value in ("8388608", "1048576"):
            if value not in message:
                problems.append(f"does not give the value {value}")
        if problems:
            print(f"FAIL rank {RANK}: the error {', '.join(problems)}: {message}", flush=True)
            return 1
        print(f"rank {RANK}: refused as expected: {message}", flush=True)
        return 0
    print(f"FAIL rank {RANK}: all_reduce of 4 MiB with mismatched collectives.buffer_bytes "
          f"returned without an error", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
