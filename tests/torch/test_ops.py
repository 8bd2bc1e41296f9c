#!/usr/bin/python3
"""Every torch.distributed operation through the "strata" backend, against references computed
here. Run under `strata-run --torch -n N /usr/bin/python3 test_ops.py` (env:// variables).

Each check that fails prints "FAIL <name>: <why>"; the script exits 1 if any did. A check is
one operation, dtype and form (sync, async_op=True, get_future()); data are small integers, so
every reference is exact in every dtype (fp16 and bf16 included) and compared bit for bit."""

import datetime
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

import strata_torch  # noqa: F401  (registers the backend)

RANK = int(os.environ["RANK"])
N = int(os.environ["WORLD_SIZE"])
failures = []
checks = 0

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64]
# ReduceOp values by name: torch 1.13's ReduceOp objects cannot be compared with ==.
OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG"]
COUNTS = [1, 7, 1000, 70001]  # 70001 elements take another algorithm than 7 at every dtype
FORMS = ["sync", "async", "future"]


def check(name, fn):
    global checks
    checks += 1
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - every failure is reported, none stops the run
        failures.append(name)
        print(f"FAIL {name}: {e}", flush=True)
        traceback.print_exc()


def expect_equal(got, want, what):
    if got.dtype != want.dtype or got.shape != want.shape:
        raise AssertionError(f"{what}: got {got.dtype}{tuple(got.shape)}, "
                             f"want {want.dtype}{tuple(want.shape)}")
    if not torch.equal(got, want):
        bad = (got != want).nonzero()[:3].tolist()
        raise AssertionError(f"{what}: differs at {bad}: got {got.flatten()[:6].tolist()}, "
                             f"want {want.flatten()[:6].tolist()}")


def run(form, call):
    """Runs a collective in one of its three forms; returns what get_future() gave, or None."""
    if form == "sync":
        assert call(False) is None
        return None
    work = call(True)
    if form == "async":
        work.wait()
        assert work.is_completed(), "is_completed() is false after wait()"
        return None
    value = work.get_future().wait()
    assert work.is_completed(), "is_completed() is false after the future completed"
    return value


def data(rank, count, dtype, op=None):
    """Rank r's input: small values so that sums, products and averages stay exact."""
    i = torch.arange(count, dtype=torch.int64)
    if op == "PRODUCT":
        v = 1 + (i + rank) % 2  # 1 or 2: a product of up to 4 ranks is at most 16
    else:
        v = (i * 3 + rank * 5) % 11 + (rank if dtype not in (torch.uint8,) else 0)
    if dtype == torch.bool:
        return ((i + rank) % 3 == 0)
    return v.to(dtype)


def reference(count, dtype, op):
    parts = [data(r, count, dtype, op).to(torch.float64) for r in range(N)]
    if dtype == torch.bool:
        b = [data(r, count, dtype, op) for r in range(N)]
        out = b[0].clone()
        for x in b[1:]:
            out = (out | x) if op in ("SUM", "MAX") else (out & x)
        return out
    acc = parts[0].clone()
    for p in parts[1:]:
        if op in ("SUM", "AVG"):
            acc += p
        elif op == "PRODUCT":
            acc *= p
        elif op == "MIN":
            acc = torch.minimum(acc, p)
        else:
            acc = torch.maximum(acc, p)
    if op == "AVG":
        acc = torch.div(acc, N, rounding_mode="trunc") if not dtype.is_floating_point else acc / N
    return acc.to(dtype)  # values stay small: no type overflows


