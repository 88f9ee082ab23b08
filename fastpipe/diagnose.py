"""The cache-bisection engine: rerun the loop with data cached at successive points.

The plan (:mod:`fastpipe.plan`) lists the points a pipeline allows; this module measures them
(each until its step time is precise enough or its time budget is spent), remeasures pairs whose
difference is borderline, inverted or taken on a loaded machine (interleaved, A B A B), and hands
the step times to :mod:`fastpipe.attribute`, which turns them into milliseconds per step per
stage. The user's DataLoader settings (workers, batch sampler, collate, pinning...) are kept by
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

from fastpipe import ddp
from fastpipe._system import usable_cores
from fastpipe.attribute import SATURATED_CPU, Attribution, verdict_for
from fastpipe.cache import CachePointDataset, UnavailablePoint, probe_point, rebuild_loader, stage_of_error
from fastpipe.devices import Device, parse_device
from fastpipe.errors import ConfigError, PipelineError
from fastpipe.measure import LoaderCycle, Measurement, device_batches, measure_until
from fastpipe.plan import COLLATE, COPY, Plan, make_plan, point_label
from fastpipe.report import TOO_NOISY, Bottleneck, ExperimentResult, Report
from fastpipe.snapshot import preserve_user_state
from fastpipe.discovery import find_pipeline
from fastpipe.stages import StageError
from fastpipe.workload import Workload, loader_batch_size

SATURATION_CAVEAT_START = "the CPU was saturated"
BUSY_MACHINE = 0.25
"""Share of all cores used by other processes above which a point counts as measured on a loaded machine."""
CPU_BACKED = 0.25
"""A span whose CPU time per step (over its workers) is at least this share of its added time counts as CPU work."""
VARIABLE_POOL = 8
"""Samples (or batches) cached per worker when the inputs vary in size."""
LADDER_AGREEMENT = 1.5
"""Ladder time and in-worker time of a stage further apart than this factor are flagged."""

__all__ = ["diagnose", "measure_points", "measure_device_bound", "point_label", "verdict_for", "SATURATED_CPU", "COPY", "COLLATE"]


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
    """A rich progress line: the point being measured, its steps so far and its precision target."""

    def __init__(self, enabled: bool) -> None:
        self._bar = None
        if enabled:
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=True)
            self._task = self._bar.add_task("diagnosing", total=None)
            self._bar.start()
        self._label = ""

    def describe(self, text: str) -> None:
        self._label = text
        if self._bar is not None:
            self._bar.update(self._task, description=text)

    def step(self, i: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=f"{self._label}: step {i + 1}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


class _Runner:
    """Measures cache points of one workload on one device; keeps every measurement it made."""

    def __init__(self, workload: Workload, device: Device, *, steps: int, warmup: int, pool: int, budget_s: float, target: float,
                 progress: bool, worker_timeout: float) -> None:
        self.workload, self.device = workload, device
        loader = workload.loader
        self.workers = loader.num_workers
        self.round = max(1, self.workers)
        self.steps = self.round * math.ceil(steps / self.round)  # whole rounds of workers: batches arrive in bursts
        self.warmup, self.pool, self.budget_s, self.target = warmup, pool, budget_s, target
        self.worker_timeout = worker_timeout
        self.pipeline, why_not = find_pipeline(loader.dataset)
        if getattr(loader, "unsupported_point_reason", None):  # a RayLoader: its stages run inside Ray tasks
            self.pipeline, why_not = None, loader.unsupported_point_reason
        self.plan: Plan = make_plan(self.pipeline, why_not)
        self.results: dict[str, ExperimentResult] = {}
        self.runs: dict[str, list[ExperimentResult]] = {}
        self.host_batches: list[Any] = []
        self.rank_spreads: dict[str, ddp.RankSpread] = {}
        self.baseline_loader: Any = None
        self.progress = _Progress(progress and ddp.is_rank0())

    # ----- batch sources -----------------------------------------------------------------
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

    def _batch_source(self, point: str) -> tuple[Callable[[], Any], Callable[[], None], Any]:
        """(next_batch, close, cache dataset or None) for one experiment."""
        non_blocking = bool(self.workload.loader.pin_memory)
        if point == "device":
            # the device transform is device work, part of the bound: it runs every step, as in the loop
            cached = [self.device.to_device(b, non_blocking=False) for b in self._host_batches()]
            self.device.synchronize()
            cycle = _Repeat(cached, False).__iter__()
            return (lambda: self._device_transform(next(cycle))), (lambda: None), None
        if point == "host":
            repeat = _Repeat(self._host_batches(), non_blocking)
            if self.workload.prefetch_depth > 0:
                from fastpipe.prefetch import make_prefetcher

                transform = self.workload.device_transform if self.device.runs_model else None
                prefetched = LoaderCycle(make_prefetcher(repeat, self.device, depth=self.workload.prefetch_depth, transform=transform, kind=self.workload.prefetcher))
                return (lambda: next(prefetched)), prefetched.close, None
            cycle = iter(repeat)
            return (lambda: self._device_transform(self.device.to_device(next(cycle), non_blocking=non_blocking))), (lambda: None), None
        dataset = self._dataset(point)
        loader = rebuild_loader(self.workload.loader, dataset, timeout=self.worker_timeout)
        if point == "baseline":
            self.baseline_loader = loader  # what the user's own loop runs: its stats (e.g. recycled memory) go in the report
        batches = device_batches(dataclasses.replace(self.workload, loader=loader), self.device)
        return (lambda: next(batches)), batches.close, dataset

    def _run_step(self, batch: Any) -> None:
        try:
            self.device.run_step(self.workload.step, batch)
        except Exception as exc:
            raise PipelineError(f"the training step raised {type(exc).__name__}: {exc}", stage="step") from exc

    # ----- one measurement -------------------------------------------------------------------
    def measure(self, point: str, *, budget_s: float | None = None) -> ExperimentResult:
        """Measure ``point`` once more; the result kept for it pools every run of it."""
        self.progress.describe(point_label(point))
        close, dataset = None, None
        try:
            next_batch, close, dataset = self._batch_source(point)
            measurement = measure_until(
                next_batch, self._run_step, warmup=self.warmup, min_steps=self.steps,
                budget_s=self.budget_s if budget_s is None else budget_s, target=self.target, device=self.device,
                round_size=self.round, on_step=self.progress.step, agree=ddp.all_stop if ddp.world() else None,
            )
        except (PipelineError, KeyboardInterrupt):
            raise
        except Exception as exc:
            raise _as_pipeline_error(exc, point) from exc
        finally:
            if close is not None:
                close()
        run, spread = ddp.slowest(self._result(point, measurement, _copy_ms(dataset, point)))
        if spread is not None:
            previous = self.rank_spreads.get(point)
            self.rank_spreads[point] = spread if previous is None or spread.spread > previous.spread else previous
        self.runs.setdefault(point, []).append(run)
        self.results[point] = _pooled(self.runs[point])
        return run

    def _result(self, point: str, measurement: Measurement, copy_ms: float) -> ExperimentResult:
        return ExperimentResult(
            name=point_label(point), cache_point=point, steps_per_s=measurement.steps_per_s, fraction_of_bound=math.nan,
            spread=measurement.spread, noise=measurement.rel_stderr, cpu_util=measurement.cpu_util,
            system_cpu_util=measurement.system_cpu_util, pool_spread=self._pool_spread(point, measurement),
            step_times=measurement.step_times, steps_measured=len(measurement.step_times), copy_ms_per_sample=copy_ms,
            round_size=self.round,
        )

    def _pool_spread(self, point: str, measurement: Measurement) -> float | None:
        """Across the cached batches of the device and host points: how much the step time depends on the data."""
        if self.pool < 2 or point not in ("device", "host"):
            return None
        slots: dict[int, list[float]] = {}
        for i, seconds in enumerate(measurement.step_times):
            slots.setdefault((self.warmup + i) % self.pool, []).append(seconds)
        means = [statistics.fmean(v) for v in slots.values()]
        return statistics.pstdev(means) / statistics.fmean(means) if len(means) > 1 else None


def _pooled(runs: list[ExperimentResult]) -> ExperimentResult:
    """One result from several runs of a point: all step times, CPU weighted by steps, noise from all rounds."""
    if len(runs) == 1:
        return runs[0]
    times = [t for run in runs for t in run.step_times]
    weights = [len(run.step_times) for run in runs]
    measurement = Measurement(times, 0.0, 0.0, round_size=runs[0].round_size)
    # rounds of each run are independent; run-to-run drift shows as spread between their rounds
    return dataclasses.replace(
        runs[-1], steps_per_s=measurement.steps_per_s, spread=measurement.spread, noise=measurement.rel_stderr,
        cpu_util=_weighted([r.cpu_util for r in runs], weights), system_cpu_util=_weighted([r.system_cpu_util for r in runs], weights),
        step_times=times, steps_measured=len(times), copy_ms_per_sample=_weighted([r.copy_ms_per_sample for r in runs], weights),
    )


def _weighted(values: list[float], weights: list[int]) -> float:
    pairs = [(v, w) for v, w in zip(values, weights) if not math.isnan(v)]
    return sum(v * w for v, w in pairs) / sum(w for _, w in pairs) if pairs else math.nan


def _copy_ms(dataset: Any, point: str) -> float:
    """The cache's own per-sample copy at ``point``, in ms, as the workers timed it (0 where no copy was needed)."""
    if dataset is None or not (point == "raw" or point.startswith("after:")):
        return 0.0
    seconds = dataset.copy_seconds_per_sample()
    return 0.0 if seconds is None or math.isnan(seconds) else seconds * 1000


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


