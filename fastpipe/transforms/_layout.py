"""Turning the images RandomMask accepts into the (C, H, W) views its kernels take.

Torch tensors are channels-first, ``(C, H, W)`` or ``(H, W)``, as after ``PILToTensor``;
NumPy arrays are channels-last, ``(H, W, C)`` or ``(H, W)``, as from PIL, OpenCV or
``torchvision.io``'s HWC decoders. Either way the kernels get a view of the same memory, so
masking in place writes through to the caller's image.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from fastpipe.errors import ConfigError


def check_image(img: Any, inplace: bool) -> None:
    """Raise a ConfigError that says what to pass instead, for anything the kernels cannot take."""
    if isinstance(img, torch.Tensor):
        if img.dim() not in (2, 3):
            raise ConfigError(
                f"RandomMask takes one image, a (C, H, W) or (H, W) tensor; got shape {tuple(img.shape)} (mask batches per sample)"
            )
        if img.device.type != "cpu":
            raise ConfigError(f"RandomMask runs on CPU tensors in the DataLoader workers; got a tensor on {img.device}")
        if inplace and img.requires_grad:
            raise ConfigError("RandomMask cannot mask a tensor that requires grad in place; pass inplace=False")
    elif isinstance(img, np.ndarray):
        if img.ndim not in (2, 3):
            raise ConfigError(f"RandomMask takes one image, an (H, W, C) or (H, W) array; got shape {img.shape}")
        if inplace and not img.flags.writeable:
            raise ConfigError("RandomMask got a read-only array (np.asarray of a PIL image is one); pass inplace=False or np.array(img)")
    else:
        raise ConfigError(
            f"RandomMask takes a torch.Tensor (C, H, W) or a numpy array (H, W, C), not {type(img).__name__}; for PIL images apply PILToTensor first"
        )


def empty_compact(img: Any) -> Any:
    """Uninitialised C-contiguous storage of ``img``'s shape and dtype, in the caller's layout.

    Out-of-place results go here: a (C, H, W) tensor comes back planar, an (H, W, C) array
    interleaved, and a crop view comes back compact, no longer holding its source image.
    """
    if isinstance(img, torch.Tensor):
        return torch.empty(img.shape, dtype=img.dtype)
    return np.empty(img.shape, dtype=img.dtype)


def planar_numpy(img: Any) -> np.ndarray:
    """A (C, H, W) NumPy view of ``img``'s memory."""
    if isinstance(img, torch.Tensor):
        try:
            array = img.detach().numpy()
        except TypeError as exc:  # e.g. bfloat16, which NumPy cannot represent
            raise ConfigError(
                f"the numpy and numba backends cannot read {img.dtype} tensors ({exc}); use backend='cpp' or mask before the cast"
            ) from exc
        return array if array.ndim == 3 else array[None]
    return img.transpose(2, 0, 1) if img.ndim == 3 else img[None]


def planar_tensor(img: Any) -> torch.Tensor:
    """A (C, H, W) tensor view of ``img``'s memory (read-only arrays only ever arrive as sources)."""
    if isinstance(img, torch.Tensor):
        tensor = img
    elif img.flags.writeable:
        tensor = torch.from_numpy(img)
    else:
        with warnings.catch_warnings():  # torch warns that it cannot protect read-only memory; we never write it
            warnings.simplefilter("ignore", UserWarning)
            tensor = torch.from_numpy(img)
    if isinstance(img, np.ndarray) and img.ndim == 3:
        tensor = tensor.permute(2, 0, 1)
    return tensor if tensor.dim() == 3 else tensor.unsqueeze(0)


def interleaved_flat(planar: np.ndarray) -> tuple[np.ndarray, int] | None:
    """``(flat, step)`` when channels are interleaved and each row is one contiguous run, else None.

    ``flat`` is a 1-D contiguous view of the image's memory, from its first value to its last,
    and row y starts at ``flat[y * step]``. Such rows (an HWC array, or a crop of one) get
    loops that vectorise; other layouts use the planar kernels, which take any strides.
    """
    channels, height, width = planar.shape
    item = planar.itemsize
    if channels < 2 or height == 0 or planar.strides[0] != item or planar.strides[2] != channels * item or planar.strides[1] % item:
        return None
    step = planar.strides[1] // item
    if step < width * channels:
        return None  # rows overlap: not an image a kernel may write
    span = (height - 1) * step + width * channels
    return np.lib.stride_tricks.as_strided(planar, shape=(span,), strides=(item,)), step
