"""Tune ``num_workers`` and ``prefetch_factor``: the cheapest setting that keeps the device fed.

The sweep measures the user's own loop (the diagnosis's ``baseline``: nothing cached) with the
loader rebuilt at each setting, against the device bound (one batch cached on the device):

1. ``num_workers`` from 1 up to the usable cores and a little beyond, at the loader's own
   ``prefetch_factor``. It stops as soon as a count reaches the bound within noise, or fails
   to improve on the best so far beyond noise: more workers would only cost memory and CPU.
2. ``prefetch_factor`` at the chosen count, unless the bound is already reached (a deeper
   queue cannot beat the bound; a shallower one is still tried, since it is cheaper).

Settings are compared in time per step (1 / steps/s), the unit in which costs add up: a
setting is better when its step is shorter beyond noise (two standard errors of the time per
step, from both measurements) and beyond ``tolerance`` of the device step. Differences of
steps/s would hide real gains far from the bound: with a bound of 10 steps/s, going from 0.4
to 0.8 steps/s is under 5% of the bound in steps/s, yet it halves the step (2.5 s to 1.25 s).
The worker sweep goes on only while the added workers give at least half of the share of the
step they could give at most (``1 - w_before / w_after``): the noise within one setting's run
misses the drift between runs on a shared machine, and a 50 ms step that reads 2 ms shorter
with a second worker is drift, or a gain not worth that worker's memory. For the same reason
two settings count as equal when their steps differ by less than ``tolerance`` of the longer.

The recommendation is the cheapest setting (fewest workers, then smallest prefetch) that
reaches the bound within noise or, when none does, the cheapest within noise of the best.
Interrupted (Ctrl-C), the sweep returns what it measured so far, marked ``interrupted``.

Memory is watched on every setting: the RSS of the process tree and the
use of ``/dev/shm``, where DataLoader workers put every batch they hand over. A setting whose
estimated shared memory exceeds what is free is not run; it gets a warning instead of the
"Bus error" that kills workers when ``/dev/shm`` fills (common in containers with a 64 MB one).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable

from torch.utils.data import DataLoader

from fastpipe._deprecated import moved_keywords
from fastpipe._system import usable_cores
from fastpipe.devices import Device, parse_device
from fastpipe.diagnosis._options import MeasureOptions, as_options
from fastpipe.diagnosis.ladder._cachepoint import BASELINE
from fastpipe.diagnosis.ladder._noise import SIGNIFICANCE, difference_noise, pool
from fastpipe.diagnosis.memory._probes import SHM_PATH, MemoryWatch, shm_estimate, shm_free
from fastpipe.diagnosis.runtime._snapshot import preserve_user_state
from fastpipe.diagnosis.stagecost import coerce_workload, loader_with
from fastpipe.diagnosis.verdict._attribute import SATURATED_CPU
from fastpipe.errors import ConfigError, PipelineError
from fastpipe.experiments._tune_result import Trial, TuneResult, size_text, workers_text
from fastpipe.workloads._workload import Workload

_SHM_FAILURE_SIGNS = ("bus error", "sigbus", "shared memory", "no space left on device", "/dev/shm")


def _memory_failure(exc: BaseException, setting: str) -> str | None:
    """A clear message when a worker died of memory (a full /dev/shm, or the OOM killer); None for other failures."""
    text = str(exc).lower()
    if any(sign in text for sign in _SHM_FAILURE_SIGNS):
        return (
            f"{setting} crashed ({exc}): {SHM_PATH} filled up. Enlarge it (docker run --shm-size=8g), or lower "
            "num_workers, prefetch_factor or the batch size"
        )
    if "killed by signal" in text:
        return (
            f"{setting} crashed ({exc}): a worker was killed, most likely for memory (the OOM killer). Lower num_workers, "
            "prefetch_factor or the batch size"
        )
    return None


def _measure_bound(workload: Workload, device: Device, options: MeasureOptions) -> tuple[Any, int]:
    """The device bound and one batch's bytes, measured as ``options`` says. The seam where the bound's measurement
    comes in (tests plant it here)."""
    from fastpipe.diagnosis.ladder._points import measure_device_bound

    return measure_device_bound(workload, device, options=options)


def _measure_setting(workload: Workload, device: Device, options: MeasureOptions) -> Any:
    """One run of the user's loop (nothing cached) with the loader at one setting, measured as ``options`` says: an
    ExperimentResult-like object with ``steps_per_s``, ``noise``, ``cpu_util`` and ``system_cpu_util``. The seam
    where each setting's measurement comes in."""
    from fastpipe.diagnosis.ladder._points import measure_points

    return measure_points(workload, device, [BASELINE], options=options)[BASELINE]


