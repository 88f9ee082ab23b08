"""The cache-bisection engine: rerun the loop with data cached at successive points.

Points, from the device upwards (see :mod:`fastpipe.cache`)::

    device  one batch on the device, the step (and any device transform) repeated: the device bound
    host    one batch on the host, copied every step as the user's loop copies it
    sample  one finished sample per worker; collate, IPC, pinning and the copy still run
    after:S the output of transform stage S; later stages rerun (last stage to first)
    raw     the transform's input; every transform reruns
    baseline nothing cached

Throughput lost between two neighbouring points is the cost of what lies between them.
The user's DataLoader settings (workers, batch sampler, collate, pinning...) are kept by
building new loaders around a wrapped copy of the dataset, and everything the user owns is
restored afterwards (:mod:`fastpipe.snapshot`).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Any, Callable, Iterator

from torch.utils.data import DataLoader

from fastpipe.cache import CachePointDataset, UnavailablePoint, fresh_copy, rebuild_loader, stage_of_error
from fastpipe.devices import Device, parse_device
from fastpipe.distributed.stats import ray_stats_notes
from fastpipe.errors import ConfigError, PipelineError
from fastpipe.measure import LoaderCycle, Measurement, device_batches, measure_steps
from fastpipe.report import Bottleneck, ExperimentResult, Report, Unavailable
from fastpipe.snapshot import preserve_user_state
from fastpipe.stages import RAW_STAGE, StageError, find_pipeline
from fastpipe.workload import Workload

SATURATED_CPU = 0.9
SATURATION_CAVEAT_START = "the CPU was saturated"
VERDICT_BANDS = ((0.05, "not input-bound"), (0.20, "moderately input-bound"), (math.inf, "highly input-bound"))
COPY, COLLATE = "host-to-device copy", "collate/IPC"
RECOMMENDATIONS = {
    "raw load": "Read or decode less per sample: decode only the crop you need (crop first), use fewer, larger files, "
    "or fetch in parallel; add workers only if cores are idle.",
    "transform": "Make it cheaper: a compiled kernel (Numba, or a C++ op such as fastpipe.transforms.RandomMask), "
    "crop before it, or move it onto the device after the copy if it is GPU-friendly.",
    COLLATE: "Send less per batch: keep images uint8 and convert and scale on the device "
    "(fastpipe.transforms.device.ConvertColorScale), use smaller dtypes, avoid padding.",
    COPY: "Copy less and overlap the copy: uint8 payloads, pin_memory=True with non_blocking copies, "
    "and prefetch on a side stream (fastpipe.DevicePrefetcher).",
}


def point_label(point: str) -> str:
    return {"device": "device (bound)", "host": "host", "sample": "sample", "raw": "raw", "baseline": "baseline"}.get(
        point, point.replace("after:", "after ")
    )


def verdict_for(gap: float) -> str:
    return next(label for limit, label in VERDICT_BANDS if gap < limit)


class _Repeat:
    """An endless iterable over a few cached host batches, shaped like a loader for the prefetcher."""

    def __init__(self, batches: list[Any], pin_memory: bool) -> None:
        self.batches, self.pin_memory = batches, pin_memory

    def __iter__(self) -> Iterator[Any]:
        while True:
            yield from self.batches

    def __len__(self) -> int:
        return 2**31 - 1


class _Progress:
    """A rich progress bar over all experiments' steps, or nothing."""

    def __init__(self, enabled: bool, total: int) -> None:
        self._bar = None
        if enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("{task.description:<28}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"), TimeElapsedColumn(), transient=True)
            self._task = self._bar.add_task("diagnosing", total=total)
            self._bar.start()

    def describe(self, text: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=text)

    def advance(self, _: int = 0) -> None:
        if self._bar is not None:
            self._bar.advance(self._task)

    def extend(self, steps: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, total=self._bar.tasks[0].total + steps)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


