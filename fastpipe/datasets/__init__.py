"""Datasets that decode only what training uses: drop-ins for torchvision's ``ImageFolder`` recipe.

* :class:`ImageFolder`: torchvision's classes, order and labels; samples are the usual
  ``RandomResizedCrop`` + ``RandomHorizontalFlip`` as uint8 tensors, decoded crop-only.
  ``on_error="raise" | "pil" | "skip"`` chooses what a damaged file does; skips are counted
  in ``dataset.skipped`` across workers and warned about with :class:`SkippedImageWarning`.
* :class:`DecodeCropLoader`: the same as a ``loader=`` for torchvision's own ``ImageFolder``
  (:class:`DecodeCrop` is the stage itself, on a file's bytes).
* :class:`EncodedImageFolder`, :func:`collate_encoded`, :class:`DecodeCropOnDevice`: the
  workers ship file bytes and the GPU decodes, crops and flips.
* :func:`crop_params`: torchvision's ``RandomResizedCrop.get_params`` from a (height, width).

Normalize after the copy with :class:`fastpipe.transforms.Normalize`. The real-photo corpus
these are benchmarked on comes from :func:`fastpipe.photos.build_corpus`.
"""

from fastpipe.datasets.crop import DecodeCrop, DecodeCropLoader, crop_params, draw_flip
from fastpipe.datasets.device_decode import DecodeCropOnDevice, EncodedBatch, collate_encoded, decode_rgb
from fastpipe.datasets.folder import EncodedImageFolder, ImageFolder, SkipCount, SkippedImageWarning
from fastpipe.datasets.threaded import ThreadLoader

__all__ = [
    "ImageFolder",
    "SkipCount",
    "SkippedImageWarning",
    "ThreadLoader",
    "DecodeCrop",
    "DecodeCropLoader",
    "EncodedImageFolder",
    "EncodedBatch",
    "collate_encoded",
    "DecodeCropOnDevice",
    "decode_rgb",
    "crop_params",
    "draw_flip",
]
