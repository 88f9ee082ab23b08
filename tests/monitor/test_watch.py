"""fastpipe.watch: the input-bound share of a plain loop against planted costs, its lines, sinks and memory."""

from __future__ import annotations

import logging
import time

import pytest
import torch
from torch.utils.data import DataLoader

import fastpipe.loading
from fastpipe.monitor import WaitLedger, Watch, band_for, memory_snapshot
from tests.fakes import PlantedDataset
from tests.fakes.watch_settings import IDS, SETTINGS, TOLERANCE, Setting

STEPS = 20


def run_loop(batches, step_ms: float, epochs: int = 1) -> None:
    for _ in range(epochs):
        for _batch in batches:
            time.sleep(step_ms / 1000)


def planted_loader(setting: Setting, steps: int = STEPS) -> DataLoader:
    return DataLoader(PlantedDataset(length=steps, shape=(4,), raw_ms=setting.loader_ms), batch_size=1)


@pytest.mark.parametrize("setting", SETTINGS, ids=IDS)
def test_plain_loop_share_is_the_planted_one(setting: Setting) -> None:
    lines: list[str] = []
    watched = fastpipe.watch(planted_loader(setting), echo=lines.append, memory=False)
    run_loop(watched, setting.step_ms)
    summary = watched.summary()
    print(f"{setting.name}: planted {setting.truth:.1%}, reported {summary['input_bound_share']:.1%}")
    assert summary["steps"] == STEPS and summary["epochs"] == 1
    assert summary["input_bound_share"] == pytest.approx(setting.truth, abs=TOLERANCE)
    assert summary["band"] == band_for(setting.truth)
    assert lines[0].startswith("fastpipe.watch: epoch 1: 20 steps")
    hinted = any("fastpipe.diagnose(loader, step" in line for line in lines)
    assert hinted == (setting.truth >= 0.05)
    assert (summary["next_step"] is not None) == (setting.truth >= 0.05)


@pytest.mark.parametrize("setting", SETTINGS, ids=IDS)
def test_through_device_prefetcher_on_cpu(setting: Setting) -> None:
    prefetcher = fastpipe.DevicePrefetcher(planted_loader(setting), "cpu", depth=2)
    watched = fastpipe.watch(prefetcher, echo=False, memory=False)
    run_loop(watched, setting.step_ms)
    share = watched.summary()["input_bound_share"]
    print(f"{setting.name} through DevicePrefetcher(cpu): planted {setting.truth:.1%}, reported {share:.1%}")
    assert share == pytest.approx(setting.truth, abs=TOLERANCE)
    if setting.truth >= 0.05:
        hint = watched.next_step()
        assert 'fastpipe.diagnose(loader.loader, step, device="cpu", prefetch_depth=2)' in hint
        assert "DataLoader(batch_size=1, num_workers=0, pin_memory=False)" in hint


def test_bands() -> None:
    assert [band_for(s) for s in (0.0, 0.049, 0.05, 0.199, 0.2, 1.0)] == [
        "not input-bound",
        "not input-bound",
        "moderately input-bound",
        "moderately input-bound",
        "highly input-bound",
        "highly input-bound",
    ]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_ledger_arithmetic_with_a_fake_clock() -> None:
    """Start-up and first batch count; a loop that breaks out early is closed at its last batch."""
    ledger = WaitLedger(clock=FakeClock())
    ledger.start_epoch(0.0)
    ledger.batch(0.5, 0.5)  # start-up + first batch: 0.5 s blocked
    ledger.batch(0.1, 1.6)  # step 1.0 s, then 0.1 s blocked
    ledger.start_epoch(10.0)  # broke out: epoch 1 ends a typical step (1.0 s) after its last batch
    assert ledger.epochs[0].elapsed_s == pytest.approx(2.6)
    assert ledger.epochs[0].share == pytest.approx(0.6 / 2.6)
    assert ledger.epochs[0].first_wait_s == 0.5
    ledger.batch(0.0, 10.0)
    ledger.end_epoch(12.0)
    assert ledger.total.steps == 3
    assert ledger.total.share == pytest.approx(0.6 / 4.6)
    ledger.start_epoch(20.0)  # an iterator made and dropped before any batch leaves no epoch
    ledger.start_epoch(21.0)
    ledger.batch(1.0, 22.0)
    ledger.pause(23.0)  # validation mid-epoch: 10 s that count nowhere
    ledger.resume(33.0)
    ledger.end_epoch(34.0)
    assert len(ledger.epochs) == 3 and ledger.epochs[-1].elapsed_s == pytest.approx(3.0)


