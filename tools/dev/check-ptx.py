#!/usr/bin/env python3
"""check-ptx.py KERNELS.ptx: the CUDA collectives' kernels use the instructions their
synchronisation scheme relies on (docs/collectives-cuda.md), and none uses local memory.

Each kernel (.entry) is checked for what its algorithm family must contain:
  LL8 kernels      8-byte volatile packet stores and loads (st/ld.volatile.global.u64)
  LL16 kernels     16-byte volatile packet stores and loads (st/ld.volatile.global.v4.u32)
  direct kernels   release reductions at system scope (red.release.sys.global.add.u64),
                   acquire loads (ld.acquire.sys), 16-byte vector loads and stores (.v4.u32)
  every kernel     %globaltimer (the bounded waits), no .local
"""
import re
import sys

# KernelId enum order in collectives/cuda/kernels.hpp.
IDS = ["AllReduceOneShot", "AllReduceTwoShot", "AllReduceDirect", "ReduceScatterPackets",
       "ReduceScatterDirect", "AllGatherPackets", "AllGatherDirect", "BroadcastPackets",
       "BroadcastDirect", "AllToAllPackets", "AllToAllDirect", "Send", "Recv"]
LL8 = [r"st\.volatile\.global\.u64", r"ld\.volatile\.global\.u64"]
LL16 = [r"st\.volatile\.global\.v4\.u32", r"ld\.volatile\.global\.v4\.u32"]
DIRECT = [r"red\.release\.sys\.global\.add\.u64", r"ld\.acquire\.sys", r"ld(\.global)?\.v4\.u32",
          r"st(\.global)?\.v4\.u32"]
NEEDS = {
    "AllReduceOneShot": LL8, "AllGatherPackets": LL8, "BroadcastPackets": LL8,
    "AllToAllPackets": LL8, "AllReduceTwoShot": LL16, "ReduceScatterPackets": LL16,
    "AllReduceDirect": DIRECT, "ReduceScatterDirect": DIRECT, "AllGatherDirect": DIRECT,
    "BroadcastDirect": DIRECT, "AllToAllDirect": DIRECT,
    "Send": DIRECT, "Recv": DIRECT,
}


def main():
    text = open(sys.argv[1]).read()
    entries = re.split(r"^\.visible \.entry ", text, flags=re.M)[1:]
    if not entries:
        print("no kernels in", sys.argv[1])
        return 1
    seen = {}
    failures = []
    for body in entries:
        name = body.split("(", 1)[0]
        m = re.search(r"KernelIdE(\d+)E", name)
        if not m:
            continue
        kid = IDS[int(m.group(1))]
        seen[kid] = seen.get(kid, 0) + 1
        for pattern in NEEDS[kid] + [r"%globaltimer"]:
            if not re.search(pattern, body):
                failures.append(f"{kid} ({name}): no {pattern}")
        if re.search(r"\.local\b", body):
            failures.append(f"{kid} ({name}): uses local memory")
    for kid in IDS:
        if kid not in seen:
            failures.append(f"{kid}: no kernel in the PTX")
    for f in failures:
        print("FAIL", f)
    print(f"{sum(seen.values())} kernels checked, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
