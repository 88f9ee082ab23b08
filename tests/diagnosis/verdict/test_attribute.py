"""Time attribution on planted costs: each named stage, and its milliseconds per step, within 25% of what was planted.

Costs are sleeps (tests/fakes): they hold on a loaded 2-core machine and add up per worker
the way per-sample costs do, so a planted cost per step is ``ms per sample x batch / workers``.
"""

from __future__ import annotations

import time

import pytest
import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader, Dataset

from fastpipe import diagnose
from fastpipe.diagnosis.ladder._plan import make_plan
from fastpipe.diagnosis.verdict._attribute import Attribution
from tests.fakes import Fast, PlantedDataset, Slow, plain_loop_step_ms, quick_options
from tests.fakes.ladder import ladder_result, plan_and_results

BATCH, WORKERS = 4, 2


def per_step_ms(ms_per_sample: float) -> float:
    return ms_per_sample * BATCH / WORKERS


def run(dataset, device: str, **kwargs):
    loader = DataLoader(dataset, batch_size=kwargs.pop("batch", BATCH), num_workers=WORKERS, **kwargs.pop("loader", {}))
    kwargs.setdefault("steps", 6)
    kwargs.setdefault("warmup", 2)
    kwargs.setdefault("budget", 2.0)
    kwargs.setdefault("stage_costs", False)
    return diagnose(loader, lambda batch: None, device=device, options=quick_options(**kwargs))


@pytest.mark.slow  # 6-25 s on 2 cores: kept out of `make test` (under 10 min); `make test-all` runs it
def test_two_expensive_stages_are_both_named_with_their_time() -> None:
    # device step 10 ms; raw load and one transform each add 20 device steps (200 ms) to every step.
    # In steps/s the raw load's drop is 1/210 - 1/410 steps/s, ~0.2% of the bound: invisible as a throughput
    # difference, but 200 ms a step as a time.
    planted = 20 * 10
    dataset = PlantedDataset(raw_ms=planted * WORKERS / BATCH, transform=T.Compose([Fast(), Slow(planted * WORKERS / BATCH)]))
    report = run(dataset, "sim:10")
    named = {b.stage: b for b in report.bottlenecks}
    # the loop's own parts are real costs near the 0.5 ms threshold (the simulated copy of each batch): they may be
    # named too, after the planted stages; the free transform never is
    assert {"raw load", "Slow"} <= set(named) <= {"raw load", "Slow", "collate/IPC", "host-to-device copy"}, report.to_table()
    assert [b.stage for b in report.bottlenecks][:2] in (["raw load", "Slow"], ["Slow", "raw load"]), report.to_table()
    for stage in ("raw load", "Slow"):
        assert named[stage].added_ms == pytest.approx(planted, rel=0.25), report.to_table()
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


@pytest.mark.slow  # 6-25 s on 2 cores: kept out of `make test` (under 10 min); `make test-all` runs it
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
    # well under half of a 120 ms step; an asynchronous step lets the host do it while the device runs. (At a 60 ms
    # step, the workers' own 25 MB batches through shared memory came near the step on a busy machine: the pipeline
    # was then really input-bound there, 1 run in 2 at load average 3.)
    dataset = PlantedDataset(shape=(3, 512, 512), dtype=torch.uint8, transform=T.Compose([Fast()]), length=2000)
    report = run(dataset, "sim:120", batch=32, loader={"pin_memory": True}, threshold=0.05)
    assert report.verdict == "not input-bound", report.to_table()
    assert not report.bottlenecks


