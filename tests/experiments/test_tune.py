"""The worker / prefetch tuner on planted sleep costs: where it stops, what it recommends, memory warnings."""

from __future__ import annotations

import argparse
import importlib
import json
from types import SimpleNamespace

import pytest
import torchvision.transforms as T
from torch.utils.data import DataLoader, default_collate

from fastpipe._tree import tree_nbytes
from fastpipe.diagnosis._options import MeasureOptions
from fastpipe.errors import ConfigError, PipelineError
from fastpipe.experiments._tune import TuneResult, _memory_failure, shm_estimate, tune
from tests.fakes import Fast, PlantedDataset
from tests.fakes.cli import tiny_toy_argv

# The sim step loop adds the loader's own ~2 ms per step to the bound's; a 10% tolerance keeps
# that (and a busy machine) from deciding, while the planted gaps below are 25% or more.
TOLERANCE = 0.1


def loader_for(raw_ms: float, shape: tuple[int, ...] = (3, 8, 8), workers: int = 2) -> DataLoader:
    dataset = PlantedDataset(length=400, shape=shape, raw_ms=raw_ms, transform=T.Compose([Fast()]))
    return DataLoader(dataset, batch_size=4, num_workers=workers)


def run(loader: DataLoader, device: str, **kwargs) -> TuneResult:
    kwargs.setdefault("tolerance", TOLERANCE)
    return tune(loader, step=lambda batch: None, device=device, options=MeasureOptions(steps=8, warmup=2), **kwargs)


def settings(result: TuneResult) -> list[tuple[int, int]]:
    return [(t.num_workers, t.prefetch_factor) for t in result.trials]


def test_stops_at_one_worker_when_one_reaches_the_bound() -> None:
    # 4 samples x 2 ms = 8 ms a batch against a 100 ms step: one worker keeps up with room to spare
    result = run(loader_for(raw_ms=2), "sim:100")
    assert settings(result) == [(1, 2)], result.to_table()  # neither 2 workers nor prefetch 4 were tried
    assert result.recommended is result.trials[0] and result.reaches_bound
    assert "the fewest possible" in result.summary
    assert any("reached the device bound" in stop for stop in result.stops)
    assert any("prefetch_factor 4" in stop for stop in result.stops)


def test_finds_the_smallest_worker_count_that_reaches_the_bound() -> None:
    # 4 x 15 ms = 60 ms a batch per worker: one worker gives ~16.7 steps/s, two give 33 > the bound of 25
    result = run(loader_for(raw_ms=15), "sim:40")
    assert settings(result) == [(1, 2), (2, 2)], result.to_table()
    one, two = result.trials
    assert one.fraction_of_bound < 0.8 and result.recommended is two and result.reaches_bound
    assert "1 worker did not" in result.summary and "smallest worker count" in result.summary
    for trial in result.trials:  # memory is watched on every setting
        assert trial.rss_peak_bytes and trial.rss_peak_bytes > 0
        assert trial.shm_estimate_bytes == shm_estimate(result.batch_bytes, trial.num_workers, trial.prefetch_factor)


def test_stops_when_more_workers_do_not_help() -> None:
    # a pageable copy of 196 kB at 0.005 GB/s blocks the host for ~39 ms a step, whatever the workers do
    result = run(loader_for(raw_ms=2, shape=(3, 64, 64)), "sim:10,h2d_gbps=0.005")
    workers_tried = [t.num_workers for t in result.trials if t.phase == "workers"]
    assert workers_tried == [1, 2], result.to_table()
    # the second worker's step is the first's within noise, or shorter by drift far under the half of it a worker could cut
    assert any("no gain beyond noise" in stop or "under half of the 50%" in stop for stop in result.stops), result.stops
    assert not result.reaches_bound and result.recommended.num_workers == 1
    assert "No setting tried reaches the device bound" in result.summary


