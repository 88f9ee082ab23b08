"""One epoch of a :class:`~fastpipe.datasets.ThreadLoader`: a reading thread, a decoding thread, and the loop's ``next()``.

The reading thread reads batch k+1's files, their headers' sizes, and draws their boxes and flips
while the decoding thread's native threads decode batch k into a ring buffer (the GIL is released
for the whole batch), so reads overlap decoding. Both queues are bounded (``prefetch`` batches),
so at most ``prefetch`` batches are read ahead and ``prefetch`` decoded ahead of the loop.
An error (a file that cannot be read, or decoded under ``on_error="raise"``) is delivered in
order: the batches before it first. ``close()`` (or dropping the iterator) stops both threads.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.utils.data._utils.collate import default_collate

from fastpipe.datasets._draws import draw_boxes, draw_flips
from fastpipe.datasets._thread_ring import BufferRing
from fastpipe.errors import CorruptImageError
from fastpipe.ops import jpeg as jpeg_ops
from fastpipe.ops.jpeg_batch import decode_jpeg_crop_batch

_END = object()
_POLL_S = 0.1  # how often a blocked thread looks at the stop flag


class SkippedImageWarning(UserWarning):
    """A :class:`~fastpipe.datasets.ThreadLoader` with ``on_error="skip"`` replaced a file it could not decode; the message names it."""


@dataclass
class _Read:
    """A batch as the reading thread hands it to the decoding thread."""

    indices: list[int]
    data: list[torch.Tensor]
    boxes: np.ndarray
    flips: np.ndarray
    labels: list[int]
    header_errors: dict[int, CorruptImageError]


@dataclass
class Plan:
    """What an epoch needs from its loader (a plain record, so the threads hold no reference to the loader)."""

    samples: list[tuple[str, int]] | None  # None: the generic path, dataset[i] and default_collate
    dataset: Any
    size: tuple[int, int]
    scale: tuple[float, float]
    ratio: tuple[float, float]
    hflip: float
    threads: int
    prefetch: int
    on_error: str
    ring: BufferRing | None
    counters: dict[str, float]
    fence: Callable[[], Any]
    mark: Callable[[torch.Tensor], Any] | None


def _put(q: "queue.Queue[Any]", item: Any, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            continue
    return False


class ThreadEpoch(Iterator[Any]):
    """Batches of one epoch: ``[images uint8 (N, 3, H, W), labels int64 (N,)]`` views into ring buffers.

    The threads hold only the :class:`_Workers` state, never this iterator, so dropping it stops them.
    """

    def __init__(self, plan: Plan, batches: Iterator[list[int]], seed: int) -> None:
        self._plan = plan
        self._workers = _Workers(plan, seed)
        self._workers.start(batches, np.random.default_rng(seed))
        self._finalizer = weakref.finalize(self, self._workers.stop.set)

    def __iter__(self) -> "ThreadEpoch":
        return self

    def __next__(self) -> Any:
        plan = self._plan
        if plan.ring is not None:
            plan.ring.poll(plan.fence)
        started = time.perf_counter()
        item = self._workers.done.get()
        plan.counters["wait_s"] += time.perf_counter() - started
        if item is _END:
            with contextlib.suppress(queue.Full):
                self._workers.done.put_nowait(_END)  # later calls stop too
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            with contextlib.suppress(queue.Full):  # the threads have stopped: later calls end the epoch instead of waiting
                self._workers.done.put_nowait(_END)
            raise item
        if plan.ring is None:
            return item
        handed = time.perf_counter()
        buffer, owned, n = item
        images, labels = plan.ring.views(buffer, n)
        plan.ring.lend(buffer, owned)
        if plan.mark is not None:
            plan.mark(images)
            plan.mark(labels)
        plan.counters["handover_s"] += time.perf_counter() - handed
        return [images, labels]

    def release(self, batch: Any, after: Any = None) -> bool:
        """Give ``batch``'s buffer back now, after a CUDA event, or at a ``time.perf_counter()`` time (the prefetcher's hook)."""
        first = batch[0] if isinstance(batch, (list, tuple)) and batch else batch
        ring = self._plan.ring
        return ring is not None and isinstance(first, torch.Tensor) and ring.release(first, after)

    def close(self) -> None:
        """Stop the reading and decoding threads now."""
        self._workers.stop.set()


class _Workers:
    """The epoch's two threads and their queues."""

    def __init__(self, plan: Plan, seed: int) -> None:
        self._plan = plan
        self.stop = threading.Event()
        self._read: queue.Queue[Any] = queue.Queue(plan.prefetch)
        self.done: queue.Queue[Any] = queue.Queue(plan.prefetch)
        self._spare = np.random.default_rng([seed, 1])  # replacements' draws, apart from the batches'
        self._stop = self.stop
        self._done = self.done

    def start(self, batches: Iterator[list[int]], rng: np.random.Generator) -> None:
        target = self._read_loop if self._plan.samples is not None else self._generic_loop
        threads = [threading.Thread(target=target, args=(batches, rng), daemon=True, name="fastpipe-read")]
        if self._plan.samples is not None:
            threads.append(threading.Thread(target=self._decode_loop, daemon=True, name="fastpipe-decode"))
        for thread in threads:
            thread.start()

    # ----- the threads ----------------------------------------------------------------------
    def _read_loop(self, batches: Iterator[list[int]], rng: np.random.Generator) -> None:
        plan, counters = self._plan, self._plan.counters
        try:
            for indices in batches:
                if self._stop.is_set():
                    return
                started = time.perf_counter()
                paths = [plan.samples[i][0] for i in indices]  # type: ignore[index]
                data = [jpeg_ops.read_bytes(p) for p in paths]
                counters["read_s"] += time.perf_counter() - started
                started = time.perf_counter()
                sizes = np.ones((len(indices), 2), dtype=np.int64)
                errors: dict[int, CorruptImageError] = {}
                for k, (path, bytes_) in enumerate(zip(paths, data)):
                    try:
                        sizes[k] = jpeg_ops.jpeg_size(bytes_)
                    except CorruptImageError as exc:
                        errors[k] = type(exc)(str(exc).replace(jpeg_ops.UNNAMED_SOURCE, path))
                boxes = draw_boxes(rng, sizes[:, 0], sizes[:, 1], plan.scale, plan.ratio)
                flips = draw_flips(rng, len(indices), plan.hflip)
                counters["draw_s"] += time.perf_counter() - started
                labels = [plan.samples[i][1] for i in indices]  # type: ignore[index]
                if not _put(self._read, _Read(list(indices), data, boxes, flips, labels, errors), self._stop):
                    return
        except BaseException as exc:  # delivered to the loop in order
            _put(self._read, exc, self._stop)
            return
        _put(self._read, _END, self._stop)

    def _decode_loop(self) -> None:
        ring = self._plan.ring
        assert ring is not None
        while not self._stop.is_set():
            try:
                item = self._read.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if item is _END or isinstance(item, BaseException):
                _put(self._done, item, self._stop)
                return
            buffer, owned = ring.take()
            try:
                self._decode(item, buffer)
            except BaseException as exc:
                ring.give_back(buffer, owned)
                _put(self._done, exc, self._stop)
                return
            if not _put(self._done, (buffer, owned, len(item.indices)), self._stop):
                ring.give_back(buffer, owned)
                return

    def _decode(self, item: _Read, buffer: torch.Tensor) -> None:
        plan, counters = self._plan, self._plan.counters
        assert plan.ring is not None and plan.samples is not None
        images, labels = plan.ring.views(buffer, len(item.indices))
        names = [plan.samples[i][0] for i in item.indices]
        if item.header_errors and plan.on_error != "skip":
            raise next(iter(item.header_errors.values()))
        started = time.perf_counter()
        result = decode_jpeg_crop_batch(
            item.data, item.boxes, plan.size, item.flips, out=images, threads=plan.threads, on_error=plan.on_error, names=names
        )
        counters["decode_s"] += time.perf_counter() - started
        counters["images"] += len(item.indices)
        targets = list(item.labels)
        failed = {f.index: f.error for f in result.failed}
        failed.update(item.header_errors)
        for k, error in sorted(failed.items()):
            images[k], targets[k] = self._replacement(item.indices[k], error)
        labels.copy_(torch.as_tensor(targets, dtype=torch.int64))

    def _replacement(self, index: int, error: CorruptImageError) -> tuple[torch.Tensor, int]:
        """``on_error="skip"``: the first file after ``index`` that decodes, as :class:`fastpipe.datasets.ImageFolder` replaces it."""
        plan = self._plan
        samples = plan.samples
        assert samples is not None
        n = len(samples)
        for step in range(1, n + 1):
            plan.counters["skipped"] += 1
            warnings.warn(f"{error}; skipped, replaced by the next file that decodes", SkippedImageWarning, stacklevel=2)
            if step == n:
                break
            path, target = samples[(index + step) % n]
            try:
                data = jpeg_ops.read_bytes(path)
                height, width = jpeg_ops.jpeg_size(data)
                box = tuple(int(v) for v in draw_boxes(self._spare, [height], [width], plan.scale, plan.ratio)[0])
                flip = bool(draw_flips(self._spare, 1, plan.hflip)[0])
                return jpeg_ops.decode_jpeg_crop(data, box, plan.size, hflip=flip), target  # type: ignore[arg-type]
            except CorruptImageError as exc:
                error = type(exc)(str(exc).replace(jpeg_ops.UNNAMED_SOURCE, path))
        raise CorruptImageError(f"none of the {n} files could be decoded (on_error='skip'); the last: {error}")

    def _generic_loop(self, batches: Iterator[list[int]], rng: np.random.Generator) -> None:
        """Any map-style dataset (e.g. the diagnosis's cached samples): ``dataset[i]`` in ``threads`` threads, then collate."""
        from concurrent.futures import ThreadPoolExecutor

        plan = self._plan
        try:
            with ThreadPoolExecutor(plan.threads, thread_name_prefix="fastpipe-sample") as pool:
                for indices in batches:
                    if self._stop.is_set():
                        return
                    started = time.perf_counter()
                    batch = default_collate(list(pool.map(plan.dataset.__getitem__, indices)))
                    plan.counters["decode_s"] += time.perf_counter() - started
                    plan.counters["images"] += len(indices)
                    if not _put(self._done, batch, self._stop):
                        return
        except BaseException as exc:
            _put(self._done, exc, self._stop)
            return
        _put(self._done, _END, self._stop)