def test_attribution_ranks_time_not_throughput_differences() -> None:
    # the numbers: RandomMask 3.173 -> 1.951 steps/s (+197 ms), raw load 1.523 -> 0.991 (+352 ms)
    from fastpipe.stages import Stage, TransformPipeline

    pipeline = TransformPipeline((), "transform", [Stage("RandomMask", lambda x: x)])
    plan = make_plan(pipeline, None)
    results = {
        "device": ladder_result("device", 290),
        "host": ladder_result("host", 290),
        "sample": ladder_result("sample", 1000 / 3.173),
        "raw": ladder_result("raw", 1000 / 1.951),
        "baseline": ladder_result("baseline", 1000 / 0.991),
    }
    results["raw"] = ladder_result("raw", 1000 / 1.523)
    results["after:RandomMask"] = ladder_result("after:RandomMask", 1000 / 3.173)
    plan.points = ["device", "host", "sample", "raw", "baseline"]
    plan.components = ["host-to-device copy", "collate/IPC", "RandomMask", "raw load"]
    attribution = Attribution(plan, results, 0.05, 256, 2)
    components = {c.stage: c for c in attribution.components(1 / 0.991)}
    assert components["raw load"].added_ms == pytest.approx(1000 / 0.991 - 1000 / 1.523)
    assert components["raw load"].added_ms > components["RandomMask"].added_ms
    assert attribution.significant("raw", "baseline") and not attribution.significant("device", "host")
    assert components["host-to-device copy"].at_least  # the upper point is the device itself


# ----- the rules of _attribute on fake measurements (no measuring) ---------------------------------
def test_the_copy_discount_is_taken_only_where_the_workers_set_the_pace_over_the_workers_the_cores_run() -> None:
    # 8 workers on 2 cores: the copy (2 ms a sample, batch 8) costs 8 x 2 / min(8, 2) = 8 ms a step, not 8 x 2 / 8
    paced = {"device": 40, "host": 41, "sample": 42, "after:B": 80, "after:A": 81, "raw": 82, "baseline": 83}
    plan, results = plan_and_results(paced, copy_ms=2.0)
    attribution = Attribution(plan, results, 0.05, 8, 8, cores=2)
    assert attribution.parallelism == 2
    assert attribution.corrected_s("after:B") * 1000 == pytest.approx(80 - 8)
    assert attribution.corrected_s("baseline") * 1000 == pytest.approx(83)  # no copy there
    # main-process-limited: every point from the sample point down runs at 60 ms, the workers idle part of the time,
    # so their copy costs nothing: the step stays as measured and no stage gains or loses time by the discount
    limited = {"device": 40, "host": 41, "sample": 60, "after:B": 61, "after:A": 60.5, "raw": 61, "baseline": 61}
    plan, results = plan_and_results(limited, copy_ms=2.0)
    attribution = Attribution(plan, results, 0.05, 8, 8, cores=2)
    for point in ("after:B", "after:A", "raw"):
        assert attribution.corrected_s(point) * 1000 == pytest.approx(max(60, limited[point] - 8)), point
        assert attribution.corrected_s(point) * 1000 >= 60
    assert not any(attribution.significant(upper, lower) for upper, lower in zip(plan.points[2:], plan.points[3:]))


def _costed(ms: dict[str, float], costs: dict[str, tuple[float, float]], saturated: bool = True, **kwargs):
    from fastpipe.diagnosis.verdict._attribute import worker_costs

    plan, results = plan_and_results(ms)
    for r in results.values():
        r.cpu_util = 0.97 if saturated and r.cache_point not in ("device", "host") else 0.3
    return Attribution(plan, results, 0.05, 4, 2, costs=worker_costs(costs), cores=2, **kwargs)


def test_a_saturated_span_is_split_by_in_worker_cost_and_a_free_stage_is_vetoed() -> None:
    # the shape: the point below the expensive stage B runs at the device step, the free stage A tips the
    # saturated CPU over and takes the whole ladder step; the split gives the span's 60 ms to B by its cost
    ms = {"device": 40, "host": 40, "sample": 40, "after:B": 41, "after:A": 40.5, "raw": 100, "baseline": 101}
    costs = {"raw load": (0.05, 0.05), "A": (0.01, 0.01), "B": (15.0, 14.0), "C": (0.02, 0.02), "collate": (0.1, 0.1)}
    attribution = _costed(ms, costs)
    components = {c.stage: c for c in attribution.components(0.101)}
    named = sorted((c for c in components.values() if attribution.named(c)), key=lambda c: -c.added_ms)
    assert [c.stage for c in named] == ["B"]
    assert components["A"].ladder_ms == pytest.approx(59.5) and attribution.vetoed(components["A"])
    assert components["B"].basis == "saturated split" and components["B"].added_ms > 55
    # the split keeps the times adding up to the baseline step
    assert 40 + sum(c.added_ms for c in components.values()) == pytest.approx(101)


