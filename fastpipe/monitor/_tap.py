"""Catch the iterators of DataLoaders that someone else iterates (a framework's fit loop, an unmodified script).

Why a patch: Lightning, the Hugging Face Trainer and a user's script each call ``iter(loader)`` inside code we
do not own, and a DataLoader's ``__iter__`` is looked up on its class. While a tap is open,
``DataLoader.__iter__`` is replaced by one that asks ``select(loader)`` for a :class:`~fastpipe.monitor.Watch`
and, when it gets one, hands out that watch's timed iterator. Subclasses that call ``super().__iter__()``
(accelerate's ``DataLoaderShard``, torchdata's loaders) are caught too.

Taps nest, and may be closed in any order (a framework callback closes its tap from a hook, not a ``with``
block): one dispatcher is installed while any tap is open, and it runs the open taps, the latest first, each
over the ones opened before it (as if each had patched over the one before). Closing a tap removes it from that
list; when the last one closes, DataLoader's own ``__iter__`` is put back, unless someone else patched it
meanwhile (then their patch stays, and our dispatcher, kept inside it, only forwards). So no order of closing
can leave a closed tap's patch installed: a closed tap is never run again.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator

from torch.utils.data import DataLoader

if TYPE_CHECKING:
    from fastpipe.monitor._watch import Watch


Source = Callable[[DataLoader, Callable[[DataLoader], Iterator[Any]]], Iterator[Any]]
"""``source(loader, original_iter)``: the iterator to time, made from the loader with DataLoader's own ``__iter__``."""

Select = Callable[[DataLoader], "Watch | None"]


class _Tap:
    """One open tap: who chooses the watch, and who makes the timed iterator."""

    def __init__(self, select: Select, source: Source | None) -> None:
        self.select, self.source = select, source

    def iterate(self, loader: DataLoader, below: Callable[[DataLoader], Iterator[Any]]) -> Any:
        watch = self.select(loader)
        if watch is None:
            return below(loader)
        if self.source is None:
            return watch.iterate(lambda: below(loader))
        source = self.source
        return watch.iterate(lambda: source(loader, below))


_OPEN: list[_Tap] = []
"""The open taps, in the order they were opened."""
_ORIGINAL: Callable[[DataLoader], Iterator[Any]] | None = None
"""DataLoader's ``__iter__`` as it was when the first open tap was opened."""


def _through(taps: tuple[_Tap, ...], original: Callable[[DataLoader], Iterator[Any]]) -> Callable[[DataLoader], Iterator[Any]]:
    """``iter(loader)`` through ``taps`` (the last one outermost) down to ``original``."""
    if not taps:
        return original
    below = _through(taps[:-1], original)
    return lambda loader: taps[-1].iterate(loader, below)


_TORCH_ITER = DataLoader.__iter__
"""DataLoader's own ``__iter__``, for a dispatch re-entered through another library's patch that kept ours."""
_inside = threading.local()


def _dispatch(self: DataLoader) -> Any:
    entered: set[int] = _inside.__dict__.setdefault("loaders", set())
    if id(self) in entered:  # another patch over a stale dispatcher of ours leads back here: go past both
        return _TORCH_ITER(self)
    original = _ORIGINAL if _ORIGINAL is not None else _dispatch.original  # type: ignore[attr-defined]
    entered.add(id(self))
    try:
        return _through(tuple(_OPEN), original)(self)
    finally:
        entered.discard(id(self))


def open_tap(select: Select, source: Source | None = None) -> _Tap:
    """Open a tap (see :func:`tap_dataloaders`); close it with :func:`close_tap`, in any order."""
    global _ORIGINAL
    tap = _Tap(select, source)
    if not _OPEN:
        current = DataLoader.__iter__
        _ORIGINAL = current
        _dispatch.original = current  # type: ignore[attr-defined]  # for a dispatcher kept inside someone else's patch
        DataLoader.__iter__ = _dispatch  # type: ignore[method-assign]
    _OPEN.append(tap)
    return tap


def close_tap(tap: _Tap) -> None:
    """Close ``tap`` (again is a no-op); the last one to close puts DataLoader's ``__iter__`` back."""
    global _ORIGINAL
    if tap in _OPEN:
        _OPEN.remove(tap)
    if not _OPEN and _ORIGINAL is not None:
        if DataLoader.__iter__ is _dispatch:
            DataLoader.__iter__ = _ORIGINAL  # type: ignore[method-assign]
        _ORIGINAL = None


def open_taps() -> int:
    """How many taps are open now (0: DataLoader's ``__iter__`` is its own again)."""
    return len(_OPEN)


@contextlib.contextmanager
def tap_dataloaders(select: Select, source: Source | None = None) -> Iterator[None]:
    """While inside, every ``iter(loader)`` of a DataLoader for which ``select`` returns a Watch is timed by it.

    ``source`` may hand out another iterator for the loader (``fastpipe watch`` times the stages inside the
    workers with a timed copy of it); by default it is the loader's own.
    """
    tap = open_tap(select, source)
    try:
        yield
    finally:
        close_tap(tap)