# ----- the strategy ------------------------------------------------------------------------
class _Diagnosis:
    def __init__(self, runner: _Runner, workload: Workload, threshold: float, strategy: str, pool_reason: str | None) -> None:
        self.runner, self.workload, self.threshold, self.strategy = runner, workload, threshold, strategy
        self.unresolved: dict[tuple[str, str], str] = {}
        self.calls_per_sample: int | None = None
        self.remeasured: set[tuple[str, str]] = set()
        r = runner
        self.report = Report(
            workload=workload.name, device=r.device.spec, num_workers=r.workers, batch_size=loader_batch_size(workload.loader),
            steps=r.steps, warmup=r.warmup, pool=r.pool, threshold=threshold, strategy=strategy, precision_target=r.target,
            budget_s=r.budget_s, notes=list(workload.notes),
        )
        if pool_reason:
            self.report.notes.append(pool_reason)

    @property
    def plan(self) -> Plan:
        return self.runner.plan

    def attribution(self) -> Attribution:
        return Attribution(self.plan, self.runner.results, self.threshold, loader_batch_size(self.workload.loader), self.runner.workers)

    def measure(self, point: str, **kwargs: Any) -> bool:
        """Measure a point; a middle point that cannot be built is dropped from the plan with its reason."""
        try:
            self.runner.measure(point, **kwargs)
            return True
        except PipelineError as exc:
            if point in ("device", "host", "baseline") or exc.stage == "step":
                raise
            cause = exc.__cause__
            reason = cause.reason if isinstance(cause, UnavailablePoint) and getattr(cause, "reason", None) else str(exc)
            self.plan.drop(point, f"this point could not be built or failed ({reason}); the stages around it are measured as one span")
            self.runner.results.pop(point, None)
            return False

    def probe(self) -> None:
        """Capture one sample at each middle point in this process: drop the points that cannot be built,
        and learn how many times the dataset calls its transform per sample (two views: 2)."""
        drops, calls = ddp.from_rank0(self._probe_points())  # one plan for every rank
        for point, reason in drops:
            self.plan.drop(point, f"{reason}; the stages around it are measured as one span")
        self.calls_per_sample = calls

    def _probe_points(self) -> tuple[list[tuple[str, str]], int | None]:
        pipeline, dataset = self.runner.pipeline, self.workload.loader.dataset
        drops: list[tuple[str, str]] = []
        calls = None
        if pipeline is None:
            return drops, calls
        for point in [p for p in self.plan.points if p == "raw" or p.startswith("after:")]:
            try:
                probe = probe_point(dataset, pipeline, point, timeout=self.runner.worker_timeout)
            except Exception:  # the user's own code failing or hanging: the measurement reports it with its stage
                break
            if probe.reason:
                drops.append((point, probe.reason))
            elif probe.calls_per_sample and probe.calls_per_sample > 1:
                calls = probe.calls_per_sample
        return drops, calls

    def run(self) -> None:
        self.probe()
        self.measure("device")
        self.measure("baseline")
        points = self.plan.points
        if not self.attribution().significant("device", "baseline"):
            skipped = [p for p in points if p not in self.runner.results]
            if skipped:
                self.report.notes.append(f"the baseline is within noise and threshold of the device bound, so {', '.join(skipped)} were not measured")
            return
        if self.strategy == "linear":
            for point in list(points[1:-1]):
                self.measure(point)
        else:
            self._bisect("device", "baseline")
        self._remeasure_suspects()

    def _bisect(self, upper: str, lower: str) -> None:
        points = self.plan.points
        a, b = points.index(upper), points.index(lower)
        if b - a <= 1 or not self.attribution().significant(upper, lower):
            return
        mid = points[(a + b) // 2]
        if not self.measure(mid):
            return self._bisect(upper, lower)
        self._bisect(upper, mid)
        self._bisect(mid, lower)

    def _busy(self, point: str) -> float:
        result = self.runner.results[point]
        return max(0.0, result.system_cpu_util - result.cpu_util)

    def _suspects(self) -> list[tuple[str, str]]:
        attribution = self.attribution()
        measured = attribution.measured()
        out = []
        for pair in zip(measured, measured[1:]):
            if pair in self.remeasured:
                continue
            loaded = max(self._busy(pair[0]), self._busy(pair[1])) > BUSY_MACHINE
            if attribution.borderline(*pair) or attribution.inverted(*pair) or (loaded and attribution.significant(*pair)):
                out.append(pair)
        return out

    def _remeasure_suspects(self) -> None:
        """Remeasure, interleaved, each pair whose difference is borderline, inverted or taken on a loaded machine.

        The pair's cost must hold in the fresh back-to-back measurement too; otherwise it is unresolved.
        """
        for upper, lower in self._suspects():
            first = self.attribution()
            was_named, was_inverted = first.significant(upper, lower), first.inverted(upper, lower)
            self.remeasured.add((upper, lower))
            budget = max(self.runner.budget_s / 2, 1.0)
            fresh_upper = self.runner.measure(upper, budget_s=budget)
            fresh_lower = self.runner.measure(lower, budget_s=budget)
            fresh = Attribution(self.plan, {"device": self.runner.results["device"], upper: fresh_upper, lower: fresh_lower},
                                self.threshold, loader_batch_size(self.workload.loader), self.runner.workers)
            loaded = max(fresh_upper.system_cpu_util - fresh_upper.cpu_util, fresh_lower.system_cpu_util - fresh_lower.cpu_util)
            if was_named and not fresh.significant(upper, lower):
                self.unresolved[(upper, lower)] = "its cost did not hold when the two points were remeasured back to back"
            elif was_named and loaded > BUSY_MACHINE and fresh_lower.system_cpu_util >= SATURATED_CPU and self._uses_cpu(fresh_upper, fresh_lower):
                # the cores were all busy, part of them with other processes, and the stage burns CPU: a
                # stage that hides under the device step on a quiet machine can show here only for want of CPU
                self.unresolved[(upper, lower)] = (f"other processes used {loaded:.0%} of the CPU while it was remeasured and the "
                                                   "cores were saturated: its cost cannot be told from theirs")
            elif was_inverted and fresh.inverted(upper, lower):
                self.report.caveats.append(
                    f"'{point_label(lower)}' ran faster than '{point_label(upper)}', which caches more, twice in a row: "
                    "that is interference or a cache point that changes the work, not the pipeline")

    def _uses_cpu(self, upper: ExperimentResult, lower: ExperimentResult) -> bool:
        """Whether the span between two points burns enough CPU that other processes' load could explain its time.

        Contention slows only CPU work: a stage that waits (I/O, sleeps) costs the same on a busy machine.
        """
        cores = usable_cores()
        cpu_per_step = [r.cpu_util * cores * r.ms_per_step for r in (upper, lower)]
        cpu_time = (cpu_per_step[1] - cpu_per_step[0]) / max(1, min(self.runner.workers, cores))
        added = lower.ms_per_step - upper.ms_per_step
        return cpu_time > CPU_BACKED * added

    # ----- the report ------------------------------------------------------------------------
    def finish(self, elapsed: float) -> Report:
        report, results = self.report, self.runner.results
        report.elapsed_s = elapsed
        report.unavailable = list(self.plan.unavailable)
        measured = [p for p in self.plan.points if p in results]
        report.experiments = [results[p] for p in measured]
        if "device" not in results:
            return report
        attribution = self.attribution()
        bound = results["device"].steps_per_s
        report.device_bound_steps_per_s = bound
        report.device_step_ms = 1000 / bound
        for result in report.experiments:
            result.fraction_of_bound = result.steps_per_s / bound
        baseline = results.get("baseline")
        baseline_s = None
        if baseline is not None:
            baseline_s = 1 / baseline.steps_per_s
            report.baseline_step_ms = baseline_s * 1000
            report.gap_fraction = max(0.0, 1 - (1 / bound) / baseline_s)
            report.verdict = verdict_for(report.gap_fraction)
        report.components = attribution.components(baseline_s)
        for component in report.components:
            pair = component.between
            if self.calls_per_sample and component.kind == "transform":
                component.calls_per_sample = self.calls_per_sample
            if pair in self.unresolved:
                _advise(component, self.runner.pipeline, self.workload.loader.dataset, self.runner.workers)
                report.unresolved.append(component)
                report.caveats.append(f"{component.stage}: {self.unresolved[pair]}")
            elif attribution.significant(*pair):
                _advise(component, self.runner.pipeline, self.workload.loader.dataset, self.runner.workers)
                report.bottlenecks.append(component)
        report.bottlenecks.sort(key=lambda b: b.added_ms, reverse=True)
        if report.unresolved and not report.bottlenecks and report.gap_fraction and report.gap_fraction >= 0.05:
            report.verdict = TOO_NOISY
        copies = {p: results[p].copy_ms_per_sample for p in measured if results[p].copy_ms_per_sample >= 0.05}
        if copies:
            listed = ", ".join(f"{point_label(p)} {ms:.2f} ms" for p, ms in copies.items())
            report.notes.append(f"cached values are copied for every sample so in-place transforms cannot pile up; the copy was "
                                f"timed inside the workers ({listed} per sample) and taken out of each point's step")
        report.caveats += self._caveats(report)
        stats = getattr(self.runner.baseline_loader, "stats", None)
        if callable(stats):
            report.notes += _loader_stat_notes(stats())
        if self.runner.rank_spreads:
            point, widest = max(self.runner.rank_spreads.items(), key=lambda item: item[1].spread)
            _, size = ddp.world() or (0, 1)
            report.notes.append(f"DDP with {size} ranks: every point shows its slowest rank, and all ranks followed one plan; "
                                f"the ranks' step times differed by up to {widest.spread:.0%} (at '{point_label(point)}', "
                                f"slowest rank {widest.slowest_rank})")
        return report

    def _caveats(self, report: Report) -> list[str]:
        caveats = []
        for b in report.bottlenecks:
            if b.cpu_saturated:
                cpu = self.runner.results[b.between[1]].cpu_util
                caveats.append(
                    f"{SATURATION_CAVEAT_START} ({cpu:.0%} of the cores) once {b.stage} was added: it may only be tipping "
                    "an already-saturated CPU over, rather than being slow itself"
                )
        pool = self.runner.pool
        if pool > 1:
            for r in report.experiments:
                if r.pool_spread is not None and r.pool_spread > 0.05:
                    caveats.append(f"across the {pool} cached batches at '{r.name}', mean step time varies by {r.pool_spread:.1%}: "
                                   "the step time depends on the data")
        if self.runner.workers == 0:
            caveats.append("num_workers=0: data loads in the training process, which is not the multi-worker case this method is built for")
        if self.runner.device.kind == "cpu":
            caveats.append("on --device cpu the model and the workers share the same cores, so the device bound is low and every "
                           "pipeline stage also slows the step; a GPU (or --device sim:STEP_MS) separates them")
        busy = [(r.name, r.system_cpu_util - r.cpu_util) for r in report.experiments if r.system_cpu_util - r.cpu_util > BUSY_MACHINE]
        if busy:
            name, other = max(busy, key=lambda item: item[1])
            caveats.append(f"other processes used up to {other:.0%} of the CPU during the run (at '{name}'): "
                           "pairs measured then were remeasured back to back; rerun on a quieter machine to be sure")
        imprecise = [r for r in report.experiments if r.noise > self.runner.target]
        if imprecise:
            listed = ", ".join(f"{r.name} ±{r.noise:.1%}" for r in imprecise)
            caveats.append(f"{len(imprecise)} point(s) did not reach the {self.runner.target:.0%} precision target within the "
                           f"{self.runner.budget_s:g} s budget ({listed}); raise --budget for a firmer answer")
        return caveats


def _loader_stat_notes(stats: dict[str, Any]) -> list[str]:
    """What a loader that reports its own statistics (fastpipe.recycled) did during the baseline point."""
    if "reused" not in stats:
        return []
    line = (f"recycled batch memory: {stats['reused']} of {stats['batches']} batches went into reused buffers; "
            f"{stats['fallbacks']} fresh allocations because every slot was in use (raise slots=), {stats['grown']} larger "
            f"buffers (batches outgrew their slot), {stats['kept']} batches kept by the loop")
    return [line + (f"; pinning: {stats['pinning']}" if stats.get("pinning") else "")]


def _advise(component: Bottleneck, pipeline: Any, dataset: Any, workers: int) -> None:
    """Fill in the component's recommendation (and snippet) for its own stage.

    A worker-side stage found while the cores had room also gets the tuner's advice: more workers
    may carry it before any stage is made cheaper.
    """
    from fastpipe.advice import recommend

    stages = None if pipeline is None else [stage.transform for stage in pipeline.stages]
    advice = recommend(component.stage, component.kind, transform=stages, dataset=dataset)
    component.recommendation = advice.text()
    component.snippet = advice.snippet
    if component.kind not in (COPY,) and not component.cpu_saturated and 0 < workers < usable_cores():
        component.recommendation += " " + recommend(component.stage, "too few workers").summary


class _Captured(BaseException):
    """Raised by the probe transform to stop a sample right after its raw input is seen (BaseException:
    a dataset's own ``except Exception`` must not swallow it)."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value


def _capture_raw(value: Any) -> Any:
    raise _Captured(value)


def _variable_inputs(runner: _Runner, samples: int = 6) -> str | None:
    """Why the inputs look variable (raw sizes differ among the first samples), or None.

    Only the raw load runs here, in the main process: the probe transform stops each sample
    before any transform, so a slow or hanging transform cannot hold the diagnosis up.
    """
    dataset = runner.workload.loader.dataset
    try:
        length = len(dataset)
    except TypeError:
        return None
    pipeline = runner.pipeline
    probe = pipeline.with_transform(dataset, _capture_raw) if pipeline is not None and pipeline.stages else None
    sizes = set()
    for index in range(min(samples, length)):
        try:
            value = dataset[index] if probe is None else probe[index]
        except _Captured as captured:
            value = captured.value
        except Exception:
            return None
        sizes.add(_size_of(value))
    return f"the first {min(samples, length)} samples differ in size ({len(sizes)} sizes)" if len(sizes) > 1 else None


def _size_of(value: Any) -> Any:
    if hasattr(value, "size") and not callable(value.size) and isinstance(value.size, tuple):  # PIL image
        return value.size
    if hasattr(value, "shape"):
        return tuple(value.shape)
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, (list, tuple)):
        return tuple(_size_of(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _size_of(v)) for k, v in value.items()))
    return type(value).__name__


def diagnose(
    loader: "DataLoader | Workload",
    step: Callable[[Any], Any] | None = None,
    device: "str | Device | None" = None,
    *,
    steps: int = 10,
    warmup: int = 3,
    pool: int | None = None,
    threshold: float = 0.05,
    strategy: str = "linear",
    budget: float = 20.0,
    precision: float = 0.03,
    device_transform: Callable[[Any], Any] | None = None,
    prefetch_depth: int = 0,
    model: Any = None,
    optimizer: Any = None,
    schedulers: Any = (),
    scaler: Any = None,
    progress: bool = True,
    worker_timeout: float = 300.0,
    name: str | None = None,
    stage_costs: bool = True,
) -> Report:
    """Find where an input pipeline loses time, by caching data at successive points.

    Args:
        loader: the user's DataLoader (never modified), or a :class:`~fastpipe.Workload`.
        step: ``step(batch)``, one training step on a batch already on the device.
        device: ``cuda[:N]``, ``cpu``, ``sim:STEP_MS[,...]`` or a Device (default: cuda if present, else sim:290).
        steps, warmup: the fewest measured steps and the untimed steps per point; steps round up to whole rounds of workers.
        pool: samples (or batches) each cache point keeps and cycles through; by default 1, or 8 when
            the first samples differ in size (the report says so).
        threshold: the smallest added time that counts, as a fraction of the device step.
        strategy: ``"linear"`` measures every point; ``"bisect"`` measures the endpoints, then bisects.
        budget: seconds of measuring per point before it stops short of the precision target.
        precision: target relative standard error of each point's mean step time.
        device_transform, prefetch_depth: how the user's loop moves batches to the device.
        model, optimizer, schedulers, scaler: restored afterwards (the diagnosis really trains): parameters,
            buffers, gradients and train/eval mode, the optimizer's, each LR scheduler's and the GradScaler's state.
        progress: show a progress line on the terminal.
        worker_timeout: seconds a worker may take for a batch before the run stops, used only
            when the loader sets no timeout of its own.
        stage_costs: when a stage in the workers is named, time each stage inside the workers in
            one more short pass, to check the ladder against it and settle saturation caveats.

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
                            schedulers=list(schedulers) if isinstance(schedulers, (list, tuple)) else [] if schedulers is None else [schedulers],
                            scaler=scaler, prefetch_depth=prefetch_depth, name=name or "workload")
    if steps < 1 or warmup < 0 or (pool is not None and pool < 1):
        raise ConfigError(f"need steps >= 1, warmup >= 0 and pool >= 1; got steps={steps}, warmup={warmup}, pool={pool}")
    if not 0 <= threshold < 1:
        raise ConfigError(f"threshold is a fraction of the device step, e.g. 0.05; got {threshold}")
    if strategy not in ("linear", "bisect"):
        raise ConfigError(f"strategy must be 'linear' or 'bisect', got {strategy!r}")
    if not budget > 0 or not 0 < precision < 1:
        raise ConfigError(f"need budget > 0 seconds and 0 < precision < 1; got budget={budget}, precision={precision}")
    device = parse_device(device)
    started = time.perf_counter()
    runner = _Runner(workload, device, steps=steps, warmup=warmup, pool=pool or 1, budget_s=budget, target=precision,
                     progress=progress, worker_timeout=worker_timeout)
    pool_reason = None
    if pool is None:
        why = ddp.from_rank0(_variable_inputs(runner) if ddp.is_rank0() else None)
        if why:
            runner.pool = VARIABLE_POOL
            pool_reason = (f"{why}, so each cache point keeps {VARIABLE_POOL} samples (or batches) per worker instead of one "
                           "(set pool= / --pool to choose)")
    diagnosis = _Diagnosis(runner, workload, threshold, strategy, pool_reason)
    if not device.runs_model and not any("simulates the step" in note for note in workload.notes):
        diagnosis.report.notes.append(f"{device.spec} simulates the step: the training step itself is not run "
                                      "(fastpipe diagnose --check-step runs it once on a real batch on the CPU)")
    with preserve_user_state(workload.model, workload.optimizer, workload.loader, schedulers=workload.schedulers, scaler=workload.scaler):
        try:
            diagnosis.run()
        except KeyboardInterrupt:
            diagnosis.report.interrupted = True
        finally:
            runner.progress.close()
        report = diagnosis.finish(time.perf_counter() - started)
        report.notes += _ray_notes(workload.loader)
        in_workers = not getattr(workload.loader, "unsupported_point_reason", None)  # stage timers need DataLoader workers
        worker_side = [b for b in report.bottlenecks + report.unresolved if b.kind not in (COPY,)]
        if stage_costs and in_workers and not report.interrupted and worker_side and runner.workers > 0:
            _check_against_stage_costs(report, workload, device, steps=steps, warmup=warmup, worker_timeout=worker_timeout)
    report.elapsed_s = time.perf_counter() - started
    return report


