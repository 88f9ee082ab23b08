"""The cache-bisection engine on planted bottlenecks, small and quick on short sim steps."""

from __future__ import annotations

import json
import pickle
import time

import numpy as np
import psutil
import pytest
import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader

from fastpipe import diagnose
from fastpipe.devices import parse_device
from fastpipe.diagnosis._options import TrainState
from fastpipe.errors import ConfigError, PipelineError
from tests.fakes import AddOne, Fast, NoTransformDataset, PlantedDataset, Raise, Slow, quick_options
from tests.fakes.cli import tiny_toy_argv

# Planted costs are twice the step, so they stand well above the DataLoader's own few milliseconds
# per batch and the jitter of a busy 2-core machine; the threshold is raised to match.
STEP = "sim:40"
PLANTED_MS = 40  # per sample: 4 samples over 2 workers = 80 ms a batch, twice the step
THRESHOLD = 0.15


def loader_for(dataset, workers: int = 2, batch: int = 4, **kwargs) -> DataLoader:
    return DataLoader(dataset, batch_size=batch, num_workers=workers, **kwargs)


def run(loader: DataLoader, **kwargs):
    kwargs.setdefault("steps", 8)
    kwargs.setdefault("warmup", 2)
    kwargs.setdefault("threshold", THRESHOLD)
    kwargs.setdefault("budget", 2.0)
    return diagnose(loader, lambda batch: None, device=kwargs.pop("device", STEP), options=quick_options(**kwargs))


def test_slow_middle_transform_is_named_and_no_other() -> None:
    transform = T.Compose([Fast(), Fast(), Slow(PLANTED_MS), Fast()])
    report = run(loader_for(PlantedDataset(transform=transform)))
    points = [e.cache_point for e in report.experiments]
    assert points == ["device", "host", "sample", "after:Slow", "after:Fast#2", "after:Fast", "raw", "baseline"]
    assert [b.stage for b in report.bottlenecks] == ["Slow"]
    assert report.bottlenecks[0].kind == "transform" and report.bottlenecks[0].between == ("after:Slow", "after:Fast#2")
    assert report.verdict in ("moderately input-bound", "highly input-bound")


def test_slow_raw_loading_is_named() -> None:
    report = run(loader_for(PlantedDataset(raw_ms=PLANTED_MS, transform=T.Compose([Fast(), Fast()]))))
    assert [(b.stage, b.kind) for b in report.bottlenecks] == [("raw load", "raw load")]
    assert report.bottlenecks[0].between == ("raw", "baseline")


def test_heavy_payload_is_the_copy() -> None:
    # 8 x 3x256x256 float32 = 6.3 MB a batch; at 0.08 GB/s a pageable copy takes ~80 ms against a 40 ms step
    dataset = PlantedDataset(shape=(3, 256, 256), transform=T.Compose([Fast()]))
    report = run(loader_for(dataset, batch=8), device="sim:40,h2d_gbps=0.08")
    assert report.bottlenecks, report.to_table()
    assert report.bottlenecks[0].kind in ("host-to-device copy", "collate/IPC")
    assert report.bottlenecks[0].kind == "host-to-device copy"  # by construction here: collate of 6 MB is ~1 ms
    assert all(b.kind != "transform" for b in report.bottlenecks)


def test_fast_pipeline_is_not_input_bound_and_stops_early() -> None:
    # a long step, so the loader's own per-batch milliseconds stay under the 5% band
    report = run(loader_for(PlantedDataset(transform=T.Compose([Fast(), Fast()]))), device="sim:150", threshold=0.05)
    assert report.verdict == "not input-bound" and not report.bottlenecks
    assert [e.cache_point for e in report.experiments] == ["device", "baseline"]
    assert any("not measured" in note for note in report.notes)


