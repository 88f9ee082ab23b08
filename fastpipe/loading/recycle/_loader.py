"""The training process's side: map each ring buffer once, hand out batches as views, give slots back.

A slot goes back to its worker when the batch in it is no longer used:

* with :class:`~fastpipe.loading._prefetch.DevicePrefetcher`, as soon as its copy to the device is done
  (a CUDA event on ``cuda``, the modelled copy's ready time on ``sim``);
* in a hand-written loop, when the loop has moved on: at each ``next()``, every earlier batch
  that nothing refers to any more (no variable, list or view holds any of its tensors) is
  released; on CUDA (and sim) only once the work queued on the current stream so far, such as
  your ``non_blocking`` copy of it, has finished. ``release(batch)`` or ``with releasing(batch):``
  releases one sooner;
* a batch still referred to long after the loop moved on has been kept: its buffer becomes
  yours, never to be overwritten, and the worker gets a new one for that slot (``kept`` in
  :meth:`RecycledLoader.stats`).

On the simulated device "device" tensors alias host memory (see :mod:`fastpipe.devices`), so once
a slot is released at its modelled copy's ready time, the sim batch may show a later batch's
values. The sim step never reads them; check values on ``cpu``, where the step reads the host
batch itself and it is released only once unused.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader
from torch.utils.data._utils.collate import default_collate

from fastpipe._tree import iter_tensors, map_tensors
from fastpipe.errors import ConfigError
from fastpipe.loading._rebuild import rebuild_loader
from fastpipe.loading.recycle import _hostpin as hostpin
from fastpipe.loading.recycle._layout import open_batch
from fastpipe.loading.recycle._leases import LeaseBook
from fastpipe.loading.recycle._ring import COUNTERS, FREE, RETIRED, STATE_TABLES, RingBatch, RingCollate

#: storage_refs() of a buffer that only its own tensor holds (calibrated: torch versions differ).
OWN_REFS = hostpin.storage_refs(torch.empty(1))
_LIVE: "weakref.WeakSet[RecycledLoader]" = weakref.WeakSet()


def default_slots(loader: DataLoader) -> int:
    """Buffers per worker: its ``prefetch_factor`` batches queued, plus two in the training process's hands."""
    return (loader.prefetch_factor or 2) + 2 if loader.num_workers > 0 else 3


@dataclass
class _Mapped:
    """One ring buffer as the training process maps it."""

    generation: int
    buffer: torch.Tensor
    registered: bool = False


class _Lease:
    """A delivered batch's hold on its slot."""

    __slots__ = ("token", "worker", "slot", "mapped", "serial", "done")

    def __init__(self, token: int, worker: int, slot: int, mapped: _Mapped, serial: int) -> None:
        self.token, self.worker, self.slot, self.mapped, self.serial = token, worker, slot, mapped, serial
        self.done = False

    def in_use(self) -> bool:
        """Whether any tensor besides the ring's own still holds this batch's memory."""
        return hostpin.storage_refs(self.mapped.buffer) > OWN_REFS

    def holds(self, tensor: torch.Tensor) -> bool:
        start = self.mapped.buffer.data_ptr()
        return start <= tensor.data_ptr() < start + self.mapped.buffer.numel()


