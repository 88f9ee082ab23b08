"""ThreadLoader: a DataLoader's batches, order and semantics, decoded by threads into reused buffers."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from fastpipe.datasets import ImageFolder, ThreadLoader
from fastpipe.datasets._draws import draw_boxes
from fastpipe.errors import ConfigError

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
    loader = ThreadLoader(ImageFolder(corpus, size=16), batch_size=2, shuffle=True, threads=2, prefetch=1, slots=2)
    kept = None
    for epoch in range(3):
        for k, (images, labels) in enumerate(loader):
            if epoch == 0 and k == 1:
                kept, copy = images, images.clone()
    stats_ = loader.stats()
    assert stats_["reused"] > 0 and stats_["kept"] == 1
    assert torch.equal(kept, copy), "a batch the loop kept was overwritten"


def test_release_gives_a_held_batch_back_at_once(corpus: Path) -> None:
    loader = ThreadLoader(ImageFolder(corpus, size=16), batch_size=4, threads=1)
    iterator = iter(loader)
    batch = next(iterator)
    assert loader.release(batch) and not loader.release(batch), "released once, then no longer held"
    import fastpipe

    assert fastpipe.release(next(iterator)), "the package-level release reaches thread-loader batches too"
    assert not loader.release([torch.zeros(2)]), "not one of its batches"
    assert loader.stats()["released"] == 2
    iterator.close()


def test_prefetcher_releases_after_the_copy(corpus: Path) -> None:
    """On cpu the batches' values are checked; on sim each buffer goes back at its modelled copy's ready time, and the
    sim "device" batch aliases host memory (fastpipe.recycled's rule), so only the release is checked there."""
    from fastpipe.loading import DevicePrefetcher

    loader = ThreadLoader(ImageFolder(corpus, size=16), batch_size=4, threads=2, pin_memory=True)
    seen = [labels.tolist() for _, labels in DevicePrefetcher(loader, "cpu")]
    assert sum(seen, []) == [label for _, label in loader.dataset.samples]
    released = loader.stats()["released"]
    assert len(list(DevicePrefetcher(loader, "sim:1"))) == 5
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
    with pytest.raises(Exception, match=victim.name):
        list(iterator)
    assert list(iterator) == [], "after the error the epoch is over; it does not hang"
    with pytest.warns(UserWarning, match=victim.name):
        batches = list(ThreadLoader(ImageFolder(root, size=16, on_error="skip"), batch_size=4))
    assert sum(len(b[1]) for b in batches) == 20


def test_bad_settings_say_what_to_change(corpus: Path) -> None:
    with pytest.raises(ConfigError, match="`threads` must be"):
        ThreadLoader(ImageFolder(corpus), batch_size=2, threads=0)
    with pytest.raises(ConfigError, match="batch_size"):
        ThreadLoader(ImageFolder(corpus), batch_size=None)


@pytest.mark.slow  # 5 s on a quiet 2-core machine, 11 s on a busy one: a whole (short) diagnosis
def test_diagnose_takes_it_as_a_loader(corpus: Path) -> None:
    """The ladder's device, host and baseline points are measured; the per-stage points are stated unavailable with
    the loader's reason; its ring's counts reach the report's notes; the user's sampler is not advanced."""
    from fastpipe import diagnose
    from fastpipe.datasets.threaded import UNSUPPORTED_POINT_REASON

    loader = ThreadLoader(ImageFolder(corpus, size=16), batch_size=4, shuffle=True, threads=2)
    report = diagnose(loader, lambda batch: None, "sim:5", steps=4, warmup=1, budget=1.0, progress=False)
    for point in ("device", "host", "baseline"):
        assert report.experiment(point) is not None, point
    assert any(UNSUPPORTED_POINT_REASON in u.reason for u in report.unavailable)
    assert any("batches went into reused buffers" in note for note in report.notes)
    assert loader.stats()["batches"] == 0, "the diagnosis iterated its own copies, not the user's loader"


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
