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


def pinned_host_bytes() -> int | None:
    """Pinned host memory PyTorch's caching host allocator holds now; None without CUDA (or where the stats are missing)."""
    import torch

    if not torch.cuda.is_available():
        return None
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if stats is None:
        return None
    try:
        return int(stats().get("reserved_bytes.all.current", stats().get("allocated_bytes.all.current", 0)))
    except (RuntimeError, AttributeError):
        return None
