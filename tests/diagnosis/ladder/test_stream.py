"""Streaming datasets get the per-stage ladder: WebDataset chains of real-photo shards, fastpipe.stages.Stages(source=...),
a transform attribute on an IterableDataset; every point replays in each worker, dict samples included."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import fastpipe.stages
from fastpipe.diagnosis._options import MeasureOptions
from fastpipe.diagnosis.discovery._pipeline import find_pipeline
from fastpipe.diagnosis.ladder._points import measure_points
from fastpipe.diagnosis.ladder._serve import cache_point_dataset, probe_point
from fastpipe.diagnosis.stagecost import measure_stage_costs
from fastpipe.workloads._workload import Workload
from tests.fakes import quick_options

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "streaming"
STEP = "sim:40"
PLANTED_MS = 40.0  # per sample: 4 samples over 2 workers = 80 ms a batch, twice the step


# ----- a custom stream with declared stages ------------------------------------------------------
def double(sample: dict) -> dict:
    return {**sample, "image": sample["image"] * 2}


def plus_one(sample: dict) -> dict:
    return {**sample, "image": sample["image"] + 1}


class Numbers:
    """Raw items, sharded across workers as a stream must be (worker i reads every n-th item)."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __iter__(self):
        info = get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(first, self.count, step):
            yield {"image": torch.full((2, 2), float(i)), "label": i}


class Declared(IterableDataset):
    def __init__(self, count: int = 64) -> None:
        self.stages = fastpipe.stages.Stages(source=Numbers(count), transforms=[double, plus_one])

    def __iter__(self):
        for sample in self.stages:  # the declared stages' output, as is (a dict here)
            yield sample


class WithTransform(IterableDataset):
    def __init__(self, transform, count: int = 64) -> None:
        self.source, self.transform = Numbers(count), transform

    def __iter__(self):
        for item in self.source:
            yield self.transform(item)


def first(dataset, n: int) -> list:
    stream = iter(dataset)
    return [next(stream) for _ in range(n)]


def values(items: list) -> list:
    return [
        tuple(x.tolist() if isinstance(x, torch.Tensor) else x for x in item)
        if isinstance(item, tuple)
        else {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in item.items()}
        for item in items
    ]


def test_declared_stream_stages_are_found_and_every_point_replays_the_same_items() -> None:
    dataset = Declared()
    pipeline, why = find_pipeline(dataset)
    assert why is None and pipeline.names() == ["double", "plus_one"] and pipeline.kind == "stages"
    truth = values(first(dataset, 3))
    assert truth[1] == {"image": [[3.0, 3.0], [3.0, 3.0]], "label": 1}
    for point in ["sample", "after:double", "raw"]:
        replay = first(cache_point_dataset(dataset, pipeline, point, pool=3), 7)  # past the pool: cycles
        assert values(replay[:3]) == truth and values(replay[3:6]) == truth, point
    assert values(first(cache_point_dataset(dataset, pipeline, "baseline"), 3)) == truth  # the stream itself


def test_a_transform_attribute_on_a_stream_is_split_and_dict_samples_work() -> None:
    dataset = WithTransform(fastpipe.stages.Stages(transforms=[double, plus_one]))
    pipeline, why = find_pipeline(dataset)
    assert why is None and pipeline.names() == ["double", "plus_one"]
    truth = values(first(dataset, 2))
    assert truth[1]["image"] == [[3.0, 3.0], [3.0, 3.0]] and truth[1]["label"] == 1
    for point in ["sample", "after:double", "raw"]:
        assert values(first(cache_point_dataset(dataset, pipeline, point, pool=2), 4)) == truth * 2, point
    assert probe_point(dataset, pipeline, "after:double").reason is None


def test_the_source_is_not_read_while_replaying() -> None:
    reads = []

    class Counted(Numbers):
        def __iter__(self):
            for item in super().__iter__():
                reads.append(item["label"])
                yield item

    dataset = Declared()
    dataset.stages.source = Counted(64)
    pipeline, _ = find_pipeline(dataset)
    first(cache_point_dataset(dataset, pipeline, "raw", pool=2), 20)
    assert len(reads) <= 3  # the capture reads the pool (a generator may read one ahead), the replay nothing


