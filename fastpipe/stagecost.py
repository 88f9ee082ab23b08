"""Stage costs measured inside the DataLoader workers: the raw load, each transform, and collate.

Caching (:mod:`fastpipe.diagnose`) says how much *throughput* a stage costs the whole pipeline;
it cannot say where the workers' CPU time goes, and so cannot settle whether a stage is slow
or merely tipped a saturated CPU over. This module answers the second question in its own
short pass over the user's pipeline:

* :class:`TimedDataset` wraps the dataset (never modifying it). In each worker it runs a copy
  of the dataset whose transform is a :class:`~fastpipe.stages.TransformPipeline` with its
  ``timer`` set, so every transform stage is timed (wall and CPU). The raw load is what is
  left of ``__getitem__`` once the transform stages are taken out.
* :class:`TimedCollate` wraps the loader's ``collate_fn``, times it, and ships the batch's
  timings back *with the batch*: it returns ``(batch, BatchTimings)``, and the main process
  strips the timings off before pinning, copying and the step see the batch. No queue, no
  extra process, a few hundred bytes per batch.
* Each stage carries a ``torch.profiler.record_function`` label (``fastpipe/raw load``,
  ``fastpipe/<Stage>``, ``fastpipe/collate``), so it shows in a profiler trace of a worker or
  of a ``num_workers=0`` loader. The raw-load range encloses the transform ranges: its *self*
  time is the raw load.

Two independent references check the accounting: the per-sample worker time implied by the
measured throughput (``num_workers x wall time / samples``, equal to the workers' busy time
when the pipeline is input-bound), and the workers' CPU time as the OS counts it (psutil).
Optional untimed passes, before and after the timed one, check that timing perturbs neither
throughput (beyond noise) nor the workers' CPU per sample.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import psutil
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from fastpipe._render import render_table
from fastpipe._system import usable_cores
from fastpipe.cache import CachePointDataset, rebuild_loader, stage_of_error
from fastpipe.devices import Device, parse_device
from fastpipe.errors import ConfigError, FastpipeError, PipelineError
from fastpipe.measure import Measurement, device_batches, measure_steps
from fastpipe.pinning import shutdown_iterator
from fastpipe.report import Report
from fastpipe.snapshot import preserve_user_state
from fastpipe.stages import RAW_STAGE, StageError, TransformPipeline, find_pipeline
from fastpipe.workload import Workload

SCHEMA = "fastpipe.stagecost/1"
COLLATE_STAGE = "collate"
#: CPU utilisation (0..1 of usable cores) at which a point counts as saturated; diagnose's own value.
SATURATED_CPU = 0.9
RAW_LABEL, COLLATE_LABEL = f"fastpipe/{RAW_STAGE}", f"fastpipe/{COLLATE_STAGE}"


# ----- inside the workers -------------------------------------------------------------------
@dataclass
class BatchTimings:
    """What one worker spent on one batch, per stage: ``stages[name] = [wall s, CPU s]`` summed over its samples."""

    samples: int = 0
    stages: dict[str, list[float]] = field(default_factory=dict)
    pid: int = 0

    def add(self, name: str, wall: float, cpu: float) -> None:
        entry = self.stages.setdefault(name, [0.0, 0.0])
        entry[0] += wall
        entry[1] += cpu


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
        self.pending = BatchTimings(pid=self.pid)
        self.sample_transform_wall = 0.0
        self.sample_transform_cpu = 0.0
        self.cpu_mark = 0.0

    def start_transforms(self) -> None:
        self.cpu_mark = self.cpu_clock()

    def on_stage(self, name: str, wall: float) -> None:
        """``TransformPipeline.timer``: the stage's wall time, plus its CPU time since the previous mark."""
        now = self.cpu_clock()
        cpu, self.cpu_mark = now - self.cpu_mark, now
        self.pending.add(name, wall, cpu)
        self.sample_transform_wall += wall
        self.sample_transform_cpu += cpu

    def start_sample(self) -> None:
        self.sample_transform_wall = self.sample_transform_cpu = 0.0

    def end_sample(self, wall: float, cpu: float) -> None:
        """``__getitem__`` took ``wall``/``cpu`` in all; what the transform stages did not take is the raw load."""
        self.pending.add(RAW_STAGE, max(0.0, wall - self.sample_transform_wall), max(0.0, cpu - self.sample_transform_cpu))
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
        wall0, cpu0 = time.perf_counter(), ledger.cpu_clock()
        with torch.profiler.record_function(RAW_LABEL):
            try:
                sample = source[index]
            except StageError:
                raise
            except Exception as exc:
                raise StageError.wrap(RAW_STAGE, exc) from exc
        ledger.end_sample(time.perf_counter() - wall0, ledger.cpu_clock() - cpu0)
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
        wall0, cpu0 = time.perf_counter(), ledger.cpu_clock()
        with torch.profiler.record_function(COLLATE_LABEL):
            try:
                batch = self.collate_fn(samples)
            except Exception as exc:
                raise StageError.wrap(COLLATE_STAGE, exc) from exc
        ledger.pending.add(COLLATE_STAGE, time.perf_counter() - wall0, ledger.cpu_clock() - cpu0)
        return batch, ledger.take()


