"""The diagnosis report's memory section, the shared-memory check before any worker starts, compare's memory per rung,
and the growth rule against an allocator's warm-up."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import DataLoader

from fastpipe.devices import parse_device
from fastpipe.diagnosis._diagnose import diagnose, run_diagnosis
from fastpipe.diagnosis.memory import _shm_budget
from fastpipe.diagnosis.memory._loader import (
    GROWTH_FLOOR,
    RISE_FLOOR,
    SUSTAINED,
    LoaderMemory,
    WorkerMemory,
    fit_growth,
    floors,
)
from fastpipe.diagnosis.memory._probes import PAGE, batch_shm_bytes
from fastpipe.diagnosis.memory._section import MemorySection, start_memory_section
from fastpipe.diagnosis.memory._shm_budget import MemoryLimits, predict_shm, size_text
from fastpipe.experiments._compare import Comparison, RungMemory, VariantResult, rung_memory
from fastpipe.workloads._workload import Workload
from tests.fakes import PlantedDataset, quick_options

MB = 1 << 20
BATCH = 32


def _jitter(n: int) -> int:
    """A fixed, deterministic wobble of up to 1.2 MB, as a worker's transient buffers give."""
    return (n * 7919 % 13) * 100_000


def _worker(points: list[tuple[int, int]], samples: int) -> WorkerMemory:
    growth, stderr, fitted, late = fit_growth(points, samples, BATCH)
    return WorkerMemory(0, 1, points[0][1], 0, max(u for _, u in points), 0, samples, growth, stderr, points, fitted, late)


def test_warm_up_that_levels_off_is_not_growth() -> None:
    # the shape toy:naive's workers gave (glibc's heap settling): +11 kB a sample for 2,000-2,400 samples, then flat
    points = [(n, 150 * MB + min(n, 2400) * 11_000 + _jitter(n)) for n in range(0, 3200, 60)]
    worker = _worker(points, 3200)
    assert worker.growth_per_1000 is not None and worker.growth_per_1000 > GROWTH_FLOOR  # the slope alone would say it grows
    assert worker.late_ratio is not None and worker.late_ratio < SUSTAINED
    assert not worker.grows


def test_sustained_growth_counts() -> None:
    points = [(n, 150 * MB + n * 9_000 + _jitter(n)) for n in range(0, 2600, 60)]  # 9 MB per 1,000 samples, all along
    worker = _worker(points, 2600)
    assert worker.growth_per_1000 == pytest.approx(9e6, rel=0.1)
    assert worker.rise is not None and worker.rise >= RISE_FLOOR and worker.late_ratio >= SUSTAINED
    assert worker.grows


def test_a_few_hundred_samples_cannot_resolve_growth() -> None:
    points = [(n, 10 * MB + n * 5_000) for n in range(0, 130, 8)]  # 5 MB per 1,000 on 130 samples: a 0.5 MB rise
    worker = _worker(points, 130)
    assert worker.growth_per_1000 is not None and worker.growth_per_1000 > GROWTH_FLOOR
    assert worker.rise is not None and worker.rise < RISE_FLOOR and not worker.grows


def test_shared_memory_is_counted_in_whole_pages() -> None:
    batch = (torch.zeros(32, 3, dtype=torch.int64), torch.zeros(4, PAGE + 1, dtype=torch.uint8))
    assert batch_shm_bytes(batch) == PAGE + 5 * PAGE
    assert batch_shm_bytes(torch.zeros(1, 100, dtype=torch.uint8), 41) == 2 * PAGE  # a one-sample batch scaled to 41


def test_floors_keep_the_least_memory_of_each_batch() -> None:
    assert floors([(0, 5), (10, 9), (31, 7), (32, 8), (40, 6), (70, 1)], BATCH) == [(0, 5), (32, 6), (70, 1)]


def test_the_loader_grows_when_most_workers_do() -> None:
    steady = [(n, 150 * MB + n * 9_000 + _jitter(n)) for n in range(0, 2600, 60)]
    flat = [(n, 150 * MB + _jitter(n)) for n in range(0, 2600, 60)]
    prediction = predict_shm(DataLoader(PlantedDataset(), batch_size=4, num_workers=2), 1000, pin=False)

    def loader(*series: list[tuple[int, int]]) -> LoaderMemory:
        return LoaderMemory(prediction, [_worker(s, 2600) for s in series], 5200, None, None, None, None, 0, 0, None, 1.0)

    assert loader(steady, steady).grows
    assert not loader(steady, flat).grows  # one worker's allocator state does not make the loader grow
    assert not loader().grows


def _run(loader: DataLoader, on_warning=None, **kwargs):
    """The diagnosis of ``loader`` (through the engine, which takes ``on_warning``), short, its passes off."""
    kwargs.setdefault("budget", 1.0)
    options = quick_options(steps=4, warmup=1, stage_costs=False, **kwargs)
    return run_diagnosis(Workload(loader=loader, step=lambda batch: None), "sim:5", options, on_warning=on_warning)