class _Sweep:
    def __init__(
        self,
        workload: Workload,
        device: Device,
        options: MeasureOptions,
        *,
        tolerance: float,
        extensions: int,
        shm_budget: int | None,
        on_trial: Callable[[Trial], None] | None,
    ) -> None:
        self.workload, self.device, self.options = workload, device, options
        self.tolerance, self.extensions = tolerance, extensions
        self.shm_budget, self.on_trial = shm_budget, on_trial
        self.bound = math.nan
        self.bound_noise = 0.0
        self.batch_bytes = 0
        self.trials: list[Trial] = []
        self.warnings: list[str] = []

    # ----- measuring --------------------------------------------------------------------
    def measure_bound(self) -> None:
        """One batch cached on the device, the step repeated: the diagnosis's device point."""
        result, self.batch_bytes = _measure_bound(self.workload, self.device, self.options)
        self.bound = result.steps_per_s
        self.bound_noise = result.noise

    def _free_shm(self) -> int | None:
        return self.shm_budget if self.shm_budget is not None else shm_free()

    def run_trial(self, workers: int, prefetch: int, phase: str) -> Trial:
        estimate = shm_estimate(self.batch_bytes, workers, prefetch)
        trial = Trial(num_workers=workers, prefetch_factor=prefetch, status="measured", shm_estimate_bytes=estimate, phase=phase)
        free = self._free_shm()
        if free is not None and estimate > free:
            trial.status = "skipped"
            trial.message = (
                f"{workers_text(workers)} with prefetch_factor {prefetch} would hold about {size_text(estimate)} of batches in shared memory, "
                f"but {SHM_PATH} has {size_text(free)} free: DataLoader workers would die with 'Bus error'. Not run. Enlarge {SHM_PATH} "
                "(docker run --shm-size=8g), or lower num_workers, prefetch_factor or the batch size"
            )
            self.warnings.append(trial.message)
            return self._done(trial)
        loader = loader_with(self.workload.loader, self.workload.loader.dataset, num_workers=workers, prefetch_factor=prefetch)
        workload = dataclasses.replace(self.workload, loader=loader)
        results: list[Any] = []
        options = dataclasses.replace(self.options, warmup=max(self.options.warmup, workers))  # a step per worker at least
        try:
            with MemoryWatch() as memory:
                for _ in range(1 + self.extensions):
                    results.append(_measure_setting(workload, self.device, options))
                    if not self.noisy(*pool(results, workers)):
                        break
        except PipelineError as exc:
            message = _memory_failure(exc, f"{workers_text(workers)} with prefetch_factor {prefetch}")
            if message is None:
                raise
            trial.status, trial.message = "failed", message
            self.warnings.append(message)
            return self._done(trial)
        trial.runs = len(results)
        trial.steps_per_s, trial.noise = pool(results, workers)
        trial.cpu_util = sum(r.cpu_util for r in results) / len(results)
        trial.system_cpu_util = sum(r.system_cpu_util for r in results) / len(results)
        trial.fraction_of_bound = trial.steps_per_s / self.bound
        if self.noisy(trial.steps_per_s, trial.noise):
            self.warnings.append(
                f"{workers_text(workers)} with prefetch_factor {prefetch}: the time per step stayed noisy (±{trial.noise:.0%}) over "
                f"{trial.runs} runs, with the machine {trial.system_cpu_util:.0%} busy; decisions near it are uncertain: "
                "rerun on a quieter machine or with more --steps"
            )
        trial.rss_peak_bytes, trial.shm_peak_bytes = memory.rss_peak, memory.shm_peak
        if free is not None and estimate > 0.5 * free:
            self.warnings.append(
                f"{workers_text(workers)} with prefetch_factor {prefetch} need about {size_text(estimate)} of the "
                f"{size_text(free)} free in {SHM_PATH}: close to the limit where workers die with 'Bus error'"
            )
        return self._done(trial)

    def _done(self, trial: Trial) -> Trial:
        self.trials.append(trial)
        if self.on_trial is not None:
            self.on_trial(trial)
        return trial

    # ----- deciding, in time per step ----------------------------------------------------
    @property
    def bound_ms(self) -> float:
        return 1000.0 / self.bound

    def floor_ms(self) -> float:
        """Differences below ``tolerance`` of the device step count as noise when claiming a gain, whatever the statistics say."""
        return self.tolerance * self.bound_ms

    def noisy(self, steps_per_s: float, noise: float) -> bool:
        """Two standard errors of the time per step wider than the tolerance: too noisy to decide on, so worth measuring longer."""
        return SIGNIFICANCE * noise * 1000.0 / steps_per_s > self.floor_ms()

    def allowance(self, a_ms: float, a_noise: float, b_ms: float, b_noise: float, floor: float, capped: bool) -> float:
        """How far apart two times per step may be and still count as equal: two standard errors of their
        difference (noise in time, from both measurements), at least ``floor``.

        ``capped``: at most twice the floor, so that a noisy run cannot pass a large gap off as
        "within noise" when claiming a setting is as good (at the bound, or as the best); claims
        that one setting is *better* stay uncapped, so noise makes them harder, never easier.
        """
        allowance = max(difference_noise(a_ms, a_noise, b_ms, b_noise), floor)
        return min(allowance, 2 * floor) if capped else allowance

    def at_bound(self, trial: Trial) -> bool:
        assert trial.step_ms is not None and trial.noise is not None
        allowance = self.allowance(self.bound_ms, self.bound_noise, trial.step_ms, trial.noise, self.floor_ms(), capped=True)
        return trial.step_ms - self.bound_ms <= allowance

    def better(self, trial: Trial, than: Trial) -> bool:
        """``trial``'s step is shorter than ``than``'s beyond noise and ``tolerance`` of the device step."""
        assert trial.step_ms is not None and than.step_ms is not None
        allowance = self.allowance(trial.step_ms, trial.noise or 0.0, than.step_ms, than.noise or 0.0, self.floor_ms(), capped=False)
        return than.step_ms - trial.step_ms > allowance

    def worth_more_workers(self, trial: Trial, best: Trial) -> bool:
        """``trial`` (more workers) is better than ``best`` and by at least half of what its added workers could give.

        Workers that share the load perfectly cut the step by ``1 - w_best / w_trial``; a gain under half of that
        means the workers no longer set the pace (the cores, the copy or the loop do), so the sweep stops. Against
        that ideal rather than the device step: a pipeline whose step is far above the bound keeps getting a worker's
        share with each one added (1/21 of the step from 20 to 21 workers), while drift between two runs on a shared
        machine (a 50 ms step reading 2 ms shorter) stays under half of what one more worker would give.
        """
        assert trial.step_ms is not None and best.step_ms is not None
        ideal = best.step_ms * (1.0 - best.num_workers / trial.num_workers)
        return self.better(trial, best) and best.step_ms - trial.step_ms >= 0.5 * ideal

    def equal(self, trial: Trial, best: Trial) -> bool:
        """``trial``'s step is within noise of ``best``'s, and within ``tolerance`` of the longer of the two: a step
        a few percent longer is not worth the memory of another worker or a deeper queue."""
        assert trial.step_ms is not None and best.step_ms is not None
        floor = self.tolerance * max(self.bound_ms, trial.step_ms, best.step_ms)
        allowance = self.allowance(trial.step_ms, trial.noise or 0.0, best.step_ms, best.noise or 0.0, floor, capped=True)
        return trial.step_ms - best.step_ms <= allowance

    def measured(self) -> list[Trial]:
        return [t for t in self.trials if t.measured]

    def best(self, trials: Iterable[Trial]) -> Trial | None:
        return max(trials, key=lambda t: t.steps_per_s or 0.0, default=None)

    def recommend(self, trials: list[Trial]) -> Trial | None:
        """The cheapest setting that reaches the bound within noise; failing that, the cheapest within noise of the best."""
        at_bound = [t for t in trials if self.at_bound(t)]
        if at_bound:
            return min(at_bound, key=lambda t: t.cost)
        best = self.best(trials)
        if best is None:
            return None
        return min((t for t in trials if self.equal(t, best)), key=lambda t: t.cost)