def test_all_reduce():
    for dtype in DTYPES:
        for op in OPS:
            for count in COUNTS:
                form = FORMS[(count + DTYPES.index(dtype)) % 3]

                def go(dtype=dtype, op=op, count=count, form=form):
                    t = data(RANK, count, dtype, op)
                    got = run(form, lambda a: dist.all_reduce(t, op=getattr(dist.ReduceOp, op),
                                                               async_op=a))
                    expect_equal(t, reference(count, dtype, op), "result")
                    if got is not None:
                        expect_equal(got[0], t, "future value")
                check(f"all_reduce {dtype} {op} n={count} {form}", go)
    for op in ["SUM", "PRODUCT", "MIN", "MAX"]:
        def go_bool(op=op):
            t = data(RANK, 33, torch.bool)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            expect_equal(t, reference(33, torch.bool, op), "bool")
        check(f"all_reduce bool {op}", go_bool)

    def non_contiguous():
        base = data(RANK, 60, torch.float32).reshape(6, 10)
        t = base.t()  # a view with strides (1, 10)
        assert not t.is_contiguous()
        dist.all_reduce(t)
        expect_equal(base, reference(60, torch.float32, "SUM").reshape(6, 10),
                     "non-contiguous")
    check("all_reduce non-contiguous", non_contiguous)

    def coalesced():
        # torch takes one dtype per coalesced call
        ts = [data(RANK, 5, torch.int64), data(RANK, 9, torch.int64)]
        dist.all_reduce_coalesced(ts)
        expect_equal(ts[0], reference(5, torch.int64, "SUM"), "tensor 0")
        expect_equal(ts[1], reference(9, torch.int64, "SUM"), "tensor 1")
    check("all_reduce_coalesced", coalesced)

    def many_async():  # issued back to back, completed in order
        works = []
        ts = [data(RANK, 100 + k, torch.float32) for k in range(8)]
        for t in ts:
            works.append(dist.all_reduce(t, async_op=True))
        for k, w in enumerate(works):
            w.wait()
            expect_equal(ts[k], reference(100 + k, torch.float32, "SUM"), f"call {k}")
    check("all_reduce 8 async in flight", many_async)


def test_broadcast_reduce():
    for root in range(N):
        for dtype in [torch.float32, torch.bfloat16, torch.int8, torch.bool]:
            def go(root=root, dtype=dtype):
                t = data(RANK, 257, dtype)
                dist.broadcast(t, src=root)
                expect_equal(t, data(root, 257, dtype), "broadcast")
            check(f"broadcast root={root} {dtype}", go)

        def go_reduce(root=root):
            t = data(RANK, 99, torch.float64)
            before = t.clone()
            run("async", lambda a: dist.reduce(t, dst=root, op=dist.ReduceOp.MAX, async_op=a))
            want = reference(99, torch.float64, "MAX") if RANK == root else before
            expect_equal(t, want, "reduce")
        check(f"reduce root={root}", go_reduce)

    def bcast_non_contiguous():
        base = data(RANK, 24, torch.int32).reshape(4, 6)
        t = base[:, ::2]
        dist.broadcast(t, src=N - 1)
        expect_equal(t, data(N - 1, 24, torch.int32).reshape(4, 6)[:, ::2], "strided")
    check("broadcast non-contiguous", bcast_non_contiguous)


def test_gathers():
    for dtype in [torch.float32, torch.float16, torch.int64, torch.uint8]:
        def go(dtype=dtype):
            outs = [torch.zeros(13, dtype=dtype) for _ in range(N)]
            dist.all_gather(outs, data(RANK, 13, dtype))
            for r in range(N):
                expect_equal(outs[r], data(r, 13, dtype), f"slot {r}")
        check(f"all_gather {dtype}", go)

    def base():
        out = torch.zeros(N * 10, dtype=torch.float32)
        run("future", lambda a: dist._all_gather_base(out, data(RANK, 10, torch.float32),
                                                        async_op=a))
        expect_equal(out, torch.cat([data(r, 10, torch.float32) for r in range(N)]), "flat")
    check("_all_gather_base", base)

    def coalesced():
        ins = [data(RANK, 3, torch.float32), data(RANK, 4, torch.float32).reshape(2, 2)]
        outs = [[torch.zeros(3), torch.zeros(2, 2)] for _ in range(N)]
        dist.all_gather_coalesced(outs, ins)
        for r in range(N):
            expect_equal(outs[r][0], data(r, 3, torch.float32), f"rank {r} tensor 0")
            expect_equal(outs[r][1], data(r, 4, torch.float32).reshape(2, 2), f"rank {r} tensor 1")
    check("all_gather_coalesced", coalesced)

    for root in range(N):
        def go_gather(root=root):
            t = data(RANK, 8, torch.float64)
            outs = [torch.zeros(8, dtype=torch.float64) for _ in range(N)] if RANK == root else None
            dist.gather(t, gather_list=outs, dst=root)
            if RANK == root:
                for r in range(N):
                    expect_equal(outs[r], data(r, 8, torch.float64), f"slot {r}")
        check(f"gather root={root}", go_gather)

        def go_scatter(root=root):
            out = torch.zeros(6, dtype=torch.int32)
            ins = [data(r, 6, torch.int32) + 100 for r in range(N)] if RANK == root else None
            dist.scatter(out, scatter_list=ins, src=root)
            expect_equal(out, data(RANK, 6, torch.int32) + 100, "scatter")
        check(f"scatter root={root}", go_scatter)


