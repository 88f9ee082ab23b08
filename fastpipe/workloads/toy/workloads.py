"""Builders for the toy workload's variants: ``toy:naive`` is the article's pipeline, exactly.

Every variant shares the article's defaults (batch 256, 1024x1024 raw images, 256x256
crops, pin_memory) and takes them as parameters so tests can run small. ``num_workers``
defaults to the article's 4, capped at the cores this process may use.
"""

from __future__ import annotations

from typing import Any, Callable

from torch.utils.data import DataLoader

from fastpipe._system import usable_cores
from fastpipe.devices import Device
from fastpipe.errors import ConfigError
from fastpipe.workloads._workload import Workload
from fastpipe.workloads.toy.dataset import ARTICLE_LENGTH, ARTICLE_NUM_CLASSES, FakeDataset
from fastpipe.workloads.toy.naive import ARTICLE_IMG_SIZE, naive_transform
from fastpipe.workloads.toy.training import ARTICLE_MODEL, build_training

ARTICLE_BATCH_SIZE = 256
ARTICLE_NUM_WORKERS = 4
ARTICLE_RAW_SIDE = 1024


def default_num_workers() -> int:
    return min(ARTICLE_NUM_WORKERS, usable_cores())


def toy_loader(dataset: FakeDataset, batch_size: int, num_workers: int | None, pin_memory: bool = True) -> DataLoader:
    """The article's DataLoader settings around ``dataset``."""
    workers = default_num_workers() if num_workers is None else num_workers
    return DataLoader(dataset, batch_size=batch_size, num_workers=workers, pin_memory=pin_memory)


def toy_training(device: Device, model: str, num_classes: int, name: str, notes: list[str]) -> dict[str, Any]:
    """Model, optimizer and step for ``device``; the sim device gets no model, since it runs none."""
    if not device.runs_model:
        notes.append(f"{device.spec} simulates the step; the model ({model}) is not built or run")

        def simulated_step(batch: Any) -> None:
            """Never called on a sim device: Device.run_step stands in for it."""

        return {"step": simulated_step}
    model_obj, optimizer, step = build_training(device.torch_device, model, num_classes)
    return {"step": step, "model": model_obj, "optimizer": optimizer}


def make_naive(
    device: Device,
    *,
    batch_size: int = ARTICLE_BATCH_SIZE,
    num_workers: int | None = None,
    raw_size: int = ARTICLE_RAW_SIDE,
    img_size: int = ARTICLE_IMG_SIZE,
    length: int = ARTICLE_LENGTH,
    model: str = ARTICLE_MODEL,
    num_classes: int = ARTICLE_NUM_CLASSES,
    pin_memory: bool = True,
) -> Workload:
    """The article's pipeline: FakeDataset + the naive Compose + DataLoader + train step."""
    if img_size > raw_size:
        raise ConfigError(f"img_size ({img_size}) cannot exceed raw_size ({raw_size}): RandomCrop needs a larger image")
    dataset = FakeDataset(naive_transform(img_size), length=length, raw_size=(raw_size, raw_size), num_classes=num_classes)
    notes: list[str] = []
    training = toy_training(device, model, num_classes, "toy:naive", notes)
    return Workload(loader=toy_loader(dataset, batch_size, num_workers, pin_memory), name="toy:naive", notes=notes, **training)


#: Variant name -> builder(device, **options). Other modules add theirs with ``register_variant``.
VARIANTS: dict[str, Callable[..., Workload]] = {"naive": make_naive}


def register_variant(name: str) -> Callable[[Callable[..., Workload]], Callable[..., Workload]]:
    def decorator(builder: Callable[..., Workload]) -> Callable[..., Workload]:
        VARIANTS[name] = builder
        return builder

    return decorator


def make_workload(variant: str, device: Device, **options: Any) -> Workload:
    """Build ``toy:<variant>`` for ``device``. Unknown variants get an error listing the known ones."""
    builder = VARIANTS.get(variant)
    if builder is None:
        known = ", ".join(f"toy:{name}" for name in sorted(VARIANTS))
        raise ConfigError(f"unknown toy variant 'toy:{variant}'; choose one of: {known}")
    return builder(device, **options)
