"""Numba kernels: the SplitMix64 stream, RandomMask (fused, draw-only, apply-only) and uniform noise.

Each kernel is plain Python that Numba compiles (see :mod:`fastpipe.transforms._jit`). The
fused mask kernel draws, dilates and zeroes in one pass over the image, keeping three rows
of draws (``width + 2`` bytes each) instead of a full-size mask: row y+1 is drawn before row
y is dilated and applied.

Two image layouts get their own inner loop, because a loop over 3 interleaved channels does
not vectorise: planar images (C, H, W), for CHW tensors and crop views of them, of any
strides; and interleaved rows (H, W*C), for contiguous HWC arrays, where the row's hit flags
are first spread over its channels and then applied to the row in one vectorised select.

Integer arithmetic is kept in uint64 on purpose: Numba types a mix of signed and unsigned
64-bit integers as float64, which would silently break the stream.
"""
from __future__ import annotations

import numpy as np

from fastpipe.transforms._jit import jit

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@jit
def splitmix_word(seed: np.uint64, index: np.uint64) -> np.uint64:
    """Word ``index`` of the counter-based SplitMix64 stream for ``seed`` (see ``_prng``)."""
    z = seed + (index + np.uint64(1)) * _GAMMA
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@jit
def fill_uniform(out: np.ndarray, seed: int) -> None:
    """Fill a 1-D uint64 array with the stream: 8 uniform bytes per word, vectorised by LLVM."""
    s = np.uint64(seed)
    for i in range(out.size):
        out[i] = splitmix_word(s, np.uint64(i))


@jit
def draw_row(row: np.ndarray, offset: int, y: int, width: int, seed: int, bits: int, threshold: int) -> None:
    """``row[offset + x] = 1`` where pixel (y, x) is drawn, else 0, for x in [0, width)."""
    s = np.uint64(seed)
    b = np.uint64(bits)
    t = np.uint64(threshold)
    per_word = 64 // bits
    chunk_mask = (np.uint64(1) << b) - np.uint64(1)
    p = y * width
    end = p + width
    x = offset
    while p < end:
        index = p // per_word
        first = p - index * per_word
        count = min(end - p, per_word - first)
        word = splitmix_word(s, np.uint64(index)) >> (b * np.uint64(first))
        run = row[x : x + count]  # a slice, and shifts that do not depend on each other: this loop vectorises
        for k in range(count):
            run[k] = ((word >> (b * np.uint64(k))) & chunk_mask) < t
        p += count
        x += count


@jit
def copy_row(row: np.ndarray, mask: np.ndarray, y: int) -> None:
    """``row[1 + x] = mask[y, x]`` (as 0/1), or all zeros when y is outside the mask."""
    height, width = mask.shape
    for x in range(width):
        row[x + 1] = 1 if (0 <= y < height and mask[y, x]) else 0


@jit
def dilate_row(prev: np.ndarray, cur: np.ndarray, nxt: np.ndarray, hit: np.ndarray) -> None:
    """4-neighbour dilation of one row: draws sit at offsets 1..W with zero padding, as scipy's
    ``convolve2d(mode="same")`` zero boundary, and rows outside the image are all zeros."""
    for x in range(hit.size):
        hit[x] = cur[x] | cur[x + 1] | cur[x + 2] | prev[x + 1] | nxt[x + 1]


@jit
def zero_planar_row(img: np.ndarray, y: int, hit: np.ndarray) -> None:
    """Zero pixels of row y of a (C, H, W) image where ``hit`` is set (a select, so it vectorises)."""
    zero = img.dtype.type(0)
    for c in range(img.shape[0]):
        for x in range(img.shape[2]):
            img[c, y, x] = zero if hit[x] else img[c, y, x]


