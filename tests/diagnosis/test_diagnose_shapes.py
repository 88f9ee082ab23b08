"""The pipelines people really run (issue 12): each shape diagnosed, the planted culprit named with its time per step.

A planted stage sleeps ``SLOW_MS`` per sample: with 4 samples a batch over 2 workers it adds
``SLOW_MS x 4 / 2`` ms to every step, against a 10 ms simulated step.
"""

from __future__ import annotations

import pytest
import torchvision.transforms as T
from torch.utils.data import BatchSampler, ConcatDataset, DataLoader, SequentialSampler

from fastpipe import diagnose
from fastpipe.stages import Stages
from tests.fakes import (
    DeclaredStages,
    Fast,
    PlantedDataset,
    PostProcessed,
    SleepBatch,
    Slow,
    ToTensorColumn,
    TransformProperty,
    TwoViews,
    hf_dataset,
    quick_options,
)

DEVICE, BATCH, WORKERS, SLOW_MS = "sim:10", 4, 2, 40
PLANTED = SLOW_MS * BATCH / WORKERS


def diagnosed(loader: DataLoader, **kwargs):
    kwargs.setdefault("steps", 6)
    kwargs.setdefault("warmup", 2)
    kwargs.setdefault("budget", 2.0)
    kwargs.setdefault("threshold", 0.15)
    kwargs.setdefault("stage_costs", False)
    return diagnose(loader, lambda batch: None, device=DEVICE, options=quick_options(**kwargs))


def loader(dataset, **kwargs) -> DataLoader:
    kwargs.setdefault("batch_size", BATCH)
    return DataLoader(dataset, num_workers=WORKERS, **kwargs)


def named(report, stage: str, planted: float = PLANTED):
    stages = {b.stage: b for b in report.bottlenecks}
    assert stage in stages, report.to_table()
    assert stages[stage].added_ms == pytest.approx(planted, rel=0.25), report.to_table()
    return stages[stage]


@pytest.mark.slow  # 6-25 s on 2 cores: kept out of `make test` (under 10 min); `make test-all` runs it
def test_concat_dataset_of_two_sources() -> None:
    parts = [PlantedDataset(length=200, transform=T.Compose([Fast(), Slow(SLOW_MS)])) for _ in range(2)]
    report = diagnosed(loader(ConcatDataset(parts)))
    named(report, "Slow")
    assert [b.stage for b in report.bottlenecks] == ["Slow"]


@pytest.mark.slow  # 6-25 s on 2 cores: kept out of `make test` (under 10 min); `make test-all` runs it
def test_hugging_face_set_transform_with_declared_batch_stages() -> None:
    dataset = hf_dataset(length=400, transform=Stages(transforms=[ToTensorColumn(), SleepBatch(SLOW_MS)]))
    report = diagnosed(loader(dataset))
    named(report, "SleepBatch")


@pytest.mark.slow  # 6-25 s on 2 cores: kept out of `make test` (under 10 min); `make test-all` runs it
def test_custom_getitem_with_declared_stages() -> None:
    report = diagnosed(loader(DeclaredStages(length=400, steps=[Fast(), Slow(SLOW_MS), Fast()])))
    named(report, "Slow")


@pytest.mark.slow  # 6-25 s on 2 cores: kept out of `make test` (under 10 min); `make test-all` runs it
def test_post_processing_dataset_loses_its_points_but_the_rest_is_measured() -> None:
    report = diagnosed(loader(PostProcessed(transform=T.Compose([Fast(), Slow(SLOW_MS)]))))
    unavailable = {u.cache_point for u in report.unavailable}
    assert {"raw", "after:Fast"} <= unavailable, report.to_table()
    assert {"device", "host", "sample", "baseline"} <= {e.cache_point for e in report.experiments}
    # the stages around the lost points are measured as one span, and its time is the planted one
    span = named(report, "raw load + Fast + Slow")
    assert span.kind == "span" and "compiled kernel" not in span.recommendation


@pytest.mark.slow  # 6-25 s on 2 cores: kept out of `make test` (under 10 min); `make test-all` runs it
def test_two_view_transform_keeps_its_cost_on_the_transform() -> None:
    report = diagnosed(loader(TwoViews(transform=T.Compose([Fast(), Slow(SLOW_MS)]))))
    slow = named(report, "Slow", planted=2 * PLANTED)
    assert slow.calls_per_sample == 2 and "2x per sample" in report.to_table()
    assert "raw load" not in {b.stage for b in report.bottlenecks}


@pytest.mark.slow  # 6-25 s on 2 cores: kept out of `make test` (under 10 min); `make test-all` runs it
def test_custom_batch_sampler_keeps_every_part_of_the_report() -> None:
    dataset = PlantedDataset(transform=T.Compose([Fast(), Slow(SLOW_MS)]))
    sampler = BatchSampler(SequentialSampler(dataset), batch_size=BATCH, drop_last=False)
    report = diagnosed(DataLoader(dataset, batch_sampler=sampler, num_workers=WORKERS))
    named(report, "Slow")
    assert report.batch_size == BATCH, "the batch size is read from the batch sampler, so per-sample figures still work"


@pytest.mark.slow  # 6-25 s on 2 cores: kept out of `make test` (under 10 min); `make test-all` runs it
def test_transform_exposed_through_a_property_leaks_no_internal_name() -> None:
    inner = PlantedDataset(transform=T.Compose([Fast(), Slow(SLOW_MS)]))
    report = diagnosed(loader(TransformProperty(inner)), stage_costs=True)
    named(report, "Slow")
    text = report.to_table() + report.to_json()
    assert "_Recorder" not in text and "runs in the training process" not in text
    assert isinstance(inner.transform, T.Compose)  # the user's dataset is untouched


@pytest.mark.slow  # 6-25 s on 2 cores: kept out of `make test` (under 10 min); `make test-all` runs it
def test_stateful_dataloader_is_diagnosed() -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed")
    dataset = PlantedDataset(transform=T.Compose([Fast(), Slow(SLOW_MS)]))
    report = diagnosed(stateful.StatefulDataLoader(dataset, batch_size=BATCH, num_workers=WORKERS))
    named(report, "Slow")


def test_report_batch_size_with_custom_sampler_is_not_none() -> None:
    dataset = PlantedDataset(transform=T.Compose([Fast()]))
    sampler = BatchSampler(SequentialSampler(dataset), batch_size=3, drop_last=False)
    from fastpipe.workloads._workload import loader_batch_size

    assert loader_batch_size(DataLoader(dataset, batch_sampler=sampler)) == 3
    assert loader_batch_size(DataLoader(dataset, batch_size=5)) == 5
