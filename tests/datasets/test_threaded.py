"""ThreadLoader: a DataLoader's batches, order and semantics, decoded by threads into reused buffers."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from fastpipe.datasets import ImageFolder, SkippedImageWarning, ThreadLoader
from fastpipe.datasets._draws import draw_boxes
from fastpipe.errors import ConfigError, CorruptImageError
from tests.fakes import quick_options, within

pytest.importorskip("skimage", reason="the corpus needs scikit-image: pip install 'fastpipe[photos]'")
stats = pytest.importorskip("scipy.stats")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fastpipe.workloads.photos import build_corpus

    return build_corpus(tmp_path_factory.mktemp("photos") / "corpus", n=20, seed=0, classes=4)


def labels_of(loader, seed: int) -> list[list[int]]:
    torch.manual_seed(seed)
    return [batch[1].tolist() for batch in loader]


@pytest.mark.parametrize("options", [dict(shuffle=True), dict(shuffle=False, drop_last=True), dict(shuffle=True, drop_last=True)])
def test_same_order_len_and_labels_as_a_dataloader(corpus: Path, options: dict) -> None:
    dataset = ImageFolder(corpus, size=16)
    ours, theirs = ThreadLoader(dataset, batch_size=6, **options), DataLoader(dataset, batch_size=6, **options)
    assert len(ours) == len(theirs)
    assert labels_of(ours, 3) == labels_of(theirs, 3)
    assert labels_of(ours, 3) != labels_of(ours, 4) or not options["shuffle"]
    # a seeded generator, as DataLoader's
    ours = ThreadLoader(dataset, batch_size=6, generator=torch.Generator().manual_seed(7), **options)
    theirs = DataLoader(dataset, batch_size=6, generator=torch.Generator().manual_seed(7), **options)
    assert labels_of(ours, 0) == labels_of(theirs, 1)


def test_distributed_sampler_and_set_epoch(corpus: Path) -> None:
    dataset = ImageFolder(corpus, size=16)
    for rank in (0, 1):
        sampler = DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=True, seed=5)
        theirs_sampler = DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=True, seed=5)
        ours, theirs = ThreadLoader(dataset, batch_size=4, sampler=sampler), DataLoader(dataset, batch_size=4, sampler=theirs_sampler)
        epochs = []
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            theirs_sampler.set_epoch(epoch)
            epochs.append(labels_of(ours, 0))
            assert epochs[-1] == labels_of(theirs, 0)
        assert len(ours) == len(theirs) == 3


def test_pixels_equal_the_datasets_own_samples(corpus: Path) -> None:
    """With scale (1, 1) and ratio (1/2, 1/2) no try fits these photos (none is twice as tall as wide), so every box is
    torchvision's central-crop fallback, and there is no flip: the crop is fixed, and the thread loader's batch must
    equal the DataLoader's, pixel for pixel (a PNG through PIL included)."""
    root = corpus.parent / "with_png"
    if not root.exists():
        shutil.copytree(corpus, root)
        from PIL import Image

        Image.open(next(root.glob("class_0/*"))).save(root / "class_0" / "zz.png")
    dataset = ImageFolder(root, size=(24, 32), scale=(1.0, 1.0), ratio=(0.5, 0.5), hflip=0.0)
    ours = torch.cat([b[0] for b in ThreadLoader(dataset, batch_size=5, threads=2)])
    theirs = torch.cat([b[0] for b in DataLoader(dataset, batch_size=5)])
    assert len(ours) == 21 and torch.equal(ours, theirs)


@pytest.mark.parametrize("height, width", [(375, 500), (500, 333)])
def test_crop_box_distribution_equals_torchvisions(height: int, width: int) -> None:
    """KS tests, 3000 draws: the batch draws against torchvision's own get_params on the global RNG."""
    from fastpipe.datasets.crop import crop_params

    def features(boxes: np.ndarray) -> dict[str, np.ndarray]:
        top, left, h, w = boxes.T.astype(float)
        return {"area": h * w / (height * width), "aspect": w / h, "x": (left + w / 2) / width, "y": (top + h / 2) / height}

    draws = 3000
    ours = features(draw_boxes(np.random.default_rng(11), np.full(draws, height), np.full(draws, width), (0.08, 1.0), (3 / 4, 4 / 3)))
    torch.manual_seed(12)
    theirs = features(np.array([crop_params(height, width) for _ in range(draws)]))
    for name in ours:
        assert stats.ks_2samp(ours[name], theirs[name]).pvalue > 0.001, name
    narrower = features(draw_boxes(np.random.default_rng(11), np.full(draws, height), np.full(draws, width), (0.2, 1.0), (3 / 4, 4 / 3)))
    assert stats.ks_2samp(narrower["area"], theirs["area"]).pvalue < 1e-6  # the test can fail


