"""fastpipe.loading._rebuild: one rebuild for the diagnosis (copies) and fastpipe.loading.recycled (shares the user's sampler)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from fastpipe.loading._rebuild import rebuild_loader
from fastpipe.loading.recycle import recycled
from tests.fakes import PlantedDataset

pytestmark = pytest.mark.filterwarnings("ignore:.*pin_memory.*no accelerator")


def labels(loader) -> list[int]:
    return [int(i) for _, batch in loader for i in batch]


def test_shared_or_copied_is_the_callers_explicit_choice() -> None:
    generator = torch.Generator().manual_seed(5)
    loader = DataLoader(PlantedDataset(length=16), batch_size=4, shuffle=True, generator=generator)
    shared = rebuild_loader(loader, PlantedDataset(length=16), share_sampler=True)
    assert shared.sampler is loader.sampler and shared.generator is generator
    copied = rebuild_loader(loader, PlantedDataset(length=16))
    assert copied.sampler is not loader.sampler and copied.generator is not generator
    before = generator.get_state().clone()
    list(copied)
    assert torch.equal(generator.get_state(), before)  # a copy never moves the user's generator
    list(shared)
    assert not torch.equal(generator.get_state(), before)  # the shared one is the user's: it moves, on purpose


def test_without_workers_the_rebuilt_loader_drops_persistence() -> None:
    loader = DataLoader(PlantedDataset(length=8), batch_size=4, num_workers=2, persistent_workers=True, prefetch_factor=3)
    rebuilt = rebuild_loader(loader, PlantedDataset(length=8), num_workers=0)
    assert rebuilt.num_workers == 0 and not rebuilt.persistent_workers and rebuilt.prefetch_factor is None


def test_recycled_follows_set_epoch_like_the_loader_it_wraps() -> None:
    dataset = PlantedDataset(length=40)
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=7)
    stock = DataLoader(dataset, batch_size=4, sampler=sampler)
    ring = recycled(DataLoader(dataset, batch_size=4, sampler=sampler))
    orders = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        expected = [i % 10 for i in sampler]  # PlantedDataset's label is index % 10
        assert labels(ring) == labels(stock) == expected
        orders.append(expected)
    assert orders[0] != orders[1], "set_epoch reshuffled the recycled loader too"
    ring.close()
