"""Planted copy-on-read datasets and their workloads (SPECs ``tests.fakes.memory:records`` and ``:packed``).

``Records`` keeps its index as a Python list of dicts, so a forked worker reading samples at random copies the
pages it touches (their reference counts change); ``Packed`` keeps the same index in NumPy arrays, which a read
does not copy.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from fastpipe.workloads._workload import Workload

N = 200_000


def path_of(i: int) -> str:
    return f"images/{i:07d}.jpg"


class Records(Dataset):
    """The usual index: one dict per sample."""

    def __init__(self, n: int = N) -> None:
        self.records = [{"path": path_of(i), "label": i % 1000, "size": (i % 640, i % 480)} for i in range(n)]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> torch.Tensor:
        r = self.records[i]
        return torch.tensor([r["label"], len(r["path"]), r["size"][0]])


class Packed(Dataset):
    """The same index in NumPy arrays: no Python object per sample."""

    def __init__(self, n: int = N) -> None:
        self.labels = np.arange(n, dtype=np.int64) % 1000
        self.paths = np.array([path_of(i).encode() for i in range(n)], dtype="S18")
        self.sizes = np.stack([np.arange(n) % 640, np.arange(n) % 480], axis=1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([int(self.labels[i]), len(self.paths[i]), int(self.sizes[i, 0])])


def _workload(dataset: Dataset, name: str) -> Workload:
    loader = DataLoader(dataset, batch_size=32, shuffle=True, num_workers=2)
    return Workload(loader=loader, step=lambda batch: None, name=name)


def records() -> Workload:
    """The planted copy-on-read dataset, read at random by 2 workers."""
    return _workload(Records(), "planted copy-on-read (list of dicts)")


def packed() -> Workload:
    """The same index in NumPy arrays."""
    return _workload(Packed(), "planted index in NumPy arrays")
