"""A dataset that draws from the global generators, as random augmentations do, and a small workload over it.

Why here: ``tests/test_rng_untouched.py`` checks every entry point against it, the command-line ones through a
factory module (``module:function``) that imports :func:`drawing_workload` from here, never from a test module.
"""

from __future__ import annotations

import random
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from fastpipe.workloads import Workload


class Drawing(Dataset):
    """Each sample draws from torch's, NumPy's and Python's global generators, as random augmentations do."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        noise = torch.rand(4) + float(np.random.rand()) + random.random()
        return torch.full((4,), float(index)) + noise, index % 3


def drawing_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[Any], None]:
    def step(batch: Any) -> None:
        x, y = batch
        torch.nn.functional.cross_entropy(torch.nn.functional.dropout(model(x), 0.5), y).backward()
        optimizer.step()
        optimizer.zero_grad()

    return step


def drawing_workload() -> Workload:
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Drawing(), batch_size=4, shuffle=True)
    return Workload(loader=loader, step=drawing_step(model, optimizer), model=model, optimizer=optimizer, name="drawing")