# ----- in the main process ------------------------------------------------------------------
class _Overrides:
    """A loader's attributes, some replaced: lets :func:`rebuild_loader` build a loader with new settings."""

    def __init__(self, loader: DataLoader, overrides: dict[str, Any]) -> None:
        self._loader, self._overrides = loader, overrides

    def __getattr__(self, name: str) -> Any:
        overrides = self.__dict__["_overrides"]
        return overrides[name] if name in overrides else getattr(self.__dict__["_loader"], name)


def loader_with(loader: DataLoader, dataset: Any, *, timeout: float | None = None, **overrides: Any) -> DataLoader:
    """A new DataLoader over ``dataset`` with ``loader``'s settings, except ``overrides`` (e.g. num_workers=3).

    Built by :func:`fastpipe.cache.rebuild_loader`, so it keeps exactly what a diagnosis keeps;
    DataLoader's own checks apply to the overridden values. An IterableDataset gets no sampler
    (DataLoader refuses one, even the placeholder it made for the original loader).
    """
    if isinstance(dataset, IterableDataset):
        overrides.setdefault("sampler", None)
    return rebuild_loader(_Overrides(loader, overrides), dataset, timeout=timeout)  # type: ignore[arg-type]


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
        return self.records[self.start:] or self.records

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


class _ChildCpu:
    """CPU seconds used by this process's children (the DataLoader workers), sampled in a thread.

    Workers can come and go (a new epoch restarts non-persistent workers), so each pid's latest
    reading is kept; a pid first seen inside the window counts from zero.
    """

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self._root = psutil.Process()
        self._baseline: dict[int, float] = {}
        self._latest: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.seconds = 0.0

    def _sample(self) -> dict[int, float]:
        seen = {}
        try:
            children = self._root.children(recursive=True)
        except psutil.Error:
            return seen
        for child in children:
            try:
                times = child.cpu_times()
                seen[child.pid] = times.user + times.system
            except psutil.Error:
                continue
        return seen

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._latest.update(self._sample())

    def start(self) -> None:
        self._baseline = self._sample()
        self._latest = dict(self._baseline)
        self._thread = threading.Thread(target=self._run, name="fastpipe-worker-cpu", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._latest.update(self._sample())
        self.seconds = sum(cpu - self._baseline.get(pid, 0.0) for pid, cpu in self._latest.items())


# ----- results ------------------------------------------------------------------------------
@dataclass
class StageCost:
    """One stage's cost per sample, as the workers paid it."""

    name: str
    kind: str
    """``"raw load"``, ``"transform"`` or ``"collate"``."""
    ms_per_sample: float
    """Mean wall milliseconds per sample inside a worker (collate: the batch's collate time / its samples)."""
    cpu_ms_per_sample: float
    """Mean CPU milliseconds per sample (differs from wall when a stage waits, e.g. on I/O or a busy CPU)."""
    share: float
    """Share of the workers' busy time (the sum of all stages' wall time), 0..1."""
    cpu_share: float
    """Share of the workers' CPU time spent in this stage, 0..1 (NaN when the stages used no CPU)."""
    samples_per_s_alone: float
    """What this stage alone would allow with this many workers: num_workers / seconds per sample."""


@dataclass
class StageCosts:
    """Stage costs of one pipeline, with the throughput of the timed pass and its cross-checks."""

    workload: str
    device: str
    num_workers: int
    batch_size: int | None
    cores: int
    steps: int
    warmup: int
    stages: list[StageCost]
    """In pipeline order: raw load, the transforms, collate."""
    samples: int
    """Samples whose timings were averaged (those delivered after warm-up)."""
    steps_per_s: float
    noise: float
    """Relative standard error of ``steps_per_s``, over whole rounds of workers (see :func:`round_noise`)."""
    cpu_util: float
    system_cpu_util: float
    os_worker_cpu_ms_per_sample: float | None = None
    """The workers' CPU time per sample as the OS counted it (None with num_workers=0)."""
    untimed_steps_per_s: float | None = None
    untimed_noise: float | None = None
    untimed_passes: list[float] = field(default_factory=list)
    """Steps/s of each untimed pass (before, after): far apart means the machine's load drifted."""
    untimed_os_worker_cpu_ms_per_sample: float | None = None
    timing_us_per_sample: float | None = None
    """CPU microseconds per sample the timing itself adds, from :func:`timing_cost_us`."""
    """The workers' CPU per sample in the untimed passes, as the OS counted it."""
    tolerance: float = 0.05
    notes: list[str] = field(default_factory=list)

    # ----- derived -----------------------------------------------------------------------
    @property
    def total_ms_per_sample(self) -> float:
        """The workers' busy time per sample: every stage's wall time, summed."""
        return sum(s.ms_per_sample for s in self.stages)

    @property
    def total_cpu_ms_per_sample(self) -> float:
        return sum(s.cpu_ms_per_sample for s in self.stages)

    @property
    def parallelism(self) -> int:
        """Processes doing the loading: the workers, or the main process when there are none."""
        return max(1, self.num_workers)

    @property
    def pipeline_samples_per_s(self) -> float:
        """What all stages together allow with this many workers."""
        total = self.total_ms_per_sample
        return math.inf if total <= 0 else self.parallelism * 1000.0 / total

    @property
    def measured_worker_ms_per_sample(self) -> float | None:
        """num_workers x wall time per delivered sample, from the measured throughput (an independent reference).

        It equals the workers' busy time per sample when they never idle, i.e. when the
        pipeline is input-bound; when it keeps up with the device, workers idle and this is larger.
        """
        if self.num_workers == 0 or not self.batch_size or not self.steps_per_s > 0:
            return None
        return self.num_workers * 1000.0 / (self.steps_per_s * self.batch_size)

    @property
    def coverage(self) -> float | None:
        """Sum of the stages / measured per-sample worker time: ~1 when input-bound, lower when workers idle."""
        measured = self.measured_worker_ms_per_sample
        return None if not measured else self.total_ms_per_sample / measured

    @property
    def cpu_coverage(self) -> float | None:
        """Sum of the stages' CPU / the workers' CPU as the OS counted it: ~1 when the stages explain the CPU."""
        os_cpu = self.os_worker_cpu_ms_per_sample
        return None if not os_cpu else self.total_cpu_ms_per_sample / os_cpu

    @property
    def overhead(self) -> float | None:
        """Relative throughput lost to timing: 1 - timed / untimed steps/s (None unless checked)."""
        if self.untimed_steps_per_s is None or not self.untimed_steps_per_s > 0:
            return None
        return 1.0 - self.steps_per_s / self.untimed_steps_per_s

    @property
    def cpu_overhead(self) -> float | None:
        """Relative worker CPU added by timing: timed / untimed OS-counted CPU per sample - 1 (None unless checked).

        Less sensitive than throughput to other load on a shared machine, which slows a pass
        without making its workers do more work.
        """
        timed, untimed = self.os_worker_cpu_ms_per_sample, self.untimed_os_worker_cpu_ms_per_sample
        return None if not timed or not untimed else timed / untimed - 1.0

    @property
    def overhead_noise(self) -> float | None:
        """The allowance for the overhead check, in steps/s: two standard errors of the difference, or ``tolerance``."""
        if self.untimed_steps_per_s is None:
            return None
        two_se = 2 * math.hypot(self.steps_per_s * self.noise, self.untimed_steps_per_s * (self.untimed_noise or 0.0))
        return max(two_se, self.tolerance * self.untimed_steps_per_s)

    @property
    def overhead_within_noise(self) -> bool | None:
        """True when the timed pass ran as fast as the untimed one, within :attr:`overhead_noise`."""
        allowance = self.overhead_noise
        if allowance is None or self.untimed_steps_per_s is None:
            return None
        return self.untimed_steps_per_s - self.steps_per_s <= allowance

    def stage(self, name: str) -> StageCost:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"no stage {name!r}; the stages are {[s.name for s in self.stages]}")

    def ranked(self, by: str = "ms_per_sample") -> list[StageCost]:
        """Stages, costliest first (by ``ms_per_sample`` or ``cpu_ms_per_sample``)."""
        return sorted(self.stages, key=lambda s: getattr(s, by), reverse=True)

    # ----- renderings --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = {"schema": SCHEMA, **dataclasses.asdict(self)}
        data.update(
            total_ms_per_sample=self.total_ms_per_sample, total_cpu_ms_per_sample=self.total_cpu_ms_per_sample,
            pipeline_samples_per_s=_finite(self.pipeline_samples_per_s),
            measured_worker_ms_per_sample=self.measured_worker_ms_per_sample, coverage=self.coverage,
            cpu_coverage=self.cpu_coverage, overhead=self.overhead, overhead_within_noise=self.overhead_within_noise,
            cpu_overhead=self.cpu_overhead,
        )
        for stage in data["stages"]:
            stage["samples_per_s_alone"] = _finite(stage["samples_per_s_alone"])
            stage["cpu_share"] = None if math.isnan(stage["cpu_share"]) else stage["cpu_share"]
        return data

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    HEADERS = ("stage", "ms/sample", "of worker time", "CPU ms/sample", "of worker CPU", "samples/s alone")

    def rows(self) -> list[tuple[str, ...]]:
        rows = [(s.name, f"{s.ms_per_sample:.2f}", f"{s.share:.1%}", f"{s.cpu_ms_per_sample:.2f}",
                 "-" if math.isnan(s.cpu_share) else f"{s.cpu_share:.1%}", _rate(s.samples_per_s_alone)) for s in self.stages]
        rows.append(("all stages", f"{self.total_ms_per_sample:.2f}", "100.0%", f"{self.total_cpu_ms_per_sample:.2f}", "100.0%",
                     _rate(self.pipeline_samples_per_s)))
        return rows

    def _who(self) -> str:
        return "1 process" if not self.num_workers else f"{self.num_workers} worker" + ("s" if self.num_workers > 1 else "")

    def title(self) -> str:
        who = self._who() if self.num_workers else "no workers: the training process loads"
        return f"fastpipe stage costs: {self.workload} on {self.device} ({who}, batch {self.batch_size}, {self.samples} samples timed)"

    def table_lines(self) -> list[str]:
        """The stage table as fixed-width plain text, for embedding in another report."""
        headers = (*self.HEADERS[:-1], f"samples/s alone ({self._who()})")
        rows = [headers, *self.rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(headers))]
        fmt = lambda row: "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))  # noqa: E731
        return [fmt(headers), "  ".join("-" * w for w in widths), *(fmt(row) for row in rows[1:])]

    def summary_lines(self) -> list[str]:
        """What the numbers mean: the largest stages, and the cross-checks."""
        lines = []
        top = self.ranked()[:2]
        if top and self.total_ms_per_sample > 0:
            lines.append("Largest: " + ", ".join(f"{s.name} ({s.ms_per_sample:.2f} ms/sample, {s.share:.0%})" for s in top))
        per_step = self.pipeline_samples_per_s / self.batch_size if self.batch_size else None
        lines.append(
            f"All stages take {self.total_ms_per_sample:.2f} ms per sample ({self.total_cpu_ms_per_sample:.2f} ms CPU): "
            f"{self._who()} can deliver {_rate(self.pipeline_samples_per_s)} samples/s"
            + (f" ({per_step:.2f} steps/s)" if per_step is not None and math.isfinite(per_step) else "")
        )
        measured = self.measured_worker_ms_per_sample
        if measured is not None and self.coverage is not None:
            lines.append(
                f"Check: the timed pass ran at {self.steps_per_s:.3f} steps/s, i.e. {measured:.2f} ms of worker time per sample; "
                f"the stages sum to {self.coverage:.0%} of it"
                + (" (workers idled: the pipeline kept up with the device, or the main process limited it)" if self.coverage < 0.8 else
                   " (more than the wall time allows: the machine's load changed during the pass; rerun with more --steps)"
                   if self.coverage > 1.2 else "")
            )
        if self.cpu_coverage is not None and self.os_worker_cpu_ms_per_sample:
            lines.append(f"Check: the OS counted {self.os_worker_cpu_ms_per_sample:.2f} ms of worker CPU per sample; the stages' CPU sums to {self.cpu_coverage:.0%} of it")
        if self.overhead is not None:
            verdict = "within noise" if self.overhead_within_noise else "MORE than noise: treat these costs with care"
            lines.append(
                f"Timing overhead: {self.steps_per_s:.3f} steps/s timed vs {self.untimed_steps_per_s:.3f} untimed "
                f"({', '.join(f'{v:.3f} {when}' for v, when in zip(self.untimed_passes, ('before', 'after')))}): "
                f"{abs(self.overhead):.1%} {'slower' if self.overhead > 0 else 'faster'}, noise allowance "
                f"±{self.overhead_noise:.3f} steps/s: {verdict}"
            )
        if self.timing_us_per_sample is not None and self.total_ms_per_sample > 0:
            lines.append(f"Timing itself costs {self.timing_us_per_sample:.1f} µs of CPU per sample "
                         f"({self.timing_us_per_sample / 10 / self.total_ms_per_sample:.2f}% of the stages' time), measured in-process")
        if self.cpu_overhead is not None:
            lines.append(f"Timing overhead in worker CPU: {self.os_worker_cpu_ms_per_sample:.2f} ms per sample timed vs "
                         f"{self.untimed_os_worker_cpu_ms_per_sample:.2f} untimed ({self.cpu_overhead:+.1%})")
        lines += [f"Note: {note}" for note in self.notes]
        return lines

    def markdown_lines(self) -> list[str]:
        out = ["| " + " | ".join(self.HEADERS) + " |", "|---" + "|---:" * (len(self.HEADERS) - 1) + "|"]
        out += ["| " + " | ".join(row) + " |" for row in self.rows()]
        return out

    def to_markdown(self) -> str:
        return "\n".join([f"### {self.title()}", "", *self.markdown_lines(), "", *(f"{line}  " for line in self.summary_lines())]) + "\n"

    def to_table(self) -> str:
        """The console rendering (rich), as plain text."""
        columns = [(f"samples/s alone ({self.parallelism})" if i == len(self.HEADERS) - 1 else header, "left" if i == 0 else "right")
                   for i, header in enumerate(self.HEADERS)]
        return render_table(self.title(), columns, self.rows(), self.summary_lines())

    def __str__(self) -> str:
        return self.to_table()


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _rate(value: float) -> str:
    return "unbounded" if not math.isfinite(value) else f"{value:,.0f}"


