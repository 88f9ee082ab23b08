"""Measuring cache points: the batch source for each point, and one measurement of it.

:class:`PointRunner` builds, for a point, the loader (a wrapped copy of the user's dataset in a
loader with every setting of theirs) or the cached batches that feed the step; measures it to a
precision target within a budget (:func:`fastpipe.diagnosis.ladder._measure.measure_until`); and keeps every run of
every point, pooled. Under DDP each run is gathered from all ranks and the slowest kept
(:mod:`fastpipe.diagnosis.runtime._ddp`). The strategy that decides what to measure lives in :mod:`fastpipe.diagnosis._diagnose`;
:func:`measure_points` and :func:`measure_device_bound` serve the experiments (``compare``, ``tune``) that
measure chosen points of several workloads.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Callable, Iterator

from fastpipe.devices import Device, parse_device
from fastpipe.diagnosis.discovery._pipeline import find_pipeline
from fastpipe.diagnosis.ladder._batches import leading_size
from fastpipe.diagnosis.ladder._cache import UnavailablePoint, stage_of_error
from fastpipe.diagnosis.ladder._cachepoint import BASELINE, DEVICE, HOST, SAMPLE, CachePoint
from fastpipe.diagnosis.ladder._loader_stages import LoaderStageCosts, StageWindow
from fastpipe.diagnosis.ladder._measure import LoaderCycle, Measurement, device_batches, measure_until
from fastpipe.diagnosis.ladder._noise import pool
from fastpipe.diagnosis.ladder._plan import HAND_OVER, Plan, make_plan, point_label
from fastpipe.diagnosis.ladder._results import ExperimentResult
from fastpipe.diagnosis.ladder._serve import cache_point_dataset
from fastpipe.diagnosis.memory._section import PointMemory, child_pids, point_memory
from fastpipe.diagnosis.runtime import _ddp as ddp
from fastpipe.diagnosis.runtime._options import MeasureOptions
from fastpipe.diagnosis.runtime._snapshot import preserve_user_state
from fastpipe.errors import ConfigError, PipelineError
from fastpipe.loading._protocols import TimesOwnStages, batches_whole, stages_outside_workers
from fastpipe.loading._rebuild import discard_loader, rebuild_loader
from fastpipe.stages import RAW_STAGE, StageError
from fastpipe.workloads._workload import Workload


class Repeat:
    """An endless iterable over a few cached host batches, shaped like a loader for the prefetcher."""

    def __init__(self, batches: list[Any], pin_memory: bool) -> None:
        self.batches, self.pin_memory = batches, pin_memory

    def __iter__(self) -> Iterator[Any]:
        while True:
            yield from self.batches

    def __len__(self) -> int:
        return 2**31 - 1


class Progress:
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


def loader_plan(loader: Any) -> tuple[Any, Plan]:
    """(the pipeline found in ``loader``'s dataset or None, the plan of its cache points): what a
    :class:`PointRunner` measures, known before it runs (script mode's estimate counts its points)."""
    pipeline, why_not = find_pipeline(loader.dataset)
    if stages_outside_workers(loader):  # a RayLoader: its stages run inside Ray tasks
        pipeline, why_not = None, stages_outside_workers(loader)
    plan = make_plan(pipeline, why_not)
    whole = batches_whole(loader)
    if whole:  # the ThreadLoader's batch decode: a cached sample stands for no step of it
        plan.drop(SAMPLE, whole, label=f"{RAW_STAGE} + transforms + {HAND_OVER}")
    return pipeline, plan


class PointRunner:
    """Measures cache points of one workload on one device; keeps every measurement it made."""

    def __init__(
        self,
        workload: Workload,
        device: Device,
        options: MeasureOptions | None = None,
        *,
        pool: int = 1,
        progress: bool = False,
    ) -> None:
        """``options``: how long and how precisely each point is measured (the defaults: ``MeasureOptions()``);
        ``pool``: samples each cache point cycles through; ``progress``: the live progress line."""
        options = MeasureOptions() if options is None else options
        self.workload, self.device, self.options = workload, device, options
        loader = workload.loader
        self.workers = loader.num_workers
        self.round = max(1, self.workers)
        self.steps = self.round * math.ceil(options.steps / self.round)  # whole rounds of workers: batches arrive in bursts
        self.warmup, self.pool, self.budget_s, self.target = options.warmup, pool, options.budget, options.precision
        self.worker_timeout = options.worker_timeout
        self.pipeline, self.plan = loader_plan(loader)
        self.results: dict[str, ExperimentResult] = {}
        self.runs: dict[str, list[ExperimentResult]] = {}
        self.host_batches: list[Any] = []
        self.delivered_batch_size: int | None = None
        """The first dimension of the first host batch, kept after the batches are released (a custom batch
        sampler's loader has no ``batch_size``; attribution needs the samples per step)."""
        self._host_loader: Any = None
        """The loader the host batches came from: they may live in its buffers, so it is discarded with them."""
        self.rank_spreads: dict[str, ddp.RankSpread] = {}
        self.baseline_loader: Any = None
        self.progress = Progress(progress and ddp.is_rank0())
        self.memory: dict[str, PointMemory] = {}
        """What each point's processes held when its timed steps ended (the largest over its runs)."""
        self.stage_windows: list[StageWindow] = []
        """The baseline runs' timed windows of a loader that times its own stages (see :meth:`loader_stage_costs`)."""

    # ----- batch sources -----------------------------------------------------------------
    def _host_batches(self) -> list[Any]:
        if not self.host_batches:
            loader = self._host_loader = rebuild_loader(self.workload.loader, self._dataset(BASELINE), timeout=self.worker_timeout)
            cycle = LoaderCycle(loader, self.device)
            try:
                self.host_batches = [next(cycle) for _ in range(self.pool)]
            finally:
                cycle.close()
            self.delivered_batch_size = leading_size(self.host_batches[0])
        return self.host_batches

    def close(self) -> None:
        """End the run: the progress line, and the cached host batches with the loader that made them."""
        self.progress.close()
        self.host_batches = []
        discard_loader(self._host_loader)
        self._host_loader = None

    def _dataset(self, point: str) -> Any:
        dataset = self.workload.loader.dataset
        if point == BASELINE and self.pipeline is None:
            return dataset
        return cache_point_dataset(dataset, self.pipeline, point, self.pool)

    def _device_transform(self, batch: Any) -> Any:
        transform = self.workload.device_transform
        return batch if transform is None or not self.device.runs_model else transform(batch)

    def _batch_source(self, point: str) -> tuple[Callable[[], Any], Callable[[], None], Any]:
        """(next_batch, close, cache dataset or None) for one experiment."""
        non_blocking = bool(self.workload.loader.pin_memory)
        if point == DEVICE:
            # the device transform is device work, part of the bound: it runs every step, as in the loop
            cached = [self.device.to_device(b, non_blocking=False) for b in self._host_batches()]
            self.device.synchronize()
            cycle = Repeat(cached, False).__iter__()
            return (lambda: self._device_transform(next(cycle))), (lambda: None), None
        if point == HOST:
            repeat = Repeat(self._host_batches(), non_blocking)
            if self.workload.prefetch_depth > 0:
                from fastpipe.loading._prefetch import make_prefetcher

                transform = self.workload.device_transform if self.device.runs_model else None
                prefetched = LoaderCycle(
                    make_prefetcher(
                        repeat, self.device, depth=self.workload.prefetch_depth, transform=transform, kind=self.workload.prefetcher
                    )
                )
                return (lambda: next(prefetched)), prefetched.close, None
            cycle = iter(repeat)
            return (lambda: self._device_transform(self.device.to_device(next(cycle), non_blocking=non_blocking))), (lambda: None), None
        dataset = self._dataset(point)
        loader = rebuild_loader(self.workload.loader, dataset, timeout=self.worker_timeout)
        if point == BASELINE:
            self.baseline_loader = loader  # what the user's own loop runs: its stats (e.g. recycled memory) go in the report
        batches = device_batches(dataclasses.replace(self.workload, loader=loader), self.device)

        def close() -> None:
            batches.close()
            discard_loader(loader)  # a point's loader is done with once measured: free its buffers now

        return (lambda: next(batches)), close, dataset

    def _run_step(self, batch: Any) -> None:
        try:
            self.device.run_step(self.workload.step, batch)
        except Exception as exc:
            raise PipelineError(f"the training step raised {type(exc).__name__}: {exc}", stage="step") from exc

    # ----- one measurement -------------------------------------------------------------------
    def measure(self, point: str, *, budget_s: float | None = None) -> ExperimentResult:
        """Measure ``point`` once more; the result kept for it pools every run of it.

        Under DDP a point that fails on any rank raises on every rank, with the failing rank's error.
        """
        self.progress.describe(point_label(point))
        if ddp.world() is None:
            measurement, copy = self._measure_once(point, budget_s, agree=None)
        else:
            measurement, copy = self._measure_on_every_rank(point, budget_s)
        run, spread = ddp.slowest(self._result(point, measurement, copy))
        if spread is not None:
            previous = self.rank_spreads.get(point)
            self.rank_spreads[point] = spread if previous is None or spread.spread > previous.spread else previous
        self.runs.setdefault(point, []).append(run)
        self.results[point] = pooled(self.runs[point])
        return run

    def _measure_once(self, point: str, budget_s: float | None, agree: Callable[[bool], bool] | None) -> tuple[Measurement, float]:
        """One measurement of ``point`` and the cache's copy time per sample (ms); failures as PipelineError."""
        close, dataset = None, None
        try:
            known = child_pids()
            next_batch, close, dataset = self._batch_source(point)
            close = self._memory_then(point, known, close)
            window = self._stage_window(point)
            measurement = self._measure_steps(next_batch, self.budget_s if budget_s is None else budget_s, window, agree)
            if window is not None:
                self.stage_windows.append(window.finish())
        except (PipelineError, KeyboardInterrupt, _PeerFailed):
            raise
        except Exception as exc:
            raise as_pipeline_error(exc, point) from exc
        finally:
            if close is not None:
                close()
        return measurement, copy_ms(dataset, point)

    def _measure_steps(
        self,
        next_batch: Callable[[], Any],
        budget_s: float,
        window: StageWindow | None,
        agree: Callable[[bool], bool] | None,
    ) -> Measurement:
        """Steps on ``next_batch``'s batches until precise or out of budget: the one part a runner whose step is not
        its own (script mode's :class:`~fastpipe.diagnosis._windows.WindowRunner`) measures differently."""
        return measure_until(
            next_batch,
            self._run_step,
            warmup=self.warmup,
            min_steps=self.steps,
            budget_s=budget_s,
            target=self.target,
            device=self.device,
            round_size=self.round,
            on_step=self.progress.step if window is None else window.and_then(self.progress.step),
            agree=agree,
        )

    def _stage_window(self, point: str) -> StageWindow | None:
        """For the baseline of a loader that times its own stages (the ThreadLoader), its clocks' window, opened now
        if there is no warm-up; None otherwise."""
        loader = self.baseline_loader
        if point != BASELINE or not isinstance(loader, TimesOwnStages):
            return None
        window = StageWindow(loader, self.warmup)
        window.begin()
        return window

    def loader_stage_costs(self) -> LoaderStageCosts | None:
        """The baseline loader's own stage costs over every timed baseline step so far (None: it keeps no clocks)."""
        if not self.stage_windows:
            return None
        return LoaderStageCosts.from_windows(self.stage_windows[-1].loader_name, self.stage_windows)

    def _memory_then(self, point: str, known: set[int], close: Callable[[], None]) -> Callable[[], None]:
        """``close``, after reading what the point's processes hold (:func:`~fastpipe.diagnosis.memory._section.point_memory`):
        the timed steps are over, the workers still alive; a failed read leaves the point without figures."""

        def read_then_close() -> None:
            try:
                now = point_memory(point, known)
                if now is not None:
                    self.memory[point] = self.memory[point].merged(now) if point in self.memory else now
            finally:
                close()

        return read_then_close

    def _measure_on_every_rank(self, point: str, budget_s: float | None) -> tuple[Measurement, float]:
        """:meth:`_measure_once` under DDP, where a point that fails on one rank must fail on all (see ``_ddp``).

        Each round's stopping vote also carries failures; a rank whose measurement raised votes
        "failed" in place of its next round, and a closing vote catches a rank that failed after
        its last round. Then the first failing rank's error is raised on every rank, so all of
        them drop the point (or stop) alike and their plans never diverge.
        """

        def agree(stop: bool) -> bool:
            outcome = ddp.vote(stop)
            if outcome.failed:
                raise _PeerFailed(outcome.failed)
            return outcome.stop

        mine: PipelineError | None = None
        try:
            result = self._measure_once(point, budget_s, agree)
            failed = ddp.vote(True).failed
        except _PeerFailed as peers:
            failed = peers.ranks
        except PipelineError as exc:
            mine, failed = exc, ddp.vote(True, failed=True).failed
        if not failed:
            return result
        rank = ddp.world()[0]  # type: ignore[index]
        src = failed[0]
        shared = ddp.from_rank(src, _described(mine) if rank == src else None)
        message, stage, reason = shared
        error = PipelineError(f"{message} (on rank {src} of the DDP job; every rank drops or stops alike)", stage=stage)
        cause: BaseException | None = UnavailablePoint.because(point, reason) if reason is not None else None
        raise error from (cause if cause is not None else mine)

    def _result(self, point: str, measurement: Measurement, copy_ms: float) -> ExperimentResult:
        return ExperimentResult(
            name=point_label(point),
            cache_point=point,
            steps_per_s=measurement.steps_per_s,
            fraction_of_bound=math.nan,
            spread=measurement.spread,
            noise=measurement.rel_stderr,
            cpu_util=measurement.cpu_util,
            system_cpu_util=measurement.system_cpu_util,
            pool_spread=self._pool_spread(point, measurement),
            step_times=measurement.step_times,
            steps_measured=len(measurement.step_times),
            copy_ms_per_sample=copy_ms,
            round_size=self.round,
        )

    def _pool_spread(self, point: str, measurement: Measurement) -> float | None:
        """Across the cached batches of the device and host points: how much the step time depends on the data."""
        if self.pool < 2 or not CachePoint(point).outside_workers:
            return None
        slots: dict[int, list[float]] = {}
        for i, seconds in enumerate(measurement.step_times):
            slots.setdefault((self.warmup + i) % self.pool, []).append(seconds)
        means = [statistics.fmean(v) for v in slots.values()]
        return statistics.pstdev(means) / statistics.fmean(means) if len(means) > 1 else None


class _PeerFailed(Exception):
    """Another rank's measurement of the point failed (raised from the stopping vote)."""

    def __init__(self, ranks: tuple[int, ...]) -> None:
        super().__init__(f"ranks {list(ranks)} failed")
        self.ranks = ranks


def _described(error: PipelineError | None) -> tuple[str, str | None, str | None]:
    """(message, stage, why the point is unavailable or None): what the failing rank tells the others."""
    assert error is not None
    cause = error.__cause__
    return str(error), error.stage, cause.reason if isinstance(cause, UnavailablePoint) else None


def pooled(runs: list[ExperimentResult]) -> ExperimentResult:
    """One result from several runs of a point: all step times, CPU weighted by steps, noise from all rounds
    (:func:`fastpipe.diagnosis.ladder._noise.pool`: run-to-run drift shows as spread between their rounds)."""
    if len(runs) == 1:
        return runs[0]
    times = [t for run in runs for t in run.step_times]
    weights = [len(run.step_times) for run in runs]
    steps_per_s, noise = pool(runs, runs[0].round_size)
    return dataclasses.replace(
        runs[-1],
        steps_per_s=steps_per_s,
        spread=Measurement(times, 0.0, 0.0).spread,
        noise=noise,
        cpu_util=_weighted([r.cpu_util for r in runs], weights),
        system_cpu_util=_weighted([r.system_cpu_util for r in runs], weights),
        step_times=times,
        steps_measured=len(times),
        copy_ms_per_sample=_weighted([r.copy_ms_per_sample for r in runs], weights),
    )


def _weighted(values: list[float], weights: list[int]) -> float:
    pairs = [(v, w) for v, w in zip(values, weights) if not math.isnan(v)]
    return sum(v * w for v, w in pairs) / sum(w for _, w in pairs) if pairs else math.nan


def copy_ms(dataset: Any, point: str) -> float:
    """The cache's own per-sample copy at ``point``, in ms, as the workers timed it (0 where no copy was needed)."""
    if dataset is None or not CachePoint(point).caches_stage_output:
        return 0.0
    seconds = dataset.copy_seconds_per_sample()
    return 0.0 if seconds is None or math.isnan(seconds) else seconds * 1000


def pipeline_error(exc: BaseException, during: str) -> PipelineError:
    """A clear error from whatever a worker, transform or collate raised ``during`` a run: the stage when fastpipe
    labelled it, else the exception's first line."""
    message = str(exc)
    stage = stage_of_error(exc)
    if stage is not None:
        detail = message[message.find(StageError.PREFIX) :].splitlines()[0].split("] ", 1)[-1]
        return PipelineError(f"stage '{stage}' raised {detail} (during {during})", stage=stage)
    first_line = message.strip().splitlines()[0] if message.strip() else type(exc).__name__
    return PipelineError(f"the data pipeline failed during {during}: {type(exc).__name__}: {first_line}", stage=None)


def as_pipeline_error(exc: BaseException, point: str) -> PipelineError:
    """:func:`pipeline_error` for one cache point's run; a point that cannot be built names itself."""
    if isinstance(exc, UnavailablePoint) and stage_of_error(exc) is None:
        return PipelineError(str(exc), stage=point)
    return pipeline_error(exc, f"the '{point_label(point)}' experiment")


def measure_device_bound(
    workload: Workload, device: "str | Device | None", *, options: MeasureOptions | None = None
) -> tuple[ExperimentResult, int]:
    """The device point alone, and the bytes of its cached batch (what one batch weighs in shared memory)."""
    from fastpipe._tree import tree_nbytes

    runner = PointRunner(workload, parse_device(device), options)
    with preserve_user_state(workload.model, workload.optimizer, workload.loader, schedulers=workload.schedulers, scaler=workload.scaler):
        try:
            runner.measure(DEVICE)
            nbytes = max(tree_nbytes(batch) for batch in runner.host_batches)
        finally:
            runner.close()
    return runner.results[DEVICE], nbytes


def measure_points(
    workload: Workload,
    device: "str | Device | None",
    points: list[str],
    *,
    options: MeasureOptions | None = None,
    pool: int = 1,
    progress: bool = False,
) -> dict[str, ExperimentResult]:
    """Measure only the named cache points of a workload (e.g. ``["device", "baseline"]``), user state preserved,
    each as ``options`` says (the defaults: ``MeasureOptions()``).

    ``fraction_of_bound`` is left unset (NaN): the caller decides which bound it is measured against.
    """
    runner = PointRunner(workload, parse_device(device), options, pool=pool, progress=progress)
    unknown = [p for p in points if p not in runner.plan.points]
    if unknown:
        raise ConfigError(f"cache points {unknown} are not available for {workload.name}; available: {runner.plan.points}")
    with preserve_user_state(workload.model, workload.optimizer, workload.loader, schedulers=workload.schedulers, scaler=workload.scaler):
        try:
            for point in points:
                runner.measure(point)
        finally:
            runner.close()  # the progress line, and the loader behind the cached host batches
    return dict(runner.results)
