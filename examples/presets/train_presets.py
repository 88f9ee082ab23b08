"""Two training scripts' input pipelines as fastpipe SPECs: a torchvision reference-style preset, and timm's.

``torchvision_preset`` holds its transforms the way torchvision's ``references/classification/presets.py`` does (a
plain class with ``self.transforms = Compose([...])``, called as ``return self.transforms(img)``; written here, not
copied); ``timm_preset`` uses timm's own ``create_transform`` (``pip install timm``). Run from this folder::

    fastpipe diagnose train_presets:torchvision_preset --device sim:20
    fastpipe diagnose train_presets:timm_preset --device sim:20

The photos: ``PHOTOS`` names your own ImageFolder; by default a small corpus of real photographs is built once,
locally, from the images scikit-image and scikit-learn ship (``pip install 'fastpipe[photos]'``).
"""

from __future__ import annotations

import os

import torch
import torchvision
import torchvision.transforms as T
from torch.utils.data import DataLoader

BATCH, WORKERS, CROP = 32, 2, 224
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class ClassificationPresetTrain:
    """Training preset in the style of torchvision's reference scripts: crop, flip, TrivialAugment, to float, normalize."""

    def __init__(self, crop_size: int = CROP, hflip_prob: float = 0.5) -> None:
        stages = [T.RandomResizedCrop(crop_size, antialias=True)]
        if hflip_prob > 0:
            stages.append(T.RandomHorizontalFlip(hflip_prob))
        stages += [T.TrivialAugmentWide(), T.PILToTensor(), T.ConvertImageDtype(torch.float), T.Normalize(MEAN, STD)]
        self.transforms = T.Compose(stages)

    def __call__(self, img):  # type: ignore[no-untyped-def]
        return self.transforms(img)


def photos_root() -> str:
    root = os.environ.get("PHOTOS")
    if root:
        return root
    from fastpipe.workloads.photos import build_corpus

    return str(build_corpus(n=int(os.environ.get("PHOTOS_N", "2000"))))


def _step(device: torch.device):  # type: ignore[no-untyped-def]
    model = torchvision.models.resnet18(num_classes=10).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    criterion = torch.nn.CrossEntropyLoss()

    def step(batch) -> None:  # type: ignore[no-untyped-def]
        images, labels = batch
        loss = criterion(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def _loader(transform) -> DataLoader:  # type: ignore[no-untyped-def]
    dataset = torchvision.datasets.ImageFolder(photos_root(), transform=transform)
    return DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=WORKERS, pin_memory=torch.cuda.is_available())


def torchvision_preset(device: torch.device):  # type: ignore[no-untyped-def]
    """The loader and step of a torchvision reference-style script (its preset class as the dataset's transform)."""
    return _loader(ClassificationPresetTrain()), _step(device)


def timm_preset(device: torch.device):  # type: ignore[no-untyped-def]
    """The loader and step of a timm-style script: ``create_transform`` for training, RandAugment and random erasing."""
    from timm.data import create_transform

    transform = create_transform(CROP, is_training=True, auto_augment="rand-m9-mstd0.5", re_prob=0.25, interpolation="bilinear")
    return _loader(transform), _step(device)
