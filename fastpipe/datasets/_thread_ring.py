"""The thread loader's batch memory: a few reused buffers, given back as ``fastpipe.loading.recycled`` gives its slots back.

Each buffer holds one batch: the uint8 (N, 3, H, W) images and the int64 (N,) labels, in one
allocation (page-locked when the batch is for CUDA), so that whether anything still holds the
batch is one count: the storage's use count (``storage_refs``, as ``fastpipe.loading.recycled`` counts it).
A delivered batch goes back to the free list, to be written again:

* with :class:`~fastpipe.loading.DevicePrefetcher` (through ``release(batch, after)``), once its
  copy to the device is done: a CUDA event; on ``sim`` the modelled copy's ready time *and* no
  reference left (a ``sim`` device batch is the host memory itself, so the step still reads it);
* in a hand-written loop, at a later ``next()``, when nothing refers to it any more, after the
  device work queued so far (your ``non_blocking`` copy of it) has finished;
* never, if the loop keeps it past ``slots`` batches: it is yours (``kept`` in the stats), and
  the ring makes a new buffer in its place.

The decoding threads never wait for a buffer: when every one is in use they write into a fresh
one (``fallbacks``), so a loop that keeps batches cannot stall the loader. Which batches get the
fresh ones depends on the threads' timing (the two decoding threads reach the ring in either order,
not always the batches'); a fresh one is never the ring's, so a loop that keeps it is not counted
``kept``, and nothing writes it again. Buffers are sized from the batches received: a batch larger
than the ring's buffers (a custom ``batch_sampler``) makes the ring drop its smaller free buffers
and allocate larger ones (``grown``).
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any, Callable

import torch

from fastpipe.loading.recycle import LeaseBook, storage_refs

LABEL_BYTES = 8  # int64 labels
#: storage_refs() of a buffer only the ring holds.
OWN_REFS = storage_refs(torch.empty(1))


class Lease:
    """A delivered batch's hold on its buffer."""

    __slots__ = ("buffer", "serial", "done")

    def __init__(self, buffer: torch.Tensor, serial: int) -> None:
        self.buffer, self.serial, self.done = buffer, serial, False

    def in_use(self) -> bool:
        return storage_refs(self.buffer) > OWN_REFS

    def holds(self, tensor: torch.Tensor) -> bool:
        start = self.buffer.data_ptr()
        return start <= tensor.data_ptr() < start + self.buffer.numel()


class BufferRing:
    """``slots`` reusable batch buffers of one shape; thread-safe (the decoding threads take, the loop gives back)."""

    def __init__(self, slots: int, batch_size: int, size: tuple[int, int], pin: bool) -> None:
        self.slots, self.size, self.pin = slots, size, pin
        self._resize(batch_size)
        self.ring_bytes = 0  # bytes of the buffers the ring owns now (free or lent)
        self._free: list[torch.Tensor] = []
        self._owned = 0  # buffers of the ring, free or lent
        self._leases: LeaseBook[Lease] = LeaseBook()
        self._lock = threading.Lock()
        self.events: Counter[str] = Counter()

    def _resize(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.nbytes = _nbytes(batch_size, self.size)

    def _new(self) -> torch.Tensor:
        return torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=self.pin)

    def take(self, n: int | None = None) -> tuple[torch.Tensor, bool]:
        """A buffer for a batch of ``n`` images (default: the ring's batch size), and whether it belongs to the ring
        (False: a one-off fallback). A batch larger than the ring's buffers grows the ring: its free buffers are dropped."""
        with self._lock:
            self.events["batches"] += 1
            if n is not None and n > self.batch_size:
                self._resize(n)
                if self._owned:  # buffers made for smaller batches exist: growth (else the first sizing)
                    self.events["grown"] += 1
                for old in self._free:
                    self._drop(old)
                self._free.clear()
            while self._free:
                buffer = self._free.pop()
                if buffer.numel() >= self.nbytes:
                    self.events["reused"] += 1
                    return buffer, True
                self._drop(buffer)  # smaller than the batches now: lent before the ring grew
            if self._owned < self.slots:
                self._owned += 1
                self.ring_bytes += self.nbytes
                self.events["first_buffers"] += 1
                return self._new(), True
            self.events["fallbacks"] += 1
        return self._new(), False

    def _drop(self, buffer: torch.Tensor) -> None:
        self._owned -= 1
        self.ring_bytes -= buffer.numel()

    def views(self, buffer: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``n`` images (uint8 (n, 3, H, W)) and labels (int64 (n,)) of ``buffer`` (laid out by its own size)."""
        h, w = self.size
        capacity = _capacity(buffer.numel(), self.size)
        images = buffer[: capacity * 3 * h * w].view(capacity, 3, h, w)[:n]
        start = buffer.numel() - capacity * LABEL_BYTES
        labels = buffer[start:].view(torch.int64)[:n]
        return images, labels

    def lend(self, buffer: torch.Tensor, owned: bool) -> None:
        """The batch in ``buffer`` goes to the loop now; an owned buffer comes back by :meth:`poll` or :meth:`release`."""
        with self._lock:
            serial = self._leases.next_serial()
            if owned:
                self._leases.held.append(Lease(buffer, serial))

    def give_back(self, buffer: torch.Tensor, owned: bool) -> None:
        """A buffer taken but never lent (the epoch ended first)."""
        if owned:
            with self._lock:
                self._free.append(buffer)

    def release(self, tensor: torch.Tensor, after: Any = None) -> bool:
        """Give back the batch holding ``tensor``: now, after a CUDA event, or at a ``time.perf_counter()`` time."""
        with self._lock:
            return self._leases.release(tensor, after, self._free_lease)

    def poll(self, fence: Callable[[], Any]) -> None:
        """Give back what is due: batches the loop has moved past (after ``fence()``: False for none), timed and event
        releases; a batch kept past ``slots`` newer ones is the loop's now."""
        with self._lock:
            self._leases.poll(fence, self.slots, self._free_lease, self._keep)

    def _keep(self, lease: Lease) -> None:
        """Kept by the loop: the buffer is the user's now; the ring makes a new one in its place."""
        self._drop(lease.buffer)
        self.events["kept"] += 1

    def _free_lease(self, lease: Lease) -> None:
        if not lease.done:
            lease.done = True
            self.events["released"] += 1
            self._free.append(lease.buffer)


def _nbytes(batch_size: int, size: tuple[int, int]) -> int:
    """One buffer's bytes: the images, padded to 8 bytes, then the labels."""
    image_bytes = batch_size * 3 * size[0] * size[1]
    return -(-image_bytes // LABEL_BYTES) * LABEL_BYTES + batch_size * LABEL_BYTES


def _capacity(nbytes: int, size: tuple[int, int]) -> int:
    """The batch size a buffer of ``nbytes`` was made for (the inverse of :func:`_nbytes`: padding is under 8 bytes)."""
    return nbytes // (3 * size[0] * size[1] + LABEL_BYTES)
