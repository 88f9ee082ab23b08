"""``ThreadLoader``: a DataLoader for image folders that decodes whole batches with threads, in one process.

Why: the decode-and-crop op is C++ that runs without the GIL, yet a DataLoader spends about a
quarter of each core around it (per-sample Python, collate, pickling into shared memory, pinning)
and keeps a copy of the dataset per worker. Here a reading thread reads the files and draws the
crops while native threads decode each batch straight into a reused (pinned, for CUDA) buffer:
no collate, no copy between processes, one copy of the dataset, no ``/dev/shm``.

    loader = ThreadLoader(fastpipe.datasets.ImageFolder(root, size=224), batch_size=256, shuffle=True, threads=8)
    for images, labels in DevicePrefetcher(loader, "cuda"):    # uint8 (256, 3, 224, 224), int64 (256,)
        ...

Same batches as ``DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, drop_last,
generator)``: the indices come from a DataLoader built with exactly those arguments, so the order,
``len()``, ``drop_last``, a seeded ``generator``, a ``DistributedSampler`` and its ``set_epoch``
are the DataLoader's, and so is the global RNG it consumes per epoch. The boxes and flips follow
the dataset's ``RandomResizedCrop`` and flip settings with torchvision's rule, drawn from a
generator seeded by the epoch's seed (:mod:`fastpipe.datasets._draws`): the same distribution,
other boxes than worker processes would draw. Non-JPEG files are decoded by PIL; damaged files
follow the dataset's ``on_error``. Batch memory is reused as :func:`fastpipe.loading.recycled` reuses it
(see :mod:`fastpipe.datasets._thread_ring`).

The fast path applies when the dataset is fastpipe's :class:`~fastpipe.datasets.ImageFolder` (or
``DatasetFolder``, its ``__getitem__`` not overridden) whose ``fast_path`` absorbed the whole
transform into a ``DecodeCrop`` (``size=...``, or ``Compose([RandomResizedCrop, RandomHorizontalFlip,
PILToTensor])``), with no ``target_transform``. Any other dataset (a transform with more after the crop,
any other map-style dataset) is served generically: ``dataset[i]`` and ``default_collate`` in the loop's
own thread, under a copy of the global RNG seeded per batch from the epoch's seed, so random transforms
give the same batches under the same ``torch.manual_seed`` (threads sharing the global RNG would not).
That is how the diagnosis's cache points reach it (:meth:`with_dataset`).

One epoch is live at a time, as the loader's buffers are shared: ``iter()`` again closes the previous
iterator (its ``next()`` then raises :class:`~fastpipe.datasets._thread_epoch.EpochClosedError`), and so
does :meth:`ThreadLoader.close`. Dropping the iterator stops its threads too (the loader holds it weakly).
"""

from __future__ import annotations

import copy
import itertools
import weakref
from collections import Counter
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, Sampler

from fastpipe.datasets._thread_epoch import Plan, ThreadEpoch
from fastpipe.datasets._thread_ring import BufferRing
from fastpipe.datasets.crop import DecodeCrop
from fastpipe.datasets.folder import DatasetFolder
from fastpipe.errors import ConfigError
from fastpipe.loading.recycle import register_releaser
from fastpipe.ops.jpeg_batch import MAX_THREADS

#: Why the per-stage cache points do not apply: the diagnosis reads it (StagesOutsideWorkers).
UNSUPPORTED_POINT_REASON = "the ThreadLoader decodes whole batches in threads, outside any DataLoader worker"
#: Why the sample point does not apply on the fast path (BatchesWhole).
BATCHES_WHOLE_REASON = (
    "the ThreadLoader decodes whole batches straight into their buffers, with no per-sample step and no collate: cached "
    "samples would be indexed and collated in the loop's thread, a path it never runs; its stage costs (read, decode, "
    "hand-over) come from its own clocks instead"
)


def _as_list(indices: list[int]) -> list[int]:
    return list(indices)


