"""The loader's memory, measured: each worker's unique memory as it reads samples, and the shared memory its batches hold.

:func:`measure_loader_memory` iterates a rebuilt copy of the user's loader (never the user's own), with the
dataset wrapped so each worker counts the samples it reads into a small shared ledger. A background thread
samples, every ``interval_s``:

* each worker's USS (pages no other process maps) and PSS (its share of the shared ones), by the pids of this
  process's new children (read from ``/proc/PID/smaps`` as psutil's ``memory_full_info`` does, less the worker's
  batches in shared memory, counted apart), with the samples that worker had read by then;
* this process's RSS;
* the shared memory the loader's processes hold (their own segments, read from ``/proc``, so another job's use
  of ``/dev/shm`` does not count), and the filesystem's use;
* pinned host memory, where CUDA reports it.

After the first batch the loop stalls, as a training loop does on a slow step, until the workers stop reading
and the held segments stop growing: every batch in flight is then collated and waiting, which is the peak that
:mod:`~fastpipe.diagnosis.memory._shm_budget` predicts. Then the rest of the samples are read as fast as the loader goes,
the loop also taking :data:`CHECKPOINTS` samples of its own spread over them.

Growth per 1,000 samples is the least-squares slope of a worker's USS over the samples it read, fitted on its
floor: the least USS seen within each batch (a batch's transient buffers come and go; what the worker keeps
between batches is what grows), past its warm-up (its first quarter of samples and two batches: the first ones
pay for imports, first touches and allocator arenas). Forked workers share the parent's pages until they write to
them, and reading a Python object writes its reference count: a worker reading a dataset index held in lists and
dicts slowly copies all of it (:mod:`~fastpipe.diagnosis.memory._copy_on_read` names the container).

A worker's growth counts (:attr:`WorkerMemory.grows`) only when all of these hold:

* the slope is beyond :data:`GROWTH_SIGNIFICANCE` standard errors and at least :data:`GROWTH_FLOOR` per 1,000;
* the rise it fits over the samples it was fitted on is at least :data:`RISE_FLOOR` (a slope fitted on a few
  hundred samples turns a megabyte of noise into megabytes per 1,000 samples);
* it does not level off: the second half of the fitted samples rises at least :data:`SUSTAINED` times as fast as
  the first. An allocator's warm-up stops (``toy:naive``'s workers, 256-pixel raw images in batches of 32: about
  22 MB over their first 2,000 samples each, then flat to 4,500; its second half rose 0-17% as fast as its first;
  with ``MALLOC_MMAP_THRESHOLD_`` fixed the rise was gone, so it was glibc's heap settling, not copy-on-read). A leak
  grows with every sample; copy-on-read slows only as the pages already copied are read again and stops once the
  whole index is copied (the planted 200,000-record list, 10,000 samples per worker: 43-46%). A warm-up longer than
  the pass can still read as growth; then no container is named.

The loader grows (:attr:`LoaderMemory.grows`) when more than half of its workers do: copy-on-read and leaks happen
in every worker that reads the same dataset; one worker's allocator state does not make a loader grow.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from fastpipe._render import render_table
from fastpipe.diagnosis.memory._probes import (
    SHM_PATH,
    batch_nbytes,
    batch_shm_bytes,
    pinned_host_bytes,
    shm_filesystem,
    shm_segments,
)
from fastpipe.diagnosis.memory._shm_budget import (
    ShmPrediction,
    check_shm_budget,
    loader_settings,
    predict_shm,
    size_text,
)
from fastpipe.loading._rebuild import rebuild_loader

MAX_WORKERS = 256
#: A worker's growth counts when its slope is this many standard errors above zero...
GROWTH_SIGNIFICANCE = 4.0
#: ...and at least this many bytes per 1,000 samples: the resolution of a few thousand samples (decoders' and
#: allocators' warm-up reached 1.2 MB on jpeg:optimized; a list of 200k dicts read at random grows ~9 MB)...
GROWTH_FLOOR = 2 * 1024 * 1024
#: ...and the rise fitted over the samples it was fitted on is at least this many bytes...
RISE_FLOOR = 4 * 1024 * 1024
#: ...and the second half of those samples rises at least this share as fast as the first (it does not level off).
SUSTAINED = 0.25
DEFAULT_SAMPLES = 2000
#: The loop also samples itself this many times over the run, so a fast loader still gives points to fit.
CHECKPOINTS = 40
#: The stall after the first batch ends when nothing moved for this long, or after ``stall_max_s``.
SETTLE_S = 2.0


class _Counted(Dataset):
    """The user's dataset, each worker counting the samples it reads into a shared ledger (row: worker id + 1; col 0 samples, col 1 pid)."""

    def __init__(self, dataset: Any, ledger: torch.Tensor) -> None:
        self.dataset, self.ledger = dataset, ledger

    def _count(self, n: int) -> None:
        info = get_worker_info()
        row = 0 if info is None else info.id + 1
        pid = os.getpid()
        if int(self.ledger[row, 1]) != pid:  # a new process in this slot (a new epoch's workers): its own count from 0,
            self.ledger[row, 0] = 0  # so its warm-up is cut from its own samples, not the previous worker's total
            self.ledger[row, 1] = pid
        self.ledger[row, 0] += n

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Any) -> Any:
        self._count(1)
        return self.dataset[index]


