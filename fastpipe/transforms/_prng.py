"""The random stream every RandomMask backend shares: counter-based SplitMix64.

Word ``i`` of the stream for ``seed`` is ``mix64(seed + (i + 1) * GOLDEN_GAMMA)``, the output
function of SplitMix64 (Steele, Lea and Flood 2014; it passes BigCrush). Being counter-based,
any word can be computed on its own, so NumPy computes the stream vectorised while Numba and
C++ compute it inside their loops, and all three agree bit for bit. That is what lets the
tests compare every backend's fused kernel with the naive scipy path on the same draw.

Drawing bits instead of floats is the speed-up: a Bernoulli(0.25) pixel needs 2 random bits,
not a 64-bit float, so one word serves 32 pixels (see :func:`quantize_ratio`).

Seeds come from NumPy's global RNG (:func:`draw_seed`), exactly where the article's
``np.random.uniform`` draws; the DataLoader seeds that RNG differently in each worker, so
workers get independent streams, as they did with the naive transform.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from fastpipe.errors import ConfigError

GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
#: Seeds are drawn in [0, 2**63) so that they fit torch's int64 op arguments unchanged.
SEED_BOUND = 2**63
_CHUNK_BITS = (1, 2, 4, 8, 16)


def draw_seed() -> int:
    """A fresh seed from NumPy's global RNG (per-worker seeded by the DataLoader)."""
    return int(np.random.randint(0, SEED_BOUND, dtype=np.int64))


def check_seed(seed: int) -> int:
    if not 0 <= int(seed) < SEED_BOUND:
        raise ConfigError(f"seed must be in [0, 2**63), got {seed}; omit it to draw one from np.random")
    return int(seed)


def splitmix_words(seed: int, count: int, start: int = 0) -> np.ndarray:
    """Words ``start .. start+count-1`` of the stream for ``seed``, as a uint64 array (vectorised)."""
    index = np.arange(start + 1, start + count + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):  # wrap-around arithmetic modulo 2**64 is the algorithm
        z = np.uint64(seed) + index * GOLDEN_GAMMA
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@functools.lru_cache(maxsize=64)
def quantize_ratio(ratio: float) -> tuple[int, int]:
    """``(bits, threshold)``: a pixel is masked when its next ``bits``-bit chunk is below ``threshold``.

    The fewest bits that represent ``ratio`` exactly are used (0.25 -> 2 bits, threshold 1:
    32 draws per 64-bit word). Ratios that are not multiples of 1/65536 use 16 bits and are
    rounded to the nearest multiple of 1/65536 (0.1 becomes 0.1000061), a bias far below
    what any augmentation notices.
    """
    ratio = float(ratio)
    if not 0.0 <= ratio <= 1.0:
        raise ConfigError(f"RandomMask ratio must be in [0, 1], got {ratio}")
    for bits in _CHUNK_BITS:
        scaled = ratio * (1 << bits)  # exact: a multiplication by a power of two
        if scaled == int(scaled):
            return bits, int(scaled)
    return 16, int(math.floor(ratio * 65536 + 0.5))


def effective_ratio(ratio: float) -> float:
    """The probability a pixel is drawn with, after :func:`quantize_ratio`."""
    bits, threshold = quantize_ratio(ratio)
    return min(threshold, 1 << bits) / (1 << bits)


def draw_bits_numpy(height: int, width: int, ratio: float, seed: int) -> np.ndarray:
    """The undilated Bernoulli(ratio) draw as a bool (height, width) array, vectorised."""
    bits, threshold = quantize_ratio(ratio)
    per_word = 64 // bits
    count = height * width
    words = splitmix_words(seed, -(-count // per_word))
    shifts = np.arange(per_word, dtype=np.uint64) * np.uint64(bits)
    chunks = (words[:, None] >> shifts[None, :]) & np.uint64((1 << bits) - 1)
    return (chunks.reshape(-1)[:count] < np.uint64(threshold)).reshape(height, width)