def test_reduce_scatter():
    for dtype in [torch.float32, torch.bfloat16, torch.int32]:
        def go(dtype=dtype):
            count = 11
            ins = [data(RANK, N * count, dtype)[r * count:(r + 1) * count].clone()
                   for r in range(N)]
            out = torch.zeros(count, dtype=dtype)
            dist.reduce_scatter(out, ins)
            want = reference(N * count, dtype, "SUM")[RANK * count:(RANK + 1) * count]
            expect_equal(out, want, "reduce_scatter")
        check(f"reduce_scatter {dtype}", go)

    def base():
        out = torch.zeros(5, dtype=torch.float32)
        run("async", lambda a: dist._reduce_scatter_base(out, data(RANK, N * 5, torch.float32),
                                                          op=dist.ReduceOp.MIN, async_op=a))
        want = reference(N * 5, torch.float32, "MIN")[RANK * 5:(RANK + 1) * 5]
        expect_equal(out, want, "flat")
    check("_reduce_scatter_base", base)


def test_all_to_all():
    def equal():
        t = torch.arange(N * 4, dtype=torch.float32) + 100 * RANK
        out = torch.zeros(N * 4)
        dist.all_to_all_single(out, t)
        want = torch.cat([torch.arange(RANK * 4, RANK * 4 + 4, dtype=torch.float32) + 100 * r
                          for r in range(N)])
        expect_equal(out, want, "equal splits")
    check("all_to_all_single equal", equal)

    # Rank r sends (r + j) % 3 rows of 2 to rank j (zero rows included).
    def rows(src, dst):
        return (src + dst) % 3

    def unequal():
        in_splits = [rows(RANK, j) for j in range(N)]
        out_splits = [rows(j, RANK) for j in range(N)]
        t = torch.cat([torch.full((rows(RANK, j), 2), RANK * 10 + j, dtype=torch.int64)
                       for j in range(N)])
        out = torch.zeros(sum(out_splits), 2, dtype=torch.int64)
        dist.all_to_all_single(out, t, output_split_sizes=out_splits, input_split_sizes=in_splits)
        want = torch.cat([torch.full((rows(j, RANK), 2), j * 10 + RANK, dtype=torch.int64)
                          for j in range(N)])
        expect_equal(out, want, "unequal splits")
    check("all_to_all_single unequal", unequal)

    def lists():
        ins = [torch.full((RANK + j + 1,), RANK * 10 + j, dtype=torch.float32) for j in range(N)]
        outs = [torch.zeros(j + RANK + 1) for j in range(N)]
        dist.all_to_all(outs, ins)
        for j in range(N):
            expect_equal(outs[j], torch.full((j + RANK + 1,), j * 10 + RANK, dtype=torch.float32),
                         f"from {j}")
    check("all_to_all lists unequal", lists)


def test_p2p():
    nxt, prv = (RANK + 1) % N, (RANK - 1) % N

    def ring_tags():
        for tag in (0, 5):
            s = torch.full((17,), RANK * 1.0 + tag)
            r = torch.zeros(17)
            req = dist.isend(s, nxt, tag=tag)
            dist.recv(r, prv, tag=tag)
            req.wait()
            expect_equal(r, torch.full((17,), prv * 1.0 + tag), f"tag {tag}")
    check("isend/recv ring with tags", ring_tags)

    def recv_first():  # both sides post the receive first: batch_isend_irecv's pattern
        r = torch.zeros(5, dtype=torch.int64)
        ops = [dist.P2POp(dist.irecv, r, prv), dist.P2POp(dist.isend,
                                                           torch.full((5,), RANK), nxt)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        expect_equal(r, torch.full((5,), prv), "batch")
    check("batch_isend_irecv recv first", recv_first)

    def pair_sync():
        if N < 2:
            return
        if RANK == 0:
            dist.send(torch.arange(9, dtype=torch.bfloat16), 1, tag=3)
        elif RANK == 1:
            r = torch.zeros(9, dtype=torch.bfloat16)
            dist.recv(r, 0, tag=3)
            expect_equal(r, torch.arange(9, dtype=torch.bfloat16), "send/recv")
    check("send/recv pair", pair_sync)


def expect_error(name, fn, words):
    def go():
        try:
            fn()
        except RuntimeError as e:
            msg = str(e)
            for w in words:
                if w not in msg:
                    raise AssertionError(f"the error does not say '{w}': {msg}")
            return
        raise AssertionError("no error")
    check(name, go)


def test_errors():
    expect_error("BAND is refused", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32),
                                                            op=dist.ReduceOp.BAND),
                 ["BAND", "SUM, PRODUCT, MIN, MAX and AVG"])
    expect_error("int16 is refused", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16)),
                 ["Short", "float32"])
    expect_error("complex is refused", lambda: dist.broadcast(torch.ones(3, dtype=torch.cfloat),
                                                              src=0), ["ComplexFloat"])
    expect_error("recv from any source", lambda: dist.recv(torch.zeros(1)), ["src"])
    expect_error("bad split sizes", lambda: dist.all_to_all_single(
        torch.zeros(N), torch.zeros(N), input_split_sizes=[5] * N), ["split sizes add up"])
    expect_error("avg on bool", lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool),
                                                        op=dist.ReduceOp.AVG), ["AVG", "bool"])

    def still_usable():
        t = torch.ones(4)
        dist.all_reduce(t)
        expect_equal(t, torch.full((4,), float(N)), "after the refused calls")
    check("group usable after refused calls", still_usable)


