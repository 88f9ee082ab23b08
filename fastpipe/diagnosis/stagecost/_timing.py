"""Timing inside the DataLoader workers: the wrappers that time each stage, and the loaders built on them.

Part of :mod:`fastpipe.diagnosis.stagecost` (see its docstring for the whole method). This module holds
everything that runs in the workers or feeds the measuring loop its batches: the per-process
ledger, :class:`TimedDataset` / :class:`TimedIterableDataset` / :class:`TimedCollate`, the
loader helpers (:func:`loader_with`, :func:`timed_loader`, :func:`untimed_loader`), the tap
that strips the timings off the batches, and the OS-side sampling of the workers' CPU time.
It knows nothing of results or reports.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from fastpipe.diagnosis.discovery._pipeline import find_pipeline
from fastpipe.diagnosis.ladder._cachepoint import BASELINE
from fastpipe.diagnosis.ladder._serve import cache_point_dataset
from fastpipe.loading._pinning import shutdown_iterator
from fastpipe.loading._rebuild import rebuild_loader
from fastpipe.stages import RAW_STAGE, StageError, TransformPipeline, read_sample

COLLATE_STAGE = "collate"
RAW_LABEL, COLLATE_LABEL = f"fastpipe/{RAW_STAGE}", f"fastpipe/{COLLATE_STAGE}"


# ----- inside the workers -------------------------------------------------------------------
OVERHEAD_STAGE = "worker overhead"
"""The row for time a worker's main thread spent inside ``__getitem__`` that is no stage's own: the timing harness
between stages, and the time it was held up while another thread of the worker ran (the queue's feeder thread
pickling the previous batch into shared memory while holding the GIL)."""

Reading = tuple[float, float, float, float, float, float]
"""One reading of a thread's clocks: wall, its CPU, its run-queue time, and the other threads' busy time (their CPU
and run-queue time together), all in seconds; then its voluntary and involuntary context switches (counts)."""
ZERO: tuple[float, ...] = (0.0,) * 6


@dataclass
class BatchTimings:
    """What one worker spent on one batch, per stage: ``stages[name] = [wall s, CPU s, run-queue s, others s, voluntary
    switches, involuntary switches]`` summed over its samples (run-queue: time the thread was ready to run but waited
    for a core, 0 where the OS does not say; others: what the process's other threads ran or waited for a core in the
    same windows, see :class:`_Clocks`; switches: the thread's context switches in those windows)."""

    samples: int = 0
    stages: dict[str, list[float]] = field(default_factory=dict)
    pid: int = 0

    def add(self, name: str, wall: float, cpu: float, runq: float = 0.0, others: float = 0.0, *switches: float) -> None:
        entry = self.stages.setdefault(name, [0.0] * 6)
        for i, value in enumerate((wall, cpu, runq, others, *switches)):
            entry[i] += value


class _RunQueueClock:
    """Seconds this thread has spent ready to run but waiting for a core (Linux ``/proc/thread-self/schedstat``).

    Tells a stage that waits for a core on a busy machine from one that waits on I/O or a sleep: wall time is
    CPU time + run-queue time + the stage's own waiting. Reads 0.0 where the file is missing. (The file's first
    field, CPU time, lags a running thread by up to a scheduler tick; the CPU clock is ``time.thread_time``.)
    """

    def __init__(self) -> None:
        try:
            self.fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self.fd = None

    def __call__(self) -> float:
        if self.fd is None:
            return 0.0
        try:
            return int(os.pread(self.fd, 128, 0).split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            self.fd = None
            return 0.0


class _OtherThreads:
    """Run-queue seconds of this process's other threads, summed (``/proc/self/task/<tid>/schedstat``).

    The threads are listed again at each batch (:meth:`refresh`), not at each reading: a worker's feeder thread starts
    with its first batch and lives as long as the worker. A thread that ends between two readings leaves the sum,
    which can make one window's figure negative; the ledger clamps it.
    """

    def __init__(self) -> None:
        self.me = threading.get_native_id()
        self.fds: dict[int, int] = {}
        self.refresh()

    def refresh(self) -> None:
        try:
            tids = {int(tid) for tid in os.listdir("/proc/self/task")} - {self.me}
        except (OSError, ValueError):
            return
        for tid in set(self.fds) - tids:
            os.close(self.fds.pop(tid))
        for tid in tids - set(self.fds):
            try:
                self.fds[tid] = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
            except OSError:
                pass

    def __call__(self) -> float:
        total = 0.0
        for tid, fd in list(self.fds.items()):
            try:
                total += int(os.pread(fd, 128, 0).split()[1]) / 1e9
            except (OSError, IndexError, ValueError):
                os.close(self.fds.pop(tid))
        return total


_THREAD_USAGE = hasattr(resource, "RUSAGE_THREAD")


class _Clocks:
    """The calling thread's clocks, read together so that every window has all of them over the same span.

    A window's wall time is its CPU time, its run-queue time and the time it was blocked. Blocked time is the stage's
    own wait (I/O, a sleep, a lock held outside the process) or a wait for another thread of the same process: the
    GIL or a lock that thread holds. The second kind shows as those threads running or waiting for a core in the
    same window (``others``: the process's CPU clock less this thread's, plus their run-queue time), so
    ``min(blocked, others)`` is the most the window can have lost to them.
    """

    def __init__(self) -> None:
        self.runq = _RunQueueClock()
        self.others = _OtherThreads() if self.runq.fd is not None else None

    def read(self) -> Reading:
        """All clocks at one instant. A preemption or a block inside the reading itself (its ``pread`` lets go of the
        GIL) would put the wait's wall time in one window and its run-queue time in the next, so the reading is
        taken again until the thread's context switches are the same at its end as at its start (the run-queue
        clock moves only across a switch). It happens often: reading the CPU clock makes the kernel check the
        thread's time slice, and a thread whose slice is spent is preempted on the way back from that very call."""
        for _ in range(4):
            switches, runq = _switches(), self.runq()
            others_waiting = self.others() if self.others is not None else 0.0
            # the CPU and wall clocks last and back to back: the other threads' clocks are one read a thread, and
            # that read's length varies with the thread count, so read between them it widened one window's CPU
            # time beyond its wall time
            cpu, process, wall = time.thread_time(), time.process_time(), time.perf_counter()
            others = (process - cpu) + others_waiting
            if _switches() == switches:
                break
        return (wall, cpu, runq, others, *switches)


def _switches() -> tuple[float, float]:
    """This thread's voluntary and involuntary context switches so far (0, 0 where the OS does not count them)."""
    if not _THREAD_USAGE:
        return (0.0, 0.0)
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return (float(usage.ru_nvcsw), float(usage.ru_nivcsw))


def _since(began: Reading, ended: Reading) -> list[float]:
    return [b - a for a, b in zip(began, ended)]


class _Ledger:
    """This process's running record of the samples fetched since the last collate.

    One per process, found through :func:`_ledger`: the dataset wrapper and the collate wrapper
    run in the same worker, one after the other, and meet here. Every window is read with all clocks at both ends
    (:class:`_Clocks`): a sample's ``__getitem__`` is one window, the located transform (the runner) another inside
    it, and each transform stage one inside that. The raw load is the sample's window less the runner's; the
    runner's window less its stages' is the timing harness (the profiler labels, the ledger's own bookkeeping),
    charged to :data:`OVERHEAD_STAGE` and to no stage. CPU time is the calling thread's, so work of other threads
    (a worker's queue feeder thread pickling the previous batch, the main process's pin thread) is not charged to
    whichever stage happens to run; a stage that spreads work over threads is undercounted, which the OS
    cross-check shows.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.clocks = _Clocks()
        self.cpu_clock: Callable[[], float] = time.thread_time
        self.runq_clock: Callable[[], float] = self.clocks.runq
        self.pending = BatchTimings(pid=self.pid)
        self.sample_runner, self.sample_stages = list(ZERO), list(ZERO)

    def read(self) -> Reading:
        return self.clocks.read()

    def stage(self, name: str, began: Reading, ended: Reading) -> None:
        """A transform stage ran from ``began`` to ``ended``."""
        spent = _since(began, ended)
        self.pending.add(name, *spent)
        self.sample_stages = [a + b for a, b in zip(self.sample_stages, spent)]

    def runner(self, began: Reading, ended: Reading) -> None:
        """The located transform (all its stages and the harness around them) ran from ``began`` to ``ended``."""
        self.sample_runner = [a + b for a, b in zip(self.sample_runner, _since(began, ended))]

    def start_sample(self) -> None:
        self.sample_runner, self.sample_stages = list(ZERO), list(ZERO)

    def end_sample(self, *spent: float) -> None:
        """``__getitem__`` took ``spent`` in all (a :data:`Reading`'s difference; wall, CPU at least): what the runner
        did not take is the raw load, what the runner took beyond its stages is the harness's (:data:`OVERHEAD_STAGE`)."""
        raw = [max(0.0, t - r) for t, r in zip((*spent, *ZERO[len(spent) :]), self.sample_runner)]
        harness = [max(0.0, r - s) for r, s in zip(self.sample_runner, self.sample_stages)]
        self.pending.add(RAW_STAGE, *raw)
        if self.sample_runner[0] > 0:
            self.pending.add(OVERHEAD_STAGE, *harness)
        self.pending.samples += 1

    def take(self) -> BatchTimings:
        taken, self.pending = self.pending, BatchTimings(pid=self.pid)
        if self.clocks.others is not None:
            self.clocks.others.refresh()
        return taken


_LEDGER: _Ledger | None = None


def _ledger() -> _Ledger:
    """This process's ledger; a forked worker starts a fresh one rather than inherit its parent's."""
    global _LEDGER
    if _LEDGER is None or _LEDGER.pid != os.getpid():
        _LEDGER = _Ledger()
    return _LEDGER


class _Clocked:
    """One transform stage, its call read with all clocks at both ends (:meth:`_Ledger.stage`)."""

    def __init__(self, name: str, transform: Callable[[Any], Any]) -> None:
        self.name, self.transform = name, transform

    def __call__(self, x: Any) -> Any:
        ledger = _ledger()
        began = ledger.read()
        try:
            return self.transform(x)
        finally:
            ledger.stage(self.name, began, ledger.read())


def _clocked(pipeline: TransformPipeline) -> TransformPipeline:
    """A copy of ``pipeline`` whose stages (and its parts' stages) are :class:`_Clocked`; the user's stages are untouched."""
    stages = [dataclasses.replace(stage, transform=_Clocked(stage.name, stage.transform)) for stage in pipeline.stages]
    return dataclasses.replace(pipeline, stages=stages, parts=tuple(_clocked(part) for part in pipeline.parts), timer=None)


class _TimedRunner:
    """Stands in for the dataset's transform: runs the located stages, each clocked, inside a clocked window of its own."""

    def __init__(self, pipeline: TransformPipeline) -> None:
        self.pipeline = _clocked(pipeline)

    def __call__(self, x: Any) -> Any:
        ledger = _ledger()
        began = ledger.read()
        try:
            return self.pipeline.run(x)
        finally:
            ledger.runner(began, ledger.read())


class TimedDataset(Dataset):
    """The user's map-style dataset, each ``__getitem__`` timed by stage (see the module docstring).

    Args:
        dataset: the loader's dataset (left untouched: a shallow copy gets the timed transform).
        pipeline: its located transform, or None: then the whole ``__getitem__`` is the raw load.
    """

    def __init__(self, dataset: Any, pipeline: TransformPipeline | None) -> None:
        self.dataset, self.pipeline = dataset, pipeline
        self._timed: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_timed"] = None  # rebuilt in each worker, not pickled with it
        return state

    def __len__(self) -> int:
        return len(self.dataset)

    def _source(self) -> Any:
        if self._timed is None:
            self._timed = self.dataset if self.pipeline is None else self.pipeline.with_transform(self.dataset, _TimedRunner(self.pipeline))
        return self._timed

    def __getitem__(self, index: Any) -> Any:
        source, ledger = self._source(), _ledger()
        ledger.start_sample()
        with torch.profiler.record_function(RAW_LABEL):
            began = ledger.read()
            sample = read_sample(source, index)
            ended = ledger.read()
        ledger.end_sample(*_since(began, ended))
        return sample


class TimedIterableDataset(IterableDataset):
    """An IterableDataset, each item timed as its raw load (its transforms, if any, cannot be told apart)."""

    def __init__(self, dataset: IterableDataset) -> None:
        self.dataset = dataset

    def __iter__(self) -> Iterator[Any]:
        source = iter(self.dataset)
        while True:
            ledger = _ledger()
            ledger.start_sample()
            began = ledger.read()
            with torch.profiler.record_function(RAW_LABEL):
                try:
                    item = next(source)
                except StopIteration:
                    return
                except Exception as exc:
                    raise StageError.wrap(RAW_STAGE, exc) from exc
            ledger.end_sample(*_since(began, ledger.read()))
            yield item


class TimedCollate:
    """The loader's collate_fn, timed; returns ``(batch, BatchTimings)`` so the timings travel with the batch."""

    def __init__(self, collate_fn: Callable[[Any], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, samples: Any) -> tuple[Any, BatchTimings]:
        ledger = _ledger()
        began = ledger.read()
        with torch.profiler.record_function(COLLATE_LABEL):
            try:
                batch = self.collate_fn(samples)
            except Exception as exc:
                raise StageError.wrap(COLLATE_STAGE, exc) from exc
        ledger.pending.add(COLLATE_STAGE, *_since(began, ledger.read()))
        return batch, ledger.take()


# ----- in the main process ------------------------------------------------------------------
def loader_with(loader: DataLoader, dataset: Any, *, timeout: float | None = None, **overrides: Any) -> DataLoader:
    """A new DataLoader over ``dataset`` with ``loader``'s settings, except ``overrides`` (e.g. num_workers=3).

    Built by :func:`fastpipe.loading._rebuild.rebuild_loader`, so it keeps exactly what a diagnosis keeps;
    DataLoader's own checks apply to the overridden values. An IterableDataset gets no sampler
    (DataLoader refuses one, even the placeholder it made for the original loader).
    """
    if isinstance(dataset, IterableDataset):
        overrides.setdefault("sampler", None)
    return rebuild_loader(loader, dataset, timeout=timeout, **overrides)


class _Tap:
    """A timed loader as the measuring loop sees it: batches without their timings, which are kept here."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        self.pin_memory = loader.pin_memory
        self.records: list[BatchTimings] = []
        self.start = 0

    def mark(self) -> None:
        """Count only the batches that arrive from now on (called when warm-up ends)."""
        self.start = len(self.records)

    def measured(self) -> list[BatchTimings]:
        return self.records[self.start :] or self.records

    def __iter__(self) -> "_TapIterator":
        return _TapIterator(self, iter(self.loader))

    def __len__(self) -> int:
        return len(self.loader)


class _TapIterator:
    def __init__(self, owner: _Tap, source: Iterator[Any]) -> None:
        self.owner, self.source = owner, source

    def __iter__(self) -> "_TapIterator":
        return self

    def __next__(self) -> Any:
        batch, timings = next(self.source)
        self.owner.records.append(timings)
        return batch

    def close(self) -> None:
        shutdown_iterator(self.source)


def timed_loader(loader: DataLoader, *, timeout: float | None = None, share_sampler: bool = False) -> tuple[DataLoader, list[str]]:
    """A loader like ``loader`` whose batches come as ``(batch, BatchTimings)``; also notes on what can be timed.

    ``share_sampler``: iterate the user's own sampler and generator (``fastpipe watch``, which iterates the copy in
    the user's stead, so ``set_epoch`` and seeding act on it as on their loader); by default copies of them
    (the diagnosis, whose passes must leave the user's untouched). See :func:`fastpipe.loading._rebuild.rebuild_loader`.
    """
    dataset, notes = loader.dataset, []
    pipeline, why_not = find_pipeline(dataset)
    if isinstance(dataset, IterableDataset):
        from fastpipe.diagnosis.ladder._stream import TimedStream

        timed: Any = TimedStream(dataset, pipeline, _ledger, _TimedRunner)
        if pipeline is None:
            notes.append(f"an IterableDataset whose stages were not found: each item is timed whole as the raw load ({why_not})")
    else:
        timed = TimedDataset(dataset, pipeline)
        if pipeline is None:
            notes.append(f"no transform stages found, so the raw load includes any transform ({why_not})")
    return loader_with(loader, timed, collate_fn=TimedCollate(loader.collate_fn), timeout=timeout, share_sampler=share_sampler), notes


def untimed_loader(loader: DataLoader, *, timeout: float | None = None) -> DataLoader:
    """The diagnosis's baseline: ``loader``'s pipeline run as is, its stages labelled but not timed."""
    pipeline, _ = find_pipeline(loader.dataset)
    dataset = loader.dataset if pipeline is None else cache_point_dataset(loader.dataset, pipeline, BASELINE)
    return loader_with(loader, dataset, timeout=timeout)
