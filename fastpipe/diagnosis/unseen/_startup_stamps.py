"""The stamps a worker writes at its start, for :mod:`._startup`: a dataset wrapper, ``worker_init_fn`` and collate.

Every time is ``time.monotonic()``, one clock for all processes of the machine. Under spawn and forkserver the
wrapper is pickled as ``(marker, dataset, marker)``: each marker unpickles as the time it was unpickled at, so the
two stamp the dataset's own unpickling inside the worker. The first collate in a worker writes the worker's stamps
to ``<folder>/<worker id>.json`` (the folder is set on the wrapper before each epoch's start). The user's dataset,
``worker_init_fn`` and ``collate_fn`` run as they are; attributes a ``worker_init_fn`` reads or sets on
``get_worker_info().dataset`` go to the user's dataset. A stream is read to at most ``limit`` items a worker and
epoch, so that the pass's epochs end as a run's do (a map-style dataset's are ended by the loader's short sampler).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from typing import Any, Callable, Iterator

from torch.utils.data import Dataset, IterableDataset, get_worker_info

_OWN = ("_dataset", "_folder", "_limit", "_unpickled", "_init", "_fetch", "_written")


class _Now:
    """Unpickles as the time it is unpickled at."""

    def __reduce__(self) -> tuple[Callable[[], float], tuple[()]]:
        return time.monotonic, ()


def _rebuild(cls: type, start: float, dataset: Any, end: float, folder: str | None, limit: int | None) -> Any:
    wrapper = cls(dataset, limit)
    wrapper.__dict__.update(_folder=folder, _unpickled=(start, end))
    return wrapper


class _Stamped:
    def __init__(self, dataset: Any, limit: int | None = None) -> None:
        self.__dict__.update(_dataset=dataset, _folder=None, _limit=limit, _unpickled=None, _init=None, _fetch=None, _written=False)

    def __reduce__(self) -> Any:
        return _rebuild, (type(self), _Now(), self._dataset, _Now(), self._folder, self._limit)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in _OWN:
            raise AttributeError(name)
        return getattr(self._dataset, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._dataset, name, value)

    def _fetching(self) -> None:
        if self._fetch is None:
            self.__dict__["_fetch"] = [time.monotonic(), None]

    def _write(self) -> None:
        info = get_worker_info()
        if info is None or self._written or self._folder is None or self._fetch is None:
            return
        self._fetch[1] = time.monotonic()
        self.__dict__["_written"] = True
        stamps = {"worker": info.id, "pid": os.getpid(), "unpickled": self._unpickled, "init": self._init, "fetch": self._fetch}
        path = os.path.join(self._folder, f"{info.id}.json")
        with open(path + ".part", "w") as f:
            json.dump(stamps, f)
        os.replace(path + ".part", path)


class StampedDataset(_Stamped, Dataset):
    def __len__(self) -> int:
        return len(self._dataset)

    def __getitem__(self, index: Any) -> Any:
        self._fetching()
        return self._dataset[index]

    def __getitems__(self, indices: list[Any]) -> Any:
        self._fetching()
        many = getattr(self._dataset, "__getitems__", None)
        return many(indices) if many is not None else [self._dataset[i] for i in indices]


class StampedIterable(_Stamped, IterableDataset):
    def __iter__(self) -> Iterator[Any]:
        source = iter(self._dataset)
        self._fetching()
        yield from source if self._limit is None else itertools.islice(source, self._limit)


class StampedInit:
    """The user's ``worker_init_fn`` (or none), timed."""

    def __init__(self, init_fn: Callable[[int], Any] | None) -> None:
        self.init_fn = init_fn

    def __call__(self, worker_id: int) -> None:
        wrapper = get_worker_info().dataset
        start = time.monotonic()
        if self.init_fn is not None:
            self.init_fn(worker_id)
        wrapper.__dict__["_init"] = (start, time.monotonic())


class StampedCollate:
    """The user's ``collate_fn``; its first call in a worker writes the worker's stamps."""

    def __init__(self, collate_fn: Callable[[Any], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, batch: Any) -> Any:
        out = self.collate_fn(batch)
        info = get_worker_info()
        if info is not None:
            info.dataset._write()
        return out


def stamped(
    dataset: Any, init_fn: Callable[[int], Any] | None, collate_fn: Callable[[Any], Any], *, limit: int | None = None
) -> tuple[Any, StampedInit, StampedCollate]:
    """(wrapped dataset, worker_init_fn, collate_fn) that stamp a worker's start (module docstring); a stream stops after
    ``limit`` items a worker."""
    wrapper = StampedIterable(dataset, limit) if isinstance(dataset, IterableDataset) else StampedDataset(dataset)
    return wrapper, StampedInit(init_fn), StampedCollate(collate_fn)
