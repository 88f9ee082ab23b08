"""The training process as a stage (fastpipe.diagnosis.unseen._main_process, verdict._main_process): a planted slow
sampler, an expensive collate without workers, pinning (timed with CUDA, skipped cleanly without), and the rule that
names a main-process part instead of the ladder's collate/IPC span."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import DataLoader, Sampler
from torch.utils.data._utils.collate import default_collate

import fastpipe
from fastpipe.diagnosis.ladder._plan import COLLATE
from fastpipe.diagnosis.unseen._main_process import MainPart, MainProcess, measure_main_process
from fastpipe.diagnosis.verdict._main_process import MAIN_PROCESS, name_main_process
from fastpipe.diagnosis.verdict._report import Bottleneck, Report
from tests.fakes import PlantedDataset, Sleep, quick_options

SAMPLER_MS = 3.0  # per index
COLLATE_MS = 20.0  # per batch


class SlowSampler(Sampler):
    """A sampler that costs ``ms`` of the training process per index (a weighting or bucketing sampler in Python)."""

    def __init__(self, n: int, ms: float = SAMPLER_MS) -> None:
        self.n, self.ms, self.epochs = n, ms, 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        self.epochs += 1
        for i in range(self.n):
            time.sleep(self.ms / 1000)
            yield i


def slow_collate(samples):
    time.sleep(COLLATE_MS / 1000)
    return default_collate(samples)


def test_a_slow_sampler_is_timed_per_index_in_the_training_process_and_the_users_is_not_advanced() -> None:
    sampler = SlowSampler(400)
    loader = DataLoader(PlantedDataset(400), batch_size=8, num_workers=2, sampler=sampler)
    main = measure_main_process(loader)
    part = main.part("sampler")
    assert part.ms_per_step >= 8 * SAMPLER_MS  # sleeps: a lower bound that holds on a loaded machine
    assert "ms per index" in part.detail and float(part.detail.split(" ms per index")[0]) >= SAMPLER_MS
    assert sampler.epochs == 0  # a copy was iterated
    assert main.part("collate").ms_per_step is None and "workers" in main.part("collate").skipped


def test_collate_without_workers_is_timed_and_its_fix_is_workers() -> None:
    loader = DataLoader(PlantedDataset(64), batch_size=8, num_workers=0, collate_fn=slow_collate)
    part = measure_main_process(loader).part("collate")
    assert part.ms_per_step >= COLLATE_MS
    assert "num_workers > 0" in part.advice(0)


def test_pinning_is_timed_with_cuda_and_skipped_cleanly_without() -> None:
    loader = DataLoader(PlantedDataset(64), batch_size=8, num_workers=0, pin_memory=True)
    part = measure_main_process(loader).part("pinning")
    if torch.cuda.is_available():
        assert part.ms_per_step is not None and part.ms_per_step > 0
    else:
        assert part.ms_per_step is None and "no CUDA" in part.skipped
    assert "fastpipe.loading.recycled" in part.advice(0)


def report_with(collate_ms: float) -> Report:
    report = Report(
        workload="w", device="sim:10", num_workers=2, batch_size=8, steps=4, warmup=1, pool=1, threshold=0.05, strategy="linear"
    )
    report.device_step_ms = 10.0
    span = Bottleneck(COLLATE, COLLATE, collate_ms, 1.0, 0.5, ("host", "sample"), False, recommendation="Collate/IPC: send less")
    report.components, report.bottlenecks = [span], [span]
    return report


def main_with(sampler_ms: float) -> MainProcess:
    return MainProcess(
        workers=2, batch_size=8, parts=[MainPart("sampler", sampler_ms, "x ms per index"), MainPart("collate", None, skipped="s")]
    )


def test_a_sampler_that_explains_the_collate_span_is_named_instead_of_it() -> None:
    report, main = report_with(30.0), main_with(25.0)
    assert name_main_process(report, main) == "sampler"
    (named,) = report.bottlenecks
    assert (named.stage, named.kind) == ("sampler", MAIN_PROCESS) and named.added_ms == 30.0
    assert "compute the epoch's order once" in named.recommendation and "class PrecomputedSampler" in named.snippet
    assert report.components[0].stage == COLLATE  # the table's row keeps the ladder's name for the span
    assert main.named == "sampler" and "[named: it costs the step]" in "\n".join(main.lines())


def test_a_sampler_that_explains_little_of_the_span_leaves_collate_ipc_named() -> None:
    report, main = report_with(30.0), main_with(5.0)
    assert name_main_process(report, main) is None
    assert report.bottlenecks[0].stage == COLLATE and main.named is None


@pytest.mark.slow
def test_diagnose_names_a_slow_sampler_as_the_main_processs_sampler_not_a_transform_or_the_raw_load() -> None:
    """Fails before this change: the ladder named the span 'collate/IPC', with advice to ship smaller batches."""
    dataset = PlantedDataset(4000, transform=Sleep(0.2))
    loader = DataLoader(dataset, batch_size=8, num_workers=2, sampler=SlowSampler(4000))
    report = fastpipe.diagnose(loader, lambda b: None, device="sim:10", options=quick_options(steps=8, budget=3, stage_costs=False))
    first = report.bottlenecks[0]
    assert (first.stage, first.kind) == ("sampler", "main process"), report.to_table()
    assert "sampler [main process]: adds" in report.to_table()
    assert not any(b.stage in ("Sleep", "raw load", COLLATE) for b in report.bottlenecks if b.added_ms > first.added_ms / 2)
    assert report.to_dict()["main_process"]["named"] == "sampler"