def test_buffers_are_reused_and_a_kept_batch_is_never_overwritten(corpus: Path) -> None:
    """The loop keeps the first batch: always one of the ring's own buffers, so the ring must count it kept.

    Which batches get a one-off buffer instead depends on the threads' timing: the two decoding threads call
    ``take()`` in whichever order they get there, so the second batch's thread, held up on a loaded machine, may
    take after the third batch's and get a fallback (the ring never had it: not ``kept``, and never overwritten
    either). Keeping the second batch made this test fail in about one run in four on a busy 2-core machine. The
    first batch's ``take()`` comes before any later batch's but the second's (with ``prefetch`` 1 a thread takes the
    third only once the loop has the first), so it gets one of a fresh ring's first two buffers, ``slots`` being 2.
    """
    loader = ThreadLoader(ImageFolder(corpus, size=16), batch_size=2, shuffle=True, threads=2, prefetch=1, slots=2)
    kept = None
    for epoch in range(3):
        for k, (images, labels) in enumerate(loader):
            if epoch == 0 and k == 0:
                kept, copy = images, images.clone()
    stats_ = loader.stats()
    assert stats_["reused"] > 0 and stats_["kept"] == 1
    assert torch.equal(kept, copy), "a batch the loop kept was overwritten"


def test_every_kept_ring_batch_is_counted_and_none_is_overwritten(corpus: Path) -> None:
    """The loop keeps every batch of the first epoch; two more epochs reuse the ring's buffers around them.

    Exact whatever the timing: each first-epoch batch in a ring buffer (its batches less its fallbacks) is kept past
    ``slots`` newer ones, so it is counted kept once, and its buffer is never written again.
    """
    loader = ThreadLoader(ImageFolder(corpus, size=16), batch_size=2, shuffle=True, threads=2, prefetch=1, slots=2)
    kept = [(images, images.clone()) for images, _ in loader]
    first = loader.stats()
    assert first["batches"] == len(kept) == 10
    in_ring = first["batches"] - first["fallbacks"]
    assert in_ring >= 2, "a fresh ring's first two buffers are its own"
    for _ in range(2):
        for _ in loader:
            pass
    stats_ = loader.stats()
    assert stats_["kept"] == in_ring
    assert stats_["reused"] > 0
    assert all(torch.equal(images, copy) for images, copy in kept), "a batch the loop kept was overwritten"


def test_release_gives_a_held_batch_back_at_once(corpus: Path) -> None:
    loader = ThreadLoader(ImageFolder(corpus, size=16), batch_size=4, threads=1)
    iterator = iter(loader)
    batch = next(iterator)
    assert loader.release(batch) and not loader.release(batch), "released once, then no longer held"
    import fastpipe.loading

    assert fastpipe.loading.release(next(iterator)), "the package-level release reaches thread-loader batches too"
    assert not loader.release([torch.zeros(2)]), "not one of its batches"
    assert loader.stats()["released"] == 2
    iterator.close()


def test_prefetcher_releases_after_the_copy(corpus: Path) -> None:
    """On cpu the batches' values are checked; on sim each buffer goes back at its modelled copy's ready time, and the
    sim "device" batch aliases host memory (fastpipe.loading.recycled's rule), so only the release is checked there."""
    from fastpipe.loading import DevicePrefetcher

    loader = ThreadLoader(ImageFolder(corpus, size=16), batch_size=4, threads=2, pin_memory=True)
    seen = [labels.tolist() for _, labels in DevicePrefetcher(loader, "cpu")]
    assert sum(seen, []) == [label for _, label in loader.dataset.samples]
    released = loader.stats()["released"]
    assert sum(1 for _ in DevicePrefetcher(loader, "sim:1")) == 5
    assert loader.stats()["released"] >= released + 3


def test_generic_path_for_a_dataset_with_a_transform(corpus: Path) -> None:
    dataset = ImageFolder(corpus, size=16, hflip=0.0, transform=lambda image: image.float() / 255)
    batches = list(ThreadLoader(dataset, batch_size=8, threads=2))
    assert [b[0].shape[0] for b in batches] == [8, 8, 4] and batches[0][0].dtype == torch.float32