def _ray_notes(loader: Any) -> list[str]:
    if not getattr(loader, "unsupported_point_reason", None):
        return []
    from fastpipe.distributed.stats import ray_stats_notes  # only Ray-backed loaders have these

    return ray_stats_notes(loader)


def _check_against_stage_costs(report: Report, workload: Workload, device: Device, **options: Any) -> None:
    """Time each stage inside the workers; check each named stage's ladder time against it, and settle saturation caveats."""
    from fastpipe.stagecost import explain_saturation, measure_stage_costs

    try:
        costs = measure_stage_costs(workload, device, **options)
    except KeyboardInterrupt:
        report.interrupted = True
        return
    except PipelineError as exc:
        report.notes.append(f"the in-worker stage timing could not run ({exc}); the ladder stands alone")
        return
    report.stage_costs = costs.to_dict()
    report.stage_cost_lines = costs.table_lines()
    batch, workers = report.batch_size or costs.batch_size, max(1, costs.parallelism)
    known = {s.name: s for s in costs.stages}
    for b in report.bottlenecks + report.unresolved:
        parts = [known.get("collate" if p.startswith("collate") else p) for p in b.stage.split(" + ")]
        if batch and parts and all(parts):
            b.in_worker_ms = sum(p.ms_per_sample for p in parts) * batch / workers
    report.caveats += _ladder_disagreements(report)
    if any(b.cpu_saturated for b in report.bottlenecks):
        explained = explain_saturation(report, costs)
        if explained:
            report.caveats = [c for c in report.caveats if not c.startswith(SATURATION_CAVEAT_START)] + explained


