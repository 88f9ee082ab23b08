"""Draw a RandomResizedCrop box from the image's size alone, and decode only that box.

The usual recipe decodes the whole image, then lets ``RandomResizedCrop`` throw most of it
away. Knowing the box before decoding lets the decoder skip the rest: the header gives the
size, torchvision's own ``RandomResizedCrop.get_params`` draws the box from it (same code,
same distribution, same torch RNG calls in the same order as the usual recipe, so a seeded
run draws the very same boxes and flips), and :func:`fastpipe.ops.jpeg.decode_jpeg_crop`
decodes and resizes just that box, with the flip fused.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Iterator, Sequence, Union

import torch
import torchvision.transforms as T

from fastpipe.errors import ConfigError, CorruptImageError, DecompressionBombError, FastpipeError
from fastpipe.ops import jpeg as jpeg_ops

Size = Union[int, Sequence[int]]
#: torchvision's RandomResizedCrop defaults.
DEFAULT_SCALE = (0.08, 1.0)
DEFAULT_RATIO = (3.0 / 4.0, 4.0 / 3.0)
#: How fastpipe.ops.jpeg names a source given as bytes in its error messages; replaced by the path.
BYTES_PLACEHOLDER = jpeg_ops.UNNAMED_SOURCE
#: What a damaged file does to DecodeCrop: "raise" (CorruptImageError naming the file) or "pil"
#: (decode it through PIL, as torchvision's recipe would).
ON_ERROR_DECODE = ("raise", "pil")


def as_size(size: Size) -> tuple[int, int]:
    """``224`` -> ``(224, 224)``; ``(h, w)`` is kept. Checked positive."""
    pair = (size, size) if isinstance(size, int) else tuple(size)
    if len(pair) != 2 or not all(isinstance(v, int) and v > 0 for v in pair):
        raise ConfigError(f"size must be a positive int or (height, width), got {size!r}")
    return int(pair[0]), int(pair[1])


def check_range(name: str, value: Sequence[float]) -> tuple[float, float]:
    """A (low, high) pair with 0 < low <= high, as RandomResizedCrop's scale and ratio must be."""
    pair = tuple(float(v) for v in value)
    if len(pair) != 2 or not 0 < pair[0] <= pair[1] or not all(map(math.isfinite, pair)):
        raise ConfigError(f"{name} must be (low, high) with 0 < low <= high, got {value!r}")
    return pair  # type: ignore[return-value]


def crop_params(
    height: int, width: int, scale: Sequence[float] = DEFAULT_SCALE, ratio: Sequence[float] = DEFAULT_RATIO
) -> tuple[int, int, int, int]:
    """``RandomResizedCrop.get_params`` for an image of ``height`` x ``width``: (top, left, box_h, box_w).

    torchvision's function wants an image only for its size; a zero-stride (height, width)
    tensor gives it that size without holding any pixels. Uses the global torch RNG, as
    torchvision does (each DataLoader worker seeds it differently).
    """
    if height <= 0 or width <= 0:
        raise ConfigError(f"image size must be positive, got {height}x{width}")
    shape_only = torch.empty((), dtype=torch.uint8).expand(height, width)
    return T.RandomResizedCrop.get_params(shape_only, list(scale), list(ratio))  # type: ignore[arg-type]


def crop_settings(
    size: Size, scale: Sequence[float], ratio: Sequence[float], hflip: float
) -> tuple[tuple[int, int], tuple[float, float], tuple[float, float], float]:
    """RandomResizedCrop's settings and the flip probability, checked: (size, scale, ratio, hflip)."""
    if not 0.0 <= hflip <= 1.0:
        raise ConfigError(f"hflip is a probability in [0, 1], got {hflip}")
    return as_size(size), check_range("scale", scale), check_range("ratio", ratio), float(hflip)


def draw_flip(p: float) -> bool:
    """``RandomHorizontalFlip(p)``'s draw; none at all when ``p`` is 0, as a recipe without the flip makes none."""
    return p > 0 and bool(torch.rand(1) < p)


