"""The article's FakeDataset, and FastFakeDataset: the same samples, loaded the fast way.

Generating the noise image stands in for reading and decoding a real file, so its cost is
the pipeline's "raw load" stage. ``raw_size`` shrinks it; the article's last experiment
(a 256x256 raw image) is the stand-in for a decode-and-crop operator, which
:class:`FastFakeDataset` models properly with ``crop_size``.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
import torchvision.transforms as T
from PIL import Image
from torchvision.datasets.vision import VisionDataset

from fastpipe.errors import ConfigError

ARTICLE_RAW_SIZE = (1024, 1024)
ARTICLE_LENGTH = 10_000
ARTICLE_NUM_CLASSES = 10


class FakeDataset(VisionDataset):
    """The article's dataset, with its sizes as parameters so tests can run small.

    Each item draws, in the article's order, the raw image with ``np.random.randint``, then
    the label with ``np.random.randint(..., dtype=np.uint8).item()``, then applies
    ``transform`` to the image.
    """

    raw_load_reads_files = False
    """Declared for fastpipe's advice: the raw load generates its image and reads or decodes no file, so the
    decode-the-crop drop-ins (which decode JPEG files) do not apply to it (see fastpipe.diagnosis.verdict._fits)."""

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

    def load_raw(self, index: int) -> Any:
        """The raw load stage: a random uint8 RGB image, as the article makes it."""
        height, width = self.raw_size
        return Image.fromarray(np.random.randint(low=0, high=256, size=(height, width, 3), dtype=np.uint8))

    def draw_label(self) -> int:
        return np.random.randint(low=0, high=self.num_classes, dtype=np.uint8).item()

    def __getitem__(self, index: int) -> tuple[Any, int]:
        img = self.load_raw(index)
        label = self.draw_label()
        if self.transform is not None:
            img = self.transform(img)
        return img, label

    def __len__(self) -> int:
        return self.length


class FastFakeDataset(FakeDataset):
    """FakeDataset's samples with the same distribution, loaded as a fast decoder would load them.

    Two changes, both to the raw load:

    * the pixels come as an (H, W, 3) uint8 array from :func:`fastpipe.transforms.uniform_noise`
      (independent uniform bytes, like ``np.random.randint(0, 256)``, ~10x faster) instead of
      a PIL image, the way ``torchvision.io.decode_jpeg`` or OpenCV return pixels; follow it
      with :class:`fastpipe.transforms.ToCHWTensor`, not ``PILToTensor``;
    * with ``crop_size``, the crop is chosen first and only that region is generated: the
      stand-in for a decode-and-crop operator. The transform then receives the crop and must
      not crop again. For uniform noise any region of the full image is uniform noise of the
      region's size, so the samples have exactly the distribution of "generate the full
      image, then RandomCrop(crop_size)".
    """

    def __init__(
        self,
        transform: Callable[[Any], Any] | None = None,
        length: int = ARTICLE_LENGTH,
        raw_size: tuple[int, int] = ARTICLE_RAW_SIZE,
        num_classes: int = ARTICLE_NUM_CLASSES,
        crop_size: int | tuple[int, int] | None = None,
    ) -> None:
        super().__init__(transform, length, raw_size, num_classes)
        if crop_size is not None:
            crop = (crop_size, crop_size) if isinstance(crop_size, int) else tuple(crop_size)
            if len(crop) != 2 or min(crop) <= 0 or crop[0] > self.raw_size[0] or crop[1] > self.raw_size[1]:
                raise ConfigError(f"crop_size {crop_size} must be positive and fit inside raw_size {self.raw_size}")
            crop_size = (int(crop[0]), int(crop[1]))
        self.crop_size: tuple[int, int] | None = crop_size

    def crop_box(self) -> tuple[int, int, int, int]:
        """(top, left, height, width) of the crop, drawn as ``RandomCrop`` draws it (torch's RNG)."""
        assert self.crop_size is not None
        shape_only = torch.empty(1, 1, 1).expand(1, *self.raw_size)  # get_params reads only the shape
        return T.RandomCrop.get_params(shape_only, self.crop_size)

    def load_region(self, index: int, top: int, left: int, height: int, width: int) -> np.ndarray:
        """Decode only the region: for noise, fresh noise of the region's size (its position cannot matter)."""
        from fastpipe.transforms.noise import uniform_noise

        return uniform_noise((height, width, 3))

    def load_raw(self, index: int) -> np.ndarray:
        """The raw load stage: the whole image, or with ``crop_size`` only the crop (see the class docstring)."""
        from fastpipe.transforms.noise import uniform_noise

        if self.crop_size is None:
            return uniform_noise((*self.raw_size, 3))
        return self.load_region(index, *self.crop_box())
