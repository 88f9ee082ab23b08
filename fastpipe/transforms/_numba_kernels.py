"""Numba kernels: the SplitMix64 stream, RandomMask (fused, draw-only, apply-only) and uniform noise.

Each kernel is plain Python that Numba compiles (see :mod:`fastpipe.transforms._jit`). The
fused mask kernels draw, dilate and zero in one pass over the image, keeping three rows of
draws (``width + 2`` bytes each) instead of a full-size mask: row y+1 is drawn before row y
is dilated and applied. They read ``src`` and write ``dst``: in place (``inplace=True``,
``dst`` unused) or into a fresh ``dst``, which gives a compact masked copy in the same pass.

Loops are shaped for the layouts that vectorise: planar images (C, H, W) of any strides,
for CHW tensors and their crop views; interleaved images (HWC memory) passed flat, one
contiguous run per row, which an RGB integer image masks with an unrolled multiply; and the
HWC -> planar copy, which de-interleaves and masks together. In-place and out-of-place loops
are separate on purpose: with two arrays LLVM guards its vector loop with an overlap check
that fails when they are the same array.

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
def make_lut(bits: int, threshold: int) -> np.ndarray:
    """For ``bits`` <= 8: byte k of ``lut[v]`` is the draw of chunk k of the byte value v.

    Turning a word into draws a byte at a time (one lookup, 8 / bits stores) is ~3x faster
    than a chunk at a time. Unused (all zeros) for 16-bit chunks.
    """
    lut = np.zeros(256, np.uint64)
    if bits <= 8:
        per_byte = 8 // bits
        chunk_mask = (1 << bits) - 1
        for v in range(256):
            acc = 0
            for k in range(per_byte):
                if ((v >> (bits * k)) & chunk_mask) < threshold:
                    acc += 1 << (8 * k)
            lut[v] = acc
    return lut


@jit
def draw_chunks(row: np.ndarray, x: int, word: np.uint64, first: int, count: int, bits: int, threshold: int) -> None:
    """Draws of chunks ``first .. first+count-1`` of ``word`` into ``row[x : x + count]``, one chunk at a time."""
    b = np.uint64(bits)
    chunk_mask = (np.uint64(1) << b) - np.uint64(1)
    t = np.uint64(threshold)
    word = word >> (b * np.uint64(first))
    for k in range(count):
        row[x + k] = ((word >> (b * np.uint64(k))) & chunk_mask) < t


@jit
def draw_row(row: np.ndarray, offset: int, y: int, width: int, seed: int, bits: int, threshold: int, lut: np.ndarray) -> None:
    """``row[offset + x] = 1`` where pixel (y, x) is drawn, else 0, for x in [0, width).

    A word the row starts or ends inside goes a chunk at a time; the whole words between go
    through ``lut`` (:func:`make_lut`), a byte of draws per lookup, in one branch-free loop
    per chunk width, which is what lets LLVM keep it tight (~4x faster than chunk by chunk).
    """
    s = np.uint64(seed)
    byte = np.uint64(255)
    per_word = 64 // bits
    p = y * width
    end = p + width
    index = p // per_word
    first = p - index * per_word
    x = offset
    if first > 0:  # the row starts inside a word
        count = min(end - p, per_word - first)
        draw_chunks(row, x, splitmix_word(s, np.uint64(index)), first, count, bits, threshold)
        p += count
        x += count
        index += 1
    whole = (end - p) // per_word
    if bits == 2:
        for w in range(whole):
            word = splitmix_word(s, np.uint64(index + w))
            run = row[x + 32 * w : x + 32 * w + 32]  # fixed-size slices: constant offsets, tight code
            for j in range(8):
                v = lut[(word >> np.uint64(8 * j)) & byte]
                run[4 * j] = v & byte
                run[4 * j + 1] = (v >> np.uint64(8)) & byte
                run[4 * j + 2] = (v >> np.uint64(16)) & byte
                run[4 * j + 3] = (v >> np.uint64(24)) & byte
    elif bits == 1:
        for w in range(whole):
            word = splitmix_word(s, np.uint64(index + w))
            run = row[x + 64 * w : x + 64 * w + 64]
            for j in range(8):
                v = lut[(word >> np.uint64(8 * j)) & byte]
                for k in range(8):
                    run[8 * j + k] = (v >> np.uint64(8 * k)) & byte
    elif bits == 4:
        for w in range(whole):
            word = splitmix_word(s, np.uint64(index + w))
            run = row[x + 16 * w : x + 16 * w + 16]
            for j in range(8):
                v = lut[(word >> np.uint64(8 * j)) & byte]
                run[2 * j] = v & byte
                run[2 * j + 1] = (v >> np.uint64(8)) & byte
    elif bits == 8:
        for w in range(whole):
            word = splitmix_word(s, np.uint64(index + w))
            run = row[x + 8 * w : x + 8 * w + 8]
            for j in range(8):
                run[j] = lut[(word >> np.uint64(8 * j)) & byte]
    else:
        t = np.uint64(threshold)
        half = np.uint64(0xFFFF)
        for w in range(whole):
            word = splitmix_word(s, np.uint64(index + w))
            run = row[x + 4 * w : x + 4 * w + 4]
            run[0] = (word & half) < t
            run[1] = ((word >> np.uint64(16)) & half) < t
            run[2] = ((word >> np.uint64(32)) & half) < t
            run[3] = (word >> np.uint64(48)) < t
    p += whole * per_word
    x += whole * per_word
    if p < end:  # the row ends inside a word
        draw_chunks(row, x, splitmix_word(s, np.uint64(index + whole)), 0, end - p, bits, threshold)


@jit
def fill_row(row: np.ndarray, y: int, width: int, seed: int, bits: int, threshold: int, lut: np.ndarray, mask: np.ndarray) -> None:
    """Draws of row y at ``row[1 : width + 1]``: copied from ``mask`` when one is given (non-empty), else drawn.

    Rows outside the image are all zeros, as is the padding at both ends: scipy's
    ``convolve2d(mode="same")`` zero boundary.
    """
    height = mask.shape[0] if mask.size > 0 else -1
    if y < 0 or (height >= 0 and y >= height):
        row[:] = 0
    elif mask.size > 0:
        for x in range(width):
            row[x + 1] = 1 if mask[y, x] else 0
    else:
        draw_row(row, 1, y, width, seed, bits, threshold, lut)


@jit
def dilate_row(prev: np.ndarray, cur: np.ndarray, nxt: np.ndarray, hit: np.ndarray) -> None:
    """4-neighbour dilation of one row, from the draws of the rows above, at and below it."""
    for x in range(hit.size):
        hit[x] = cur[x] | cur[x + 1] | cur[x + 2] | prev[x + 1] | nxt[x + 1]


@jit
def zero_planar_row(img: np.ndarray, y: int, hit: np.ndarray, integer: bool) -> None:
    """In place: zero pixels of row y of a (C, H, W) image where ``hit`` is set.

    Integer images multiply by 0 or 1, branch-free for any target. A select (which float images
    would need, since a multiply keeps NaN and inf) is compiled by LLVM into a branch per pixel for
    some targets (the x86-64 baseline, Sandy Bridge), 3-8x slower on random masks, so float images
    arrive here as their bits (see ``mask._numba_mask``).
    """
    if integer:
        for c in range(img.shape[0]):
            for x in range(img.shape[2]):
                img[c, y, x] *= img.dtype.type(1 - hit[x])
        return
    zero = img.dtype.type(0)
    for c in range(img.shape[0]):
        for x in range(img.shape[2]):
            img[c, y, x] = zero if hit[x] else img[c, y, x]


@jit
def copy_planar_row(src: np.ndarray, dst: np.ndarray, y: int, hit: np.ndarray, integer: bool) -> None:
    """Out of place: row y of ``dst`` = row y of ``src``, zeroed where ``hit`` is set. Any strides.

    A separate loop from the in-place one on purpose: with two arrays LLVM guards its vector
    loop with an overlap check, which fails when they are the same array. Integer images
    multiply, as in :func:`zero_planar_row`.
    """
    if integer:
        for c in range(dst.shape[0]):
            for x in range(dst.shape[2]):
                dst[c, y, x] = src[c, y, x] * dst.dtype.type(1 - hit[x])
        return
    zero = dst.dtype.type(0)
    for c in range(dst.shape[0]):
        for x in range(dst.shape[2]):
            dst[c, y, x] = zero if hit[x] else src[c, y, x]


@jit
def interleaved_row(
    src: np.ndarray,
    src_step: int,
    dst: np.ndarray,
    dst_step: int,
    y: int,
    hit: np.ndarray,
    spread: np.ndarray,
    integer: bool,
    inplace: bool,
) -> None:
    """Row y of an interleaved ``dst`` = row y of ``src`` zeroed where ``hit`` is set.

    Interleaved images arrive flat: a 1-D contiguous array whose row y starts at ``y * step``,
    so each row is a contiguous slice that LLVM vectorises even inside a crop view. RGB integer
    images (the common case) multiply each pixel's 3 values by 0 or 1, unrolled; other integer
    images spread ``hit`` over the channels first and multiply; anything else (bool) selects.
    Float images arrive as their bits (see ``mask._numba_mask``).
    """
    width = hit.size
    channels = spread.size // width
    target = dst[y * dst_step : y * dst_step + width * channels]
    source = src[y * src_step : y * src_step + width * channels]
    if integer and channels == 3:
        if inplace:
            for x in range(width):
                keep = dst.dtype.type(1 - hit[x])
                target[3 * x] *= keep
                target[3 * x + 1] *= keep
                target[3 * x + 2] *= keep
        else:
            for x in range(width):
                keep = dst.dtype.type(1 - hit[x])
                target[3 * x] = source[3 * x] * keep
                target[3 * x + 1] = source[3 * x + 1] * keep
                target[3 * x + 2] = source[3 * x + 2] * keep
        return
    for c in range(channels):
        lane = spread[c:]
        for x in range(width):
            lane[x * channels] = hit[x]
    if integer:  # branch-free, as in zero_planar_row
        if inplace:
            for i in range(spread.size):
                target[i] *= dst.dtype.type(1 - spread[i])
        else:
            for i in range(spread.size):
                target[i] = source[i] * dst.dtype.type(1 - spread[i])
        return
    zero = dst.dtype.type(0)
    if inplace:
        for i in range(spread.size):
            target[i] = zero if spread[i] else target[i]
    else:
        for i in range(spread.size):
            target[i] = zero if spread[i] else source[i]


@jit
def rgb_to_planar_row(src: np.ndarray, src_step: int, dst: np.ndarray, y: int, hit: np.ndarray) -> None:
    """Row y of a flat interleaved RGB integer image into a planar (3, H, W) one, masked.

    The HWC -> CHW copy and the mask in one pass; LLVM turns the stride-3 reads into shuffles.
    """
    width = hit.size
    source = src[y * src_step : y * src_step + 3 * width]
    red, green, blue = dst[0, y], dst[1, y], dst[2, y]
    for x in range(width):
        keep = dst.dtype.type(1 - hit[x])
        red[x] = source[3 * x] * keep
        green[x] = source[3 * x + 1] * keep
        blue[x] = source[3 * x + 2] * keep


@jit
def mask_planar(
    src: np.ndarray, dst: np.ndarray, inplace: bool, integer: bool, seed: int, bits: int, threshold: int, mask: np.ndarray
) -> None:
    """Draw (or copy ``mask``), dilate and zero a (C, H, W) image, into ``dst`` or in place in ``src``.

    An empty ``mask`` means draw from (seed, bits, threshold): the fused fast path. ``integer``:
    the image holds integers, so zeroing can multiply (see :func:`zero_planar_row`).
    """
    _, height, width = src.shape
    prev, cur, nxt = np.zeros(width + 2, np.uint8), np.zeros(width + 2, np.uint8), np.zeros(width + 2, np.uint8)
    hit = np.empty(width, np.uint8)
    lut = make_lut(bits, threshold)
    fill_row(cur, 0, width, seed, bits, threshold, lut, mask)
    for y in range(height):
        fill_row(nxt, y + 1 if y + 1 < height else -1, width, seed, bits, threshold, lut, mask)
        dilate_row(prev, cur, nxt, hit)
        if inplace:
            zero_planar_row(src, y, hit, integer)
        else:
            copy_planar_row(src, dst, y, hit, integer)
        prev, cur, nxt = cur, nxt, prev


@jit
def mask_interleaved(
    src: np.ndarray,
    src_step: int,
    dst: np.ndarray,
    dst_step: int,
    height: int,
    channels: int,
    integer: bool,
    inplace: bool,
    seed: int,
    bits: int,
    threshold: int,
    mask: np.ndarray,
) -> None:
    """:func:`mask_planar` for flat interleaved images (see :func:`interleaved_row`), e.g. HWC arrays."""
    width = (src.size - (height - 1) * src_step) // channels if height > 0 else 0
    prev, cur, nxt = np.zeros(width + 2, np.uint8), np.zeros(width + 2, np.uint8), np.zeros(width + 2, np.uint8)
    hit = np.empty(width, np.uint8)
    spread = np.empty(width * channels, np.uint8)
    lut = make_lut(bits, threshold)
    fill_row(cur, 0, width, seed, bits, threshold, lut, mask)
    for y in range(height):
        fill_row(nxt, y + 1 if y + 1 < height else -1, width, seed, bits, threshold, lut, mask)
        dilate_row(prev, cur, nxt, hit)
        interleaved_row(src, src_step, dst, dst_step, y, hit, spread, integer, inplace)
        prev, cur, nxt = cur, nxt, prev


@jit
def mask_rgb_to_planar(src: np.ndarray, src_step: int, dst: np.ndarray, seed: int, bits: int, threshold: int, mask: np.ndarray) -> None:
    """:func:`mask_planar` from a flat interleaved RGB integer image into a planar (3, H, W) ``dst``."""
    height, width = dst.shape[1], dst.shape[2]
    prev, cur, nxt = np.zeros(width + 2, np.uint8), np.zeros(width + 2, np.uint8), np.zeros(width + 2, np.uint8)
    hit = np.empty(width, np.uint8)
    lut = make_lut(bits, threshold)
    fill_row(cur, 0, width, seed, bits, threshold, lut, mask)
    for y in range(height):
        fill_row(nxt, y + 1 if y + 1 < height else -1, width, seed, bits, threshold, lut, mask)
        dilate_row(prev, cur, nxt, hit)
        rgb_to_planar_row(src, src_step, dst, y, hit)
        prev, cur, nxt = cur, nxt, prev


@jit
def draw_mask(height: int, width: int, seed: int, bits: int, threshold: int) -> np.ndarray:
    """The undilated draw the fused kernels use, as a (height, width) uint8 array of 0/1."""
    out = np.empty((height, width), np.uint8)
    lut = make_lut(bits, threshold)
    for y in range(height):
        draw_row(out[y], 0, y, width, seed, bits, threshold, lut)
    return out