class _CountedBatches(_Counted):
    """For a dataset that reads a batch at once (``__getitems__``): the fetcher keeps calling it."""

    def __getitems__(self, indices: list[Any]) -> Any:
        self._count(len(indices))
        return self.dataset.__getitems__(indices)


@dataclass
class WorkerMemory:
    """One worker's memory over the run: at the start, at the peak, and its growth with the samples it read."""

    worker: int
    pid: int
    uss_start: int
    pss_start: int
    uss_peak: int
    pss_peak: int
    samples: int
    growth_per_1000: float | None
    """Bytes of USS per 1,000 samples read (least squares); None with too few points."""
    growth_stderr: float | None
    points: list[tuple[int, int]] = field(default_factory=list, repr=False)
    """(samples read, USS) as sampled."""
    fitted_samples: int = 0
    """The samples the growth was fitted over (past the warm-up)."""
    late_ratio: float | None = None
    """The second half's slope over the first half's (None: too few points in a half to tell)."""

    @property
    def rise(self) -> float | None:
        """Bytes the fitted growth adds over the samples it was fitted on."""
        return None if self.growth_per_1000 is None else self.growth_per_1000 * self.fitted_samples / 1000

    @property
    def grows(self) -> bool:
        """Growth beyond noise, large enough to resolve, and not levelling off (the rules in the module docstring)."""
        g, se, rise = self.growth_per_1000, self.growth_stderr, self.rise
        if g is None or se is None or rise is None:
            return False
        sustained = self.late_ratio is None or self.late_ratio >= SUSTAINED
        return g >= GROWTH_FLOOR and g > GROWTH_SIGNIFICANCE * se and rise >= RISE_FLOOR and sustained

    def why_not(self) -> str | None:
        """Why this worker's growth does not count, in words; None when it does."""
        g, se, rise = self.growth_per_1000, self.growth_stderr, self.rise
        if g is None or se is None or rise is None:
            return "too few samples past its warm-up to fit"
        if g < GROWTH_FLOOR or g <= GROWTH_SIGNIFICANCE * se:
            return f"{size_text(g)} ± {size_text(se)} per 1,000 samples is within noise or under {size_text(GROWTH_FLOOR)}"
        if rise < RISE_FLOOR:
            return f"a rise of {size_text(rise)} over the {self.fitted_samples} samples fitted, under the {size_text(RISE_FLOOR)} that resolves growth"
        if self.late_ratio is not None and self.late_ratio < SUSTAINED:
            return f"it levels off (its second half rose {self.late_ratio:.0%} as fast as its first): a warm-up"
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "pid": self.pid,
            "uss_start": self.uss_start,
            "pss_start": self.pss_start,
            "uss_peak": self.uss_peak,
            "pss_peak": self.pss_peak,
            "samples": self.samples,
            "growth_per_1000_samples": self.growth_per_1000,
            "growth_stderr": self.growth_stderr,
            "fitted_samples": self.fitted_samples,
            "late_ratio": self.late_ratio,
            "grows": self.grows,
        }