@pytest.mark.slow  # 6-25 s on 2 cores: kept out of `make test` (under 10 min); `make test-all` runs it
def test_bisect_finds_the_same_culprit_with_fewer_experiments() -> None:
    transform = T.Compose([Fast(), Fast(), Fast(), Slow(PLANTED_MS), Fast(), Fast()])
    report = run(loader_for(PlantedDataset(transform=transform)), strategy="bisect")
    assert [b.stage for b in report.bottlenecks] == ["Slow"]
    assert len(report.experiments) < 10  # linear measures device, host, sample, 5 after-points, raw and baseline


def test_in_place_transforms_do_not_pile_up() -> None:
    from fastpipe.diagnosis.discovery._pipeline import find_pipeline
    from fastpipe.diagnosis.ladder._cache import CachePointDataset

    dataset = PlantedDataset(transform=T.Compose([Fast(), AddOne(), AddOne()]))
    pipeline, _ = find_pipeline(dataset)
    for point in ("raw", "after:Fast", "after:AddOne"):
        cached = CachePointDataset(dataset, pipeline, point)
        values = {cached[i][0][0, 0, 0].item() for i in range(5)}
        assert len(values) == 1, f"{point}: values changed across calls: {values}"


def test_pool_cycles_through_distinct_samples() -> None:
    from fastpipe.diagnosis.discovery._pipeline import find_pipeline
    from fastpipe.diagnosis.ladder._cache import CachePointDataset

    dataset = PlantedDataset(transform=T.Compose([Fast()]))
    pipeline, _ = find_pipeline(dataset)
    cached = CachePointDataset(dataset, pipeline, "raw", pool=3)
    labels = [cached[i][1] for i in range(9)]
    assert labels == [0, 1, 2] * 3


@pytest.mark.slow  # 6-25 s on 2 cores: kept out of `make test` (under 10 min); `make test-all` runs it
def test_dataset_without_transform_reports_unavailable_points() -> None:
    report = run(loader_for(NoTransformDataset()), threshold=0.0)
    points = [e.cache_point for e in report.experiments]
    assert "device" in points and "baseline" in points
    unavailable = {u.cache_point: u.reason for u in report.unavailable}
    assert "raw" in unavailable and "transform" in unavailable["raw"]


def test_worker_error_names_its_stage_and_does_not_hang() -> None:
    transform = T.Compose([Fast(), Raise("planted failure")])
    with pytest.raises(PipelineError, match="planted failure") as info:
        run(loader_for(PlantedDataset(transform=transform)))
    assert info.value.stage == "Raise"


def test_raw_load_error_is_labelled() -> None:
    class Broken(PlantedDataset):
        def __getitem__(self, index):
            raise OSError("disk gone")

    with pytest.raises(PipelineError, match="disk gone") as info:
        run(loader_for(Broken(transform=T.Compose([Fast()]))))
    assert info.value.stage == "raw load"


def test_step_error() -> None:
    def step(batch):
        raise RuntimeError("CUDA out of memory (planted)")

    with pytest.raises(PipelineError, match="planted") as info:
        diagnose(loader_for(PlantedDataset(), workers=0), step, device="cpu", options=quick_options(steps=2, warmup=0))
    assert info.value.stage == "step"


def test_num_workers_zero_works_with_a_caveat() -> None:
    report = run(loader_for(PlantedDataset(transform=T.Compose([Slow(5)])), workers=0), steps=4)
    assert report.experiments and any("num_workers=0" in c for c in report.caveats)


def test_ctrl_c_returns_a_partial_report_and_stops_workers() -> None:
    calls = {"n": 0}

    def step(batch):  # a real step on the cpu device, interrupted mid-diagnosis
        time.sleep(0.04)
        calls["n"] += 1
        if calls["n"] == 25:
            raise KeyboardInterrupt

    before = {p.pid for p in psutil.Process().children(recursive=True)}  # e.g. multiprocessing's resource tracker
    loader = loader_for(PlantedDataset(transform=T.Compose([Slow(PLANTED_MS)])))
    report = diagnose(loader, step, device="cpu", options=quick_options(steps=8, warmup=2, budget=2))
    assert report.interrupted and 1 <= len(report.experiments) < 9
    assert {p.pid for p in psutil.Process().children(recursive=True)} - before == set()


