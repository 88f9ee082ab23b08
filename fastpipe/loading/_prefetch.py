"""DevicePrefetcher: batches arrive on the device already copied (and transformed), ahead of the step.

The host-to-device copy is the last stage of an input pipeline. Done inline, the step waits
for it; done ahead, from pinned memory, on a side stream, it hides behind the previous steps.
torchtnt's ``CudaDataPrefetcher`` does the latter but (1) never calls ``record_stream``, so the
caching allocator may hand a batch's memory back to the copy stream while the step still reads
it, (2) makes a new stream every epoch, (3) refuses any device but CUDA and (4) has no hook for
device-side work. This module closes those gaps:

* ``cuda``: one side stream per prefetcher, created on first use. Each batch is pinned (if the
  loader did not), copied with ``non_blocking=True`` and transformed on that stream, and an event
  is recorded. A batch that is already (partly) on the GPU, written by the loader on the
  consumer's stream, is read only after that stream's work so far: the side stream waits on it,
  and those tensors get ``record_stream(side)``. On hand-over the consumer's current stream waits
  on the event, and every tensor gets ``record_stream(consumer)`` so its memory is not reused
  until the consumer is done.
* ``sim``: the same steps on the modelled copy engine (pinning is modelled where the machine
  cannot pin), so prefetching overlaps with the step exactly as it would on a GPU.
* ``cpu``: nothing to copy; batches pass through (the transform still runs).

A loader with persistent workers keeps them across epochs: an epoch's end stops only the
prefetcher's own pin thread; ``close()`` stops the workers. With a recycled loader
(:func:`fastpipe.loading.recycled`) each host batch's buffer goes back to its worker as soon as its copy
is done: when the copy's event completes on ``cuda``, at the modelled copy's ready time on ``sim``
(on ``cpu`` the step uses the host batch itself, and the loader releases it once unused).

``make_prefetcher(kind="tnt")`` returns torchtnt's prefetcher behind the same interface
(:mod:`fastpipe.loading._tnt`), so the two can be measured side by side.
"""

from __future__ import annotations

import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.profiler import record_function

from fastpipe._tree import iter_tensors, map_tensors
from fastpipe.devices import Device, parse_device
from fastpipe.errors import ConfigError
from fastpipe.loading._pinning import keeps_workers, pinned_iter, shutdown_iterator, stop_iterator
from fastpipe.loading._prefetch_args import PREFETCHERS, DeviceLike, Transform, check_prefetch_args

__all__ = ["DevicePrefetcher", "PrefetchIterator", "make_prefetcher", "PREFETCHERS", "check_prefetch_args"]


@dataclass
class _InFlight:
    """A batch whose copy (and transform) has been issued; ``ready`` is its CUDA event, if any."""

    batch: Any
    ready: "torch.cuda.Event | None" = None


def _pin_host_tensors(device: Device, batch: Any) -> Any:
    """Pin the batch's host tensors the loader left pageable; tensors already on a device are kept."""
    return map_tensors(lambda t: device.pin(t) if t.device.type == "cpu" else t, batch)


class DevicePrefetcher:
    """Iterate ``loader`` with each batch already on ``device``, up to ``depth`` batches copied ahead.

    Args:
        loader: any re-iterable of batches (usually a DataLoader); tensors may be nested in tuples,
            lists, dicts, namedtuples and dataclasses.
        device: a :class:`~fastpipe.devices.Device` or a spec such as ``"cuda"``, ``"cpu"``, ``"sim:290"``.
        depth: batches in flight ahead of the one the step is using (``depth + 1`` live on the device).
        transform: optional ``batch -> batch`` run on the device right after the copy (on the side
            stream on CUDA), e.g. a uint8-to-float conversion, so the host ships 4x fewer bytes.

    Each ``iter()`` starts a new epoch with a fresh loader iterator and closes the previous one.
    """

    def __init__(self, loader: Iterable[Any], device: DeviceLike, depth: int = 2, transform: Transform | None = None) -> None:
        check_prefetch_args(depth, transform)
        self.loader = loader
        self.device = parse_device(device)
        self.depth = depth
        self.transform = transform
        self._stream: "torch.cuda.Stream | None" = None
        self._current: "weakref.ref[PrefetchIterator] | None" = None

    @property
    def stream(self) -> "torch.cuda.Stream | None":
        """The CUDA side stream the copies run on: made on the first epoch and reused by every later one."""
        if self.device.kind == "cuda" and self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device.torch_device)
        return self._stream

    def __len__(self) -> int:
        try:
            return len(self.loader)  # type: ignore[arg-type]
        except TypeError as exc:
            raise TypeError(f"len() of a DevicePrefetcher is its loader's, and this {type(self.loader).__name__} has no len()") from exc

    def __iter__(self) -> "PrefetchIterator":
        previous = self._current() if self._current is not None else None
        if previous is not None:
            previous.end_epoch()  # a DataLoader supports one live epoch; end the old one (and its workers, unless persistent)
        iterator = PrefetchIterator(self)
        self._current = weakref.ref(iterator)
        return iterator