def test_a_setting_that_would_exhaust_shm_is_skipped_with_a_warning() -> None:
    loader = loader_for(raw_ms=15)
    batch_bytes = tree_nbytes(default_collate([loader.dataset[i] for i in range(4)]))
    budget = (shm_estimate(batch_bytes, 1, 2) + shm_estimate(batch_bytes, 2, 2)) // 2  # room for one worker, not two
    result = run(loader, "sim:40", shm_budget_bytes=budget)
    # two workers, and then a deeper queue for one, would each hold 6 batches: neither is run
    assert [(t.num_workers, t.prefetch_factor, t.status) for t in result.trials] == [
        (1, 2, "measured"),
        (2, 2, "skipped"),
        (1, 4, "skipped"),
    ]
    assert result.trials[1].steps_per_s is None
    assert any("Bus error" in w and "/dev/shm" in w and "--shm-size" in w for w in result.warnings)
    assert result.recommended is result.trials[0]
    assert "SKIPPED" in result.to_table()


def test_memory_failures_become_clear_messages() -> None:
    bus = PipelineError("the data pipeline failed: RuntimeError: DataLoader worker (pid 123) is killed by signal: Bus error.")
    assert "/dev/shm filled up" in _memory_failure(bus, "3 workers")
    oom = PipelineError("DataLoader worker (pid 7) is killed by signal: Killed.")
    assert "OOM" in _memory_failure(oom, "3 workers")
    assert _memory_failure(PipelineError("stage 'Raise' raised ValueError"), "3 workers") is None


def test_renders_and_serializes() -> None:
    result = run(loader_for(raw_ms=2), "sim:100")
    data = json.loads(result.to_json())
    assert data["schema"] == "fastpipe.tune/1" and data["recommended"]["num_workers"] == 1
    assert data["trials"][0]["fraction_of_bound"] > 0 and data["bound_steps_per_s"] > 0
    table = result.to_table()
    assert "device bound" in table and "<- recommended" in table and "Recommended:" in table


def test_bad_arguments() -> None:
    loader = loader_for(raw_ms=0)
    with pytest.raises(ConfigError, match="max_workers"):
        run(loader, "sim:10", max_workers=0)
    with pytest.raises(ConfigError, match="prefetch"):
        run(loader, "sim:10", prefetch_factors=[0])
    with pytest.raises(ConfigError, match="step"):
        tune(loader, device="sim:10")