def test_without_in_worker_costs_the_ladder_alone_decides() -> None:
    ms = {"device": 40, "host": 40, "sample": 40, "after:B": 41, "after:A": 40.5, "raw": 100, "baseline": 101}
    plan, results = plan_and_results(ms)
    attribution = Attribution(plan, results, 0.05, 4, 2, cores=2)
    named = [c.stage for c in attribution.components(0.101) if attribution.named(c)]
    assert named == ["A"]  # today's rule, which the report caveats and says it fell back to


def test_a_noisy_ladder_names_by_in_worker_cost_with_the_reason() -> None:
    ms = {"device": 40, "host": 40, "sample": 40, "after:B": 60, "after:A": 61, "raw": 62, "baseline": 63}
    costs = {"raw load": (0.05, 0.05), "A": (0.01, 0.01), "B": (15.0, 14.0), "C": (0.02, 0.02)}
    # B's own step (after:B -> after:A) did not hold when remeasured: B is named by its in-worker cost (its CPU time,
    # 14 ms a sample: the 1 ms of wall beyond it is too small to count as waiting), x 4 samples / 2 workers
    noisy = _costed(ms, costs, saturated=False, unresolved={("after:B", "after:A"): "it did not hold"})
    components = {c.stage: c for c in noisy.components(0.063)}
    assert noisy.by_cost(components["B"]) == "it did not hold" and components["B"].in_worker_ms == pytest.approx(14.0 * 4 / 2)
    # a stage that costs nothing in the workers is not named by cost, however unsure the ladder was
    quiet = _costed(ms, costs, saturated=False, unresolved={("after:A", "raw"): "it did not hold"})
    assert quiet.by_cost({c.stage: c for c in quiet.components(0.063)}["A"]) is None


def test_waiting_is_told_from_waiting_for_a_core() -> None:
    from fastpipe.diagnosis.verdict._attribute import worker_costs

    # run-queue time counted by the OS: a stage that is only preempted does not wait; one that sleeps does
    costs = worker_costs({"raw load": (12.5, 0.2, 0.1), "Busy": (20.0, 5.0, 15.0), "collate": (0.3, 0.1, 0.1)})
    assert costs["raw load"].waits and costs["raw load"].own_ms == pytest.approx(12.4)
    assert not costs["Busy"].waits and costs["Busy"].own_ms == pytest.approx(5.0)
    # without it, the contention the computing stages show stands in
    costs = worker_costs({"raw load": (12.5, 0.2), "Busy": (20.0, 5.0), "collate": (0.3, 0.1)})
    assert costs["raw load"].waits and not costs["Busy"].waits


def test_a_run_that_names_nothing_still_names_the_largest_in_worker_costs() -> None:
    from fastpipe.diagnosis.verdict._attribute import worker_costs

    # only the device and the baseline were measured, and their difference did not beat the noise
    plan, results = plan_and_results({"device": 40, "baseline": 70})
    results["baseline"].noise = 0.3
    costs = worker_costs({"raw load": (9.0, 8.5), "A": (0.01, 0.01), "B": (3.0, 2.9), "C": (0.02, 0.02)})
    attribution = Attribution(plan, results, 0.05, 4, 2, costs=costs, cores=2)
    components = attribution.components(0.070)
    assert not any(attribution.named(c) for c in components)
    named = sorted(attribution.unnamed_costs(components), key=lambda b: -b.added_ms)
    assert [b.stage for b in named] == ["raw load", "B"] and all(b.basis == "in-worker cost" and b.why for b in named)