class _Diagnosis:
    def __init__(self, workload: Workload, device: Device, steps: int, warmup: int, pool: int, threshold: float, strategy: str, progress: bool, worker_timeout: float) -> None:
        self.workload, self.device = workload, device
        loader = workload.loader
        self.workers = loader.num_workers
        # whole rounds of workers, so batches arriving in bursts average out
        self.steps = max(1, self.workers) * math.ceil(steps / max(1, self.workers))
        self.warmup, self.pool, self.threshold, self.strategy = warmup, pool, threshold, strategy
        self.worker_timeout = worker_timeout
        self.pipeline, why_not = find_pipeline(loader.dataset)
        if getattr(loader, "unsupported_point_reason", None):  # a RayLoader: its stages run inside Ray tasks
            self.pipeline, why_not = None, loader.unsupported_point_reason
        self.points, self.unavailable = self._plan(why_not)
        self.components = self._components()
        self.results: dict[str, ExperimentResult] = {}
        self.host_batches: list[Any] = []
        self._copy_costs: dict[str, float] = {}
        self.progress = _Progress(progress, 0)
        self.report = Report(
            workload=workload.name, device=device.spec, num_workers=self.workers, batch_size=loader.batch_size,
            steps=self.steps, warmup=warmup, pool=pool, threshold=threshold, strategy=strategy,
            notes=list(workload.notes),
        )

    # ----- planning ---------------------------------------------------------------------
    def _plan(self, why_not: str | None) -> tuple[list[str], list[Unavailable]]:
        points, unavailable = ["device", "host"], []
        if self.pipeline is None:
            reason = why_not or "no transform"
            if "IterableDataset" in reason:
                unavailable.append(Unavailable("sample", reason))
            else:
                points.append("sample")
            unavailable += [Unavailable("after:<stage>", reason), Unavailable("raw", reason)]
        else:
            names = self.pipeline.names()
            points.append("sample")
            points += [f"after:{name}" for name in reversed(names[:-1])]
            if names:
                points.append("raw")
            else:  # with no stages, the raw sample is the finished sample
                unavailable += [Unavailable("after:<stage>", "the transform has no stages"), Unavailable("raw", "the transform has no stages")]
        points.append("baseline")
        return points, unavailable

    def _components(self) -> list[str]:
        """What lies between points[i] and points[i+1]."""
        components = [COPY]
        if "sample" in self.points:
            components.append(COLLATE)
        if self.pipeline is not None:
            components += list(reversed(self.pipeline.names()))
            components.append(RAW_STAGE)
        else:
            components.append(f"{RAW_STAGE} + transforms" if "sample" in self.points else f"{COLLATE} + {RAW_STAGE} + transforms")
        return components

    # ----- experiments ------------------------------------------------------------------
    def _host_batches(self) -> list[Any]:
        if not self.host_batches:
            loader = rebuild_loader(self.workload.loader, self._dataset("baseline"), timeout=self.worker_timeout)
            cycle = LoaderCycle(loader, self.device)
            try:
                self.host_batches = [next(cycle) for _ in range(self.pool)]
            finally:
                cycle.close()
        return self.host_batches

    def _dataset(self, point: str) -> Any:
        dataset = self.workload.loader.dataset
        if point == "baseline" and self.pipeline is None:
            return dataset
        return CachePointDataset(dataset, self.pipeline, point, self.pool)

    def _device_transform(self, batch: Any) -> Any:
        transform = self.workload.device_transform
        return batch if transform is None or not self.device.runs_model else transform(batch)

    def _batch_source(self, point: str) -> tuple[Callable[[], Any], Callable[[], None]]:
        """(next_batch, close) for one experiment."""
        non_blocking = bool(self.workload.loader.pin_memory)
        if point == "device":
            # the device transform is device work, part of the bound: it runs every step, as in the loop
            cached = [self.device.to_device(b, non_blocking=False) for b in self._host_batches()]
            self.device.synchronize()
            cycle = _Repeat(cached, False).__iter__()
            return (lambda: self._device_transform(next(cycle))), (lambda: None)
        if point == "host":
            repeat = _Repeat(self._host_batches(), non_blocking)
            if self.workload.prefetch_depth > 0:
                from fastpipe.prefetch import make_prefetcher

                transform = self.workload.device_transform if self.device.runs_model else None
                prefetched = LoaderCycle(make_prefetcher(repeat, self.device, depth=self.workload.prefetch_depth, transform=transform, kind=self.workload.prefetcher))
                return (lambda: next(prefetched)), prefetched.close
            cycle = iter(repeat)
            return (lambda: self._device_transform(self.device.to_device(next(cycle), non_blocking=non_blocking))), (lambda: None)
        loader = rebuild_loader(self.workload.loader, self._dataset(point), timeout=self.worker_timeout)
        batches = device_batches(dataclasses.replace(self.workload, loader=loader), self.device)
        return (lambda: next(batches)), batches.close

    def _run_step(self, batch: Any) -> None:
        try:
            self.device.run_step(self.workload.step, batch)
        except Exception as exc:
            raise PipelineError(f"the training step raised {type(exc).__name__}: {exc}", stage="step") from exc

    def measure(self, point: str) -> ExperimentResult:
        self.progress.describe(point_label(point))
        next_batch, close = None, None
        try:
            next_batch, close = self._batch_source(point)
            measurement = measure_steps(next_batch, self._run_step, warmup=self.warmup, steps=self.steps, device=self.device,
                                        on_step=self.progress.advance, round_size=max(1, self.workers))
        except (PipelineError, KeyboardInterrupt):
            raise
        except Exception as exc:
            raise _as_pipeline_error(exc, point) from exc
        finally:
            if close is not None:
                close()
        result = ExperimentResult(
            name=point_label(point), cache_point=point, steps_per_s=measurement.steps_per_s, fraction_of_bound=math.nan,
            spread=measurement.spread, noise=measurement.rel_stderr, cpu_util=measurement.cpu_util,
            system_cpu_util=measurement.system_cpu_util, pool_spread=self._pool_spread(point, measurement),
            step_times=measurement.step_times,
        )
        self.results[point] = result
        return result

    def _pool_spread(self, point: str, measurement: Measurement) -> float | None:
        """Across the cached batches of the device and host points: how much the step time depends on the data."""
        if self.pool < 2 or point not in ("device", "host"):
            return None
        slots: dict[int, list[float]] = {}
        for i, seconds in enumerate(measurement.step_times):
            slots.setdefault((self.warmup + i) % self.pool, []).append(seconds)
        means = [statistics.fmean(v) for v in slots.values()]
        return statistics.pstdev(means) / statistics.fmean(means) if len(means) > 1 else None

    # ----- strategy ---------------------------------------------------------------------
    def _noise(self, upper: ExperimentResult, lower: ExperimentResult) -> float:
        """Two standard errors of the difference, in steps/s."""
        return 2 * math.hypot(upper.steps_per_s * upper.noise, lower.steps_per_s * lower.noise)

    def _significant(self, upper: str, lower: str, drop: float | None = None) -> bool:
        u, l = self.results[upper], self.results[lower]
        bound = self.results["device"].steps_per_s
        drop = u.steps_per_s - l.steps_per_s if drop is None else drop
        return drop > max(self._noise(u, l), self.threshold * bound)

    def _copy_seconds(self, point: str) -> float:
        """Time to copy one cached value at ``point``: a cost of the cache itself, not of the pipeline.

        Measured once in the main process on one captured sample (PIL images are not copied).
        """
        if self.pipeline is None or not (point == "raw" or point.startswith("after:")):
            return 0.0
        if point not in self._copy_costs:
            try:
                cached = CachePointDataset(self.workload.loader.dataset, self.pipeline, point)._capture(0).cached
                times = []
                for _ in range(5):
                    began = time.perf_counter()
                    fresh_copy(cached)
                    times.append(time.perf_counter() - began)
                self._copy_costs[point] = statistics.median(times)
            except Exception:  # the estimate is a refinement; a sample that cannot be read here gets none
                self._copy_costs[point] = 0.0
        return self._copy_costs[point]

    def _without_copy(self, point: str) -> float:
        """Steps/s at ``point`` with the cache's own per-sample copy taken out.

        A point copies its cached value for every sample, so in-place transforms cannot pile up;
        that copy is not the pipeline's. In a worker-bound run it adds batch x copy / workers to
        each step; taking it out never makes a point faster than the device bound.
        """
        rate = self.results[point].steps_per_s
        batch = self.workload.loader.batch_size
        if not batch:
            return rate
        bound_step = 1 / self.results["device"].steps_per_s
        step = max(bound_step, 1 / rate - batch * self._copy_seconds(point) / max(1, self.workers))
        return 1 / step

    def _stage_drop(self, upper: str, lower: str) -> float:
        """Steps/s lost between two points, the cache's own copies discounted."""
        return self._without_copy(upper) - self._without_copy(lower)

    def run(self) -> None:
        points = self.points
        per_point = self.warmup + self.steps
        self.progress.extend(2 * per_point)
        self.measure("device")
        self.measure("baseline")
        if not self._significant("device", "baseline"):
            skipped = [p for p in points if p not in self.results]
            if skipped:
                self.report.notes.append(f"the baseline is within noise and threshold of the device bound, so {', '.join(skipped)} were not measured")
            return
        if self.strategy == "linear":
            middle = points[1:-1]
            self.progress.extend(len(middle) * per_point)
            for point in middle:
                self.measure(point)
        else:
            self._bisect(0, len(points) - 1, per_point)

    def _bisect(self, a: int, b: int, per_point: int) -> None:
        if b - a <= 1 or not self._significant(self.points[a], self.points[b]):
            return
        mid = (a + b) // 2
        self.progress.extend(per_point)
        self.measure(self.points[mid])
        self._bisect(a, mid, per_point)
        self._bisect(mid, b, per_point)

    # ----- attribution ------------------------------------------------------------------
    def finish(self, elapsed: float) -> Report:
        report = self.report
        report.elapsed_s = elapsed
        report.unavailable = self.unavailable
        measured = [p for p in self.points if p in self.results]
        report.experiments = [self.results[p] for p in measured]
        device = self.results.get("device")
        if device is None:
            return report
        bound = device.steps_per_s
        report.device_bound_steps_per_s = bound
        for result in report.experiments:
            result.fraction_of_bound = result.steps_per_s / bound
        baseline = self.results.get("baseline")
        if baseline is not None:
            report.gap_fraction = max(0.0, 1 - baseline.steps_per_s / bound)
            report.verdict = verdict_for(report.gap_fraction)
        for upper, lower in zip(measured, measured[1:]):
            drop = self._stage_drop(upper, lower)
            if not self._significant(upper, lower, drop):
                continue
            between = self.components[self.points.index(upper):self.points.index(lower)]
            kind = _kind_of(between)
            stage = " + ".join(reversed(between)) if len(between) > 1 else between[0]
            saturated = self.results[lower].cpu_util >= SATURATED_CPU
            report.bottlenecks.append(Bottleneck(
                stage=stage, kind=kind, drop_fraction=drop / bound,
                between=(upper, lower), cpu_saturated=saturated, recommendation=RECOMMENDATIONS[kind],
            ))
        report.bottlenecks.sort(key=lambda b: b.drop_fraction, reverse=True)
        copies = {p: c for p, c in self._copy_costs.items() if c * 1000 >= 0.05}
        if copies:
            listed = ", ".join(f"{point_label(p)} {c * 1000:.2f} ms" for p, c in copies.items())
            report.notes.append(f"cached values are copied for every sample so in-place transforms cannot pile up ({listed}); "
                                "each drop is measured with that copy discounted")
        report.caveats = self._caveats(report)
        return report

    def _caveats(self, report: Report) -> list[str]:
        caveats = []
        for b in report.bottlenecks:
            if b.cpu_saturated:
                cpu = self.results[b.between[1]].cpu_util
                caveats.append(
                    f"{SATURATION_CAVEAT_START} ({cpu:.0%} of the cores) once {b.stage} was added: it may only be tipping "
                    "an already-saturated CPU over, rather than being slow itself"
                )
        if self.pool == 1:
            caveats.append("one cached sample or batch stands for all: with variable-size inputs, or a model whose work "
                           "depends on the data, rerun with pool > 1 (--pool 4) to check")
        else:
            spreads = [(r.name, r.pool_spread) for r in report.experiments if r.pool_spread is not None]
            for name, spread in spreads:
                caveats.append(f"across the {self.pool} cached batches at '{name}', mean step time varies by {spread:.1%}"
                               + (": the step time depends on the data" if spread > 0.05 else ""))
        shapes = {tuple(tuple(t.shape) for t in _tensors(b)) for b in self.host_batches}
        if len(shapes) > 1:
            caveats.append("batches differ in shape (variable-size inputs): one cached batch may not represent real throughput")
        if self.workers == 0:
            caveats.append("num_workers=0: data loads in the training process, which is not the multi-worker case this method is built for")
        caveats += self._noise_caveats(report)
        return caveats

    def _noise_caveats(self, report: Report) -> list[str]:
        """Signs that the measurements, not the pipeline, are off: other load on the machine, or inverted points."""
        caveats = []
        busy = [(r.name, r.system_cpu_util - r.cpu_util) for r in report.experiments if r.system_cpu_util - r.cpu_util > 0.25]
        if busy:
            name, other = max(busy, key=lambda item: item[1])
            caveats.append(f"other processes used up to {other:.0%} of the CPU during the run (at '{name}'): "
                           "results may be perturbed; rerun on a quieter machine or with more --steps")
        measured = report.experiments
        for upper, lower in zip(measured, measured[1:]):
            if lower.steps_per_s - upper.steps_per_s > max(self._noise(upper, lower), self.threshold * (report.device_bound_steps_per_s or 0)):
                caveats.append(f"'{lower.name}' ran faster than '{upper.name}', which caches more: that is noise or "
                               "interference, not the pipeline; rerun with more --steps")
        return caveats


