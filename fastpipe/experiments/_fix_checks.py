"""Does a fix give the model the same input? Labels, shapes and dtypes, pixels, and the crop boxes' distribution.

A fix that is faster because it feeds the model something else is not a fix. :func:`check_input` reads the first
samples of the original pipeline and of the rewritten one as the model would get them: each loader rebuilt without
workers over the same sampler order (both seeded alike: torch, ``random`` and NumPy), its batches collated, then the
workload's device transform applied on the CPU (seeded alike again). Then:

* **labels**: equal for the same indices (the sampler draws the same order from the same seed);
* **shapes and dtypes**: of every tensor in the batch;
* **pixels**, where the fix draws its random parameters with the same RNG calls in the same order (torchvision's
  ``RandomResizedCrop`` and fastpipe's decode-the-crop do, as do transforms moved after the copy): the mean absolute
  difference in 0..255 grey levels (one level is ``1 / (255 std)`` after a ``Normalize``) must be under
  :data:`PIXEL_TOLERANCE`, fastpipe.ops.jpeg's documented tolerance against PIL for a DCT-scaled decode;
* **crop boxes**, where the fix draws its crop with another RNG (timm's ``RandomResizedCropAndInterpolation`` draws
  with Python's ``random``, fastpipe's decoder with torch's): :data:`BOX_DRAWS` boxes of each, for the dataset's own
  image sizes, compared feature by feature (area share, log aspect ratio, centre x and y) with a two-sample
  Kolmogorov-Smirnov test; the distributions differ when any p-value is under :data:`BOX_ALPHA` / 4 (Bonferroni).

The generators' states (torch's, Python's, NumPy's) are put back when a check ends: the user's script goes on drawing
what it would have drawn.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader

from fastpipe._tree import iter_tensors, map_tensors
from fastpipe.diagnosis.runtime._snapshot import UserState
from fastpipe.loading._rebuild import rebuild_loader

#: Mean absolute difference allowed, in 0..255 levels (fastpipe.ops.jpeg's documented tolerance for a DCT-scaled decode).
PIXEL_TOLERANCE = 2.5
#: Samples compared: at most this many, in batches of at most :data:`CHECK_BATCH`.
CHECK_SAMPLES = 48
CHECK_BATCH = 16
#: Boxes drawn from each crop for the distribution test, and its significance level (over all four features).
BOX_DRAWS = 3000
BOX_ALPHA = 1e-3

BoxDraw = Callable[[int, int], Sequence[int]]
"""``(height, width) -> (top, left, box_h, box_w)``: one random crop box for an image of that size."""


@dataclass(frozen=True)
class BoxCheck:
    """The two crops' boxes compared: the smallest p-value of the four features, and which feature it was."""

    p_value: float
    feature: str
    draws: int

    @property
    def same(self) -> bool:
        return self.p_value >= BOX_ALPHA / 4

    def line(self) -> str:
        verdict = "the same crop-box distribution" if self.same else "a DIFFERENT crop-box distribution"
        return f"{verdict} (KS test on {self.draws} boxes each: smallest p = {self.p_value:.2g}, {self.feature})"


@dataclass(frozen=True)
class InputCheck:
    """What :func:`check_input` found; ``passed`` when every check that ran passed."""

    samples: int
    labels_equal: bool
    labels: str
    shapes_equal: bool
    shapes: str
    pixel_levels: float | None = None
    """Mean absolute difference in 0..255 levels; None when pixels were not compared (see ``pixels``)."""
    pixels: str = ""
    boxes: BoxCheck | None = None
    before_collate: bool = False
    """Compared before the loader's own collate_fn, which the fix keeps (the same function on the same kind of samples)."""

    @property
    def passed(self) -> bool:
        pixels_ok = self.pixel_levels is None or self.pixel_levels <= PIXEL_TOLERANCE
        return self.labels_equal and self.shapes_equal and pixels_ok and (self.boxes is None or self.boxes.same)

    def line(self) -> str:
        parts = [self.labels, self.shapes, self.pixels]
        if self.boxes is not None:
            parts.append(self.boxes.line())
        if self.before_collate:
            parts.append("compared before the loader's collate_fn, which the fix keeps")
        return ", ".join(part for part in parts if part)