def test_every_n_steps_lines_and_epochs() -> None:
    lines: list[str] = []
    watched = fastpipe.watch(DataLoader(PlantedDataset(length=10, shape=(2,)), batch_size=2), every=2, echo=lines.append, memory=False)
    run_loop(watched, 0, epochs=2)
    assert [line.split(":")[1].strip() for line in lines if "next step" not in line] == [
        "steps 1-2",
        "steps 3-4",
        "epoch 1",
        "steps 6-7",
        "steps 8-9",
        "epoch 2",
    ]
    summary = watched.summary()
    assert summary["steps"] == 10 and summary["epochs"] == 2 and len(summary["per_epoch"]) == 2


def test_forwards_len_and_attributes() -> None:
    loader = DataLoader(PlantedDataset(length=12, shape=(2,)), batch_size=4)
    watched = Watch(loader, echo=False)
    assert len(watched) == 3 and watched.dataset is loader.dataset and watched.batch_size == 4
    assert [b[0].shape[0] for b in watched] == [4, 4, 4]


def test_logger_and_callable_sinks(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("fastpipe-test-watch")
    with caplog.at_level(logging.INFO, logger=logger.name):
        run_loop(fastpipe.watch(DataLoader(PlantedDataset(length=4, shape=(2,))), log=logger, echo=False), 0)
    assert any("fastpipe.watch: epoch 1: 4 steps" in r.getMessage() for r in caplog.records)
    received: list[dict] = []
    run_loop(fastpipe.watch(DataLoader(PlantedDataset(length=4, shape=(2,))), log=received.append, echo=False), 0)
    assert len(received) == 1
    assert {"fastpipe/input_bound_share", "fastpipe/wait_ms_per_step", "fastpipe/rss_mb"} <= set(received[0])


def test_tensorboard_writer_sink(tmp_path) -> None:
    tensorboard = pytest.importorskip("torch.utils.tensorboard")
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    writer = tensorboard.SummaryWriter(str(tmp_path))
    run_loop(fastpipe.watch(planted_loader(SETTINGS[0], steps=6), log=writer, echo=False), 5)
    writer.close()
    events = accumulator.EventAccumulator(str(tmp_path))
    events.Reload()
    (scalar,) = events.Scalars("fastpipe/input_bound_share")
    assert scalar.step == 6 and scalar.value > 0.2


def test_bad_arguments_say_what_to_fix() -> None:
    with pytest.raises(fastpipe.ConfigError, match="every must be a positive"):
        fastpipe.watch([], every=0)
    with pytest.raises(fastpipe.ConfigError, match="log must be"):
        fastpipe.watch([], log=42)


def test_watches_recycled_batches_unchanged() -> None:
    loader = DataLoader(PlantedDataset(length=8, shape=(3,)), batch_size=2, num_workers=1)
    expected = [b[0].clone() for b in loader]
    watched = fastpipe.watch(fastpipe.loading.recycled(loader), echo=False, memory=False)
    got = []
    for images, _ in watched:
        got.append(images.clone())
        fastpipe.loading.release((images, _))
    assert all(torch.equal(a, b) for a, b in zip(expected, got)) and len(got) == len(expected)
    assert watched.summary()["steps"] == 4


def test_memory_snapshot_reads_workers_while_they_run() -> None:
    loader = DataLoader(PlantedDataset(length=8, shape=(2,)), batch_size=2, num_workers=1)
    iterator = iter(loader)
    next(iterator)
    snapshot = memory_snapshot()
    del iterator
    assert snapshot.rss_bytes and snapshot.rss_bytes > 10 * 2**20
    assert len(snapshot.workers_uss_bytes) >= 1 and all(v > 0 for v in snapshot.workers_uss_bytes.values())
    assert snapshot.shm_total_bytes is None or snapshot.shm_free_bytes <= snapshot.shm_total_bytes
    assert "rss" in snapshot.line()