def test_on_error_skip_replaces_and_counts(corpus: Path, tmp_path: Path) -> None:
    root = tmp_path / "damaged"
    shutil.copytree(corpus, root)
    victim = sorted(root.glob("class_1/*"))[0]
    victim.write_bytes(victim.read_bytes()[:300])
    iterator = iter(ThreadLoader(ImageFolder(root, size=16), batch_size=4))
    with pytest.raises(CorruptImageError, match=victim.name):
        list(iterator)
    assert list(iterator) == [], "after the error the epoch is over; it does not hang"
    dataset = ImageFolder(root, size=16, on_error="skip")
    with pytest.warns(SkippedImageWarning, match=victim.name):
        batches = list(ThreadLoader(dataset, batch_size=4))
    assert sum(len(b[1]) for b in batches) == 20
    assert dataset.skipped.count == 1, "the dataset's own count, as with a DataLoader"


def test_bad_settings_say_what_to_change(corpus: Path) -> None:
    with pytest.raises(ConfigError, match="`threads` must be"):
        ThreadLoader(ImageFolder(corpus), batch_size=2, threads=0)
    with pytest.raises(ConfigError, match="batch_size"):
        ThreadLoader(ImageFolder(corpus), batch_size=None)


READ_DELAY_S = 0.01
"""Planted in every file read by :func:`slow_reads`: 40 ms per 4-image batch, far beyond a 5 ms simulated step."""