def test_a_stream_that_changes_its_transforms_output_says_why_its_points_are_unavailable() -> None:
    class Changes(WithTransform):
        def __iter__(self):
            for item in self.source:
                yield self.transform(item)["image"].float()

    dataset = Changes(fastpipe.stages.Stages(transforms=[double, plus_one]))
    pipeline, _ = find_pipeline(dataset)
    reason = probe_point(dataset, pipeline, "after:double").reason
    assert reason is not None and "Changes.__iter__ changes its transform's output" in reason


def test_a_one_shot_source_is_refused_before_the_diagnosis_uses_up_the_users_items() -> None:
    with pytest.raises(TypeError, match="re-iterable"):
        fastpipe.stages.Stages(source=(i for i in range(3)), transforms=[lambda x: x])
    assert fastpipe.stages.Stages(source=range(3), transforms=[lambda x: x]).source == range(3)  # re-iterable: accepted


def test_a_stream_without_stages_says_which_declaration_to_add() -> None:
    class Opaque(IterableDataset):
        def __iter__(self):
            yield from range(3)

    pipeline, why = find_pipeline(Opaque())
    assert pipeline is None and "fastpipe.stages.Stages(source=" in why and "Opaque.__iter__" in why


def test_each_worker_replays_its_own_share_and_an_empty_worker_stays_empty() -> None:
    dataset = Declared(count=1)  # worker 1 of 2 has nothing to read, in the user's loader and in the replay
    pipeline, _ = find_pipeline(dataset)
    for point in ["sample", "raw"]:
        loader = DataLoader(cache_point_dataset(dataset, pipeline, point, pool=2), batch_size=None, num_workers=2)
        labels = [sample["label"] for sample, _ in zip(loader, range(6))]
        assert labels == [0] * 6, point
    wide = Declared(count=64)
    loader = DataLoader(cache_point_dataset(wide, find_pipeline(wide)[0], "after:double", pool=2), batch_size=None, num_workers=2)
    labels = [sample["label"] for sample, _ in zip(loader, range(8))]
    assert labels == [0, 1, 2, 3, 0, 1, 2, 3]  # worker 0 reads 0, 2, ...; worker 1 reads 1, 3, ...; each replays its two


def test_hugging_face_streaming_map_is_not_read_and_the_declaration_works() -> None:
    datasets = pytest.importorskip("datasets")
    streamed = datasets.Dataset.from_dict({"image": [[float(i)] * 4 for i in range(8)], "label": list(range(8))}).to_iterable_dataset()
    pipeline, why = find_pipeline(streamed.map(double))
    assert pipeline is None and "fastpipe.stages.Stages(source=streamed" in why

    class Wrapped(IterableDataset):
        def __init__(self) -> None:
            self.stages = fastpipe.stages.Stages(source=streamed.with_format("torch"), transforms=[double, plus_one])

        def __iter__(self):
            return iter(self.stages)

    dataset = Wrapped()
    pipeline, why = find_pipeline(dataset)
    assert why is None and pipeline.names() == ["double", "plus_one"]
    truth = values(first(dataset, 2))
    assert values(first(cache_point_dataset(dataset, pipeline, "raw", pool=2), 4)) == truth * 2


# ----- WebDataset shards of real photos ----------------------------------------------------------
@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("webdataset")
    pytest.importorskip("skimage", reason="the corpus needs scikit-image: pip install 'fastpipe[photos]'")
    from fastpipe.workloads.photos import build_corpus

    photos = build_corpus(tmp_path_factory.mktemp("photos") / "corpus", n=8, seed=0, classes=4)
    sys.path.insert(0, str(EXAMPLE))
    try:
        import wds_train
    finally:
        sys.path.remove(str(EXAMPLE))
    urls = wds_train.write_shards(photos, photos.parent / "shards")
    yield wds_train, urls
    sys.modules.pop("wds_train", None)


def test_webdataset_chain_stages_are_its_filters(example) -> None:
    wds_train, urls = example
    pipeline, why = find_pipeline(wds_train.make_stream(urls))
    assert why is None and pipeline.kind == "webdataset"
    assert pipeline.names() == ["decode", "crop", "slow_augment", "to_tensor", "batched"]


