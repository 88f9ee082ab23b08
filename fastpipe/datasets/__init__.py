"""Datasets that decode only what training uses: drop-ins for torchvision's ``ImageFolder`` recipe.

* :class:`ImageFolder`: a drop-in for ``torchvision.datasets.ImageFolder`` (a subclass, same
  constructor): ``ImageFolder(root, transform=the_same_transform)``. The crop the transform
  begins with (``RandomResizedCrop``, ``Resize`` + ``CenterCrop``, ...) is decoded crop-only,
  with torchvision's random draws; ``dataset.fast_path`` (:class:`FastPath`, from
  :func:`absorb`) says what was absorbed. ``ImageFolder(root, size=224)`` is the explicit form
  (uint8 tensors out). ``on_error="raise" | "pil" | "skip"`` chooses what a damaged file does;
  skips are counted in ``dataset.skipped`` across workers and warned about with
  :class:`SkippedImageWarning`.
* :class:`DatasetFolder`: the same for torchvision's ``DatasetFolder(root, loader, extensions, ...)``.
* :class:`DecodeResized`: the validation recipe's stage (``Resize`` + ``CenterCrop``, decoded
  at the DCT scale that covers the resized size).
* :class:`DecodeCropLoader`: the explicit form's RandomResizedCrop + flip as a ``loader=`` for torchvision's own ``ImageFolder``
  (:class:`DecodeCrop` is the stage itself, on a file's bytes).
* :class:`EncodedImageFolder`, :func:`collate_encoded`, :class:`DecodeCropOnDevice`: the
  workers ship file bytes and the GPU decodes, crops and flips.
* :func:`crop_params`: torchvision's ``RandomResizedCrop.get_params`` from a (height, width).
* :class:`ThreadLoader`: a DataLoader for such folders without worker processes: threads read the
  files while :func:`fastpipe.ops.decode_jpeg_crop_batch` (the batch op: many JPEGs decoded and
  cropped by native threads, GIL released) writes each whole batch into a reused (pinned) buffer.
* ``fastpipe prepare SRC DST`` (:mod:`fastpipe.datasets.prepare`): a copy of a folder with progressive
  JPEGs rewritten losslessly as baseline (same pixels, faster to decode), everything else linked.

Normalize after the copy with :class:`fastpipe.transforms.Normalize`. The real-photo corpus
these are benchmarked on comes from :func:`fastpipe.photos.build_corpus`.
"""

from fastpipe.datasets.absorb import FastPath, absorb
from fastpipe.datasets.crop import DecodeCrop, DecodeCropLoader, crop_params, draw_flip
from fastpipe.datasets.device_decode import DecodeCropOnDevice, EncodedBatch, collate_encoded, decode_rgb
from fastpipe.datasets.folder import DatasetFolder, EncodedImageFolder, ImageFolder, SkipCount, SkippedImageWarning
from fastpipe.datasets.resized import DecodeResized
from fastpipe.datasets.threaded import ThreadLoader

__all__ = [
    "DatasetFolder",
    "DecodeCrop",
    "DecodeCropLoader",
    "DecodeCropOnDevice",
    "DecodeResized",
    "EncodedBatch",
    "EncodedImageFolder",
    "FastPath",
    "ImageFolder",
    "SkipCount",
    "SkippedImageWarning",
    "ThreadLoader",
    "absorb",
    "collate_encoded",
    "crop_params",
    "decode_rgb",
    "draw_flip",
]
