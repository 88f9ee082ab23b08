"""Steady-state throughput of a training loop: warm-up, per-step times, spread, CPU load.

Throughput is 1 / mean step time over the measured steps, after warm-up steps that absorb
worker start-up and the first batches (toy_workload.md: "the mean of per-step times after
the first step"). CPU utilisation of the whole process tree (the main process and its
DataLoader workers) is sampled alongside, so a saturated CPU shows in every result.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from fastpipe.devices import Device
from fastpipe.diagnosis.ladder._cpu import CpuMonitor
from fastpipe.diagnosis.ladder._noise import rel_stderr
from fastpipe.loading._pinning import forget_dead_iterator, pinned_iter, shutdown_iterator
from fastpipe.workloads._workload import Workload


@dataclass
class Measurement:
    """Per-step wall times of one measured run, with the CPU load while it ran."""

    step_times: list[float]
    cpu_util: float
    """Process-tree CPU seconds / (wall seconds x usable cores), 0..1: 1.0 means every core was busy."""
    system_cpu_util: float
    """The whole machine's CPU utilisation over the run, 0..1 (other users of a shared machine show here)."""

    @property
    def mean_step_s(self) -> float:
        return statistics.fmean(self.step_times)

    @property
    def steps_per_s(self) -> float:
        return 1.0 / self.mean_step_s

    @property
    def spread(self) -> float:
        """Relative standard deviation of step times (0.1 = steps vary by 10%)."""
        if len(self.step_times) < 2:
            return 0.0
        return statistics.stdev(self.step_times) / self.mean_step_s

    round_size: int = 1
    """Steps per round of workers. Batches from N workers arrive in bursts (a long wait, then N-1
    short ones), so single step times swing widely while whole rounds stay steady."""

    @property
    def rel_stderr(self) -> float:
        """Relative standard error of the mean step time, from whole rounds when there are several."""
        return rel_stderr(self.step_times, self.round_size)


class LoaderCycle:
    """Endless batches from a DataLoader, starting a new epoch when one ends, as training does.

    With ``device`` given, batches are pinned the way the loader would pin them for that
    device (see :mod:`fastpipe.loading._pinning`).
    """

    def __init__(self, loader: Iterable[Any], device: Device | None = None) -> None:
        self.loader = loader
        self.device = device
        self._iterator: Iterator[Any] | None = None

    def _start(self) -> Iterator[Any]:
        return iter(self.loader) if self.device is None else pinned_iter(self.loader, self.device)

    def __next__(self) -> Any:
        if self._iterator is None:
            self._iterator = self._start()
        try:
            return next(self._iterator)
        except StopIteration:
            if not _persistent(self.loader):  # persistent workers carry on into the next epoch
                self.close()
            self._iterator = self._start()
            return next(self._iterator)  # an empty loader raises StopIteration here, on purpose

    def __iter__(self) -> "LoaderCycle":
        return self

    def close(self) -> None:
        """Shut the workers down now rather than whenever the iterator is collected."""
        iterator, self._iterator = self._iterator, None
        if iterator is not None:
            shutdown_iterator(iterator)
        owner = self.loader
        while owner is not None:  # a persistent loader, even behind wrappers, must not keep the dead iterator
            forget_dead_iterator(owner)
            owner = getattr(owner, "loader", None)


def _persistent(loader: Any) -> bool:
    """Whether ``loader`` (or the DataLoader it wraps) keeps its workers across epochs."""
    while loader is not None:
        if getattr(loader, "persistent_workers", False):
            return True
        loader = getattr(loader, "loader", None)
    return False


