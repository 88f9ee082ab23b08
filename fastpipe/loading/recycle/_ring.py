"""The worker's side of the ring: a few reused shared-memory batch buffers, and the note sent per batch.

Each worker owns ``slots`` buffers. A slot's state lives in a small shared uint8 table that both
processes see; each transition has one writer, so no lock or pipe is needed:

* the worker takes a slot that is ``FREE`` (or ``RETIRED``) and marks it ``BUSY``;
* the training process marks it ``FREE`` once the batch in it is no longer used, or ``RETIRED``
  when the user kept that batch: the worker then gives the slot a new buffer and leaves the
  old one to whoever still holds it.

A buffer crosses to the training process once, inside the first :class:`RingBatch` that uses
it (PyTorch shares it by file descriptor, already unlinked from ``/dev/shm``, so a crash leaves
nothing behind); later batches in the same slot send only the layout. When no slot is free
the worker never waits: it writes into a fresh buffer, as the stock DataLoader would, and
counts a fallback.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import get_worker_info

from fastpipe.loading.recycle._layout import LeafSpec, Plan, plan_batch

FREE, BUSY, RETIRED = 0, 1, 2
#: Per-worker counters, one int64 each, written only by that worker.
COUNTERS = ("batches", "reused", "first_buffers", "grown", "replaced_kept", "fallbacks", "allocated_bytes")
#: The training process's table of every ring's slot states, by ring token (for notes dropped unread).
STATE_TABLES: dict[int, np.ndarray] = {}
_tokens = itertools.count(1)


def new_token() -> int:
    """A number naming one set of workers' rings (one per epoch without persistent workers)."""
    return next(_tokens)


def shared_table(rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """A zeroed table in shared memory, made before the workers start so they all see it."""
    return torch.zeros((rows, cols), dtype=dtype).share_memory_()


def new_buffer(nbytes: int, shared: bool) -> torch.Tensor:
    """A flat uint8 buffer; in shared memory when it must cross to another process."""
    if not shared:
        return torch.empty(nbytes, dtype=torch.uint8)
    storage = torch.UntypedStorage._new_shared(nbytes)
    return torch.empty(0, dtype=torch.uint8).set_(storage)


class RingBatch:
    """What a worker sends per batch: which slot, the layout, and the buffer itself when it is new.

    If the training process drops one unread (a persistent loader's epoch abandoned midway), its
    slot is handed back, so the ring does not shrink.
    """

    def __init__(
        self,
        token: int,
        worker: int,
        slot: int,
        generation: int,
        buffer: torch.Tensor | None,
        skeleton: Any,
        specs: list[LeafSpec],
        in_worker: bool,
    ) -> None:
        self.token, self.worker, self.slot, self.generation = token, worker, slot, generation
        self.buffer, self.skeleton, self.specs = buffer, skeleton, specs
        self._received = not in_worker  # made in the training process itself when num_workers=0
        self._opened = False

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_received"] = True
        return state

    def pin_memory(self, *args: Any) -> "RingBatch":
        """Nothing to pin here: the training process registers or pins the ring buffers itself."""
        return self

    def mark_opened(self) -> None:
        self._opened = True

    def __del__(self) -> None:
        if not self._received or self._opened or self.slot < 0:
            return
        table = STATE_TABLES.get(self.token)
        if table is not None:  # a buffer sent here but never mapped must be replaced, not reused
            table[self.worker, self.slot] = RETIRED if self.buffer is not None else FREE


class RingCollate:
    """The ``collate_fn`` a recycled loader's workers run: collate straight into a ring slot.

    Args:
        collate_fn: the user's collate function, or None for ``default_collate`` (which is then
            done without any intermediate tensor).
        slots: buffers per worker.
    """

    def __init__(self, collate_fn: Callable[[list[Any]], Any] | None, slots: int) -> None:
        self.collate_fn = collate_fn
        self.slots = slots
        self.token = 0
        self.states: torch.Tensor | None = None
        self.counters: torch.Tensor | None = None
        self._ring: dict[str, Any] | None = None

    def start(self, workers: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        """Fresh tables for a new set of workers (called in the training process before they start)."""
        self.token = new_token()
        self.states = shared_table(max(1, workers), self.slots, torch.uint8)
        self.counters = shared_table(max(1, workers), len(COUNTERS), torch.int64)
        self._ring = None
        STATE_TABLES[self.token] = self.states.numpy()
        return self.token, self.states, self.counters

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_ring"] = None  # each worker builds its own
        return state

    def _local(self) -> dict[str, Any]:
        if self._ring is None or self._ring["token"] != self.token:
            assert self.states is not None and self.counters is not None, "RingCollate.start() was not called"
            self._ring = {
                "token": self.token,
                "buffers": [None] * self.slots,
                "generations": [0] * self.slots,
                "next": 0,
                "states": self.states.numpy(),
                "counters": self.counters.numpy(),
            }
        return self._ring

    def __call__(self, samples: list[Any]) -> RingBatch:
        info = get_worker_info()
        worker = 0 if info is None else info.id
        plan = plan_batch(samples, self.collate_fn)
        ring = self._local()
        slot, generation, buffer, is_new = self._acquire(ring, worker, plan, shared=info is not None)
        plan.write(buffer)
        sent = buffer if is_new else None
        return RingBatch(self.token, worker, slot, generation, sent, plan.skeleton, plan.specs, in_worker=info is not None)

    def _acquire(self, ring: dict[str, Any], worker: int, plan: Plan, shared: bool) -> tuple[int, int, torch.Tensor, bool]:
        states, counts = ring["states"][worker], ring["counters"][worker]
        counts[COUNTERS.index("batches")] += 1
        for k in range(self.slots):
            slot = (ring["next"] + k) % self.slots
            state = int(states[slot])
            if state == BUSY:
                continue
            ring["next"] = slot + 1
            current = ring["buffers"][slot]
            if state == FREE and current is not None and current.numel() >= plan.nbytes:
                states[slot] = BUSY
                counts[COUNTERS.index("reused")] += 1
                return slot, ring["generations"][slot], current, False
            reason = "first_buffers" if current is None else ("replaced_kept" if state == RETIRED else "grown")
            counts[COUNTERS.index(reason)] += 1
            counts[COUNTERS.index("allocated_bytes")] += plan.nbytes
            ring["buffers"][slot] = None  # drop ours before allocating: the old one may be large
            buffer = new_buffer(plan.nbytes, shared)
            ring["buffers"][slot] = buffer
            ring["generations"][slot] += 1
            states[slot] = BUSY
            return slot, ring["generations"][slot], buffer, True
        counts[COUNTERS.index("fallbacks")] += 1
        counts[COUNTERS.index("allocated_bytes")] += plan.nbytes
        return -1, 0, new_buffer(plan.nbytes, shared), True
