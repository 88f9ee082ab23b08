"""Catch the iterators of DataLoaders that someone else iterates (a framework's fit loop, an unmodified script).

Why a patch: Lightning, the Hugging Face Trainer and a user's script each call ``iter(loader)`` inside code we
do not own, and a DataLoader's ``__iter__`` is looked up on its class. For the duration of a ``with`` block,
``DataLoader.__iter__`` is replaced by one that asks ``select(loader)`` for a :class:`~fastpipe.monitor.Watch`
and, when it gets one, hands out that watch's timed iterator. Subclasses that call ``super().__iter__()``
(accelerate's ``DataLoaderShard``, torchdata's loaders) are caught too. The patch is process-wide and restored
on exit, in the order the blocks were entered, so blocks nest.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Iterator

from torch.utils.data import DataLoader

if TYPE_CHECKING:
    from fastpipe.monitor._watch import Watch


Source = Callable[[DataLoader, Callable[[DataLoader], Iterator[Any]]], Iterator[Any]]
"""``source(loader, original_iter)``: the iterator to time, made from the loader with DataLoader's own ``__iter__``."""


@contextlib.contextmanager
def tap_dataloaders(select: "Callable[[DataLoader], Watch | None]", source: Source | None = None) -> Iterator[None]:
    """While inside, every ``iter(loader)`` of a DataLoader for which ``select`` returns a Watch is timed by it.

    ``source`` may hand out another iterator for the loader (``fastpipe watch`` times the stages inside the
    workers with a timed copy of it); by default it is the loader's own.
    """
    original = DataLoader.__iter__

    def __iter__(self: DataLoader) -> Any:
        watch = select(self)
        if watch is None:
            return original(self)
        if source is None:
            return watch.iterate(lambda: original(self))
        return watch.iterate(lambda: source(self, original))

    DataLoader.__iter__ = __iter__  # type: ignore[method-assign]
    try:
        yield
    finally:
        DataLoader.__iter__ = original  # type: ignore[method-assign]