@pytest.fixture
def slow_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every read of a file (by path) sleeps READ_DELAY_S first, so the loader is input-bound on any machine, quiet or busy.

    Without it the diagnosis tests depended on the machine's speed: a loader that keeps up with the simulated step
    leaves the baseline within noise of the device bound, and the ladder then measures no host point (how
    test_diagnose_takes_it_as_a_loader failed once, on a quieter moment of a shared machine; a 60 ms step shows it
    every time). A sleep costs no CPU, so other load does not change the planted figure.
    """
    import os
    import time

    from fastpipe.ops import jpeg as jpeg_ops

    read = jpeg_ops.read_bytes

    def slow(source):
        if isinstance(source, (str, os.PathLike)):  # a file read; bytes already read pass through (header sizes, decode)
            time.sleep(READ_DELAY_S)
        return read(source)

    monkeypatch.setattr(jpeg_ops, "read_bytes", slow)


@pytest.mark.slow  # 5 s on a quiet 2-core machine, 11 s on a busy one: a whole (short) diagnosis
def test_diagnose_takes_it_as_a_loader(corpus: Path, slow_reads: None) -> None:
    """The ladder's device, host and baseline points are measured; the per-stage points are stated unavailable with
    the loader's reason; its ring's counts reach the report's notes; the user's sampler is not advanced."""
    from fastpipe import diagnose
    from fastpipe.datasets.threaded import BATCHES_WHOLE_REASON, UNSUPPORTED_POINT_REASON

    loader = ThreadLoader(ImageFolder(corpus, size=16), batch_size=4, shuffle=True, threads=2)
    report = diagnose(loader, lambda batch: None, device="sim:5", options=quick_options(steps=4, warmup=1, budget=1.0))
    for point in ("device", "host", "baseline"):
        assert report.experiment(point) is not None, point
    assert any(UNSUPPORTED_POINT_REASON in u.reason for u in report.unavailable)
    assert report.experiment("sample") is None and any(
        u.cache_point == "sample" and BATCHES_WHOLE_REASON in u.reason for u in report.unavailable
    )
    assert any("batches went into reused buffers" in note for note in report.notes)
    assert loader.stats()["batches"] == 0, "the diagnosis iterated its own copies, not the user's loader"


def test_stage_clocks_count_each_threads_work(corpus: Path) -> None:
    """The clocks the diagnosis differences: every image read, drawn, decoded and handed over once per epoch; the
    native threads decoding at once are a decoding thread's own (2 or 1 of the 3, at most one per image of its batch)
    plus the other decoding thread's; the generic path is one stage in the loop's thread."""
    loader = ThreadLoader(ImageFolder(corpus, size=16), batch_size=6, threads=3)
    assert loader.stage_clocks()["images"] == 0
    for _ in range(2):
        for _batch in loader:
            pass
    clocks = loader.stage_clocks()
    stages = {c["stage"]: c for c in clocks["stages"]}
    assert list(stages) == ["read", "draw", "decode", "hand-over", "wait"]
    assert (clocks["images"], clocks["batches"]) == (40, 8)
    assert all(c["items"] == 40 for c in stages.values())
    # batches of 6, 6, 6, 2 per epoch; a batch of 2 on either decoding thread: min(2, 2) + 1 or min(1, 2) + 2
    assert (stages["decode"]["calls"], stages["decode"]["threads"]) == (8, 2 * (3 + 3 + 3 + 3))
    assert stages["decode"]["thread"] == "decoding threads"
    assert stages["wait"]["calls"] == 10, "a wait per batch, and one per epoch for its end"
    assert all(c["seconds"] > 0 for c in stages.values())
    assert stages["read"]["thread"] == stages["draw"]["thread"] == "reading thread"

    generic = ThreadLoader(ImageFolder(corpus, size=16, transform=lambda image: image), batch_size=6)
    assert loader.batches_whole and generic.batches_whole is None, "the generic path does run dataset[i] and collate"
    list(generic)
    (only,) = generic.stage_clocks()["stages"]
    assert (only["stage"], only["thread"], only["items"], only["calls"]) == ("load + collate", "loop thread", 20, 4)


def test_diagnose_reports_its_stage_costs(corpus: Path, slow_reads: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The report's stage costs of a ThreadLoader, from its own clocks over the baseline's timed steps: a row per
    stage with positive figures, in the table, the Markdown and the JSON; the read row holds the planted read delay,
    the decode row's time per image is the op's own (loosely: the same files, one thread each), and the advice names
    the stage that dominates."""
    import json

    from fastpipe import diagnose
    from fastpipe.ops import jpeg as jpeg_ops

    dataset = ImageFolder(corpus, size=16)
    loader = ThreadLoader(dataset, batch_size=4, shuffle=True, threads=1)
    report = diagnose(loader, lambda batch: None, device="sim:5", options=quick_options(steps=4, warmup=1, budget=0.3))
    costs = report.loader_stage_costs
    assert costs is not None and costs.loader == "ThreadLoader" and costs.steps >= 4
    # no sample point: cached samples collated in the loop's thread would time a path this loader never runs
    assert report.experiment("sample") is None
    assert [c.stage for c in report.components][-1] == "raw load + transforms + hand-over", "no collate/IPC: it has none"
    assert [s.stage for s in costs.stages] == ["read", "draw", "decode", "hand-over", "wait"]
    for stage in costs.stages:
        assert stage.ms_per_step > 0 and stage.share_of_step > 0 and stage.ms_per_image > 0, stage
    read, decode = costs.stage("read"), costs.stage("decode")
    assert read.ms_per_image >= 1e3 * READ_DELAY_S, "the reading thread's clock holds the reads"
    assert decode.threads == 1 and decode.images >= 4 * costs.steps - 4 * loader.prefetch

    # the op alone on the same files, one call per image, boxes drawn as the loader draws them (after a warm-up pass)
    monkeypatch.undo()  # reads at full speed again: decode_jpeg_crop reads its source through read_bytes
    files = [jpeg_ops.read_bytes(path) for path, _ in dataset.samples]
    sizes = np.array([jpeg_ops.jpeg_size(data) for data in files])
    boxes = draw_boxes(np.random.default_rng(0), sizes[:, 0], sizes[:, 1], dataset.decode.scale, dataset.decode.ratio)
    import time

    for _ in range(2):  # the second pass is the one kept
        started = time.perf_counter()
        for data, box in zip(files, boxes):
            jpeg_ops.decode_jpeg_crop(data, tuple(int(v) for v in box), (16, 16))
        op_ms = 1e3 * (time.perf_counter() - started) / len(files)
    assert 0.3 * op_ms <= decode.ms_per_image <= 5 * op_ms, (decode.ms_per_image, op_ms)

    text, markdown = report.to_table(), report.to_markdown()
    for rendering in (text, markdown):
        assert "Stage costs of the ThreadLoader" in rendering and "decoding thread (1 native thread)" in rendering
        assert "do not add up to 100%" in rendering
        assert "In the ThreadLoader, read dominates" in rendering and "storage" in rendering, rendering
    assert "own clocks time its stages instead" in text, "the note where a DataLoader's would say the in-worker timing ran"
    data = json.loads(report.to_json())["loader_stage_costs"]
    assert data["schema"] == "fastpipe.loaderstages/1"
    assert {s["stage"]: s["ms_per_image"] for s in data["stages"]}["decode"] == pytest.approx(decode.ms_per_image)


