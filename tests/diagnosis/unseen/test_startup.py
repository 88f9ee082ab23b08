"""Start-up, measured and explained (fastpipe.diagnosis.unseen._startup): planted slow worker_init_fn, non-persistent
workers over short epochs and a dataset that carries a large list; each is named with its seconds and its fix, and
each fix's projected saving is checked against the saving measured by applying the fix (within 30%)."""

from __future__ import annotations

import json
import multiprocessing
import statistics
import time

import pytest
from torch.utils.data import DataLoader

from benchmarks.startup_fixes import first_batch_s, later_epoch_s  # the benchmark's own clocks: the same checks
from benchmarks.startup_planted import Carries
from fastpipe.diagnosis.unseen._startup import TRANSFER, measure_startup
from fastpipe.diagnosis.unseen._transfer import large_attributes, measure_transfer
from fastpipe.diagnosis.verdict._report import Report
from tests.fakes import PlantedDataset

INIT_S = 0.5
OPEN_S = 0.4
TOLERANCE = 0.30


def slow_init(worker_id: int) -> None:
    time.sleep(INIT_S)


class OpensLazily(PlantedDataset):
    """Opens its store on first use in each worker (an LMDB or HDF5 handle opened lazily, as fork-safe datasets do):
    a fresh worker's first fetch pays it, a kept worker's does not."""

    def __init__(self, length: int) -> None:
        super().__init__(length=length)
        self.handle: object | None = None

    def __getitem__(self, index: int):
        if self.handle is None:
            time.sleep(OPEN_S)
            self.handle = object()
        return super().__getitem__(index)


def fix(startup, name: str):
    return next(f for f in startup.fixes if f.name.startswith(name))


def within(projected: float, measured: float) -> bool:
    return abs(projected - measured) <= TOLERANCE * abs(measured)


def test_a_slow_worker_init_fn_is_named_with_its_seconds_and_its_saving_holds_when_it_is_removed() -> None:
    def make(init):
        return DataLoader(PlantedDataset(64), batch_size=8, num_workers=2, worker_init_fn=init, multiprocessing_context="fork")

    startup = measure_startup(make(slow_init))
    parts = dict(startup.parts)
    assert INIT_S <= parts["worker_init_fn"] < INIT_S + 0.4
    assert abs(sum(parts.values()) - startup.first_batch_s) < 1e-6  # the parts add up to the wait
    cheaper = fix(startup, "a cheaper worker_init_fn")
    measured = statistics.median(first_batch_s(make(slow_init)) - first_batch_s(make(None)) for _ in range(2))
    assert within(cheaper.saves_s, measured), (cheaper.saves_s, measured)
    text = "\n".join(startup.lines())
    assert "worker_init_fn: 0.5" in text and "a cheaper worker_init_fn: saves" in text


def test_non_persistent_workers_over_short_epochs_pay_the_restart_each_epoch_and_persistent_workers_save_it() -> None:
    def make(persistent: bool):
        return DataLoader(
            PlantedDataset(32),
            batch_size=8,
            num_workers=2,
            worker_init_fn=slow_init,
            persistent_workers=persistent,
            multiprocessing_context="fork",
        )

    startup = measure_startup(make(False))
    assert startup.restart_s is not None and startup.restart_s >= INIT_S
    persistent = fix(startup, "persistent_workers=True")
    assert persistent.per_epoch and startup.fixes[0] is persistent
    measured = later_epoch_s(make(False)) - later_epoch_s(make(True))
    assert within(persistent.saves_s, measured), (persistent.saves_s, measured)
    assert measure_startup(make(True)).restart_s is None  # nothing to restart


def test_persistent_workers_save_a_fresh_workers_first_fetch_warm_up_too() -> None:
    """A store opened lazily in each worker: the first fetch of every fresh worker pays it, and persistent workers keep
    it open. Projected from the first fetch of the restart, the saving would miss it (0.1 s projected, 0.5 s saved)."""

    def make(persistent: bool):
        return DataLoader(OpensLazily(32), batch_size=8, num_workers=2, persistent_workers=persistent, multiprocessing_context="fork")

    startup = measure_startup(make(False))
    assert dict(startup.parts)["first fetch (load and collate the first batch)"] >= OPEN_S
    persistent = fix(startup, "persistent_workers=True")
    measured = later_epoch_s(make(False)) - later_epoch_s(make(True))
    assert measured > OPEN_S  # the planted warm-up is what persistent workers save (else this test shows nothing)
    assert within(persistent.saves_s, measured), (persistent.saves_s, measured)


def test_the_large_attribute_is_found_by_the_attribute_walk_with_its_pickled_size() -> None:
    dataset = Carries(records=20_000, length=64)
    (found,) = large_attributes(dataset)
    assert found.path == "Carries.records" and 20e6 < found.nbytes < 21e6 and found.kind == "list of 20,000 bytes"
    transfer = measure_transfer(dataset)
    assert transfer.nbytes >= found.nbytes and transfer.large == [found]


def test_a_loader_without_workers_has_no_start_up_to_split() -> None:
    assert measure_startup(DataLoader(PlantedDataset(8), batch_size=4)) is None


def test_the_report_shows_the_start_up_section_in_text_json_and_markdown() -> None:
    loader = DataLoader(PlantedDataset(32), batch_size=8, num_workers=2, worker_init_fn=slow_init, multiprocessing_context="fork")
    report = Report(
        workload="w", device="sim:10", num_workers=2, batch_size=8, steps=4, warmup=1, pool=1, threshold=0.05, strategy="linear"
    )
    report.startup = measure_startup(loader)
    assert "Start-up (2 workers, fork" in report.to_table() and "worker_init_fn" in report.to_table()
    assert "#### Start-up" in report.to_markdown()
    data = json.loads(report.to_json())
    assert data["startup"]["start_method"] == "fork" and data["startup"]["fixes"][0]["name"] == "persistent_workers=True"


@pytest.mark.slow
def test_a_dataset_that_carries_a_large_list_under_forkserver_is_named_and_its_lighter_form_saves_the_projection() -> None:
    """150 MB pickled to each of 2 workers at every start; the fix applied: the same dataset without the list."""
    multiprocessing.set_forkserver_preload(["__main__", "torch", "tests.fakes", __name__])  # the server imports once, as a real job's would

    def make(records: int):
        return DataLoader(Carries(records, length=64), batch_size=8, num_workers=2, multiprocessing_context="forkserver")

    first_batch_s(make(0))  # the fork server started
    startup = measure_startup(make(150_000))
    assert startup.transfer.large[0].path == "Carries.records" and startup.transfer.nbytes > 150e6
    assert dict(startup.parts)[TRANSFER] > 0
    lighter = fix(startup, "a lighter Carries")
    measured = statistics.median(first_batch_s(make(150_000)) - first_batch_s(make(0)) for _ in range(3))
    assert within(lighter.saves_s, measured), (lighter.saves_s, measured, startup.lines())