def _tensors(batch: Any) -> list[Any]:
    from fastpipe._tree import iter_tensors

    return list(iter_tensors(batch))


def _kind_of(components: list[str]) -> str:
    if any(c not in (COPY, COLLATE, RAW_STAGE) and RAW_STAGE not in c for c in components):
        return "transform"
    if any(RAW_STAGE in c for c in components):
        return "raw load"
    return COLLATE if COLLATE in components else COPY


def _as_pipeline_error(exc: BaseException, point: str) -> PipelineError:
    message = str(exc)
    stage = stage_of_error(exc)
    if stage is not None:
        start = message.find(StageError.PREFIX)
        detail = message[start:].splitlines()[0].split("] ", 1)[-1]
        return PipelineError(f"stage '{stage}' raised {detail} (during the '{point_label(point)}' experiment)", stage=stage)
    if isinstance(exc, UnavailablePoint):
        return PipelineError(str(exc), stage=point)
    first_line = message.strip().splitlines()[0] if message.strip() else type(exc).__name__
    return PipelineError(f"the data pipeline failed during the '{point_label(point)}' experiment: {type(exc).__name__}: {first_line}", stage=None)


def diagnose(
    loader: "DataLoader | Workload",
    step: Callable[[Any], Any] | None = None,
    device: "str | Device | None" = None,
    *,
    steps: int = 10,
    warmup: int = 3,
    pool: int = 1,
    threshold: float = 0.05,
    strategy: str = "linear",
    device_transform: Callable[[Any], Any] | None = None,
    prefetch_depth: int = 0,
    model: Any = None,
    optimizer: Any = None,
    progress: bool = True,
    worker_timeout: float = 300.0,
    name: str | None = None,
    stage_costs: bool = True,
) -> Report:
    """Find where an input pipeline loses throughput, by caching data at successive points.

    Args:
        loader: the user's DataLoader (never modified), or a :class:`~fastpipe.Workload`.
        step: ``step(batch)``, one training step on a batch already on the device.
        device: ``cuda[:N]``, ``cpu``, ``sim:STEP_MS[,h2d_gbps=G]`` or a Device (default: cuda if present, else sim:290).
        steps, warmup: measured and untimed steps per experiment; steps round up to whole rounds of workers.
        pool: how many different samples (or batches) each cache point keeps and cycles through.
        threshold: the smallest drop, as a fraction of the device bound, that counts as a bottleneck.
        strategy: ``"linear"`` measures every point; ``"bisect"`` measures the endpoints, then bisects.
        device_transform, prefetch_depth: how the user's loop moves batches to the device.
        model, optimizer: restored bit for bit afterwards (the diagnosis really trains).
        progress: show a progress bar on the terminal.
        worker_timeout: seconds a worker may take for a batch before the run stops, used only
            when the loader sets no timeout of its own.
        stage_costs: when a bottleneck appears at a saturated CPU, time each stage inside the
            workers in one more short pass, to tell "this stage is slow" from "the pipeline as a
            whole exceeds the cores" (:mod:`fastpipe.stagecost`).

    Returns:
        A :class:`~fastpipe.report.Report`; if interrupted with Ctrl-C, a partial one with ``interrupted`` set.

    Raises:
        ConfigError: bad arguments.
        PipelineError: a worker, transform or the step raised; ``.stage`` says where.
    """
    if isinstance(loader, Workload):
        workload = loader
        if step is not None:
            workload = dataclasses.replace(workload, step=step)
    else:
        if not isinstance(loader, DataLoader) and not hasattr(loader, "with_dataset"):
            raise ConfigError(f"diagnose needs a torch.utils.data.DataLoader (or a fastpipe.Workload), not {type(loader).__name__}")
        if step is None or not callable(step):
            raise ConfigError("diagnose needs step, a function step(batch) that runs one training step")
        workload = Workload(loader=loader, step=step, device_transform=device_transform, model=model, optimizer=optimizer,
                            prefetch_depth=prefetch_depth, name=name or "workload")
    if steps < 1 or warmup < 0 or pool < 1:
        raise ConfigError(f"need steps >= 1, warmup >= 0 and pool >= 1; got steps={steps}, warmup={warmup}, pool={pool}")
    if not 0 <= threshold < 1:
        raise ConfigError(f"threshold is a fraction of the device bound, e.g. 0.05; got {threshold}")
    if strategy not in ("linear", "bisect"):
        raise ConfigError(f"strategy must be 'linear' or 'bisect', got {strategy!r}")
    device = parse_device(device)
    diagnosis = _Diagnosis(workload, device, steps, warmup, pool, threshold, strategy, progress, worker_timeout)
    if not device.runs_model and not any("simulates the step" in note for note in workload.notes):
        diagnosis.report.notes.append(f"{device.spec} simulates the step: the training step itself is not run")
    started = time.perf_counter()
    with preserve_user_state(workload.model, workload.optimizer, workload.loader):
        try:
            diagnosis.run()
        except KeyboardInterrupt:
            diagnosis.report.interrupted = True
        finally:
            diagnosis.progress.close()
        report = diagnosis.finish(time.perf_counter() - started)
        report.notes += ray_stats_notes(workload.loader)  # [] unless the loader is Ray-backed
        in_workers = not getattr(workload.loader, "unsupported_point_reason", None)  # stage timers need DataLoader workers
        if stage_costs and in_workers and not report.interrupted and any(b.cpu_saturated for b in report.bottlenecks):
            _settle_saturation(report, workload, device, steps=steps, warmup=warmup, worker_timeout=worker_timeout)
    report.elapsed_s = time.perf_counter() - started
    return report