class RecycledLoader:
    """A DataLoader whose workers collate into a ring of reused shared-memory buffers.

    Build it with :func:`fastpipe.loading.recycled`. It iterates like the loader it wraps (same batches,
    same structure, same order) and exposes the same settings (``dataset``, ``num_workers``,
    ``batch_size``, ``pin_memory``, ...), so ``fastpipe diagnose`` accepts it.
    """

    def __init__(
        self, loader: DataLoader, slots: int | None = None, *, poison: int | None = None, registrar: hostpin.Registrar | None = None
    ) -> None:
        if not isinstance(loader, DataLoader):
            raise ConfigError(f"fastpipe.loading.recycled wraps a torch.utils.data.DataLoader, not a {type(loader).__name__}")
        if loader.batch_size is None and loader.batch_sampler is None:
            raise ConfigError(
                "fastpipe.loading.recycled needs a batching DataLoader (batch_size or batch_sampler set); this one yields single samples"
            )
        slots = default_slots(loader) if slots is None else slots
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ConfigError(f"slots must be a whole number >= 1 (buffers per worker), got {slots!r}; the default is prefetch_factor + 2")
        if poison is not None and not 0 <= poison <= 255:
            raise ConfigError(f"poison must be a byte value 0..255 or None, got {poison!r}")
        self.source = loader
        self.slots = slots
        self.poison = poison
        self.registrar = registrar
        """How buffers are page-locked: None for CUDA's on CUDA; tests inject a counting fake."""
        user_collate = None if loader.collate_fn is default_collate else loader.collate_fn
        self._collate = RingCollate(user_collate, slots)
        # the user's own sampler and generator drive the batches, so sampler.set_epoch() works as on the loader wrapped
        self._inner = rebuild_loader(loader, loader.dataset, share_sampler=True, collate_fn=self._collate, pin_memory=False)
        self._maps: dict[int, dict[tuple[int, int], _Mapped]] = {}
        self._counters: list[torch.Tensor] = []
        self._events: Counter[str] = Counter()
        self._leases: LeaseBook[_Lease] = LeaseBook()
        self._graveyard: list[_Mapped] = []
        self._pinner: hostpin.HostPinner | None = None
        self._lock = threading.RLock()
        # registered buffers are unregistered when the loader is collected, whatever else happened
        self._registrations = hostpin.Registrations()
        self._finalizer = weakref.finalize(self, self._registrations.release_all)
        self._finalizer.atexit = False  # at exit the process's mappings and locks go with it
        _LIVE.add(self)

    # The wrapped loader's settings, for diagnose and for code that reads them.
    dataset = property(lambda self: self.source.dataset)
    num_workers = property(lambda self: self.source.num_workers)
    batch_size = property(lambda self: self.source.batch_size)
    pin_memory = property(lambda self: self.source.pin_memory)
    persistent_workers = property(lambda self: self.source.persistent_workers)
    collate_fn = property(lambda self: self.source.collate_fn)
    prefetch_factor = property(lambda self: self.source.prefetch_factor)
    drop_last = property(lambda self: self.source.drop_last)
    sampler = property(lambda self: self.source.sampler)
    batch_sampler = property(lambda self: self.source.batch_sampler)
    timeout = property(lambda self: self.source.timeout)
    worker_init_fn = property(lambda self: self.source.worker_init_fn)
    multiprocessing_context = property(lambda self: self.source.multiprocessing_context)
    generator = property(lambda self: self.source.generator)
    pin_memory_device = property(lambda self: self.source.pin_memory_device)

    def __len__(self) -> int:
        return len(self._inner)

    def __repr__(self) -> str:
        return f"<RecycledLoader slots={self.slots} workers={self.num_workers} batch_size={self.batch_size}>"

    def with_dataset(self, dataset: Any, **overrides: Any) -> "RecycledLoader":
        """The same recycled loader around ``dataset`` (and any DataLoader settings in ``overrides``): the diagnosis's hook.

        The copy iterates a copy of the sampler and generator, so measuring it never moves the user's.
        """
        return RecycledLoader(rebuild_loader(self.source, dataset, **overrides), self.slots, poison=self.poison, registrar=self.registrar)

    def __iter__(self) -> "RecycledIterator":
        return self.iter_for_device(None)

    def iter_for_device(self, device: Any) -> "RecycledIterator":
        """One epoch, with the ring buffers pinned for ``device``: registered on CUDA, marked pinned on sim.

        ``fastpipe.loading._pinning.pinned_iter`` calls this, so fastpipe's own loops and the prefetcher
        never copy these batches into pinned memory a second time.
        """
        return RecycledIterator(self, device)

    def stats(self) -> dict[str, Any]:
        """Counts since the loader was made: batches, slot reuses, new buffers and why, fallbacks, kept batches.

        ``fallbacks`` are batches written into a fresh buffer because every slot was still in use
        (more ``slots`` would avoid them); ``grown`` are new buffers for batches larger than their
        slot (shapes that change); ``kept`` are batches still referred to long after the loop moved on.
        """
        totals = {name: 0 for name in COUNTERS}
        for table in self._counters:
            for name, value in zip(COUNTERS, table.sum(dim=0).tolist()):
                totals[name] += int(value)
        with self._lock:
            ring_bytes = sum(m.buffer.numel() for maps in self._maps.values() for m in maps.values())
        pinning = "none" if self._pinner is None else self._pinner.mode
        if self._pinner is not None and self._pinner.failed:
            pinning = f"copied ({self._pinner.failed})"
        return {
            **totals,
            "kept": self._events["kept"],
            "released": self._events["released"],
            "slots": self.slots,
            "workers": self.num_workers,
            "ring_bytes": ring_bytes,
            "pinning": pinning,
        }

    def close(self) -> None:
        """Stop persistent workers now, drop every mapped buffer and unregister every registered one.

        Batches you still hold stay valid; they are no longer page-locked. The loader can be iterated
        again (new workers, new buffers).
        """
        iterator = getattr(self._inner, "_iterator", None)
        if iterator is not None:
            iterator._shutdown_workers()
            self._inner._iterator = None
        with self._lock:
            for token in list(self._maps):
                self._forget(token)
            self._graveyard = []
            self._registrations.release_all()

    # -- internal: epochs, mapping, leases ---------------------------------------------------

    def _start_epoch(self, device: Any) -> tuple[Iterator[Any], int, bool]:
        inner = self._inner
        iterator = getattr(inner, "_iterator", None)
        if iterator is not None and getattr(iterator, "_shutdown", False):
            inner._iterator = None  # its persistent workers were shut down; start new ones
        if inner.num_workers == 0:  # the ring lives in this process: one for every epoch
            keeps, fresh = True, self._collate.states is None
        else:
            keeps = bool(inner.persistent_workers)
            fresh = not (keeps and inner._iterator is not None)
        if fresh:
            _, _, counters = self._collate.start(inner.num_workers)
            self._counters.append(counters)
        if self._pinner is None or self._pinner.device is not device:
            self._pinner = hostpin.HostPinner(device, bool(self.source.pin_memory), self.registrar)
        return iter(inner), self._collate.token, not keeps

    def _open(self, message: RingBatch) -> Any:
        """The batch a worker's note describes, as views into the (mapped once) buffer."""
        pinner = self._pinner
        assert pinner is not None
        with self._lock:
            message.mark_opened()
            key = (message.worker, message.slot)
            maps = self._maps.setdefault(message.token, {})
            if message.slot < 0:  # a fallback buffer: used once, never registered (pinned by a copy on CUDA)
                mapped = _Mapped(message.generation, message.buffer)  # type: ignore[arg-type]
            elif message.buffer is not None:
                old = maps.get(key)
                if old is not None:
                    self._bury(old)
                mapped = maps[key] = _Mapped(message.generation, message.buffer, pinner.register(message.buffer))
                if mapped.registered:
                    self._registrations.add(mapped.buffer, pinner.registrar)
            else:
                mapped = maps.get(key)  # type: ignore[assignment]
                if mapped is None or mapped.generation != message.generation:
                    raise RuntimeError(
                        f"fastpipe.loading.recycled: worker {message.worker} reused slot {message.slot} (generation {message.generation}) "
                        "that this process never mapped; please report this bug"
                    )
            message.buffer = None
            batch, views = open_batch(mapped.buffer, message.skeleton, message.specs)
            lease = _Lease(message.token, message.worker, message.slot, mapped, self._leases.next_serial())
            if pinner.mode == "register" and not mapped.registered:  # the copy is the pinned batch: release the slot now
                batch = map_tensors(pinner.registrar.pin_copy, batch)
                del views
                self._free(lease)
                return batch
            pinner.pin_views(views)
            self._leases.held.append(lease)
            return batch

    def _free(self, lease: _Lease) -> None:
        if lease.done:
            return
        lease.done = True
        self._events["released"] += 1
        if lease.slot < 0:
            return
        if self.poison is not None:
            lease.mapped.buffer.fill_(self.poison)  # a batch still in use would now show it
        table = STATE_TABLES.get(lease.token)
        if table is not None:
            table[lease.worker, lease.slot] = FREE

    def _retire(self, lease: _Lease) -> None:
        """The user kept this batch: the buffer is theirs now; the worker gets a new one for the slot."""
        lease.done = True
        self._events["kept"] += 1
        if lease.slot < 0:
            return
        maps = self._maps.get(lease.token, {})
        if maps.get((lease.worker, lease.slot)) is lease.mapped:
            del maps[(lease.worker, lease.slot)]
            self._bury(lease.mapped)
        table = STATE_TABLES.get(lease.token)
        if table is not None:
            table[lease.worker, lease.slot] = RETIRED

    def _bury(self, mapped: _Mapped) -> None:
        """Drop the ring's hold on a buffer; a registered one is unregistered once nothing uses it."""
        if mapped.registered:
            self._graveyard.append(mapped)

    def _forget(self, token: int) -> None:
        for mapped in self._maps.pop(token, {}).values():
            self._bury(mapped)
        STATE_TABLES.pop(token, None)

    def release(self, batch: Any, after: Any = None) -> bool:
        """Give ``batch``'s slot back: now, after a CUDA event, or at a ``time.perf_counter()`` time.

        Returns False when ``batch`` is not one of this loader's batches still held.
        """
        first = next(iter_tensors(batch), None)
        if first is None:
            return False
        with self._lock:
            return self._leases.release(first, after, self._free)

    def _poll(self) -> None:
        """Release what is due (:class:`~fastpipe.loading.recycle._leases.LeaseBook`: timed and event releases, batches
        the loop has moved past; a batch kept past every worker's slots is retired), then unregister buried buffers."""
        with self._lock:
            self._leases.poll(self._fence, self.slots * max(1, self.num_workers), self._free, self._retire)
            self._sweep()

    def _sweep(self) -> None:
        """Unregister the buried buffers nothing uses any more."""
        with self._lock:
            self._graveyard = [m for m in self._graveyard if not self._unregister_if_unused(m)]

    def _fence(self) -> Any:
        """A mark after the device work queued so far (False where nothing can be queued: cpu, no device)."""
        device = None if self._pinner is None else self._pinner.device
        if device is not None and getattr(device, "kind", "cpu") != "cpu":
            return device.timeline_mark()  # a CUDA event on the current stream; the modelled queue's end on sim
        if self._pinner is not None and self._pinner.mode == "register":
            return self._pinner.registrar.fence()
        return False

    def _unregister_if_unused(self, mapped: _Mapped) -> bool:
        if hostpin.storage_refs(mapped.buffer) > OWN_REFS:
            return False
        self._registrations.unregister(mapped.buffer)
        return True


