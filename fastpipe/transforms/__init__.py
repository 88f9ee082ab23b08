"""Fast drop-in parts for input pipelines: transforms for the workers, and for the device.

* :class:`RandomMask` (and its functional parts :func:`draw_mask`, :func:`apply_mask`,
  :func:`random_mask`): the article's mask with numba, C++ and NumPy backends.
* :func:`uniform_noise`: uniform uint8 noise fast enough to stand in for a decoder.
* :class:`ToCHWTensor`: an HWC NumPy array to a CHW uint8 tensor, without PIL
  (and :class:`Contiguous`, to compact a crop view).
* :mod:`fastpipe.transforms.device`, for a uint8 batch already on the device:
  :class:`Normalize` (``Normalize.imagenet()``), torchvision's ``ToTensor() + Normalize(mean, std)``
  fused into the uint8 -> float conversion, the one to reach for; and :class:`ConvertColorScale`,
  the article's toy step, which also changes the colour space (RGB -> YCbCr).
* :mod:`fastpipe.transforms.jpeg`: JPEG decoding at reduced DCT scale when the crop allows.
"""

from fastpipe.transforms.convert import Contiguous, ToCHWTensor
from fastpipe.transforms.device import IMAGENET_MEAN, IMAGENET_STD, ConvertColorScale, Normalize
from fastpipe.transforms.mask import BACKENDS, RandomMask, apply_mask, backend_available, draw_mask, random_mask, resolve_backend
from fastpipe.transforms.noise import uniform_noise

# Not sorted: users meet Normalize (keeps RGB) before ConvertColorScale (changes the colour space).
__all__ = [
    "BACKENDS",
    "RandomMask",
    "apply_mask",
    "draw_mask",
    "random_mask",
    "backend_available",
    "resolve_backend",
    "uniform_noise",
    "ToCHWTensor",
    "Contiguous",
    "Normalize",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ConvertColorScale",
]
