"""``ImageFolder`` drop-ins: torchvision's folder layout and labels, with only the crop decoded.

Class discovery, file order and labels come from torchvision's own ``find_classes`` and
``make_dataset``, so ``classes``, ``class_to_idx``, ``samples`` and ``targets`` are exactly
``torchvision.datasets.ImageFolder``'s; only how a sample is produced differs:

* :class:`ImageFolder` is torchvision's class (a subclass, same constructor and overrides) whose
  transform's leading crop is decoded crop-only (:mod:`fastpipe.datasets.absorb`), or, in the
  explicit form ``ImageFolder(root, size=224)``, ``RandomResizedCrop`` + ``RandomHorizontalFlip``
  as uint8 tensors. Its stages are declared (``self.stages``, a :class:`fastpipe.stages.Stages`):
  reading the file is the raw load (its bytes on the fast path, ``loader(path)`` otherwise), then
  the decode stage, then the rest of the transform, so ``fastpipe diagnose`` times each.
  A damaged file raises :class:`~fastpipe.errors.CorruptImageError` naming it
  (``on_error="raise"``), is decoded through PIL as torchvision would (``"pil"``), or is
  replaced by the next file that decodes (``"skip"``), counted in :attr:`ImageFolder.skipped`;
  the skip also works inside a diagnosis, where the stages run wrapped in a ``StageError``.
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
import torchvision
from torch.utils.data import Dataset
from torchvision.datasets.folder import IMG_EXTENSIONS, default_loader, find_classes, make_dataset, pil_loader

from fastpipe.datasets.absorb import absorb, explicit
from fastpipe.datasets.crop import BYTES_PLACEHOLDER, DEFAULT_RATIO, DEFAULT_SCALE, Size, check_on_error, crop_settings, naming_errors
from fastpipe.errors import CorruptImageError
from fastpipe.ops.jpeg import read_bytes
from fastpipe.stages import StageError, Stages

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

    def set(self, count: int) -> None:
        """Put the count back to ``count`` (while no worker is decoding): how a diagnosis leaves the user's count as it was."""
        self.reset()
        self._slots[0] = count

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


class DatasetFolder(torchvision.datasets.DatasetFolder):
    """torchvision's ``DatasetFolder``, same contract, with the crop at the start of its transform decoded crop-only.

    What :class:`ImageFolder` is built on (its docstring says what both do); use it directly as
    torchvision's ``DatasetFolder(root, loader, extensions, ...)``. With a loader other than
    torchvision's ``default_loader`` or ``pil_loader``, nothing is absorbed (fastpipe cannot know
    what the loader returns), and it is torchvision's class with declared stages.

    See :class:`ImageFolder` for the rest.
    """

    def __init__(
        self,
        root: "str | os.PathLike[str]",
        loader: Callable[[str], Any],
        extensions: tuple[str, ...] | None = None,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
        *,
        size: Size | None = None,
        scale: Sequence[float] | None = None,
        ratio: Sequence[float] | None = None,
        hflip: float | None = None,
        on_error: str = "raise",
    ) -> None:
        self.on_error = check_on_error(on_error, ON_ERROR)
        self._explicit: tuple[Any, ...] | None = None
        if (size, scale, ratio, hflip) != (None, None, None, None):  # any of them asks for the explicit form
            self._explicit = crop_settings(
                224 if size is None else size,
                DEFAULT_SCALE if scale is None else scale,
                DEFAULT_RATIO if ratio is None else ratio,
                0.5 if hflip is None else hflip,
            )  # checked before the folder is listed
        self.skipped = SkipCount()
        torchvision.datasets.DatasetFolder.__init__(
            self,
            root,
            loader,
            extensions,
            transform=transform,
            target_transform=target_transform,
            is_valid_file=is_valid_file,
            allow_empty=allow_empty,
        )
        self._plan()

    @property
    def transform(self) -> Callable[[Any], Any] | None:
        """The user's transform; setting it (as torchvision allows) absorbs it again and rebuilds :attr:`stages`."""
        return self.__dict__.get("_transform")

    @transform.setter
    def transform(self, transform: Callable[[Any], Any] | None) -> None:
        self._transform = transform
        if "loader" in self.__dict__:  # not while torchvision's __init__ runs: _plan needs the loader
            self._plan()

    def _plan(self) -> None:
        decode_errors = "pil" if self.on_error == "pil" else "raise"
        if self._explicit is not None:
            self.fast_path = explicit(*self._explicit, transform=self._transform, on_error=decode_errors)
        else:
            default = self.loader in (default_loader, pil_loader)
            self.fast_path = absorb(self._transform, loader_is_default=default, on_error=decode_errors)
        if self.fast_path.active:
            self.stages = Stages(load=self.read, transforms=[self.fast_path.decode, *self.fast_path.rest])
        else:
            self.stages = Stages(load=self.load, transforms=[] if self._transform is None else [self._transform])

    @property
    def decode(self) -> Any:
        """The decode stage (``DecodeCrop`` or ``DecodeResized``, with its ``size``...), or None when nothing was absorbed."""
        return self.fast_path.decode

    def read(self, index: int) -> torch.Tensor:
        """The raw load of the fast path: sample ``index``'s file, as a 1-D uint8 tensor of its bytes."""
        return read_bytes(self.samples[index][0])

    def load(self, index: int) -> Any:
        """The raw load when nothing is absorbed: ``self.loader(path)``, as torchvision's ``__getitem__`` does.

        Under ``on_error="skip"``, what PIL cannot open becomes a CorruptImageError naming the file, to be skipped.
        """
        path = self.samples[index][0]
        if self.on_error != "skip":
            return self.loader(path)
        try:
            return self.loader(path)
        except (OSError, SyntaxError, ValueError) as exc:  # what PIL raises for a damaged or unknown file
            raise CorruptImageError(f"{path}: cannot decode the image ({type(exc).__name__}: {exc})") from exc

    def extra_repr(self) -> str:
        return f"Fast path: {self.fast_path}"

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        path, target = self.samples[index]
        try:
            with naming_errors(path):
                image = self.stages(index)  # looked up on self each time: fastpipe swaps it on a copy to time each stage
        except StageError as exc:  # a diagnosis runs the stages wrapped: name the file there too
            corrupt = corrupt_cause(exc)
            if corrupt is None:
                raise
            if self.on_error != "skip":
                raise StageError(str(exc).replace(BYTES_PLACEHOLDER, path, 1)) from exc
            image, target = self._replacement(index, named(corrupt, path))
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
            except (CorruptImageError, StageError) as next_exc:
                corrupt = corrupt_cause(next_exc)
                if corrupt is None:
                    raise
                exc = named(corrupt, path)
        raise CorruptImageError(f"{self.root}: none of the {n} files could be decoded (on_error='skip'); the last: {exc}")