@pytest.mark.slow  # 6-25 s on 2 cores: kept out of `make test` (under 10 min); `make test-all` runs it
def test_report_has_each_points_memory_in_every_rendering(tmp_path) -> None:
    report = _run(DataLoader(PlantedDataset(length=64), batch_size=4, num_workers=2))
    memory = report.memory
    assert memory is not None and memory.loader is None and "loader_memory=False" in memory.not_run
    points = {p.cache_point: p for p in memory.points}
    assert list(points) == [e.cache_point for e in report.experiments]
    assert points["device"].uss == [] and points["device"].pss == []  # batches cached in this process: no workers
    baseline = points["baseline"]
    assert len(baseline.uss) == 2 and all(u > 0 for u in baseline.uss) and len(baseline.pss) == 2
    assert baseline.shm_held > 0 and baseline.rss > 0  # the batches in flight, in the loader's own segments
    data = json.loads(report.to_json())["memory"]
    assert [p["cache_point"] for p in data["points"]] == list(points) and data["points"][-1]["uss"] == baseline.uss
    assert "Memory at each cache point" in report.to_table()
    assert "#### Memory" in report.to_markdown()


def test_budget_warning_comes_before_any_worker_starts(monkeypatch) -> None:
    events: list[str] = []
    original = torch.utils.data.dataloader._MultiProcessingDataLoaderIter.__init__

    def spy(self, *args, **kwargs):
        events.append("a worker started")
        original(self, *args, **kwargs)

    monkeypatch.setattr(torch.utils.data.dataloader._MultiProcessingDataLoaderIter, "__init__", spy)
    # a batch: 3 kB of samples and 32 bytes of labels, a page each in shared memory; x (2 workers x 2 + 1) = 41 kB; 10 kB free
    monkeypatch.setattr(_shm_budget, "read_limits", lambda *a, **k: MemoryLimits(10_000, 10_000, None, None))
    report = _run(DataLoader(PlantedDataset(length=32), batch_size=4, num_workers=2), on_warning=events.append)
    warning = events[0]
    assert "shared memory will not fit" in warning and "Bus error" in warning
    assert "prefetch_factor=1" in warning and "uint8 batches" in warning and "--shm-size=" in warning
    assert "a worker started" in events[1:]  # the diagnosis then ran, the warning first
    assert report.memory.budget_warning == warning
    assert any(c.startswith("shared memory will not fit") for c in report.caveats)
    assert "Warned before any worker started" in report.to_table()


def test_budget_warning_defaults_to_a_python_warning(monkeypatch) -> None:
    monkeypatch.setattr(_shm_budget, "read_limits", lambda *a, **k: MemoryLimits(10_000, 10_000, None, None))
    workload = Workload(loader=DataLoader(PlantedDataset(length=8), batch_size=4, num_workers=2), step=lambda b: None)
    with pytest.warns(RuntimeWarning, match="shared memory will not fit"):
        section = start_memory_section(workload, None)
    assert section.budget_warning is not None
    no_workers = Workload(loader=DataLoader(PlantedDataset(length=8), batch_size=4), step=lambda b: None)
    assert start_memory_section(no_workers, None).budget_warning is None  # nothing goes through shared memory


def test_memory_section_without_points_renders() -> None:
    section = MemorySection(not_run="why")
    assert "not run (why)" in section.to_text(str) and section.to_dict()["loader_pass_not_run"] == "why"
    assert section.bars() == []


def test_compare_shows_memory_per_rung() -> None:
    workload = Workload(loader=DataLoader(PlantedDataset(length=64), batch_size=4, num_workers=2), step=lambda b: None)
    memory = rung_memory(workload, parse_device("sim:5"), 10.0)
    assert memory is not None and memory.not_run is None
    batch_bytes = batch_shm_bytes(next(iter(DataLoader(PlantedDataset(length=64), batch_size=4))))
    assert memory.shm_predicted == batch_bytes * (2 * 2 + 1) and memory.shm_peak and memory.shm_peak > 0
    assert memory.worker_uss_peak and memory.worker_uss_peak > 0 and memory.pinned_predicted == 0
    no_workers = Workload(loader=DataLoader(PlantedDataset(length=8), batch_size=4), step=lambda b: None)
    assert rung_memory(no_workers, parse_device("sim:5"), 10.0) is None
    variant = VariantResult("naive", "x:y", 1.0, 0.5, 1000.0, None, None, None, None, 0.01, 0.0, 0.5, memory=memory)
    comparison = Comparison(device="sim:5", device_bound_steps_per_s=2.0, steps=4, warmup=1, variants=[variant])
    table = comparison.to_table()
    assert "Memory per rung" in table and "shm peak / predicted" in table and size_text(memory.shm_predicted) in table
    assert "shm peak / predicted" in comparison.to_markdown()
    assert json.loads(comparison.to_json())["variants"][0]["memory"]["shm_predicted"] == memory.shm_predicted
    cut = RungMemory(100, 50, False, None, 0, None)
    assert cut.cells()[0].startswith("≥")  # a stall cut short is a lower bound