# ----- the pass -----------------------------------------------------------------------------
def coerce_workload(source: "DataLoader | Workload", step: Callable[[Any], Any] | None = None, name: str | None = None) -> Workload:
    """A Workload from a Workload or a (DataLoader, step) pair, as :func:`fastpipe.diagnose` accepts them."""
    if isinstance(source, Workload):
        return source if step is None else dataclasses.replace(source, step=step)
    if not isinstance(source, DataLoader):
        raise ConfigError(f"expected a torch.utils.data.DataLoader or a fastpipe.Workload, not {type(source).__name__}")
    if step is None or not callable(step):
        raise ConfigError("pass step, a function step(batch) that runs one training step (or a Workload)")
    return Workload(loader=source, step=step, name=name or "workload")


class _Noop:
    def __call__(self, x: Any) -> Any:
        return x


class _ProbeDataset(Dataset):
    """Free samples through ``stages`` no-op transforms: whatever reading it costs is fastpipe's own."""

    def __init__(self, stages: int) -> None:
        from torchvision.transforms import Compose

        self.transform = Compose([_Noop() for _ in range(stages)])
        self.sample = torch.zeros(4)

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> Any:
        return self.transform(self.sample)


def timing_cost_us(stages: int, *, samples: int = 400, batch: int = 8, repeats: int = 3) -> float:
    """CPU microseconds per sample that timing adds to a pipeline of ``stages`` transforms.

    Measured in this process on a pipeline that costs nothing, read as a diagnosis reads it
    (stages labelled, untimed) and as the stage-cost pass reads it (timed, labelled, collate
    wrapped); the best of ``repeats`` of each. A busy machine cannot inflate this the way it
    inflates an A/B comparison of throughput, since both sides run back to back on one thread.
    """
    from torch.utils.data import default_collate

    probe = _ProbeDataset(stages)
    pipeline, _ = find_pipeline(probe)
    untimed, timed, collate = CachePointDataset(probe, pipeline, "baseline"), TimedDataset(probe, pipeline), TimedCollate(default_collate)

    def cost(read: Callable[[int], Any], gather: Callable[[list[Any]], Any]) -> float:
        best = math.inf
        for _ in range(repeats):
            began = time.thread_time()
            for start in range(0, samples, batch):
                gather([read(i) for i in range(start, start + batch)])
            best = min(best, time.thread_time() - began)
        return best

    extra = cost(timed.__getitem__, collate) - cost(untimed.__getitem__, default_collate)
    return max(0.0, 1e6 * extra / samples)


