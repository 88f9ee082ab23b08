"""Transforms that run on the device, after the host-to-device copy of a uint8 batch.

Sending uint8 and converting on the device moves a quarter of the bytes that float32 does,
and takes per-sample float work off the DataLoader workers (the article's last list of
fixes). :class:`ConvertColorScale` replaces the naive per-sample ``ConvertColor`` followed
by ``Scale`` with one batched expression.
"""
from __future__ import annotations

from typing import Any

import torch

from fastpipe.errors import ConfigError

#: The article's RGB -> YCbCr matrix and offset (JPEG's full-range BT.601).
YCBCR_MATRIX = ((0.299, 0.587, 0.114), (-0.16874, -0.33126, 0.5), (0.5, -0.41869, -0.08131))
YCBCR_OFFSET = (0.0, 128.0, 128.0)
_OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


class ConvertColorScale:
    """``Scale(ConvertColor(x))`` on a whole batch, as one affine map: ``(A/255) @ x + b/255``.

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
        if dtype not in _OUT_DTYPES:
            raise ConfigError(f"ConvertColorScale dtype must be one of {', '.join(map(str, _OUT_DTYPES))}, got {dtype}")
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
        if isinstance(batch, torch.Tensor):
            return self.images(batch)
        if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
            return type(batch)([self.images(batch[0]), *batch[1:]])
        raise ConfigError(f"ConvertColorScale takes an image tensor or an (images, ...) tuple, got {type(batch).__name__}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dtype={self.dtype})"
