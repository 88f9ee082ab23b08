"""Stage costs timed inside the workers, on planted sleep costs that hold on a loaded 2-core machine."""

from __future__ import annotations

import argparse
import json
import math
import pickle
import time

import pytest
import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader, IterableDataset, default_collate

from fastpipe.diagnosis.ladder._results import ExperimentResult
from fastpipe.diagnosis.stagecost import (
    COLLATE_LABEL,
    OVERHEAD_STAGE,
    RAW_LABEL,
    StageCost,
    StageCosts,
    _Ledger,
    measure_stage_costs,
    timed_loader,
)
from fastpipe.diagnosis.verdict._report import Bottleneck, Report
from fastpipe.diagnosis.verdict._saturation import explain_saturation
from fastpipe.errors import ConfigError, PipelineError
from tests.fakes import Fast, NoTransformDataset, PlantedDataset, Raise, Slow
from tests.fakes.cli import tiny_toy_argv

# Input-bound by construction: a sample costs 30 + 2 + 15 = 47 ms, so a batch of 4 takes a worker
# ~190 ms and two workers deliver a batch every ~95 ms, against a 40 ms simulated step.
STEP = "sim:40"
RAW_MS, SLOW_MS, FAST_MS = 30, 15, 2


def planted_loader(workers: int = 2, **kwargs) -> DataLoader:
    transform = T.Compose([Fast(FAST_MS), Slow(SLOW_MS), Fast(0)])
    return DataLoader(PlantedDataset(length=400, raw_ms=RAW_MS, transform=transform), batch_size=4, num_workers=workers, **kwargs)


def costs_of(loader: DataLoader, **kwargs) -> StageCosts:
    kwargs.setdefault("steps", 8)
    kwargs.setdefault("warmup", 2)
    return measure_stage_costs(loader, kwargs.pop("device", STEP), step=lambda batch: None, **kwargs)


def test_planted_costs_are_ranked_and_sum_to_the_worker_time() -> None:
    costs = costs_of(planted_loader())
    assert [s.name for s in costs.stages] == ["raw load", "Fast", "Slow", "Fast#2", "collate", "worker overhead"]
    assert [s.name for s in costs.ranked()[:3]] == ["raw load", "Slow", "Fast"]
    ms = {s.name: s.ms_per_sample for s in costs.stages}
    # a sleep lasts at least its time; a busy machine may add a few ms, never take any away
    assert RAW_MS <= ms["raw load"] < RAW_MS + 12
    assert SLOW_MS <= ms["Slow"] < SLOW_MS + 8
    assert FAST_MS <= ms["Fast"] < FAST_MS + 5
    assert ms["Fast#2"] < 1 and ms["collate"] < 3
    assert sum(s.share for s in costs.stages) == pytest.approx(1.0)
    raw = costs.stage("raw load")
    assert raw.samples_per_s_alone == pytest.approx(2 * 1000 / raw.ms_per_sample)
    # the independent reference: the throughput says how long each worker spent per sample
    assert costs.measured_worker_ms_per_sample is not None
    assert 0.8 <= costs.coverage <= 1.2, costs.to_table()
    # sleeps cost wall time, not CPU
    assert costs.stage("Slow").cpu_ms_per_sample < 0.2 * SLOW_MS
    assert costs.samples >= costs.steps * 4
    # the timing's own CPU per sample, measured in-process: microseconds against milliseconds of stages
    # (a ratio, not a machine's figure: under 2% of the stages' own time per sample, which is ~49 ms here)
    own_ms = sum(s.ms_per_sample for s in costs.stages if s.name != OVERHEAD_STAGE)
    assert costs.timing_us_per_sample is not None and costs.timing_us_per_sample / 1000 < 0.02 * own_ms


@pytest.mark.slow
def test_timing_does_not_perturb_throughput_and_the_check_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    # an A/B on a shared machine: one retry, so a burst of someone else's load cannot fail it alone
    for attempt in range(2):
        costs = costs_of(planted_loader(), check_overhead=True)
        assert costs.untimed_steps_per_s is not None
        if costs.overhead_within_noise and abs(costs.overhead) < 0.1:
            break
    else:
        pytest.fail(f"timing perturbed throughput beyond noise twice:\n{costs.to_table()}")

    # control: the same check catches timing that costs 15 ms a sample (~30% of the pipeline)
    slow_end = _Ledger.end_sample

    def end_sample_slowly(self, *args: float) -> None:
        time.sleep(0.015)
        slow_end(self, *args)

    monkeypatch.setattr(_Ledger, "end_sample", end_sample_slowly)
    slowed = costs_of(planted_loader(), check_overhead=True)
    assert slowed.overhead_within_noise is False and slowed.overhead > 0.15, slowed.to_table()


