"""Test pipelines for the fix engine and the loader unwrapping: torchvision-style presets, written here in the style
of torchvision's reference ``references/classification/presets.py`` (a plain class holding ``self.transforms``), and
a small folder of real photos (:func:`fastpipe.workloads.photos.build_corpus`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torchvision.transforms as v1
import torchvision.transforms.v2 as v2
from torchvision.transforms import InterpolationMode

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class PresetTrain:
    """A training preset like torchvision's reference ``ClassificationPresetTrain``: its stages in ``self.transforms``."""

    def __init__(
        self,
        crop_size: int,
        *,
        interpolation: InterpolationMode = InterpolationMode.BILINEAR,
        hflip_prob: float = 0.5,
        auto_augment: bool = False,
        random_erase_prob: float = 0.0,
        use_v2: bool = False,
        scale: tuple[float, float] = (0.08, 1.0),
    ) -> None:
        T: Any = v2 if use_v2 else v1
        stages = [T.RandomResizedCrop(crop_size, scale=scale, interpolation=interpolation, antialias=True)]
        if hflip_prob > 0:
            stages.append(T.RandomHorizontalFlip(hflip_prob))
        if auto_augment:
            stages.append(T.RandAugment(interpolation=interpolation))
        stages.append(T.PILToTensor())
        stages.append(T.ToDtype(torch.float, scale=True) if use_v2 else T.ConvertImageDtype(torch.float))
        stages.append(T.Normalize(mean=MEAN, std=STD))
        if random_erase_prob > 0:
            stages.append(T.RandomErasing(p=random_erase_prob))
        if use_v2:
            stages.append(T.ToPureTensor())
        self.transforms = T.Compose(stages)

    def __call__(self, img: Any) -> Any:
        return self.transforms(img)


class PresetEval:
    """torchvision's reference ``ClassificationPresetEval``: Resize, CenterCrop, then the float conversion and Normalize."""

    def __init__(self, crop_size: int, resize_size: int) -> None:
        self.transforms = v1.Compose(
            [
                v1.Resize(resize_size, antialias=True),
                v1.CenterCrop(crop_size),
                v1.PILToTensor(),
                v1.ConvertImageDtype(torch.float),
                v1.Normalize(MEAN, STD),
            ]
        )

    def __call__(self, img: Any) -> Any:
        return self.transforms(img)


class SlowOwnTransform:
    """A user's own Python transform (a per-pixel loop would be here): the one kind a compiled kernel could help."""

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return image.clone()


def corpus(root: Path, n: int = 16, classes: int = 2) -> Path:
    """A folder of ``n`` real photos (ImageNet's sizes) in torchvision's ImageFolder layout, built once per root."""
    from fastpipe.workloads.photos import build_corpus

    return build_corpus(root, n=n, seed=0, classes=classes)