def test_webdataset_every_point_replays_what_the_chain_delivers(example, monkeypatch) -> None:
    import webdataset as wds

    wds_train, urls = example
    monkeypatch.setattr(wds_train, "SLOW_MS", 0.0)
    stream = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("pil").to_tuple("jpg", "cls")
    resize = wds_train.T.Compose([wds_train.T.Resize((64, 64)), wds_train.T.PILToTensor()])  # deterministic: no random crop
    stream = stream.map_tuple(resize, None).batched(2)
    pipeline, _ = find_pipeline(stream)
    assert pipeline.names() == ["decode", "to_tuple", "map_tuple(Compose)", "batched"]
    truth = first(stream, 2)
    for point in ["sample", "after:map_tuple(Compose)", "after:to_tuple", "after:decode", "raw"]:
        pool = 2 if point == "sample" else 4  # batches, or the samples of two batches
        replay = first(cache_point_dataset(stream, pipeline, point, pool=pool), 4)
        for got, want in zip(replay, truth * 2):
            assert torch.equal(got[0], want[0]) and list(got[1]) == list(want[1]), point


def test_webdataset_slow_map_shows_between_its_points_and_in_its_cost(example) -> None:
    wds_train, urls = example
    loader = DataLoader(wds_train.make_stream(urls), batch_size=None, num_workers=2)
    workload = Workload(loader=loader, step=lambda batch: None, name="wds")
    results = measure_points(workload, STEP, ["after:slow_augment", "after:crop"], options=MeasureOptions(steps=6, warmup=2, budget=2.0))
    added = 1000 / results["after:crop"].steps_per_s - 1000 / results["after:slow_augment"].steps_per_s
    assert added > 0.5 * (PLANTED_MS * wds_train.BATCH / 2 - 40)  # the planted 80 ms of worker time a step, past the 40 ms step
    costs = measure_stage_costs(loader, STEP, step=lambda batch: None, steps=4, warmup=1)
    assert [s.name for s in costs.stages][:6] == ["raw load", "decode", "crop", "slow_augment", "to_tensor", "batched"]
    assert costs.stage("slow_augment").ms_per_sample > 0.8 * PLANTED_MS
    assert costs.stage("to_tensor").ms_per_sample < 0.2 * PLANTED_MS


@pytest.mark.slow
def test_webdataset_diagnosis_names_the_slow_map_and_not_the_cheap_ones(example) -> None:
    wds_train, urls = example
    loader = DataLoader(wds_train.make_stream(urls), batch_size=None, num_workers=2)
    report = fastpipe.diagnose(
        loader, lambda batch: None, device=STEP, options=quick_options(steps=8, warmup=2, budget=2.0, threshold=0.15)
    )
    named = [b.stage for b in report.bottlenecks]
    assert named and named[0] == "slow_augment", report.to_table()
    assert "to_tensor" not in named and "batched" not in named, report.to_table()
    points = [e.cache_point for e in report.experiments]
    assert "after:slow_augment" in points and "after:crop" in points


@pytest.mark.slow
def test_declared_stream_diagnosis_names_its_slow_stage() -> None:
    def slow(sample: dict) -> dict:
        time.sleep(PLANTED_MS / 1000)
        return sample

    class Planted(IterableDataset):
        def __init__(self) -> None:
            self.stages = fastpipe.stages.Stages(source=Numbers(100_000), transforms=[double, slow, plus_one])

        def __iter__(self):
            return iter(self.stages)

    loader = DataLoader(Planted(), batch_size=4, num_workers=2)
    report = fastpipe.diagnose(
        loader,
        lambda batch: None,
        device=STEP,
        options=quick_options(steps=6, warmup=2, budget=1.5, threshold=0.15, strategy="bisect", stage_costs=False),
    )
    assert [b.stage for b in report.bottlenecks] == ["slow"], report.to_table()


def wait_10ms(sample: dict) -> dict:
    time.sleep(0.01)
    return sample


def test_declared_stream_stage_costs_are_per_stage() -> None:
    class Planted(IterableDataset):
        def __init__(self) -> None:
            self.stages = fastpipe.stages.Stages(source=Numbers(100_000), transforms=[double, wait_10ms, plus_one])

        def __iter__(self):
            for sample in self.stages:
                yield sample

    loader = DataLoader(Planted(), batch_size=4, num_workers=2)
    costs = measure_stage_costs(loader, STEP, step=lambda batch: None, steps=4, warmup=1)
    assert [s.name for s in costs.stages] == ["raw load", "double", "wait_10ms", "plus_one", "collate", "worker overhead"]
    assert costs.stage("wait_10ms").ms_per_sample >= 9 and costs.stage("plus_one").ms_per_sample < 3
    assert not costs.notes or all("whole as the raw load" not in note for note in costs.notes)