def timed_loader(loader: DataLoader, *, timeout: float | None = None) -> tuple[DataLoader, list[str]]:
    """A loader like ``loader`` whose batches come as ``(batch, BatchTimings)``; also notes on what can be timed."""
    dataset, notes = loader.dataset, []
    pipeline, why_not = find_pipeline(dataset)
    if isinstance(dataset, IterableDataset):
        timed: Any = TimedIterableDataset(dataset)
        notes.append("an IterableDataset: each item is timed whole as the raw load, transforms included")
    else:
        timed = TimedDataset(dataset, pipeline)
        if pipeline is None:
            notes.append(f"no transform stages found, so the raw load includes any transform ({why_not})")
    return loader_with(loader, timed, collate_fn=TimedCollate(loader.collate_fn), timeout=timeout), notes


def _stage_order(pipeline_names: list[str], seen: set[str]) -> list[str]:
    order = [RAW_STAGE, *pipeline_names, COLLATE_STAGE]
    return order + sorted(seen - set(order))


def summarize(records: list[BatchTimings], names: list[str], num_workers: int) -> tuple[list[StageCost], int]:
    """Per-sample stage costs from the batches' timings; also the number of samples they cover."""
    samples = sum(r.samples for r in records)
    if samples == 0:
        raise PipelineError("the stage-cost pass timed no samples: the loader delivered no batches", stage=None)
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for record in records:
        for name, (w, c) in record.stages.items():
            wall[name] = wall.get(name, 0.0) + w
            cpu[name] = cpu.get(name, 0.0) + c
    total_wall, total_cpu = sum(wall.values()), sum(cpu.values())
    parallelism = max(1, num_workers)
    stages = []
    for name in _stage_order(names, set(wall)):
        w, c = wall.get(name, 0.0) / samples, cpu.get(name, 0.0) / samples
        kind = RAW_STAGE if name == RAW_STAGE else COLLATE_STAGE if name == COLLATE_STAGE else "transform"
        stages.append(StageCost(
            name=name, kind=kind, ms_per_sample=1000 * w, cpu_ms_per_sample=1000 * c,
            share=w * samples / total_wall if total_wall > 0 else 0.0,
            cpu_share=c * samples / total_cpu if total_cpu > 0 else math.nan,
            samples_per_s_alone=parallelism / w if w > 0 else math.inf,
        ))
    return stages, samples


