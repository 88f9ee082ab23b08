"""Damaged files in fastpipe.datasets: ImageFolder(on_error="raise" | "pil" | "skip"), messages that name the file, skip counts across workers."""

from __future__ import annotations

import copy
import pickle
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import fastpipe.ops.jpeg as jpeg
from fastpipe.datasets import DecodeCropLoader, ImageFolder
from fastpipe.datasets.crop import crop_params, draw_flip
from fastpipe.datasets.folder import SkippedImageWarning
from fastpipe.errors import ConfigError, CorruptImageError
from tests.fakes import quick_options

pytest.importorskip("skimage", reason="the corpus needs scikit-image: pip install 'fastpipe[photos]'")
requires_op = pytest.mark.skipif(not jpeg.JPEG_OP_AVAILABLE, reason=jpeg.jpeg_op_status())


def _build_corpus(root: Path, n: int) -> Path:
    from fastpipe.workloads.photos import build_corpus

    return build_corpus(root, n=n, seed=0, classes=2)


def corrupt_scan(data: bytes) -> bytes:
    """Random bytes over the start of the entropy-coded data, which every box must decode (or skip through):
    libjpeg warns ("Corrupt JPEG data"), PIL decodes through it."""
    out = bytearray(data)
    start = out.index(b"\xff\xda")
    out[start + 30 : start + 830] = np.random.default_rng(1).integers(0, 256, 800, dtype=np.uint8).tobytes()
    return bytes(out)


def truncate_scan(data: bytes) -> bytes:
    """Cut 20 bytes into the first scan: no box can be decoded, by the op or by PIL."""
    return data[: data.index(b"\xff\xda") + 20]


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 6-file folder in 2 classes (class_0: indices 0-2, class_1: 3-5) whose index 1 (class_0/00002.jpg) has
    corrupt scan data and index 2 (class_0/00004.jpg) is truncated."""
    root = tmp_path_factory.mktemp("damaged") / "root"
    shutil.copytree(_build_corpus(tmp_path_factory.mktemp("photos") / "corpus", 6), root, ignore=shutil.ignore_patterns(".*"))
    warned = root / "class_0" / "00002.jpg"
    warned.write_bytes(corrupt_scan(warned.read_bytes()))
    truncated = root / "class_0" / "00004.jpg"
    truncated.write_bytes(truncate_scan(truncated.read_bytes()))
    return {"root": root, "warned": warned, "truncated": truncated}


def index_of(dataset: ImageFolder, path: Path) -> int:
    return [p for p, _ in dataset.samples].index(str(path))


@requires_op
def test_raise_names_the_file_not_a_placeholder(damaged: dict[str, Path]) -> None:
    dataset = ImageFolder(damaged["root"], size=32)
    for key in ("warned", "truncated"):
        path = damaged[key]
        with pytest.raises(CorruptImageError) as info:
            dataset[index_of(dataset, path)]
        message = str(info.value)
        assert message.startswith(f"{path}: ") and jpeg.UNNAMED_SOURCE not in message and "<" not in message, message
    with pytest.raises(CorruptImageError) as info:  # the loader for torchvision's ImageFolder says the same
        DecodeCropLoader(32)(damaged["truncated"])
    assert str(info.value).startswith(f"{damaged['truncated']}: ") and "<" not in str(info.value)


@requires_op
def test_pil_decodes_what_libjpeg_only_warned_about_on_the_same_box(damaged: dict[str, Path]) -> None:
    dataset = ImageFolder(damaged["root"], size=40, on_error="pil")
    path = damaged["warned"]
    torch.manual_seed(3)
    image, label = dataset[index_of(dataset, path)]
    torch.manual_seed(3)  # the same draws as the dataset: box from the header's size, then the flip
    box = crop_params(*jpeg.jpeg_size(path))
    flip = draw_flip(0.5)
    assert label == 0 and image.shape == (3, 40, 40) and image.dtype == torch.uint8
    assert torch.equal(image, jpeg.decode_pil(path, box, (40, 40), hflip=flip))


@requires_op
def test_pil_still_raises_what_pil_cannot_decode(damaged: dict[str, Path]) -> None:
    dataset = ImageFolder(damaged["root"], size=32, on_error="pil")
    with pytest.raises(CorruptImageError, match=rf"^{damaged['truncated']}: .*truncated"):
        dataset[index_of(dataset, damaged["truncated"])]


@requires_op
def test_skip_returns_the_next_file_that_decodes_and_counts(damaged: dict[str, Path]) -> None:
    dataset = ImageFolder(damaged["root"], size=32, on_error="skip")
    reference = ImageFolder(damaged["root"], size=32)
    i = index_of(dataset, damaged["truncated"])
    with pytest.warns(SkippedImageWarning, match=str(damaged["truncated"])):
        torch.manual_seed(0)
        first = dataset[i]
    assert dataset.skipped.count == 1
    # Deterministic: the same seed gives the same replacement, and it is the next file's sample.
    torch.manual_seed(0)
    with pytest.warns(SkippedImageWarning):
        again = dataset[i]
    assert torch.equal(first[0], again[0]) and first[1] == again[1] == reference.samples[i + 1][1]
    assert dataset.skipped.reset() == 2 and dataset.skipped.count == 0
    # Two bad files in a row (indices 1 and 2; 3 is good): two skips.
    j = index_of(dataset, damaged["warned"])
    with pytest.warns(SkippedImageWarning):
        _, label = dataset[j]
    assert dataset.skipped.count == 2 and label == reference.samples[j + 2][1]


@requires_op
def test_skip_gives_up_when_no_file_decodes(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    for k in range(3):
        (tmp_path / "a" / f"{k}.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg at all")
    dataset = ImageFolder(tmp_path, size=16, on_error="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedImageWarning)
        with pytest.raises(CorruptImageError, match="none of the 3 files could be decoded"):
            dataset[1]
    assert dataset.skipped.count == 3


def test_on_error_is_checked() -> None:
    with pytest.raises(ConfigError, match="on_error must be one of 'raise', 'pil', 'skip'"):
        ImageFolder(Path(__file__).parent, on_error="ignore")
    with pytest.raises(ConfigError, match="on_error must be one of 'raise', 'pil'"):
        DecodeCropLoader(32, on_error="skip")


@requires_op
@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])  # spawn: ~15 s of worker imports
def test_skips_in_workers_are_counted_in_the_main_process(damaged: dict[str, Path], context: str) -> None:
    """Workers are other processes: the count lives in shared memory, inherited (fork) or sent with the dataset (spawn)."""
    dataset = ImageFolder(damaged["root"], size=24, on_error="skip")
    loader = DataLoader(dataset, batch_size=2, num_workers=2, multiprocessing_context=context, persistent_workers=True)
    for epoch in range(2):
        labels = torch.cat([labels for _, labels in loader])
        assert len(labels) == len(dataset)
        # Sample 1 skips files 1 and 2, sample 2 skips file 2: 3 skips an epoch, whichever worker met them.
        assert dataset.skipped.reset() == 3, f"epoch {epoch}"


def test_copies_outside_worker_start_get_their_own_count(damaged: dict[str, Path]) -> None:
    dataset = ImageFolder(damaged["root"], size=24, on_error="skip")
    dataset.skipped.add()
    for clone in (copy.deepcopy(dataset), pickle.loads(pickle.dumps(dataset))):
        assert clone.skipped.count == 1
        clone.skipped.add()
        assert clone.skipped.count == 2 and dataset.skipped.count == 1


@requires_op
@pytest.mark.parametrize("point", ["baseline", "raw", "after:DecodeCrop"])
def test_skip_works_where_a_diagnosis_replays_the_stages(damaged: dict[str, Path], point: str) -> None:
    """A diagnosis runs the declared stages wrapped (a StageError around the CorruptImageError): still skipped and counted;
    under "raise" the error names the file, not the op's placeholder for unnamed bytes."""
    from fastpipe.diagnosis.discovery._pipeline import find_pipeline
    from fastpipe.diagnosis.ladder._cache import CachePointDataset

    dataset = ImageFolder(damaged["root"], size=24, on_error="skip")
    pipeline, _ = find_pipeline(dataset)
    cached = CachePointDataset(dataset, pipeline, point)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        items = [cached[i] for i in (index_of(dataset, damaged["truncated"]), 0, 5)]
    assert all(image.shape == (3, 24, 24) for image, _ in items) and dataset.skipped.count >= 1
    raising = ImageFolder(damaged["root"], size=24)
    replay = CachePointDataset(raising, pipeline=find_pipeline(raising)[0], point="baseline")
    with pytest.raises(Exception, match="DecodeCrop") as info:
        replay[index_of(raising, damaged["truncated"])]
    assert str(damaged["truncated"]) in str(info.value) and jpeg.UNNAMED_SOURCE not in str(info.value)