def seed_all(seed: int) -> None:
    """The same starting point for every RNG a transform may draw from: torch's, Python's and NumPy's."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def model_inputs(workload: Any, samples: int = CHECK_SAMPLES, seed: int = 0, direct: bool = False) -> list[Any]:
    """The first ``samples`` samples as the model gets them, in batches, seeded, the device transform run on the CPU.

    The loader is rebuilt without workers and in batches of at most :data:`CHECK_BATCH`, unless ``direct``: then the
    workload's own loader gives its first batch (a fix of the loader itself: its workers, its batch memory).
    """
    loader = workload.loader
    if direct:  # a copy of a DataLoader, its workers ended with the pass (never the user's persistent ones)
        source: Any = rebuild_loader(loader, loader.dataset, persistent_workers=False) if isinstance(loader, DataLoader) else loader
    else:
        batch = getattr(loader, "batch_size", None) or CHECK_BATCH
        source = rebuild_loader(loader, loader.dataset, num_workers=0, batch_size=min(batch, CHECK_BATCH, samples))
    seed_all(seed)
    batches: list[Any] = []
    seen = 0
    iterator = iter(source)
    try:
        for item in iterator:
            batches.append(map_tensors(lambda t: t.clone(), item))
            seen += len(next(iter_tensors(item)))
            if seen >= samples or direct:
                break
    finally:
        close = getattr(iterator, "_shutdown_workers", None) if source is not loader else None
        if close is not None:
            close()
        del iterator
    if workload.device_transform is not None:
        seed_all(seed + 1)
        batches = [workload.device_transform(b) for b in batches]
    return batches


def _images_labels(batch: Any) -> tuple[torch.Tensor, Any]:
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[0], batch[1]
    return batch, None


def check_input(
    original: Any,
    fixed: Any,
    *,
    level_unit: Sequence[float] | float | None,
    compare_pixels: str | None = None,
    boxes: tuple[BoxDraw, BoxDraw, Sequence[tuple[int, int]]] | None = None,
    samples: int = CHECK_SAMPLES,
    seed: int = 0,
    direct: bool = False,
) -> InputCheck:
    """Compare what ``original`` and ``fixed`` (two Workloads) give the model; see the module docstring.

    Args:
        level_unit: one 0..255 grey level in the model input's units, per channel or for all (None: uint8, 1).
        compare_pixels: None to compare pixels; else why they are not comparable (said in the result).
        boxes: (the original crop's draw, the fix's draw, image sizes (h, w) to draw for): test their distribution.
        direct: read each workload's own loader (its first batch, workers and all), for a fix of the loader itself.
    """
    rngs = UserState()  # the checks seed every generator: the user's states are put back afterwards
    try:
        return _check_input(original, fixed, level_unit, compare_pixels, boxes, samples, seed, direct)
    finally:
        rngs.restore()


def _check_input(
    original: Any,
    fixed: Any,
    level_unit: Sequence[float] | float | None,
    compare_pixels: str | None,
    boxes: tuple[BoxDraw, BoxDraw, Sequence[tuple[int, int]]] | None,
    samples: int,
    seed: int,
    direct: bool,
) -> InputCheck:
    a, b = model_inputs(original, samples, seed, direct), model_inputs(fixed, samples, seed, direct)
    labels_a = [_images_labels(x)[1] for x in a]
    labels_b = [_images_labels(x)[1] for x in b]
    n = sum(len(_images_labels(x)[0]) for x in a)
    flat_a = torch.cat([torch.as_tensor(y).flatten() for y in labels_a]) if labels_a and labels_a[0] is not None else None
    flat_b = torch.cat([torch.as_tensor(y).flatten() for y in labels_b]) if labels_b and labels_b[0] is not None else None
    if flat_a is None or flat_b is None:
        labels_equal, labels = flat_a is flat_b, "no labels" if flat_a is flat_b else "labels missing on one side"
    elif flat_a.shape != flat_b.shape:
        labels_equal, labels = False, f"labels DIFFER: {len(flat_a)} against {len(flat_b)}"
    else:
        wrong = int((flat_a != flat_b).sum())
        labels_equal = wrong == 0
        labels = f"labels equal ({len(flat_a)} samples)" if labels_equal else f"labels DIFFER at {wrong} of {len(flat_a)} indices"
    specs_a = [(tuple(t.shape), t.dtype) for x in a for t in iter_tensors(x)]
    specs_b = [(tuple(t.shape), t.dtype) for x in b for t in iter_tensors(x)]
    shapes_equal = specs_a == specs_b
    first = specs_a[0] if specs_a else None
    shapes = (
        f"same shapes and dtypes ({tuple(first[0][1:])} {str(first[1]).replace('torch.', '')})"
        if shapes_equal and first
        else f"shapes or dtypes DIFFER ({specs_a[:1]} against {specs_b[:1]})"
    )
    levels = None
    pixels = f"pixels not compared: {compare_pixels}" if compare_pixels else ""
    if compare_pixels is None and shapes_equal:
        levels = _levels(a, b, level_unit)
        pixels = f"pixels within {levels:.2g} levels (mean |difference|; tolerance {PIXEL_TOLERANCE:g})"
        if levels > PIXEL_TOLERANCE:
            pixels = f"pixels DIFFER by {levels:.2g} levels on average (tolerance {PIXEL_TOLERANCE:g})"
    box_check = None if boxes is None else compare_boxes(*boxes, seed=seed)
    return InputCheck(n, labels_equal, labels, shapes_equal, shapes, levels, pixels, box_check)


def _levels(a: list[Any], b: list[Any], unit: Sequence[float] | float | None) -> float:
    total, count = 0.0, 0
    for x, y in zip(a, b):
        images_x, images_y = _images_labels(x)[0].double(), _images_labels(y)[0].double()
        diff = (images_x - images_y).abs()
        if unit is not None:
            scale = torch.as_tensor(unit, dtype=torch.float64)
            if scale.ndim == 1 and diff.ndim >= 3 and diff.shape[-3] == len(scale):
                scale = scale.view(-1, 1, 1)
            diff = diff / scale
        total += float(diff.sum())
        count += diff.numel()
    return total / max(count, 1)


def _features(boxes: list[tuple[int, int, int, int, int, int]]) -> dict[str, np.ndarray]:
    array = np.asarray(boxes, dtype=np.float64)
    top, left, h, w, height, width = array.T
    return {
        "area share": h * w / (height * width),
        "log aspect ratio": np.log(w / h),
        "centre x": (left + w / 2) / width,
        "centre y": (top + h / 2) / height,
    }


def compare_boxes(original: BoxDraw, fixed: BoxDraw, sizes: Sequence[tuple[int, int]], seed: int = 0, draws: int = BOX_DRAWS) -> BoxCheck:
    """Two crops' boxes for the same image sizes, tested feature by feature (two-sample KS; see the module docstring)."""
    from scipy.stats import ks_2samp

    drawn = []
    rngs = UserState()
    try:
        for k, draw in enumerate((original, fixed)):
            seed_all(seed + 7919 * k)  # independent draws: equal seeds would make a same-RNG pair trivially identical
            drawn.append([(*map(int, draw(*sizes[i % len(sizes)])), *sizes[i % len(sizes)]) for i in range(draws)])
    finally:
        rngs.restore()
    features_a, features_b = _features(drawn[0]), _features(drawn[1])
    worst = (math.inf, "")
    for name in features_a:
        p = float(ks_2samp(features_a[name], features_b[name]).pvalue)
        worst = min(worst, (p, name))
    return BoxCheck(worst[0], worst[1], draws)