def _pipeline_error(exc: BaseException, what: str) -> PipelineError:
    stage = stage_of_error(exc)
    message = str(exc)
    if stage is not None:
        detail = message[message.find(StageError.PREFIX):].splitlines()[0].split("] ", 1)[-1]
        return PipelineError(f"stage '{stage}' raised {detail} (during the {what})", stage=stage)
    first = message.strip().splitlines()[0] if message.strip() else type(exc).__name__
    return PipelineError(f"the data pipeline failed during the {what}: {type(exc).__name__}: {first}", stage=None)


def round_noise(step_times: list[float], workers: int) -> float:
    """Relative standard error of the mean step time, over whole rounds of ``workers`` steps.

    With several workers, batches arrive in bursts (one step waits, the next finds its batch
    ready), so single step times vary far more than throughput does; rounds average that out.
    Falls back to single steps when there are fewer than two rounds.
    """
    size = max(1, workers)
    rounds = [sum(step_times[i:i + size]) for i in range(0, len(step_times) - size + 1, size)]
    values = rounds if len(rounds) >= 2 else step_times
    if len(values) < 2:
        return 0.0
    return statistics.stdev(values) / statistics.fmean(values) / math.sqrt(len(values))


def untimed_loader(loader: DataLoader, *, timeout: float | None = None) -> DataLoader:
    """The diagnosis's baseline: ``loader``'s pipeline run as is, its stages labelled but not timed."""
    pipeline, _ = find_pipeline(loader.dataset)
    dataset = loader.dataset if pipeline is None else CachePointDataset(loader.dataset, pipeline, "baseline")
    return loader_with(loader, dataset, timeout=timeout)