def _worker_sweep(sweep: _Sweep, counts: list[int], prefetch: int, stops: list[str]) -> None:
    best: Trial | None = None
    for workers in counts:
        trial = sweep.run_trial(workers, prefetch, "workers")
        if not trial.measured:
            stops.append(f"worker sweep at {workers_text(workers)}: {trial.status} (see the warning)")
            return
        if sweep.at_bound(trial):
            stops.append(
                f"worker sweep at {workers_text(workers)}: it reached the device bound within noise, so more workers were not tried"
            )
            return
        if best is not None and not sweep.better(trial, best):
            stops.append(
                f"worker sweep at {workers_text(workers)}: no gain beyond noise over {workers_text(best.num_workers)} "
                f"({trial.step_ms:.1f} vs {best.step_ms:.1f} ms per step), so more workers were not tried"
            )
            return
        if best is not None and not sweep.worth_more_workers(trial, best):
            ideal = 1.0 - best.num_workers / workers
            stops.append(
                f"worker sweep at {workers_text(workers)}: a small gain over {workers_text(best.num_workers)} "
                f"({trial.step_ms:.1f} vs {best.step_ms:.1f} ms per step, {1 - trial.step_ms / best.step_ms:.0%} shorter), "
                f"under half of the {ideal:.0%} that the added workers could give, so more workers were not tried"
            )
            return
        best = trial  # the first, or better than the best beyond noise
    every = counts == list(range(1, counts[-1] + 1))
    stops.append(f"worker sweep: tried every count up to {counts[-1]}" if every else f"worker sweep: tried {', '.join(map(str, counts))}")


