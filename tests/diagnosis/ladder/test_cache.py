"""Cache points (fastpipe.diagnosis.ladder._cache): unavailable points, repeated transforms, the copy ledger, rebuilt loaders."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, Sampler, SequentialSampler

from fastpipe.diagnosis.discovery._pipeline import find_pipeline
from fastpipe.diagnosis.ladder._cache import CachePointDataset, UnavailablePoint
from fastpipe.diagnosis.ladder._serve import check_point, probe_point
from fastpipe.loading._rebuild import rebuild_loader
from tests.fakes import AddOne, Fast, PlantedDataset, PostProcessed, TwoViews


class Crop:
    """A cheap stage that reads its input and returns a new, smaller tensor (a slice, copied)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :4, :4].clone()


class TickClock:
    """A fake clock: each reading is ``step`` seconds after the previous one, so each timed copy takes exactly ``step``."""

    def __init__(self, step: float) -> None:
        self.step, self.now = step, 0.0

    def __call__(self) -> float:
        self.now += self.step
        return self.now


class CountingTransform:
    """Counts its calls (per process), to check how often the cache reruns a stage."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x):
        self.calls += 1
        return x + 1


def cache(dataset, point: str, **kwargs) -> CachePointDataset:
    pipeline, why = find_pipeline(dataset)
    assert pipeline is not None, why
    return CachePointDataset(dataset, pipeline, point, **kwargs)


# ----- points that cannot be built -----------------------------------------------------------
def test_post_processing_dataset_is_unavailable_with_its_reason_in_the_main_process() -> None:
    dataset = PostProcessed(transform=T.Compose([Fast(), Fast()]))
    pipeline, _ = find_pipeline(dataset)
    for point in ("raw", "after:Fast"):
        reason = check_point(dataset, pipeline, point)
        assert reason is not None and "changes its transform's output" in reason and "final stage" in reason
    assert check_point(dataset, pipeline, "sample") is None and check_point(dataset, pipeline, "baseline") is None
    assert check_point(dataset, pipeline, "after:Nope") is not None


def test_post_processing_raises_a_catchable_error_from_the_workers() -> None:
    dataset = PostProcessed(transform=T.Compose([Fast()]))
    loader = DataLoader(cache(dataset, "raw"), batch_size=2, num_workers=1)
    with pytest.raises(UnavailablePoint) as info:
        next(iter(loader))
    assert info.value.point == "raw" and "changes its transform's output" in info.value.reason


def test_unknown_stage_is_unavailable_early() -> None:
    with pytest.raises(UnavailablePoint) as info:
        cache(PlantedDataset(transform=T.Compose([Fast()])), "after:Missing")
    assert info.value.point == "after:Missing" and "['Fast']" in info.value.reason


# ----- repeated transforms -------------------------------------------------------------------
def test_two_views_are_counted_and_both_rerun() -> None:
    counter = CountingTransform()
    dataset = TwoViews(transform=T.Compose([Fast(), counter]))
    pipeline, _ = find_pipeline(dataset)
    probe = probe_point(dataset, pipeline, "raw")
    assert probe.reason is None and probe.calls_per_sample == 2
    cached = CachePointDataset(dataset, pipeline, "raw")
    (first, second), label = cached[3]
    assert cached.calls_per_sample == 2 and torch.equal(first, second) and first[0, 0, 0].item() == 4.0 and label == 3
    counter.calls = 0
    for i in range(5):
        cached[i]
    assert counter.calls == 10  # both views rerun the stage for every sample served


# ----- the copy ledger -----------------------------------------------------------------------
def test_a_copy_is_timed_per_sample_and_none_when_later_stages_leave_the_value_alone() -> None:
    big = (3, 128, 128)
    copied = cache(PlantedDataset(shape=big, transform=T.Compose([Fast(), AddOne()])), "after:Fast", clock=TickClock(0.01))
    shared = cache(PlantedDataset(shape=big, transform=T.Compose([Fast(), Crop()])), "after:Fast", clock=TickClock(0.01))
    for i in range(6):
        copied[i], shared[i]
    assert copied.copy_stats().samples == 6 and copied.copy_stats().copied == 6
    assert copied.copy_seconds_per_sample() == pytest.approx(0.01)  # one reading apart on the fake clock
    assert shared.copy_stats().samples == 6 and shared.copy_stats().copied == 0 and shared.copy_seconds_per_sample() == 0.0
    assert probe_point(shared.dataset, shared.pipeline, "after:Fast").copies is False
    assert probe_point(copied.dataset, copied.pipeline, "after:Fast").copies is True
    copied.reset_copy_stats()
    assert copied.copy_stats().samples == 0


def test_two_views_count_one_copy_time_per_sample() -> None:
    dataset = TwoViews(transform=T.Compose([Fast(), AddOne()]))
    cached = cache(dataset, "raw", clock=TickClock(0.01))
    for i in range(4):
        cached[i]
    stats = cached.copy_stats()
    assert stats.samples == 4 and stats.copied == 4 and stats.seconds_per_sample == pytest.approx(0.01)


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])  # spawn: by pickling
def test_the_ledger_is_filled_inside_the_workers(context: str) -> None:
    dataset = PlantedDataset(length=24, transform=T.Compose([Fast(), AddOne()]))
    cached = cache(dataset, "raw", clock=TickClock(0.005))
    batches = list(DataLoader(cached, batch_size=4, num_workers=2, multiprocessing_context=context))
    stats = cached.copy_stats()
    assert len(batches) == 6 and stats.samples == 24 and stats.copied == 24
    assert stats.seconds_per_sample == pytest.approx(0.005)
    # each worker serves its own capture (batches alternate between the two): in-place AddOne did not pile up
    assert all(torch.equal(b[0], batches[i % 2][0]) for i, b in enumerate(batches))


def test_an_in_place_write_after_the_capture_switches_to_copies() -> None:
    class SometimesInPlace:
        def __init__(self):
            self.calls = 0

        def __call__(self, x):
            self.calls += 1
            return x.add_(100) if self.calls == 3 else x + 1

    dataset = PlantedDataset(transform=T.Compose([Fast(), SometimesInPlace()]))
    cached = cache(dataset, "after:Fast")
    values = [cached[0][0][0, 0, 0].item() for _ in range(5)]  # the capture is call 1, the write call 3
    assert values == [1.0, 100.0, 1.0, 1.0, 1.0]  # the write did not stick in the cache
    assert cached.copy_stats().copied == 3  # served shared until the write was seen, then copied


def test_a_write_by_the_consumer_is_not_served_again() -> None:
    cached = cache(PlantedDataset(transform=T.Compose([Fast()])), "raw")
    x, _ = cached[0]
    x.add_(5)  # e.g. a loop normalising its batch in place, with batch_size=None and no workers
    assert cached[0][0][0, 0, 0].item() == 0.0


def test_numpy_values_are_always_copied() -> None:
    import numpy as np

    class ToArray:
        def __call__(self, x):
            return x.numpy().copy()

    class Same:
        def __call__(self, x):
            return x

    cached = cache(PlantedDataset(transform=T.Compose([ToArray(), Same()])), "after:ToArray")
    for i in range(3):
        assert isinstance(cached[i][0], np.ndarray)
    assert cached.copy_stats().copied == 3


# ----- rebuilt loaders -----------------------------------------------------------------------
class Resumable(Sampler):
    """A sampler with state, as resumable samplers keep it: where it stopped."""

    def __init__(self, n: int) -> None:
        self.n, self.position = n, 0

    def __iter__(self):
        while self.position < self.n:
            self.position += 1
            yield self.position - 1

    def __len__(self) -> int:
        return self.n

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def test_rebuilt_loader_copies_the_sampler_and_keeps_the_users_untouched() -> None:
    generator = torch.Generator().manual_seed(3)
    loader = DataLoader(PlantedDataset(length=20), batch_size=4, shuffle=True, generator=generator)
    before = generator.get_state().clone()
    rebuilt = rebuild_loader(loader, PlantedDataset(length=20))
    assert rebuilt.sampler is not loader.sampler and isinstance(rebuilt.sampler, RandomSampler)
    assert torch.equal(rebuilt.generator.get_state(), before)
    list(rebuilt)
    assert torch.equal(generator.get_state(), before)  # the user's generator did not move

    sampler = Resumable(20)
    resumable = DataLoader(PlantedDataset(length=20), batch_size=4, sampler=sampler)
    copy = rebuild_loader(resumable, PlantedDataset(length=20))
    assert [b[1].tolist() for b in copy][:1] == [[0, 1, 2, 3]] and sampler.position == 0


def test_custom_batch_sampler_is_copied() -> None:
    class Buckets(Sampler):
        def __init__(self):
            self.epochs = 0

        def __iter__(self):
            self.epochs += 1
            return iter([[0, 1], [2, 3, 4]])

        def __len__(self):
            return 2

    buckets = Buckets()
    loader = DataLoader(PlantedDataset(), batch_sampler=buckets)
    rebuilt = rebuild_loader(loader, PlantedDataset())
    assert rebuilt.batch_sampler is not buckets and [len(b[1]) for b in rebuilt] == [2, 3] and buckets.epochs == 0
    plain = DataLoader(PlantedDataset(), batch_sampler=BatchSampler(SequentialSampler(range(5)), 2, False))
    assert [b[1].tolist() for b in rebuild_loader(plain, PlantedDataset())] == [[0, 1], [2, 3], [4]]


def test_loader_subclass_is_kept() -> None:
    class Mine(DataLoader):
        def __init__(self, dataset, tag: str = "none", **kwargs):
            super().__init__(dataset, **kwargs)
            self.tag = tag

    loader = Mine(PlantedDataset(), tag="kept", batch_size=4)
    rebuilt = rebuild_loader(loader, PlantedDataset(), num_workers=0)
    assert type(rebuilt) is Mine and rebuilt.tag == "kept" and rebuilt.batch_size == 4

    class Odd(DataLoader):
        def __init__(self, dataset):  # cannot take the settings back: a plain DataLoader keeps them
            super().__init__(dataset, batch_size=3)

    odd = rebuild_loader(Odd(PlantedDataset()), PlantedDataset())
    assert type(odd) is DataLoader and odd.batch_size == 3


def test_stateful_dataloader_is_kept() -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed")
    loader = stateful.StatefulDataLoader(PlantedDataset(length=16), batch_size=4, shuffle=True, snapshot_every_n_steps=3)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    rebuilt = rebuild_loader(loader, PlantedDataset(length=16))
    assert type(rebuilt) is stateful.StatefulDataLoader and rebuilt.snapshot_every_n_steps == 3
    assert len(list(rebuilt)) == 4
    assert loader.state_dict() == state  # iterating the copy left the user's loader where it was


def test_capture_value_reads_the_raw_input_even_where_the_point_cannot_be_served() -> None:
    from fastpipe.diagnosis.ladder._cache import capture_value

    dataset = PostProcessed(shape=(3, 5, 6), transform=T.Compose([Fast()]))
    pipeline, _ = find_pipeline(dataset)
    value = capture_value(dataset, pipeline, "raw", 3)
    assert value.shape == (3, 5, 6) and value.dtype == torch.uint8 and value[0, 0, 0].item() == 3
    with pytest.raises(UnavailablePoint):
        capture_value(dataset, pipeline, "sample")


def test_a_hanging_probe_times_out_instead_of_hanging() -> None:
    import threading

    release = threading.Event()

    class Hang:
        def __call__(self, x):
            release.wait(30)
            return x

    dataset = PlantedDataset(transform=T.Compose([Fast(), Hang()]))
    pipeline, _ = find_pipeline(dataset)
    try:
        with pytest.raises(TimeoutError, match="main process"):
            check_point(dataset, pipeline, "raw", timeout=0.2)
    finally:
        release.set()
    assert check_point(dataset, pipeline, "raw", timeout=10) is None


class _Layout:
    """Records what it is given: type, dtype, shape, strides, storage offset, shared memory."""

    seen: list[tuple] = []

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        _Layout.seen.append((type(x).__name__, x.dtype, tuple(x.shape), x.stride(), x.storage_offset(), x.is_shared()))
        return x.mul_(1)  # in place, so the cache must hand out copies


class _PilImages(torch.utils.data.Dataset):
    def __init__(self, transform) -> None:
        self.transform = transform

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int):
        from PIL import Image

        return self.transform(Image.fromarray(np.full((48, 40, 3), index, dtype=np.uint8))), 0


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_cached_copy_hands_the_next_stage_what_the_pipeline_gives_it(version: str) -> None:
    """After a PIL-to-tensor conversion (channels-last strides) and a crop (a view into the larger image), the next
    stage must see the same layout from the cache as from the pipeline, or the cache point changes the work below it."""
    import torchvision.transforms as v1
    import torchvision.transforms.v2 as v2

    from fastpipe.diagnosis.discovery._pipeline import find_pipeline

    if version == "v1":
        transform = v1.Compose([v1.PILToTensor(), v1.CenterCrop(24), _Layout()])
    else:
        transform = v2.Compose([v2.ToImage(), v2.CenterCrop(24), _Layout()])
    dataset = _PilImages(transform)
    pipeline, _ = find_pipeline(dataset)
    for point in ("after:" + pipeline.names()[0], "after:CenterCrop"):
        _Layout.seen.clear()
        dataset[3]
        expected = _Layout.seen[-1]
        cached = CachePointDataset(dataset, pipeline, point)
        cached[3], cached[3], cached[3]  # the capture, then two samples served from copies
        assert cached.copy_stats().copied >= 2
        assert _Layout.seen[-1] == expected, (point, _Layout.seen[-1], expected)
