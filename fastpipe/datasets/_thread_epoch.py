"""One epoch of a :class:`~fastpipe.datasets.ThreadLoader`: a reading thread, two decoding threads, and the loop's ``next()``.

The reading thread reads the next batches' files, their headers' sizes, and draws their boxes and
flips while the decoding threads' native threads decode earlier batches into ring buffers (the GIL
is released for the whole batch), so reads overlap decoding. The two decoding threads take batches
in turn, so that one's Python between batches (about a millisecond a batch) does not leave the cores
idle; ``threads`` native threads decode at once in all (:func:`decoder_threads`). Batches reach the
loop in order. The read queue is bounded (``prefetch`` batches), and a decoding thread takes a batch
only while it is at most ``prefetch`` ahead of the loop, so at most ``prefetch`` batches are read
ahead and ``prefetch + 1`` decoded or being decoded ahead of the loop.
An error (a file that cannot be read, or decoded under ``on_error="raise"``) is delivered in
order: the batches before it first. ``close()`` (or dropping the iterator) stops the threads and
gives the buffers of batches decoded but not delivered back to the ring.
"""

from __future__ import annotations

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
from fastpipe.datasets.folder import SkippedImageWarning
from fastpipe.errors import CorruptImageError
from fastpipe.ops import jpeg as jpeg_ops
from fastpipe.ops.jpeg_batch import decode_jpeg_crop_batch

_END = object()
_DONE = object()  # a decoding thread's own stop: the other one delivered the end
_POLL_S = 0.1  # how often a blocked thread looks at the stop flag (and next() at whether the threads live)
JOIN_S = 5.0  # how long close() waits for each thread (one batch's decode at most)


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
    collate: Callable[[list[Any]], Any] | None = None
    """The loader's ``collate_fn`` (None: ``default_collate``; the fast path hands its batch as it is then)."""