def test_barriers():
    def barrier():
        for _ in range(3):
            dist.barrier()
        w = dist.barrier(async_op=True)
        w.wait()
    check("barrier", barrier)

    def monitored():
        # torch 1.13's dist.monitored_barrier only accepts gloo; the ProcessGroup method is
        # strata's own (through the store).
        pg = dist.group.WORLD
        pg.monitored_barrier(datetime.timedelta(seconds=20), True)
    check("monitored_barrier (ProcessGroup method)", monitored)

    def monitored_missing():
        # The last rank stays away: rank 0 names it after the timeout, the others hear it from
        # rank 0. (The last monitored barrier here: the absent rank's call count now differs.)
        if RANK == N - 1:
            return
        try:
            dist.group.WORLD.monitored_barrier(datetime.timedelta(seconds=2), True)
        except RuntimeError as e:
            if "did not arrive" not in str(e) or str(N - 1) not in str(e):
                raise AssertionError(f"the error does not name rank {N - 1}: {e}")
            return
        raise AssertionError("a monitored barrier with a missing rank passed")
    if N > 1:
        check("monitored_barrier names a missing rank", monitored_missing)


def test_subgroup():
    def sub():
        ranks = list(range(0, N, 2))
        g = dist.new_group(ranks=ranks, backend="strata")
        if RANK in ranks:
            t = torch.full((3,), float(RANK))
            dist.all_reduce(t, group=g)
            expect_equal(t, torch.full((3,), float(sum(ranks))), "subgroup sum")
        dist.barrier()
    check("new_group of even ranks", sub)


def test_tag_mismatch():
    """Rank 1 receives with another tag than rank 0 sent: a clear error, then the group refuses
    every call at once (no hang). In a group of its own, so the world group goes on."""
    g = dist.new_group(ranks=[0, 1], backend="strata", timeout=datetime.timedelta(seconds=20))

    def go():
        if RANK == 0:
            dist.send(torch.ones(3), 1, group=g, tag=1)
        elif RANK == 1:
            try:
                dist.recv(torch.zeros(3), 0, group=g, tag=2)
                raise AssertionError("a recv with the wrong tag succeeded")
            except RuntimeError as e:
                for w in ["tag 2", "tag 1", "rank 0", "in the order"]:
                    if w not in str(e):
                        raise AssertionError(f"the error does not say '{w}': {e}")
            t0 = time.monotonic()
            try:
                dist.all_reduce(torch.ones(1), group=g)
                raise AssertionError("the broken group ran a call")
            except RuntimeError as e:
                if "unusable" not in str(e) or time.monotonic() - t0 > 5:
                    raise AssertionError(f"not refused at once: {e}")
    check("recv with another tag breaks the group", go)
    dist.barrier()


def main():
    dist.init_process_group("strata", init_method="env://",
                            timeout=datetime.timedelta(seconds=60))
    assert dist.get_rank() == RANK and dist.get_world_size() == N
    for test in [test_all_reduce, test_broadcast_reduce, test_gathers, test_reduce_scatter,
                 test_all_to_all, test_p2p, test_errors, test_barriers, test_subgroup,
                 test_tag_mismatch]:
        test()
    dist.barrier()
    dist.destroy_process_group()
    if failures:
        print(f"rank {RANK}: {len(failures)} of {checks} checks failed", flush=True)
        return 1
    print(f"rank {RANK}: all {checks} checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
