"""Two ranks on gloo, each checking its stream (tests/diagnosis/unseen/test_streams.py runs them in spawned processes)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from tests.fakes.ddp import _init


class WorkerSharded(IterableDataset):
    """Split by worker, and by rank when ``by_rank``: without it, every rank reads the same items."""

    def __init__(self, by_rank: bool) -> None:
        # read in the training process: a DataLoader worker has no process group of its own
        self.rank, self.ranks = (dist.get_rank(), dist.get_world_size()) if by_rank else (0, 1)

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        share, shares = self.rank * workers + worker, self.ranks * workers
        for i in range(share, 200, shares):
            yield torch.tensor([float(i)])


def check_rank(rank: int, world_size: int, port: int, out: str, by_rank: bool) -> None:
    from fastpipe.diagnosis.unseen._streams import check_stream

    _init(rank, world_size, port)
    try:
        check = check_stream(DataLoader(WorkerSharded(by_rank), batch_size=4, num_workers=2))
        Path(out, f"rank{rank}.json").write_text(json.dumps(check.to_dict()))
        dist.barrier()
    finally:
        dist.destroy_process_group()