class RecycledIterator(Iterator[Any]):
    """One epoch of a :class:`RecycledLoader`. ``close()`` stops the workers (persistent ones too)."""

    def __init__(self, owner: RecycledLoader, device: Any) -> None:
        self._owner = owner
        self._source, self._token, owns_token = owner._start_epoch(device)
        # Without persistent workers each epoch has its own workers and buffers: drop them with it.
        self._finalizer = weakref.finalize(self, owner._forget, self._token) if owns_token else None

    def __iter__(self) -> "RecycledIterator":
        return self

    def __next__(self) -> Any:
        self._owner._poll()
        return self._owner._open(next(self._source))

    def release(self, batch: Any, after: Any = None) -> bool:
        """See :meth:`RecycledLoader.release`."""
        return self._owner.release(batch, after)

    def close(self) -> None:
        """Stop this epoch's workers now (a persistent loader starts new ones on its next epoch)."""
        shutdown = getattr(self._source, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        inner = self._owner._inner
        if getattr(inner, "_iterator", None) is self._source:
            inner._iterator = None
        with self._owner._lock:
            self._owner._forget(self._token)
            self._owner._sweep()  # what no batch of yours still uses is unregistered now
        if self._finalizer is not None:
            self._finalizer.detach()


def release(batch: Any, after: Any = None) -> bool:
    """Hand a recycled batch's buffer back to its worker now (or after a CUDA event / perf_counter time).

    Call it when the batch is no longer needed, e.g. after ``torch.cuda.current_stream().synchronize()``
    or with ``after=event`` recorded after your copy. Returns False for a batch that is not a
    held recycled batch (a plain DataLoader's, say), so it is safe to call on any batch.
    """
    return any(loader.release(batch, after) for loader in list(_LIVE))


class releasing:
    """``with releasing(batch):`` releases ``batch``'s slot when the block ends (see :func:`release`)."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def __enter__(self) -> Any:
        return self.batch

    def __exit__(self, *exc: Any) -> None:
        release(self.batch)
