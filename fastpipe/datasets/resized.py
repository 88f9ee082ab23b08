"""The validation recipe decoded in one pass: ``Resize(s)`` + ``CenterCrop(c)`` (either alone) + an optional flip.

``Resize`` then ``CenterCrop`` on a PIL image resizes the whole image and slices its centre.
:class:`DecodeResized` does the same geometry with the decoder: the file is decoded straight to
the resized size by :func:`fastpipe.ops.jpeg.decode_jpeg_crop` (which picks the 1/2, 1/4 or 1/8
DCT scale that still covers that size, so a large photo is never decoded at full size), and the
centre is sliced from that, at the integer offsets torchvision's ``center_crop`` computes. The
box cannot be cut before resizing instead: the centre crop's edges fall between source pixels,
and the op takes an integer box, so that would shift the image by up to half a source pixel.
A ``CenterCrop`` alone needs no resize, so only its box is decoded; that shortcut is taken only
when the resize leaves the image's size as it is (``Resize(size=None, max_size=m)`` does resize,
so its centre is in resized coordinates and is sliced from the resized decode like any other).

A crop larger than the image is padded with zeros, as torchvision's ``center_crop`` does, by
calling it on the decoded tensor. No random draw is made except the flip's coin.
"""

from __future__ import annotations

from typing import Sequence

import torch

from fastpipe.datasets.crop import ON_ERROR_DECODE, check_on_error, draw_flip
from fastpipe.errors import ConfigError, CorruptImageError, DecompressionBombError
from fastpipe.ops import jpeg as jpeg_ops


def resized_size(height: int, width: int, resize: Sequence[int] | None, max_size: int | None) -> tuple[int, int]:
    """``Resize(resize, max_size=max_size)``'s output (height, width) for a ``height`` x ``width`` image (torchvision's rule)."""
    from torchvision.transforms.functional import _compute_resized_output_size

    if resize is None and max_size is None:
        return height, width
    out = _compute_resized_output_size((height, width), None if resize is None else list(resize), max_size, allow_size_none=True)
    return int(out[0]), int(out[1])


class DecodeResized:
    """A file's bytes in; ``Resize(resize)`` then ``CenterCrop(crop)`` then the flip out, as uint8 (3, h, w) RGB.

    Args:
        resize: ``Resize``'s ``size`` as a list (``[s]``: the shorter side; ``[h, w]``), or None for no resize.
        max_size: ``Resize``'s ``max_size``.
        crop: ``CenterCrop``'s (height, width), or None for no crop.
        hflip: ``RandomHorizontalFlip``'s probability (0: no draw at all).
        on_error: ``"raise"`` or ``"pil"`` (decode through PIL what the op refuses; see
            :class:`~fastpipe.datasets.crop.DecodeCrop`).
    """

    def __init__(
        self,
        resize: Sequence[int] | None = None,
        max_size: int | None = None,
        crop: tuple[int, int] | None = None,
        hflip: float = 0.0,
        on_error: str = "raise",
    ) -> None:
        if resize is None and max_size is None and crop is None:
            raise ConfigError("DecodeResized needs a resize (size or max_size), a crop, or both")
        if not 0.0 <= hflip <= 1.0:
            raise ConfigError(f"hflip is a probability in [0, 1], got {hflip}")
        self.resize = None if resize is None else [int(v) for v in resize]
        self.max_size, self.crop, self.hflip = max_size, crop, float(hflip)
        self.on_error = check_on_error(on_error, ON_ERROR_DECODE)

    def _decode(self, data: torch.Tensor, box: tuple[int, int, int, int], size: tuple[int, int]) -> torch.Tensor:
        try:
            return jpeg_ops.decode_jpeg_crop(data, box, size)
        except DecompressionBombError:
            raise
        except CorruptImageError:
            if self.on_error != "pil":
                raise
            return jpeg_ops.decode_pil(data, box, size)

    def __call__(self, data: torch.Tensor) -> torch.Tensor:
        height, width = jpeg_ops.jpeg_size(data)
        out_h, out_w = resized_size(height, width, self.resize, self.max_size)
        if self.crop is None:
            image = self._decode(data, (0, 0, height, width), (out_h, out_w))
        else:
            crop_h, crop_w = self.crop
            top, left = int(round((out_h - crop_h) / 2.0)), int(round((out_w - crop_w) / 2.0))
            # larger than the image in either side: torchvision pads; let its own kernel do it. (Not ``top < 0``:
            # a crop one pixel taller than the image has top = round(-0.5) = 0, and slicing would return it short.)
            if crop_h > out_h or crop_w > out_w:
                from torchvision.transforms.v2.functional import center_crop

                image = center_crop(self._decode(data, (0, 0, height, width), (out_h, out_w)), [crop_h, crop_w])
            elif (out_h, out_w) == (height, width):  # no resize (or one to the image's own size): decode the box alone
                image = self._decode(data, (top, left, crop_h, crop_w), (crop_h, crop_w))
            else:
                image = self._decode(data, (0, 0, height, width), (out_h, out_w))[:, top : top + crop_h, left : left + crop_w]
        if draw_flip(self.hflip):
            return image.flip(-1)
        return image.contiguous()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(resize={self.resize}, max_size={self.max_size}, crop={self.crop}, "
            f"hflip={self.hflip}, on_error={self.on_error!r})"
        )
