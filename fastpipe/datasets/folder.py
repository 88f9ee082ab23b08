"""``ImageFolder`` drop-ins: torchvision's folder layout and labels, with only the crop decoded.

Class discovery, file order and labels come from torchvision's own ``find_classes`` and
``make_dataset``, so ``classes``, ``class_to_idx``, ``samples`` and ``targets`` are exactly
``torchvision.datasets.ImageFolder``'s; only how a sample is produced differs:

* :class:`ImageFolder` returns ``(uint8 (3, size, size) tensor, label)``: the
  ``RandomResizedCrop`` + ``RandomHorizontalFlip`` of the usual recipe, decoded crop-only by
  :class:`~fastpipe.datasets.crop.DecodeCrop`. Normalize on the device after the copy
  (:class:`fastpipe.transforms.Normalize`). Its stages are declared (``self.stages``, a
  :class:`fastpipe.stages.Stages`): reading the file is the raw load, then ``DecodeCrop``,
  then the optional transform, so ``fastpipe diagnose`` times each.
* :class:`EncodedImageFolder` returns ``(file bytes as a 1-D uint8 tensor, label)`` for
  machines whose CPU cannot keep up: decode, crop and flip run on the GPU
  (:class:`~fastpipe.datasets.device_decode.DecodeCropOnDevice`).
"""
from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import torch
from torch.utils.data import Dataset
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

from fastpipe.datasets.crop import DEFAULT_RATIO, DEFAULT_SCALE, DecodeCrop, Size, naming_errors
from fastpipe.ops.jpeg import read_bytes
from fastpipe.stages import Stages


class _Folder(Dataset):
    """torchvision's discovery: ``root/<class>/**/<file>`` with its extensions, sorted classes and files."""

    def __init__(
        self,
        root: "str | os.PathLike[str]",
        extensions: tuple[str, ...] | None = IMG_EXTENSIONS,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
    ) -> None:
        self.root = os.fspath(root)
        self.classes, self.class_to_idx = find_classes(self.root)
        # torchvision's rule: extensions and is_valid_file are exclusive.
        self.extensions = None if is_valid_file is not None else extensions
        self.samples: list[tuple[str, int]] = make_dataset(self.root, self.class_to_idx, self.extensions, is_valid_file, allow_empty=allow_empty)
        self.imgs = self.samples
        self.targets = [target for _, target in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(root={self.root!r}, {len(self)} files, {len(self.classes)} classes)"


class ImageFolder(_Folder):
    """torchvision's ``ImageFolder`` + ``RandomResizedCrop(size, scale, ratio)`` + ``RandomHorizontalFlip(hflip)``, uint8 out.

    Replaces::

        torchvision.datasets.ImageFolder(root, transform=Compose([
            RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(), Normalize(mean, std)]))

    with ``fastpipe.datasets.ImageFolder(root, size=224)`` in the workers and
    ``fastpipe.transforms.Normalize(mean, std)`` on the device. Boxes and flips are drawn by
    torchvision's own code from the header's size, with the same torch RNG calls, so the
    distribution (and, for the same seed, every box) is the usual recipe's.

    Args:
        root: the folder of class folders.
        size, scale, ratio: ``RandomResizedCrop``'s arguments.
        hflip: ``RandomHorizontalFlip``'s probability (0 for none).
        transform: optional, applied to the uint8 (3, h, w) tensor after crop and flip.
        target_transform, extensions, is_valid_file, allow_empty: as torchvision's.
    """

    def __init__(
        self,
        root: "str | os.PathLike[str]",
        size: Size = 224,
        scale: Sequence[float] = DEFAULT_SCALE,
        ratio: Sequence[float] = DEFAULT_RATIO,
        hflip: float = 0.5,
        transform: Callable[[torch.Tensor], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        extensions: tuple[str, ...] | None = IMG_EXTENSIONS,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
    ) -> None:
        super().__init__(root, extensions, is_valid_file, allow_empty)
        self.decode = DecodeCrop(size, scale, ratio, hflip)
        self.target_transform = target_transform
        self.transform = transform  # builds self.stages

    @property
    def transform(self) -> Callable[[torch.Tensor], Any] | None:
        """The optional transform after decode-crop; setting it rebuilds :attr:`stages`."""
        return self._transform

    @transform.setter
    def transform(self, transform: Callable[[torch.Tensor], Any] | None) -> None:
        self._transform = transform
        self.stages = Stages(load=self.read, transforms=[self.decode] + ([transform] if transform is not None else []))

    def read(self, index: int) -> torch.Tensor:
        """The raw load: sample ``index``'s file, as a 1-D uint8 tensor of its bytes."""
        return read_bytes(self.samples[index][0])

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        path, target = self.samples[index]
        with naming_errors(path):
            image = self.stages(index)  # looked up on self each time: fastpipe swaps it on a copy to time each stage
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target


class EncodedImageFolder(_Folder):
    """The files' bytes, undecoded: ``(1-D uint8 tensor, label)``, for decoding on the GPU.

    Use it with ``collate_fn=collate_encoded`` (the images differ in size, so they stay a
    list) and :class:`~fastpipe.datasets.device_decode.DecodeCropOnDevice` as the step's
    first device-side transform. The workers only read files, so a few of them feed a GPU
    that decodes thousands of images per second.
    """

    def __init__(
        self,
        root: "str | os.PathLike[str]",
        target_transform: Callable[[int], Any] | None = None,
        extensions: tuple[str, ...] | None = IMG_EXTENSIONS,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
    ) -> None:
        super().__init__(root, extensions, is_valid_file, allow_empty)
        self.target_transform = target_transform

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Any]:
        path, target = self.samples[index]
        data = read_bytes(path)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return data, target