@dataclass
class _Pass:
    measurement: Measurement
    worker_cpu_s: float
    samples: int
    """Samples the loop consumed while ``worker_cpu_s`` was counted."""


def _run_pass(workload: Workload, device: Device, loader: Any, steps: int, warmup: int, tap: _Tap | None = None) -> _Pass:
    """The workload's own loop over ``loader`` (a DataLoader or a timing tap), timed after warm-up."""
    children = _ChildCpu()
    batches = device_batches(dataclasses.replace(workload, loader=loader), device)

    def on_step(i: int) -> None:
        if i == warmup - 1:
            if tap is not None:
                tap.mark()
            children.start()

    def run_step(batch: Any) -> None:
        try:
            device.run_step(workload.step, batch)
        except Exception as exc:
            raise PipelineError(f"the training step raised {type(exc).__name__}: {exc}", stage="step") from exc

    if warmup == 0:
        children.start()
    try:
        measurement = measure_steps(lambda: next(batches), run_step, warmup=warmup, steps=steps, device=device, on_step=on_step)
    except (FastpipeError, KeyboardInterrupt):
        raise
    except Exception as exc:
        raise _pipeline_error(exc, "stage-cost pass" if tap is not None else "untimed pass") from exc
    finally:
        children.stop()
        batches.close()
    # in steady state the workers produce what the loop consumes, so the window's samples are the steps' samples
    # (timings themselves arrive a batch or two ahead of their step, through the pin thread)
    batch_size = workload.loader.batch_size
    samples = steps * batch_size if batch_size else sum(r.samples for r in (tap.measured() if tap is not None else []))
    return _Pass(measurement, children.seconds, samples)


