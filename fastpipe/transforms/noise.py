"""Uniform uint8 noise, fast: the toy dataset's stand-in for reading and decoding an image.

The article makes its raw image with ``np.random.randint(0, 256, size=(1024, 1024, 3))``,
which spends ~2-5 ms turning 64-bit draws into bounded integers one at a time. Every byte of
a SplitMix64 output word is already uniform on 0..255, so filling the buffer with whole
words gives the same distribution (independent uniform bytes) in ~0.2 ms: the Numba loop is
counter-based, so LLVM vectorises it. Seeds come from ``np.random`` as the article's draws do,
so DataLoader workers still get independent streams.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from fastpipe.errors import ConfigError
from fastpipe.transforms import _prng
from fastpipe.transforms._jit import JIT_DISABLED


def uniform_noise(shape: Sequence[int], seed: int | None = None, backend: str = "auto") -> np.ndarray:
    """A C-contiguous uint8 array of ``shape``, each byte independent and uniform on 0..255.

    Args:
        shape: e.g. ``(1024, 1024, 3)`` for an HWC image.
        seed: a seed in [0, 2**63); ``None`` draws one from ``np.random``.
        backend: ``"numba"``, ``"numpy"`` (vectorised, ~10x slower) or ``"auto"`` (numba
            unless JIT is disabled). Both give the same bytes for the same seed.
    """
    if backend == "auto":
        backend = "numpy" if JIT_DISABLED else "numba"
    if backend not in ("numba", "numpy"):
        raise ConfigError(f"uniform_noise backend must be auto, numba or numpy, got '{backend}'")
    shape = tuple(int(n) for n in shape)
    if any(n < 0 for n in shape):
        raise ConfigError(f"uniform_noise needs a shape of non-negative sizes, got {shape}")
    seed = _prng.draw_seed() if seed is None else _prng.check_seed(seed)
    count = math.prod(shape)
    words = -(-count // 8)
    if backend == "numba":
        from fastpipe.transforms._numba_kernels import fill_uniform

        buffer = np.empty(words, dtype=np.uint64)
        fill_uniform(buffer, seed)
    else:
        buffer = _prng.splitmix_words(seed, words)
    return buffer.view(np.uint8)[:count].reshape(shape)