@dataclass
class LoaderMemory:
    """What :func:`measure_loader_memory` found; sizes in bytes."""

    prediction: ShmPrediction
    workers: list[WorkerMemory]
    samples: int
    shm_peak: int | None
    """The loader's own shared-memory segments at their largest (None: not measured)."""
    shm_fs_used_peak: int | None
    """The filesystem's use above its level at the start (every process on the machine counts)."""
    shm_size: int | None
    shm_free: int | None
    main_rss_start: int
    main_rss_peak: int
    pinned_peak: int | None
    seconds: float
    budget_warning: str | None = None
    skipped: str | None = None
    """Why nothing was run (the budget check failed), else None."""
    settled: bool = True
    """Whether the stall after the first batch ended with every batch in flight waiting (then ``shm_peak`` is the
    peak); False when a time budget cut it short, so ``shm_peak`` is a lower bound."""

    @property
    def grows(self) -> bool:
        """More than half of the workers grow (see the module docstring)."""
        return bool(self.workers) and sum(w.grows for w in self.workers) * 2 > len(self.workers)

    @property
    def growth_per_1000(self) -> float | None:
        """The mean growth per 1,000 samples over the workers that read enough to tell."""
        known = [w.growth_per_1000 for w in self.workers if w.growth_per_1000 is not None]
        return sum(known) / len(known) if known else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "prediction": self.prediction.to_dict(),
            "workers": [w.to_dict() for w in self.workers],
            "samples": self.samples,
            "shm_peak": self.shm_peak,
            "shm_fs_used_peak": self.shm_fs_used_peak,
            "shm_size": self.shm_size,
            "shm_free": self.shm_free,
            "main_rss_start": self.main_rss_start,
            "main_rss_peak": self.main_rss_peak,
            "pinned_peak": self.pinned_peak,
            "seconds": self.seconds,
            "grows": self.grows,
            "growth_per_1000_samples": self.growth_per_1000,
            "budget_warning": self.budget_warning,
            "skipped": self.skipped,
            "settled": self.settled,
        }

    def lines(self) -> list[str]:
        p = self.prediction
        out = []
        if self.skipped:
            out.append(f"not run: {self.skipped}")
        measured = "not measured" if self.shm_peak is None else size_text(self.shm_peak)
        if self.shm_peak is not None and not self.settled:
            measured = f"at least {measured} (the stall was cut short by the time budget before every batch in flight was waiting)"
        ratio = f" ({self.shm_peak / p.shm_bytes:.0%} of the prediction)" if self.shm_peak is not None and p.shm_bytes else ""
        out.append(f"shared memory: predicted peak {size_text(p.shm_bytes)} ({p.formula()}); measured {measured}{ratio}")
        out.append(
            f"{SHM_PATH}: {size_text(self.shm_free)} free of {size_text(self.shm_size)}; its use rose by at most "
            f"{size_text(self.shm_fs_used_peak)} (all processes on the machine)"
        )
        pinned = f"{size_text(self.pinned_peak)} measured" if self.pinned_peak is not None else "not measured (no CUDA)"
        out.append(f"pinned host memory: predicted {size_text(p.pinned_bytes)}{'' if p.pin else ' (pin thread off)'}, {pinned}")
        out.append(f"training process RSS: {size_text(self.main_rss_start)} at the start, {size_text(self.main_rss_peak)} at the peak")
        growth = self.growth_per_1000
        if self.workers:
            if self.grows:
                out.append(f"worker unique memory grows with the samples read: mean {size_text(growth)} per 1,000 samples")
            else:
                growing = [w.worker for w in self.workers if w.grows]
                reasons = [f"worker {w.worker}: {w.why_not()}" for w in self.workers if not w.grows]
                majority = f"only {len(growing)} of {len(self.workers)} workers grow; " if growing else ""
                out.append(
                    f"worker unique memory: no growth that counts (mean {size_text(growth)} per 1,000 samples): {majority}"
                    + "; ".join(reasons)
                )
        if self.budget_warning:
            out.append(self.budget_warning)
        return out

    def to_table(self) -> str:
        rows = [
            (
                str(w.worker),
                str(w.pid),
                str(w.samples),
                size_text(w.uss_start),
                size_text(w.uss_peak),
                "n/a" if w.growth_per_1000 is None else f"{size_text(w.growth_per_1000)} ± {size_text(w.growth_stderr)}",
                size_text(w.pss_start),
                size_text(w.pss_peak),
            )
            for w in self.workers
        ]
        columns = [
            ("worker", "right"),
            ("pid", "right"),
            ("samples read", "right"),
            ("USS start", "right"),
            ("USS peak", "right"),
            ("USS growth / 1k samples", "right"),
            ("PSS start", "right"),
            ("PSS peak", "right"),
        ]
        return render_table(f"Loader memory ({self.samples} samples, {self.seconds:.1f} s)", columns, rows, self.lines())