@pytest.mark.gpu
def test_pinned_buffers_and_cuda_prefetch_gpu(corpus: Path) -> None:
    """On CUDA the ring's buffers are page-locked, batches arrive on the GPU in order, and buffers go back after the copy."""
    from fastpipe.loading import DevicePrefetcher

    loader = ThreadLoader(ImageFolder(corpus, size=16), batch_size=4, threads=2, pin_memory=True)
    images, _ = next(iter(loader))
    assert images.is_pinned()
    seen = [labels.cpu().tolist() for images, labels in DevicePrefetcher(loader, "cuda")]
    assert sum(seen, []) == [label for _, label in loader.dataset.samples]
    torch.cuda.synchronize()
    assert loader.stats()["released"] >= 3 and loader.stats()["pinning"] == "page-locked buffers"


@pytest.mark.parametrize("threads", [1, 2])
def test_next_on_a_replaced_or_closed_iterator_raises_instead_of_blocking(corpus: Path, threads: int) -> None:
    loader = ThreadLoader(ImageFolder(corpus, size=16), batch_size=4, threads=threads, prefetch=1)
    first = iter(loader)
    next(first)
    second = iter(loader)
    with pytest.raises(RuntimeError, match="iter\\(\\) was called again"):
        within(10, lambda: next(first))
    assert within(10, lambda: next(second))[1].shape == (4,)
    loader.close()
    with pytest.raises(RuntimeError, match="closed"):
        within(10, lambda: next(second))


@pytest.mark.parametrize("threads", [1, 2])
def test_a_failure_in_the_decoding_thread_reaches_next(corpus: Path, monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    from fastpipe.datasets import _thread_ring

    made = []

    def failing(ring):
        made.append(1)
        if len(made) > 1:
            raise MemoryError("no buffer for you")
        return torch.empty(ring.nbytes, dtype=torch.uint8)

    monkeypatch.setattr(_thread_ring.BufferRing, "_new", failing)
    loader = ThreadLoader(ImageFolder(corpus, size=16), batch_size=4, threads=threads, prefetch=1, slots=1)

    def keep_all() -> list:
        return [batch for batch in loader]  # keeps every batch: the ring must make more buffers

    with pytest.raises(MemoryError, match="no buffer for you"):
        within(10, keep_all)


@pytest.mark.parametrize("threads", [1, 2])
def test_epochs_that_end_early_give_their_buffers_back(corpus: Path, threads: int) -> None:
    import time

    loader = ThreadLoader(ImageFolder(corpus, size=16), batch_size=2, threads=threads, prefetch=2)
    for _ in range(loader.slots + 1):
        for _batch in loader:
            time.sleep(0.2)  # the threads fill both queues
            break
    before = loader.stats()["fallbacks"]
    for _batch in loader:
        pass
    assert loader.stats()["fallbacks"] == before, "a full epoch after early breaks still found every buffer taken"
    assert loader.stats()["ring_bytes"] <= loader.slots * loader._ring.nbytes


@pytest.mark.parametrize("threads", [1, 2])
def test_dropping_the_iterator_stops_its_threads(corpus: Path, threads: int) -> None:
    import gc
    import threading
    import time

    loader = ThreadLoader(ImageFolder(corpus, size=16), batch_size=2, threads=threads)
    iterator = iter(loader)
    next(iterator)
    decoding = [t for t in threading.enumerate() if t.name.startswith("fastpipe-decode")]
    assert len(decoding) >= min(threads, 2), "the name filter below sees the decoding threads"
    del iterator, decoding
    gc.collect()
    ours = ("fastpipe-read", "fastpipe-decode")  # other tests in this process may leave their own daemon threads
    deadline = time.perf_counter() + 5
    while any(t.name.startswith(ours) for t in threading.enumerate()) and time.perf_counter() < deadline:
        time.sleep(0.05)
    assert not [t.name for t in threading.enumerate() if t.name.startswith(ours)]


def test_the_readme_form_takes_the_fast_path_and_is_reproducible(corpus: Path) -> None:
    """Compose([RandomResizedCrop, RandomHorizontalFlip, PILToTensor]) is absorbed: the batch op, draws from the epoch's
    seed (two seeded runs give the same batches, the loop's own draws in between), and the global RNG moves as a
    DataLoader's (the epoch's seed only)."""
    import torchvision.transforms as T

    dataset = ImageFolder(corpus, transform=T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.PILToTensor()]))
    loader = ThreadLoader(dataset, batch_size=8, threads=2, shuffle=True)

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        images = []
        for batch in loader:
            images.append(batch[0].clone())
            torch.rand(100)  # the training loop's own draws
        return torch.cat(images), torch.rand(1)

    first, second = run(), run()
    assert torch.equal(first[0], second[0])
    torch.manual_seed(0)
    for _ in DataLoader(range(len(dataset)), batch_size=8, shuffle=True):
        torch.rand(100)
    assert torch.equal(first[1], torch.rand(1)), "the global RNG moved otherwise than a DataLoader's"
    assert loader.fast()

    class Overridden(ImageFolder):
        def __getitem__(self, index: int):
            return super().__getitem__(index)

    assert not ThreadLoader(Overridden(corpus, size=16), batch_size=4).fast()


