"""Workload factories for CLI tests of `fastpipe diagnose`."""

from __future__ import annotations

import time

import torchvision.transforms as T
from torch.utils.data import DataLoader

from tests.fakes import Fast, PlantedDataset, Raise


def raising_in_worker():
    dataset = PlantedDataset(transform=T.Compose([Fast(), Raise("corrupt JPEG (planted)")]))
    return DataLoader(dataset, batch_size=4, num_workers=2), lambda batch: None


class Hang:
    def __call__(self, x):
        time.sleep(3600)
        return x


def hanging_in_worker():
    dataset = PlantedDataset(transform=T.Compose([Hang()]))
    return DataLoader(dataset, batch_size=4, num_workers=1), lambda batch: None


def heavy_copy(prefetch_depth: int = 0):
    from fastpipe.workloads._workload import Workload

    # 6.3 MB a batch of 8; long enough that no experiment crosses an epoch (and restarts its workers)
    dataset = PlantedDataset(length=1000, shape=(3, 256, 256), transform=T.Compose([Fast()]))
    loader = DataLoader(dataset, batch_size=8, num_workers=2, pin_memory=True)
    return Workload(loader=loader, step=lambda batch: None, prefetch_depth=prefetch_depth, name=f"prefetch={prefetch_depth}")
