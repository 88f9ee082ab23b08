"""fastpipe.diagnose under torchrun: every rank diagnoses its own shard, all ranks follow one plan.

    torchrun --nproc_per_node 2 examples/ddp/diagnose_ddp.py            # gloo on the CPU, sim device
    torchrun --nproc_per_node 8 examples/ddp/diagnose_ddp.py --nccl     # NCCL, one GPU per rank

Rank 0 prints the report (every rank holds the same one).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import fastpipe


class Decode:
    """A stand-in for an expensive per-sample stage: 20 ms."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.02)
        return x


class Images(Dataset):
    def __init__(self, transform) -> None:
        self.transform = transform

    def __len__(self) -> int:
        return 4000

    def __getitem__(self, index: int):
        return self.transform(torch.zeros(3, 32, 32)), index % 10


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nccl", action="store_true", help="NCCL and one GPU per rank (default: gloo on the CPU, sim device)")
    args = parser.parse_args()
    if args.nccl:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if args.nccl else "gloo")
    try:
        dataset = Images(Decode())
        loader = DataLoader(dataset, batch_size=8, num_workers=2, sampler=DistributedSampler(dataset))
        report = fastpipe.diagnose(
            loader,
            lambda batch: None,
            device="cuda" if args.nccl else "sim:20",
            options=fastpipe.DiagnoseOptions(steps=6, warmup=2, budget=3.0, progress=False, stage_costs=False),
        )
        if dist.get_rank() == 0:
            print(report.to_table())
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
