"""Issue 32: a busy neighbour must not move the blame.

The in-worker timing reads every window with all its clocks at both ends (a preemption inside a reading once put
its wall time in one window and its run-queue time in the next, which made a free raw load look like it waited);
time that is no stage's own goes to a "worker overhead" row; a stage is called waiting only when its own blocked
time is above its noise; the split uses CPU and own waits where the machine is shared; more workers are advised only
with a projected gain from the free cores. The last tests diagnose planted pipelines beside a real neighbour.
"""

from __future__ import annotations

import json

import pytest
import torchvision.transforms as T
from torch.utils.data import DataLoader

from fastpipe import diagnose
from fastpipe.diagnosis.stagecost._timing import OVERHEAD_STAGE, BatchTimings, TimedDataset, _ledger
from fastpipe.diagnosis.verdict._attribute import Attribution, worker_costs
from fastpipe.diagnosis.verdict._report import Bottleneck
from fastpipe.stages import RAW_STAGE
from tests.fakes import quick_options
from tests.fakes.benchmark_scripts import load_benchmark
from tests.fakes.ladder import plan_and_results

_PLANTED = load_benchmark("neighbour")  # the benchmark's planted parts: a CPU burn, a free stage, random images
Burn, Free, RandomImages = _PLANTED.Burn, _PLANTED.Free, _PLANTED.RandomImages


# ----- the timing: one window, all clocks ------------------------------------------------------
def test_each_stage_window_holds_its_own_cpu_and_run_queue_time() -> None:
    # in this process: a free stage right after a 2 ms one. Before, a free stage's CPU and run-queue windows began
    # at the previous stage's end (so they held the harness between them) while its wall time was the pipeline's own
    # narrower timer: CPU and run queue beyond the wall time, and the difference landed in the raw load's wall
    dataset = RandomImages(T.Compose([Burn(2.0), Free()]))
    from fastpipe.diagnosis.discovery._pipeline import find_pipeline

    pipeline, _ = find_pipeline(dataset)
    timed = TimedDataset(dataset, pipeline)
    for i in range(10):
        timed[i]
    _ledger().take()
    for i in range(100):
        timed[i]
    taken = _ledger().take()
    wall, cpu, runq = (taken.stages["Free"][i] / 100 for i in range(3))
    assert cpu <= wall + 5e-6 and runq <= wall + 5e-6, taken.stages
    timed = [name for name in taken.stages if name != OVERHEAD_STAGE]
    for name, (w, c, q, *_) in taken.stages.items():  # no window holds more CPU and run queue than wall time
        # up to 5 µs a sample and window: the clocks are read in turn; the overhead row is the runner's window less
        # each stage's, so it carries the reading error of all of them
        windows = 1 + len(timed) if name == OVERHEAD_STAGE else 1
        assert c + q <= w * 1.02 + windows * 100 * 5e-6, (name, taken.stages)


def _record(stages: dict[str, list[float]], samples: int = 8) -> BatchTimings:
    """A batch's timings from per-sample figures: four times in ms, then two switch counts."""
    scale = [samples / 1000] * 4 + [samples] * 2
    return BatchTimings(samples=samples, stages={k: [v * f for v, f in zip(vals, scale)] for k, vals in stages.items()})


def test_time_other_threads_held_is_the_overhead_rows_but_a_sleeping_stage_keeps_its_own() -> None:
    from fastpipe.diagnosis.stagecost._measure import summarize

    # per sample, in ms: wall, CPU, run queue, other threads' busy time, switches. The raw load computes 0.2 ms and was
    # blocked 1.0 ms while the feeder thread ran 1.1 ms: held. Sleep sleeps 10 ms while the feeder ran 1 ms beside it.
    batches = [
        _record({RAW_STAGE: [1.5 + d, 0.2, 0.3, 1.1, 0, 0], "Sleep": [10.2 + d, 0.1, 0.1, 1.0, 8, 0], "collate": [0.2, 0.2, 0, 0, 0, 0]})
        for d in (0.0, 0.01, -0.01, 0.02)
    ]
    stages, samples = summarize(batches, ["Sleep"], 2)
    by = {s.name: s for s in stages}
    assert [s.name for s in stages] == [RAW_STAGE, "Sleep", "collate", "worker overhead"] and samples == 32
    raw, sleep, overhead = by[RAW_STAGE], by["Sleep"], by["worker overhead"]
    assert raw.held_ms_per_sample == pytest.approx(1.0, abs=0.02) and raw.blocked_ms_per_sample < 0.02
    assert raw.ms_per_sample == pytest.approx(0.5, abs=0.02)  # its own: CPU and run queue
    assert sleep.held_ms_per_sample == 0 and sleep.blocked_ms_per_sample == pytest.approx(10.0, abs=0.02)
    assert overhead.ms_per_sample == pytest.approx(1.0, abs=0.02) and overhead.held_ms_per_sample == pytest.approx(1.0, abs=0.02)
    assert sum(s.ms_per_sample for s in stages) == pytest.approx(1.5 + 10.2 + 0.2, abs=0.02)  # still the busy time
    assert sleep.voluntary_switches == pytest.approx(8)