def _ladder_disagreements(report: Report) -> list[str]:
    """Where the ladder's time per step and the in-worker timing disagree, say so and why."""
    lines = []
    checked = [b for b in report.bottlenecks if b.in_worker_ms]
    for b in checked:
        ratio = b.added_ms / b.in_worker_ms
        if 1 / LADDER_AGREEMENT <= ratio <= LADDER_AGREEMENT:
            continue
        why = ("its upper point ran at the device bound, so part of its cost hides under the device step"
               if b.at_least and ratio < 1 else
               "the CPU was saturated there, so the workers shared the cores with the training process and each other"
               if b.cpu_saturated else "the two measurements disagree beyond their noise")
        lines.append(f"{b.stage}: the ladder puts {b.added_ms:.0f} ms per step on it, the in-worker timing {b.in_worker_ms:.0f} ms "
                     f"(x{ratio:.2f}): {why}")
    by_ladder = [b.stage for b in sorted(checked, key=lambda b: b.added_ms, reverse=True)]
    by_workers = [b.stage for b in sorted(checked, key=lambda b: b.in_worker_ms or 0.0, reverse=True)]
    if by_ladder[:2] != by_workers[:2] and len(checked) > 1:
        lines.append(f"the ladder ranks {', '.join(by_ladder[:2])} first, the in-worker timing {', '.join(by_workers[:2])}: "
                     "trust the in-worker timing for stages whose upper point ran at the device bound")
    return lines