def test_the_generic_path_is_reproducible_under_a_seed(corpus: Path) -> None:
    import torchvision.transforms as T

    transform = T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4), T.PILToTensor()])
    loader = ThreadLoader(ImageFolder(corpus, transform=transform), batch_size=8, threads=2)
    assert not loader.fast()
    runs = []
    for _ in range(2):
        torch.manual_seed(1)
        runs.append(torch.cat([batch[0] for batch in loader]))
    assert torch.equal(runs[0], runs[1])


def test_a_custom_batch_sampler_is_not_scanned_ahead(corpus: Path) -> None:
    from torch.utils.data import BatchSampler, RandomSampler

    dataset = ImageFolder(corpus, size=16)
    sampler = BatchSampler(RandomSampler(range(len(dataset))), 5, False)
    torch.manual_seed(0)
    theirs = DataLoader(range(len(dataset)), batch_sampler=sampler)
    expected = [[[dataset.samples[i][1] for i in b] for b in theirs] for _ in range(2)], torch.rand(1)
    torch.manual_seed(0)
    loader = ThreadLoader(dataset, batch_size=None, batch_sampler=sampler, threads=1)
    got = [[b[1].tolist() for b in loader] for _ in range(2)], torch.rand(1)
    assert got[0] == expected[0] and torch.equal(got[1], expected[1])


def test_on_sim_a_buffer_is_not_rewritten_while_the_step_holds_its_batch(corpus: Path) -> None:
    """The sim "device" batch is the host buffer itself: it goes back to the ring only once nothing refers to it."""
    import time

    from fastpipe.loading import DevicePrefetcher

    loader = ThreadLoader(ImageFolder(corpus, size=16), batch_size=2, threads=1, prefetch=1, slots=2, pin_memory=True)
    changed = 0
    for images, _labels in DevicePrefetcher(loader, "sim:1", depth=1):
        snapshot = images.clone()
        time.sleep(0.03)  # the step reads the batch while the decoding thread writes the next ones
        changed += not torch.equal(snapshot, images)
    assert changed == 0
    assert loader.stats()["released"] > 0


def test_with_dataset_maps_dataloader_settings(corpus: Path) -> None:
    loader = ThreadLoader(ImageFolder(corpus, size=16), batch_size=4, threads=1)
    other = loader.with_dataset(loader.dataset, num_workers=3, prefetch_factor=4)
    assert (other.threads, other.prefetch) == (3, 4)
    assert loader.with_dataset(loader.dataset, num_workers=0).threads == 1
    with pytest.raises(ConfigError, match="cannot change"):
        loader.with_dataset(loader.dataset, persistent_workers=True)


