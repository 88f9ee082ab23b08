"""The real-JPEG reference workloads: the usual ImageNet recipe on real photos, and its fixes.

``jpeg:naive`` is what most training scripts do: torchvision's ``ImageFolder`` with PIL,
``RandomResizedCrop(224)``, ``RandomHorizontalFlip()``, ``ToTensor()`` and ``Normalize`` in
the workers, float32 over the copy, resnet50, batch 256. The other variants add one fix each,
in the order ``fastpipe compare jpeg`` climbs them (:data:`LADDER`):

=======================  ======================================================================
``jpeg:naive``           the usual recipe (above)
``jpeg:decode-crop``     + decode only the crop: the naive code with only the dataset class
                         changed (fastpipe.datasets.ImageFolder, same transform); Normalize
                         still in the workers, float32 still over the copy
``jpeg:uint8-host``      + uint8 over the copy, Normalize on the device (the ``device_transform``)
``jpeg:optimized``       + the prefetcher (``prefetch_depth=2``)
``jpeg:threads``         ``jpeg:optimized`` with fastpipe's ThreadLoader in place of the DataLoader:
                         batches decoded by native threads in one process (``num_workers`` threads)
``jpeg:device-decode``   the workers ship file bytes; decode, crop, flip and Normalize on the
                         device (for GPUs whose CPU cannot keep up; not on the ladder: a sim
                         device does not run device-side work, so it would show decoding as free)
=======================  ======================================================================

All read the real-photo corpus of :func:`fastpipe.workloads.photos.build_corpus` (built on first use,
then cached) and take the same options.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch
import torchvision
import torchvision.transforms as T
from torch.utils.data import DataLoader, Dataset, RandomSampler

from fastpipe._system import usable_cores
from fastpipe.datasets import DecodeCropOnDevice, EncodedImageFolder, ImageFolder, ThreadLoader, collate_encoded
from fastpipe.devices import DEFAULT_SIM_STEP_MS, Device
from fastpipe.errors import ConfigError
from fastpipe.transforms.device import IMAGENET_MEAN, IMAGENET_STD, Normalize
from fastpipe.workloads._workload import Workload
from fastpipe.workloads.photos import DEFAULT_N, build_corpus
from fastpipe.workloads.toy.training import ARTICLE_MODEL
from fastpipe.workloads.toy.workloads import toy_training

IMG_SIZE = 224
BATCH_SIZE = 256
#: Workers by default: as many as the cores this process may use, up to the 8 a single-GPU ImageNet run commonly gets.
MAX_DEFAULT_WORKERS = 8
PREFETCH_DEPTH = 2
#: The toy's simulated step (290 ms for 256 images of 256x256 on the article's A10G), scaled by pixels to 224x224.
JPEG_SIM_STEP_MS = DEFAULT_SIM_STEP_MS * (IMG_SIZE / 256) ** 2
#: The device jpeg: SPECs run on when none is given and no GPU is present (fastpipe.workloads._workload.default_device_for reads it).
DEFAULT_SIM_SPEC = f"sim:{round(JPEG_SIM_STEP_MS)}"


def default_num_workers() -> int:
    return min(MAX_DEFAULT_WORKERS, usable_cores())


#: Shuffled passes over the corpus in one epoch of the reference loaders.
EPOCH_PASSES = 50


def usual_recipe(img_size: int = IMG_SIZE) -> T.Compose:
    """The per-sample transform of torchvision's ImageNet training recipe, on PIL images."""
    return T.Compose([T.RandomResizedCrop(img_size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def training_loader(dataset: Dataset, batch_size: int, num_workers: int | None, pin_memory: bool, seed: int, **kwargs: Any) -> DataLoader:
    """The usual training loader: shuffled (seeded, so runs are repeatable), pinned, workers capped at the cores."""
    workers = default_num_workers() if num_workers is None else num_workers
    if workers < 0 or batch_size < 1:
        raise ConfigError(f"jpeg workloads need batch_size >= 1 and num_workers >= 0, got {batch_size} and {workers}")
    generator = torch.Generator().manual_seed(seed)
    # The corpus stands in for a large dataset: an epoch of EPOCH_PASSES shuffled passes over it, so the
    # workers are not restarted every few steps (ImageNet's epoch is 5,000 steps of 256), and every
    # sample is still drawn once per pass.
    sampler = RandomSampler(dataset, num_samples=len(dataset) * EPOCH_PASSES, generator=generator)
    return DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, num_workers=workers, pin_memory=pin_memory, persistent_workers=False, **kwargs
    )


def _corpus(root: "str | os.PathLike[str] | None", n: int, seed: int) -> str:
    return os.fspath(build_corpus(root, n=n, seed=seed, verbose=True))


def make_jpeg_variant(
    device: Device,
    variant: str,
    *,
    batch_size: int = BATCH_SIZE,
    num_workers: int | None = None,
    n: int = DEFAULT_N,
    root: "str | os.PathLike[str] | None" = None,
    seed: int = 0,
    img_size: int = IMG_SIZE,
    model: str = ARTICLE_MODEL,
    pin_memory: bool = True,
    dtype: torch.dtype = torch.float32,
) -> Workload:
    """Build ``jpeg:<variant>`` (see the module docstring) on the corpus of ``n`` photos at ``root``.

    Args:
        batch_size, num_workers, pin_memory: the DataLoader's (workers default to the usable cores, up to 8).
        n, root, seed: the corpus (``build_corpus``'s; built on first use, then reused).
        img_size: the crop's side (224).
        model: torchvision model for cpu/cuda (resnet50); not built on a sim device.
        dtype: the device-side Normalize's output dtype (float32, or bfloat16).
    """
    if variant not in VARIANTS:
        raise ConfigError(f"unknown jpeg variant 'jpeg:{variant}'; choose one of: {', '.join(f'jpeg:{v}' for v in VARIANTS)}")
    if img_size < 1:
        raise ConfigError(f"img_size must be positive, got {img_size}")
    root_path = _corpus(root, n, seed)
    name = f"jpeg:{variant}"
    device_transform: Callable[[Any], Any] | None = None
    loader_kwargs: dict[str, Any] = {}
    if variant == "naive":
        dataset: Dataset = torchvision.datasets.ImageFolder(root_path, transform=usual_recipe(img_size))
    elif variant == "decode-crop":  # only the class changes: fastpipe's ImageFolder absorbs the crop and flip
        dataset = ImageFolder(root_path, transform=usual_recipe(img_size))
    elif variant == "device-decode":
        dataset = EncodedImageFolder(root_path)
        loader_kwargs["collate_fn"] = collate_encoded
        device_transform = DecodeCropOnDevice(img_size, normalize=Normalize.imagenet(dtype))
    else:
        dataset = ImageFolder(root_path, size=img_size)
        device_transform = Normalize.imagenet(dtype)
    notes: list[str] = [f"{name}: {len(dataset)} real-photo JPEGs in {root_path}"]  # type: ignore[arg-type]
    num_classes = len(dataset.classes)  # type: ignore[attr-defined]
    training = toy_training(device, model, num_classes, name, notes)
    if device_transform is not None and not device.runs_model:
        notes.append(
            f"{name}: the device-side {type(device_transform).__name__} is not run on {device.spec}; its time is taken as part of the simulated step"
        )
    loader = training_loader(dataset, batch_size, num_workers, pin_memory, seed, **loader_kwargs)
    if variant == "threads":  # the same sampler and settings, its workers turned into decoding threads
        threads = max(1, loader.num_workers)
        loader = ThreadLoader(dataset, batch_size=batch_size, sampler=loader.sampler, threads=threads, pin_memory=pin_memory)
    return Workload(
        loader=loader,
        device_transform=device_transform,
        prefetch_depth=PREFETCH_DEPTH if variant in ("optimized", "device-decode", "threads") else 0,
        name=name,
        notes=notes,
        **training,
    )


def _builder(variant: str) -> Callable[..., Workload]:
    def build(device: Device, **options: Any) -> Workload:
        return make_jpeg_variant(device, variant, **options)

    build.__name__ = build.__qualname__ = f"make_{variant.replace('-', '_')}"
    build.__doc__ = f"``jpeg:{variant}``: see fastpipe.workloads.jpeg.workloads."
    return build


#: Variant name -> builder(device, **options), in ladder order.
VARIANTS: dict[str, Callable[..., Workload]] = {
    v: _builder(v) for v in ("naive", "decode-crop", "uint8-host", "optimized", "threads", "device-decode")
}

#: ``fastpipe compare jpeg``: each rung adds one fix to the one before; the prefetcher last, as in the toy ladder.
LADDER: list[tuple[str, str]] = [
    ("naive (PIL, RandomResizedCrop, ToTensor, Normalize)", "jpeg:naive"),
    ("+ decode only the crop", "jpeg:decode-crop"),
    ("+ uint8 on the host, Normalize on the device", "jpeg:uint8-host"),
    ("+ prefetcher (= jpeg:optimized)", "jpeg:optimized"),
    ("+ thread loader: batches decoded by threads, one process (= jpeg:threads)", "jpeg:threads"),
]


def make_workload(variant: str, device: Device, **options: Any) -> Workload:
    """Build ``jpeg:<variant>`` for ``device`` (fastpipe.workloads._workload.load_workload calls this for ``jpeg:`` SPECs)."""
    if "raw_size" in options:
        raise ConfigError("jpeg workloads have no raw_size: their images are real photos of ImageNet's sizes; use img_size for the crop")
    builder = VARIANTS.get(variant)
    if builder is None:
        raise ConfigError(f"unknown jpeg variant 'jpeg:{variant}'; choose one of: {', '.join(f'jpeg:{v}' for v in VARIANTS)}")
    return builder(device, **options)
