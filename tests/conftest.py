"""Shared fixtures. Tests run small: tiny images, short sim steps, few workers."""

from __future__ import annotations

import pytest
import torch

# Keep the suite predictable on a 2-core machine: one intra-op thread per process.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def small_toy_options() -> dict:
    """toy workload sizes that keep a step in the millisecond range."""
    return dict(batch_size=4, num_workers=0, raw_size=64, img_size=32, length=64, model="resnet18")
