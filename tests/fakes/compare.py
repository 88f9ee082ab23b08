"""Workload factories for compare tests: a ladder whose rungs have known, planted costs."""

from __future__ import annotations

import torchvision.transforms as T
from torch.utils.data import DataLoader

from fastpipe.workloads._workload import Workload
from tests.fakes import PlantedDataset, Slow


def _workload(ms: float, name: str) -> Workload:
    dataset = PlantedDataset(transform=T.Compose([Slow(ms)]))
    return Workload(loader=DataLoader(dataset, batch_size=4, num_workers=2), step=lambda batch: None, name=name)


def slow() -> Workload:
    return _workload(60, "slow")  # 4 x 60 ms over 2 workers: 120 ms a batch


def faster() -> Workload:
    return _workload(30, "faster")  # 60 ms a batch


def same_as_faster() -> Workload:
    return _workload(30, "same")


def fastest() -> Workload:
    return _workload(0, "fastest")


def raises() -> Workload:
    raise RuntimeError("factory exploded")
