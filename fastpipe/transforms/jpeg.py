"""JPEG loading that decodes at reduced size when the crop allows it: the real-image decode-and-crop.

A JPEG can be decoded at 1/2, 1/4 or 1/8 scale for a fraction of the cost, by skipping DCT
coefficients (PIL's ``Image.draft``, libjpeg's ``scale_denom``). That is free quality-wise
whenever the pipeline shrinks the image afterwards anyway: a RandomResizedCrop whose box is
at least twice its output size, or a Resize to a shorter side of at most half the image.
So the crop is chosen first, from the header's size alone, and the decoder is told how much
it may shrink. The toy dataset's crop-first generation stands in for this.
"""

from __future__ import annotations

from os import PathLike
from typing import BinaryIO, Sequence

import torch
import torchvision.transforms as T
from PIL import Image

from fastpipe.errors import ConfigError

Box = tuple[float, float, float, float]
DCT_SCALES = (8, 4, 2, 1)


def dct_scale_for(box: Box, size: tuple[int, int]) -> int:
    """The largest DCT reduction (8, 4, 2 or 1) that leaves ``box`` at least ``size`` = (width, height) pixels."""
    box_width, box_height = box[2] - box[0], box[3] - box[1]
    for scale in DCT_SCALES:
        if box_width / scale >= size[0] and box_height / scale >= size[1]:
            return scale
    return 1


def _draft(im: Image.Image, scale: int) -> float:
    """Ask the decoder for 1/``scale`` size; returns the reduction it applied (1.0 for non-JPEGs)."""
    if scale == 1:
        return 1.0
    width, height = im.size
    chosen = im.draft("RGB", (max(1, width // scale), max(1, height // scale)))
    if chosen is None:
        return 1.0
    return width / chosen[1][2]  # chosen = (mode, box of the original image in reduced coordinates)


def decode_pil_draft_crop(
    source: "str | PathLike[str] | BinaryIO", box: Box, size: tuple[int, int], resample: int = Image.BILINEAR
) -> Image.Image:
    """The region ``box`` (left, top, right, bottom, in full-size pixels) resized to ``size`` = (width, height), as RGB.

    Decodes at the coarsest DCT scale that keeps the box at least ``size``; non-JPEG files
    are decoded at full size. Equal in content to ``Image.open(source).convert("RGB").resize(size, box=box)``
    up to the difference between DCT-domain and pixel-domain downscaling.
    """
    if size[0] <= 0 or size[1] <= 0:
        raise ConfigError(f"decode_pil_draft_crop needs a positive output size, got {size}")
    with Image.open(source) as im:
        left, top, right, bottom = box
        if not (0 <= left < right <= im.size[0] and 0 <= top < bottom <= im.size[1]):
            raise ConfigError(f"crop box {box} is not inside the {im.size[0]}x{im.size[1]} image")
        reduction = _draft(im, dct_scale_for(box, size))
        scaled = (left / reduction, top / reduction, right / reduction, bottom / reduction)
        if im.mode != "RGB":
            im = im.convert("RGB")
        return im.resize(size, resample, box=scaled)


def decode_jpeg_reduced(source: "str | PathLike[str] | BinaryIO", min_size: int) -> Image.Image:
    """Decode as RGB at the coarsest DCT scale whose shorter side is still at least ``min_size``.

    For pipelines that start with ``Resize(min_size)``: the resize then has less to do.
    """
    if min_size <= 0:
        raise ConfigError(f"decode_jpeg_reduced needs a positive min_size, got {min_size}")
    with Image.open(source) as im:
        shorter = min(im.size)
        scale = next((s for s in DCT_SCALES if shorter / s >= min_size), 1)
        _draft(im, scale)
        return im.convert("RGB")


class JpegRandomResizedCrop:
    """Loader that replaces ``RandomResizedCrop(size)(Image.open(path).convert("RGB"))``.

    The crop box is drawn first, with torchvision's own ``RandomResizedCrop.get_params`` (so
    the distribution of boxes is torchvision's), from the image size in the header; then only
    as much of the image is decoded as that box needs (:func:`decode_pil_draft_crop`).
    """

    def __init__(
        self,
        size: int | Sequence[int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
        resample: int = Image.BILINEAR,
    ) -> None:
        height, width = (size, size) if isinstance(size, int) else tuple(size)
        self.size = (int(height), int(width))
        self.scale, self.ratio, self.resample = scale, ratio, resample

    def box(self, image_size: tuple[int, int]) -> Box:
        """Draw a crop box (left, top, right, bottom) for an image of ``image_size`` = (width, height)."""
        width, height = image_size
        shape_only = torch.empty(1, 1, 1).expand(1, height, width)  # get_params reads only the shape
        top, left, box_height, box_width = T.RandomResizedCrop.get_params(shape_only, list(self.scale), list(self.ratio))
        return (left, top, left + box_width, top + box_height)

    def __call__(self, source: "str | PathLike[str] | BinaryIO") -> Image.Image:
        with Image.open(source) as im:
            image_size = im.size
        if hasattr(source, "seek"):
            source.seek(0)
        return decode_pil_draft_crop(source, self.box(image_size), (self.size[1], self.size[0]), self.resample)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, scale={self.scale}, ratio={self.ratio})"
