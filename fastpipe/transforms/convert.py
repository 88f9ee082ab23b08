"""Small layout transforms for uint8 pipelines that skip PIL: HWC arrays to CHW tensors.

Decoders such as ``torchvision.io.decode_jpeg``, OpenCV and :func:`uniform_noise` give
pixels as arrays; going through a PIL image and ``PILToTensor`` costs two full-size copies.
:class:`ToCHWTensor` makes a zero-copy CHW view instead, so a following ``RandomCrop`` is
free and only the crop is ever copied (by :class:`Contiguous`).
"""

from __future__ import annotations

import numpy as np
import torch

from fastpipe.errors import ConfigError


class ToCHWTensor:
    """An (H, W, C) or (H, W) NumPy array -> a (C, H, W) tensor sharing its memory (``contiguous=True`` copies)."""

    def __init__(self, contiguous: bool = False) -> None:
        self.contiguous = contiguous

    def __call__(self, img: np.ndarray) -> torch.Tensor:
        if not isinstance(img, np.ndarray) or img.ndim not in (2, 3):
            raise ConfigError(f"ToCHWTensor takes an (H, W, C) or (H, W) numpy array, got {type(img).__name__} {getattr(img, 'shape', '')}")
        if not img.flags.writeable:
            img = np.array(img)  # torch cannot safely share read-only memory
        tensor = torch.from_numpy(img)
        tensor = tensor.permute(2, 0, 1) if tensor.dim() == 3 else tensor.unsqueeze(0)
        return tensor.contiguous() if self.contiguous else tensor

    def __repr__(self) -> str:
        return f"{type(self).__name__}(contiguous={self.contiguous})"


class Contiguous:
    """Copy a tensor view into its own compact memory.

    Put it right after a crop of a large image: a sample that is a view keeps the whole
    source image alive until collate (a 256x256 crop pinning a 3 MB raw image, times the
    batch size), and the copy also gives the next transform a planar layout to work on.
    """

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        return img.contiguous()

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