def private_memory(pid: int, shm_path: str = SHM_PATH) -> tuple[int, int] | None:
    """(USS, PSS) of a process from ``/proc/PID/smaps``, leaving out its shared-memory segments.

    A worker's batch in ``/dev/shm`` counts as its private memory until the training process maps it; left in, a
    200 MB batch would swamp the growth of the worker's own heap. The batches are counted apart (:func:`shm_segments`).
    """
    uss = pss = 0
    skip = False
    try:
        with open(f"/proc/{pid}/smaps") as smaps:
            for line in smaps:
                head = line[: line.find(" ")]
                if "-" in head and not head.endswith(":"):
                    parts = line.split(None, 5)
                    skip = len(parts) == 6 and parts[5].startswith(shm_path)
                elif skip:
                    continue
                elif head in ("Private_Clean:", "Private_Dirty:"):
                    uss += int(line.split()[1]) * 1024
                elif head == "Pss:":
                    pss += int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return uss, pss


def _slope(points: list[tuple[int, int]]) -> tuple[float | None, float | None]:
    """Least-squares slope of USS over samples read, per 1,000 samples, and its standard error."""
    n = len(points)
    if n < 3 or len({x for x, _ in points}) < 3:
        return None, None
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in points)
    stderr = math.sqrt(residual / (n - 2) / sxx)
    return slope * 1000, stderr * 1000


