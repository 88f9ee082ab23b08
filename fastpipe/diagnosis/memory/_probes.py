"""Memory a loader setting holds: the shared-memory estimate, free ``/dev/shm``, and a watch of the process tree.

DataLoader workers hand every batch over through ``/dev/shm``; when it fills (64 MB by default in a container),
workers die with "Bus error". The estimate lets a sweep skip a setting that would not fit, and the watch
records what each run really took.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from typing import Any

import psutil

from fastpipe.monitor._memory import SHM_PATH, shm_usage

#: Batches in shared memory besides the ``workers x prefetch_factor`` in flight: one being pinned or consumed, one queued.
SHM_EXTRA_BATCHES = 2


def shm_estimate(batch_bytes: int, num_workers: int, prefetch_factor: int) -> int:
    """Shared memory a loader setting may hold at once: every batch in flight lives in ``/dev/shm``.

    Each worker keeps up to ``prefetch_factor`` batches outstanding, and the main process holds
    a couple more while pinning and consuming them. ``num_workers=0`` uses none.
    """
    if num_workers == 0:
        return 0
    return batch_bytes * (num_workers * prefetch_factor + SHM_EXTRA_BATCHES)


def shm_free(path: str = SHM_PATH) -> int | None:
    """Free bytes in ``/dev/shm``, or None where there is none (macOS, Windows)."""
    usage = shm_usage(path)
    return None if usage is None else usage.free


def _shm_used(path: str = SHM_PATH) -> int | None:
    usage = shm_usage(path)
    return None if usage is None else usage.used


class MemoryWatch:
    """Peak RSS of this process and its children, and peak ``/dev/shm`` use above its level at the start.

    RSS counts shared pages once per process that maps them (torch's libraries, batches in
    shared memory), so the tree's sum overstates unique memory; it is what ``top`` adds up.
    """

    def __init__(self, interval_s: float = 0.25) -> None:
        self.interval_s = interval_s
        self._root = psutil.Process()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shm_start: int | None = None
        self.rss_peak = 0
        self.shm_peak: int | None = None

    def _sample(self) -> None:
        try:
            processes = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:
            processes = [self._root]
        rss = 0
        for proc in processes:
            try:
                rss += proc.memory_info().rss
            except psutil.Error:
                continue
        self.rss_peak = max(self.rss_peak, rss)
        used = _shm_used()
        if used is not None and self._shm_start is not None:
            self.shm_peak = max(self.shm_peak or 0, used - self._shm_start)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> "MemoryWatch":
        self._shm_start = _shm_used()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="fastpipe-memory-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def shm_filesystem(path: str = SHM_PATH) -> tuple[int, int] | None:
    """(size, free bytes) of the shared-memory filesystem, or None where there is none."""
    usage = shm_usage(path)
    return None if usage is None else (usage.total, usage.free)


def shm_segments(pids: Iterable[int], path: str = SHM_PATH) -> dict[int, int]:
    """The shared-memory segments ``pids`` hold, mapped or open (batches in flight): inode -> bytes.

    Read from ``/proc/PID/maps`` and ``/proc/PID/fd``, so only these processes' segments count, not another
    job's on the same machine. PyTorch's segments are already unlinked (``... (deleted)``) and still count here.
    multiprocessing's semaphores (``sem.*``) are left out.
    """
    prefix = path.rstrip("/") + "/"
    seen: dict[int, int] = {}

    def keep(name: str) -> bool:
        return name.startswith(prefix) and not name[len(prefix) :].startswith("sem.")

    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            fds = []
        for fd in fds:
            try:
                if keep(os.readlink(f"/proc/{pid}/fd/{fd}")):
                    stat = os.stat(f"/proc/{pid}/fd/{fd}")
                    seen[stat.st_ino] = max(seen.get(stat.st_ino, 0), stat.st_size)
            except OSError:
                continue
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    parts = line.split(None, 5)
                    if len(parts) == 6 and keep(parts[5]):
                        start, end = (int(x, 16) for x in parts[0].split("-"))
                        inode = int(parts[4])
                        seen[inode] = max(seen.get(inode, 0), end - start)
        except OSError:
            continue
    return seen


def batch_nbytes(batch: Any) -> tuple[int, int]:
    """(bytes of every tensor and array in ``batch``, of those the float32 ones)."""
    import numpy as np
    import torch

    if isinstance(batch, torch.Tensor):
        n = batch.numel() * batch.element_size()
        return n, n if batch.dtype == torch.float32 else 0
    if isinstance(batch, np.ndarray):
        return batch.nbytes, batch.nbytes if batch.dtype == np.float32 else 0
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        parts = [batch_nbytes(item) for item in batch]
        return sum(p[0] for p in parts), sum(p[1] for p in parts)
    return 0, 0


#: Shared memory is handed out in whole pages.
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _tensor_sizes(batch: Any) -> list[int]:
    import numpy as np
    import torch

    if isinstance(batch, torch.Tensor):
        return [batch.numel() * batch.element_size()]
    if isinstance(batch, np.ndarray):
        return [batch.nbytes]
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        return [n for item in batch for n in _tensor_sizes(item)]
    return []


def batch_shm_bytes(batch: Any, scale: int = 1) -> int:
    """Bytes ``batch`` takes in shared memory, each tensor scaled by ``scale`` (a one-sample batch times the batch size).

    Each tensor a worker hands over is its own segment, in whole pages: a batch of 32 int64 triples (768 bytes)
    holds 4 kB, five times its bytes; a batch of images rounds by less than a page per tensor.
    """
    return sum(-(-n * scale // PAGE) * PAGE for n in _tensor_sizes(batch))


#: The host-allocator statistics read, first found wins: bytes of pinned blocks the allocator owns (handed out and
#: cached). torch >= 2.6 flattens them as ``allocated_bytes.current``; the ``.all.`` and ``reserved_`` spellings
#: are those of the device allocator's statistics, kept in case a version names the host ones alike.
HOST_STAT_KEYS = ("allocated_bytes.current", "allocated_bytes.all.current", "reserved_bytes.all.current", "reserved_bytes.current")


def _cuda_present() -> bool:
    import torch

    return torch.cuda.is_available()


def _host_allocator_stats() -> dict[str, Any] | None:
    """PyTorch's caching host (pinned) allocator statistics, flattened; None where this torch has none.

    ``torch.cuda.host_memory_stats()`` answers ``{}`` until Python's CUDA state is initialised, but the
    allocator serves ``pin_memory()`` (a DataLoader's pin thread) before that can happen, so the C
    accessor behind it is asked directly where it exists.
    """
    import torch

    nested = getattr(torch._C, "_cuda_hostMemoryStats", None)
    if nested is not None:
        try:
            return dict(flatten_stats(nested()))
        except RuntimeError:
            pass
    public = getattr(torch.cuda, "host_memory_stats", None)
    if public is None:
        return None
    try:
        return dict(public())
    except (RuntimeError, AttributeError):
        return None


def flatten_stats(stats: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    """``{"allocated_bytes": {"current": 5}}`` as ``("allocated_bytes.current", 5)``, as torch.cuda's own flattening does."""
    if isinstance(stats, dict):
        for key, value in stats.items():
            yield from flatten_stats(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, stats


def host_allocator_bytes(stats: dict[str, Any] | None) -> int | None:
    """Pinned bytes the caching host allocator owns, from its flattened statistics; None when no known key is there."""
    if not stats:
        return None
    for key in HOST_STAT_KEYS:
        value = stats.get(key)
        if isinstance(value, (int, float)):
            return int(value)
    return None


def pinned_host_bytes() -> int | None:
    """Page-locked host memory this process holds now: PyTorch's pinned blocks plus fastpipe's registered buffers.

    Two sources, because neither sees the other: the caching host allocator's statistics count every
    ``pin_memory()`` copy (a DataLoader's pin thread, a prefetcher pinning pageable batches), cached blocks
    included (it keeps them for reuse, so this is what the process holds, not what one batch needs);
    ``cudaHostRegister`` on memory fastpipe.loading.recycled mapped itself is counted by fastpipe
    (:func:`fastpipe.loading.recycle._hostpin.registered_bytes`). None without CUDA, or when neither
    source answers.
    """
    if not _cuda_present():
        return None
    from fastpipe.loading.recycle._hostpin import registered_bytes

    allocator = host_allocator_bytes(_host_allocator_stats())
    registered = registered_bytes()
    if allocator is None and not registered:
        return None
    return (allocator or 0) + registered
