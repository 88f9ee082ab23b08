"""The loader-settings fix: what a short ``tune`` sweep recommends, as a rewrite of the user's DataLoader call.

The fast tests plant each setting's measurement at tune's own seams (``_measure_bound``, ``_measure_setting``), as
tests/test_tune.py does: no loader runs, so they decide how the candidate is derived, not what the machine measures.
The one measuring test (slow) runs the sweep and the compare run on a planted sleep cost.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
import torchvision.transforms as T
from torch.utils.data import DataLoader

from fastpipe._system import usable_cores
from fastpipe.diagnosis._options import MeasureOptions
from fastpipe.errors import PipelineError
from fastpipe.experiments._fix import RECOMMENDED, fix, plan, tune_candidate
from fastpipe.experiments._fix_candidates import build_candidates, sweep_counts
from fastpipe.workloads import Workload
from tests.fakes import Fast, PlantedDataset

QUICK = MeasureOptions(steps=4, warmup=1, budget=2.0, precision=0.03)


def workload_with(workers: int, prefetch: int | None = None, raw_ms: float = 0.0) -> Workload:
    dataset = PlantedDataset(length=400, raw_ms=raw_ms, transform=T.Compose([Fast()]))
    loader = DataLoader(dataset, batch_size=4, num_workers=workers, prefetch_factor=prefetch)
    return Workload(loader=loader, step=lambda batch: None, name="planted")


def planted(monkeypatch: pytest.MonkeyPatch, rate, bound: float = 10.0) -> list[tuple[int, int]]:
    """Plant the device bound (steps/s) and each setting's steps/s, ``rate(workers, prefetch)``; returns the settings
    measured, in order."""
    tune_module = importlib.import_module("fastpipe.experiments._tune")
    measured: list[tuple[int, int]] = []

    def measure_bound(workload, device, options):
        return SimpleNamespace(steps_per_s=bound, noise=0.01, step_times=[]), 1000

    def measure_setting(workload, device, options):
        loader = workload.loader
        measured.append((loader.num_workers, loader.prefetch_factor))
        return SimpleNamespace(steps_per_s=rate(*measured[-1]), noise=0.01, cpu_util=0.5, system_cpu_util=0.5, step_times=[])

    monkeypatch.setattr(tune_module, "_measure_bound", measure_bound)
    monkeypatch.setattr(tune_module, "_measure_setting", measure_setting)
    return measured


def test_the_sweep_tries_doubling_counts_up_to_the_cores() -> None:
    assert sweep_counts(1) == [1]
    assert sweep_counts(2) == [1, 2]
    assert sweep_counts(6) == [1, 2, 4, 6]
    assert sweep_counts(48) == [1, 2, 4, 8, 16, 32, 48]


needs_two_cores = pytest.mark.skipif(usable_cores() < 2, reason="the sweep tries 2 workers only with 2 usable cores")


@needs_two_cores
def test_a_loader_with_one_worker_gets_the_count_tune_recommends(monkeypatch: pytest.MonkeyPatch) -> None:
    # one worker: 200 ms a step; two reach the 100 ms device step, so the sweep stops there (prefetch 4 not tried)
    measured = planted(monkeypatch, lambda workers, prefetch: 5.0 * workers)
    workload = workload_with(workers=1)
    tuned = tune_candidate(workload, "sim:100", QUICK)
    assert measured == [(1, 2), (2, 2)]
    assert tuned.name == "num_workers 1 -> 2 (tune's choice)" and tuned.not_tried is None
    assert tuned.code.startswith("DataLoader(..., num_workers=2)  #") and "`fastpipe tune SPEC` measures every count" in tuned.code
    assert (tuned.workload.loader.num_workers, tuned.workload.loader.prefetch_factor) == (2, 2)
    assert workload.loader.num_workers == 1  # the user's loader is left as it was
    candidates, _ = build_candidates(workload, tuned)
    assert tuned in candidates and not any(c.name.startswith("num_workers 1 -> ") and c is not tuned for c in candidates)


@needs_two_cores
def test_a_deeper_queue_is_offered_where_tune_measured_it_shorter(monkeypatch: pytest.MonkeyPatch) -> None:
    # a second worker gains nothing (200 ms both), a queue of 4 batches per worker reaches the device step
    measured = planted(monkeypatch, lambda workers, prefetch: 10.0 if prefetch == 4 else 5.0)
    tuned = tune_candidate(workload_with(workers=1), "sim:100", QUICK)
    assert measured == [(1, 2), (2, 2), (1, 4)]
    assert tuned.name == "prefetch_factor 2 -> 4 (tune's choice)"
    assert tuned.code.startswith("DataLoader(..., num_workers=1, prefetch_factor=4)  #")
    assert (tuned.workload.loader.num_workers, tuned.workload.loader.prefetch_factor) == (1, 4)


def test_a_loader_without_workers_gets_one_and_the_default_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    # one worker already reaches the device step: neither more workers nor a deeper queue is tried
    measured = planted(monkeypatch, lambda workers, prefetch: 10.0)
    tuned = tune_candidate(workload_with(workers=0), "sim:100", QUICK)
    assert measured == [(1, 2)]
    assert tuned.name == "num_workers 0 -> 1 (tune's choice)" and tuned.code.startswith("DataLoader(..., num_workers=1)  #")


@needs_two_cores
def test_a_loader_already_at_tunes_choice_gets_no_such_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    planted(monkeypatch, lambda workers, prefetch: 5.0 * workers)
    workload = workload_with(workers=2, prefetch=2)
    tuned = tune_candidate(workload, "sim:100", QUICK)
    assert tuned.workload is None and tuned.not_tried.startswith("already at tune's choice, num_workers=2 and prefetch_factor=2")
    candidates, _ = build_candidates(workload, tuned)
    assert [c.name for c in candidates if c.workload is not None and "workers" in c.addresses] == []


def test_a_sweep_that_fails_is_not_tried_with_why(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*_, **__):
        raise PipelineError("stage 'Decode' raised ValueError: bad file")

    planted(monkeypatch, lambda workers, prefetch: 5.0)
    monkeypatch.setattr(importlib.import_module("fastpipe.experiments._tune"), "_measure_setting", fail)
    tuned = tune_candidate(workload_with(workers=1), "sim:100", QUICK)
    assert tuned.workload is None and tuned.not_tried.startswith("the short tune sweep failed: PipelineError: stage 'Decode'")


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 16 workers built, never started
def test_the_sweep_stays_short_on_many_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    # a pipeline that scales with every worker, far from the bound, on 16 cores: 5 counts, not tune's 18
    monkeypatch.setattr(importlib.import_module("fastpipe.experiments._fix"), "usable_cores", lambda: 16)
    measured = planted(monkeypatch, lambda workers, prefetch: 0.5 * workers, bound=100.0)
    tuned = tune_candidate(workload_with(workers=1), "sim:10", QUICK)
    assert [w for w, _ in measured] == [1, 2, 4, 8, 16, 16] and measured[-1] == (16, 4)
    assert tuned.name == "num_workers 1 -> 16 (tune's choice)"


def test_the_plan_counts_the_sweep_and_its_cost() -> None:
    workload = workload_with(workers=1)
    found = plan(workload, MeasureOptions(steps=4, warmup=1, budget=5.0), step_ms=50.0)
    sweep = 1 + len(sweep_counts(usable_cores())) + 2
    assert f"a short tune sweep picks (up to {sweep} measurements first)" in found.tried[-1]
    rungs = len(found.tried) + 1  # every candidate and the original
    assert found.at_most_s == pytest.approx(rungs * (2.0 + 5.0) + 5.0 + sweep * 5.0)


@pytest.mark.slow
def test_fix_measures_the_tuned_count_against_the_original() -> None:
    # 4 samples x 15 ms = 60 ms a batch for one worker against a 40 ms step; two workers bring the step to the bound.
    # The costs are sleeps: the second worker overlaps its batches even on a loaded 2-core machine.
    if usable_cores() < 2:
        pytest.skip("the sweep tries 2 workers only with 2 usable cores")
    report = fix(workload_with(workers=1, raw_ms=15), device="sim:40", options=MeasureOptions(steps=6, warmup=2, budget=4.0))
    tuned = [r for r in report.results if "(tune's choice)" in r.name]
    assert [r.name for r in tuned] == ["num_workers 1 -> 2 (tune's choice)"], report.to_table()
    assert tuned[0].status == RECOMMENDED and tuned[0].gain > 0.25 and "labels equal" in tuned[0].check, report.to_table()
    assert "apply: DataLoader(..., num_workers=2)" in report.to_table()