def test_workers_zero_runs_in_the_main_process() -> None:
    costs = costs_of(planted_loader(workers=0), steps=3, warmup=1)
    assert [s.name for s in costs.ranked()[:2]] == ["raw load", "Slow"]
    assert costs.measured_worker_ms_per_sample is None and costs.os_worker_cpu_ms_per_sample is None
    assert any("num_workers=0" in note for note in costs.notes)


def test_dataset_without_transform_gets_raw_load_and_collate() -> None:
    costs = costs_of(DataLoader(NoTransformDataset(), batch_size=4, num_workers=1), steps=3, warmup=1)
    # the worker-overhead row (time no stage's own, charged to none) shows only when there was such time to move
    assert [s.name for s in costs.stages if s.name != OVERHEAD_STAGE] == ["raw load", "collate"]
    assert any("no transform stages" in note for note in costs.notes)


class SleepyStream(IterableDataset):
    def __iter__(self):
        for i in range(400):
            time.sleep(0.005)
            yield torch.zeros(2)


def test_iterable_dataset_is_timed_whole() -> None:
    costs = costs_of(DataLoader(SleepyStream(), batch_size=4, num_workers=1), steps=3, warmup=1)
    # the worker-overhead row (time no stage's own, charged to none) shows only when there was such time to move
    assert [s.name for s in costs.stages if s.name != OVERHEAD_STAGE] == ["raw load", "collate"]
    assert costs.stage("raw load").ms_per_sample >= 5
    assert any("IterableDataset" in note for note in costs.notes)


def test_stages_show_in_a_profiler_trace() -> None:
    loader, _ = timed_loader(planted_loader(workers=0))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for i, (batch, timings) in enumerate(loader):
            assert timings.samples == 4 and isinstance(batch[0], torch.Tensor)
            if i == 1:
                break
    names = {event.name for event in prof.events()}
    assert {RAW_LABEL, "fastpipe/Fast", "fastpipe/Slow", "fastpipe/Fast#2", COLLATE_LABEL} <= names


def test_errors_name_their_stage() -> None:
    broken = DataLoader(PlantedDataset(length=400, transform=T.Compose([Fast(), Raise("planted failure")])), batch_size=4, num_workers=1)
    with pytest.raises(PipelineError, match="planted failure") as info:
        costs_of(broken, steps=2, warmup=0)
    assert info.value.stage == "Raise"

    def bad_collate(samples):
        raise TypeError("cannot stack these")

    with pytest.raises(PipelineError, match="cannot stack") as info:
        costs_of(DataLoader(PlantedDataset(length=400), batch_size=4, num_workers=1, collate_fn=bad_collate), steps=2, warmup=0)
    assert info.value.stage == "collate"


def test_user_objects_are_untouched() -> None:
    loader = planted_loader(workers=1)
    dataset_before = pickle.dumps(loader.dataset)
    costs_of(loader, steps=2, warmup=1)
    assert pickle.dumps(loader.dataset) == dataset_before
    assert loader.collate_fn is default_collate and loader.num_workers == 1


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="DataLoader"):
        measure_stage_costs([1, 2], STEP, step=lambda b: None)
    with pytest.raises(ConfigError, match="step"):
        measure_stage_costs(planted_loader(), STEP)
    with pytest.raises(ConfigError, match="steps"):
        measure_stage_costs(planted_loader(), STEP, step=lambda b: None, steps=0)


# ----- the saturation caveat --------------------------------------------------------------------
def hand_costs(raw_ms: float, mask_ms: float, other_ms: float, workers: int = 2, cores: int = 2, cpu_fraction: float = 1.0) -> StageCosts:
    """Stage costs written down, not measured: the explanation is arithmetic on them."""
    parts = [
        ("raw load", "raw load", raw_ms),
        ("RandomMask", "transform", mask_ms),
        ("ConvertColor", "transform", other_ms),
        ("collate", "collate", 0.0),
    ]
    total = sum(ms for _, _, ms in parts)
    stages = [
        StageCost(name, kind, ms, ms * cpu_fraction, ms / total, ms / total, workers * 1000 / ms if ms else math.inf)
        for name, kind, ms in parts
    ]
    return StageCosts(
        workload="hand",
        device="sim:290",
        num_workers=workers,
        batch_size=256,
        cores=cores,
        steps=10,
        warmup=3,
        stages=stages,
        samples=2560,
        steps_per_s=1.0,
        noise=0.01,
        cpu_util=0.95,
        system_cpu_util=0.97,
    )


