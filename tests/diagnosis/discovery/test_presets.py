"""Preset pipelines seen inside (issue 30, items 2 and 3): torchvision-style presets and timm's create_transform.

The presets below are written here in the style of torchvision's reference ``presets.py`` (a plain class holding
``self.transforms = Compose([...])``, called as ``return self.transforms(img)``), v1 and v2; timm's pipelines are
its own ``create_transform``. On a small folder of real photos: every inner stage is found, each library stage's
catalog facts are what the class is, and the advice never tells the user to compile a library transform, to move a
per-sample random one onto the device on whole batches, or to run one that takes PIL images after the copy.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision
import torchvision.transforms as T
import torchvision.transforms.v2 as v2

from fastpipe.diagnosis.discovery._catalog import NO, PER_SAMPLE, PER_SAMPLE_ONLY, YES, facts_for
from fastpipe.diagnosis.discovery._pipeline import find_pipeline
from fastpipe.diagnosis.verdict._advice import RAW, TRANSFORM, recommend
from tests.fakes import Slow, quick_options

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
COMPILE_WORDS = ("Numba", "C++", "TORCH_LIBRARY", "Compile it")
DEVICE_SNIPPET_LINE = "fastpipe.DevicePrefetcher(loader, device, transform=on_device)"


class TrainPreset:
    """Training preset in torchvision's reference style: crop, flip, optional policy, uint8 to float, normalize, erase."""

    def __init__(self, crop: int = 64, *, v: str = "v1", policy: str | None = None, erase: float = 0.0) -> None:
        t = v2 if v == "v2" else T
        stages: list = [t.ToImage()] if v == "v2" else []
        stages += [t.RandomResizedCrop(crop, antialias=True), t.RandomHorizontalFlip(0.5)]
        if policy == "ta_wide":
            stages.append(t.TrivialAugmentWide())
        elif policy == "ra":
            stages.append(t.RandAugment())
        stages += [t.PILToTensor()] if v == "v1" else []
        stages += [t.ToDtype(torch.float32, scale=True)] if v == "v2" else [t.ConvertImageDtype(torch.float)]
        stages.append(t.Normalize(MEAN, STD))
        if erase > 0:
            stages.append(t.RandomErasing(erase))
        self.transforms = t.Compose(stages)

    def __call__(self, img):  # type: ignore[no-untyped-def]
        return self.transforms(img)


class EvalPreset:
    """Evaluation preset in the same style: resize, centre crop, to float, normalize."""

    def __init__(self, crop: int = 56, resize: int = 64, *, v: str = "v1") -> None:
        t = v2 if v == "v2" else T
        stages: list = [t.ToImage()] if v == "v2" else []
        stages += [t.Resize(resize, antialias=True), t.CenterCrop(crop)]
        stages += [t.PILToTensor(), t.ConvertImageDtype(torch.float)] if v == "v1" else [t.ToDtype(torch.float32, scale=True)]
        stages.append(t.Normalize(MEAN, STD))
        self.transforms = t.Compose(stages)

    def __call__(self, img):  # type: ignore[no-untyped-def]
        return self.transforms(img)


class ConvertsToo:
    """A preset whose call does more than its Compose: opening it would drop the conversion, so it stays one stage."""

    def __init__(self) -> None:
        self.transforms = T.Compose([T.RandomResizedCrop(32)])

    def __call__(self, img):  # type: ignore[no-untyped-def]
        return self.transforms(img).convert("L")


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fastpipe.workloads.photos import build_corpus

    return build_corpus(tmp_path_factory.mktemp("photos") / "corpus", n=8, seed=0, classes=2)


def _timm(is_training: bool, auto_augment: str | None) -> object:
    timm_data = pytest.importorskip("timm.data")
    return timm_data.create_transform(64, is_training=is_training, auto_augment=auto_augment, re_prob=0.25 if is_training else 0.0)


