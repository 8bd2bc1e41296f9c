#!/usr/bin/env python3
"""check-ptx.py KERNELS.ptx: the CUDA collectives' kernels use the instructions their
synchronisation scheme relies on (docs/collectives-cuda.md), and none uses local memory.

Each kernel (.entry) is checked for what its algorithm family must contain:
  LL8 kernels      pairs of LL8 packets in one 16-byte volatile store and load
                   (st/ld.volatile.global.v4.u32); the data path of allReduce one-shot, allGather
                   and allToAll has no 8-byte packet store (st.volatile.global.u64: a pair split
                   in two; broadcast keeps them for its presence packets)
  LL16 kernels     16-byte volatile packet stores and loads (st/ld.volatile.global.v4.u32)
  direct kernels   release reductions at system scope (red.release.sys.global.add.u64),
                   acquire loads (ld.acquire.sys), 16-byte vector loads and stores (.v4.u32)
  net kernels      a system-scope fence and the 16-byte FIFO entry store (st.relaxed.sys.global
                   .v2.u64), acquire loads of the proxies' counters (ld.acquire.sys)
  every kernel     %globaltimer (the bounded waits), no .local
  direct folds     the float AllReduceDirect and ReduceScatterDirect kernels issue at least 4
                   16-byte loads (ld.global.v4) in a row with no f32 arithmetic between them
                   (several loads in flight per thread before the fold uses them)
  forbidden        .gpu and .cta scopes on atomics, fences and ordered loads and stores (peers
                   are other GPUs and the host: only .sys orders against them), membar.cta/.gl,
                   and non-coherent loads (ld.global.nc, the read-only cache: a peer's writes
                   to its staging or packets would be read stale)

--self-test feeds it small PTX texts, each with one defect, and checks that each is caught.
"""
import re
import sys

# KernelId enum order in collectives/cuda/kernels.hpp.
IDS = ["AllReduceOneShot", "AllReduceTwoShot", "AllReduceDirect", "ReduceScatterPackets",
       "ReduceScatterDirect", "AllGatherPackets", "AllGatherDirect", "BroadcastPackets",
       "BroadcastDirect", "AllToAllPackets", "AllToAllDirect", "Send", "Recv", "NetReduce",
       "NetGather"]
LL16 = [r"st\.volatile\.global\.v4\.u32", r"ld\.volatile\.global\.v4\.u32"]
LL8 = LL16  # an 8-byte unit is two LL8 packets, one 16-byte access
# LL8 kernels whose every packet store is a pair (broadcast also stores 8-byte presence packets).
PAIRED = ("AllReduceOneShot", "AllGatherPackets", "AllToAllPackets")
# The network step: FIFO pushes (a system-scope fence, then the 16-byte entry in one store), and
# acquire loads of the counters the proxies raise.
NET = [r"fence\.acq_rel\.sys", r"st\.relaxed\.sys\.global\.v2\.u64", r"ld\.acquire\.sys"]
DIRECT = [r"red\.release\.sys\.global\.add\.u64", r"ld\.acquire\.sys", r"ld(\.global)?\.v4\.u32",
          r"st(\.global)?\.v4\.u32"]
NEEDS = {
    "AllReduceOneShot": LL8, "AllGatherPackets": LL8, "BroadcastPackets": LL8,
    "AllToAllPackets": LL8, "AllReduceTwoShot": LL16, "ReduceScatterPackets": LL16,
    "AllReduceDirect": DIRECT, "ReduceScatterDirect": DIRECT, "AllGatherDirect": DIRECT,
    "BroadcastDirect": DIRECT, "AllToAllDirect": DIRECT,
    "Send": DIRECT, "Recv": DIRECT, "NetReduce": NET, "NetGather": NET,
}


FORBIDDEN = [
    (r"\.(acquire|release|relaxed|acq_rel|sc)\.(gpu|cta|cluster)\b", "a .gpu/.cta scope"),
    (r"\bfence\.[a-z_.]*\b(gpu|cta|cluster)\b", "a fence at .gpu/.cta scope"),
    (r"\bmembar\.(cta|gl)\b", "membar.cta/.gl (not .sys)"),
    (r"\bld\.global\.nc\b|\bld\.[a-z0-9.]*\.nc\.", "a non-coherent load (.nc)"),
]


