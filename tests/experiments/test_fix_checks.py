"""The fix engine's input checks, and the candidates it builds, on real transforms and real photos (nothing measured)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchvision
import torchvision.transforms as v1
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as F

from fastpipe.datasets import ImageFolder
from fastpipe.datasets.absorb import absorb
from fastpipe.datasets.crop import crop_params
from fastpipe.diagnosis._options import MeasureOptions
from fastpipe.experiments._fix import INPUT_CHANGED, plan, run_fix
from fastpipe.experiments._fix_candidates import Candidate, build_candidates, level_unit
from fastpipe.experiments._fix_checks import PIXEL_TOLERANCE, check_input, compare_boxes
from fastpipe.ops import jpeg as jpeg_ops
from fastpipe.workloads import Workload
from tests.fakes.fix import PresetEval, PresetTrain, SlowOwnTransform, corpus

timm = pytest.importorskip("timm")
requires_op = pytest.mark.skipif(not jpeg_ops.JPEG_OP_AVAILABLE, reason=jpeg_ops.jpeg_op_status())
SIZES = [(375, 500), (500, 375), (333, 500), (400, 400)]


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return corpus(tmp_path_factory.mktemp("photos") / "corpus", n=12)


def _workload(dataset, batch_size: int = 6, device_transform=None) -> Workload:
    return Workload(loader=DataLoader(dataset, batch_size=batch_size, shuffle=True), step=lambda b: None, device_transform=device_transform)


def _rrc_draw(cls, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    def draw(height: int, width: int):
        return cls.get_params(torch.empty((), dtype=torch.uint8).expand(3, height, width), scale, ratio)

    return draw


def _decoder_draw(scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    return lambda height, width: crop_params(height, width, scale, ratio)


@pytest.mark.parametrize("library", ["torchvision", "timm"])
def test_the_decoders_boxes_have_the_distribution_of_torchvision_and_timm(library: str) -> None:
    """DecodeCrop draws with torchvision's get_params on torch's RNG; timm's draws with Python's random: same law."""
    from timm.data.transforms import RandomResizedCropAndInterpolation

    cls = v1.RandomResizedCrop if library == "torchvision" else RandomResizedCropAndInterpolation
    check = compare_boxes(_rrc_draw(cls), _decoder_draw(), SIZES)
    assert check.same, check.line()


def test_a_shifted_crop_distribution_fails_the_box_test() -> None:
    """A decoder drawing scale (0.25, 1) where the user's crop draws (0.08, 1): a broken fix, caught."""
    from timm.data.transforms import RandomResizedCropAndInterpolation

    check = compare_boxes(_rrc_draw(RandomResizedCropAndInterpolation), _decoder_draw(scale=(0.25, 1.0)), SIZES)
    assert not check.same and check.feature == "area share", check.line()


@requires_op
def test_timms_bilinear_crop_and_the_decoders_give_the_same_pixels_for_a_box(photos: Path) -> None:
    """The interpolation is part of the fix: timm's bilinear resized crop and the decoder's agree within tolerance."""
    path = next(iter(sorted(photos.rglob("*.jpg"))))
    with Image.open(path) as image:
        rgb = image.convert("RGB")
    box = (20, 30, 200, 260)
    theirs = F.pil_to_tensor(F.resized_crop(rgb, *box, [96, 96], InterpolationMode.BILINEAR))
    ours = jpeg_ops.decode_jpeg_crop(jpeg_ops.read_bytes(str(path)), box, (96, 96), hflip=False)
    assert (theirs.float() - ours.float()).abs().mean().item() < PIXEL_TOLERANCE


@pytest.mark.parametrize("interpolation", ["bicubic", "random"])
def test_timm_crops_the_decoder_cannot_do_are_not_absorbed_and_say_why(interpolation: str) -> None:
    from timm.data import create_transform

    fast = absorb(create_transform(96, is_training=True, interpolation=interpolation))
    assert not fast.active and "RandomResizedCropAndInterpolation" in str(fast) and "bilinear" in str(fast)


@requires_op
@pytest.mark.parametrize("use_v2", [False, True])
def test_preset_candidates_open_the_preset_and_pass_their_input_checks(photos: Path, use_v2: bool) -> None:
    """A torchvision-style preset: decode-the-crop takes its inner RandomResizedCrop + flip, uint8 moves its
    conversion and Normalize after the copy; both give the model the same labels, shapes and pixels."""
    original = _workload(torchvision.datasets.ImageFolder(str(photos), PresetTrain(64, use_v2=use_v2)))
    candidates, view = build_candidates(original)
    by_name = {c.name.split(" (")[0]: c for c in candidates}
    decode, uint8 = by_name["decode only the crop"], by_name["uint8 over the copy, Normalize on the device"]
    assert view.via == "PresetTrain.transforms" and decode.workload is not None and uint8.workload is not None
    assert "RandomResizedCrop" in decode.addresses and not any(c.name.startswith("compile") for c in candidates)
    unit = level_unit(original, view.leaves)
    for candidate in (decode, uint8):
        checked = check_input(original, candidate.workload, level_unit=unit, boxes=candidate.boxes)
        assert checked.passed and checked.labels_equal and checked.pixel_levels is not None, checked.line()
    assert "PresetTrain.transforms" in decode.code


