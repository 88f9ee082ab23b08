"""watch's split of each epoch's start (additive to the first-batch figure): iter(loader), then the first next()."""

from __future__ import annotations

import time

from torch.utils.data import DataLoader

import fastpipe
from tests.fakes import PlantedDataset

INIT_S = 0.3


def slow_init(worker_id: int) -> None:
    time.sleep(INIT_S)


def test_every_epoch_start_is_split_and_non_persistent_workers_pay_it_each_epoch() -> None:
    loader = DataLoader(PlantedDataset(16), batch_size=8, num_workers=2, worker_init_fn=slow_init, multiprocessing_context="fork")
    lines: list[str] = []
    watch = fastpipe.watch(loader, echo=lines.append, memory=False)
    for _ in range(2):
        for _ in watch:
            pass
    summary = watch.summary()
    starts = summary["starts"]
    assert len(starts) == 2
    for start, epoch in zip(starts, summary["per_epoch"]):
        assert start["iter_s"] + start["first_next_s"] >= INIT_S  # every epoch waits for the workers' worker_init_fn again
        assert abs(start["iter_s"] + start["first_next_s"] - epoch["first_batch_s"]) < 1e-6  # the split adds up
    assert sum("workers started in" in line for line in lines) == 2  # one per epoch line