PIPELINES = {
    "tv-v1-train": (
        lambda: TrainPreset(v="v1", policy="ta_wide", erase=0.25),
        [
            "RandomResizedCrop",
            "RandomHorizontalFlip",
            "TrivialAugmentWide",
            "PILToTensor",
            "ConvertImageDtype",
            "Normalize",
            "RandomErasing",
        ],
    ),
    "tv-v2-train": (
        lambda: TrainPreset(v="v2", policy="ra", erase=0.25),
        ["ToImage", "RandomResizedCrop", "RandomHorizontalFlip", "RandAugment", "ToDtype", "Normalize", "RandomErasing"],
    ),
    "tv-v1-eval": (lambda: EvalPreset(v="v1"), ["Resize", "CenterCrop", "PILToTensor", "ConvertImageDtype", "Normalize"]),
    "tv-v2-eval": (lambda: EvalPreset(v="v2"), ["ToImage", "Resize", "CenterCrop", "ToDtype", "Normalize"]),
    "timm-train": (
        lambda: _timm(True, None),
        ["RandomResizedCropAndInterpolation", "RandomHorizontalFlip", "ColorJitter", "MaybeToTensor", "Normalize", "RandomErasing"],
    ),
    "timm-train-randaugment": (
        lambda: _timm(True, "rand-m9-mstd0.5"),
        ["RandomResizedCropAndInterpolation", "RandomHorizontalFlip", "RandAugment", "MaybeToTensor", "Normalize", "RandomErasing"],
    ),
    "timm-eval": (lambda: _timm(False, None), ["Resize", "CenterCrop", "MaybeToTensor", "Normalize"]),
}


@pytest.mark.parametrize("which", list(PIPELINES))
def test_every_inner_stage_is_found_and_known(photos: Path, which: str) -> None:
    make, expected = PIPELINES[which]
    transform = make()
    dataset = torchvision.datasets.ImageFolder(str(photos), transform=transform)
    pipeline, why = find_pipeline(dataset)
    assert why is None and pipeline.names() == expected, (pipeline and pipeline.names(), why)
    image, _ = dataset[0]
    torch.manual_seed(0)
    staged = pipeline.with_transform(dataset, pipeline.run)[0][0]  # the stages run in order are the preset itself
    assert staged.shape == image.shape and staged.dtype == image.dtype
    for stage in pipeline.stages:
        facts = facts_for(stage.transform)
        assert not facts.custom and not facts.compile_helps, facts
    by_name = {s.name: facts_for(s.transform) for s in pipeline.stages}
    assert by_name["Normalize"].on_device == YES
    crop = next(f for f in by_name.values() if f.crop is not None)
    assert crop.name in ("RandomResizedCrop", "RandomResizedCropAndInterpolation", "Resize")
    for random_stage in ("RandomHorizontalFlip", "ColorJitter", "RandAugment", "TrivialAugmentWide"):
        if random_stage in by_name:
            assert by_name[random_stage].random == PER_SAMPLE and by_name[random_stage].on_device in (PER_SAMPLE_ONLY, NO)


@pytest.mark.parametrize("which", list(PIPELINES))
def test_no_library_stage_is_advised_to_be_compiled_or_moved_wrongly(photos: Path, which: str) -> None:
    make, _ = PIPELINES[which]
    dataset = torchvision.datasets.ImageFolder(str(photos), transform=make())
    pipeline, _ = find_pipeline(dataset)
    stages = [s.transform for s in pipeline.stages]
    for stage in pipeline.stages:
        advice = recommend(stage.name, TRANSFORM, transform=stages, dataset=dataset)
        facts = facts_for(stage.transform)
        assert not any(word in advice.summary for word in COMPILE_WORDS), (stage.name, advice.summary)
        if facts.on_device in (PER_SAMPLE_ONLY, NO):  # per-sample random, or takes PIL: no whole-batch device code
            assert DEVICE_SNIPPET_LINE not in (advice.snippet or ""), (stage.name, advice.snippet)
        if facts.on_device == PER_SAMPLE_ONLY and "takes a flip right after the crop over" not in advice.summary:
            assert "cannot move onto the device on whole batches as it is" in advice.summary, advice.summary
    raw = recommend(RAW, RAW, transform=stages, dataset=dataset)
    assert "no crop or resize" not in raw.summary, raw.summary
    fast = __import__("fastpipe.datasets", fromlist=["absorb"]).absorb(stages)
    if not fast.active:  # its own fast_path says "not absorbed": the drop-in is not recommended
        assert "fastpipe.datasets.ImageFolder(root, transform=" not in raw.summary, raw.summary
        assert "dataset = ImageFolder(root, transform=" not in (raw.snippet or ""), raw.snippet
        if which.startswith("timm-train"):  # the crop itself is the reason, in the fast path's own words
            assert "not absorbed: it starts with RandomResizedCropAndInterpolation" in raw.summary, raw.summary
    elif isinstance(dataset.transform, (TrainPreset, EvalPreset)):
        assert "transform=preset.transforms" in raw.summary, raw.summary  # the chain the preset holds, as the drop-in needs
        assert "ImageFolder(root, transform=transform.transforms)" in raw.snippet