def _put(q: "queue.Queue[Any]", item: Any, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            continue
    return False


class EpochClosedError(RuntimeError):
    """``next()`` on a :class:`ThreadEpoch` that was closed: by ``iter()`` on its loader again, or ``close()``."""


class ThreadEpoch(Iterator[Any]):
    """Batches of one epoch: ``[images uint8 (N, 3, H, W), labels int64 (N,)]`` views into ring buffers.

    The threads hold only the :class:`_Workers` state, never this iterator, so dropping it stops them
    (and gives their buffers back). ``next()`` never blocks on threads that are gone: a closed
    epoch raises :class:`EpochClosedError`, threads that died without a word raise RuntimeError.

    The generic path (``plan.samples`` is None: any map-style dataset, or a transform the decoder did not
    absorb) runs ``dataset[i]`` in the loop's own thread, under a copy of the global RNG seeded from the
    epoch's seed and the batch's number: draws from the global RNG (torchvision's random transforms) are
    reproducible under ``torch.manual_seed``, and the loop's RNG moves as a DataLoader's does.
    """

    def __init__(self, plan: Plan, batches: Iterator[list[int]], seed: int) -> None:
        self._plan = plan
        self._closed: str | None = None
        if plan.samples is None:
            self._batches: Iterator[list[int]] | None = batches
            self._seed, self._number = seed, 0
            self._workers: _Workers | None = None
            return
        self._batches = None
        self._workers = _Workers(plan, seed)
        self._workers.start(batches, np.random.default_rng(seed))
        self._finalizer = weakref.finalize(self, self._workers.shutdown, 0.0)

    def __iter__(self) -> "ThreadEpoch":
        return self

    def __next__(self) -> Any:
        if self._closed is not None:
            raise EpochClosedError(f"this iterator was closed {self._closed}; start a new epoch with iter(loader)")
        if self._workers is None:
            return self._next_generic()
        plan = self._plan
        if plan.ring is not None:
            polled = time.perf_counter()
            plan.ring.poll(plan.fence)  # giving back the buffers the loop moved past: part of the hand-over
            plan.counters["handover_s"] += time.perf_counter() - polled
        started = time.perf_counter()
        item = self._workers.get()
        plan.counters["wait_s"] += time.perf_counter() - started
        plan.counters["waits"] += 1
        if item is _END:
            self._finish()
            raise StopIteration
        if isinstance(item, BaseException):
            self._finish()
            raise item
        handed = time.perf_counter()
        buffer, owned, n = item
        assert plan.ring is not None
        images, labels = plan.ring.views(buffer, n)
        plan.ring.lend(buffer, owned)
        if plan.mark is not None:
            plan.mark(images)
            plan.mark(labels)
        plan.counters["handover_s"] += time.perf_counter() - handed
        plan.counters["handed_batches"] += 1
        plan.counters["handed_images"] += n
        if plan.collate is not None:  # the user's collate on the batch's samples (it copies: the views go back to the ring)
            return plan.collate([(images[i], labels[i]) for i in range(n)])
        return [images, labels]

    def flush_clocks(self) -> None:
        """Bring the decode clocks up to now (a batch still in the op counts its time so far)."""
        if self._workers is not None:
            self._workers.flush()

    def _finish(self) -> None:
        """The epoch ended (or failed): later ``next()`` calls stop at once."""
        assert self._workers is not None
        self._workers.shutdown(JOIN_S)
        self._workers.ended = True

    def _next_generic(self) -> Any:
        plan = self._plan
        assert self._batches is not None
        indices = next(self._batches)  # StopIteration ends the epoch
        started = time.perf_counter()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed((self._seed + self._number) % 2**63)
            batch = (plan.collate or default_collate)([plan.dataset[i] for i in indices])
        self._number += 1
        plan.counters["decode_s"] += time.perf_counter() - started
        plan.counters["images"] += len(indices)
        plan.counters["decode_batches"] += 1
        plan.counters["decode_threads"] += 1  # the loop's own thread
        plan.counters["handed_batches"] += 1
        plan.counters["handed_images"] += len(indices)
        return batch

    def release(self, batch: Any, after: Any = None) -> bool:
        """Give ``batch``'s buffer back now, after a CUDA event, or at a ``time.perf_counter()`` time (the prefetcher's hook)."""
        started = time.perf_counter()
        first = batch[0] if isinstance(batch, (list, tuple)) and batch else batch
        ring = self._plan.ring
        released = ring is not None and isinstance(first, torch.Tensor) and ring.release(first, after)
        self._plan.counters["handover_s"] += time.perf_counter() - started  # the prefetcher's release: part of the hand-over
        return released

    def close(self, why: str = "by close()") -> None:
        """Stop the threads, wait for them (a few seconds at most) and give every queued buffer back to the ring."""
        if self._closed is None:
            ended = self._workers is None or self._workers.ended
            self._closed = "after the epoch ended" if ended and why == "by close()" else why
        if self._workers is not None:
            self._workers.shutdown(JOIN_S)


def decoder_threads(threads: int) -> list[int]:
    """Native threads per decoding thread for ``threads`` in all: two decoding threads (one when ``threads`` is 1).

    Why two: a decoding thread runs Python between two batches (the batch's views, its labels, the hand-over to the
    loop, the next read batch), about a millisecond in which its native threads have nothing to decode. With two
    decoding threads taking batches in turn, one decodes while the other is between batches, so the cores stay busy;
    the native threads at once stay ``threads`` in all.
    """
    if threads < 2:
        return [threads]
    return [threads - threads // 2, threads // 2]


class _Workers:
    """The epoch's reading thread and decoding threads, the read queue between them, and the decoded batches in order.

    The decoding threads take read batches in order (each gets the next sequence number) and deliver each decoded
    batch under its number; ``get()`` hands them over in that order. A decoding thread takes a read batch only while
    it is at most ``prefetch`` batches ahead of the loop, so at most ``prefetch + 1`` batches are decoded or being
    decoded ahead of it: with two decoding threads the buffers in use are as many as with one.
    """

    def __init__(self, plan: Plan, seed: int) -> None:
        self._plan = plan
        self._seed = seed
        self._natives = decoder_threads(plan.threads)  # native threads per decoding thread
        self._stop = threading.Event()
        self.ended = False
        self._read: queue.Queue[Any] = queue.Queue(plan.prefetch)
        self._threads: list[threading.Thread] = []
        self._ready: dict[int, Any] = {}  # decoded batches (or the error, or the end) by sequence number
        self._next = 0  # the sequence number the loop gets next
        self._taken = 0  # the sequence number the next read batch gets
        self._order = threading.Condition()  # guards _ready, _next and _taken
        self._take = threading.Lock()  # one decoding thread at a time takes a read batch and its number
        self._input_done = False  # a decoding thread took the end (or the reading thread's error)
        self._clock = threading.Lock()  # the decode counters: two threads add to them
        self._decoding = 0  # native threads in the op now
        self._weight = 0.0  # their sum of 1 / cap (see _decode_clock)
        self._since = 0.0  # when the decode clocks were last brought up to date

    def start(self, batches: Iterator[list[int]], rng: np.random.Generator) -> None:
        self._threads = [threading.Thread(target=self._read_loop, args=(batches, rng), daemon=True, name="fastpipe-read")]
        self._threads += [
            threading.Thread(target=self._decode_loop, args=(natives,), daemon=True, name=f"fastpipe-decode-{k}")
            for k, natives in enumerate(self._natives)
        ]
        for thread in self._threads:
            thread.start()

    def get(self) -> Any:
        """The next batch in order (or the error, or the end); waits while a thread can still deliver it, never longer."""
        while True:
            if self.ended:
                return _END
            with self._order:
                item = self._pop_next()
                if item is not None:
                    return item
                self._order.wait(_POLL_S)
                item = self._pop_next()
                if item is not None:
                    return item
            if not any(thread.is_alive() for thread in self._threads):
                with self._order:  # the last delivery may have landed between the wait and the check
                    item = self._pop_next()
                return (
                    item
                    if item is not None
                    else RuntimeError("the ThreadLoader's reading and decoding threads stopped without delivering a batch or an error")
                )

    def _pop_next(self) -> Any:
        """The loop's next item if it was delivered, else None (call with ``_order`` held)."""
        if self._next not in self._ready:
            return None
        item = self._ready.pop(self._next)
        if isinstance(item, tuple):  # a batch: the loop moves on, a decoding thread may take another
            self._next += 1
            self._order.notify_all()
        return item

    def _deliver(self, seq: int, item: Any) -> None:
        with self._order:
            self._ready[seq] = item
            self._order.notify_all()

    def shutdown(self, timeout: float) -> None:
        """Stop all threads, join them (up to ``timeout`` s each), and give the buffers still queued back to the ring."""
        self._stop.set()
        with self._order:
            self._order.notify_all()
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current and thread.is_alive() and timeout > 0:
                thread.join(timeout)
        self.drain()

    def drain(self) -> None:
        """Empty the read queue and the decoded batches; a decoded batch's buffer goes back to the ring."""
        ring = self._plan.ring
        while True:
            try:
                self._read.get_nowait()
            except queue.Empty:
                break
        with self._order:
            items, self._ready = list(self._ready.values()), {}
        for item in items:
            if isinstance(item, tuple) and ring is not None:
                ring.give_back(item[0], item[1])

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
                counters["read_images"] += len(indices)
                counters["read_batches"] += 1
                labels = [plan.samples[i][1] for i in indices]  # type: ignore[index]
                if not _put(self._read, _Read(list(indices), data, boxes, flips, labels, errors), self._stop):
                    return
        except BaseException as exc:  # delivered to the loop in order
            _put(self._read, exc, self._stop)
            return
        _put(self._read, _END, self._stop)

    def _decode_loop(self, natives: int) -> None:
        """Take read batches in turn and decode each into a ring buffer with ``natives`` native threads; any failure here
        (a buffer that cannot be made included) reaches ``next()`` in its batch's place."""
        ring = self._plan.ring
        assert ring is not None
        taken: tuple[torch.Tensor, bool] | None = None
        seq: int | None = None
        try:
            while not self._stop.is_set():
                seq, item = self._next_read()
                if item is None:
                    continue
                if item is _DONE:
                    return
                if item is _END or isinstance(item, BaseException):
                    self._deliver(seq, item)
                    return
                taken = ring.take(len(item.indices))
                self._decode(item, taken[0], natives, seq)
                if self._stop.is_set():
                    return  # stopped: the finally gives it back
                self._deliver(seq, (*taken, len(item.indices)))
                taken, seq = None, None
        except BaseException as exc:
            if seq is None:
                with self._take:
                    seq, self._taken = self._taken, self._taken + 1
            self._deliver(seq, exc)
        finally:
            if taken is not None:
                ring.give_back(*taken)
            if self._stop.is_set():  # closed while batches were queued: no one else may drain after this thread
                self.drain()

    def _next_read(self) -> tuple[int | None, Any]:
        """The next read batch and its sequence number, once the loop is close enough behind; (None, None) to look
        again (stopped, or nothing read yet). The end (or the reading thread's error) is put back for the other
        decoding thread, which then stops (``_DONE``) without delivering it twice."""
        with self._take:
            with self._order:
                while self._taken - self._next > self._plan.prefetch and not self._stop.is_set():
                    self._order.wait(_POLL_S)
            if self._stop.is_set():
                return None, None
            try:
                item = self._read.get(timeout=_POLL_S)
            except queue.Empty:
                return None, None
            if item is _END or isinstance(item, BaseException):
                self._read.put_nowait(item)  # for the other decoding thread: room, as it was just taken
                if self._input_done:  # the other one delivered it already
                    return None, _DONE
                self._input_done = True
            seq, self._taken = self._taken, self._taken + 1
            return seq, item

    def _decode(self, item: _Read, buffer: torch.Tensor, natives: int, seq: int) -> None:
        plan, counters = self._plan, self._plan.counters
        assert plan.ring is not None and plan.samples is not None
        images, labels = plan.ring.views(buffer, len(item.indices))
        names = [plan.samples[i][0] for i in item.indices]
        if item.header_errors and plan.on_error != "skip":
            raise next(iter(item.header_errors.values()))
        n = len(item.indices)
        # at most one native thread per image: of this thread's natives, min(natives, n) decode; of all the decoding
        # threads', at most `cap` at once for batches of this size
        cap = sum(min(k, n) for k in self._natives)
        self._decode_clock(min(natives, n), cap)
        try:
            result = decode_jpeg_crop_batch(
                item.data, item.boxes, plan.size, item.flips, out=images, threads=natives, on_error=plan.on_error, names=names
            )
        finally:
            self._decode_clock(-min(natives, n), cap)
        with self._clock:
            counters["images"] += n
            counters["decode_batches"] += 1
            counters["decode_threads"] += cap  # the native threads that can decode batches of this size at once
        targets = list(item.labels)
        failed = {f.index: f.error for f in result.failed}
        failed.update(item.header_errors)
        if failed:
            spare = np.random.default_rng([self._seed, 1, seq])  # replacements' draws: apart from the batches', the same whichever thread
            for k, error in sorted(failed.items()):
                images[k], targets[k] = self._replacement(item.indices[k], error, spare)
        labels.copy_(torch.as_tensor(targets, dtype=torch.int64))

    def _decode_clock(self, natives: int, cap: int) -> None:
        """Bring the decode clocks up to now, then count ``natives`` more native threads in the op (fewer when negative)
        out of the ``cap`` that can decode at once: ``decode_s`` adds each native thread's time over ``cap`` (the time the
        decode takes of that many cores: a batch decoded on half of them while the other decoding thread waits counts
        half), ``decode_busy_s`` the wall time during which any is in the op. Both move at every start and end, and
        ``flush()`` brings them up to the moment the clocks are read, so a window over them sees the same intervals."""
        with self._clock:
            now = time.perf_counter()
            if self._decoding > 0:
                self._plan.counters["decode_s"] += self._weight * (now - self._since)
                self._plan.counters["decode_busy_s"] += now - self._since
            self._since = now
            if natives:
                self._decoding += natives
                self._weight += natives / cap
                if self._decoding == 0:
                    self._weight = 0.0  # no drift from float sums

    def flush(self) -> None:
        """The decode clocks up to now (the loader calls it before it reads them)."""
        self._decode_clock(0, 1)

    def _replacement(self, index: int, error: CorruptImageError, spare: np.random.Generator) -> tuple[torch.Tensor, int]:
        """``on_error="skip"``: the first file after ``index`` that decodes, as :class:`fastpipe.datasets.ImageFolder` replaces it."""
        plan = self._plan
        samples = plan.samples
        assert samples is not None
        n = len(samples)
        for step in range(1, n + 1):
            with self._clock:  # two decoding threads may skip at once
                plan.counters["skipped"] += 1
                skipped = getattr(plan.dataset, "skipped", None)
                if skipped is not None:
                    skipped.add()  # the dataset's own count, as its __getitem__ keeps it
            warnings.warn(f"{error}; skipped, replaced by the next file that decodes", SkippedImageWarning, stacklevel=2)
            if step == n:
                break
            path, target = samples[(index + step) % n]
            try:
                data = jpeg_ops.read_bytes(path)
                height, width = jpeg_ops.jpeg_size(data)
                box = tuple(int(v) for v in draw_boxes(spare, [height], [width], plan.scale, plan.ratio)[0])
                flip = bool(draw_flips(spare, 1, plan.hflip)[0])
                return jpeg_ops.decode_jpeg_crop(data, box, plan.size, hflip=flip), target  # type: ignore[arg-type]
            except CorruptImageError as exc:
                error = type(exc)(str(exc).replace(jpeg_ops.UNNAMED_SOURCE, path))
        raise CorruptImageError(f"none of the {n} files could be decoded (on_error='skip'); the last: {error}")
