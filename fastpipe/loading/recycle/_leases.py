"""When a lent batch's memory may be written again: one book for every ring that lends batches to the loop.

``fastpipe.loading.recycled``'s shared-memory slots and the ThreadLoader's batch buffers both lend a batch's memory to the
training loop and take it back:

* at once, after a CUDA event, or at a ``time.perf_counter()`` time (:meth:`LeaseBook.release`, the prefetcher's
  hook). A time is ``sim``'s modelled copy: its device batch is the host memory itself, so the memory must also be
  unreferenced before it is written again;
* once the loop has moved past it and nothing refers to it any more, after the device work queued so far (a
  ``non_blocking`` copy of it) has finished (:meth:`LeaseBook.poll`, called at each ``next()``);
* never, when the loop keeps it past ``patience`` newer batches: the memory is the loop's now (``retire``).

The book does not lock: its owner calls it under its own lock.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Generic, Protocol, TypeVar

import torch


class Lease(Protocol):
    """A delivered batch's hold on its memory."""

    serial: int
    done: bool

    def in_use(self) -> bool:
        """Whether any tensor besides the ring's own still holds the batch's memory."""

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` lies in the batch's memory."""


L = TypeVar("L", bound=Lease)


class LeaseBook(Generic[L]):
    """The leases lent to the loop and the releases waiting on an event or a time. ``free`` and ``retire``, passed
    at each call, are the owner's: give the memory back to its ring, or let the loop keep it."""

    def __init__(self) -> None:
        self.held: deque[L] = deque()
        self.pending: list[tuple[L, Any]] = []
        self.serial = 0

    def next_serial(self) -> int:
        """The serial number of the batch lent next (every batch counts, lent or handed over for good)."""
        self.serial += 1
        return self.serial

    def release(self, tensor: torch.Tensor, after: Any, free: Callable[[L], None]) -> bool:
        """Give back the held batch holding ``tensor``: now, after a CUDA event, or at a ``time.perf_counter()`` time.
        False when no held batch holds it."""
        if tensor.device.type != "cpu":
            return False
        for lease in self.held:
            if not lease.done and lease.holds(tensor):
                self.held.remove(lease)
                if after is None:
                    free(lease)
                else:
                    self.pending.append((lease, after))
                return True
        return False

    def poll(self, fence: Callable[[], Any], patience: int, free: Callable[[L], None], retire: Callable[[L], None]) -> None:
        """Give back what is due: batches the loop has moved past and nothing references (after ``fence()``, asked
        once: False where no device work can be queued), and event and timed releases; retire batches kept past
        ``patience`` newer ones. The latest batch is the loop's current one and stays lent."""
        latest = self.held[-1] if self.held else None
        mark = None
        for lease in list(self.held):
            if lease.done:
                self.held.remove(lease)
            elif lease is latest:
                continue
            elif not lease.in_use():
                self.held.remove(lease)
                mark = fence() if mark is None else mark
                if mark is False:
                    free(lease)
                else:  # a non_blocking copy of it may still be queued on the device
                    self.pending.append((lease, mark))
            elif self.serial - lease.serial > patience:
                self.held.remove(lease)
                retire(lease)
        now = time.perf_counter()  # after the batches just moved past: a fence already passed frees them now
        waiting = []
        for lease, after in self.pending:
            due = (now >= after and not lease.in_use()) if isinstance(after, float) else after.query()
            if due:
                free(lease)
            else:
                waiting.append((lease, after))
        self.pending = waiting