def test_bad_arguments() -> None:
    loader = loader_for(PlantedDataset(), workers=0)
    with pytest.raises(ConfigError, match="DataLoader"):
        diagnose([1, 2, 3], lambda b: None, device=STEP)
    with pytest.raises(ConfigError, match="step"):
        diagnose(loader, None, device=STEP)
    with pytest.raises(ConfigError, match="strategy"):
        diagnose(loader, lambda b: None, device=STEP, options=quick_options(strategy="random"))


def test_nothing_the_user_owns_changes() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10), torch.nn.BatchNorm1d(10))
    model.eval()  # a mode the diagnosis must put back
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss()

    def step(batch):
        inputs, labels = batch
        model.train()
        loss = criterion(model(inputs), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    dataset = PlantedDataset(transform=T.Compose([Fast(), Slow(2)]))
    generator = torch.Generator().manual_seed(5)
    loader = DataLoader(dataset, batch_size=4, num_workers=2, shuffle=True, generator=generator)
    model_before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer_before = pickle.dumps(optimizer.state_dict())
    dataset_before = pickle.dumps(dataset)
    generator_before = generator.get_state().clone()
    rng_before = (torch.get_rng_state().clone(), pickle.dumps(np.random.get_state()))

    state = TrainState(model=model, optimizer=optimizer)
    report = diagnose(loader, step, device="cpu", options=quick_options(steps=4, warmup=1, budget=2.0, threshold=0.0), train_state=state)

    assert report.experiments  # it really ran
    after = model.state_dict()
    assert all(torch.equal(model_before[k], after[k]) for k in model_before)
    assert all(p.grad is None for p in model.parameters()) and not model.training
    assert pickle.dumps(optimizer.state_dict()) == optimizer_before
    assert pickle.dumps(dataset) == dataset_before and dataset.transform.transforms[1].ms == 2
    assert torch.equal(generator.get_state(), generator_before)
    assert torch.equal(torch.get_rng_state(), rng_before[0]) and pickle.dumps(np.random.get_state()) == rng_before[1]


def test_loader_settings_are_kept() -> None:
    from fastpipe.loading._rebuild import rebuild_loader

    def init(worker_id):
        pass

    def collate(batch):
        return batch

    loader = DataLoader(
        PlantedDataset(),
        batch_size=5,
        num_workers=2,
        shuffle=True,
        drop_last=True,
        collate_fn=collate,
        worker_init_fn=init,
        prefetch_factor=3,
        persistent_workers=True,
        timeout=7,
        multiprocessing_context="fork",
        generator=torch.Generator(),
    )
    rebuilt = rebuild_loader(loader, PlantedDataset(), timeout=60)
    for name in (
        "num_workers",
        "collate_fn",
        "pin_memory",
        "timeout",
        "worker_init_fn",
        "prefetch_factor",
        "persistent_workers",
        "batch_size",
    ):
        assert getattr(rebuilt, name) is getattr(loader, name) or getattr(rebuilt, name) == getattr(loader, name), name
    # the sampler and generator are copies, so iterating the rebuilt loader cannot advance the user's
    assert rebuilt.sampler is not loader.sampler and type(rebuilt.sampler) is type(loader.sampler)
    assert torch.equal(rebuilt.generator.get_state(), loader.generator.get_state())
    assert rebuilt.drop_last and len(rebuilt) == len(loader)
    custom = DataLoader(PlantedDataset(), batch_sampler=[[0, 1], [2, 3, 4]])
    assert list(rebuild_loader(custom, PlantedDataset()).batch_sampler) == [[0, 1], [2, 3, 4]]
    assert rebuilt.multiprocessing_context is loader.multiprocessing_context


def test_report_renders(tmp_path) -> None:
    report = run(loader_for(PlantedDataset(raw_ms=PLANTED_MS, transform=T.Compose([Fast()]))))
    data = json.loads(report.to_json())
    assert data["device_bound_steps_per_s"] > 0 and data["verdict"] in ("moderately input-bound", "highly input-bound")
    assert {"name", "cache_point", "steps_per_s", "fraction_of_bound", "spread", "cpu_util"} <= set(data["experiments"][0])
    assert {"stage", "kind", "added_ms", "share_of_baseline"} <= set(data["bottlenecks"][0])
    assert isinstance(data["caveats"], list)
    assert "| baseline |" in report.to_markdown() and "raw load" in report.to_table()
    assert "Verdict:" in report.to_table() and "Stages that cost time per step" in report.to_markdown()
    png = tmp_path / "report.png"
    report.plot(str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_hanging_worker_stops_at_the_timeout() -> None:
    from tests.fakes.diagnose import hanging_in_worker

    loader, step = hanging_in_worker()
    started = time.perf_counter()
    with pytest.raises(PipelineError, match="timed out"):
        diagnose(loader, step, device=STEP, options=quick_options(steps=2, warmup=0, worker_timeout=2))
    assert time.perf_counter() - started < 30


@pytest.mark.parametrize("depth", [0, 2])
def test_host_point_uses_the_loops_own_copy_path(depth: int) -> None:
    # a 6.3 MB batch over 0.25 GB/s is a 25 ms copy against a 40 ms step: prefetching hides it, inline it adds
    from fastpipe.diagnosis._options import MeasureOptions
    from fastpipe.diagnosis.ladder._points import measure_points
    from tests.fakes.diagnose import heavy_copy

    results = measure_points(heavy_copy(depth), "sim:40,h2d_gbps=0.25", ["device", "host"], options=MeasureOptions(steps=8, warmup=2))
    fraction = results["host"].steps_per_s / results["device"].steps_per_s
    if depth:
        assert fraction > 0.85
    else:
        assert fraction < 0.70  # 40 / (40 + 25) = 0.62


@pytest.mark.slow  # 6-25 s on 2 cores: kept out of `make test` (under 10 min); `make test-all` runs it
def test_cli_diagnose_outputs(tmp_path, capsys) -> None:
    from fastpipe.cli import main

    argv = tiny_toy_argv(
        "diagnose",
        "sim:20",
        "--num-workers",
        "1",
        "--threshold",
        "0.5",
        "--json",
        str(tmp_path / "r.json"),
        "--markdown",
        str(tmp_path / "r.md"),
        "--plot",
        str(tmp_path / "r.png"),
    )
    assert main(argv) == 0
    assert "device (bound)" in capsys.readouterr().out
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["schema"] == "fastpipe.report/2" and data["workload"] == "toy:naive"
    assert (tmp_path / "r.png").stat().st_size > 1000 and "| cache point |" in (tmp_path / "r.md").read_text()


@pytest.mark.parametrize(
    "spec, fix",
    [
        ("tests.fakes.diagnose:raising_in_worker", "corrupt JPEG (planted)"),
        ("tests.fakes.diagnose:no_such_factory", "has no function"),
        ("toy:nonsense", "toy:naive"),
    ],
)
def test_cli_diagnose_bad_input_exit_2(spec: str, fix: str, capsys) -> None:
    from fastpipe.cli import main

    assert main(["diagnose", spec, "--device", STEP, "--steps", "2", "--warmup", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert fix in err and "Traceback" not in err and err.startswith("fastpipe: error:")


def test_iterable_dataset_gets_device_host_and_baseline() -> None:
    from torch.utils.data import IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            for i in range(10_000):
                yield torch.zeros(3, 8, 8), i % 10

    report = run(DataLoader(Stream(), batch_size=4, num_workers=0), threshold=0.0)
    assert {"device", "baseline"} <= {e.cache_point for e in report.experiments}
    assert any("IterableDataset" in u.reason for u in report.unavailable)


def test_saturated_drop_is_settled_with_stage_costs() -> None:
    from fastpipe.diagnosis.stagecost import measure_stage_costs
    from fastpipe.diagnosis.verdict._caveats import Facts, saturation_explained, saturation_unexplained
    from fastpipe.workloads._workload import Workload

    loader = loader_for(PlantedDataset(transform=T.Compose([Fast(), Slow(PLANTED_MS)])))
    report = run(loader, stage_costs=True)
    assert [b.stage for b in report.bottlenecks] == ["Slow"], report.to_table()
    assert report.stage_costs is not None and {s["name"] for s in report.stage_costs["stages"]} >= {"Slow", "raw load"}
    assert "Stage costs inside the workers" in report.to_table() and "```" in report.to_markdown()
    assert "stage_costs" in json.loads(report.to_json())
    # Sleeps never saturate a CPU, so mark the drop as saturated to exercise the caveat rules.
    report.bottlenecks[0].cpu_saturated = True
    costs = measure_stage_costs(Workload(loader=loader, step=lambda b: None), parse_device(STEP), steps=4, warmup=1)
    facts = Facts(report=report, attribution=None, workers=2, device_kind="sim", pool=1, target=0.03, budget_s=2.0, costs=costs)
    assert saturation_unexplained(facts) is None
    assert "Slow, at a saturated CPU" in (saturation_explained(facts) or ""), report.caveats


def test_conditional_transforms_stay_one_stage() -> None:
    from fastpipe.stages import split_transform

    transform = T.Compose([T.RandomApply([Slow(1)], p=0.1), T.Compose([Fast(), T.RandomChoice([Fast(), Slow(1)])])])
    assert [s.name for s in split_transform(transform)] == ["RandomApply", "Fast", "RandomChoice"]


def test_empty_transform_has_no_raw_point() -> None:
    report = run(loader_for(PlantedDataset(transform=T.Compose([]))), threshold=0.0)
    assert "raw" not in {e.cache_point for e in report.experiments}
    assert any(u.cache_point == "raw" for u in report.unavailable)


def test_cli_run_rejects_zero_steps(capsys) -> None:
    from fastpipe.cli import main

    assert main(["run", "toy:naive", "--steps", "0", "--device", STEP]) == 2
    assert "--steps" in capsys.readouterr().err


@pytest.mark.slow  # 6-25 s on 2 cores: kept out of `make test` (under 10 min); `make test-all` runs it
def test_a_point_that_fails_when_remeasured_is_dropped_as_in_the_first_measurement(monkeypatch: pytest.MonkeyPatch) -> None:
    from fastpipe.diagnosis import _diagnose
    from fastpipe.diagnosis.ladder._points import PointRunner

    calls: dict[str, int] = {}
    real = PointRunner.measure

    def measure(self, point, **kwargs):
        calls[point] = calls.get(point, 0) + 1
        if point == "raw" and calls[point] == 2:
            raise PipelineError("planted failure on the second measurement", stage="Slow")
        return real(self, point, **kwargs)

    monkeypatch.setattr(PointRunner, "measure", measure)
    monkeypatch.setattr(_diagnose._Diagnosis, "_suspects", lambda self: [("after:Slow", "raw"), ("raw", "baseline")])
    report = run(loader_for(PlantedDataset(transform=T.Compose([Slow(PLANTED_MS), Fast()]))), stage_costs=False)
    assert calls["raw"] == 2 and not report.interrupted
    assert [u.cache_point for u in report.unavailable if "planted failure" in u.reason] == ["raw"], report.to_table()
    assert "raw" not in {e.cache_point for e in report.experiments} and report.baseline_step_ms
