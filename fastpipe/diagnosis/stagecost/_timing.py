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
@dataclass
class BatchTimings:
    """What one worker spent on one batch, per stage: ``stages[name] = [wall s, CPU s, run-queue s]`` summed over its
    samples (run-queue: time the thread was ready to run but waited for a core; 0 where the OS does not say)."""

    samples: int = 0
    stages: dict[str, list[float]] = field(default_factory=dict)
    pid: int = 0

    def add(self, name: str, wall: float, cpu: float, runq: float = 0.0) -> None:
        entry = self.stages.setdefault(name, [0.0, 0.0, 0.0])
        entry[0] += wall
        entry[1] += cpu
        entry[2] += runq


class _RunQueueClock:
    """Seconds this thread has spent ready to run but waiting for a core (Linux ``/proc/thread-self/schedstat``).

    Tells a stage that waits for a core on a busy machine from one that waits on I/O or a sleep: wall time is
    CPU time + run-queue time + the stage's own waiting. Reads 0.0 where the file is missing.
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


class _Ledger:
    """This process's running record of the samples fetched since the last collate.

    One per process, found through :func:`_ledger`: the dataset wrapper and the collate wrapper
    run in the same worker, one after the other, and meet here. CPU time is the calling
    thread's, so work of other threads (a worker's queue feeder thread pickling the previous
    batch, the main process's pin thread) is not charged to whichever stage happens to run; a
    stage that spreads work over threads is undercounted, which the OS cross-check shows.
    CPU spent between stages (their profiler labels) is charged to the next stage.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.cpu_clock: Callable[[], float] = time.thread_time
        self.runq_clock: Callable[[], float] = _RunQueueClock()
        self.pending = BatchTimings(pid=self.pid)
        self.sample_transform_wall = 0.0
        self.sample_transform_cpu = 0.0
        self.sample_transform_runq = 0.0
        self.cpu_mark = 0.0
        self.runq_mark = 0.0

    def start_transforms(self) -> None:
        self.cpu_mark, self.runq_mark = self.cpu_clock(), self.runq_clock()

    def on_stage(self, name: str, wall: float) -> None:
        """``TransformPipeline.timer``: the stage's wall time, plus its CPU and run-queue time since the previous mark."""
        now, runq = self.cpu_clock(), self.runq_clock()
        cpu, self.cpu_mark = now - self.cpu_mark, now
        queued, self.runq_mark = runq - self.runq_mark, runq
        self.pending.add(name, wall, cpu, queued)
        self.sample_transform_wall += wall
        self.sample_transform_cpu += cpu
        self.sample_transform_runq += queued

    def start_sample(self) -> None:
        self.sample_transform_wall = self.sample_transform_cpu = self.sample_transform_runq = 0.0

    def end_sample(self, wall: float, cpu: float, runq: float = 0.0) -> None:
        """``__getitem__`` took ``wall``/``cpu``/``runq`` in all; what the transform stages did not take is the raw load."""
        self.pending.add(
            RAW_STAGE,
            max(0.0, wall - self.sample_transform_wall),
            max(0.0, cpu - self.sample_transform_cpu),
            max(0.0, runq - self.sample_transform_runq),
        )
        self.pending.samples += 1

    def take(self) -> BatchTimings:
        taken, self.pending = self.pending, BatchTimings(pid=self.pid)
        return taken


_LEDGER: _Ledger | None = None


def _ledger() -> _Ledger:
    """This process's ledger; a forked worker starts a fresh one rather than inherit its parent's."""
    global _LEDGER
    if _LEDGER is None or _LEDGER.pid != os.getpid():
        _LEDGER = _Ledger()
    return _LEDGER


class _TimedRunner:
    """Stands in for the dataset's transform: runs the located stages with the ledger as their timer."""

    def __init__(self, pipeline: TransformPipeline) -> None:
        self.pipeline = pipeline

    def __call__(self, x: Any) -> Any:
        ledger = _ledger()
        ledger.start_transforms()
        return dataclasses.replace(self.pipeline, timer=ledger.on_stage).run(x)


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
        wall0, cpu0, runq0 = time.perf_counter(), ledger.cpu_clock(), ledger.runq_clock()
        with torch.profiler.record_function(RAW_LABEL):
            sample = read_sample(source, index)
        ledger.end_sample(time.perf_counter() - wall0, ledger.cpu_clock() - cpu0, ledger.runq_clock() - runq0)
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
            wall0, cpu0 = time.perf_counter(), ledger.cpu_clock()
            with torch.profiler.record_function(RAW_LABEL):
                try:
                    item = next(source)
                except StopIteration:
                    return
                except Exception as exc:
                    raise StageError.wrap(RAW_STAGE, exc) from exc
            ledger.end_sample(time.perf_counter() - wall0, ledger.cpu_clock() - cpu0)
            yield item


class TimedCollate:
    """The loader's collate_fn, timed; returns ``(batch, BatchTimings)`` so the timings travel with the batch."""

    def __init__(self, collate_fn: Callable[[Any], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, samples: Any) -> tuple[Any, BatchTimings]:
        ledger = _ledger()
        wall0, cpu0, runq0 = time.perf_counter(), ledger.cpu_clock(), ledger.runq_clock()
        with torch.profiler.record_function(COLLATE_LABEL):
            try:
                batch = self.collate_fn(samples)
            except Exception as exc:
                raise StageError.wrap(COLLATE_STAGE, exc) from exc
        ledger.pending.add(COLLATE_STAGE, time.perf_counter() - wall0, ledger.cpu_clock() - cpu0, ledger.runq_clock() - runq0)
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
