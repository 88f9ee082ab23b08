"""Time attribution on planted costs: each named stage, and its milliseconds per step, within 25% of what was planted.

Costs are sleeps (tests/fakes.py): they hold on a loaded 2-core machine and add up per worker
the way per-sample costs do, so a planted cost per step is ``ms per sample x batch / workers``.
"""
from __future__ import annotations

import time

import pytest
import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader, Dataset

from fastpipe import diagnose
from fastpipe.diagnosis._attribute import Attribution
from fastpipe.diagnosis._plan import make_plan
from fastpipe.diagnosis._report import ExperimentResult
from tests.fakes import Fast, PlantedDataset, Slow, plain_loop_step_ms

BATCH, WORKERS = 4, 2


def per_step_ms(ms_per_sample: float) -> float:
    return ms_per_sample * BATCH / WORKERS


def run(dataset, device: str, **kwargs):
    loader = DataLoader(dataset, batch_size=kwargs.pop("batch", BATCH), num_workers=WORKERS, **kwargs.pop("loader", {}))
    kwargs.setdefault("steps", 6)
    kwargs.setdefault("warmup", 2)
    kwargs.setdefault("budget", 2.0)
    kwargs.setdefault("stage_costs", False)
    return diagnose(loader, lambda batch: None, device, progress=False, **kwargs)


def test_two_expensive_stages_are_both_named_with_their_time() -> None:
    # device step 10 ms; raw load and one transform each add 20 device steps (200 ms) to every step.
    # In steps/s the raw load's drop is 1/210 - 1/410 steps/s, ~0.2% of the bound: invisible as a throughput
    # difference, but 200 ms a step as a time.
    planted = 20 * 10
    dataset = PlantedDataset(raw_ms=planted * WORKERS / BATCH, transform=T.Compose([Fast(), Slow(planted * WORKERS / BATCH)]))
    report = run(dataset, "sim:10")
    named = {b.stage: b for b in report.bottlenecks}
    assert set(named) == {"raw load", "Slow"}, report.to_table()
    for b in named.values():
        assert b.added_ms == pytest.approx(planted, rel=0.25), report.to_table()
    assert report.baseline_step_ms == pytest.approx(10 + 2 * planted, rel=0.25)
    # the figures against an independent measurement: the same loop timed on its own, outside fastpipe, takes the
    # device step plus every time the report attributes (within 25%: sleeps hold on a loaded 2-core machine)
    loop_ms = plain_loop_step_ms(DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS), "sim:10")
    attributed = report.device_step_ms + sum(c.added_ms for c in report.components)
    assert attributed == pytest.approx(loop_ms, rel=0.25), (attributed, loop_ms, report.to_table())


class BigRaw(Dataset):
    """Raw samples are large tensors (12 MB); the pipeline slices a small crop, then masks it in place."""

    def __init__(self, transform) -> None:
        self.transform = transform

    def __len__(self) -> int:
        return 400

    def __getitem__(self, index: int):
        time.sleep(0.02)  # a slow raw load, so the pipeline is input-bound and every point is measured
        x = torch.full((3, 1024, 1024), float(index % 5))
        return self.transform(x), 0


class SliceCrop:
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :64, :64]  # a view: microseconds


class AddOneInPlace:
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.add_(1)  # in place, through the crop's view, into the cached raw tensor: the cache must copy it


def test_a_cheap_stage_after_a_large_cached_tensor_is_not_named() -> None:
    # The raw point caches the 12 MB raw tensor and, since AddOneInPlace writes through the crop's view into it,
    # copies it for every sample: ~5 ms a sample, 8 samples over 2 workers, some 20 ms a step on top of the
    # Slow stage's 80. Without the copy measured in the workers and taken out, SliceCrop (a view: microseconds)
    # would be named for that time.
    transform = T.Compose([SliceCrop(), AddOneInPlace(), Slow(20)])
    report = run(BigRaw(transform), "sim:40", batch=8, threshold=0.15)
    assert "SliceCrop" not in {b.stage for b in report.bottlenecks}, report.to_table()
    assert "Slow" in {b.stage for b in report.bottlenecks}, report.to_table()
    raw = report.experiment("raw")
    assert raw is not None and raw.copy_ms_per_sample > 0, "the raw point's copy of the 12 MB tensor was timed in the workers"


def test_a_cheap_pipeline_with_main_process_work_under_the_step_is_not_input_bound() -> None:
    # 32 uint8 samples of 3x512x512 = 25 MB a batch: the main process pins (copies) every batch, ~10 ms here,
    # well under half of a 60 ms step; an asynchronous step lets the host do it while the device runs
    dataset = PlantedDataset(shape=(3, 512, 512), dtype=torch.uint8, transform=T.Compose([Fast()]), length=2000)
    report = run(dataset, "sim:60", batch=32, loader={"pin_memory": True}, threshold=0.05)
    assert report.verdict == "not input-bound", report.to_table()
    assert not report.bottlenecks


def _result(point: str, ms: float, noise: float = 0.01) -> ExperimentResult:
    return ExperimentResult(name=point, cache_point=point, steps_per_s=1000 / ms, fraction_of_bound=float("nan"), spread=0.0,
                            noise=noise, cpu_util=0.5, system_cpu_util=0.5)


def test_attribution_ranks_time_not_throughput_differences() -> None:
    # the numbers: RandomMask 3.173 -> 1.951 steps/s (+197 ms), raw load 1.523 -> 0.991 (+352 ms)
    from fastpipe.stages import Stage, TransformPipeline

    pipeline = TransformPipeline((), "transform", [Stage("RandomMask", lambda x: x)])
    plan = make_plan(pipeline, None)
    results = {"device": _result("device", 290), "host": _result("host", 290), "sample": _result("sample", 1000 / 3.173),
               "raw": _result("raw", 1000 / 1.951), "baseline": _result("baseline", 1000 / 0.991)}
    results["raw"] = _result("raw", 1000 / 1.523)
    results["after:RandomMask"] = _result("after:RandomMask", 1000 / 3.173)
    plan.points = ["device", "host", "sample", "raw", "baseline"]
    plan.components = ["host-to-device copy", "collate/IPC", "RandomMask", "raw load"]
    attribution = Attribution(plan, results, 0.05, 256, 2)
    components = {c.stage: c for c in attribution.components(1 / 0.991)}
    assert components["raw load"].added_ms == pytest.approx(1000 / 0.991 - 1000 / 1.523)
    assert components["raw load"].added_ms > components["RandomMask"].added_ms
    assert attribution.significant("raw", "baseline") and not attribution.significant("device", "host")
    assert components["host-to-device copy"].at_least  # the upper point is the device itself
