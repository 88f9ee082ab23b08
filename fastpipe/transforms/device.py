"""Transforms that run on the device, after the host-to-device copy of a uint8 batch.

Sending uint8 and converting on the device moves a quarter of the bytes that float32 does,
and takes per-sample float work off the DataLoader workers (the article's last list of
fixes). Reach for :class:`Normalize` first: it is torchvision's ``ToTensor()`` followed by
``Normalize(mean, std)``, on a whole batch, as one affine expression (``Normalize.imagenet()``
for the ImageNet recipe), so the model sees the same input as before. :class:`ConvertColorScale`
is the article's toy step: it changes the colour space (RGB -> YCbCr by default) as well as
the scale, so use it only where the model was trained on that.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from fastpipe.errors import ConfigError

#: The article's RGB -> YCbCr matrix and offset (JPEG's full-range BT.601).
YCBCR_MATRIX = ((0.299, 0.587, 0.114), (-0.16874, -0.33126, 0.5), (0.5, -0.41869, -0.08131))
YCBCR_OFFSET = (0.0, 128.0, 128.0)
#: torchvision's ImageNet statistics, as in its reference training recipe and pretrained weights.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _check_dtype(name: str, dtype: torch.dtype) -> None:
    if dtype not in _OUT_DTYPES:
        raise ConfigError(f"{name} dtype must be one of {', '.join(map(str, _OUT_DTYPES))}, got {dtype}")


def _map_images(batch: Any, images: Callable[[torch.Tensor], torch.Tensor], name: str) -> Any:
    """Apply ``images`` to a tensor, or to the first item of an ``(images, ...)`` tuple or list."""
    if isinstance(batch, torch.Tensor):
        return images(batch)
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
        return type(batch)([images(batch[0]), *batch[1:]])
    raise ConfigError(f"{name} takes an image tensor or an (images, ...) tuple, got {type(batch).__name__}")


class Normalize:
    """torchvision's ``ToTensor()`` + ``Normalize(mean, std)`` on a uint8 batch, as one affine map.

    ``(x / 255 - mean) / std`` is ``x * scale + bias`` with ``scale = 1 / (255 std)`` and
    ``bias = -mean / std``: one cast, one multiply and one add over the whole batch on the
    device, where the usual recipe runs a divide, a subtract and a divide per sample in the
    workers and then ships float32 (4x the bytes). The two constants are computed in float64
    and rounded once, so the result is as close to the exact value as torchvision's own
    (both within 2 float32 ulps; tested to 1e-6). Computed in float32, then cast once to ``dtype``.

    Args:
        mean, std: per-channel statistics in 0..1 units, as torchvision's ``Normalize`` takes them.
        dtype: output dtype: float32, or bfloat16/float16 for low-precision models.

    Call it on a uint8 (N, C, H, W) or (C, H, W) tensor on any device, or on a tuple/list whose
    first item is one (the ``(images, labels)`` batches of a DataLoader); other items pass through.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float], dtype: torch.dtype = torch.float32) -> None:
        _check_dtype("Normalize", dtype)
        mean64 = torch.as_tensor(mean, dtype=torch.float64).flatten()
        std64 = torch.as_tensor(std, dtype=torch.float64).flatten()
        if mean64.numel() == 0 or mean64.shape != std64.shape:
            raise ConfigError(f"Normalize needs one mean and one std per channel, got {mean64.numel()} means and {std64.numel()} stds")
        if not bool((std64 > 0).all()):
            raise ConfigError(f"Normalize needs positive stds, got {tuple(std64.tolist())}")
        self.mean, self.std, self.dtype = tuple(mean64.tolist()), tuple(std64.tolist()), dtype
        channels = mean64.numel()
        self.scale = (1.0 / (255.0 * std64)).to(torch.float32).view(channels, 1, 1)
        self.bias = (-mean64 / std64).to(torch.float32).view(channels, 1, 1)
        self._on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def imagenet(cls, dtype: torch.dtype = torch.float32) -> "Normalize":
        """``Normalize(IMAGENET_MEAN, IMAGENET_STD)``: what torchvision's ImageNet recipe and weights expect."""
        return cls(IMAGENET_MEAN, IMAGENET_STD, dtype)

    def _params(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._on_device:  # copied once per device, not per batch
            self._on_device[device] = (self.scale.to(device), self.bias.to(device))
        return self._on_device[device]

    def images(self, images: torch.Tensor) -> torch.Tensor:
        """Normalize one uint8 image batch (N, C, H, W) or image (C, H, W)."""
        channels = self.scale.shape[0]
        if images.dim() not in (3, 4) or images.shape[-3] != channels:
            raise ConfigError(
                f"Normalize({channels} channels) needs (N, {channels}, H, W) or ({channels}, H, W) images, got shape {tuple(images.shape)}"
            )
        if images.dtype != torch.uint8:
            raise ConfigError(
                f"Normalize takes uint8 images (0..255) and does ToTensor's /255 itself, got {images.dtype}; "
                "for float images already in 0..1 use torchvision.transforms.Normalize"
            )
        scale, bias = self._params(images.device)
        out = images.to(torch.float32).mul_(scale).add_(bias)
        return out if self.dtype == torch.float32 else out.to(self.dtype)

    def __call__(self, batch: Any) -> Any:
        return _map_images(batch, self.images, "Normalize")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mean={self.mean}, std={self.std}, dtype={self.dtype})"