def test_no_private_names_from_other_packages_and_sorted_exports() -> None:
    """The loader's modules import other packages' public names only; ``fastpipe.datasets.__all__`` is sorted."""
    import ast

    import fastpipe.datasets

    root = Path(fastpipe.datasets.__file__).parent
    for name in ("threaded.py", "_thread_epoch.py", "_thread_ring.py", "_draws.py"):
        for node in ast.walk(ast.parse((root / name).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.module.startswith("fastpipe.datasets"):
                private = [part for part in node.module.split(".") if part.startswith("_")]
                private += [alias.name for alias in node.names if alias.name.startswith("_")]
                assert not (node.module.startswith("fastpipe") and private), f"{name} imports {private} from {node.module}"
    assert fastpipe.datasets.__all__ == sorted(fastpipe.datasets.__all__)


def test_stats_report_what_was_allocated(corpus: Path) -> None:
    dataset = ImageFolder(corpus, size=16)
    loader = ThreadLoader(dataset, batch_size=None, batch_sampler=[[0, 1], [2, 3, 4], [5], [6, 7]], threads=1)
    sizes = [len(labels) for _images, labels in loader]
    stats_ = loader.stats()
    assert sizes == [2, 3, 1, 2] and stats_["grown"] == 1, "sized from the batches received: 2, then grown to 3"
    per_3, per_2 = 3 * (3 * 16 * 16 + 8), 2 * (3 * 16 * 16 + 8)  # the first 2-image buffer is dropped at its next take
    made = {a * per_3 + b * per_2 for a in range(1, loader.slots + 1) for b in (0, 1) if a + b <= loader.slots}
    assert stats_["ring_bytes"] in made, (stats_["ring_bytes"], sorted(made))


def _slow_even_batches(monkeypatch: pytest.MonkeyPatch, samples: list, batch_size: int, seconds: float, fail: int | None = None) -> None:
    """Make the batch op sleep ``seconds`` on the even batches of an unshuffled epoch over ``samples`` (so the two decoding
    threads finish out of order) and fail on batch ``fail``; batches are told apart by their files' names."""
    import time

    from fastpipe.datasets import _thread_epoch

    real = _thread_epoch.decode_jpeg_crop_batch
    number = {samples[i][0]: i // batch_size for i in range(len(samples))}

    def slow(*args, names, **kwargs):
        batch = number[names[0]]
        if batch == fail:
            raise CorruptImageError(f"planted failure in batch {batch}")
        if batch % 2 == 0:
            time.sleep(seconds)
        return real(*args, names=names, **kwargs)

    monkeypatch.setattr(_thread_epoch, "decode_jpeg_crop_batch", slow)


def test_two_decoding_threads_deliver_in_order_when_they_finish_out_of_order(corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """threads=2 runs two decoding threads taking batches in turn; a slow batch does not let the next one overtake it."""
    from fastpipe.datasets._thread_epoch import decoder_threads

    assert decoder_threads(1) == [1] and decoder_threads(2) == [1, 1] and decoder_threads(5) == [3, 2]
    dataset = ImageFolder(corpus, size=16)
    expected = labels_of(DataLoader(dataset, batch_size=2), 11)
    _slow_even_batches(monkeypatch, dataset.samples, 2, 0.05)
    ours = ThreadLoader(dataset, batch_size=2, threads=2)
    assert within(30, lambda: labels_of(ours, 11)) == expected
    assert ours.stats()["fallbacks"] == 0, "no more buffers in use than the ring has"


@pytest.mark.parametrize("threads", [1, 2])
def test_a_failing_batch_arrives_after_the_batches_before_it(corpus: Path, monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """Batch 2 fails at once while batch 0 still sleeps on the other decoding thread: next() gives batches 0 and 1, then
    batch 2's error, then the end."""
    dataset = ImageFolder(corpus, size=16)
    _slow_even_batches(monkeypatch, dataset.samples, 2, 0.05, fail=2)
    loader = ThreadLoader(dataset, batch_size=2, threads=threads)
    iterator = iter(loader)
    got = [within(10, lambda: next(iterator)) for _ in range(2)]
    assert [batch[1].tolist() for batch in got] == [[t for _, t in dataset.samples[k : k + 2]] for k in (0, 2)]
    with pytest.raises(CorruptImageError, match="planted failure in batch 2"):
        within(10, lambda: next(iterator))
    with pytest.raises(StopIteration):  # the epoch ended with its error
        within(10, lambda: next(iterator))


@pytest.mark.parametrize("threads", [1, 2])
def test_an_empty_epoch_and_a_reading_error_end_cleanly(corpus: Path, monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    from fastpipe.ops import jpeg as jpeg_ops

    dataset = ImageFolder(corpus, size=16)
    empty = ThreadLoader(dataset, batch_size=4, sampler=[], threads=threads)
    assert within(10, lambda: list(empty)) == []
    real = jpeg_ops.read_bytes
    bad = dataset.samples[9][0]

    def read(path):
        if str(path) == bad:
            raise OSError(f"planted: cannot read {path}")
        return real(path)

    monkeypatch.setattr(jpeg_ops, "read_bytes", read)
    loader = ThreadLoader(dataset, batch_size=4, threads=threads)
    iterator = iter(loader)
    got = [within(10, lambda: next(iterator))[1].tolist() for _ in range(2)]
    assert got == [[t for _, t in dataset.samples[k : k + 4]] for k in (0, 4)], "the batches before the failing one, in order"
    with pytest.raises(OSError, match="planted: cannot read"):
        within(10, lambda: next(iterator))


def test_decode_clock_counts_overlapping_decoding_threads_once(corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two decoding threads of one native thread each, side by side in the op: decode_s is their native threads' time
    over the 2 threads, so the decode share of an epoch stays at most its wall time (not twice it), and
    busy_seconds, the wall time either is in the op, is no more than the epoch's either."""
    import threading
    import time

    from fastpipe.datasets import _thread_epoch

    real = _thread_epoch.decode_jpeg_crop_batch
    inside = [0, 0]  # now, most at once
    lock = threading.Lock()

    def sleepy(*args, **kwargs):
        with lock:
            inside[0] += 1
            inside[1] = max(inside)
        time.sleep(0.08)
        with lock:
            inside[0] -= 1
        return real(*args, **kwargs)

    monkeypatch.setattr(_thread_epoch, "decode_jpeg_crop_batch", sleepy)
    loader = ThreadLoader(ImageFolder(corpus, size=16), batch_size=2, threads=2)
    started = time.perf_counter()
    within(30, lambda: [batch for batch in loader])
    wall = time.perf_counter() - started
    decode_clock = loader.stage_clocks()["stages"][2]
    decode_s = decode_clock["seconds"]
    assert decode_s <= decode_clock["busy_seconds"] * 1.001 <= wall * 1.001
    assert inside[1] == 2, "the two decoding threads did decode at once"
    assert decode_s >= 10 * 0.08 / 2 * 0.9, "ten 80 ms sleeps, two at a time"


@pytest.mark.parametrize(
    "threads, batch, read_ms, op_ms, named, decode_ms, at_once",
    [
        # reads 32 ms a batch; the op 40 ms a batch on one native thread, 20 on both: the reads set the pace
        (2, 4, 8.0, 10.0, "read", (17, 28), (1.0, 1.9)),
        # batches of 1: of each decoding thread's 2 natives one decodes, 2 at once in all (not 4): 10 ms a batch
        # against reads of 7, so decode sets the pace (counted over 4 threads it would read 5 ms and name the read)
        (4, 1, 7.0, 20.0, "decode", (8, 14), (1.4, 2.0)),
        # natives split 2 + 1: batches of 4 take 20 and 40 ms, 13.3 ms a batch over the 3 threads; reads 4 ms
        (3, 4, 1.0, 10.0, "decode", (10.5, 20), (2.0, 3.0)),
    ],
)
def test_planted_decode_and_read_costs_name_the_stage_that_sets_the_pace(
    corpus: Path,
    monkeypatch: pytest.MonkeyPatch,
    threads: int,
    batch: int,
    read_ms: float,
    op_ms: float,
    named: str,
    decode_ms: tuple[float, float],
    at_once: tuple[float, float],
) -> None:
    """Planted reads (per file) and a planted op (per image, one native thread per image at most): the decode row is its
    native threads' time over the most that can decode at once (not the wall time a decoding thread spends alone with
    part of them), the dominant stage is the one that sets the pace, and how many decoded at once is measured."""
    import time

    from fastpipe.datasets import _thread_epoch
    from fastpipe.diagnosis.ladder._loader_stages import LoaderStageCosts, StageWindow
    from fastpipe.diagnosis.verdict._advice import recommend_loader_stage
    from fastpipe.ops import jpeg as jpeg_ops

    real_read, real_op = jpeg_ops.read_bytes, _thread_epoch.decode_jpeg_crop_batch

    def slow_read(source):
        if isinstance(source, (str, Path)):  # a file read, not the header's look at bytes already read
            time.sleep(read_ms / 1e3)
        return real_read(source)

    def slow_op(data, *args, threads, **kwargs):
        time.sleep(op_ms / 1e3 * len(data) / min(threads, len(data)))
        return real_op(data, *args, threads=threads, **kwargs)

    monkeypatch.setattr(jpeg_ops, "read_bytes", slow_read)
    monkeypatch.setattr(_thread_epoch, "decode_jpeg_crop_batch", slow_op)
    images = 40 if batch > 1 else 30
    loader = ThreadLoader(ImageFolder(corpus, size=16), batch_size=batch, sampler=[i % 20 for i in range(images)], threads=threads)
    window = StageWindow(loader, warmup=2)
    for i, _batch in enumerate(loader):
        window.on_step(i)
    costs = LoaderStageCosts.from_windows("ThreadLoader", [window.finish()])
    assert costs is not None
    decode = costs.stage("decode")
    assert costs.dominant() is costs.stage(named), costs.stages
    assert decode_ms[0] <= decode.ms_per_step <= decode_ms[1], decode
    assert decode.at_once is not None and at_once[0] < decode.at_once <= at_once[1], decode
    assert "decoded at once on average" in "\n".join(costs.lines())
    advice = recommend_loader_stage(costs, loader.dataset, 2, threads=threads, batch_size=batch)
    assert advice is not None and f"{named} dominates" in advice.summary