def _prefetch_sweep(sweep: _Sweep, workers: int, factors: list[int], stops: list[str]) -> None:
    at_count = [t for t in sweep.measured() if t.num_workers == workers]
    tried = {t.prefetch_factor for t in sweep.trials if t.num_workers == workers}
    reached = any(sweep.at_bound(t) for t in at_count)
    best = sweep.best(at_count)
    current = min(tried) if tried else 0
    for factor in sorted(set(factors) - tried):
        if reached and factor > current:
            stops.append(
                f"prefetch sweep at {workers_text(workers)}: the bound is already reached, so prefetch_factor {factor} (more memory) was not tried"
            )
            return
        trial = sweep.run_trial(workers, factor, "prefetch")
        if not trial.measured:
            stops.append(f"prefetch sweep at prefetch_factor {factor}: {trial.status} (see the warning)")
            return
        if factor > current and best is not None and not sweep.better(trial, best):
            stops.append(
                f"prefetch sweep at prefetch_factor {factor}: no gain beyond noise over {best.prefetch_factor}, so deeper queues were not tried"
            )
            return
        if factor > current and sweep.at_bound(trial):
            stops.append(
                f"prefetch sweep at prefetch_factor {factor}: it reached the device bound within noise, so deeper queues were not tried"
            )
            return
        best = trial if best is None or trial.steps_per_s > best.steps_per_s else best  # type: ignore[operator]