def _whole(name: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ConfigError(f"`{name}` must be an int {bound}. Got {value!r}.")
    return value


class ThreadLoader:
    """Batches ``[uint8 (N, 3, H, W), int64 (N,)]`` of a :class:`fastpipe.datasets.ImageFolder`, decoded by threads.

    Args:
        dataset: a :class:`fastpipe.datasets.ImageFolder` (the fast path), or any map-style dataset (served generically).
        batch_size, shuffle, sampler, batch_sampler, drop_last, generator: as ``torch.utils.data.DataLoader``'s.
        collate_fn: as DataLoader's (None: ``default_collate``), run in the loop's thread on each batch's samples; on the
            fast path a batch decoded whole is split into ``(image, label)`` samples for it, so a collate that mixes
            samples (mixup, cutmix) sees what it would see from a DataLoader over the same dataset.
        threads: native threads decoding at once (the cores to give the loader); from 2 on, two decoding threads
            share them, each decoding its own batch, so the cores stay busy between batches (a batch decoded while
            the other decoding thread waits has half of them: throughput is the same, one batch's latency longer).
        prefetch: batches read ahead, and batches decoded ahead, of the loop.
        slots: reused batch buffers (default ``prefetch + 3``: up to ``prefetch + 1`` decoded or being written ahead
            of the loop, and two in the loop's hands).
        pin_memory: page-lock the buffers when CUDA is available (as DataLoader's ``pin_memory``).
    """

    num_workers = 0  # no worker processes: the diagnosis times the loader as one
    persistent_workers = False
    prefetch_factor = None
    timeout = 0
    worker_init_fn = None
    multiprocessing_context = None
    pin_memory_device = ""

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: "Sampler[int] | None" = None,
        batch_sampler: Any = None,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
        *,
        threads: int = 2,
        prefetch: int = 2,
        slots: int | None = None,
        pin_memory: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        if batch_size is None and batch_sampler is None:
            raise ConfigError("ThreadLoader decodes whole batches: give batch_size (or a batch_sampler)")
        self.dataset = dataset
        self.threads = _whole("threads", threads, 1, MAX_THREADS)
        self.prefetch = _whole("prefetch", prefetch, 1)
        self.slots = _whole("slots", prefetch + 3 if slots is None else slots, 1)
        self.pin_memory = bool(pin_memory)
        if collate_fn is not None and not callable(collate_fn):
            raise ConfigError(f"`collate_fn` must be callable (or None for default_collate). Got {collate_fn!r}.")
        self.collate_fn = collate_fn
        self._indices = DataLoader(
            range(len(dataset)),
            batch_size=batch_size if batch_sampler is None else 1,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            drop_last=drop_last,
            generator=generator,
            collate_fn=_as_list,
        )
        self._counters: Counter[str] = Counter()
        self._ring: BufferRing | None = None
        self._epoch: weakref.ReferenceType[ThreadEpoch] | None = None  # weak: dropping the iterator stops its threads
        register_releaser(self)  # fastpipe.loading.release(batch) and releasing(batch) ask every live loader, recycled ones and this

    # The DataLoader settings, for code (and the diagnosis) that reads them.
    batch_size = property(lambda self: self._indices.batch_size)
    drop_last = property(lambda self: self._indices.drop_last)
    sampler = property(lambda self: self._indices.sampler)
    batch_sampler = property(lambda self: self._indices.batch_sampler)
    generator = property(lambda self: self._indices.generator)

    @property
    def unsupported_point_reason(self) -> str:
        """The diagnosis measures the device, host, sample and baseline points only (its StagesOutsideWorkers hook)."""
        return UNSUPPORTED_POINT_REASON

    @property
    def batches_whole(self) -> str | None:
        """Why the diagnosis leaves out the sample point (its BatchesWhole hook): on the fast path no sample exists apart
        from its batch, and cached samples would be indexed and collated in the loop's thread, a path this loader never
        runs (it would read slower than the loader itself and name a collate that does not exist). None on the generic
        path, which does run ``dataset[i]`` and ``default_collate`` in the loop's thread."""
        return BATCHES_WHOLE_REASON if self.fast() else None

    def __len__(self) -> int:
        return len(self._indices)

    def __repr__(self) -> str:
        return (
            f"ThreadLoader({type(self.dataset).__name__}, batch_size={self.batch_size}, threads={self.threads}, prefetch={self.prefetch})"
        )

    def with_dataset(self, dataset: Any, **overrides: Any) -> "ThreadLoader":
        """A loader like this one over ``dataset`` (the diagnosis's hook); its sampler and generator are copies, so
        iterating it leaves this one's untouched. ``overrides``: ``threads``, ``prefetch``, ``slots``, ``pin_memory``,
        ``collate_fn`` (None: ``default_collate``), and the DataLoader names callers such as ``fastpipe tune`` pass: ``num_workers`` (> 0: that many threads;
        0: this loader's own ``threads``) and ``prefetch_factor`` (None: this loader's ``prefetch``; else batches
        read ahead)."""
        settings = dict(
            threads=self.threads, prefetch=self.prefetch, slots=self.slots, pin_memory=self.pin_memory, collate_fn=self.collate_fn
        )
        overrides = dict(overrides)
        workers = overrides.pop("num_workers", 0)
        if workers:
            overrides.setdefault("threads", min(_whole("num_workers", workers, 0), MAX_THREADS))
        factor = overrides.pop("prefetch_factor", None)
        if factor is not None:
            overrides.setdefault("prefetch", _whole("prefetch_factor", factor, 1))
        unknown = set(overrides) - set(settings)
        if unknown:
            raise ConfigError(
                f"ThreadLoader.with_dataset cannot change {sorted(unknown)}; it takes {sorted(settings)}, num_workers and prefetch_factor"
            )
        settings.update(overrides)
        custom_batches = self._indices.batch_size is None
        memo = {id(self.dataset): self.dataset, id(dataset): dataset}  # a sampler's dataset is shared, not copied

        def own(value: Any) -> Any:
            return copy.deepcopy(value, dict(memo))

        return ThreadLoader(
            dataset,
            batch_size=None if custom_batches else self.batch_size,
            shuffle=None,
            sampler=None if custom_batches else own(self.sampler),
            batch_sampler=own(self.batch_sampler) if custom_batches else None,
            drop_last=self.drop_last,
            generator=own(self.generator),
            **settings,
        )

    # ----- epochs -------------------------------------------------------------------------
    def __iter__(self) -> ThreadEpoch:
        return self.iter_for_device(None)

    def iter_for_device(self, device: Any) -> ThreadEpoch:
        """One epoch for ``device`` (a fastpipe Device, or None): buffers pinned on CUDA, marked pinned on ``sim``.

        The prefetcher's hook (PinsForDevice): a batch it copies goes back to the ring once the copy is done.
        """
        previous = self._epoch() if self._epoch is not None else None
        if previous is not None:  # one live epoch: the ring's buffers are shared
            previous.close("because iter() was called again on its ThreadLoader")
        indices = iter(self._indices)  # draws the epoch's seed as a DataLoader does, from its generator
        seed = int(getattr(indices, "_base_seed", 0))
        first = next(indices, None)  # the sampler's own draws (RandomSampler's permutation) in this thread
        batches = iter(()) if first is None else itertools.chain([first], indices)
        epoch = ThreadEpoch(self._plan(device), batches, seed)
        self._epoch = weakref.ref(epoch)
        return epoch

    def fast(self) -> bool:
        """Whether batches are decoded by the batch op into the ring (else ``dataset[i]`` and collate, see the module doc).

        Only when the result is exactly what ``dataset[i]`` gives: fastpipe's ``DatasetFolder.__getitem__`` (not a
        subclass's override), a ``DecodeCrop`` that absorbed the whole transform, and no ``target_transform``.
        """
        dataset = self.dataset
        fast_path = getattr(dataset, "fast_path", None)
        return (
            isinstance(dataset, DatasetFolder)
            and type(dataset).__getitem__ is DatasetFolder.__getitem__
            and fast_path is not None
            and isinstance(fast_path.decode, DecodeCrop)
            and len(fast_path.rest) == 0
            and isinstance(getattr(dataset, "samples", None), list)
            and dataset.target_transform is None
        )

    def _plan(self, device: Any) -> Plan:
        kind = getattr(device, "kind", None)
        decode = getattr(self.dataset, "decode", None)
        fast = self.fast()
        pin = self.pin_memory and kind in (None, "cuda") and torch.cuda.is_available()
        ring = None
        if fast:
            # a custom batch sampler: sized from the batches it makes, as they come (take() grows the ring)
            batch = self.batch_size or (self._ring.batch_size if self._ring is not None else 1)
            if self._ring is None or self._ring.pin != pin or self._ring.batch_size < batch or self._ring.size != decode.size:
                self._ring = BufferRing(self.slots, batch, decode.size, pin)
            ring = self._ring
        return Plan(
            samples=self.dataset.samples if fast else None,
            dataset=self.dataset,
            size=decode.size if fast else (0, 0),
            scale=decode.scale if fast else (0.0, 0.0),
            ratio=decode.ratio if fast else (0.0, 0.0),
            hflip=decode.hflip if fast else 0.0,
            threads=self.threads,
            prefetch=self.prefetch,
            on_error=str(getattr(self.dataset, "on_error", "raise")),
            ring=ring,
            counters=self._counters,
            fence=_fence_for(device, pin),
            mark=device.mark_pinned if kind == "sim" and self.pin_memory else None,
            collate=self.collate_fn,
        )

    def release(self, batch: Any, after: Any = None) -> bool:
        """Give ``batch``'s buffer back to the ring now, after a CUDA event, or at a ``time.perf_counter()`` time.

        As ``fastpipe.loading.release`` for recycled batches: call it once the batch is no longer needed (e.g. with
        ``after=event`` recorded after your copy). False for a batch that is not one of this loader's held batches.
        """
        first = batch[0] if isinstance(batch, (list, tuple)) and batch else batch
        return self._ring is not None and isinstance(first, torch.Tensor) and self._ring.release(first, after)

    def stage_clocks(self) -> dict[str, Any]:
        """Running totals of each stage since the loader was made (the diagnosis's ``TimesOwnStages`` hook: it takes
        their difference over the baseline point's timed steps and reports it as this loader's stage costs).

        The fast path runs a reading thread, one or two decoding threads and the loop's thread. The reading thread reads
        the files (``read``), then their headers' sizes and the crop draws (``draw``); the decoding threads run the batch
        op (``decode``: its native threads' seconds over the most that can decode at once, ``threads`` unless batches
        are smaller: the time it takes of that many cores; ``busy_seconds`` is the wall time either decoding thread was
        in it); the loop's own thread gives back the buffers it moved past and makes each batch's views
        (``hand-over``), and waits in ``next()`` for a decoded batch (``wait``). Read, draw, hand-over and wait are wall
        times of the thread named. The generic path runs ``dataset[i]`` and ``default_collate`` in the loop's thread.
        """
        self._flush_clocks()
        c = self._counters
        if not self.fast():
            stages = [
                _clock(
                    "load + collate",
                    "loop thread",
                    "dataset[i] and default_collate",
                    c,
                    "decode_s",
                    "images",
                    "decode_batches",
                    "decode_threads",
                )
            ]
        else:
            stages = [
                _clock("read", "reading thread", "file reads", c, "read_s", "read_images", "read_batches", "read_batches"),
                _clock("draw", "reading thread", "header sizes and crop draws", c, "draw_s", "read_images", "read_batches", "read_batches"),
                {
                    **_clock(
                        "decode",
                        "decoding threads" if self.threads > 1 else "decoding thread",
                        "the batch decode op",
                        c,
                        "decode_s",
                        "images",
                        "decode_batches",
                        "decode_threads",
                    ),
                    "busy_seconds": float(c["decode_busy_s"]),
                },
                _clock(
                    "hand-over",
                    "loop thread",
                    "ring views and buffer release",
                    c,
                    "handover_s",
                    "handed_images",
                    "handed_batches",
                    "handed_batches",
                ),
                _clock("wait", "loop thread", "blocked in next() for a decoded batch", c, "wait_s", "handed_images", "waits", "waits"),
            ]
        return {"stages": stages, "images": int(c["handed_images"]), "batches": int(c["handed_batches"])}

    def _flush_clocks(self) -> None:
        epoch = self._epoch() if self._epoch is not None else None
        if epoch is not None:
            epoch.flush_clocks()

    def close(self) -> None:
        """Stop the current epoch's threads (joined, a few seconds at most) and give its queued buffers back."""
        epoch = self._epoch() if self._epoch is not None else None
        if epoch is not None:
            epoch.close("by ThreadLoader.close()")

    def stats(self) -> dict[str, Any]:
        """Counts and times since the loader was made (the diagnosis puts them in its report: ReportsStats).

        ``read_ms``, ``draw_ms`` and ``decode_ms`` are per image (reading files, header sizes and
        box draws, the batch decode's native threads' time over ``threads``); ``handover_ms`` and ``wait_ms`` per batch (making
        the batch's views; the loop blocked in ``next()`` waiting for a batch).
        """
        self._flush_clocks()
        c = self._counters
        ring = self._ring.events if self._ring is not None else Counter()
        images, batches = max(c["images"], 1), max(ring["batches"], 1)
        return {
            "batches": ring["batches"],
            "reused": ring["reused"],
            "fallbacks": ring["fallbacks"],
            "grown": ring["grown"],
            "kept": ring["kept"],
            "released": ring["released"],
            "slots": self.slots,
            "workers": 0,
            "ring_bytes": 0 if self._ring is None else self._ring.ring_bytes,
            "pinning": "page-locked buffers" if self._ring is not None and self._ring.pin else "none",
            "threads": self.threads,
            "skipped": int(c["skipped"]),
            "read_ms": 1e3 * c["read_s"] / images,
            "draw_ms": 1e3 * c["draw_s"] / images,
            "decode_ms": 1e3 * c["decode_s"] / images,
            "handover_ms": 1e3 * c["handover_s"] / batches,
            "wait_ms": 1e3 * c["wait_s"] / batches,
        }


def _clock(
    stage: str, thread: str, what: str, counters: Counter[str], seconds: str, items: str, calls: str, threads: str
) -> dict[str, Any]:
    """One ``StageClock`` (``fastpipe.loading.StageClock``) from the loader's counters, named by their keys."""
    return {
        "stage": stage,
        "thread": thread,
        "what": what,
        "seconds": float(counters[seconds]),
        "items": int(counters[items]),
        "calls": int(counters[calls]),
        "threads": int(counters[threads]),
    }


def _fence_for(device: Any, pinned: bool) -> Any:
    """What ``poll`` waits on before reusing a batch the loop moved past: the device's queue so far, or nothing."""
    kind = getattr(device, "kind", None)
    if kind in ("cuda", "sim"):
        return device.timeline_mark
    if kind is None and pinned:  # a plain loop on a CUDA machine may have queued a non_blocking copy of it

        def event() -> Any:
            mark = torch.cuda.Event()
            mark.record()
            return mark

        return event
    return lambda: False