def saturated_report(stage: str, between: tuple[str, str] = ("after:RandomMask", "raw"), cpu: float = 0.97) -> Report:
    report = Report(
        workload="hand",
        device="sim:290",
        num_workers=2,
        batch_size=256,
        steps=10,
        warmup=3,
        pool=1,
        threshold=0.05,
        strategy="linear",
        device_bound_steps_per_s=2.0,
    )
    for point in between:
        report.experiments.append(
            ExperimentResult(
                name=point,
                cache_point=point,
                steps_per_s=1.0,
                fraction_of_bound=0.5,
                spread=0.1,
                noise=0.01,
                cpu_util=cpu,
                system_cpu_util=0.99,
            )
        )
    report.bottlenecks.append(
        Bottleneck(
            stage=stage,
            kind="raw load",
            added_ms=100.0,
            noise_ms=5.0,
            share_of_baseline=0.3,
            between=between,
            cpu_saturated=cpu >= 0.9,
            recommendation="",
        )
    )
    return report


def test_saturation_says_when_the_stage_itself_is_slow() -> None:
    # bound 2 steps/s x 256 = 512 samples/s: 2 workers have 2 / 512 s = 3.91 ms of CPU per sample; raw load takes 6
    lines = explain_saturation(saturated_report("raw load"), hand_costs(raw_ms=6.0, mask_ms=1.0, other_ms=0.5))
    assert len(lines) == 1 and "slow by itself" in lines[0] and "6.00 ms" in lines[0] and "3.91 ms" in lines[0]
    assert "CPU per sample, largest first: raw load" in lines[-1]


def test_saturation_within_the_noise_of_the_budget_is_borderline() -> None:
    lines = explain_saturation(saturated_report("raw load"), hand_costs(raw_ms=3.8, mask_ms=1.0, other_ms=0.5))
    assert len(lines) == 1 and "borderline" in lines[0] and "slow by itself" not in lines[0]


def test_saturation_says_when_the_whole_pipeline_exceeds_the_cores() -> None:
    # raw load alone allows 2 / 3 ms = 667 samples/s (enough), but all stages (6 ms) only 333, and at
    # 512 samples/s they need 3.1 cores of a 2-core machine
    lines = explain_saturation(saturated_report("raw load"), hand_costs(raw_ms=3.0, mask_ms=2.5, other_ms=0.5))
    assert len(lines) == 1 and "not slow by itself" in lines[0]
    assert "the pipeline's CPU as a whole must shrink" in lines[0] and "3.1 cores" in lines[0]
    # the same times with 8 cores: the workers, not the cores, fall short
    more = explain_saturation(saturated_report("raw load"), hand_costs(raw_ms=3.0, mask_ms=2.5, other_ms=0.5, cores=8))
    assert "more than 2 workers give" in more[0] and "fastpipe tune" in more[0]


def test_saturation_elsewhere_and_not_saturated() -> None:
    fits = explain_saturation(saturated_report("RandomMask"), hand_costs(raw_ms=1.0, mask_ms=1.0, other_ms=0.5))
    assert len(fits) == 1 and "together fit the budget" in fits[0] and "other processes" in fits[0]
    copy = explain_saturation(saturated_report("host-to-device copy", ("host", "sample")), hand_costs(3.0, 2.5, 0.5))
    assert "training process" in copy[0]
    assert explain_saturation(saturated_report("raw load", cpu=0.5), hand_costs(6.0, 1.0, 0.5)) == []


def test_renderings() -> None:
    costs = hand_costs(raw_ms=5.0, mask_ms=4.3, other_ms=0.5)
    costs.untimed_steps_per_s, costs.untimed_noise = 1.01, 0.01
    data = json.loads(costs.to_json())
    assert data["schema"] == "fastpipe.stagecost/1" and [s["name"] for s in data["stages"]][:2] == ["raw load", "RandomMask"]
    assert data["stages"][-1]["samples_per_s_alone"] is None  # collate cost nothing here: unbounded
    assert data["overhead_within_noise"] is True and data["total_ms_per_sample"] == pytest.approx(9.8)
    lines = costs.table_lines()
    assert lines[0].startswith("stage") and "of worker CPU" in lines[0]
    assert any(line.startswith("RandomMask") and "4.30" in line and "43.9%" in line for line in lines)
    assert "| raw load |" in costs.to_markdown() and "Largest: raw load" in costs.to_table()


def test_cli_costs(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from fastpipe.commands import costs as command

    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    out = tmp_path / "costs.json"
    args = parser.parse_args(tiny_toy_argv("costs", "sim:5", "--num-workers", "1", "--json", str(out)))
    assert args.handler(args) == 0
    assert "RandomMask" in capsys.readouterr().out
    assert json.loads(out.read_text())["stages"][0]["name"] == "raw load"