@jit
def zero_interleaved_row(rows: np.ndarray, y: int, hit: np.ndarray, spread: np.ndarray, integer: bool) -> None:
    """Zero pixels of row y of an (H, W*C) interleaved image where ``hit`` is set.

    RGB integer images (the common case) multiply each pixel's 3 values by 0 or 1, unrolled,
    which LLVM vectorises; anything else spreads ``hit`` over the channels first and then
    selects (a multiply would keep NaN and inf in float images).
    """
    width = hit.size
    channels = spread.size // width
    row = rows[y]
    if integer and channels == 3:
        for x in range(width):
            keep = rows.dtype.type(1 - hit[x])
            row[3 * x] *= keep
            row[3 * x + 1] *= keep
            row[3 * x + 2] *= keep
        return
    for c in range(channels):
        lane = spread[c:]
        for x in range(width):
            lane[x * channels] = hit[x]
    zero = rows.dtype.type(0)
    for i in range(spread.size):
        row[i] = zero if spread[i] else row[i]


@jit
def random_mask_planar(img: np.ndarray, seed: int, bits: int, threshold: int) -> None:
    """Fused draw, dilate and zero of a (C, H, W) image, in place."""
    _, height, width = img.shape
    prev, cur, nxt = np.zeros(width + 2, np.uint8), np.zeros(width + 2, np.uint8), np.zeros(width + 2, np.uint8)
    hit = np.empty(width, np.uint8)
    if height > 0:
        draw_row(cur, 1, 0, width, seed, bits, threshold)
    for y in range(height):
        if y + 1 < height:
            draw_row(nxt, 1, y + 1, width, seed, bits, threshold)
        else:
            nxt[:] = 0
        dilate_row(prev, cur, nxt, hit)
        zero_planar_row(img, y, hit)
        prev, cur, nxt = cur, nxt, prev


@jit
def random_mask_interleaved(rows: np.ndarray, channels: int, integer: bool, seed: int, bits: int, threshold: int) -> None:
    """Fused draw, dilate and zero of an (H, W*C) interleaved image, in place."""
    height = rows.shape[0]
    width = rows.shape[1] // channels
    prev, cur, nxt = np.zeros(width + 2, np.uint8), np.zeros(width + 2, np.uint8), np.zeros(width + 2, np.uint8)
    hit = np.empty(width, np.uint8)
    spread = np.empty(width * channels, np.uint8)
    if height > 0:
        draw_row(cur, 1, 0, width, seed, bits, threshold)
    for y in range(height):
        if y + 1 < height:
            draw_row(nxt, 1, y + 1, width, seed, bits, threshold)
        else:
            nxt[:] = 0
        dilate_row(prev, cur, nxt, hit)
        zero_interleaved_row(rows, y, hit, spread, integer)
        prev, cur, nxt = cur, nxt, prev


@jit
def apply_mask_planar(img: np.ndarray, mask: np.ndarray) -> None:
    """Dilate a given (H, W) draw and zero those pixels of a (C, H, W) image, in place."""
    width = img.shape[2]
    prev, cur, nxt = np.zeros(width + 2, np.uint8), np.zeros(width + 2, np.uint8), np.zeros(width + 2, np.uint8)
    hit = np.empty(width, np.uint8)
    copy_row(cur, mask, 0)
    for y in range(img.shape[1]):
        copy_row(nxt, mask, y + 1)
        dilate_row(prev, cur, nxt, hit)
        zero_planar_row(img, y, hit)
        prev, cur, nxt = cur, nxt, prev


@jit
def apply_mask_interleaved(rows: np.ndarray, channels: int, integer: bool, mask: np.ndarray) -> None:
    """Dilate a given (H, W) draw and zero those pixels of an (H, W*C) interleaved image, in place."""
    width = mask.shape[1]
    prev, cur, nxt = np.zeros(width + 2, np.uint8), np.zeros(width + 2, np.uint8), np.zeros(width + 2, np.uint8)
    hit = np.empty(width, np.uint8)
    spread = np.empty(width * channels, np.uint8)
    copy_row(cur, mask, 0)
    for y in range(rows.shape[0]):
        copy_row(nxt, mask, y + 1)
        dilate_row(prev, cur, nxt, hit)
        zero_interleaved_row(rows, y, hit, spread, integer)
        prev, cur, nxt = cur, nxt, prev


@jit
def draw_mask(height: int, width: int, seed: int, bits: int, threshold: int) -> np.ndarray:
    """The undilated draw the fused kernels use, as a (height, width) uint8 array of 0/1."""
    out = np.empty((height, width), np.uint8)
    for y in range(height):
        draw_row(out[y], 0, y, width, seed, bits, threshold)
    return out
