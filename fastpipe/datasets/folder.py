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
  A damaged file raises :class:`~fastpipe.errors.CorruptImageError` naming it
  (``on_error="raise"``), is decoded through PIL as torchvision would (``"pil"``), or is
  replaced by the next file that decodes (``"skip"``), counted in :attr:`ImageFolder.skipped`.
* :class:`EncodedImageFolder` returns ``(file bytes as a 1-D uint8 tensor, label)`` for
  machines whose CPU cannot keep up: decode, crop and flip run on the GPU
  (:class:`~fastpipe.datasets.device_decode.DecodeCropOnDevice`).
"""

from __future__ import annotations

import multiprocessing
import os
import warnings
from multiprocessing.context import get_spawning_popen
from typing import Any, Callable, Sequence

import torch
from torch.utils.data import Dataset
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

from fastpipe.datasets.crop import DEFAULT_RATIO, DEFAULT_SCALE, DecodeCrop, Size, check_on_error, naming_errors
from fastpipe.errors import CorruptImageError
from fastpipe.ops.jpeg import read_bytes
from fastpipe.stages import Stages

ON_ERROR = ("raise", "pil", "skip")


class SkippedImageWarning(UserWarning):
    """An :class:`ImageFolder` with ``on_error="skip"`` replaced a file it could not decode; the message names it."""


class SkipCount:
    """How many samples an :class:`ImageFolder` with ``on_error="skip"`` replaced, summed over all its DataLoader workers.

    The count lives in shared memory, one slot per process (the main one, and each DataLoader
    worker by its id), so no lock is needed: workers started with ``fork`` inherit it, and
    workers started with ``spawn`` or ``forkserver`` receive it with the dataset, so the main
    process reads every worker's skips in :attr:`count`. For a figure per epoch, take
    :meth:`reset` between epochs (while no worker is decoding). Any other copy of the dataset
    (``copy.deepcopy``, ``pickle.dumps``) gets a counter of its own, starting from this one's count.
    Two loaders iterating the same dataset at once share worker slots and may lose a count.
    """

    SLOTS = 1024  # the main process, then workers by id (modulo)

    def __init__(self, start: int = 0) -> None:
        self._slots = multiprocessing.RawArray("q", self.SLOTS)
        self._slots[0] = start

    def add(self) -> None:
        """Count one skip, in this process's slot."""
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        self._slots[0 if info is None else 1 + info.id % (self.SLOTS - 1)] += 1

    @property
    def count(self) -> int:
        """Skips since construction or the last :meth:`reset`, in every process."""
        return int(sum(self._slots))

    def reset(self) -> int:
        """Set the count to 0; returns the count it had (e.g. the epoch's skips)."""
        count = self.count
        memoryview(self._slots).cast("B")[:] = bytes(8 * self.SLOTS)
        return count

    def __getstate__(self) -> dict[str, Any]:
        if get_spawning_popen() is not None:  # a worker process being started: share the same memory
            return {"slots": self._slots}
        return {"start": self.count}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "slots" in state:
            self._slots = state["slots"]
        else:
            self.__init__(state["start"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"SkipCount({self.count})"


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
        self.samples: list[tuple[str, int]] = make_dataset(
            self.root, self.class_to_idx, self.extensions, is_valid_file, allow_empty=allow_empty
        )
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
        on_error: what a file that cannot be decoded does (a
            :class:`~fastpipe.errors.CorruptImageError`, including a file over the pixel limit):
            ``"raise"`` (the default) raises it, naming the file; ``"pil"`` decodes through PIL
            what the op refused, as torchvision's ``ImageFolder`` would (the op treats libjpeg's
            warnings about damaged data as errors; PIL decodes through them), and raises what
            PIL cannot decode; ``"skip"`` returns the next sample that decodes instead (index + 1,
            wrapping around, so the same files give the same replacements), counts it in
            :attr:`skipped` and warns with :class:`SkippedImageWarning` naming the file.

    Attributes:
        skipped: a :class:`SkipCount`: samples replaced under ``on_error="skip"``, summed over
            the DataLoader's workers; ``skipped.reset()`` at each epoch's end gives the epoch's.
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
        on_error: str = "raise",
    ) -> None:
        self.on_error = check_on_error(on_error, ON_ERROR)
        super().__init__(root, extensions, is_valid_file, allow_empty)
        self.decode = DecodeCrop(size, scale, ratio, hflip, on_error="pil" if on_error == "pil" else "raise")
        self.skipped = SkipCount()
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
        try:
            with naming_errors(path):
                image = self.stages(index)  # looked up on self each time: fastpipe swaps it on a copy to time each stage
        except CorruptImageError as exc:
            if self.on_error != "skip":
                raise
            image, target = self._replacement(index, exc)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target

    def _replacement(self, index: int, exc: CorruptImageError) -> tuple[Any, int]:
        """``on_error="skip"``: the image and label of the first file after ``index`` that decodes."""
        n = len(self.samples)
        for step in range(1, n + 1):
            self.skipped.add()
            warnings.warn(f"{exc}; skipped, replaced by the next file that decodes", SkippedImageWarning, stacklevel=3)
            if step == n:
                break
            path, target = self.samples[(index + step) % n]
            try:
                with naming_errors(path):
                    return self.stages((index + step) % n), target
            except CorruptImageError as next_exc:
                exc = next_exc
        raise CorruptImageError(f"{self.root}: none of the {n} files could be decoded (on_error='skip'); the last: {exc}")


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