def test_a_diagnosis_snapshot_puts_the_users_skip_count_back(damaged: dict[str, Path]) -> None:
    from fastpipe.diagnosis.runtime._snapshot import UserState

    dataset = ImageFolder(damaged["root"], size=24, on_error="skip")
    dataset.skipped.add()
    loader = DataLoader(torch.utils.data.Subset(dataset, [0, 1]), batch_size=2)  # found through the Subset too
    state = UserState(loader=loader)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        for index in (index_of(dataset, damaged["truncated"]), index_of(dataset, damaged["warned"])):
            dataset[index]
    assert state.skipped_during() == dataset.skipped.count - 1 >= 2
    state.restore()
    assert dataset.skipped.count == 1
    assert UserState(loader=DataLoader(torch.utils.data.TensorDataset(torch.zeros(2)))).skipped_during() is None


@pytest.mark.slow
@requires_op
def test_diagnose_runs_over_damaged_files_and_reports_the_skips(damaged: dict[str, Path]) -> None:
    import torchvision.transforms as T

    import fastpipe

    dataset = ImageFolder(damaged["root"], transform=T.Compose([T.RandomResizedCrop(32), T.ToTensor()]), on_error="skip")
    loader = DataLoader(dataset, batch_size=2, shuffle=True, num_workers=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedImageWarning)
        report = fastpipe.diagnose(
            loader, lambda batch: None, device="sim:10", options=quick_options(steps=3, warmup=1, budget=2, stage_costs=False)
        )
    assert report.skipped_samples and report.skipped_samples > 0 and dataset.skipped.count == 0
    assert any(f"skipped {report.skipped_samples} damaged sample" in note for note in report.notes)
    assert '"skipped_samples"' in report.to_json()