def measure_steps(
    next_batch: Callable[[], Any],
    run_step: Callable[[Any], Any],
    *,
    warmup: int,
    steps: int,
    device: Device,
    on_step: Callable[[int], None] | None = None,
    round_size: int = 1,
) -> Measurement:
    """Time ``steps`` iterations of fetch-then-step after ``warmup`` untimed ones.

    Step times are read on the device's timeline (CUDA events, the sim's modelled queue), from
    the end of one step to the end of the next: on an asynchronous device the host only launches
    steps, so host-side intervals would time the launches, not the steps.

    ``next_batch`` returns a batch ready for the step (fetched, copied, transformed);
    ``run_step`` runs the step on it. ``on_step(i)`` is called after every iteration,
    warm-up included, for progress bars. ``round_size`` is the number of loader workers (see
    :attr:`Measurement.round_size`).
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    return measure_until(
        next_batch,
        run_step,
        warmup=warmup,
        min_steps=steps,
        budget_s=math.inf,
        target=0.0,
        device=device,
        round_size=round_size,
        on_step=on_step,
        max_steps=steps,
    )


def measure_until(
    next_batch: Callable[[], Any],
    run_step: Callable[[Any], Any],
    *,
    warmup: int,
    min_steps: int,
    budget_s: float,
    target: float,
    device: Device,
    round_size: int = 1,
    on_step: Callable[[int], None] | None = None,
    agree: Callable[[bool], bool] | None = None,
    max_steps: int | None = None,
) -> Measurement:
    """Like :func:`measure_steps`, but keep going, a whole round of workers at a time, until the mean
    step time's relative standard error is under ``target`` or ``budget_s`` of measuring is spent.

    At least ``min_steps`` are measured whatever the budget, and never more than ``max_steps``. ``agree(stop) -> stop`` makes the
    decision a joint one (under DDP every rank must run the same number of steps). The stopping rule reads host-side
    intervals (on an asynchronous device they match the device's in steady state); the figures
    returned are read on the device's timeline, as :func:`measure_steps` does.
    """
    if min_steps < 1 or warmup < 0:
        raise ValueError(f"need min_steps >= 1 and warmup >= 0, got min_steps={min_steps}, warmup={warmup}")
    size = max(1, round_size)
    for i in range(warmup):
        run_step(next_batch())
        if on_step is not None:
            on_step(i)
    marks = [device.timeline_mark()]
    host_times: list[float] = []
    with CpuMonitor() as monitor:
        started = last = time.perf_counter()
        while True:
            run_step(next_batch())
            marks.append(device.timeline_mark())
            now = time.perf_counter()
            host_times.append(now - last)
            last = now
            if on_step is not None:
                on_step(warmup + len(host_times) - 1)
            count = len(host_times)
            if max_steps is not None and count >= max_steps:
                break
            if count >= min_steps and count % size == 0:
                precise = Measurement(host_times, 0.0, 0.0, round_size=size).rel_stderr <= target and count // size >= 3
                stop = precise or now - started >= budget_s
                if agree is not None:
                    stop = agree(stop)
                if stop:
                    break
        device.synchronize()
    step_times = [device.seconds_between(a, b) for a, b in zip(marks, marks[1:])]
    return Measurement(step_times=step_times, cpu_util=monitor.cpu_util, system_cpu_util=monitor.system_cpu_util, round_size=size)


def device_batches(workload: Workload, device: Device) -> LoaderCycle:
    """Endless batches on ``device``, delivered the way the workload's own loop delivers them.

    Inline (the article's loop): fetch, copy with ``non_blocking=pin_memory``, then the
    device transform. With ``prefetch_depth`` > 0, fastpipe's DevicePrefetcher does all three
    ahead of the step. Device transforms are skipped on a sim device: its step time covers them.
    """
    transform = workload.device_transform if device.runs_model else None
    if workload.prefetch_depth > 0:
        from fastpipe.loading._prefetch import make_prefetcher

        prefetcher = make_prefetcher(workload.loader, device, depth=workload.prefetch_depth, transform=transform, kind=workload.prefetcher)
        return LoaderCycle(prefetcher)
    return LoaderCycle(_InlineCopy(workload.loader, device, transform), device=None)


class _InlineCopy:
    """Iterates a loader and copies each batch to the device in the consumer's thread."""

    def __init__(self, loader: Any, device: Device, transform: Callable[[Any], Any] | None) -> None:
        self.loader, self.device, self.transform = loader, device, transform
        self.non_blocking = bool(getattr(loader, "pin_memory", False))

    def __iter__(self) -> Iterator[Any]:
        return _InlineCopyIterator(self)


class _InlineCopyIterator:
    def __init__(self, owner: _InlineCopy) -> None:
        self.owner = owner
        self.source = pinned_iter(owner.loader, owner.device)

    def __iter__(self) -> "_InlineCopyIterator":
        return self

    def __next__(self) -> Any:
        batch = self.owner.device.to_device(next(self.source), non_blocking=self.owner.non_blocking)
        return batch if self.owner.transform is None else self.owner.transform(batch)

    def close(self) -> None:
        shutdown_iterator(self.source)


def measure_workload(
    workload: Workload, device: Device, *, warmup: int = 3, steps: int = 10, on_step: Callable[[int], None] | None = None
) -> Measurement:
    """The workload's own training loop, nothing cached, timed after warm-up."""
    batches = device_batches(workload, device)
    try:
        return measure_steps(
            lambda: next(batches),
            lambda batch: device.run_step(workload.step, batch),
            warmup=warmup,
            steps=steps,
            device=device,
            on_step=on_step,
            round_size=max(1, workload.loader.num_workers),
        )
    finally:
        batches.close()