class PrefetchIterator(Iterator[Any]):
    """One epoch of a :class:`DevicePrefetcher`. ``close()`` stops the loader's workers at once, persistent ones too.

    A loader error is raised in order: the batches fetched before it are delivered first.
    """

    def __init__(self, owner: DevicePrefetcher) -> None:
        self._device = owner.device
        self._depth = owner.depth
        self._transform = owner.transform
        self._stream = owner.stream
        self._source = pinned_iter(owner.loader, owner.device)
        self._keeps_workers = keeps_workers(owner.loader)
        # A recycled loader's iterator takes each host batch back once its copy is done.
        self._release: Callable[[Any, Any], bool] | None = getattr(self._source, "release", None)
        self._pending: deque[_InFlight] = deque()
        self._error: Exception | None = None
        self._exhausted = False
        self._shutdown = weakref.finalize(self, stop_iterator, self._source, workers=not self._keeps_workers)

    def _start(self, batch: Any) -> _InFlight:
        """Issue the copy (and transform) of one host batch without waiting for it."""
        device, transform = self._device, self._transform
        with record_function("fastpipe.prefetch.copy"):
            if device.kind == "cpu":
                batch = device.to_device(batch)
                return _InFlight(batch if transform is None else transform(batch))
            host = _pin_host_tensors(device, batch)
            if self._stream is None:  # sim: the modelled copy engine's side stream takes the place of CUDA's
                with device.side_stream():
                    batch = device.to_device(host, non_blocking=True)
                if self._release is not None:
                    self._release(host, device.ready_time(batch))  # type: ignore[attr-defined]
                return _InFlight(batch if transform is None else transform(batch))
            on_gpu = [t for t in iter_tensors(host) if t.is_cuda]
            if on_gpu:  # the loader may have written them on the consumer's stream: read them after that work
                self._stream.wait_stream(torch.cuda.current_stream(device.torch_device))
            with torch.cuda.stream(self._stream):
                for tensor in on_gpu:
                    tensor.record_stream(self._stream)  # their memory is not reused before the side stream has read it
                batch = device.to_device(host, non_blocking=True)
                if self._release is not None:
                    copied = torch.cuda.Event()
                    copied.record(self._stream)
                    self._release(host, copied)
                if transform is not None:
                    batch = transform(batch)
                ready = torch.cuda.Event()
                ready.record(self._stream)
            return _InFlight(batch, ready)

    def _hand_over(self, item: _InFlight) -> Any:
        """Make the consumer's stream wait for the copy and own the batch's memory from now on."""
        if item.ready is None:
            return item.batch
        with record_function("fastpipe.prefetch.hand_over"):
            consumer = torch.cuda.current_stream(self._device.torch_device)
            consumer.wait_event(item.ready)
            for tensor in iter_tensors(item.batch):
                if tensor.is_cuda:
                    tensor.record_stream(consumer)
        return item.batch

    def _fill(self) -> None:
        while not self._exhausted and len(self._pending) < self._depth:
            try:
                batch = next(self._source)
            except StopIteration:
                self._end()
                return
            except Exception as exc:  # re-raised by __next__ after the batches before it
                self._error = exc
                self._end()
                return
            self._pending.append(self._start(batch))

    def _end(self) -> None:
        """The epoch is over: stop the pin thread, and the workers unless the loader keeps them."""
        self._exhausted = True
        self._shutdown()

    def __next__(self) -> Any:
        if not self._pending:
            self._fill()
        if not self._pending:
            error, self._error = self._error, None
            if error is not None:
                raise error
            raise StopIteration
        head = self._pending.popleft()
        self._fill()  # the next copy is issued before the step that uses ``head`` starts
        return self._hand_over(head)

    def __iter__(self) -> "PrefetchIterator":
        return self

    def end_epoch(self) -> None:
        """End the epoch now: drop the batches in flight; a loader's persistent workers stay for the next one."""
        self._pending.clear()
        self._error = None
        self._end()

    def close(self) -> None:
        """End the epoch now: drop the batches in flight and shut down the loader's workers, persistent ones too."""
        self.end_epoch()
        shutdown_iterator(self._source)


def make_prefetcher(
    loader: Iterable[Any], device: DeviceLike, *, depth: int = 2, transform: Transform | None = None, kind: str = "fastpipe"
) -> Any:
    """A re-iterable of on-device batches: fastpipe's :class:`DevicePrefetcher` or, with ``kind="tnt"``,
    torchtnt's ``CudaDataPrefetcher`` behind the same interface (CUDA only; see :mod:`fastpipe.loading._tnt`)."""
    device = parse_device(device)
    if kind == "fastpipe":
        return DevicePrefetcher(loader, device, depth=depth, transform=transform)
    if kind == "tnt":
        from fastpipe.loading._tnt import TntPrefetcher

        return TntPrefetcher(loader, device, depth=depth, transform=transform)
    raise ConfigError(f"unknown prefetcher {kind!r}: use one of {', '.join(repr(k) for k in PREFETCHERS)}")
