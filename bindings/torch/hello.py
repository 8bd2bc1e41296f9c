import datetime, torch, torch.distributed as dist
import strata_torch  # registers the "strata" backend

dist.init_process_group("strata", init_method="env://", timeout=datetime.timedelta(seconds=60))
rank, n = dist.get_rank(), dist.get_world_size()
t = torch.full((4,), float(rank))
dist.all_reduce(t)  # SUM over every rank: 0 + 1 + ... + n-1
assert t.tolist() == [n * (n - 1) / 2] * 4, t
print(f"rank {rank} of {n}: all_reduce gave {t.tolist()}")
dist.destroy_process_group()
