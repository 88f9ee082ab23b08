"""Cheap memory figures for a running job: the training process's RSS, its workers' USS, free ``/dev/shm``.

Why these three: a DataLoader dies of memory in three ways (issue 24): the shared-memory filesystem fills up
("Bus error"; Docker's default ``/dev/shm`` is 64 MB), workers' private memory grows epoch after epoch
(copy-on-read of the parent's Python objects), or the training process's own memory grows (pinned buffers,
batches kept alive). RSS and a filesystem's free space are one system call each. A worker's USS (memory only
it holds, so growth from copy-on-read shows there and shared pages do not) needs psutil to read the
process's ``smaps``, a few milliseconds for a large process, so it is read on request, per summary line, never
per step. The diagnosis can call :func:`memory_snapshot` as well; nothing here starts or stops a process.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass, field
from typing import Any

SHM_PATH = "/dev/shm"


@dataclass
class MemorySnapshot:
    """Memory of this process and its child processes (a DataLoader's workers), in bytes; None when unreadable.

    Attributes:
        rss_bytes: the training process's resident set size.
        workers_uss_bytes: unique set size of each child process, by pid (empty without psutil or children).
        shm_free_bytes, shm_total_bytes: the shared-memory filesystem's free and total space.
    """

    rss_bytes: int | None = None
    workers_uss_bytes: dict[int, int] = field(default_factory=dict)
    shm_free_bytes: int | None = None
    shm_total_bytes: int | None = None

    @property
    def workers_uss_total(self) -> int:
        return sum(self.workers_uss_bytes.values())

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["workers_uss_total_bytes"] = self.workers_uss_total
        return out

    def line(self) -> str:
        """``rss 1.2 GB, workers 4 x 310 MB USS, /dev/shm 60 MB free of 64 MB`` (parts that were read)."""
        parts = []
        if self.rss_bytes is not None:
            parts.append(f"rss {_size(self.rss_bytes)}")
        if self.workers_uss_bytes:
            n = len(self.workers_uss_bytes)
            parts.append(f"workers {n} x {_size(self.workers_uss_total // n)} USS")
        if self.shm_free_bytes is not None and self.shm_total_bytes:
            parts.append(f"{SHM_PATH} {_size(self.shm_free_bytes)} free of {_size(self.shm_total_bytes)}")
        return ", ".join(parts)


def shm_usage(path: str = SHM_PATH) -> Any:
    """``shutil.disk_usage`` of the shared-memory filesystem (total, used, free), or None where there is none
    (macOS, Windows). The one reading of ``/dev/shm`` that the monitor, the diagnosis and ``tune`` share."""
    try:
        return shutil.disk_usage(path)
    except OSError:
        return None


def memory_snapshot(*, workers: bool = True, shm_path: str = SHM_PATH) -> MemorySnapshot:
    """Read the figures now. ``workers=False`` skips the per-child USS (the only part that costs milliseconds)."""
    snap = MemorySnapshot(rss_bytes=_rss())
    usage = shm_usage(shm_path)
    if usage is not None:
        snap.shm_free_bytes, snap.shm_total_bytes = usage.free, usage.total
    if workers:
        snap.workers_uss_bytes = _children_uss()
    return snap


def _rss() -> int | None:
    try:
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        try:
            import psutil  # a core dependency; /proc is only the faster path
        except ImportError:
            return None
        return int(psutil.Process().memory_info().rss)


def _children_uss() -> dict[int, int]:
    try:
        import psutil
    except ImportError:
        return {}
    out = {}
    for child in psutil.Process().children(recursive=False):
        try:
            out[child.pid] = int(child.memory_full_info().uss)
        except (psutil.Error, AttributeError):  # gone, not ours to read, or no USS on this platform
            continue
    return out


def _size(n: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
