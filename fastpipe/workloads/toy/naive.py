"""The article's transforms, reproduced exactly: the naive pipeline every result is measured against.

Stage order, shapes, dtypes and maths are the article's (see toy_workload.md). The one
liberty: RandomMask draws its mask at the image's own height and width, where the article
reads a global ``img_size`` that always equals them.
"""

from __future__ import annotations

import numpy as np
import torch
import torchvision.transforms as T

ARTICLE_IMG_SIZE = 256
ARTICLE_MASK_RATIO = 0.25
FOUR_NEIGHBOUR_KERNEL = [[0, 1, 0], [1, 1, 1], [0, 1, 0]]


class RandomMask(torch.nn.Module):
    """Zero a random, 4-neighbour-dilated set of pixels in every channel, in place (uint8 stays uint8)."""

    def __init__(self, ratio: float = ARTICLE_MASK_RATIO) -> None:
        super().__init__()
        self.ratio = ratio

    def dilate_mask(self, masks: np.ndarray) -> np.ndarray:
        # The article imports scipy inside the transform; so do we, to keep its per-call cost.
        from scipy.signal import convolve2d

        return convolve2d(masks, FOUR_NEIGHBOUR_KERNEL, mode="same").astype(bool)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        height, width = img.shape[-2:]
        masks = np.random.uniform(size=(height, width)) < self.ratio
        dilated_mask = torch.unsqueeze(torch.tensor(self.dilate_mask(masks)), 0)
        dilated_mask = dilated_mask.expand(3, -1, -1)
        img[dilated_mask] = 0.0
        return img


class ConvertColor(torch.nn.Module):
    """RGB to YCbCr with the article's matrix and offset; returns the default float dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.A = torch.tensor([[0.299, 0.587, 0.114], [-0.16874, -0.33126, 0.5], [0.5, -0.41869, -0.08131]])
        self.b = torch.tensor([0.0, 128.0, 128.0])

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        img = img.to(dtype=torch.get_default_dtype())
        img = torch.matmul(self.A, img.view([3, -1])).view(img.shape)
        img = img + self.b[:, None, None]
        return img


class Scale:
    """Divide by 255 in the default float dtype."""

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        return img.to(dtype=torch.get_default_dtype()).div(255)


def naive_transform(img_size: int = ARTICLE_IMG_SIZE, mask_ratio: float = ARTICLE_MASK_RATIO) -> T.Compose:
    """The article's Compose: PILToTensor, RandomCrop, RandomMask, ConvertColor, Scale."""
    return T.Compose([T.PILToTensor(), T.RandomCrop(img_size), RandomMask(mask_ratio), ConvertColor(), Scale()])
