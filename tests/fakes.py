"""Planted-cost fixtures: datasets and transforms whose costs are known by construction.

Costs are sleeps, not busy loops, so they hold on a loaded 2-core machine and add up per
worker the way real per-sample costs do.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch
from torch.utils.data import Dataset


class Sleep:
    """A transform stage that takes ``ms`` per sample and returns its input unchanged."""

    def __init__(self, ms: float = 0.0) -> None:
        self.ms = ms

    def __call__(self, x: Any) -> Any:
        if self.ms:
            time.sleep(self.ms / 1000)
        return x


class Fast(Sleep):
    pass


class Slow(Sleep):
    pass


class AddOne:
    """An in-place stage: if a cache handed out its own copy, values would pile up."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.add_(1)


class Raise:
    def __init__(self, message: str = "planted failure") -> None:
        self.message = message

    def __call__(self, x: Any) -> Any:
        raise ValueError(self.message)


class PlantedDataset(Dataset):
    """Samples of a given shape; the raw load sleeps ``raw_ms``; ``transform`` as torchvision datasets use it."""

    def __init__(self, length: int = 400, shape: tuple[int, ...] = (3, 8, 8), raw_ms: float = 0.0,
                 transform: Callable[[Any], Any] | None = None, dtype: torch.dtype = torch.float32) -> None:
        self.length, self.shape, self.raw_ms, self.transform, self.dtype = length, shape, raw_ms, transform, dtype

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.raw_ms:
            time.sleep(self.raw_ms / 1000)
        x = torch.full(self.shape, float(index % 7), dtype=self.dtype)
        if self.transform is not None:
            x = self.transform(x)
        return x, index % 10


class NoTransformDataset(Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.zeros(4)