def _settle_saturation(report: Report, workload: Workload, device: Device, **options: Any) -> None:
    """Time each stage inside the workers, and say for each saturated drop whether the stage or the whole pipeline is at fault."""
    from fastpipe.stagecost import explain_saturation, measure_stage_costs

    try:
        costs = measure_stage_costs(workload, device, **options)
    except KeyboardInterrupt:
        report.interrupted = True
        return
    report.stage_costs = costs.to_dict()
    report.stage_cost_lines = costs.table_lines()
    explained = explain_saturation(report, costs)
    if explained:
        report.caveats = [c for c in report.caveats if not c.startswith(SATURATION_CAVEAT_START)] + explained


def measure_device_bound(
    workload: Workload, device: "str | Device | None", *, steps: int = 10, warmup: int = 3, worker_timeout: float = 300.0
) -> tuple[ExperimentResult, int]:
    """The device point alone, and the bytes of its cached batch (what one batch weighs in shared memory)."""
    from fastpipe._tree import tree_nbytes

    device = parse_device(device)
    diagnosis = _Diagnosis(workload, device, steps, warmup, 1, 0.0, "linear", False, worker_timeout)
    with preserve_user_state(workload.model, workload.optimizer, workload.loader):
        result = diagnosis.measure("device")
    return result, max(tree_nbytes(batch) for batch in diagnosis.host_batches)


def measure_points(
    workload: Workload,
    device: "str | Device | None",
    points: list[str],
    *,
    steps: int = 10,
    warmup: int = 3,
    pool: int = 1,
    progress: bool = False,
    worker_timeout: float = 300.0,
) -> dict[str, ExperimentResult]:
    """Measure only the named cache points of a workload (e.g. ``["device", "baseline"]``), user state preserved.

    ``fraction_of_bound`` is left unset (NaN): the caller decides which bound it is measured against.
    """
    device = parse_device(device)
    diagnosis = _Diagnosis(workload, device, steps, warmup, pool, 0.0, "linear", progress, worker_timeout)
    unknown = [p for p in points if p not in diagnosis.points]
    if unknown:
        raise ConfigError(f"cache points {unknown} are not available for {workload.name}; available: {diagnosis.points}")
    diagnosis.progress.extend(len(points) * (diagnosis.warmup + diagnosis.steps))
    with preserve_user_state(workload.model, workload.optimizer, workload.loader):
        try:
            for point in points:
                diagnosis.measure(point)
        finally:
            diagnosis.progress.close()
    return dict(diagnosis.results)
