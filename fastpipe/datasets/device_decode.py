"""Decode, crop and flip on the GPU: for machines whose CPU cannot decode as fast as the GPU trains.

The workers ship each file's bytes (:class:`~fastpipe.datasets.folder.EncodedImageFolder`),
a few tens of kB per image instead of 150 kB of uint8 pixels, and :func:`collate_encoded`
keeps them as a list, since the images differ in size. After the loader,
:class:`DecodeCropOnDevice` decodes the whole list in one ``torchvision.io.decode_jpeg(list,
device="cuda")`` call (nvjpeg, batched), then draws each crop with torchvision's own
``RandomResizedCrop.get_params`` and resizes and flips it there. The same code runs with
``device="cpu"`` (libjpeg-turbo through torchvision), which is how it is tested without a GPU.

The bytes stay in host memory on purpose: nvjpeg reads them from there, so
:class:`EncodedBatch` is a container that ``.to(device)`` helpers (fastpipe's prefetcher,
``pin_memory``) pass through untouched, while the labels beside it are copied as usual.
"""

from __future__ import annotations

import warnings
from typing import Any, Iterator, Sequence

import torch
from torch.utils.data import default_collate
from torchvision.transforms.v2 import functional as F

from fastpipe.datasets.crop import DEFAULT_RATIO, DEFAULT_SCALE, Size, crop_params, crop_settings, draw_flip
from fastpipe.errors import ConfigError
from fastpipe.ops import jpeg as jpeg_ops
from fastpipe.ops.jpeg import CorruptImageError


class EncodedBatch:
    """Encoded image files, one 1-D uint8 tensor each, kept on the host whatever copies the batch.

    Not a list or a dataclass on purpose: batch-copying helpers recurse into those and would
    move the bytes to the GPU, where ``decode_jpeg`` cannot read them.
    """

    def __init__(self, data: Sequence[torch.Tensor]) -> None:
        self.data = list(data)

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self.data)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() for t in self.data)

    def __repr__(self) -> str:
        return f"EncodedBatch({len(self)} files, {self.nbytes} bytes)"


def collate_encoded(samples: Sequence[tuple[torch.Tensor, Any]]) -> tuple[EncodedBatch, Any]:
    """``collate_fn`` for :class:`EncodedImageFolder`: the bytes as an :class:`EncodedBatch`, the labels stacked."""
    if not samples:
        raise ConfigError("collate_encoded got an empty batch")
    data, targets = zip(*samples)
    return EncodedBatch(data), default_collate(list(targets))


def _decode_one(data: torch.Tensor, device: torch.device, index: int) -> torch.Tensor:
    """One file on ``device``, else on the CPU then copied (nvjpeg lacks CMYK/YCCK, for instance)."""
    from torchvision.io import ImageReadMode, decode_image, decode_jpeg

    if device.type != "cpu" and jpeg_ops.is_jpeg(data):
        try:
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
        except RuntimeError:
            pass  # decoded on the CPU below, as DALI does for what nvjpeg cannot
    try:
        return decode_image(data, mode=ImageReadMode.RGB).to(device)
    except RuntimeError as exc:
        raise CorruptImageError(f"file #{index} of the batch ({data.numel()} bytes) cannot be decoded: {exc}") from exc


def check_sizes(files: Sequence[torch.Tensor]) -> None:
    """Read each file's size from its header and refuse one over the pixel limit, before any decoder allocates it.

    Raises:
        DecompressionBombError: a file's header claims more than
            :func:`fastpipe.ops.jpeg.max_image_pixels` pixels; the message says which file of the batch.
        CorruptImageError: a file's size cannot be read at all.
    """
    for i, data in enumerate(files):
        try:
            jpeg_ops.jpeg_size(data)
        except CorruptImageError as exc:
            name = f"file #{i} of the batch ({data.numel()} bytes)"
            raise type(exc)(str(exc).replace(jpeg_ops.UNNAMED_SOURCE, name, 1)) from exc