class _Sampler:
    """The background thread: samples the workers, this process and the shared memory every ``interval_s``."""

    def __init__(self, ledger: torch.Tensor, known: set[int], interval_s: float) -> None:
        self.ledger, self.known, self.interval_s = ledger, known, interval_s
        self.me = psutil.Process()
        self.procs: dict[int, psutil.Process] = {}
        self.series: dict[int, list[tuple[int, int, int]]] = {}  # pid -> (samples read, uss, pss)
        self.shm_now = 0
        self.shm_peak = 0
        fs = shm_filesystem()
        self.fs_start = None if fs is None else fs[0] - fs[1]
        self.fs_peak: int | None = None
        self.rss_start = self.me.memory_info().rss
        self.rss_peak = self.rss_start
        self.pinned_peak = pinned_host_bytes()
        self.lock = threading.Lock()
        self._sampling = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fastpipe-loader-memory", daemon=True)

    def counts(self) -> dict[int, int]:
        """pid -> samples read, from the ledger."""
        rows = self.ledger[1:].tolist()
        return {int(pid): int(n) for n, pid in rows if pid}

    def sample(self) -> None:
        with self._sampling:  # the thread and the loop's checkpoints take turns
            self._sample()

    def _sample(self) -> None:
        try:
            for child in self.me.children():
                if child.pid not in self.known and child.pid not in self.procs:
                    self.procs[child.pid] = child
        except psutil.Error:
            pass
        counts = self.counts()
        for pid in list(self.procs):
            sizes = private_memory(pid)
            if sizes is not None:
                self.series.setdefault(pid, []).append((counts.get(pid, 0), *sizes))
        self.rss_peak = max(self.rss_peak, self.me.memory_info().rss)
        held = sum(shm_segments([self.me.pid, *self.procs]).values())
        fs = shm_filesystem()
        pinned = pinned_host_bytes()
        with self.lock:
            self.shm_now = held
            self.shm_peak = max(self.shm_peak, held)
            if fs is not None and self.fs_start is not None:
                self.fs_peak = max(self.fs_peak or 0, fs[0] - fs[1] - self.fs_start)
            if pinned is not None:
                self.pinned_peak = max(self.pinned_peak or 0, pinned)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def floors(points: list[tuple[int, int]], batch_size: int) -> list[tuple[int, int]]:
    """(first samples-read count, least USS) per batch the worker was reading: a batch's transient buffers left out."""
    least: dict[int, tuple[int, int]] = {}
    for n, uss in points:
        batch = n // max(1, batch_size)
        first, low = least.get(batch, (n, uss))
        least[batch] = (min(first, n), min(low, uss))
    return [least[b] for b in sorted(least)]


