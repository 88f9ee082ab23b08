"""The article's FakeDataset: a random 1024x1024 RGB image and a uint8 label per sample.

Generating the noise image stands in for reading and decoding a real file, so its cost is
the pipeline's "raw load" stage. ``raw_size`` shrinks it; the article's last experiment
(a 256x256 raw image) is the stand-in for a decode-and-crop operator.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
from PIL import Image
from torchvision.datasets.vision import VisionDataset

ARTICLE_RAW_SIZE = (1024, 1024)
ARTICLE_LENGTH = 10_000
ARTICLE_NUM_CLASSES = 10


class FakeDataset(VisionDataset):
    """The article's dataset, with its sizes as parameters so tests can run small.

    Each item draws, in the article's order, the raw image with ``np.random.randint``, then
    the label with ``np.random.randint(..., dtype=np.uint8).item()``, then applies
    ``transform`` to the image.
    """

    def __init__(
        self,
        transform: Callable[[Any], Any] | None = None,
        length: int = ARTICLE_LENGTH,
        raw_size: tuple[int, int] = ARTICLE_RAW_SIZE,
        num_classes: int = ARTICLE_NUM_CLASSES,
    ) -> None:
        super().__init__(root=None, transform=transform)
        if length <= 0 or min(raw_size) <= 0 or num_classes <= 0:
            raise ValueError(f"FakeDataset needs positive sizes, got length={length}, raw_size={raw_size}, num_classes={num_classes}")
        self.length = length
        self.raw_size = tuple(raw_size)
        self.num_classes = num_classes

    def load_raw(self, index: int) -> Image.Image:
        """The raw load stage: a random uint8 RGB image, as the article makes it."""
        height, width = self.raw_size
        return Image.fromarray(np.random.randint(low=0, high=256, size=(height, width, 3), dtype=np.uint8))

    def __getitem__(self, index: int) -> tuple[Any, int]:
        img = self.load_raw(index)
        label = np.random.randint(low=0, high=self.num_classes, dtype=np.uint8).item()
        if self.transform is not None:
            img = self.transform(img)
        return img, label

    def __len__(self) -> int:
        return self.length
