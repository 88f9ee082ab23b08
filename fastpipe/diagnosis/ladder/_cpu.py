"""The one CPU sampler: CPU time of this process and its descendants (DataLoader workers), in a thread.

Every measurement in fastpipe (diagnosis points, stage costs, the tuner) reads CPU use through
:class:`CpuMonitor`, so "CPU" means the same thing in every report.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from fastpipe._system import usable_cores


class CpuMonitor:
    """Samples the CPU time of a process and all its descendants in a background thread.

    Descendants come and go (DataLoader workers die with their iterator), so each pid's
    latest CPU time is remembered; pids seen first inside the window count from zero.
    """

    def __init__(self, interval_s: float = 0.1, cores: int | None = None) -> None:
        try:  # imported here so fastpipe still measures throughput where psutil is missing
            import psutil
        except ImportError:
            psutil = None
        self._psutil = psutil
        self.interval_s = interval_s
        self.cores = cores or usable_cores()
        self._root = psutil.Process() if psutil is not None else None
        self._baseline: dict[int, float] = {}
        self._latest: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wall_start = 0.0
        self._wall = 0.0
        self.children_seconds = math.nan if psutil is None else 0.0
        """CPU seconds of the descendants alone (the DataLoader workers) over the window."""
        self.cpu_util = math.nan if psutil is None else 0.0
        self.system_cpu_util = math.nan if psutil is None else 0.0

    def _sample(self) -> dict[int, float]:
        seen: dict[int, float] = {}
        try:
            processes = [self._root, *self._root.children(recursive=True)]
        except self._psutil.Error:
            processes = [self._root]
        for proc in processes:
            try:
                times = proc.cpu_times()
                seen[proc.pid] = times.user + times.system
            except self._psutil.Error:
                continue  # exited between listing and reading
        return seen

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._latest.update(self._sample())

    def __enter__(self) -> "CpuMonitor":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        if self._psutil is None:
            return
        self._baseline = self._sample()
        self._latest = dict(self._baseline)
        self._system_start = self._psutil.cpu_times()  # the machine's own counters: no shared state with other monitors
        self._wall_start = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="fastpipe-cpu-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._psutil is None or self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._latest.update(self._sample())
        self._wall = time.perf_counter() - self._wall_start
        used = sum(cpu - self._baseline.get(pid, 0.0) for pid, cpu in self._latest.items())
        own = self._root.pid
        self.children_seconds = sum(cpu - self._baseline.get(pid, 0.0) for pid, cpu in self._latest.items() if pid != own)
        self.cpu_util = max(0.0, used / (self._wall * self.cores)) if self._wall > 0 else 0.0
        self.system_cpu_util = _busy_share(self._system_start, self._psutil.cpu_times())


def _busy_share(start: Any, end: Any) -> float:
    """Share of the machine's CPU time that was busy (not idle or waiting on I/O) between two psutil.cpu_times()."""
    total = sum(end) - sum(start)
    idle = (end.idle - start.idle) + (getattr(end, "iowait", 0.0) - getattr(start, "iowait", 0.0))
    return max(0.0, min(1.0, 1 - idle / total)) if total > 0 else 0.0