@contextlib.contextmanager
def naming_errors(source: object) -> Iterator[None]:
    """Errors about the bytes of a file read from a path name the path, as the user needs to find the file."""
    try:
        yield
    except FastpipeError as exc:
        if not isinstance(source, (str, os.PathLike)):
            raise
        path = os.fspath(source)
        message = str(exc)
        message = message.replace(BYTES_PLACEHOLDER, path, 1) if BYTES_PLACEHOLDER in message else f"{path}: {message}"
        raise type(exc)(message) from exc


def check_on_error(on_error: str, allowed: Sequence[str]) -> str:
    """``on_error`` if it is one of ``allowed``, else a ConfigError that lists them."""
    if on_error not in allowed:
        raise ConfigError(f"on_error must be one of {', '.join(map(repr, allowed))}, got {on_error!r}")
    return on_error


class DecodeCrop:
    """The decode-and-crop stage: a file's bytes in, its random crop out as uint8 (3, h, w) RGB.

    Reads the size from the header, draws ``RandomResizedCrop``'s box and ``RandomHorizontalFlip``'s
    coin with torchvision's code, then decodes only that box (the flip fused) with
    :func:`fastpipe.ops.jpeg.decode_jpeg_crop`. One stage, so ``fastpipe diagnose`` times it
    apart from reading the file.

    ``on_error="pil"``: a file the op refuses (it treats libjpeg's warnings about damaged data
    as errors) is decoded again through PIL on the same box and flip
    (:func:`fastpipe.ops.jpeg.decode_pil`), as torchvision's recipe would decode it; what PIL
    cannot decode either, and a file over the pixel limit, still raise.
    """

    def __init__(
        self,
        size: Size = 224,
        scale: Sequence[float] = DEFAULT_SCALE,
        ratio: Sequence[float] = DEFAULT_RATIO,
        hflip: float = 0.5,
        on_error: str = "raise",
    ) -> None:
        self.size, self.scale, self.ratio, self.hflip = crop_settings(size, scale, ratio, hflip)
        self.on_error = check_on_error(on_error, ON_ERROR_DECODE)

    def __call__(self, data: torch.Tensor) -> torch.Tensor:
        box = crop_params(*jpeg_ops.jpeg_size(data), self.scale, self.ratio)
        flip = draw_flip(self.hflip)
        try:
            return jpeg_ops.decode_jpeg_crop(data, box, self.size, hflip=flip)
        except DecompressionBombError:
            raise
        except CorruptImageError:
            if self.on_error != "pil":
                raise
            return jpeg_ops.decode_pil(data, box, self.size, hflip=flip)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, scale={self.scale}, ratio={self.ratio}, hflip={self.hflip}, on_error={self.on_error!r})"


class DecodeCropLoader(DecodeCrop):
    """A ``loader`` for torchvision's ``ImageFolder`` that returns the random crop, decoded alone, as uint8 CHW.

    torchvision's ``ImageFolder(root, loader=...)`` calls ``loader(path)`` and only then the
    transform, so a loader that wants to decode only the crop must draw the crop itself::

        from fastpipe.datasets import DecodeCropLoader
        from fastpipe.transforms import Normalize

        dataset = torchvision.datasets.ImageFolder(root, loader=DecodeCropLoader(224))
        # no transform: the loader did RandomResizedCrop(224) + RandomHorizontalFlip() and
        # returns uint8 (3, 224, 224); after the copy to the GPU:
        images = Normalize.imagenet()(images.cuda(non_blocking=True))

    Keep in the transform only what comes after the crop and flip (e.g. nothing, or colour
    jitter on the uint8 tensor); drop ``RandomResizedCrop``, ``RandomHorizontalFlip``,
    ``ToTensor`` and ``Normalize``. A picklable object, so it works with any worker start method.
    Errors name the file; ``on_error="pil"`` decodes through PIL what the op refuses (see
    :class:`DecodeCrop`).
    """

    def __call__(self, source: "str | os.PathLike[str] | bytes | torch.Tensor") -> torch.Tensor:  # type: ignore[override]
        with naming_errors(source):
            return super().__call__(jpeg_ops.read_bytes(source))  # read once: the header and the decode share it