def measure_device_bound(
    workload: Workload, device: "str | Device | None", *, steps: int = 10, warmup: int = 3, worker_timeout: float = 300.0,
    budget: float = 20.0, precision: float = 0.03,
) -> tuple[ExperimentResult, int]:
    """The device point alone, and the bytes of its cached batch (what one batch weighs in shared memory)."""
    from fastpipe._tree import tree_nbytes

    device = parse_device(device)
    runner = _Runner(workload, device, steps=steps, warmup=warmup, pool=1, budget_s=budget, target=precision, progress=False,
                     worker_timeout=worker_timeout)
    with preserve_user_state(workload.model, workload.optimizer, workload.loader, schedulers=workload.schedulers, scaler=workload.scaler):
        runner.measure("device")
    return runner.results["device"], max(tree_nbytes(batch) for batch in runner.host_batches)


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
    budget: float = 20.0,
    precision: float = 0.03,
) -> dict[str, ExperimentResult]:
    """Measure only the named cache points of a workload (e.g. ``["device", "baseline"]``), user state preserved.

    ``fraction_of_bound`` is left unset (NaN): the caller decides which bound it is measured against.
    """
    device = parse_device(device)
    runner = _Runner(workload, device, steps=steps, warmup=warmup, pool=pool, budget_s=budget, target=precision,
                     progress=progress, worker_timeout=worker_timeout)
    unknown = [p for p in points if p not in runner.plan.points]
    if unknown:
        raise ConfigError(f"cache points {unknown} are not available for {workload.name}; available: {runner.plan.points}")
    with preserve_user_state(workload.model, workload.optimizer, workload.loader, schedulers=workload.schedulers, scaler=workload.scaler):
        try:
            for point in points:
                runner.measure(point)
        finally:
            runner.progress.close()
    return dict(runner.results)

