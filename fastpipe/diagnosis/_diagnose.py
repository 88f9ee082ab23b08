"""The cache-bisection engine: rerun the loop with data cached at successive points.

The plan (:mod:`fastpipe.diagnosis.ladder._plan`) lists the points a pipeline allows; this module measures them
(each until its step time is precise enough or its time budget is spent), remeasures pairs whose
difference is borderline, inverted or taken on a loaded machine (interleaved, A B A B), and hands
the step times to :mod:`fastpipe.diagnosis.verdict._attribute`, which turns them into milliseconds per step per
stage (with each stage's in-worker cost, timed in one more pass when the pipeline is input-bound), and
to :mod:`fastpipe.diagnosis.verdict._caveats`, which words what the report must caveat. The user's DataLoader settings (workers, batch sampler, collate, pinning...) are kept by
building new loaders around a wrapped copy of the dataset, and everything the user owns is
restored afterwards (:mod:`fastpipe.diagnosis.runtime._snapshot`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from torch.utils.data import DataLoader, IterableDataset

from fastpipe._deprecated import moved_keywords
from fastpipe._system import usable_cores
from fastpipe.devices import Device, parse_device
from fastpipe.diagnosis._options import DiagnoseOptions, TrainState, as_options
from fastpipe.diagnosis._unseen import add_unseen
from fastpipe.diagnosis.ladder._cache import UnavailablePoint
from fastpipe.diagnosis.ladder._cachepoint import ANCHORS, BASELINE, DEVICE
from fastpipe.diagnosis.ladder._plan import COLLATE, COPY, Plan, has_copy, point_label
from fastpipe.diagnosis.ladder._points import PointRunner
from fastpipe.diagnosis.ladder._results import ExperimentResult
from fastpipe.diagnosis.ladder._serve import probe_point
from fastpipe.diagnosis.ladder._variable import variable_inputs
from fastpipe.diagnosis.memory._section import finish_memory_section, start_memory_section
from fastpipe.diagnosis.runtime import _ddp as ddp
from fastpipe.diagnosis.runtime._snapshot import preserve_user_state
from fastpipe.diagnosis.verdict._attribute import (
    LADDER,
    SATURATED_CPU,
    Attribution,
    mark_small_costs,
    noise_verdict,
    verdict_for,
    worker_costs,
)
from fastpipe.diagnosis.verdict._caveats import (
    BUSY_MACHINE,
    CAVEATS,
    NOTES,
    SATURATION_CAVEAT_START,
    Facts,
    apply,
    waiting_text,
    workers_needed,
)
from fastpipe.diagnosis.verdict._loader import LoaderFacts, loader_facts
from fastpipe.diagnosis.verdict._report import Bottleneck, Report
from fastpipe.errors import ConfigError, PipelineError
from fastpipe.loading._protocols import LoaderStats, ReportsStats, stages_outside_workers
from fastpipe.stages import RAW_STAGE
from fastpipe.workloads._workload import Workload, loader_batch_size, unwrapped_workload

CPU_BACKED = 0.25
"""A span whose CPU time per step (over its workers) is at least this share of its added time counts as CPU work."""
VARIABLE_POOL = 8
"""Samples (or batches) cached per worker when the inputs vary in size."""
__all__ = ["COLLATE", "COPY", "SATURATED_CPU", "SATURATION_CAVEAT_START", "diagnose", "point_label", "run_diagnosis", "verdict_for"]


# ----- the strategy ------------------------------------------------------------------------
class _Diagnosis:
    def __init__(self, runner: PointRunner, workload: Workload, threshold: float, strategy: str, pool_reason: str | None) -> None:
        self.runner, self.workload, self.threshold, self.strategy = runner, workload, threshold, strategy
        self.unresolved: dict[tuple[str, str], str] = {}
        self.calls_per_sample: int | None = None
        self.remeasured: set[tuple[str, str]] = set()
        self.inverted: list[tuple[str, str]] = []
        r = runner
        # the settings, and what the run gathers before finish() makes the full report (notes, caveats, an interruption...)
        self.report = Report(
            workload=workload.name,
            device=r.device.spec,
            num_workers=r.workers,
            batch_size=loader_batch_size(workload.loader),
            steps=r.steps,
            warmup=r.warmup,
            pool=r.pool,
            threshold=threshold,
            strategy=strategy,
            precision_target=r.target,
            budget_s=r.budget_s,
            notes=list(workload.notes),
        )
        if pool_reason:
            self.report.notes.append(pool_reason)
        if not has_copy(r.device.kind):  # the device decides what exists: no copy, no host point, no copy stage
            self.plan.without_copy()

    @property
    def plan(self) -> Plan:
        return self.runner.plan

    def attribution(self, costs: Any = None) -> Attribution:
        """The attribution of what was measured; with the in-worker ``costs`` (StageCosts), rules 2-5 apply."""
        stages = (
            None
            if costs is None
            else worker_costs(
                {
                    s.name: (
                        s.ms_per_sample,
                        s.cpu_ms_per_sample,
                        s.runq_ms_per_sample,
                        s.held_ms_per_sample,
                        s.blocked_ms_per_sample,
                        s.blocked_noise_ms,
                    )
                    for s in costs.stages
                }
            )
        )
        return Attribution(
            self.plan,
            self.runner.results,
            self.threshold,
            self.batch_size(),
            self.runner.workers,
            costs=stages,
            unresolved=dict(self.unresolved),
        )

    def batch_size(self) -> int | None:
        """The loader's batch size; with a custom batch sampler, the size of the batches it delivered (the host point's)."""
        return loader_batch_size(self.workload.loader) or self.runner.delivered_batch_size

    def measure(self, point: str, **kwargs: Any) -> ExperimentResult | None:
        """Measure a point (its run's result); a middle point that cannot be built or fails is dropped from the plan
        with its reason (None). The first measurement and every remeasurement go through here."""
        try:
            return self.runner.measure(point, **kwargs)
        except PipelineError as exc:
            if point in ANCHORS or exc.stage == "step":
                raise
            cause = exc.__cause__
            reason = cause.reason if isinstance(cause, UnavailablePoint) and getattr(cause, "reason", None) else str(exc)
            self.plan.drop(point, f"this point could not be built or failed ({reason}); the stages around it are measured as one span")
            self.runner.results.pop(point, None)
            return None

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
        for point in [p for p in self.plan.points if p.caches_stage_output]:
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
        self.measure(DEVICE)
        self.measure(BASELINE)
        points = self.plan.points
        if not self.attribution().significant(DEVICE, BASELINE):
            skipped = [p for p in points if p not in self.runner.results]
            if skipped:
                self.report.notes.append(
                    f"the baseline is within noise and threshold of the device bound, so {', '.join(skipped)} were not measured"
                )
            return
        if self.strategy == "linear":
            for point in list(points[1:-1]):
                self.measure(point)
        else:
            self._bisect(DEVICE, BASELINE)
        self._remeasure_suspects()

    def _bisect(self, upper: str, lower: str) -> None:
        points = self.plan.points
        a, b = points.index(upper), points.index(lower)
        if b - a <= 1 or not self.attribution().significant(upper, lower):
            return
        mid = points[(a + b) // 2]
        if self.measure(mid) is None:
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
            if upper not in self.runner.results or lower not in self.runner.results:
                continue  # dropped while an earlier pair was remeasured
            first = self.attribution()
            was_named, was_inverted = first.significant(upper, lower), first.inverted(upper, lower)
            self.remeasured.add((upper, lower))
            budget = max(self.runner.budget_s / 2, 1.0)
            fresh_upper = self.measure(upper, budget_s=budget)
            fresh_lower = self.measure(lower, budget_s=budget) if fresh_upper is not None else None
            if fresh_upper is None or fresh_lower is None:
                continue  # a point failed: dropped as in the first measurement, its neighbours now meet as one span
            fresh = Attribution(
                self.plan,
                {DEVICE: self.runner.results[DEVICE], upper: fresh_upper, lower: fresh_lower},
                self.threshold,
                self.batch_size(),
                self.runner.workers,
            )
            loaded = max(fresh_upper.system_cpu_util - fresh_upper.cpu_util, fresh_lower.system_cpu_util - fresh_lower.cpu_util)
            if was_named and not fresh.significant(upper, lower):
                self.unresolved[(upper, lower)] = "its cost did not hold when the two points were remeasured back to back"
            elif (
                was_named
                and loaded > BUSY_MACHINE
                and fresh_lower.system_cpu_util >= SATURATED_CPU
                and self._uses_cpu(fresh_upper, fresh_lower)
            ):
                # the cores were all busy, part of them with other processes, and the stage burns CPU: a
                # stage that hides under the device step on a quiet machine can show here only for want of CPU
                self.unresolved[(upper, lower)] = (
                    f"other processes used {loaded:.0%} of the CPU while it was remeasured and the "
                    "cores were saturated: its cost cannot be told from theirs"
                )
            elif was_inverted and fresh.inverted(upper, lower):
                self.inverted.append((upper, lower))
                self.unresolved[(upper, lower)] = "the point below ran faster than the point above, twice in a row"

    def _uses_cpu(self, upper: ExperimentResult, lower: ExperimentResult) -> bool:
        """Whether the span between two points burns enough CPU that other processes' load could explain its time.

        Contention slows only CPU work: a stage that waits (I/O, sleeps) costs the same on a busy machine.
        """
        cores = usable_cores()
        cpu_per_step = [r.cpu_util * cores * r.ms_per_step for r in (upper, lower)]
        cpu_time = (cpu_per_step[1] - cpu_per_step[0]) / max(1, min(self.runner.workers, cores))
        added = lower.ms_per_step - upper.ms_per_step
        return cpu_time > CPU_BACKED * added

    def input_bound(self) -> bool:
        """Whether the baseline runs slower than the device bound beyond noise or threshold (worth timing each stage)."""
        results = self.runner.results
        if DEVICE not in results or BASELINE not in results:
            return False
        attribution = self.attribution()
        return (
            attribution.significant(DEVICE, BASELINE) or results[DEVICE].steps_per_s / results[BASELINE].steps_per_s - 1 >= self.threshold
        )

    # ----- the report ------------------------------------------------------------------------
    def finish(self, elapsed: float, costs: Any = None, no_costs_reason: str | None = None) -> Report:
        """The report: figures and names by the rules of :mod:`fastpipe.diagnosis.verdict._attribute` (with the in-worker
        ``costs`` when they were measured), advice for each named stage, and the caveats of :mod:`fastpipe.diagnosis.verdict._caveats`.

        Each part is computed first (the points measured, the figures, the stage costs, the named stages); the report is
        made from them and ``self.report`` (the settings and what the run gathered: notes, caveats, an interruption, the
        loader's own clocks, skipped samples) at once; its named stages are then advised, and the report given the words
        the rules say about it (the verdict when noise decides, caveats, notes) in one more copy.
        """
        results = self.runner.results
        measured = {
            "elapsed_s": elapsed,
            "batch_size": self.report.batch_size or self.batch_size(),  # a custom batch sampler's: from its batches
            "unavailable": list(self.plan.unavailable),
            "experiments": [results[p] for p in self.plan.points if p in results],
        }
        if DEVICE not in results:
            return dataclasses.replace(self.report, **measured)
        attribution = self.attribution(costs)
        figures = self._figures(measured["experiments"])
        named = self._named(attribution, figures)
        report = dataclasses.replace(self.report, **measured, **figures, **self._stage_cost_parts(costs), **named)
        notes = self._advise_named(report, attribution)
        return self._with_words(report, attribution, costs, no_costs_reason, notes)

    def _figures(self, experiments: list[ExperimentResult]) -> dict[str, Any]:
        """The device bound, the baseline step, the gap between them and the verdict it gives; each point's share of the
        bound is set on its result."""
        results = self.runner.results
        bound = results[DEVICE].steps_per_s
        for result in experiments:
            result.fraction_of_bound = result.steps_per_s / bound
        figures: dict[str, Any] = {"device_bound_steps_per_s": bound, "device_step_ms": 1000 / bound}
        baseline = results.get(BASELINE)
        if baseline is not None:
            baseline_s = 1 / baseline.steps_per_s
            gap = max(0.0, 1 - (1 / bound) / baseline_s)
            figures.update(
                baseline_step_ms=baseline_s * 1000,
                gap_fraction=gap,
                verdict=verdict_for(gap, shares_cores=self.runner.device.step_uses_worker_cores),
            )
        return figures

    @staticmethod
    def _stage_cost_parts(costs: Any) -> dict[str, Any]:
        """The in-worker stage costs as the report holds them (nothing when they were not measured)."""
        if costs is None:
            return {}
        return {
            "stage_costs": costs.to_dict(),
            "stage_cost_lines": costs.table_lines(),
            "ranked_by": "time per step: each stage's own ladder step, or its share by in-worker cost of a span the ladder cannot split",
        }

    def _named(self, attribution: Attribution, figures: dict[str, Any]) -> dict[str, Any]:
        """Every span between measured points (``components``), the ones named as costs (``bottlenecks``, largest first,
        the small ones marked), the ones whose cost did not hold when remeasured (``unresolved``, each with a caveat)."""
        baseline = self.runner.results.get(BASELINE)
        components = attribution.components(None if baseline is None else 1 / baseline.steps_per_s)
        bottlenecks: list[Bottleneck] = []
        unresolved: list[Bottleneck] = []
        caveats = list(self.report.caveats)
        for component in components:
            if self.calls_per_sample and component.kind == "transform":
                component.calls_per_sample = self.calls_per_sample
            why_by_cost = attribution.by_cost(component)
            if why_by_cost is not None:
                bottlenecks += attribution.by_cost_parts(component, why_by_cost)
            elif component.basis == LADDER and component.between in self.unresolved and not attribution.vetoed(component):
                unresolved.append(component)
                caveats.append(f"{component.stage}: {self.unresolved[component.between]}")
            elif attribution.named(component):
                bottlenecks.append(component)
        gap = figures.get("gap_fraction")
        if attribution.costs and not bottlenecks and gap and gap >= 0.05:
            bottlenecks += attribution.unnamed_costs(components)  # rule 4: never end with the costs unmentioned
        bottlenecks.sort(key=lambda b: b.added_ms, reverse=True)
        if figures.get("baseline_step_ms") is not None:
            mark_small_costs(bottlenecks, figures["baseline_step_ms"] - figures["device_step_ms"])
        return {"components": components, "bottlenecks": bottlenecks, "unresolved": unresolved, "caveats": caveats}

    def _advise_named(self, report: Report, attribution: Attribution) -> list[str]:
        """Word the fix for each named and unresolved stage (their ``recommendation`` and ``snippet``); the notes a
        loader that times its own stages adds when none of its stages is named."""
        advised = report.bottlenecks + report.unresolved
        loader = (
            loader_facts(self.workload, self.runner.device.kind, find_wrapper=any(COPY in b.stage for b in advised)) if advised else None
        )
        for b in advised:
            _advise(
                b,
                self.runner.pipeline,
                self.workload.loader.dataset,
                self.runner.workers,
                attribution.costs,
                report,
                attribution.batch_size,
                free_cores=_free_cores(self.runner.results.get(BASELINE)),
                loader=loader,
            )
        return self._advise_loader_stages(report)

    def _with_words(self, report: Report, attribution: Attribution, costs: Any, no_costs_reason: str | None, notes: list[str]) -> Report:
        """The report with what the rules say about it: the verdict when noise decides (rule 8: noise never passes for a
        finding), the caveats and notes of :mod:`fastpipe.diagnosis.verdict._caveats`, and a recycling loader's own
        statistics."""
        spread = None
        if self.runner.rank_spreads:
            point, widest = max(self.runner.rank_spreads.items(), key=lambda item: item[1].spread)
            _, size = ddp.world() or (0, 1)
            spread = (size, point, widest.spread, widest.slowest_rank)
        facts = Facts(
            report=report,
            attribution=attribution,
            workers=self.runner.workers,
            device_kind=self.runner.device.kind,
            pool=self.runner.pool,
            target=self.runner.target,
            budget_s=self.runner.budget_s,
            costs=costs,
            no_costs_reason=no_costs_reason,
            inverted=self.inverted,
            rank_spread=spread,
        )
        stats = self.runner.baseline_loader.stats() if isinstance(self.runner.baseline_loader, ReportsStats) else None
        return dataclasses.replace(
            report,
            verdict=noise_verdict(attribution, report) or report.verdict,
            caveats=report.caveats + apply(CAVEATS, facts),
            notes=report.notes + notes + apply(NOTES, facts) + (_loader_stat_notes(stats) if stats is not None else []),
        )

    def _advise_loader_stages(self, report: Report) -> list[str]:
        """An input-bound loader that times its own stages (the ThreadLoader): name its dominant stage, as the remedy of
        each named stage of the loader (the host-to-device copy keeps its own), or in a note (returned) when none of them
        is named."""
        from fastpipe.diagnosis.verdict._advice import recommend_loader_stage

        costs = report.loader_stage_costs
        if costs is None or not self.input_bound():
            return []
        loader = self.workload.loader
        baseline = report.experiment(BASELINE)
        saturated = baseline is not None and (baseline.system_cpu_util or 0.0) >= SATURATED_CPU
        advice = recommend_loader_stage(
            costs,
            loader.dataset,
            usable_cores(),
            threads=getattr(loader, "threads", None),
            batch_size=report.batch_size,
            saturated=saturated,
        )
        if advice is None:
            return []
        ours = [b for b in report.bottlenecks + report.unresolved if b.kind != COPY]
        for b in ours:
            b.recommendation, b.snippet = advice.text(), advice.snippet
        if not ours:
            return [f"the input costs time per step and no stage of the loader is named by the ladder: {advice.text()}"]
        return []


def _loader_stat_notes(stats: LoaderStats) -> list[str]:
    """What a loader that reports its own statistics (fastpipe.loading.recycled) did during the baseline point."""
    if "reused" not in stats:
        return []
    line = (
        f"recycled batch memory: {stats['reused']} of {stats['batches']} batches went into reused buffers; "
        f"{stats['fallbacks']} fresh allocations because every slot was in use (raise slots=), {stats['grown']} larger "
        f"buffers (batches outgrew their slot), {stats['kept']} batches kept by the loop"
    )
    return [line + (f"; pinning: {stats['pinning']}" if stats.get("pinning") else "")]


def _free_cores(result: ExperimentResult | None) -> float | None:
    """The usable cores less what other processes used while ``result``'s point ran (None when it was not measured)."""
    if result is None or result.system_cpu_util != result.system_cpu_util:  # NaN without psutil
        return None
    return usable_cores() * (1.0 - max(0.0, result.system_cpu_util - result.cpu_util))


def _advise(
    component: Bottleneck,
    pipeline: Any,
    dataset: Any,
    workers: int,
    costs: dict[str, Any] | None,
    report: Report,
    batch: int | None = None,
    *,
    free_cores: float | None = None,
    loader: LoaderFacts | None = None,
) -> None:
    """Fill in the component's recommendation (and snippet) for its own stage (``loader``: what the device and the
    loader already do, so the advice never asks for it).

    A stage that mostly waits gets advice about workers, prefetching and storage, with the workers that would hide it
    (rule 5 of :mod:`fastpipe.diagnosis.verdict._attribute`); one that computes gets advice about its code. A worker-side stage
    found while the cores had room also gets the tuner's advice: more workers may carry it before any stage is made cheaper.
    """
    from fastpipe.diagnosis.verdict._advice import recommend, webdataset_shards

    stages = None if pipeline is None else [stage.transform for stage in pipeline.stages]
    advice = recommend(component.stage, component.kind, transform=stages, dataset=dataset, loader=loader)
    waiting = waiting_text(
        component, costs, report.device_step_ms or 0.0, batch or report.batch_size, usable_cores(), workers=workers, free_cores=free_cores
    )
    if component.waits and waiting:
        # a stream's raw load waits on its reads, which more workers overlap only where there is more to read in
        # parallel (a WebDataset chain: as many shards as workers); its own advice says so
        stream_read = isinstance(dataset, IterableDataset) and RAW_STAGE in component.stage.split(" + ")
        if stream_read:  # workers beyond a WebDataset chain's shards read nothing: the shards are the limit then
            shards, needed = webdataset_shards(dataset), workers_needed(costs, report.device_step_ms or 0.0, batch or report.batch_size)
            limit = None if shards is None or needed is None else shards.limit_text(needed)
            waiting = waiting if limit is None else f"{waiting} {limit}"
        component.recommendation, component.snippet = (f"{waiting} {advice.text()}" if stream_read else waiting), None
        return
    component.recommendation = advice.text() if waiting is None else f"{waiting} {advice.text()}"
    component.snippet = advice.snippet
    cores = usable_cores() if free_cores is None else free_cores  # a neighbour's cores are not there to take
    if component.kind not in (COPY,) and not component.cpu_saturated and 0 < workers < int(cores):
        component.recommendation += " " + recommend(component.stage, "too few workers").summary


@moved_keywords({"options": DiagnoseOptions, "train_state": TrainState}, positional=("device",))
def diagnose(
    loader: "DataLoader | Workload",
    step: Callable[[Any], Any] | None = None,
    *,
    device: "str | Device | None" = None,
    options: DiagnoseOptions | None = None,
    train_state: TrainState | None = None,
    device_transform: Callable[[Any], Any] | None = None,
    prefetch_depth: int = 0,
) -> Report:
    """Find where an input pipeline loses time, by caching data at successive points.

    Args:
        loader: the user's DataLoader (never modified), or a :class:`~fastpipe.Workload`, which carries its own
            step, training state, device transform and prefetch depth.
        step: ``step(batch)``, one training step on a batch already on the device (with a DataLoader only).
        device: ``cuda[:N]``, ``cpu``, ``sim:STEP_MS[,...]`` or a Device (default: cuda if present, else sim:290).
        options: everything measured and decided by, a :class:`~fastpipe.DiagnoseOptions` (steps, warmup, budget,
            precision, pool, threshold, strategy, progress, stage costs, the loader-memory and start-up passes, the
            report's name); None: its defaults, which are ``fastpipe diagnose``'s.
        train_state: what the diagnosis trains and puts back afterwards (the diagnosis really trains): a
            :class:`~fastpipe.diagnosis.TrainState` of the model, optimizer, LR schedulers and GradScaler
            (with a DataLoader only).
        device_transform, prefetch_depth: how the user's loop moves batches to the device (with a DataLoader only).

    Returns:
        A :class:`~fastpipe.diagnosis.verdict._report.Report`; if interrupted with Ctrl-C, a partial one with ``interrupted`` set.

    Raises:
        ConfigError: bad arguments, or arguments a Workload already carries (it keeps its own).
        PipelineError: a worker, transform or the step raised; ``.stage`` says where.

    The old keywords (``steps=``, ``model=``, ... and a positional device) still work for one release, with a
    :class:`DeprecationWarning` naming the new spelling.

    Example:
        A toy whose ``Decode`` waits 20 ms a sample, against a simulated 50 ms step (2 workers, batch 8)::

            import time

            import torch
            import torchvision.transforms as T
            from torch.utils.data import DataLoader, Dataset

            import fastpipe

            class Decode:
                def __call__(self, x):
                    time.sleep(0.02)  # 20 ms a sample: 8 samples over 2 workers = 80 ms a batch
                    return x.float()

            class Flip:
                def __call__(self, x):
                    return x.flip(-1)

            class Toy(Dataset):
                def __init__(self):
                    self.transform = T.Compose([Decode(), Flip()])

                def __len__(self):
                    return 512

                def __getitem__(self, i):
                    return self.transform(torch.zeros(3, 32, 32, dtype=torch.uint8)), 0

            loader = DataLoader(Toy(), batch_size=8, num_workers=2)
            options = fastpipe.DiagnoseOptions(budget=5, progress=False, loader_memory=False, startup=False)
            report = fastpipe.diagnose(loader, lambda batch: None, device="sim:50", options=options)
            print(report)

        printed, on 2 cores busy with other work (its figures vary from run to run; the first lines shown)::

            fastpipe diagnosis: workload on sim:50 (2 workers, batch 8, at least 10 steps a point after 3 warm-up, precision target
            3%)
            ┏━━━━━━━━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━┳━━━━━━━━━┳━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━┳━━━━━┓
            ┃ cache point    ┃ ms/step ┃ stage added         ┃ its ms ┃ steps/s ┃ of device bound ┃ precision ┃ CPU ┃
            ┡━━━━━━━━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━━━╇━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━┩
            │ device (bound) │      50 │                     │        │  20.000 │          100.0% │     ±0.0% │  2% │
            │ host           │      52 │ host-to-device copy │     +2 │  19.230 │           96.1% │     ±1.1% │  1% │
            │ sample         │      53 │ collate/IPC         │     +1 │  18.757 │           93.8% │     ±1.4% │  4% │
            │ after Decode   │      54 │ Flip                │    +0* │  18.609 │           93.0% │     ±1.1% │  4% │
            │ raw            │      94 │ Decode              │   +44* │  10.613 │           53.1% │     ±2.2% │  5% │
            │ baseline       │      98 │ raw load            │    +0* │  10.251 │           51.3% │     ±2.4% │  4% │
            └────────────────┴─────────┴─────────────────────┴────────┴─────────┴─────────────────┴───────────┴─────┘
            Each row's 'stage added' is the stage that runs at this point but not at the row above; 'its ms' is the time it adds per step (* its share, by in-worker cost, of a span the ladder cannot split).
            Verdict: highly input-bound (the baseline step is 98 ms against the device's 50 ms: 49% of it is input)
            Stages that cost time per step, largest first (by time per step: each stage's own ladder step, or its share by in-worker cost of a span the ladder cannot split):
              - Decode [transform]: adds at least 44 ms per step (±4.8), its share by in-worker cost of the span from 'sample' down, 45% of the baseline step (its own ladder step: +40 ms); in the workers it costs 81 ms per step [...]
              [... its advice; an unresolved collate/IPC, the caveats, notes, stage costs, the main process and memory follow]
    """
    options = as_options(DiagnoseOptions, options)
    workload = _workload_of(loader, step, train_state, device_transform, prefetch_depth)
    return run_diagnosis(workload, parse_device(device), options)


def _workload_of(loader: Any, step: Any, train_state: TrainState | None, device_transform: Any, prefetch_depth: int) -> Workload:
    """The Workload ``diagnose`` was given, or the one its DataLoader and step make; what a Workload carries itself
    cannot be given beside it (it would be silently ignored, or silently override what the Workload was built with)."""
    if isinstance(loader, Workload):
        given = [
            name
            for name, value in (
                ("step", step if loader.step is not None else None),
                ("train_state", train_state),
                ("device_transform", device_transform),
                ("prefetch_depth", prefetch_depth or None),
            )
            if value is not None
        ]
        if given:
            raise ConfigError(
                f"{', '.join(given)} cannot be given with a Workload, which carries its own: set them on the Workload "
                f"(dataclasses.replace(workload, {given[0]}=...); train_state's parts are its model, optimizer, "
                "schedulers and scaler)"
            )
        return loader if step is None else dataclasses.replace(loader, step=step)
    if step is None or not callable(step):
        raise ConfigError("diagnose needs step, a function step(batch) that runs one training step")
    state = train_state or TrainState()
    return Workload(
        loader=loader,
        step=step,
        device_transform=device_transform,
        model=state.model,
        optimizer=state.optimizer,
        schedulers=list(state.schedulers),
        scaler=state.scaler,
        prefetch_depth=prefetch_depth,
        name="workload",
    )


def run_diagnosis(
    workload: Workload,
    device: "str | Device | None",
    options: DiagnoseOptions | None = None,
    *,
    runner: Callable[..., PointRunner] = PointRunner,
    on_warning: Callable[[str], None] | None = None,
) -> Report:
    """The engine behind :func:`diagnose`, for a Workload: what the command line and script mode call.

    Args:
        workload: what to diagnose (a wrapped loader is unwrapped here); ``options.name``, if set, relabels it.
        device: as for :func:`diagnose`.
        options: as for :func:`diagnose` (validated when built).
        runner: what measures the points, called as :class:`PointRunner` is, ``runner(workload, device,
            options=..., pool=..., progress=...)`` (script mode passes one that measures windows of a running
            script's own loop, :class:`fastpipe.diagnosis._windows.WindowRunner`; tests plant measurements).
        on_warning: called, before any worker starts, with the shared-memory budget's warning when the loader's
            batches would not fit ``/dev/shm`` or the memory cgroup (default: :func:`warnings.warn`).
    """
    options = as_options(DiagnoseOptions, options)
    if options.name is not None:
        workload = dataclasses.replace(workload, name=options.name)
    # a wrapped loader (timm's PrefetchLoader, accelerate's, fastpipe's prefetcher) is unwrapped; anything else is refused
    workload = unwrapped_workload(workload, workload.name)
    device = parse_device(device)
    started = time.perf_counter()
    runner = runner(workload, device, options=options, pool=options.pool or 1, progress=options.progress)
    pool_reason = None
    if options.pool is None:
        with preserve_user_state(loader=workload.loader):  # the probe reads samples: what they draw is put back
            why = ddp.from_rank0(variable_inputs(runner) if ddp.is_rank0() else None)
        if why:
            runner.pool = VARIABLE_POOL
            pool_reason = (
                f"{why}, so each cache point keeps {VARIABLE_POOL} samples (or batches) per worker instead of one "
                "(set pool= / --pool to choose)"
            )
    diagnosis = _Diagnosis(runner, workload, options.threshold, options.strategy, pool_reason)
    if not device.runs_model and not any("simulates the step" in note for note in workload.notes):
        diagnosis.report.notes.append(
            f"{device.spec} simulates the step: the training step itself is not run "
            "(fastpipe diagnose --check-step runs it once on a real batch on the CPU)"
        )
    with preserve_user_state(
        workload.model, workload.optimizer, workload.loader, schedulers=workload.schedulers, scaler=workload.scaler
    ) as state:
        # before any worker starts: a run that would die says why first
        memory = start_memory_section(workload, on_warning, timeout=options.worker_timeout)
        if memory.budget_warning:
            diagnosis.report.caveats.append(memory.caveat())
        try:
            diagnosis.run()
        except KeyboardInterrupt:
            diagnosis.report.interrupted = True
        finally:
            runner.close()  # the progress line, and the loader behind the cached host batches
        costs, why_not = None, None
        loader_costs = diagnosis.report.loader_stage_costs = runner.loader_stage_costs()  # free: the baseline's own steps
        if loader_costs is not None:
            loader_costs.input_bound = diagnosis.input_bound()
        if not diagnosis.input_bound() or diagnosis.report.interrupted:
            pass  # nothing to split or name: the ladder's figures stand
        elif not options.stage_costs:
            why_not = "the in-worker timing was turned off (stage_costs=False)"
        elif stages_outside_workers(workload.loader) or runner.workers == 0:
            why_not = "the in-worker timing needs DataLoader workers (num_workers > 0)"
            if loader_costs is not None:
                why_not += f"; the {loader_costs.loader}'s own clocks time its stages instead (the table below), which split no ladder step"
        else:
            costs, why_not = _stage_costs(
                diagnosis.report, workload, device, steps=options.steps, warmup=options.warmup, worker_timeout=options.worker_timeout
            )
        diagnosis.report.skipped_samples = state.skipped_during()  # before finish: a note says so
        report = diagnosis.finish(time.perf_counter() - started, costs, why_not)
        report.notes += _ray_notes(workload.loader)
        report.memory = finish_memory_section(
            memory, runner.memory, [e.cache_point for e in report.experiments], workload, device,
            loader_pass=options.loader_memory and not report.interrupted, budget_s=options.budget,
        )  # fmt: skip
        report.interrupted = report.interrupted or memory.interrupted
        if not report.interrupted:
            add_unseen(report, workload.loader, startup=options.startup, timeout=options.worker_timeout)
    report.elapsed_s = time.perf_counter() - started
    return report


def _ray_notes(loader: Any) -> list[str]:
    if not stages_outside_workers(loader):
        return []
    from fastpipe.distributed.stats import ray_stats_notes  # only Ray-backed loaders have these

    return ray_stats_notes(loader)


def _stage_costs(report: Report, workload: Workload, device: Device, **options: Any) -> tuple[Any, str | None]:
    """Time each stage inside the workers (:mod:`fastpipe.diagnosis.stagecost`): (StageCosts, None), or (None, why not)."""
    from fastpipe.diagnosis.stagecost import measure_stage_costs

    try:
        return measure_stage_costs(workload, device, **options), None
    except KeyboardInterrupt:
        report.interrupted = True
        return None, "the in-worker timing was interrupted"
    except PipelineError as exc:
        return None, f"the in-worker timing could not run ({exc})"