# ----- the verdict ------------------------------------------------------------------------------
def test_a_stage_waits_only_when_its_own_blocked_time_is_above_its_noise() -> None:
    # wall, CPU, run queue, held by other threads, own blocked, its noise (ms a sample). The raw load's 0.6 ms of
    # unexplained time is within its noise (±0.8): it computes. Taken as wall - CPU - run queue (1.0 ms), it waited.
    rows = {
        RAW_STAGE: (1.5, 0.2, 0.3, 0.4, 0.6, 0.8),
        "Burn": (3.0, 3.0, 0.0, 0.0, 0.0, 0.0),
        "collate": (0.2, 0.2, 0.0, 0.0, 0.0, 0.0),
    }
    costs = worker_costs(rows)
    assert not costs[RAW_STAGE].waits and costs[RAW_STAGE].own_ms == pytest.approx(0.2)
    assert not costs["Burn"].waits
    alone = worker_costs({RAW_STAGE: (1.5, 0.2, 0.3, 0.4, 0.6, 0.1), "collate": rows["collate"]})
    assert alone[RAW_STAGE].waits  # the same time above a small noise, and most of the pipeline's time, does count
    sleeps = worker_costs({"Sleep": (12.5, 0.2, 0.1, 0.0, 12.2, 0.3), "collate": rows["collate"]})
    assert sleeps["Sleep"].waits and sleeps["Sleep"].own_ms == pytest.approx(12.4)


def test_on_a_shared_machine_the_span_is_split_by_cpu_even_below_saturation() -> None:
    # other processes used 35% of the cores, the diagnosis's own tree 50%: not saturated, but shared. The free stage
    # A took the ladder step (a neighbour's burst); the split gives the span to B, by CPU and its own waits
    # (the sample point runs well below the 20 ms device step, so nothing hides under it: only the sharing splits)
    ms = {"device": 20, "host": 20, "sample": 40, "after:B": 41, "after:A": 40.5, "raw": 100, "baseline": 101}
    plan, results = plan_and_results(ms)
    for r in results.values():
        r.cpu_util, r.system_cpu_util = 0.5, 0.85 if r.cache_point not in ("device", "host") else 0.3
    costs = worker_costs({"raw load": (0.4, 0.05), "A": (0.3, 0.01), "B": (40.0, 14.0, 26.0), "C": (0.02, 0.02)})
    attribution = Attribution(plan, results, 0.05, 4, 2, costs=costs, cores=2)
    components = {c.stage: c for c in attribution.components(0.101)}
    named = [c.stage for c in sorted(components.values(), key=lambda c: -c.added_ms) if attribution.named(c)]
    inside = [stage for stage in named if stage not in ("collate/IPC", "host-to-device copy")]  # the loop's own parts
    assert inside == ["B"] and components["B"].basis == "saturated split", named


def test_more_workers_are_advised_only_with_a_projected_gain_from_the_free_cores() -> None:
    from fastpipe.diagnosis.verdict._caveats import waiting_text

    costs = worker_costs({RAW_STAGE: (12.5, 2.0, 0.1, 0.0, 10.4, 0.2), "collate": (0.3, 0.3, 0.0, 0.0, 0.0, 0.0)})
    b = Bottleneck(
        stage=RAW_STAGE, kind="raw load", added_ms=40, noise_ms=1, share_of_baseline=0.5, between=("raw", "baseline"), cpu_saturated=False
    )
    b.cpu_ratio, b.waits = 2.0 / 12.5, True
    # 4 samples a 10 ms step: 0.4 samples/ms; 2 workers give 2 / 12.7 = 0.16 a ms; 2 free cores allow 2 / 2.3 = 0.87
    roomy = waiting_text(b, costs, 10.0, 4, 2, workers=2, free_cores=2.0)
    assert roomy is not None and "about 6 workers would keep up" in roomy and "projected gain of up to 154%" in roomy, roomy
    # a neighbour took 1.7 of the 2 cores: 0.3 / 2.3 = 0.13 samples a ms, less than 2 workers already deliver
    crowded = waiting_text(b, costs, 10.0, 4, 2, workers=2, free_cores=0.3)
    assert crowded is not None and "would keep up" not in crowded and "projected to gain 0%" in crowded, crowded
    assert "1.7 of the 2 cores were used by other processes" in crowded


