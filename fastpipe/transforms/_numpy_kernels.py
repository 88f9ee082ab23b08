"""NumPy RandomMask kernels: the reference backend, and the fallback when nothing compiled is available.

Vectorised and short enough to check by eye; no loops in Python. The draw is the shared
SplitMix64 stream (``_prng.draw_bits_numpy``), so this backend agrees with the compiled
ones bit for bit.
"""

from __future__ import annotations

import numpy as np


def dilate(mask: np.ndarray) -> np.ndarray:
    """4-neighbour dilation of a bool (H, W) mask, zero outside: scipy's ``convolve2d(mode="same") > 0``."""
    mask = mask.astype(bool, copy=False)
    out = mask.copy()
    out[1:] |= mask[:-1]
    out[:-1] |= mask[1:]
    out[:, 1:] |= mask[:, :-1]
    out[:, :-1] |= mask[:, 1:]
    return out


def apply_mask_planar(img: np.ndarray, mask: np.ndarray) -> None:
    """Zero the dilation of ``mask`` in every channel of a (C, H, W) view, in place."""
    img[:, dilate(mask)] = 0