def fit_growth(points: list[tuple[int, int]], samples: int, batch_size: int) -> tuple[float | None, float | None, int, float | None]:
    """(growth per 1,000 samples, its standard error, samples fitted over, late/early slope ratio) of one worker's
    (samples read, USS) points: on the per-batch floors past the warm-up (see the module docstring)."""
    start = max(2 * batch_size, samples // 4)  # past the first batches' one-off allocations
    warm = floors([(n, uss) for n, uss in points if n >= start], batch_size)
    growth, stderr = _slope(warm)
    late_ratio = None
    if len(warm) >= 6:
        half = (warm[0][0] + warm[-1][0]) / 2
        early, late = _slope([p for p in warm if p[0] <= half])[0], _slope([p for p in warm if p[0] >= half])[0]
        if early is not None and late is not None and early > 0:
            late_ratio = late / early
    return growth, stderr, (warm[-1][0] - warm[0][0] if warm else 0), late_ratio


def _workers(sampler: _Sampler, batch_size: int) -> list[WorkerMemory]:
    counts = sampler.counts()
    rows = {int(pid): i for i, (_, pid) in enumerate(sampler.ledger[1:].tolist()) if pid}
    result = []
    for pid, series in sampler.series.items():
        if pid not in rows or not series:
            continue  # a child that never read a sample (not one of the loader's workers)
        growth, stderr, fitted, late_ratio = fit_growth([(n, uss) for n, uss, _ in series], counts.get(pid, 0), batch_size)
        result.append(
            WorkerMemory(
                worker=rows[pid],
                pid=pid,
                uss_start=series[0][1],
                pss_start=series[0][2],
                uss_peak=max(s[1] for s in series),
                pss_peak=max(s[2] for s in series),
                samples=counts.get(pid, 0),
                growth_per_1000=growth,
                growth_stderr=stderr,
                points=[(n, uss) for n, uss, _ in series],
                fitted_samples=fitted,
                late_ratio=late_ratio,
            )
        )
    return sorted(result, key=lambda w: w.worker)


def first_batch(loader: Any) -> Any:
    """One batch of ``loader`` read in this process (no workers start), to size its batches."""
    inline = rebuild_loader(loader, loader.dataset, num_workers=0, persistent_workers=False)
    iterator = iter(inline)
    try:
        return next(iterator)
    finally:
        del iterator


def measure_loader_memory(
    loader: Any,
    *,
    samples: int | None = None,
    device: Any = None,
    interval_s: float = 0.1,
    stall_max_s: float = 300.0,
    check: bool = True,
    limits: Any = None,
    on_warning: Callable[[str], None] | None = None,
    budget_s: float | None = None,
) -> LoaderMemory:
    """Measure the memory a rebuilt copy of ``loader`` takes as it reads ``samples`` samples (see the module docstring).

    Args:
        loader: the user's DataLoader (or a ``fastpipe.loading.recycled`` one); never iterated itself.
        samples: samples to read (default :data:`DEFAULT_SAMPLES`, at least the batches in flight plus two).
        device: a fastpipe Device, for a ``fastpipe.loading.recycled`` loader's ring to be pinned for it.
        interval_s: the sampling period.
        stall_max_s: the longest stall after the first batch (it ends sooner, once the workers stop reading).
        check: run :func:`~fastpipe.diagnosis.memory._shm_budget.check_shm_budget` first (on one batch read here, before any
            worker starts) and measure nothing when the loader would not fit. Without the check no batch is read
            here: the batch's size is taken from the first batch the workers deliver.
        limits: the machine's limits for the check (tests pass their own); read when None.
        on_warning: called with the budget warning as soon as it is known.
        budget_s: seconds the whole pass may take once the workers start (the stall gets at most half; reading
            stops when it is spent, with fewer samples than asked); None: no limit. A cut stall sets ``settled`` False.
    """
    if samples is not None and samples < 1:
        raise ValueError(f"samples must be >= 1. Got {samples}")
    if interval_s <= 0:
        raise ValueError(f"interval_s must be > 0. Got {interval_s}")
    if budget_s is not None and budget_s <= 0:
        raise ValueError(f"budget_s must be > 0. Got {budget_s}")
    warning = None
    prediction = None
    if check:
        batch = first_batch(loader)
        batch_bytes, float32_bytes = batch_shm_bytes(batch), batch_nbytes(batch)[1]
        del batch
        prediction = predict_shm(loader, batch_bytes)
        warning = check_shm_budget(loader, batch_bytes, float32_bytes=float32_bytes, limits=limits)
    if warning and on_warning is not None:
        on_warning(warning)
    fs = shm_filesystem() if limits is None else (limits.shm_size, limits.shm_free)
    shm_size, shm_free = fs if fs else (None, None)
    rss = psutil.Process().memory_info().rss
    if warning:
        assert prediction is not None
        return LoaderMemory(
            prediction,
            [],
            0,
            None,
            None,
            shm_size,
            shm_free,
            rss,
            rss,
            None,
            0.0,
            warning,
            skipped="the loader would not fit its shared memory; fix it first (see the warning)",
        )

    batch_size = getattr(getattr(loader, "source", loader), "batch_size", None) or 1
    workers, prefetch, slots = loader_settings(loader)
    in_flight = (max(1, workers) * slots if slots is not None else workers * prefetch + 1) + 2
    samples = max(samples or DEFAULT_SAMPLES, in_flight * batch_size)
    ledger = torch.zeros((MAX_WORKERS + 1, 2), dtype=torch.int64).share_memory_()
    dataset = loader.dataset
    if isinstance(dataset, IterableDataset):
        raise ValueError("measure_loader_memory reads map-style datasets (samples by index); an IterableDataset is not counted")
    wrapped = (_CountedBatches if hasattr(dataset, "__getitems__") else _Counted)(dataset, ledger)
    copy = rebuild_loader(loader, wrapped, timeout=120.0)
    known = {c.pid for c in psutil.Process().children()}
    sampler = _Sampler(ledger, known, interval_s)
    start = time.perf_counter()
    deadline = math.inf if budget_s is None else start + budget_s
    sampler.start()
    read = 0
    settled = True
    iterator = copy.iter_for_device(device) if device is not None and hasattr(copy, "iter_for_device") else iter(copy)
    try:
        held = next(iterator)  # the loop's batch, held through the stall
        if prediction is None:
            prediction = predict_shm(loader, batch_shm_bytes(held))
        read += batch_size
        settled = _stall(sampler, min(stall_max_s, max(0.0, deadline - time.perf_counter()) / 2))
        del held
        every = max(batch_size, samples // CHECKPOINTS)
        while read < samples and time.perf_counter() < deadline:
            try:
                next(iterator)
            except StopIteration:
                iterator = iter(copy)
                continue
            read += batch_size
            if read % every < batch_size:  # points spread over the samples however fast the loader goes
                sampler.sample()
    finally:
        sampler.stop()
        close = getattr(iterator, "close", None) or getattr(iterator, "_shutdown_workers", None)
        if close is not None:
            close()
        del iterator
    return LoaderMemory(
        prediction,
        _workers(sampler, batch_size),
        int(sum(sampler.counts().values())),
        sampler.shm_peak,
        sampler.fs_peak,
        shm_size,
        shm_free,
        sampler.rss_start,
        sampler.rss_peak,
        sampler.pinned_peak,
        time.perf_counter() - start,
        None,
        settled=settled,
    )


def _stall(sampler: _Sampler, stall_max_s: float) -> bool:
    """Hold still until the workers stop reading and the shared memory stops growing (True), or ``stall_max_s`` passes (False)."""
    deadline = time.perf_counter() + stall_max_s
    last = (-1, -1)
    quiet_since = time.perf_counter()
    while time.perf_counter() < deadline:
        time.sleep(sampler.interval_s)
        with sampler.lock:
            now = (sum(sampler.counts().values()), sampler.shm_now)
        if now != last:
            last, quiet_since = now, time.perf_counter()
        elif time.perf_counter() - quiet_since >= SETTLE_S:
            return True
    return False


def estimated_batch_bytes(loader: Any) -> tuple[int, int] | None:
    """(shared-memory bytes, float32 bytes) of one batch: one sample collated with the loader's own ``collate_fn``, times the batch size.

    Reading one sample, not a batch: a heavy pipeline (toy:naive's 256 samples of 1024-pixel float images) would take
    seconds to make a whole batch in one process. Exact for collates that stack samples (the default); None when the
    batch size is not fixed (a batch sampler) or the dataset has no index, and :func:`first_batch` decides instead.
    """
    source = getattr(loader, "source", loader)
    batch_size = getattr(source, "batch_size", None)
    dataset = loader.dataset
    if not batch_size or isinstance(dataset, IterableDataset):
        return None
    from torch.utils.data import default_collate

    collate = getattr(source, "collate_fn", None) or default_collate
    try:
        one = collate([dataset[0]])
    except Exception:  # a dataset that index 0 does not read (keyed by name, __getitems__ only): first_batch decides
        return None
    return batch_shm_bytes(one, batch_size), batch_nbytes(one)[1] * batch_size


def loader_budget_warning(loader: Any, *, limits: Any = None) -> str | None:
    """:func:`~fastpipe.diagnosis.memory._shm_budget.check_shm_budget` before any worker starts: None without workers (nothing
    goes through shared memory), else on :func:`estimated_batch_bytes` (one sample read here), or one batch read here."""
    workers, _, slots = loader_settings(loader)
    if workers == 0 and slots is None:
        return None
    sized = estimated_batch_bytes(loader)
    if sized is None:
        batch = first_batch(loader)
        sized = batch_shm_bytes(batch), batch_nbytes(batch)[1]
    batch_bytes, float32_bytes = sized
    return check_shm_budget(loader, batch_bytes, float32_bytes=float32_bytes, limits=limits)