class ImageFolder(DatasetFolder, torchvision.datasets.ImageFolder):
    """torchvision's ``ImageFolder``, same contract, with the crop at the start of its transform decoded crop-only.

    A drop-in: ``fastpipe.datasets.ImageFolder(root, transform=the_same_transform)`` takes the
    constructor, attributes and overrides of ``torchvision.datasets.ImageFolder`` (it is a
    subclass: ``find_classes``, ``make_dataset``, ``loader``, ``is_valid_file``,
    ``allow_empty``, ``classes``, ``samples``, ``targets``, ``imgs``, ``transforms``), and
    returns what torchvision's class returns: a PIL image with no transform. When the transform
    begins with ``RandomResizedCrop``, ``Resize`` + ``CenterCrop``, ``CenterCrop`` or ``Resize``
    (optionally + ``RandomHorizontalFlip``), that prefix is decoded by the JPEG op with
    torchvision's own random draws, and the rest runs on the decoded tensor when it begins with
    ``ToTensor``/``PILToTensor``/``ToImage``, else on a PIL image of the crop
    (:mod:`fastpipe.datasets.absorb`). :attr:`fast_path` (and the repr) says which prefix was
    absorbed and why the rest was not.

    The explicit fast form, ``ImageFolder(root, size=224, scale=..., ratio=..., hflip=0.5)``
    (keywords), decodes ``RandomResizedCrop(size, scale, ratio)`` + ``RandomHorizontalFlip(hflip)``
    and returns uint8 (3, h, w) tensors; ``transform`` then runs on that tensor. Normalize on the
    device after the copy (:class:`fastpipe.transforms.Normalize`).

    Args:
        root, transform, target_transform, loader, is_valid_file, allow_empty: torchvision's.
        size, scale, ratio, hflip: the explicit fast form (any of them given turns it on; their
            defaults are then 224, torchvision's scale and ratio, and 0.5).
        extensions: the extensions kept when ``is_valid_file`` is None (torchvision's image ones).
        on_error: what a file that cannot be decoded does (a
            :class:`~fastpipe.errors.CorruptImageError`, including a file over the pixel limit):
            ``"raise"`` (the default) raises it, naming the file; ``"pil"`` decodes through PIL
            what the op refused, as torchvision's ``ImageFolder`` would (the op treats libjpeg's
            warnings about damaged data as errors; PIL decodes through them), and raises what
            PIL cannot decode; ``"skip"`` returns the next sample that decodes instead (index + 1,
            wrapping around, so the same files give the same replacements), counts it in
            :attr:`skipped` and warns with :class:`SkippedImageWarning` naming the file.

    Attributes:
        fast_path: a :class:`~fastpipe.datasets.absorb.FastPath`; rebuilt when ``transform`` is set.
        skipped: a :class:`SkipCount`: samples replaced under ``on_error="skip"``, summed over
            the DataLoader's workers; ``skipped.reset()`` at each epoch's end gives the epoch's.
        stages: the declared :class:`fastpipe.stages.Stages` (the raw load, the decode, the rest),
            so ``fastpipe diagnose`` caches and times each.
    """

    def __init__(
        self,
        root: "str | os.PathLike[str]",
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        loader: Callable[[str], Any] = default_loader,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
        *,
        size: Size | None = None,
        scale: Sequence[float] | None = None,
        ratio: Sequence[float] | None = None,
        hflip: float | None = None,
        extensions: tuple[str, ...] | None = IMG_EXTENSIONS,
        on_error: str = "raise",
    ) -> None:
        super().__init__(
            root,
            loader,
            extensions if is_valid_file is None else None,  # torchvision's rule: they are exclusive
            transform,
            target_transform,
            is_valid_file,
            allow_empty,
            size=size,
            scale=scale,
            ratio=ratio,
            hflip=hflip,
            on_error=on_error,
        )
        self.imgs = self.samples


def named(exc: CorruptImageError, path: str) -> CorruptImageError:
    """``exc`` with the file's path in place of the op's placeholder for unnamed bytes (itself when it names the file)."""
    message = str(exc)
    return type(exc)(message.replace(BYTES_PLACEHOLDER, path, 1)) if BYTES_PLACEHOLDER in message else exc


def corrupt_cause(exc: BaseException) -> CorruptImageError | None:
    """The CorruptImageError behind ``exc`` (itself, or the one a diagnosis wrapped in a StageError), named by file."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, CorruptImageError):
            return seen
        seen = seen.__cause__
    return None


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
