"""The device decides what exists (issue 38, item 3): what the report names and advises comes from the device, the
loader and the pipeline found, never from a recipe fastpipe assumes.

* On ``cpu`` the step reads its batches where the loader leaves them: no host point, no host-to-device copy stage, and
  no pinning, DevicePrefetcher or uint8-for-the-copy advice (timm on a CPU got "host-to-device copy +32 ±20" with all
  three).
* A loader that already prefetches (timm's PrefetchLoader, fastpipe's DevicePrefetcher) or already ships uint8 is never
  told to.
* Image sizes are read from the dataset that is open (timm's ImageDataset keeps its files in ``.reader``).
* Stage names come from the pipeline found: a preset that converts with PILToTensor + ConvertImageDtype is never told
  about ToTensor.

The ladders are planted (:class:`tests.fakes.ladder.PlantedRunner`): no timing runs.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torchvision.transforms as T
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from fastpipe.diagnosis.ladder._plan import COPY
from fastpipe.diagnosis.verdict._advice import COLLATE, RAW, TRANSFORM, recommend, ships_uint8
from fastpipe.diagnosis.verdict._loader import LoaderFacts, loader_facts, prefetching_wrapper
from tests.fakes.ladder import Tiny, planted_report

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
COPY_ADVICE = ("pin_memory", "DevicePrefetcher", "uint8 payloads", "non_blocking", "device_transform")
#: "ToTensor" as a word of its own (PILToTensor, MaybeToTensor are other classes).
BARE_TO_TENSOR = re.compile(r"(?<![A-Za-z])ToTensor")


class Preset:
    """torchvision's reference ClassificationPresetTrain, v1, pil backend: no ToTensor in it."""

    def __init__(self) -> None:
        self.transforms = T.Compose(
            [T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.PILToTensor(), T.ConvertImageDtype(torch.float), T.Normalize(MEAN, STD)]
        )

    def __call__(self, img: Any) -> Any:
        return self.transforms(img)


UINT8 = [T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.PILToTensor()]
FLOAT = [T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]


def copy_ladder() -> dict[str, tuple[float, float, float]]:
    """A copy of +30 ms on a 100 ms step, beyond its noise; everything else free."""
    points = {"device": 100.0, "host": 130.0, "sample": 130.0, "after:B": 130.0, "after:A": 130.0, "raw": 130.0, "baseline": 130.0}
    return {p: (ms, 0.005, 0.0) for p, ms in points.items()}


# ----- the device ------------------------------------------------------------------------------------------------
def test_on_cpu_the_ladder_has_no_host_point_and_no_copy_stage() -> None:
    report = planted_report(copy_ladder(), device="cpu")
    points = [e.cache_point for e in report.experiments]
    assert "host" not in points and points[:2] == ["device", "sample"], points
    assert not any(COPY in c.stage for c in report.components), [c.stage for c in report.components]
    text = report.to_table()
    assert "host-to-device copy" not in text.split("Note:")[0], text  # no row, no named stage, no advice
    assert "no host-to-device copy" in text
    # the time the copy seemed to cost on cpu is the collate span's now (sample - device), named as such
    assert [b.stage for b in report.bottlenecks] == [COLLATE], text
    assert not any(word in report.bottlenecks[0].recommendation for word in ("DevicePrefetcher", "pin_memory", "on the device"))


def test_on_a_device_with_a_copy_the_copy_is_still_measured_and_named() -> None:
    report = planted_report(copy_ladder(), device="sim:100")
    assert [b.stage for b in report.bottlenecks] == [COPY], report.to_table()
    assert "DevicePrefetcher" in report.bottlenecks[0].recommendation


@pytest.mark.parametrize(
    "stage",
    ["Normalize", "ToTensor", "RandomHorizontalFlip", "ConvertColor", COLLATE, "raw load + ToTensor + collate/IPC"],
)
def test_on_cpu_no_advice_sends_work_to_a_device_or_through_a_copy(stage: str) -> None:
    advice = recommend(stage, TRANSFORM if stage not in (COLLATE,) else COLLATE, transform=FLOAT, loader=LoaderFacts(copies=False))
    text = advice.summary + (advice.snippet or "")
    for word in ("DevicePrefetcher", "device_transform", "pin_memory", "non_blocking", "on the device", "after the copy"):
        assert word not in text, (stage, word, text)


# ----- the loader ------------------------------------------------------------------------------------------------
def test_a_loader_that_prefetches_and_ships_uint8_is_not_told_to() -> None:
    done = recommend(COPY, COPY, transform=UINT8, loader=LoaderFacts(pinned=True, prefetcher="the script's PrefetchLoader"))
    assert not any(word in done.summary for word in ("fastpipe.DevicePrefetcher", "uint8 payloads", "pin_memory=True,")), done.summary
    assert done.snippet is None and "Already in place" in done.summary and "PrefetchLoader" in done.summary
    todo = recommend(COPY, COPY, transform=FLOAT, loader=LoaderFacts())
    for word in ("pin_memory=True", "DevicePrefetcher", "uint8 payloads"):
        assert word in todo.summary, todo.summary
    collate = recommend(COLLATE, COLLATE, transform=UINT8)
    assert "uint8 images (PILToTensor" not in collate.summary and "uint8 already" in collate.summary, collate.summary


