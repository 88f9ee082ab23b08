"""The toy workload's optimized form, and the cumulative steps that lead to it from the naive one.

Each variant adds one fix to the one before, so ``fastpipe compare`` can show what each buys:

========================  =====================================================================
``toy:naive``             the article's pipeline (fastpipe/workloads/toy/workloads.py)
``toy:fast-transforms``   + fast RandomMask (numba / C++), and the crop moved before PILToTensor;
                          float32 still leaves the workers
``toy:uint8-host``        + workers return uint8; colour and scale run on the device after the
                          copy (ConvertColorScale, the Workload's ``device_transform``)
``toy:prefetch``          + batches copied ahead on a side stream (``prefetch_depth=2``)
``toy:fast-raw``          + the raw image comes from a fast generator as an array, not a PIL image
                          (what a faster decoder buys; not a step of the compare ladder)
``toy:optimized``         + crop-first raw loading: only the 256x256 crop is ever generated
``toy:crop-first``        ``toy:optimized`` without the prefetcher: the compare ladder adds the
                          prefetcher last, where the copy is what remains of the gap
``toy:recycled``          ``toy:optimized`` + recycled batch memory: workers collate into a ring
                          of reused shared-memory buffers (``fastpipe.loading.recycled``), pinned once
========================  =====================================================================

All take the same options as ``toy:naive`` (batch size, workers, sizes, model), plus
``mask_backend`` and ``dtype`` (the device-side output dtype, float32 or bfloat16).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
import torchvision.transforms as T
from torchvision.transforms import Compose

from fastpipe.devices import Device
from fastpipe.errors import ConfigError
from fastpipe.transforms.convert import Contiguous, ToCHWTensor
from fastpipe.transforms.device import ConvertColorScale
from fastpipe.transforms.mask import RandomMask
from fastpipe.transforms.noise import uniform_noise
from fastpipe.workloads._workload import Workload
from fastpipe.workloads.toy.dataset import ARTICLE_LENGTH, ARTICLE_NUM_CLASSES, FakeDataset, FastFakeDataset
from fastpipe.workloads.toy.naive import ARTICLE_IMG_SIZE, ARTICLE_MASK_RATIO, ConvertColor, Scale
from fastpipe.workloads.toy.training import ARTICLE_MODEL
from fastpipe.workloads.toy.workloads import ARTICLE_BATCH_SIZE, ARTICLE_RAW_SIDE, register_variant, toy_loader, toy_training

PREFETCH_DEPTH = 2


@dataclass(frozen=True)
class Optimizations:
    """Which fixes a toy variant applies; each one is independent of the others."""

    fast_mask: bool = False
    """RandomMask with a compiled backend instead of np.random.uniform + scipy's convolve2d."""
    uint8_host: bool = False
    """Workers return uint8; ConvertColorScale runs on the device after the copy."""
    prefetch: bool = False
    """The Workload copies batches ahead (``prefetch_depth``)."""
    fast_raw: bool = False
    """The raw image is an HWC array from ``uniform_noise``, not ``np.random.randint`` + PIL."""
    crop_first: bool = False
    """Only the crop region is generated (implies ``fast_raw``'s array output)."""
    recycled: bool = False
    """The loader is wrapped by ``fastpipe.loading.recycled``: batches are collated into reused buffers."""


FAST_TRANSFORMS = Optimizations(fast_mask=True)
UINT8_HOST = replace(FAST_TRANSFORMS, uint8_host=True)
PREFETCH = replace(UINT8_HOST, prefetch=True)
FAST_RAW = replace(PREFETCH, fast_raw=True)
OPTIMIZED = replace(FAST_RAW, crop_first=True)
CROP_FIRST = replace(OPTIMIZED, prefetch=False)
RECYCLED = replace(OPTIMIZED, recycled=True)