@pytest.mark.slow  # two diagnoses with their loader passes (10 s each at least): 60-90 s on the loaded 2-core machine
def test_diagnosis_names_copy_on_read_and_not_a_numpy_index() -> None:
    from tests.fakes.memory import packed, records

    options = quick_options(steps=4, warmup=1, budget=2.0, stage_costs=False, loader_memory=True)
    grown = diagnose(records(), device="sim:10", options=options).memory
    assert grown.loader is not None and grown.loader.grows, grown.loader.to_table()
    assert grown.copy_on_read is not None and [c.path for c in grown.copy_on_read.containers] == ["Records.records"]
    flat = diagnose(packed(), device="sim:10", options=options).memory
    assert flat.loader is not None and not flat.loader.grows and flat.copy_on_read is None, flat.loader.to_table()


def test_a_new_process_in_a_workers_slot_counts_its_samples_from_zero() -> None:
    """A new epoch's worker takes the old one's ledger row: its count restarts, so its own warm-up is cut from its
    own samples (not from the previous worker's running total)."""
    import os

    from fastpipe.diagnosis.memory._loader import _Counted

    ledger = torch.zeros((3, 2), dtype=torch.int64)
    ledger[0] = torch.tensor([500, os.getpid() + 1])  # the slot held another process that read 500 samples
    counted = _Counted(list(range(10)), ledger)
    counted[0], counted[1]
    assert ledger[0].tolist() == [2, os.getpid()]
    counted[2]
    assert ledger[0].tolist() == [3, os.getpid()]  # the same process keeps counting


# ----- pinned host memory: PyTorch's caching host allocator plus the buffers fastpipe registered ---------------
def test_pinned_reading_adds_the_host_allocator_and_fastpipes_registrations(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU run read "0 B measured": the stats were looked up as ``reserved_bytes.all.current``, which the host
    allocator does not have. The stats here have the shape ``torch._C._cuda_hostMemoryStats()`` returns."""
    from fastpipe.diagnosis.memory import _probes
    from fastpipe.loading.recycle import _hostpin

    nested = {
        "num_host_alloc": 3,
        "allocations": {"current": 3, "peak": 3, "allocated": 3, "freed": 0},
        "allocated_bytes": {"current": 1_800 * MB, "peak": 1_900 * MB, "allocated": 1_900 * MB, "freed": 100 * MB},
        "active_bytes": {"current": 600 * MB, "peak": 900 * MB, "allocated": 2_000 * MB, "freed": 1_400 * MB},
    }
    monkeypatch.setattr(_probes, "_cuda_present", lambda: True)
    monkeypatch.setattr(_probes, "_host_allocator_stats", lambda: dict(_probes.flatten_stats(nested)))
    monkeypatch.setattr(_hostpin, "_registered_bytes", 0)
    assert _probes.pinned_host_bytes() == 1_800 * MB, "held by the allocator: handed out and cached"
    monkeypatch.setattr(_hostpin, "_registered_bytes", 48 * MB)
    assert _probes.pinned_host_bytes() == 1_848 * MB, "plus the ring buffers registered in place"
    monkeypatch.setattr(_probes, "_host_allocator_stats", lambda: {})  # torch.cuda.host_memory_stats() before CUDA's init
    assert _probes.pinned_host_bytes() == 48 * MB
    monkeypatch.setattr(_hostpin, "_registered_bytes", 0)
    assert _probes.pinned_host_bytes() is None, "no source answered: not measured, rather than 0 B"
    monkeypatch.setattr(_probes, "_cuda_present", lambda: False)
    assert _probes.pinned_host_bytes() is None


def test_the_host_allocators_own_statistics_are_read_here() -> None:
    """This torch's real statistics (CUDA build or not) have the key the reading looks for."""
    from fastpipe.diagnosis.memory import _probes

    stats = _probes._host_allocator_stats()
    if stats is None:
        pytest.skip(f"torch {torch.__version__} has no host allocator statistics")
    if not stats:
        pytest.skip("host allocator statistics are empty before CUDA is initialised, on this torch")
    assert _probes.host_allocator_bytes(stats) is not None, sorted(stats)


@pytest.mark.gpu
def test_pinned_memory_is_measured_on_cuda() -> None:
    """On a GPU: pin_memory() copies (what a DataLoader's pin thread makes) and a recycled ring registered in place both count."""
    from fastpipe.diagnosis.memory import _probes
    from fastpipe.loading.recycle import RecycledLoader, _hostpin

    held = [torch.empty(8 * MB, dtype=torch.uint8).pin_memory() for _ in range(4)]
    copies = _probes.pinned_host_bytes()
    assert copies is not None and copies >= 32 * MB, copies
    loader = DataLoader(PlantedDataset(length=64), batch_size=16, num_workers=1, pin_memory=True)
    ring = RecycledLoader(loader, slots=3)
    iterator = ring.iter_for_device(parse_device("cuda"))
    batch = next(iterator)
    assert ring.stats()["pinning"] == "register"
    registered = _hostpin.registered_bytes()
    assert registered >= batch[0].numel(), "the ring's buffer under this batch is registered and counted"
    assert _probes.pinned_host_bytes() >= copies + registered
    del batch, held
    iterator.close()
    ring.close()