def _worker_cpu_ms(passes: list[_Pass], workers: int) -> float | None:
    seconds, samples = sum(p.worker_cpu_s for p in passes), sum(p.samples for p in passes)
    return 1000 * seconds / samples if workers > 0 and samples and seconds > 0 else None


def measure_stage_costs(
    source: "DataLoader | Workload",
    device: "str | Device | None" = None,
    *,
    step: Callable[[Any], Any] | None = None,
    steps: int = 10,
    warmup: int = 3,
    check_overhead: bool = False,
    tolerance: float = 0.05,
    worker_timeout: float = 300.0,
    name: str | None = None,
) -> StageCosts:
    """Time each stage inside the workers during a short run of the user's own loop.

    Args:
        source: a :class:`~fastpipe.Workload`, or a DataLoader with ``step``.
        device: ``cuda[:N]``, ``cpu``, ``sim:STEP_MS`` or a Device (default: cuda if present, else sim:290).
        steps, warmup: measured and untimed steps; steps round up to whole rounds of workers, as a diagnosis does.
        check_overhead: also run the loop untimed (the diagnosis's baseline) before and after the timed pass, so
            :attr:`StageCosts.overhead_within_noise` says whether timing perturbed throughput; running it on both
            sides lets drift of a busy machine show as noise instead of as overhead.
        tolerance: the smallest relative throughput difference the overhead check counts, besides noise.
        worker_timeout: seconds a worker may take for a batch, used when the loader sets no timeout.

    Raises:
        ConfigError: bad arguments.
        PipelineError: a stage, collate or the step raised; ``.stage`` says which.
    """
    workload = coerce_workload(source, step, name)
    if steps < 1 or warmup < 0:
        raise ConfigError(f"need steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    if not 0 <= tolerance < 1:
        raise ConfigError(f"tolerance is a fraction of the throughput, e.g. 0.05; got {tolerance}")
    device = parse_device(device)
    loader = workload.loader
    workers = loader.num_workers
    steps = max(1, workers) * math.ceil(steps / max(1, workers))
    pipeline, _ = find_pipeline(loader.dataset)
    untimed: list[_Pass] = []
    timed, notes = timed_loader(loader, timeout=worker_timeout)
    tap = _Tap(timed)
    with preserve_user_state(workload.model, workload.optimizer, loader):
        if check_overhead:
            untimed.append(_run_pass(workload, device, untimed_loader(loader, timeout=worker_timeout), steps, warmup))
        result = _run_pass(workload, device, tap, steps, warmup, tap)
        if check_overhead:
            untimed.append(_run_pass(workload, device, untimed_loader(loader, timeout=worker_timeout), steps, warmup))
    stages, samples = summarize(tap.measured(), pipeline.names() if pipeline is not None else [], workers)
    if workers == 0:
        notes.append("num_workers=0: the stages ran in the training process, between steps")
    untimed_times = [t for p in untimed for t in p.measurement.step_times]
    return StageCosts(
        workload=workload.name, device=device.spec, num_workers=workers, batch_size=loader.batch_size, cores=usable_cores(),
        steps=steps, warmup=warmup, stages=stages, samples=samples, steps_per_s=result.measurement.steps_per_s,
        noise=round_noise(result.measurement.step_times, workers), cpu_util=result.measurement.cpu_util,
        system_cpu_util=result.measurement.system_cpu_util, os_worker_cpu_ms_per_sample=_worker_cpu_ms([result], workers),
        untimed_steps_per_s=len(untimed_times) / sum(untimed_times) if untimed_times else None,
        untimed_noise=round_noise(untimed_times, workers) if untimed_times else None,
        untimed_passes=[p.measurement.steps_per_s for p in untimed],
        untimed_os_worker_cpu_ms_per_sample=_worker_cpu_ms(untimed, workers), tolerance=tolerance, notes=notes,
        timing_us_per_sample=timing_cost_us(len(pipeline.stages) if pipeline is not None else 0),
    )


# ----- the saturation caveat, settled -------------------------------------------------------
def _costs_for(stage: str, costs: StageCosts) -> list[StageCost] | None:
    """The measured stages behind a diagnosis bottleneck's name (``"A + B"``, ``"collate/IPC"``...); None if none run in workers."""
    known = {s.name: s for s in costs.stages}
    found: list[StageCost] = []
    for part in stage.split(" + "):
        if part in known:
            found.append(known[part])
        elif part.startswith("collate"):
            found.append(known[COLLATE_STAGE])
        elif part == "transforms":
            found += [s for s in costs.stages if s.kind == "transform"]
    return found or None


def explain_saturation(report: Report, costs: StageCosts, *, saturated: float = SATURATED_CPU) -> list[str]:
    """For each bottleneck found at a saturated CPU, whether the stage is slow or the whole pipeline exceeds the cores.

    The budget is the device bound: ``bound steps/s x batch size`` samples/s. A stage is *slow*
    when, alone, this many workers could not deliver that rate (its samples/s alone is below it).
    Otherwise the stage only tipped the CPU over: all stages *together* exceed the budget, and the
    line says whether that exceeds the machine's cores (CPU-seconds needed per second at the bound)
    or only the workers (more workers could help). Every line names the stages that consume the CPU.
    """
    bound, batch = report.device_bound_steps_per_s, report.batch_size or costs.batch_size
    if not bound or not batch:
        return []
    needed = bound * batch
    workers = costs.parallelism
    consumers = ", ".join(f"{s.name} {s.cpu_ms_per_sample:.1f} ms ({s.cpu_share:.0%})" for s in costs.ranked("cpu_ms_per_sample") if s.cpu_ms_per_sample > 0)
    consumers = f"CPU per sample goes to: {consumers}" if consumers else "the stages themselves used almost no CPU (they wait, e.g. on I/O)"
    cores_needed = costs.total_cpu_ms_per_sample / 1000.0 * needed
    whole = costs.pipeline_samples_per_s
    lines = []
    for b in report.bottlenecks:
        point = report.experiment(b.between[1])
        cpu = point.cpu_util if point is not None else math.nan
        if not (b.cpu_saturated or cpu >= saturated):
            continue
        head = f"{b.stage}, at a saturated CPU ({cpu:.0%} of the cores): "
        own = _costs_for(b.stage, costs)
        if own is None:
            lines.append(head + "it runs in the training process, not in the workers.")
            continue
        own_ms = sum(s.ms_per_sample for s in own)
        alone = workers * 1000.0 / own_ms if own_ms > 0 else math.inf
        if alone < needed:
            lines.append(
                head + f"this stage is slow. Alone it takes {own_ms:.2f} ms per sample, so {workers} workers could deliver "
                f"at most {_rate(alone)} samples/s, below the {needed:,.0f} samples/s the device bound needs "
                f"({bound:.2f} steps/s x {batch}); it is slow in itself, not only tipping a saturated CPU over."
            )
        elif whole < needed:
            scope = (
                f"the pipeline as a whole exceeds the cores: at the device bound all stages together need {cores_needed:.1f} cores "
                f"of CPU, and this machine gives {costs.cores}; cut the largest consumers, not only this stage"
                if cores_needed > costs.cores else
                f"the pipeline as a whole exceeds what {workers} workers deliver: at the device bound it needs {cores_needed:.1f} "
                f"of the {costs.cores} cores, so more workers may carry it (try fastpipe tune)"
            )
            lines.append(
                head + f"this stage is not slow by itself ({own_ms:.2f} ms per sample allows {_rate(alone)} samples/s with "
                f"{workers} workers, above the {needed:,.0f} needed), but all stages together take {costs.total_ms_per_sample:.2f} ms "
                f"per sample ({_rate(whole)} samples/s): {scope}."
            )
        else:
            lines.append(
                head + f"the workers' stages fit the budget ({costs.total_ms_per_sample:.2f} ms per sample allows {_rate(whole)} "
                f"samples/s, {needed:,.0f} needed), so the CPU went elsewhere: the training process (pinning, copies, "
                f"a step on the CPU) or other processes (the machine was {point.system_cpu_util if point else math.nan:.0%} busy)."
            )
    if lines:
        lines[-1] += f" {consumers}."  # once, after the last explanation, not on every line
    return lines
