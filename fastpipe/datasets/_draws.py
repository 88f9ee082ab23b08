"""RandomResizedCrop's boxes and RandomHorizontalFlip's coins for a whole batch at once, from a generator of its own.

Why not :func:`fastpipe.datasets.crop.crop_params` (torchvision's own ``get_params``): it draws from
the global torch RNG, one small tensor at a time (about 30 us an image). A thread loader draws in a
background thread: the global RNG would race with the training loop's own draws (dropout, the
sampler), and the per-image Python would eat into the decode threads' cores. Here one NumPy
generator per epoch, seeded from the loader's epoch seed, draws a batch's boxes in a few array
operations.

The rule is torchvision's, step for step (``RandomResizedCrop.get_params``): up to 10 tries of a
scale uniform in ``scale`` and a log-aspect-ratio uniform in ``log(ratio)``; ``w = round(sqrt(area
* scale * ratio))``, ``h = round(sqrt(area * scale / ratio))`` (round half to even, as Python's
``round``); the first try with ``0 < w <= width`` and ``0 < h <= height`` wins, its top and left
uniform over the positions that fit; when none fits, the central crop of the ratio clamped to
``ratio``. So the distribution is torchvision's (``tests/datasets/test_threaded.py`` compares them), though
the same seed gives other boxes than the global-RNG recipe.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

#: torchvision's number of tries before the central crop.
TRIES = 10


def draw_boxes(
    rng: np.random.Generator, heights: np.ndarray, widths: np.ndarray, scale: Sequence[float], ratio: Sequence[float]
) -> np.ndarray:
    """(top, left, height, width) per image, int64 (N, 4), drawn as ``RandomResizedCrop.get_params`` draws them."""
    heights = np.asarray(heights, dtype=np.int64)
    widths = np.asarray(widths, dtype=np.int64)
    n = len(heights)
    area = (heights * widths).astype(np.float64)[:, None]
    target = area * rng.uniform(scale[0], scale[1], size=(n, TRIES))
    aspect = np.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1]), size=(n, TRIES)))
    w = np.rint(np.sqrt(target * aspect)).astype(np.int64)
    h = np.rint(np.sqrt(target / aspect)).astype(np.int64)
    fits = (w > 0) & (w <= widths[:, None]) & (h > 0) & (h <= heights[:, None])
    first = fits.argmax(axis=1)
    found = fits[np.arange(n), first]
    bw, bh = w[np.arange(n), first], h[np.arange(n), first]
    # uniform integer positions in [0, size - box]: as torch.randint(0, size - box + 1)
    top = np.floor(rng.random(n) * (heights - bh + 1)).astype(np.int64)
    left = np.floor(rng.random(n) * (widths - bw + 1)).astype(np.int64)
    boxes = np.stack([top, left, bh, bw], axis=1)
    for i in np.flatnonzero(~found):  # rare: torchvision's central-crop fallback, image by image
        boxes[i] = central_box(int(heights[i]), int(widths[i]), ratio)
    return boxes


def central_box(height: int, width: int, ratio: Sequence[float]) -> tuple[int, int, int, int]:
    """torchvision's fallback after 10 misses: the central crop whose aspect ratio is clamped to ``ratio``."""
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def draw_flips(rng: np.random.Generator, n: int, p: float) -> np.ndarray:
    """``RandomHorizontalFlip(p)``'s coins for ``n`` images (all False, with no draw, when ``p`` is 0)."""
    return rng.random(n) < p if p > 0 else np.zeros(n, dtype=bool)