def decode_rgb(files: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Decode every file to uint8 (3, H, W) RGB on ``device``.

    Every file's header is checked against the pixel limit first (:func:`check_sizes`).

    JPEGs go in one batched ``decode_jpeg`` call (nvjpeg on CUDA); if that call fails (a file
    the GPU decoder does not support, or a corrupt one), each file is retried alone, falling
    back to the CPU, so one odd file costs a little time instead of the batch. Other formats
    (PNG, WebP...) are decoded on the CPU.
    """
    from torchvision.io import ImageReadMode, decode_jpeg

    files = [data.cpu() for data in files]
    check_sizes(files)
    images: list[torch.Tensor | None] = [None] * len(files)
    jpegs = [i for i, data in enumerate(files) if jpeg_ops.is_jpeg(data)]
    with warnings.catch_warnings():  # torchvision 0.29 deprecates its image codecs in favour of TorchCodec
        warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities", category=DeprecationWarning)
        if jpegs:
            try:
                for i, image in zip(jpegs, decode_jpeg([files[i] for i in jpegs], mode=ImageReadMode.RGB, device=device)):
                    images[i] = image
            except RuntimeError:
                pass  # retried one by one below
        for i, data in enumerate(files):
            if images[i] is None:
                images[i] = _decode_one(data, device, i)
    return images  # type: ignore[return-value]


class DecodeCropOnDevice:
    """``RandomResizedCrop(size, scale, ratio)`` + ``RandomHorizontalFlip(hflip)`` on a batch of encoded files, on the device.

    Call it on ``(EncodedBatch, labels)`` (what a loader with :func:`collate_encoded` yields,
    after the labels were moved to the device) or on an ``EncodedBatch`` alone; returns
    ``(uint8 (N, 3, h, w) images, labels)`` on the device, followed by ``normalize`` if given::

        loader = DataLoader(EncodedImageFolder(root), batch_size=256, num_workers=4, collate_fn=collate_encoded)
        decode = DecodeCropOnDevice(224, normalize=Normalize.imagenet())
        for batch in loader:
            images, labels = decode((batch[0], batch[1].cuda(non_blocking=True)))

    Args:
        size, scale, ratio, hflip: as torchvision's RandomResizedCrop and RandomHorizontalFlip.
        device: where to decode; by default the device of the labels (so fastpipe's
            prefetcher decides), or the CPU when there are none.
        normalize: e.g. :class:`fastpipe.transforms.Normalize`, applied to the uint8 batch.

    Boxes and flips are drawn from the global torch RNG of the process that runs it, in the
    usual recipe's order (box, then flip, image by image). A file whose header claims more
    pixels than :func:`fastpipe.ops.jpeg.max_image_pixels` raises
    :class:`~fastpipe.errors.DecompressionBombError` before any file of the batch is decoded.
    """

    def __init__(
        self,
        size: Size = 224,
        scale: Sequence[float] = DEFAULT_SCALE,
        ratio: Sequence[float] = DEFAULT_RATIO,
        hflip: float = 0.5,
        device: "str | torch.device | None" = None,
        normalize: Any = None,
    ) -> None:
        self.size, self.scale, self.ratio, self.hflip = crop_settings(size, scale, ratio, hflip)
        self.device = None if device is None else torch.device(device)
        self.normalize = normalize

    def _device_for(self, rest: Sequence[Any]) -> torch.device:
        if self.device is not None:
            return self.device
        tensors = [item for item in rest if isinstance(item, torch.Tensor)]
        return tensors[0].device if tensors else torch.device("cpu")

    def images(self, files: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
        """Decode ``files`` on ``device`` and return the random crops as uint8 (N, 3, h, w)."""
        out = []
        for image in decode_rgb(files, device):
            top, left, height, width = crop_params(image.shape[-2], image.shape[-1], self.scale, self.ratio)
            crop = F.resized_crop(image, top, left, height, width, list(self.size), antialias=True)
            out.append(crop.flip(-1) if draw_flip(self.hflip) else crop)
        images = torch.stack(out)
        return images if self.normalize is None else self.normalize(images)

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, EncodedBatch):
            return self.images(batch.data, self._device_for(()))
        if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], EncodedBatch):
            rest = list(batch[1:])
            return type(batch)([self.images(batch[0].data, self._device_for(rest)), *rest])
        raise ConfigError(
            f"DecodeCropOnDevice takes an EncodedBatch or an (EncodedBatch, labels) tuple, got {type(batch).__name__}; "
            "build the DataLoader with EncodedImageFolder and collate_fn=collate_encoded"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, scale={self.scale}, ratio={self.ratio}, hflip={self.hflip}, device={self.device})"