def optimized_transform(
    opts: Optimizations, img_size: int = ARTICLE_IMG_SIZE, mask_ratio: float = ARTICLE_MASK_RATIO, mask_backend: str = "auto"
) -> Compose:
    """The per-sample Compose for ``opts``: the naive stages, with each enabled fix swapped in."""
    if opts.crop_first or opts.fast_raw:
        # A zero-copy CHW view of the HWC array (and of its crop); the mask then writes a compact
        # planar copy in the same pass (inplace=False), so the sample no longer holds the raw image.
        crop = [] if opts.crop_first else [T.RandomCrop(img_size)]
        masks = [RandomMask(mask_ratio, backend=mask_backend, inplace=False)] if opts.fast_mask else [Contiguous(), _naive_mask(mask_ratio)]
        stages: list[Any] = [ToCHWTensor(), *crop, *masks]
    elif opts.fast_mask:
        # The transform fixes reorder too: crop the PIL image first, so only the crop is converted
        # to a tensor (PILToTensor of the full 1024x1024 image costs more than the fast mask). Same
        # crop distribution, and the same crop for the same torch RNG state. For uint8 samples the
        # mask writes a compact CHW copy in its single pass (PILToTensor gives an HWC-strided view).
        mask = RandomMask(mask_ratio, backend=mask_backend, inplace=not opts.uint8_host)
        stages = [T.RandomCrop(img_size), T.PILToTensor(), mask]
    else:
        stages = [T.PILToTensor(), T.RandomCrop(img_size), _naive_mask(mask_ratio)]
    if not opts.uint8_host:
        stages += [ConvertColor(), Scale()]
    return Compose(stages)


def _naive_mask(ratio: float) -> torch.nn.Module:
    from fastpipe.workloads.toy.naive import RandomMask as NaiveRandomMask

    return NaiveRandomMask(ratio)


def make_toy_variant(
    device: Device,
    opts: Optimizations = OPTIMIZED,
    *,
    name: str = "toy:optimized",
    batch_size: int = ARTICLE_BATCH_SIZE,
    num_workers: int | None = None,
    raw_size: int = ARTICLE_RAW_SIDE,
    img_size: int = ARTICLE_IMG_SIZE,
    length: int = ARTICLE_LENGTH,
    model: str = ARTICLE_MODEL,
    num_classes: int = ARTICLE_NUM_CLASSES,
    pin_memory: bool = True,
    mask_backend: str = "auto",
    dtype: torch.dtype = torch.float32,
) -> Workload:
    """Build the toy workload with the fixes in ``opts``; the other options are ``make_naive``'s."""
    if img_size > raw_size:
        raise ConfigError(f"img_size ({img_size}) cannot exceed raw_size ({raw_size}): RandomCrop needs a larger image")
    transform = optimized_transform(opts, img_size, mask_backend=mask_backend)
    sizes = dict(length=length, raw_size=(raw_size, raw_size), num_classes=num_classes)
    if opts.crop_first or opts.fast_raw:
        dataset: FakeDataset = FastFakeDataset(transform, crop_size=img_size if opts.crop_first else None, **sizes)
        uniform_noise((1,))  # compile (or load) the generator before workers fork
    else:
        dataset = FakeDataset(transform, **sizes)
    for stage in transform.transforms:
        if isinstance(stage, RandomMask):
            stage.warm_up()
    notes: list[str] = []
    training = toy_training(device, model, num_classes, name, notes)
    device_transform: Callable[[Any], Any] | None = None
    if opts.uint8_host:
        device_transform = ConvertColorScale(dtype)
        if not device.runs_model:
            notes.append(f"{name}: colour conversion and scaling run on the device, inside the simulated step time")
    loader: Any = toy_loader(dataset, batch_size, num_workers, pin_memory)
    if opts.recycled:
        from fastpipe.loading.recycle import recycled

        loader = recycled(loader)
    return Workload(
        loader=loader,
        device_transform=device_transform,
        prefetch_depth=PREFETCH_DEPTH if opts.prefetch else 0,
        name=name,
        notes=notes,
        **training,
    )


#: The registered variants, in ladder order (toy:naive comes first, from workloads.py).
VARIANT_OPTIMIZATIONS: dict[str, Optimizations] = {
    "fast-transforms": FAST_TRANSFORMS,
    "uint8-host": UINT8_HOST,
    "prefetch": PREFETCH,
    "fast-raw": FAST_RAW,
    "optimized": OPTIMIZED,
    "crop-first": CROP_FIRST,
    "recycled": RECYCLED,
}


def _register(variant: str, opts: Optimizations) -> None:
    def builder(device: Device, **options: Any) -> Workload:
        return make_toy_variant(device, opts, name=f"toy:{variant}", **options)

    builder.__name__ = builder.__qualname__ = f"make_{variant.replace('-', '_')}"
    builder.__doc__ = f"toy:{variant}: {opts}"
    register_variant(variant)(builder)


for _variant, _opts in VARIANT_OPTIMIZATIONS.items():
    _register(_variant, _opts)


def make_optimized(device: Device, **options: Any) -> Workload:
    """``toy:optimized``: every fix (see the module docstring)."""
    return make_toy_variant(device, OPTIMIZED, name="toy:optimized", **options)