# ----- small stages apart from culprits (rule 7) ----------------------------------------------------
def _named(stage: str, ms: float, *, at_least: bool = False, in_worker: float | None = None) -> Bottleneck:
    return Bottleneck(stage, "transform", ms, 5.0, ms / 1000, ("after:" + stage, "raw"), False, at_least=at_least, in_worker_ms=in_worker)


def test_a_stage_under_a_tenth_of_the_input_time_is_a_small_cost_listed_apart() -> None:
    from fastpipe.diagnosis.verdict._attribute import mark_small_costs
    from fastpipe.diagnosis.verdict._report import Report

    # toy:naive beside two busy loops, in its proportions: 720 ms of input a step; ConvertColor crossed the threshold
    named = [
        _named(RAW_STAGE, 412.0),
        _named("RandomMask", 137.0),
        _named("ConvertColor", 31.0),
        _named("PILToTensor", 20.0, at_least=True, in_worker=113.0),  # hidden under the step: its in-worker cost counts
    ]
    mark_small_costs(named, 720.0)
    assert [b.minor for b in named] == [False, False, True, False]
    report = Report("w", "sim:290", 2, 256, 4, 1, 1, 0.05, "linear", baseline_step_ms=1010.0, device_step_ms=290.0)
    report.bottlenecks = named
    text = report.to_table()
    culprits, small = text.split("Stages that cost time per step", 1)[1].split("Smaller costs", 1)
    assert "ConvertColor" in small and "ConvertColor" not in culprits, text
    assert all(stage in culprits for stage in (RAW_STAGE, "RandomMask", "PILToTensor")), text
    assert json.loads(report.to_json())["bottlenecks"][2]["minor"] is True


def test_the_first_named_stage_is_never_a_small_cost() -> None:
    from fastpipe.diagnosis.verdict._attribute import mark_small_costs

    named = [_named("A", 30.0), _named("B", 20.0)]  # a pipeline that is hardly input-bound: 500 ms of input, 50 named
    mark_small_costs(named, 500.0)
    assert [b.minor for b in named] == [False, True]
    alone = [_named("A", 30.0), _named("B", 20.0)]
    mark_small_costs(alone, None)  # no baseline: nothing to compare with, nothing marked
    assert not any(b.minor for b in alone)


# ----- beside a real neighbour (slow: each diagnosis runs ~1 minute on 2 loaded cores) ------------------
PLANTED = {
    "free raw load, 3 ms transform": (lambda: RandomImages(T.Compose([Burn(3.0), Free(), Free(), Free()]), side=224), "Burn", False),
    "sleeping raw load": (lambda: RandomImages(T.Compose([Free()]), sleep_ms=12.0), RAW_STAGE, True),
}


@pytest.mark.slow
@pytest.mark.parametrize("neighbour", ["training", "busy"])
@pytest.mark.parametrize("case", sorted(PLANTED))
def test_planted_pipelines_beside_a_neighbour(neighbour: str, case: str) -> None:
    jobs = load_benchmark("neighbour_job")
    build, planted, sleeps = PLANTED[case]
    proc = jobs.start(neighbour)
    try:
        loader = DataLoader(build(), batch_size=8, num_workers=2)
        report = diagnose(loader, lambda batch: None, device="sim:10", options=quick_options(steps=6, warmup=2, budget=8.0))
    finally:
        jobs.stop(proc)
    named = [b.stage for b in report.bottlenecks]
    assert named and named[0] == planted, report.to_table()
    assert not [stage for stage in named if stage.startswith("Free")], report.to_table()
    for b in report.bottlenecks:
        if b.stage == planted:
            assert b.waits is sleeps, report.to_table()
        elif b.waits is not None:
            assert not b.waits, f"{b.stage} is CPU work and was called waiting:\n{report.to_table()}"