def test_a_preset_that_does_more_than_its_chain_stays_one_stage(photos: Path) -> None:
    dataset = torchvision.datasets.ImageFolder(str(photos), transform=ConvertsToo())
    pipeline, _ = find_pipeline(dataset)
    assert pipeline.names() == ["ConvertsToo"]
    assert pipeline.with_transform(dataset, pipeline.run)[0][0].mode == "L"  # its own call still runs, conversion included


@pytest.mark.parametrize("v", ["v1", "v2"])
def test_every_cache_point_inside_a_preset_replays_what_the_preset_gives(photos: Path, v: str) -> None:
    """The ladder's cache points work through the descent: at every point inside a (deterministic) eval preset, the
    sample served is the one the preset itself gives, and the user's preset is left as it was."""
    from fastpipe.diagnosis.ladder._serve import cache_point_dataset

    preset = EvalPreset(v=v)
    before = list(preset.transforms.transforms)
    dataset = torchvision.datasets.ImageFolder(str(photos), transform=preset)
    pipeline, _ = find_pipeline(dataset)
    expected = dataset[1][0]
    for point in ["raw", *(f"after:{name}" for name in pipeline.names()), "sample", "baseline"]:
        served = cache_point_dataset(dataset, pipeline, point)
        image, label = served[1]
        assert torch.equal(image, expected) and label == dataset[1][1], point
    assert dataset.transform is preset and preset.transforms.transforms == before


@pytest.mark.slow
def test_the_ladder_names_a_stage_inside_a_preset() -> None:
    """A slow stage planted inside a preset is named by a (small) diagnosis, and each inner stage has its point.

    (Generated images, so that a tiny run has samples enough for its steps; the photos are for the stages above.)
    """
    from fastpipe import diagnose
    from fastpipe.workloads.toy.dataset import FakeDataset

    preset = EvalPreset()
    preset.transforms = T.Compose([T.CenterCrop(56), Slow(60), T.PILToTensor()])
    loader = torch.utils.data.DataLoader(FakeDataset(preset, length=64, raw_size=(96, 96)), batch_size=4, num_workers=2)
    report = diagnose(
        loader, lambda batch: None, device="sim:10", options=quick_options(steps=4, warmup=1, budget=2.0, threshold=0.15, stage_costs=False)
    )
    points = [r.name for r in report.experiments]
    assert "after Slow" in points and "after CenterCrop" in points, points
    assert "Slow" in {b.stage for b in report.bottlenecks}, report.to_table()


def test_the_presets_example_loads_as_specs_with_every_inner_stage(photos: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/presets/train_presets.py (the must-show diagnoses' SPECs): both factories' stages are found inside."""
    import importlib.util

    pytest.importorskip("timm")
    path = Path(__file__).resolve().parents[3] / "examples" / "presets" / "train_presets.py"
    spec = importlib.util.spec_from_file_location("train_presets", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setenv("PHOTOS", str(photos))
    expected = {
        "torchvision_preset": [
            "RandomResizedCrop",
            "RandomHorizontalFlip",
            "TrivialAugmentWide",
            "PILToTensor",
            "ConvertImageDtype",
            "Normalize",
        ],
        "timm_preset": [
            "RandomResizedCropAndInterpolation",
            "RandomHorizontalFlip",
            "RandAugment",
            "MaybeToTensor",
            "Normalize",
            "RandomErasing",
        ],
    }
    for name, stages in expected.items():
        loader, step = getattr(module, name)(torch.device("cpu"))
        assert find_pipeline(loader.dataset)[0].names() == stages and callable(step)