def test_the_eval_preset_and_timm_pipelines_get_the_candidates_that_fit(photos: Path) -> None:
    from timm.data import create_transform

    evaluation, _ = build_candidates(_workload(torchvision.datasets.ImageFolder(str(photos), PresetEval(64, 72))))
    assert {c.name.split(" (")[0] for c in evaluation if c.workload is not None} >= {
        "decode only the crop",
        "uint8 over the copy, Normalize on the device",
    }
    erasing, _ = build_candidates(_workload(torchvision.datasets.ImageFolder(str(photos), PresetTrain(64, random_erase_prob=0.5))))
    uint8 = next(c for c in erasing if c.name.startswith("uint8"))
    assert uint8.workload is None and "RandomErasing follows Normalize" in uint8.not_tried
    rand, _ = build_candidates(
        _workload(torchvision.datasets.ImageFolder(str(photos), create_transform(64, is_training=True, auto_augment="rand-m9-mstd0.5")))
    )
    assert not any(c.name.startswith("compile") for c in rand)  # every stage is a library's: nothing to compile
    prefetched, _ = build_candidates(
        _workload(torchvision.datasets.ImageFolder(str(photos), create_transform(64, is_training=True, use_prefetcher=True)))
    )
    assert "already ends in uint8 (MaybePILToTensor)" in next(c for c in prefetched if c.name.startswith("uint8")).not_tried
    decode = next(c for c in rand if c.name.startswith("decode only the crop"))
    assert decode.workload is not None and decode.compare_pixels and decode.boxes is not None  # timm draws with another RNG


def test_a_users_own_transform_gets_compile_advice_only(photos: Path) -> None:
    transform = v1.Compose([v1.RandomResizedCrop(64), v1.PILToTensor(), SlowOwnTransform()])
    candidates, _ = build_candidates(_workload(torchvision.datasets.ImageFolder(str(photos), transform)))
    advice = [c for c in candidates if c.name.startswith("compile")]
    assert [c.name for c in advice] == ["compile SlowOwnTransform"] and advice[0].workload is None and "by hand" in advice[0].not_tried


@requires_op
def test_a_fix_with_wrong_labels_or_a_shifted_crop_is_never_measured_nor_recommended(photos: Path) -> None:
    """Two deliberately broken fixes: labels off by one, and the crop drawn at scale (0.25, 1): both 'input changed'."""
    preset = PresetTrain(64)
    original = _workload(torchvision.datasets.ImageFolder(str(photos), preset))
    wrong_labels = ImageFolder(str(photos), transform=preset.transforms, target_transform=lambda y: (y + 1) % 2)
    shifted = PresetTrain(64, scale=(0.25, 1.0))
    shifted_ds = ImageFolder(str(photos), transform=shifted.transforms)
    boxes = (_rrc_draw(v1.RandomResizedCrop), _decoder_draw(scale=(0.25, 1.0)), SIZES)
    broken = [
        Candidate("wrong labels", ("raw load",), "", workload=_workload(wrong_labels)),
        Candidate("shifted crop", ("raw load",), "", workload=_workload(shifted_ds), compare_pixels="planted", boxes=boxes),
    ]
    report = run_fix(original, "sim:5", MeasureOptions(steps=1, warmup=0, budget=1.0), candidates=broken)
    assert [r.status for r in report.results] == [INPUT_CHANGED, INPUT_CHANGED]
    assert "labels DIFFER" in report.results[0].check and "DIFFERENT crop-box distribution" in report.results[1].check
    assert report.original_ms is None and not report.recommended  # nothing was measured


def test_the_checks_leave_the_users_random_generators_as_they_were(photos: Path) -> None:
    """The checks seed torch, random and NumPy to compare like with like; the user's states are put back."""
    import random

    import numpy as np

    preset = PresetTrain(64)
    original = _workload(torchvision.datasets.ImageFolder(str(photos), preset))
    fixed = _workload(ImageFolder(str(photos), transform=preset.transforms))
    torch.manual_seed(11)
    random.seed(11)
    np.random.seed(11)
    before = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    check_input(original, fixed, level_unit=None, boxes=(_rrc_draw(v1.RandomResizedCrop), _decoder_draw(), SIZES))
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
    assert (np.random.get_state()[1] == before[2]).all()


def test_without_fix_the_plan_names_the_fixes_and_the_time(photos: Path) -> None:
    workload = _workload(torchvision.datasets.ImageFolder(str(photos), PresetTrain(64)))
    found = plan(workload, MeasureOptions(steps=10, warmup=3, budget=20.0), step_ms=50.0)
    assert "decode only the crop (the same transform)" in found.tried and 0 < found.typical_s <= found.at_most_s
    line = found.lines("train:make")[0]
    assert "fastpipe diagnose train:make --fix" in line and f"{found.typical_s:.0f} s" in line