def test_cli_tune(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from fastpipe.commands import tune as command

    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    out = tmp_path / "tune.json"
    args = parser.parse_args(tiny_toy_argv("tune", "sim:50", "--max-workers", "1", "--prefetch-factors", "2", "--json", str(out)))
    assert args.handler(args) == 0
    captured = capsys.readouterr()
    assert "Recommended:" in captured.out and "tried num_workers=1" in captured.err
    assert json.loads(out.read_text())["recommended"]["num_workers"] == 1
    with pytest.raises(SystemExit):
        parser.parse_args(["tune", "toy:naive", "--prefetch-factors", "two"])


# ----- planted measurements: the seams where the bound and each setting's measurement come in --------------------
def planted(monkeypatch, rates: dict[int, float], bound: float, noise: float = 0.02, interrupt_at: int | None = None) -> list[int]:
    """Plant the device bound and each worker count's steps/s (no loader runs); returns the worker counts measured."""
    tune_module = importlib.import_module("fastpipe.experiments._tune")

    measured: list[int] = []

    def measure_bound(workload, device, options):
        return SimpleNamespace(steps_per_s=bound, noise=noise, step_times=[]), 1000

    def measure_setting(workload, device, options):
        workers = workload.loader.num_workers
        if workers == interrupt_at:
            raise KeyboardInterrupt
        measured.append(workers)
        return SimpleNamespace(steps_per_s=rates[workers], noise=noise, cpu_util=0.5, system_cpu_util=0.5, step_times=[])

    monkeypatch.setattr(tune_module, "_measure_bound", measure_bound)
    monkeypatch.setattr(tune_module, "_measure_setting", measure_setting)
    return measured


def test_far_from_the_bound_halving_the_step_is_a_gain(monkeypatch) -> None:
    # issue 11: bound 10 steps/s; 1 worker 0.4, 2 workers 0.8. In steps/s the gain (0.4) is under 5% of the bound;
    # in time per step it halves the step (2500 -> 1250 ms against a 100 ms device step).
    planted(monkeypatch, {1: 0.4, 2: 0.8, 3: 0.8, 4: 0.8}, bound=10.0)
    result = tune(loader_for(raw_ms=0), step=lambda b: None, device="sim:100", max_workers=4, prefetch_factors=[2])
    assert result.recommended is not None and result.recommended.num_workers >= 2, result.to_table()
    assert result.recommended.num_workers == 2  # 3 workers are no shorter than 2: the cheapest within noise of the best
    assert result.trials[0].step_ms == pytest.approx(2500.0) and "1250.0" in result.to_table()


def test_gains_within_the_tolerance_of_the_device_step_do_not_count(monkeypatch) -> None:
    # 2 workers shorten the step by 3 ms against a 100 ms device step: under the 5% tolerance (5 ms)
    planted(monkeypatch, {1: 1000 / 203, 2: 1000 / 200, 3: 1000 / 200}, bound=10.0, noise=0.0)
    result = tune(loader_for(raw_ms=0), step=lambda b: None, device="sim:100", max_workers=3, prefetch_factors=[2])
    assert [t.num_workers for t in result.trials] == [1, 2] and result.recommended.num_workers == 1, result.to_table()


@pytest.mark.parametrize("noise, tried", [(0.2, [1, 2]), (0.01, [1, 2, 3])])
def test_noise_in_time_from_both_settings_decides(monkeypatch, noise: float, tried: list[int]) -> None:
    # 2500 vs 1800 ms: a 700 ms gain (28%, over half of the 50% a second worker could give). With 20% noise on each,
    # two standard errors of the difference are ~1230 ms: no gain beyond noise, so 3 workers are not tried; with 1%
    # noise (~62 ms) it is a gain and the sweep goes on.
    planted(monkeypatch, {1: 0.4, 2: 1 / 1.8, 3: 1 / 1.8}, bound=10.0, noise=noise)
    result = tune(loader_for(raw_ms=0), step=lambda b: None, device="sim:100", max_workers=3, prefetch_factors=[2], extensions=0)
    assert [t.num_workers for t in result.trials] == tried, result.to_table()
    assert any(f"at {tried[-1]} workers: no gain beyond noise" in stop for stop in result.stops), result.stops
    # the recommendation may not claim 1 worker as good as 2: a 700 ms gap exceeds twice the tolerance of the longer
    # step (2 x 5% of 2500 ms = 250 ms)
    assert result.recommended.num_workers == 2


def test_far_from_the_bound_each_added_worker_keeps_counting(monkeypatch) -> None:
    # a pipeline that scales with its workers and needs 25 of them to reach a 100 ms step: from 20 to 21 workers the
    # step shortens by 1/21 (under 5% of it), still the whole share one more worker can give, so the sweep goes on
    # until a worker gains less than the tolerance of the device step (22 -> 23 workers: 113.6 -> 108.7 ms, under 5 ms);
    # the recommendation is the cheapest within 5% of the best (22 workers, 4.5% longer than 23's step)
    planted(monkeypatch, {w: 0.4 * w for w in range(1, 31)}, bound=10.0, noise=0.005)
    result = tune(loader_for(raw_ms=0), step=lambda b: None, device="sim:100", max_workers=30, prefetch_factors=[2])
    assert [t.num_workers for t in result.trials if t.phase == "workers"] == list(range(1, 24)), result.to_table()
    assert any("at 23 workers: no gain beyond noise" in stop for stop in result.stops), result.stops
    assert result.recommended.num_workers == 22


def test_a_gain_under_half_of_what_the_added_workers_could_give_stops_the_sweep(monkeypatch) -> None:
    # 52.2 -> 50.0 ms with a second worker (4% against the 50% it could give at most): drift between two runs on a
    # busy machine, or a gain not worth a worker's memory; the first worker is recommended
    planted(monkeypatch, {1: 1000 / 52.2, 2: 1000 / 50.0, 3: 1000 / 50.0}, bound=100.0, noise=0.0002)
    result = tune(loader_for(raw_ms=0), step=lambda b: None, device="sim:10", max_workers=3, prefetch_factors=[2])
    assert [t.num_workers for t in result.trials if t.phase == "workers"] == [1, 2], result.to_table()
    assert any("under half of the 50% that the added workers could give" in stop for stop in result.stops), result.stops
    assert result.recommended.num_workers == 1


def test_interrupted_sweep_keeps_the_settings_it_measured(monkeypatch) -> None:
    planted(monkeypatch, {1: 0.4, 2: 0.8}, bound=10.0, interrupt_at=3)
    result = tune(loader_for(raw_ms=0), step=lambda b: None, device="sim:100", max_workers=4, prefetch_factors=[2])
    assert result.interrupted and [t.num_workers for t in result.trials] == [1, 2]
    table = result.to_table()
    assert "Interrupted (Ctrl-C) after 2 setting(s)" in table and "2500.0" in table and "1250.0" in table
    assert result.recommended.num_workers == 2 and "so far" in result.summary


def test_interrupted_before_the_bound_says_so(monkeypatch) -> None:
    tune_module = importlib.import_module("fastpipe.experiments._tune")

    def measure_bound(*_, **__):
        raise KeyboardInterrupt

    monkeypatch.setattr(tune_module, "_measure_bound", measure_bound)
    result = tune(loader_for(raw_ms=0), step=lambda b: None, device="sim:100")
    assert result.interrupted and result.trials == [] and "no setting was measured" in result.summary
    assert "device bound" in result.to_table()


def make_planted_workload():
    return loader_for(raw_ms=0), lambda batch: None


def test_cli_tune_interrupted_prints_the_partial_table(monkeypatch, capsys: pytest.CaptureFixture[str]) -> None:
    from fastpipe.cli import main

    planted(monkeypatch, {1: 0.4, 2: 0.8}, bound=10.0, interrupt_at=3)
    code = main(["tune", f"{__name__}:make_planted_workload", "--device", "sim:100", "--max-workers", "4", "--prefetch-factors", "2"])
    out = capsys.readouterr().out
    assert code == 130
    assert "Interrupted (Ctrl-C)" in out and "2500.0" in out and "1250.0" in out and "<- recommended" in out


def test_budget_and_precision_reach_every_measurement(monkeypatch) -> None:
    tune_module = importlib.import_module("fastpipe.experiments._tune")
    seen = []

    def measure_bound(workload, device, options):
        seen.append(options)
        return SimpleNamespace(steps_per_s=10.0, noise=0.0, step_times=[]), 1000

    def measure_setting(workload, device, options):
        seen.append(options)
        return SimpleNamespace(steps_per_s=10.0, noise=0.0, cpu_util=0.5, system_cpu_util=0.5, step_times=[])

    monkeypatch.setattr(tune_module, "_measure_bound", measure_bound)
    monkeypatch.setattr(tune_module, "_measure_setting", measure_setting)
    given = MeasureOptions(budget=3.0, precision=0.05)
    tune(loader_for(raw_ms=0), step=lambda b: None, device="sim:100", options=given, prefetch_factors=[2])
    assert len(seen) >= 2 and all(o.budget == 3.0 and o.precision == 0.05 for o in seen)
    assert seen[0] is given  # the bound is measured with the object passed in, not a copy of its knobs
    with pytest.raises(ConfigError, match="budget"):
        tune(loader_for(raw_ms=0), step=lambda b: None, device="sim:100", options=MeasureOptions(budget=0))


def test_worker_counts_choose_the_counts_the_sweep_may_try(monkeypatch) -> None:
    # a pipeline that scales with its workers, far from the bound: the sweep tries exactly the counts given
    planted(monkeypatch, {w: 0.4 * w for w in range(1, 9)}, bound=10.0, noise=0.005)
    result = tune(loader_for(raw_ms=0), step=lambda b: None, device="sim:100", worker_counts=[4, 1, 2], prefetch_factors=[2])
    assert [t.num_workers for t in result.trials] == [1, 2, 4], result.to_table()
    assert "worker sweep: tried 1, 2, 4" in result.stops and result.recommended.num_workers == 4
    with pytest.raises(ConfigError, match="worker counts"):
        tune(loader_for(raw_ms=0), step=lambda b: None, device="sim:100", worker_counts=[0, 2])
