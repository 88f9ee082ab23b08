"""RandomMask, fast: the article's mask transform with NumPy, Numba and C++ backends.

Same distribution as the article's: each pixel is drawn independently with probability
``ratio``, the draw is dilated with the 4-neighbour cross, and those pixels are zeroed in
every channel. Same interface too: an ``nn.Module`` that masks in place (``inplace=False``
masks a copy).

Randomness apart from work, as in torchvision's transforms v2: the only random choice is a
seed, drawn from NumPy's global RNG; everything after it is deterministic. :func:`draw_mask`
makes the explicit draw for a seed, :func:`apply_mask` is the deterministic kernel that
dilates and zeroes a given draw, and :func:`random_mask` (what the module calls) does both in
one pass. ``random_mask(img, seed=s)`` equals ``apply_mask(img, draw_mask(h, w, seed=s))`` on
every backend, which is how the tests compare each backend bit for bit with the naive scipy
path on the same draw.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any, TypeVar

import numpy as np
import torch

import fastpipe.ops as ops
from fastpipe.errors import ConfigError, OptionalDependencyError
from fastpipe.transforms import _layout, _numpy_kernels, _prng
from fastpipe.transforms._jit import JIT_DISABLED

Image = TypeVar("Image", torch.Tensor, np.ndarray)

BACKENDS = ("numpy", "numba", "cpp")
#: Preference of ``backend="auto"``, fastest first (benchmarks/bench_transforms.py measures it).
AUTO_ORDER = ("cpp", "numba", "numpy")
ARTICLE_MASK_RATIO = 0.25


@functools.lru_cache(maxsize=None)
def backend_available(name: str) -> bool:
    """Whether ``name`` can run here. Numba with ``FASTPIPE_DISABLE_JIT=1`` runs, but as slow Python."""
    if name == "numpy":
        return True
    if name == "numba":
        return importlib.util.find_spec("numba") is not None or JIT_DISABLED
    if name == "cpp":
        return ops.EXTENSION_AVAILABLE
    raise ConfigError(f"unknown RandomMask backend '{name}'; choose auto, {', '.join(BACKENDS)}")


def resolve_backend(name: str) -> str:
    """The concrete backend ``name`` means here; ``auto`` is the fastest available compiled one."""
    if name == "auto":
        for candidate in AUTO_ORDER:
            if candidate == "numba" and JIT_DISABLED:
                continue  # plain-Python kernels are for debugging, never a default
            if backend_available(candidate):
                return candidate
        return "numpy"
    if not backend_available(name):
        if name == "cpp":
            ops.require_extension()
        raise OptionalDependencyError("RandomMask backend 'numba' needs numba: pip install numba (or use backend='numpy')")
    return name


def draw_mask(height: int, width: int, ratio: float = ARTICLE_MASK_RATIO, seed: int | None = None) -> np.ndarray:
    """The undilated draw: a bool (height, width) array, True with probability ``ratio``.

    With ``seed=None`` a seed is drawn from ``np.random``. The same seed gives the draw that
    every backend's :func:`random_mask` uses.
    """
    seed = _prng.draw_seed() if seed is None else _prng.check_seed(seed)
    return _prng.draw_bits_numpy(height, width, ratio, seed)


def _numba() -> Any:
    from fastpipe.transforms import _numba_kernels

    return _numba_kernels


def _is_integer(array: np.ndarray) -> bool:
    return array.dtype.kind in "iu"  # np.issubdtype is ~10x slower, and this runs per sample


def apply_mask(img: Image, mask: np.ndarray | torch.Tensor, backend: str = "auto", inplace: bool = True) -> Image:
    """Dilate ``mask`` (H, W) and zero those pixels of ``img`` in every channel: the deterministic kernel.

    ``inplace=False`` leaves ``img`` alone and returns a compact (C-contiguous) masked copy.
    """
    backend = resolve_backend(backend)
    _layout.check_image(img, inplace)
    mask = mask.numpy() if isinstance(mask, torch.Tensor) else np.asarray(mask)
    height, width = _layout.planar_numpy(img).shape[1:]
    if mask.shape != (height, width):
        raise ConfigError(f"mask shape {mask.shape} does not match the image's (H, W) = ({height}, {width})")
    mask = np.ascontiguousarray(mask, dtype=np.uint8)
    out = img if inplace else _layout.empty_compact(img)
    if backend == "numba":
        _numba_mask(img, out, mask)
        return out
    if not inplace:
        _layout.planar_numpy(out)[...] = _layout.planar_numpy(img)
    if backend == "cpp":
        ops.apply_mask_(_layout.planar_tensor(out), torch.from_numpy(mask))
    else:
        _numpy_kernels.apply_mask_planar(_layout.planar_numpy(out), mask)
    return out


def random_mask(
    img: Image, ratio: float = ARTICLE_MASK_RATIO, seed: int | None = None, backend: str = "auto", inplace: bool = True
) -> Image:
    """Draw, dilate and zero: ``apply_mask(img, draw_mask(H, W, ratio, seed))``, in one pass on numba and cpp.

    ``inplace=False`` leaves ``img`` alone and returns a compact (C-contiguous) masked copy,
    made in the same pass on numba and cpp: masking a crop view out of place costs no more
    than the ``.contiguous()`` it replaces.
    """
    backend = resolve_backend(backend)
    bits, threshold = _prng.quantize_ratio(ratio)
    _layout.check_image(img, inplace)
    seed = _prng.draw_seed() if seed is None else _prng.check_seed(seed)
    out = img if inplace else _layout.empty_compact(img)
    if backend == "cpp":
        if inplace:
            ops.random_mask_(_layout.planar_tensor(img), float(ratio), seed)
        else:
            ops.random_mask_out(_layout.planar_tensor(img), float(ratio), seed, _layout.planar_tensor(out))
    elif backend == "numba":
        _numba_mask(img, out, None, seed, bits, threshold)
    else:
        planar = _layout.planar_numpy(out)
        if not inplace:
            planar[...] = _layout.planar_numpy(img)
        _numpy_kernels.apply_mask_planar(planar, _prng.draw_bits_numpy(planar.shape[1], planar.shape[2], ratio, seed))
    return out


_NO_MASK = np.zeros((0, 0), dtype=np.uint8)


def _numba_mask(img: Any, out: Any, mask: np.ndarray | None, seed: int = 0, bits: int = 1, threshold: int = 0) -> None:
    """Pick the Numba kernel for the layouts of ``img`` and ``out`` (``out is img``: in place) and run it.

    ``mask=None`` draws from (seed, bits, threshold), fused; a mask is dilated and applied.
    """
    kernels = _numba()
    inplace = out is img
    src = _layout.planar_numpy(img)
    dst = src if inplace else _layout.planar_numpy(out)
    if src.dtype.kind == "f":
        # Zero float pixels through their bits (all-zero bits are +0.0, as the select writes):
        # integer kernels multiply by 0 or 1 branch-free, where LLVM compiles a float select into
        # a branch per pixel for some targets (see _numba_kernels.zero_planar_row).
        bits_type = np.dtype(f"u{src.dtype.itemsize}")
        src = src.view(bits_type)
        dst = src if inplace else dst.view(bits_type)
    draws = _NO_MASK if mask is None else mask
    src_flat = _layout.interleaved_flat(src)
    dst_flat = src_flat if inplace else _layout.interleaved_flat(dst)
    integer = _is_integer(src)
    channels, height = src.shape[0], src.shape[1]
    if src_flat is not None and (inplace or dst_flat is not None):
        target = src_flat if inplace else dst_flat
        call = (kernels.mask_interleaved, *src_flat, *target, height, channels, integer, inplace)
    elif src_flat is not None and integer and channels == 3 and dst.strides[2] == dst.itemsize:
        call = (kernels.mask_rgb_to_planar, *src_flat, dst)
    else:
        call = (kernels.mask_planar, src, dst, inplace, integer)
    if JIT_DISABLED:  # plain Python on NumPy uint64 scalars warns on the wrap-around the algorithm relies on
        with np.errstate(over="ignore"):
            call[0](*call[1:], seed, bits, threshold, draws)
    else:
        call[0](*call[1:], seed, bits, threshold, draws)


class RandomMask(torch.nn.Module):
    """Drop-in for the article's RandomMask: same distribution, same in-place contract, 20-40x faster.

    (Measured per 256x256 sample by benchmarks/bench_transforms.py; ``inplace=False`` on a crop
    view also replaces the ``.contiguous()`` copy that would follow.)

    Args:
        ratio: probability that a pixel is drawn before dilation (the article's 0.25).
        backend: ``"auto"`` (fastest available), ``"numba"``, ``"cpp"`` or ``"numpy"``.
        inplace: mask ``img`` itself, as the article does; ``False`` masks and returns a copy.

    Takes a (C, H, W) or (H, W) CPU tensor, or an (H, W, C) or (H, W) NumPy array, of any
    dtype (uint8 is the intended one: mask before converting to float).
    """

    def __init__(self, ratio: float = ARTICLE_MASK_RATIO, backend: str = "auto", inplace: bool = True) -> None:
        super().__init__()
        _prng.quantize_ratio(ratio)  # validates now, not in a worker
        self.ratio = ratio
        self.backend = resolve_backend(backend)
        self.inplace = inplace

    def warm_up(self) -> "RandomMask":
        """Compile the Numba kernels (or load them from Numba's disk cache) now, in this process.

        Call it before a DataLoader starts its workers: forked workers inherit the compiled
        kernels instead of each compiling the same ones at once. Numba compiles one version
        per memory layout, so contiguous, strided and channels-last images are all warmed.
        """
        if self.backend == "numba" and not JIT_DISABLED:
            planar = torch.zeros((3, 4, 6), dtype=torch.uint8)
            interleaved = np.zeros((4, 6, 3), dtype=np.uint8)
            for img in (planar, planar[:, 1:3, 1:4], interleaved, interleaved[1:3, 1:4]):
                for inplace in (True, False):
                    random_mask(img, self.ratio, seed=0, backend="numba", inplace=inplace)
        return self

    def forward(self, img: Image) -> Image:
        return random_mask(img, self.ratio, seed=None, backend=self.backend, inplace=self.inplace)

    def extra_repr(self) -> str:
        return f"ratio={self.ratio}, backend={self.backend!r}, inplace={self.inplace}"
