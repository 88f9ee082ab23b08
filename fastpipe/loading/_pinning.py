"""Pinned host memory, real or modelled.

On a CUDA machine a DataLoader with ``pin_memory=True`` copies each batch into page-locked
memory in a background thread, and only such batches can be copied to the device without
blocking the host. Without an accelerator, PyTorch cannot pin at all and silently skips that
thread. To keep the simulated accelerator honest there, :class:`PinningIterator` does what
the DataLoader's pin thread would: in a background thread it copies each batch into the sim
device's modelled pinned memory (a real memcpy, so the host pays what pinning costs).
"""

from __future__ import annotations

import queue
import threading
import warnings
from typing import Any, Callable, Iterable, Iterator

import torch

from fastpipe.devices import Device
from fastpipe.loading._protocols import PinsForDevice

_DONE = object()


def pinning_is_emulated(pin_memory: bool, device: Device) -> bool:
    """True when the loader asks for pinning but only fastpipe can provide it (sim, no accelerator)."""
    return pin_memory and device.kind == "sim" and not torch.cuda.is_available()


class PinningIterator:
    """Pin batches from ``source`` one step ahead in a thread, like the DataLoader's pin thread."""

    def __init__(self, source: Iterable[Any], pin: Callable[[Any], Any], depth: int = 2) -> None:
        self._source = iter(source)
        self._pin = pin
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fastpipe-pin-memory", daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for batch in self._source:
                if not self._put(("ok", self._pin(batch))):
                    return
            self._put(("ok", _DONE))
        except BaseException as exc:  # handed to the consumer, which re-raises it
            self._put(("error", exc))

    def __iter__(self) -> "PinningIterator":
        return self

    def __next__(self) -> Any:
        if self._stop.is_set():
            raise StopIteration
        kind, item = self._queue.get()
        if kind == "error":
            self._stop.set()
            raise item
        if item is _DONE:
            self._stop.set()
            raise StopIteration
        return item

    def stop(self) -> None:
        """Stop the thread and leave the source running (a persistent loader's workers serve the next epoch)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def close(self) -> None:
        """Stop the thread, then the source iterator and its workers."""
        self.stop()
        shutdown_iterator(self._source)


def forget_dead_iterator(loader: Any) -> None:
    """Drop a persistent-workers DataLoader's reference to an iterator whose workers were shut down.

    Such a loader keeps its iterator to reuse the workers; once fastpipe has shut them down, the
    next ``iter(loader)`` (fastpipe's or the user's own) must start fresh ones instead.
    """
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and getattr(iterator, "_shutdown", False):
        loader._iterator = None


def keeps_workers(loader: Any) -> bool:
    """Whether ``loader`` (or the loader it wraps, under ``.loader``) keeps its workers across epochs."""
    while loader is not None:
        if getattr(loader, "persistent_workers", False) and getattr(loader, "num_workers", 0) > 0:
            return True
        loader = getattr(loader, "loader", None)
    return False


def pinned_iter(loader: Any, device: Device) -> Iterator[Any]:
    """``iter(loader)``, with modelled pinning added when the loader wants pinning the machine cannot give.

    A loader that pins its own memory for a device (``fastpipe.loading.recycled``: ring buffers
    registered on CUDA, marked pinned on sim) is asked for its batches through ``iter_for_device``.
    """
    if isinstance(loader, PinsForDevice):
        return loader.iter_for_device(device)
    forget_dead_iterator(loader)
    if not pinning_is_emulated(bool(getattr(loader, "pin_memory", False)), device):
        return iter(loader)
    with warnings.catch_warnings():  # "no accelerator is found": fastpipe pins in its stead
        warnings.filterwarnings("ignore", message=".*pin_memory.*no accelerator.*")
        iterator = iter(loader)
    return PinningIterator(iterator, device.pin)


def stop_iterator(iterator: Any, *, workers: bool) -> None:
    """End fastpipe's use of ``iterator``: its pin thread always, its loader's workers only if ``workers``."""
    if workers:
        shutdown_iterator(iterator)
    elif isinstance(iterator, PinningIterator):
        iterator.stop()


def shutdown_iterator(iterator: Any) -> None:
    """Stop DataLoader workers (and threads) behind ``iterator`` now, not at garbage collection.

    Works on DataLoader iterators and on any iterator with a ``close()`` that does the same.
    """
    shutdown = getattr(iterator, "close", None) or getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