def _summary(sweep: _Sweep, chosen: Trial) -> tuple[str, bool]:
    reaches = sweep.at_bound(chosen)
    setting = f"num_workers={chosen.num_workers}, prefetch_factor={chosen.prefetch_factor}"
    rate = (
        f"{chosen.step_ms:.1f} ms per step against the device's {sweep.bound_ms:.1f} ms; {chosen.steps_per_s:.3f} of "
        f"{sweep.bound:.3f} steps/s, {chosen.fraction_of_bound:.0%} of the device bound"
    )
    fewer = [t for t in sweep.measured() if t.num_workers < chosen.num_workers]
    if reaches:
        verb = "reaches" if chosen.num_workers == 1 else "reach"
        text = f"Recommended: {setting}. {workers_text(chosen.num_workers)} {verb} the device bound within noise ({rate})"
        if fewer:
            most = max(fewer, key=lambda t: t.num_workers)
            text += f"; {workers_text(most.num_workers)} did not ({most.step_ms:.1f} ms per step), so this is the smallest worker count that does."
        else:
            text += ", the fewest possible."
        return text, True
    cpu = max((t.cpu_util or 0.0) for t in sweep.measured())
    machine = max((t.system_cpu_util or 0.0) for t in sweep.measured())
    if cpu >= SATURATED_CPU:
        why = f"the pipeline saturates the CPU ({cpu:.0%} of the cores): cut the per-sample work (fastpipe costs shows where it goes)"
    elif machine >= SATURATED_CPU:
        why = (
            f"the machine's CPU is saturated ({machine:.0%}), {machine - cpu:.0%} of it by other processes: "
            "measure on a quieter machine before trusting this"
        )
    else:
        why = "the CPU has room, so the limit is not the worker count: run fastpipe diagnose to find it"
    text = (
        f"Recommended: {setting}, the cheapest setting within noise of the best ({rate}). No setting tried reaches the device bound: {why}."
    )
    return text, False


