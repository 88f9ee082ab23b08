"""Everything the user's loader did is kept, or the fix is refused (:mod:`fastpipe.experiments._fix_keep`), on the
settings torchvision's reference ``train.py`` and others really use: a mixup/cutmix ``collate_fn`` (its
``--mixup-alpha``), a custom sampler, a ``worker_init_fn``, a seeded generator; and the ThreadLoader keeping a
collate_fn and a batch sampler. Nothing is measured."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision
from torch.utils.data import DataLoader, Sampler
from torch.utils.data.dataloader import default_collate

from fastpipe.datasets import ImageFolder, ThreadLoader
from fastpipe.experiments._fix_candidates import build_candidates
from fastpipe.experiments._fix_keep import compare_loaders, custom_collate, refusal
from fastpipe.ops import jpeg as jpeg_ops
from fastpipe.workloads import Workload
from tests.fakes.fix import PresetTrain, corpus

requires_op = pytest.mark.skipif(not jpeg_ops.JPEG_OP_AVAILABLE, reason=jpeg_ops.jpeg_op_status())
CLASSES = 2


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return corpus(tmp_path_factory.mktemp("photos") / "corpus", n=12, classes=CLASSES)


def _mixup_collate():
    """torchvision's reference ``train.py`` with ``--mixup-alpha``: ``collate_fn = lambda batch:
    mixupcutmix(*default_collate(batch))``, here with torchvision's v2 MixUp (it needs float images)."""
    from torchvision.transforms import v2

    mixup = v2.MixUp(alpha=0.2, num_classes=CLASSES)
    return lambda batch: mixup(*default_collate(batch))