def test_ships_uint8_reads_the_pipelines_last_conversion() -> None:
    assert ships_uint8(UINT8) is True
    assert ships_uint8(FLOAT) is False
    assert ships_uint8(Preset()) is False  # PILToTensor, then ConvertImageDtype
    assert ships_uint8([T.RandomResizedCrop(64)]) is None


def test_a_prefetching_wrapper_the_script_iterates_is_found_around_its_dataloader() -> None:
    import fastpipe

    loader = DataLoader(list(range(8)), batch_size=2)
    assert prefetching_wrapper(loader) is None
    wrapper = fastpipe.DevicePrefetcher(loader, torch.device("cpu"))
    assert prefetching_wrapper(loader) == type(wrapper).__name__
    timm_loader = pytest.importorskip("timm.data.loader")
    other = DataLoader(list(range(8)), batch_size=2)
    held = timm_loader.PrefetchLoader(other, device=torch.device("cpu"))
    assert prefetching_wrapper(other) == "PrefetchLoader", held
    # the facts a report reads: found on a device with a copy, never looked for on cpu (no copy to prefetch)
    workload = SimpleNamespace(loader=other, prefetch_depth=0)
    assert loader_facts(workload, "cuda").prefetcher == "the script's PrefetchLoader"
    assert loader_facts(workload, "cpu") == LoaderFacts(copies=False, pinned=False, prefetcher=None)


def test_a_named_copy_behind_a_prefetching_loader_is_not_advised_a_prefetcher() -> None:
    report = planted_report(copy_ladder(), device="sim:100", prefetch_depth=2)
    copy = next(b for b in report.bottlenecks if b.stage == COPY)
    assert "fastpipe.DevicePrefetcher" not in copy.recommendation and "prefetcher (depth 2)" in copy.recommendation, copy.recommendation


# ----- the dataset and the pipeline ------------------------------------------------------------------------------
class TimmLikeDataset(Dataset):
    """timm's ImageDataset shape: the files are listed by its reader, not by the dataset."""

    def __init__(self, root: Path, transform: Any) -> None:
        self.reader = SimpleNamespace(samples=[(str(p), 0) for p in sorted(root.glob("*.jpg"))])
        self.transform = transform

    def __len__(self) -> int:
        return len(self.reader.samples)

    def __getitem__(self, i: int) -> Any:
        return self.transform(Image.open(self.reader.samples[i][0]).convert("RGB")), 0


def test_image_size_caveats_read_the_dataset_that_is_open(tmp_path: Path) -> None:
    for i in range(3):
        Image.new("RGB", (100, 80), (i, i, i)).save(tmp_path / f"{i}.jpg")  # under twice the 64 px crop: a caveat
    dataset = TimmLikeDataset(tmp_path, T.Compose(FLOAT))
    advice = recommend(RAW, RAW, transform=FLOAT, dataset=dataset)
    assert "did not see your image sizes" not in (advice.caveat or ""), advice.caveat
    assert "on 100x80 images" in (advice.caveat or ""), advice.caveat


@pytest.mark.parametrize("stage", ["ConvertImageDtype", "Normalize", "RandomResizedCrop", RAW, COLLATE, "PILToTensor"])
def test_a_preset_without_to_tensor_is_never_told_about_to_tensor(stage: str) -> None:
    preset = Preset()
    kind = RAW if stage == RAW else COLLATE if stage == COLLATE else TRANSFORM
    for loader in (LoaderFacts(), LoaderFacts(copies=False)):
        advice = recommend(stage, kind, transform=preset, loader=loader)
        text = advice.summary + (advice.caveat or "") + (advice.snippet or "")
        assert not BARE_TO_TENSOR.search(text), (stage, text)
    float_out = recommend("ConvertImageDtype", TRANSFORM, transform=preset)
    assert "ConvertImageDtype + Normalize" in float_out.summary and "your PILToTensor's uint8" in float_out.summary, float_out.summary


def test_a_pipeline_with_to_tensor_still_hears_about_it() -> None:
    advice = recommend("ToTensor", TRANSFORM, transform=FLOAT)
    assert "ToTensor + Normalize" in advice.summary, advice.summary


def test_the_planted_dataset_is_what_the_planted_runner_diagnoses() -> None:
    # the planted ladders above are about a dataset with two stages, A and B: the plan the report shows is theirs
    report = planted_report(copy_ladder(), device="sim:100")
    assert [c.stage for c in report.components] == [COPY, COLLATE, "B", "A", "raw load"]
    assert len(Tiny()) == 8


def test_torchvisions_fake_data_is_not_told_about_image_files() -> None:
    # the noisy script's dataset: FakeData makes its images in code, so no decode drop-in and no "did not see your
    # image sizes" caveat (its raw load was advised fastpipe's ImageFolder and told to check file sizes)
    from torchvision.datasets import FakeData

    advice = recommend(RAW, RAW, transform=FLOAT, dataset=FakeData(8, (3, 40, 40), 10, T.Compose(FLOAT)))
    assert "FakeData generates each raw image in code" in advice.summary, advice.summary
    assert "image sizes" not in (advice.caveat or "") and "ImageFolder(root" not in advice.summary, advice