@moved_keywords({"options": MeasureOptions}, positional=("device",))
def tune(
    source: "DataLoader | Workload",
    *,
    step: Callable[[Any], Any] | None = None,
    device: "str | Device | None" = None,
    options: MeasureOptions | None = None,
    max_workers: int | None = None,
    worker_counts: Iterable[int] | None = None,
    prefetch_factors: Iterable[int] = (2, 4),
    tolerance: float = 0.05,
    extensions: int = 2,
    shm_budget_bytes: int | None = None,
    on_trial: Callable[[Trial], None] | None = None,
    name: str | None = None,
) -> TuneResult:
    """Sweep num_workers, then prefetch_factor, and recommend the cheapest setting within noise of the best.

    Args:
        source: a :class:`~fastpipe.Workload`, or a DataLoader with ``step``. Never modified.
        step: ``step(batch)``, one training step (with a DataLoader only: a Workload carries its own).
        device: ``cuda[:N]``, ``cpu``, ``sim:STEP_MS`` or a Device (default: cuda if present, else sim:290).
        options: how each setting is measured (:class:`~fastpipe.MeasureOptions`; None: its defaults): until its
            mean step time has ``precision`` relative standard error or ``budget`` seconds have passed, as in
            :func:`fastpipe.diagnose`, with at least ``steps`` measured steps after ``warmup`` untimed ones (at least
            one per worker).
        max_workers: the largest count tried (default: usable cores + 2).
        worker_counts: the counts the worker sweep may try, in rising order, instead of every count from 1 to
            ``max_workers`` (``fix`` sweeps 1, 2, 4, ... and the usable cores, to bound its cost on many cores).
        prefetch_factors: the values the second sweep may try at the chosen worker count.
        tolerance: differences in time per step below this fraction of the device step count as noise when
            claiming a gain, and below this fraction of the longer step when choosing the cheapest setting as good
            as the best, whatever the statistics say.
        extensions: how many more runs a setting gets, pooled with the first, while two standard errors
            of its throughput exceed ``tolerance`` of the bound (a busy machine).
        shm_budget_bytes: shared memory the loader may use (default: what is free in /dev/shm now).
        on_trial: called with each :class:`Trial` as it finishes (for progress output).
        name: the result's label for a DataLoader (a Workload has its own).

    Returns:
        The sweep and the recommendation. Interrupted (Ctrl-C), the settings measured so far, with
        ``interrupted`` set, rather than a KeyboardInterrupt that would lose them.

    Raises:
        ConfigError: bad arguments. PipelineError: the pipeline or step failed for a reason other than shared memory.

    The old keywords (``steps=``, ``budget=``, ... and a positional device) still work for one release, with a
    :class:`DeprecationWarning` naming the new spelling.
    """
    options = as_options(MeasureOptions, options)
    if isinstance(source, Workload) and step is not None and source.step is not None:
        raise ConfigError("step cannot be given with a Workload, which carries its own: dataclasses.replace(workload, step=...)")
    workload = coerce_workload(source, step, name)
    factors = sorted({int(f) for f in prefetch_factors})
    cores = usable_cores()
    top = cores + 2 if max_workers is None else max_workers
    counts = list(range(1, top + 1)) if worker_counts is None else sorted({int(w) for w in worker_counts})
    if top < 1:
        raise ConfigError(f"max_workers must be at least 1, got {max_workers}")
    if not counts or counts[0] < 1:
        raise ConfigError(f"worker counts must be whole numbers >= 1, e.g. 1,2,4; got {worker_counts}")
    if not factors or factors[0] < 1:
        raise ConfigError(f"prefetch factors must be whole numbers >= 1, e.g. 2,4; got {list(prefetch_factors)}")
    if not 0 < tolerance < 1:
        raise ConfigError(f"tolerance is a fraction of the device step, e.g. 0.05; got {tolerance}")
    if extensions < 0:
        raise ConfigError(f"extensions must be 0 or more, got {extensions}")
    device = parse_device(device)
    loader = workload.loader
    base_prefetch = loader.prefetch_factor if loader.num_workers > 0 and loader.prefetch_factor else 2
    sweep = _Sweep(workload, device, options, tolerance=tolerance, extensions=extensions, shm_budget=shm_budget_bytes, on_trial=on_trial)
    stops: list[str] = []
    interrupted = False
    try:
        with preserve_user_state(workload.model, workload.optimizer, loader, schedulers=workload.schedulers, scaler=workload.scaler):
            sweep.measure_bound()
            _worker_sweep(sweep, counts, base_prefetch, stops)
            chosen = sweep.recommend(sweep.measured())
            if chosen is not None:
                _prefetch_sweep(sweep, chosen.num_workers, factors, stops)
    except KeyboardInterrupt:
        interrupted = True  # keep what was measured: the partial table is worth printing
    result = TuneResult(
        workload=workload.name,
        device=device.spec,
        batch_size=loader.batch_size,
        cores=cores,
        current=(loader.num_workers, loader.prefetch_factor if loader.num_workers > 0 else None),
        bound_steps_per_s=sweep.bound,
        bound_noise=sweep.bound_noise,
        batch_bytes=sweep.batch_bytes,
        shm_budget_bytes=shm_budget_bytes if shm_budget_bytes is not None else shm_free(),
        tolerance=tolerance,
        trials=sweep.trials,
        stops=stops,
        warnings=sweep.warnings,
        interrupted=interrupted,
    )
    if math.isnan(sweep.bound):
        result.summary = "Interrupted while measuring the device bound: no setting was measured."
        return result
    result.recommended = sweep.recommend(sweep.measured())
    if result.recommended is None:
        result.summary = (
            "No setting was measured before the interruption." if interrupted else "No setting could be measured: see the warnings."
        )
    elif interrupted:
        text, result.reaches_bound = _summary(sweep, result.recommended)
        result.summary = "Of the settings measured so far: " + text[0].lower() + text[1:]
    else:
        result.summary, result.reaches_bound = _summary(sweep, result.recommended)
    return result
