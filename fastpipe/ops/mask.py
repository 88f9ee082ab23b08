"""Typed wrappers and fake kernels for the RandomMask ops in ``csrc/random_mask.cpp``.

The schemas (``TORCH_LIBRARY(fastpipe, m)`` in ``csrc/fastpipe_ops.cpp``) say which argument
each op mutates; the fake kernels here tell torch.compile and ``torch.library.opcheck``
what the ops return without running them. Every op is deterministic given its seed: the
randomness is drawn by the caller (see :mod:`fastpipe.transforms.mask`).
"""

from __future__ import annotations

import torch

import fastpipe.ops as _ops
from fastpipe.ops._device import require_cpu


def draw_mask(height: int, width: int, ratio: float, seed: int) -> torch.Tensor:
    """The undilated Bernoulli(ratio) draw for ``seed``, as a uint8 (height, width) tensor of 0/1."""
    _ops.require_extension()
    out = torch.empty((height, width), dtype=torch.uint8)
    torch.ops.fastpipe.draw_mask_(out, float(ratio), int(seed))
    return out


def apply_mask_(img: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Zero, in place, the 4-neighbour dilation of ``mask`` (H, W) in every channel of ``img`` (C, H, W)."""
    _ops.require_extension()
    require_cpu("apply_mask_", img=img, mask=mask)
    torch.ops.fastpipe.apply_mask_(img, mask)
    return img


def random_mask_(img: torch.Tensor, ratio: float, seed: int) -> torch.Tensor:
    """Draw, dilate and zero in one pass, in place; equal to ``apply_mask_(img, draw_mask(..., seed))``."""
    _ops.require_extension()
    require_cpu("random_mask_", img=img)
    torch.ops.fastpipe.random_mask_(img, float(ratio), int(seed))
    return img


def random_mask_out(img: torch.Tensor, ratio: float, seed: int, out: torch.Tensor) -> torch.Tensor:
    """``img`` masked into ``out`` (same shape and dtype, not overlapping ``img``) in one pass; ``img`` is unchanged."""
    _ops.require_extension()
    require_cpu("random_mask_out", img=img, out=out)
    torch.ops.fastpipe.random_mask_out(img, float(ratio), int(seed), out)
    return out


if _ops.EXTENSION_AVAILABLE:

    @torch.library.register_fake("fastpipe::draw_mask_")
    def _draw_mask_fake(out: torch.Tensor, ratio: float, seed: int) -> None:
        torch._check(out.dim() == 2 and out.dtype == torch.uint8, lambda: "draw_mask_: out must be uint8 (H, W)")

    @torch.library.register_fake("fastpipe::apply_mask_")
    def _apply_mask_fake(img: torch.Tensor, mask: torch.Tensor) -> None:
        torch._check(mask.dim() == 2, lambda: "apply_mask_: mask must be (H, W)")

    @torch.library.register_fake("fastpipe::random_mask_")
    def _random_mask_fake(img: torch.Tensor, ratio: float, seed: int) -> None:
        torch._check(img.dim() in (2, 3), lambda: "random_mask_: img must be (C, H, W) or (H, W)")

    @torch.library.register_fake("fastpipe::random_mask_out")
    def _random_mask_out_fake(img: torch.Tensor, ratio: float, seed: int, out: torch.Tensor) -> None:
        torch._check(out.shape == img.shape and out.dtype == img.dtype, lambda: "random_mask_out: out must match img's shape and dtype")