class ConvertColorScale:
    """The article's ``Scale(ConvertColor(x))`` on a whole batch: it CHANGES THE COLOUR SPACE (RGB -> YCbCr).

    Not a drop-in for ``ToTensor() + Normalize``: by default it converts RGB to the article's
    YCbCr, so a model trained on RGB input would see different input. Use :class:`Normalize`
    for that; this one reproduces the article's toy pipeline, as one affine map ``(A/255) @ x + b/255``
    (with ``matrix=torch.eye(3), offset=(0, 0, 0)`` it is plain ``x / 255``).

    Folding the 1/255 into the matrix and offset makes colour conversion and scaling one
    affine expression over the batch, where the naive pipeline runs a matmul, an add, a cast
    and a divide per sample. Eagerly it is the uint8 -> float32 cast, one batched 3x3 matmul
    and an in-place add (on a CPU ~25x faster than the equivalent 1x1 ``conv2d``); wrap
    ``transform.images`` in ``torch.compile`` to let inductor fuse them (it compiles and
    matches on a CPU; not measured on a GPU here). It is computed in
    float32 whatever the output dtype (uint8 values are exact there; bf16 weights would cost
    ~3 significant digits), then cast once.

    Args:
        dtype: output dtype: float32 (the article's), or bfloat16/float16 for low-precision models.
        matrix, offset: the 3x3 colour matrix and 3 offsets in 0..255 units; the article's by default.

    Call it on a uint8 (N, 3, H, W) or (3, H, W) tensor on any device, or on a tuple/list
    whose first item is one (the ``(images, labels)`` batches of a DataLoader); other items
    pass through unchanged.
    """

    def __init__(
        self,
        dtype: torch.dtype = torch.float32,
        matrix: Any = YCBCR_MATRIX,
        offset: Any = YCBCR_OFFSET,
    ) -> None:
        _check_dtype("ConvertColorScale", dtype)
        weight = torch.as_tensor(matrix, dtype=torch.float64)
        bias = torch.as_tensor(offset, dtype=torch.float64)
        if weight.shape != (3, 3) or bias.shape != (3,):
            raise ConfigError(f"ConvertColorScale needs a 3x3 matrix and 3 offsets, got {tuple(weight.shape)} and {tuple(bias.shape)}")
        self.dtype = dtype
        self.weight = (weight / 255.0).to(torch.float32)
        self.bias = (bias / 255.0).to(torch.float32).view(3, 1)
        self._on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _params(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._on_device:  # copied once per device, not per batch
            self._on_device[device] = (self.weight.to(device), self.bias.to(device))
        return self._on_device[device]

    def images(self, images: torch.Tensor) -> torch.Tensor:
        """Convert one uint8 image batch (N, 3, H, W) or image (3, H, W)."""
        if images.dim() not in (3, 4) or images.shape[-3] != 3:
            raise ConfigError(f"ConvertColorScale needs (N, 3, H, W) or (3, H, W) RGB images, got shape {tuple(images.shape)}")
        weight, bias = self._params(images.device)
        pixels = images.to(torch.float32).flatten(-2)  # (N, 3, H*W)
        out = torch.matmul(weight, pixels).add_(bias).view(images.shape)
        return out if self.dtype == torch.float32 else out.to(self.dtype)

    def __call__(self, batch: Any) -> Any:
        return _map_images(batch, self.images, "ConvertColorScale")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dtype={self.dtype})"
