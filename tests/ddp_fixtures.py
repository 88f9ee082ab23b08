"""A two-rank diagnosis on the gloo backend, run by tests/test_ddp.py in spawned processes."""
from __future__ import annotations

import os
from pathlib import Path

import torch.distributed as dist
import torchvision.transforms as T
from torch.utils.data import DataLoader, DistributedSampler

from tests.fakes import Fast, PlantedDataset, Slow

SLOW_MS = 40


def diagnose_rank(rank: int, world_size: int, port: int, out: str) -> None:
    from fastpipe import diagnose

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        # rank 1 is the slow one: its planted stage costs twice rank 0's
        dataset = PlantedDataset(length=4000, transform=T.Compose([Fast(), Slow(SLOW_MS * (1 + rank))]))  # no epoch ends mid-point
        loader = DataLoader(dataset, batch_size=4, num_workers=1, sampler=DistributedSampler(dataset, shuffle=True, seed=3))
        report = diagnose(loader, lambda batch: None, "sim:10", steps=4, warmup=1, budget=1.5, threshold=0.15,
                          progress=False, stage_costs=False)
        Path(out, f"rank{rank}.json").write_text(report.to_json())
        dist.barrier()
    finally:
        dist.destroy_process_group()