class EveryOther(Sampler[int]):
    """A user's own sampler: even indices, then odd ones."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter([*range(0, self.n, 2), *range(1, self.n, 2)])

    def __len__(self) -> int:
        return self.n


def seed_worker(worker_id: int) -> None:  # the PyTorch docs' reproducibility recipe
    import random

    import numpy as np

    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def _by_name(candidates):
    return {c.name: c for c in candidates}


def test_a_thread_loader_without_the_collate_fn_is_refused_and_says_which() -> None:
    collate = _mixup_collate()
    original = DataLoader(list(range(8)), batch_size=4, collate_fn=collate)
    why = refusal(original, ThreadLoader(list(range(8)), batch_size=4))
    assert why is not None and "cannot keep the loader's collate_fn" in why and "mixup/cutmix lives there" in why
    assert refusal(original, ThreadLoader(list(range(8)), batch_size=4, collate_fn=collate)) is None


def test_a_custom_sampler_drop_last_and_a_generator_must_be_kept() -> None:
    data = list(range(10))
    generator = torch.Generator().manual_seed(7)
    original = DataLoader(data, batch_size=3, sampler=EveryOther(10), drop_last=True, generator=generator)
    assert (
        refusal(
            original, ThreadLoader(data, batch_size=3, sampler=EveryOther(10), drop_last=True, generator=torch.Generator().manual_seed(7))
        )
        is None
    )
    assert "EveryOther" in refusal(original, ThreadLoader(data, batch_size=3, drop_last=True, generator=generator))
    assert "drop_last=True" in refusal(original, ThreadLoader(data, batch_size=3, sampler=EveryOther(10), generator=generator))
    unseeded = refusal(original, ThreadLoader(data, batch_size=3, sampler=EveryOther(10), drop_last=True))
    assert unseeded is not None and "generator" in unseeded


def test_a_worker_init_fn_cannot_be_kept_without_worker_processes() -> None:
    data = list(range(8))
    original = DataLoader(data, batch_size=4, num_workers=2, worker_init_fn=seed_worker, persistent_workers=True)
    why = refusal(original, ThreadLoader(data, batch_size=4))
    assert why is not None and "worker_init_fn (tests.experiments.test_fix_keep.seed_worker)" in why and "no worker processes" in why
    rebuilt = DataLoader(data, batch_size=4, num_workers=1, worker_init_fn=seed_worker, persistent_workers=True)
    assert refusal(original, rebuilt) is None  # another worker count keeps the function and persistent workers
    dropped = DataLoader(data, batch_size=4, num_workers=1, worker_init_fn=seed_worker)
    assert "persistent_workers=True" in refusal(original, dropped)
    settings = [k.setting for k in compare_loaders(original, rebuilt)]
    assert settings[:1] == ["collate_fn"] and {"sampler", "generator", "pin_memory"} <= set(settings)


def test_a_collate_fn_is_refused_where_the_samples_it_gets_change() -> None:
    collate = _mixup_collate()
    original = DataLoader(list(range(8)), batch_size=4, collate_fn=collate)
    same = DataLoader(list(range(8)), batch_size=4, collate_fn=collate)
    assert refusal(original, same) is None
    why = refusal(original, same, changes_samples="uint8 images")
    assert why is not None and "would get uint8 images" in why
    assert custom_collate(DataLoader(list(range(4)))) is None and custom_collate(original) is collate


@requires_op
def test_with_a_mixup_collate_the_candidates_keep_it_or_are_not_tried(photos: Path) -> None:
    dataset = torchvision.datasets.ImageFolder(str(photos), PresetTrain(32))
    loader = DataLoader(dataset, batch_size=4, shuffle=True, collate_fn=_mixup_collate(), num_workers=1, worker_init_fn=seed_worker)
    workload = Workload(loader=loader, step=lambda b: None, name="tv mixup")
    candidates, _ = build_candidates(workload)
    by = _by_name(candidates)
    decode = by["decode only the crop (the same transform)"]
    assert decode.not_tried is None and decode.loader.collate_fn is loader.collate_fn  # the same transform: kept
    assert decode.loader.worker_init_fn is seed_worker and decode.original is workload
    uint8 = by["uint8 over the copy, Normalize on the device"]
    assert uint8.workload is None and "collate_fn" in uint8.not_tried and "uint8 images" in uint8.not_tried
    threaded = by["ThreadLoader over the decode-the-crop dataset"]
    assert threaded.workload is None and "worker_init_fn" in threaded.not_tried
    recycled = by["recycled batch memory"]
    assert recycled.not_tried is None and custom_collate(recycled.loader) is loader.collate_fn


@requires_op
def test_the_thread_loader_runs_the_users_collate_on_the_fast_path_and_keeps_a_batch_sampler(photos: Path) -> None:
    import torchvision.transforms as v1

    seen = []

    def collate(samples):
        seen.append(len(samples))
        images, labels = default_collate(samples)
        return images.float(), labels

    dataset = ImageFolder(str(photos), transform=v1.Compose([v1.RandomResizedCrop(32), v1.PILToTensor()]))
    batches = torch.utils.data.BatchSampler(EveryOther(len(dataset)), batch_size=5, drop_last=False)
    loader = ThreadLoader(dataset, batch_sampler=batches, collate_fn=collate, threads=1)
    assert loader.fast()
    out = list(loader)
    assert seen == [5, 5, 2] and [len(b[1]) for b in out] == [5, 5, 2]
    assert out[0][0].dtype == torch.float32 and out[0][0].shape == (5, 3, 32, 32)
    assert out[0][1].tolist() == [dataset.samples[i][1] for i in range(0, 10, 2)]
    again = loader.with_dataset(dataset)
    assert again.collate_fn is collate and refusal(DataLoader(dataset, batch_sampler=batches, collate_fn=collate), again) is None


@requires_op
def test_the_input_check_compares_before_a_kept_random_collate(photos: Path) -> None:
    """Mixup draws in whichever process collates: the check compares what enters the (same, kept) collate_fn."""
    from fastpipe.experiments._fix import check_candidate
    from fastpipe.experiments._fix_candidates import level_unit, view_of

    dataset = torchvision.datasets.ImageFolder(str(photos), PresetTrain(32))
    loader = DataLoader(dataset, batch_size=4, shuffle=True, collate_fn=_mixup_collate())
    workload = Workload(loader=loader, step=lambda b: None, name="tv mixup")
    candidates, _ = build_candidates(workload)
    threaded = _by_name(candidates)["ThreadLoader over the decode-the-crop dataset"]
    assert threaded.not_tried is None and threaded.loader.collate_fn is loader.collate_fn  # no workers to lose here
    view, _ = view_of(workload)
    checked = check_candidate(workload, threaded, level_unit(workload, view.leaves))
    assert checked.passed, checked.line()
    assert checked.labels_equal and "compared before the loader's collate_fn, which the fix keeps" in checked.line()
    assert loader.collate_fn is threaded.loader.collate_fn  # the user's loader and the candidate's keep it afterwards