FOLD_KERNELS = ("AllReduceDirect", "ReduceScatterDirect")
MIN_LOADS_IN_FLIGHT = 4


def loads_before_use(body):
    """The longest run of ld.global.v4 with no f32 arithmetic in between."""
    best = run = 0
    for line in body.splitlines():
        line = line.strip()
        if re.match(r"ld\.global\.v4\.", line):
            run += 1
            best = max(best, run)
        elif re.match(r"(add|sub|mul|min|max|fma|mad|div)(\.[a-z]+)*\.f32\b", line):
            run = 0
    return best


def check(text):
    """The failures of a PTX text, and how many kernels it has."""
    entries = re.split(r"^\.visible \.entry ", text, flags=re.M)[1:]
    if not entries:
        return ["no kernels in the PTX"], 0
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
        if kid in PAIRED and re.search(r"st\.volatile\.global\.u64", body):
            failures.append(f"{kid} ({name}): an LL8 pair split into 8-byte stores")
        if re.search(r"\.local\b", body):
            failures.append(f"{kid} ({name}): uses local memory")
        if kid in FOLD_KERNELS and re.search(r"KernelIdE\d+EfE", name):
            n = loads_before_use(body)
            if n < MIN_LOADS_IN_FLIGHT:
                failures.append(f"{kid} ({name}): at most {n} 16-byte loads before the fold "
                                f"uses them (want {MIN_LOADS_IN_FLIGHT})")
        for pattern, what in FORBIDDEN:
            m2 = re.search(pattern, body)
            if m2:
                failures.append(f"{kid} ({name}): {what}: {m2.group(0)}")
    for kid in IDS:
        if kid not in seen:
            failures.append(f"{kid}: no kernel in the PTX")
    return failures, sum(seen.values())


def self_test():
    """Every rule fires on a kernel that breaks it, and a good one passes."""
    good_body = ("ld.volatile.global.u64 c, [a];\n"
                 "mov.u64 t, %globaltimer;\nld.acquire.sys.b64 x, [y];\n")
    def ptx(extra, fold_ok=True):
        out = ""
        for i, kid in enumerate(IDS):
            body = good_body
            for p in NEEDS[kid]:
                body += re.sub(r"\\|\(|\)|\?|\|", "", p.replace(r"(\.global)?", ".global")) + " z;\n"
            if kid in FOLD_KERNELS:
                body += "ld.global.v4.u32 {a,b,c,d}, [x];\n" * (4 if fold_ok else 2)
                body += "add.f32 f, g, h;\n"
            if i == 0:
                body += extra
            out += f".visible .entry _Z16collectiveKernelILN6strata4cuda8KernelIdE{i}EfEvNS1_10KernelArgsE(\n{body}}}\n"
        return out
    bad = {
        "ld.acquire.gpu.b64 x, [y];": "a .gpu/.cta scope",
        "st.release.cta.b64 [y], x;": "a .gpu/.cta scope",
        "atom.add.acq_rel.gpu.u64 x, [y], 1;": "a .gpu/.cta scope",
        "fence.acq_rel.gpu;": "a fence at .gpu/.cta scope",
        "membar.gl;": "membar.cta/.gl",
        "ld.global.nc.v4.u32 {a,b,c,d}, [y];": "a non-coherent load",
        "st.local.u32 [x], y;": "uses local memory",
        "st.volatile.global.u64 [a], b;": "an LL8 pair split",
    }
    ok = True
    failures, _ = check(ptx(""))
    if failures:
        print("self-test: the good PTX fails:", failures)
        ok = False
    for line, what in bad.items():
        failures, _ = check(ptx(line + "\n"))
        if not any(what in f for f in failures):
            print(f"self-test: '{line}' is not caught ({what}); got {failures}")
            ok = False
    failures, _ = check(ptx("", fold_ok=False))
    if not any("loads before the fold" in f for f in failures):
        print("self-test: a fold with 2 loads in flight is not caught")
        ok = False
    print("self-test:", "every rule fires" if ok else "FAILED")
    return 0 if ok else 1


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        return self_test()
    failures, kernels = check(open(sys.argv[1]).read())
    for f in failures:
        print("FAIL", f)
    print(f"{kernels} kernels checked, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
