"""Time attribution: what each stage adds to the step. Every rule that decides a figure or a name lives here.

A point's step time is ``1 / steps/s``. The rules, in the order they apply:

1. **Ladder.** Between an upper point (more cached) and the lower one below it, the stage in between adds
   ``t_lower - t_upper`` to every step. Times add up: the device step plus every stage's added time is the
   baseline step. A stage is *named* when its added time beats both the noise (two standard errors of the
   difference, :func:`~fastpipe.diagnosis.ladder._noise.difference_noise`) and the threshold (a fraction of the
   device step).
2. **Saturated or hidden spans are split by measured cost.** A ladder step is the stage's own cost only
   where the step time grows with the work: not where its upper point already runs at the device bound
   (part of the stage hides under the step, and the stage that tips the pipeline over is charged for what
   it un-hides), nor where its lower point has the CPU saturated (stages then slow each other, and the one
   that tips the CPU over is charged for the others), nor where other processes shared the machine at its lower
   point (:data:`SHARED_CPU`: a neighbour's load moves step times that no stage caused). Consecutive stages inside the workers (below the
   ``sample`` point) in either case form a *span*. The ladder measures the span's total reliably
   (``t_bottom - t_top``); it is split among the span's stages in proportion to their in-worker cost per
   sample (:class:`WorkerCost`: CPU time, plus the stage's own waits; never its wall time, which a neighbour's
   load stretches).
   A stage whose cost is above the threshold is named even when its own ladder step is zero.
3. **Veto.** A stage inside the workers whose in-worker cost per step (cost per sample x batch /
   :attr:`Attribution.parallelism`) is below the threshold is never named, whatever the ladder says.
4. **A noisy ladder still points somewhere.** Where the ladder cannot decide (the pair did not hold when
   remeasured, or its noise exceeds the threshold; a split share is decided by its span's total alone) and the in-worker cost is above the threshold, the stage
   is named by its in-worker cost, labelled as such (``basis="in-worker cost"``), with the reason.
5. **Waiting or computing.** A stage *waits* when its own blocked time (off the CPU, not waiting for a core, not
   held by another thread of its worker such as the feeder pickling the previous batch) is above the noise (two
   standard errors over the timed batches), more than its CPU time and at least :data:`WAIT_SHARE` of the
   pipeline's wall time per sample; else it *computes* (:func:`worker_costs`).
6. **The cache's own copy** (timed inside the workers, :mod:`fastpipe.diagnosis.ladder._cache`) is taken out of a
   point's step only where the workers set the pace: ``batch x copy / min(workers, usable cores)``, never
   taking the step below the pace the rest of the loop allows (the ``sample`` point, where the workers do
   nothing but hand out a finished sample; else the host or device point). A loop limited by the main
   process keeps its step as measured.

7. **Culprits and small costs.** A named stage whose time is under :data:`MINOR_SHARE` of the input time (the
   baseline step less the device step) is a *small cost* (``Bottleneck.minor``), listed apart from the culprits: it is
   real (beyond noise and threshold) but not where the time goes, and a busy neighbour, which raises every stage's CPU
   time through shared caches and memory bandwidth, lifts such stages over the threshold first (beside two busy loops
   toy:naive's ConvertColor was named third). The first named stage is never small.

8. **A ladder that is not monotone names nothing from its out-of-order points.** A point that caches more can never
   be slower than one that caches less; where one is, beyond the same noise and threshold that name a stage
   (:meth:`Attribution.inversions`, any two points, not only neighbours), one of the two measurements is off (a
   neighbour's load came and went, a point changed the work) and nobody can tell which: no ladder figure that starts
   or ends at either point is named (:meth:`Attribution.off_ladder`; rule 4's in-worker cost still may, labelled). When
   noise leaves nothing named although the step says there is something to name, the verdict is
   :func:`noise_verdict`'s "too noisy to decide: ..." with what to do.

Where the in-worker timing could not run, rules 2-5 do not apply and the report says so (rule 1 alone).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fastpipe._system import usable_cores
from fastpipe.diagnosis.ladder._cachepoint import BASELINE, DEVICE, HOST, SAMPLE, CachePoint
from fastpipe.diagnosis.ladder._noise import difference_noise
from fastpipe.diagnosis.ladder._plan import Plan, kind_of
from fastpipe.diagnosis.ladder._results import TOO_NOISY, ExperimentResult
from fastpipe.diagnosis.verdict._report import Bottleneck, Report, ms_text

VERDICT_BANDS = ((0.05, "not input-bound"), (0.20, "moderately input-bound"), (math.inf, "highly input-bound"))
SATURATED_CPU = 0.9
"""CPU utilisation (0..1 of usable cores) at which a point counts as saturated."""
LADDER, SPLIT, IN_WORKER = "ladder", "saturated split", "in-worker cost"
"""What a named stage's figure comes from (``Bottleneck.basis``)."""
WAIT_SHARE = 0.2
"""A stage's waiting counts (rule 5) only when it is at least this share of the pipeline's wall time per sample."""
SHARED_CPU = 0.25
"""Share of all cores other processes used at a point above which the machine counts as shared there (rule 2)."""
MINOR_SHARE = 0.1
"""A named stage under this share of the input time is a small cost, listed apart from the culprits (rule 7)."""
WORKER_KINDS = ("transform", "raw load")
"""Kinds of component that run entirely inside the workers, where the in-worker timing sees all of their cost."""


COMPETES = "the input pipeline competes with the step for the CPU"
"""The verdict's start when the step runs on the workers' cores (``--device cpu``): see :func:`verdict_for`."""


def verdict_for(gap: float, *, shares_cores: bool = False) -> str:
    """The verdict for a gap (the share of the baseline step that is input): a band of :data:`VERDICT_BANDS`.

    When the step runs on the cores the workers use (``shares_cores``, ``--device cpu``), a gap beyond the first band
    is not "input-bound" in the sense of a loop waiting for batches: the workers take the step's cores, so the loop
    may never wait while the step slows down. It is its own verdict then, "the input pipeline competes with the step
    for the CPU: X% of the step", X being the gap.
    """
    label = next(label for limit, label in VERDICT_BANDS if gap < limit)
    if shares_cores and gap >= VERDICT_BANDS[0][0]:
        return f"{COMPETES}: {gap:.0%} of the step"
    return label


def step_s(result: ExperimentResult) -> float:
    return 1.0 / result.steps_per_s


def stderr_s(result: ExperimentResult) -> float:
    return step_s(result) * result.noise


def difference_noise_s(a: ExperimentResult, b: ExperimentResult) -> float:
    """Two standard errors of the difference of two mean step times, in seconds (:func:`~fastpipe.diagnosis.ladder._noise.difference_noise`)."""
    return difference_noise(step_s(a), a.noise, step_s(b), b.noise)


def mark_small_costs(named: list[Bottleneck], input_ms: float | None) -> None:
    """Rule 7 on stages ranked largest first: each after the first whose time is under :data:`MINOR_SHARE` of
    ``input_ms`` is marked ``minor``. A figure that is a lower bound (``at_least``: part of it hides under the device
    step) counts at its in-worker cost where that is larger."""
    if not input_ms or input_ms <= 0:
        return
    for b in named[1:]:
        figure = max(b.added_ms, b.in_worker_ms or 0.0) if b.at_least else b.added_ms
        b.minor = figure < MINOR_SHARE * input_ms


def parts_of(stage: str) -> list[str]:
    """The stage names in a component's name (``"raw load + PILToTensor"`` -> both)."""
    return [part.strip() for part in stage.split(" + ") if part.strip()]


@dataclass(frozen=True)
class WorkerCost:
    """One stage's cost per sample inside the workers, as the split and the veto read it."""

    wall_ms: float
    cpu_ms: float
    wait_ms: float
    """The time it waits, where that counts (see :func:`worker_costs`); 0 for a stage that computes."""
    blocked_ms: float = 0.0
    """Its own blocked time as measured, counted as waiting or not (0 where the timing could not tell it apart)."""

    @property
    def own_ms(self) -> float:
        """What the stage costs a worker per sample: its CPU time and its waiting."""
        return self.cpu_ms + self.wait_ms

    @property
    def cpu_ratio(self) -> float:
        """CPU time over wall time inside the workers (1: all computing; near 0: all waiting)."""
        return self.cpu_ms / self.wall_ms if self.wall_ms > 0 else math.nan

    @property
    def waits(self) -> bool:
        return self.wait_ms > self.cpu_ms


def worker_costs(stages: dict[str, tuple[float, ...]]) -> dict[str, WorkerCost]:
    """Per-stage costs from ``{name: (wall ms, CPU ms[, run-queue ms[, held ms, own blocked ms, its noise ms]]) per
    sample}`` as the in-worker timing measured them (:class:`~fastpipe.diagnosis.stagecost.StageCost`'s fields).

    With all six figures the timing has already split the wall time: a stage's own blocked time is what is left
    once its CPU, its wait for a core and the time other threads of its worker held it are taken out, and it
    counts as waiting only when it is above its noise. With three (older timings), the wait is ``wall - CPU -
    run-queue``; with two, the pipeline's stages tell it: the highest CPU/wall ratio among the stages that hold a
    fair share (10%) of the CPU is the contention every computing stage saw, and a stage's wait is its wall time
    beyond its CPU time so stretched. Either way a wait counts only where it is more than the stage's CPU time and
    at least :data:`WAIT_SHARE` of the pipeline's wall time per sample: a cheap stage caught by a preemption does
    not turn into a waiting one.
    """
    # one thread cannot spend more CPU than wall time inside a stage: CPU beyond it is the timing's own work between
    # stages, charged to the next one (stagecost's ledger), which would make a stage that does nothing look busy
    rows = {name: (float(v[0]), min(float(v[1]), float(v[0])), *(float(x) for x in v[2:])) for name, v in stages.items()}
    total_cpu = sum(row[1] for row in rows.values())
    total_wall = sum(row[0] for row in rows.values())
    counted = any(len(row) > 2 and row[2] > 0 for row in rows.values())
    ratios = [row[1] / row[0] for row in rows.values() if row[0] > 0 and row[1] >= 0.1 * total_cpu > 0]
    contention = min(1.0, max(ratios)) if ratios else 1.0
    out = {}
    for name, row in rows.items():
        wall, cpu = row[0], row[1]
        noise = row[5] if len(row) >= 6 else 0.0
        if len(row) >= 6:
            blocked = row[4]
        elif counted:
            blocked = max(0.0, wall - cpu - (row[2] if len(row) > 2 else 0.0))
        else:
            blocked = max(0.0, wall - cpu / contention)
        waits = blocked > max(cpu, noise) and blocked >= WAIT_SHARE * total_wall
        out[name] = WorkerCost(wall, cpu, blocked if waits else 0.0, blocked)
    return out


@dataclass
class Attribution:
    """Inputs that turn measured points into per-stage times (the rules are in the module docstring)."""

    plan: Plan
    results: dict[str, ExperimentResult]
    threshold: float
    """Smallest added time that counts, as a fraction of the device step."""
    batch_size: int | None
    workers: int
    costs: dict[str, WorkerCost] | None = None
    """Each stage's in-worker cost (raw load and transforms), when the in-worker timing ran."""
    cores: int = field(default_factory=usable_cores)
    unresolved: dict[tuple[str, str], str] = field(default_factory=dict)
    """Pairs the ladder could not decide (they did not hold when remeasured), with the reason."""

    @property
    def device_s(self) -> float:
        return step_s(self.results[DEVICE])

    @property
    def threshold_s(self) -> float:
        return self.threshold * self.device_s

    @property
    def parallelism(self) -> int:
        """Processes that load in parallel: the workers the cores can run (the main process with no workers)."""
        return max(1, min(self.workers, self.cores))

    def measured(self) -> list[str]:
        return [p for p in self.plan.points if p in self.results]

    # ----- rule 6: the cache's own copy ---------------------------------------------------
    def pace_s(self) -> float:
        """The fastest step the loop allows when the workers do no pipeline work (the sample point, else host, else device)."""
        for point in (SAMPLE, HOST, DEVICE):
            if point in self.results:
                return step_s(self.results[point])
        return self.device_s

    def corrected_s(self, point: str) -> float:
        """The point's step time with the cache's own per-sample copy taken out where the workers set the pace.

        The copy costs ``batch x copy / min(workers, usable cores)`` a step while the workers are the bottleneck;
        it can take the step down to :meth:`pace_s` at most (there the main process or the device sets the pace,
        and the copy, done by idle workers, costs nothing). A step already at or below that pace is kept as measured.
        """
        result = self.results[point]
        measured, copy_s = step_s(result), result.copy_ms_per_sample / 1000.0
        if not self.batch_size or copy_s <= 0:
            return measured
        pace = self.pace_s()
        if measured <= pace:
            return measured
        return max(pace, measured - self.batch_size * copy_s / self.parallelism)

    # ----- rule 1: the ladder --------------------------------------------------------------
    def added(self, upper: str, lower: str) -> tuple[float, float]:
        """(seconds added per step, two standard errors of it) between two measured points."""
        return self.corrected_s(lower) - self.corrected_s(upper), difference_noise_s(self.results[upper], self.results[lower])

    def significant(self, upper: str, lower: str) -> bool:
        added, noise = self.added(upper, lower)
        return added > max(noise, self.threshold_s)

    def borderline(self, upper: str, lower: str) -> bool:
        """Named, but by less than twice the threshold or the noise: worth remeasuring before blaming it."""
        added, noise = self.added(upper, lower)
        return self.significant(upper, lower) and added < 2 * max(noise, self.threshold_s)

    def inverted(self, upper: str, lower: str) -> bool:
        """The point that caches less ran faster beyond noise and threshold: impossible for the pipeline."""
        added, noise = self.added(upper, lower)
        return -added > max(noise, self.threshold_s)

    # ----- rule 8: a ladder that is not monotone ------------------------------------------
    def inversions(self) -> list[tuple[str, str]]:
        """Every pair of measured points (more cached, less cached), neighbours or not, where the one that caches more
        ran slower beyond noise and threshold (:meth:`inverted`): the ladder is not monotone there."""
        measured = self.measured()
        return [(upper, lower) for i, upper in enumerate(measured) for lower in measured[i + 1 :] if self.inverted(upper, lower)]

    def off_ladder(self) -> set[str]:
        """The points of every inversion: a ladder figure that starts or ends at one of them is never named (rule 8)."""
        return {point for pair in self.inversions() for point in pair}

    def out_of_order(self, component: Bottleneck) -> bool:
        """Whether the component's figure (its own ladder step, or the span it was split from) touches an out-of-order point."""
        points = set(component.between) | set(component.span or ())
        return bool(points & self.off_ladder())

    def inversion_text(self, limit: int = 2) -> str:
        """The inversions in words, the largest first (at most ``limit``), for a caveat or the verdict."""
        pairs = sorted(self.inversions(), key=lambda pair: self.added(*pair)[0])  # the largest inversion first
        words = []
        for upper, lower in pairs[:limit]:
            added, noise = self.added(upper, lower)
            words.append(
                f"'{CachePoint(upper).label}' ({self.corrected_s(upper) * 1000:.0f} ms a step), which caches more, ran "
                f"{-added * 1000:.0f} ms ±{noise * 1000:.0f} slower than '{CachePoint(lower).label}' "
                f"({self.corrected_s(lower) * 1000:.0f} ms)"
            )
        more = f" and {len(pairs) - limit} more pair(s)" if len(pairs) > limit else ""
        return "; ".join(words) + more

    def at_bound(self, point: str) -> bool:
        """The point runs as fast as the loop can without workers (the host point, or the device's when it was
        not measured), within noise and threshold: its own pipeline work hides under the step."""
        if CachePoint(point).outside_workers:
            return True
        reference = self.results.get(HOST) or self.results[DEVICE]
        excess = self.corrected_s(point) - step_s(reference)
        return excess <= max(difference_noise_s(self.results[point], reference), self.threshold_s)

    def saturated(self, point: str) -> bool:
        """The CPU was saturated at the point: by the diagnosed process tree, or by it and other processes together
        (either way the stages competed for cores, and their ladder steps stop adding up one by one)."""
        result = self.results[point]
        return max(result.cpu_util, result.system_cpu_util) >= SATURATED_CPU

    # ----- rules 2-5: in-worker costs ----------------------------------------------------
    def cost_of(self, stage: str) -> list[WorkerCost] | None:
        """The in-worker costs of a component's stages, or None when any of them was not timed."""
        if not self.costs:
            return None
        parts = [self.costs.get(part) for part in parts_of(stage)]
        return parts if parts and all(p is not None for p in parts) else None  # type: ignore[return-value]

    def per_step_ms(self, costs: list[WorkerCost]) -> float | None:
        """In-worker cost per sample, summed, as milliseconds per step: x batch / parallelism."""
        if not self.batch_size:
            return None
        return sum(c.own_ms for c in costs) * self.batch_size / self.parallelism

    def shared(self, point: str) -> bool:
        """Other processes used at least :data:`SHARED_CPU` of all cores while the point ran (a busy neighbour)."""
        result = self.results[point]
        return result.system_cpu_util - result.cpu_util >= SHARED_CPU

    def _linear(self, upper: str, lower: str) -> bool:
        """Whether the ladder step between two points is the stage's own cost (rule 2)."""
        return not self.at_bound(upper) and not self.saturated(lower) and not self.shared(lower)

    def components(self, baseline_s: float | None) -> list[Bottleneck]:
        """One entry per pair of neighbouring measured points, in order from the device down, with the figure
        the rules give it (rules 1, 2 and 5; :meth:`named` applies 3 and :meth:`by_cost` applies 4)."""
        out = []
        measured = self.measured()
        for upper, lower in zip(measured, measured[1:]):
            between = self.plan.between(upper, lower)
            added, noise = self.added(upper, lower)
            stage = " + ".join(reversed(between)) if len(between) > 1 else between[0]
            component = Bottleneck(
                stage=stage,
                kind=kind_of(between),
                added_ms=added * 1000,
                noise_ms=noise * 1000,
                share_of_baseline=math.nan,
                between=(upper, lower),
                cpu_saturated=self.results[lower].cpu_util >= SATURATED_CPU,
                at_least=self.at_bound(upper),
                ladder_ms=added * 1000,
            )
            costs = self.cost_of(stage) if self._worker_side(component) else None
            if costs:
                component.in_worker_ms = self.per_step_ms(costs)
                wall, cpu, wait = (sum(getattr(c, f) for c in costs) for f in ("wall_ms", "cpu_ms", "wait_ms"))
                component.cpu_ratio = cpu / wall if wall > 0 else None
                component.waits = wait > cpu
            out.append(component)
        self._split(out)
        for c in out:
            c.share_of_baseline = c.added_ms / (baseline_s * 1000) if baseline_s else math.nan
        return out

    def _worker_side(self, component: Bottleneck) -> bool:
        """Below the sample point, made only of the raw load and transforms (their whole cost is in the workers)."""
        upper = CachePoint(component.between[0])
        return upper.kind in ("sample", "after", "raw") and all(kind_of([part]) in WORKER_KINDS for part in parts_of(component.stage))

    def _split(self, components: list[Bottleneck]) -> None:
        """Rule 2: each run of worker-side components whose ladder steps are not linear shares the run's total by cost."""
        run: list[Bottleneck] = []
        for c in components + [None]:  # type: ignore[list-item]
            if c is not None and c.in_worker_ms is not None and not self._linear(*c.between):
                run.append(c)
                continue
            if run:
                self._share(run)
            run = []

    def _share(self, run: list[Bottleneck]) -> None:
        top, bottom = run[0].between[0], run[-1].between[1]
        total, noise = self.added(top, bottom)
        weights = [c.in_worker_ms or 0.0 for c in run]
        if sum(weights) <= 0 or total <= 0:
            return
        for c, w in zip(run, weights):
            share = w / sum(weights)
            c.added_ms, c.noise_ms, c.basis = 1000 * total * share, 1000 * noise * share, SPLIT
            c.span = (top, bottom)
            c.at_least = self.at_bound(top)  # the span's total itself can hide under the device step

    def by_cost_parts(self, component: Bottleneck, why: str) -> list[Bottleneck]:
        """Rule 4's entries for a component the ladder could not decide: one per stage in it whose in-worker cost is
        above the threshold (a span of stages the ladder measured as one is named stage by stage)."""
        out = []
        for part in parts_of(component.stage):
            costs = self.cost_of(part)
            ms = self.per_step_ms(costs) if costs else None
            if ms is None or ms < self.threshold_s * 1000:
                continue
            wall, cpu, wait = (sum(getattr(c, f) for c in costs) for f in ("wall_ms", "cpu_ms", "wait_ms"))
            out.append(
                Bottleneck(
                    stage=part,
                    kind=kind_of([part]),
                    added_ms=ms,
                    noise_ms=component.noise_ms,
                    share_of_baseline=component.share_of_baseline * (ms / component.added_ms) if component.added_ms > 0 else math.nan,
                    between=component.between,
                    cpu_saturated=component.cpu_saturated,
                    basis=IN_WORKER,
                    why=why,
                    in_worker_ms=ms,
                    ladder_ms=component.ladder_ms,
                    cpu_ratio=cpu / wall if wall > 0 else None,
                    waits=wait > cpu,
                )
            )
        return out

    def unnamed_costs(self, components: list[Bottleneck]) -> list[Bottleneck]:
        """Rule 4 for a run that would name nothing although it is input-bound: every stage inside the workers whose
        in-worker cost is above the threshold, by that cost, with the reason."""
        out = []
        for c in components:
            if all(kind_of([part]) in WORKER_KINDS or part in ("collate/IPC", "host-to-device copy") for part in parts_of(c.stage)):
                why = (
                    f"the ladder could not resolve any stage (the span from '{CachePoint(c.between[0]).label}' to "
                    f"'{CachePoint(c.between[1]).label}' adds {c.ladder_ms or c.added_ms:.0f} ms ±{c.noise_ms:.0f})"
                )
                out += self.by_cost_parts(c, why)
        return out

    def vetoed(self, component: Bottleneck) -> bool:
        """Rule 3: a worker-side stage whose in-worker cost per step is below the threshold is never named."""
        return component.in_worker_ms is not None and component.in_worker_ms < self.threshold_s * 1000

    def named(self, component: Bottleneck) -> bool:
        """Rules 1-3 and 8: the component's figure beats noise and threshold, its in-worker cost does not clear it, and
        it does not start or end at a point where the ladder is out of order."""
        return (
            not self.vetoed(component)
            and component.added_ms > max(component.noise_ms, self.threshold_s * 1000)
            and not self.out_of_order(component)
        )

    def by_cost(self, component: Bottleneck) -> str | None:
        """Rule 4: why the ladder could not decide this component, when its in-worker cost names it instead (else None)."""
        if component.in_worker_ms is None or self.vetoed(component) or self.named(component):
            return None
        why = self.unresolved.get(component.between) if component.basis == LADDER else None  # a split share stands on its span
        if why is None and self.out_of_order(component):
            why = f"the ladder is not monotone around it: {self.inversion_text(1)}"
        if why is None and component.noise_ms > self.threshold_s * 1000:
            why = (
                f"the ladder could not resolve it: ±{ms_text(component.noise_ms)} ms of noise against a threshold of "
                f"{ms_text(self.threshold_s * 1000)} ms"
            )
        return why


TO_DECIDE = (
    "to decide, measure on a quieter machine{busy}, or longer: a larger --budget, or a smaller --precision than {target:g} "
    "(each point then runs until its mean step time is that precise)"
)
"""What a "too noisy to decide" verdict tells the user to do (the same in factory and script mode)."""


def noise_verdict(attribution: Attribution, report: Report) -> str | None:
    """The verdict when noise, not the pipeline, decides what the report can say (rule 8), else None.

    "too noisy to decide: ..." when the baseline step is beyond the threshold of the device step but not beyond the
    noise of that difference (whether the input costs time is not known); when it is within both but the noise reaches
    past the threshold because the device or baseline point missed its precision target (at the target, a gap within
    its noise is the answer the user asked for: not input-bound); or when it is beyond both and yet no stage
    is named by the ladder because the stages that would hold that time are within their noise, out of order on the
    ladder (:meth:`Attribution.inversions`), or did not hold when remeasured. Stages rule 4 names by their in-worker
    cost alone are then pointers, not findings: the verdict says so and names the largest. A gap spread
    over stages that are each below the threshold, beyond their noise, is not noise: that verdict stays as it is.
    """
    results = attribution.results
    if DEVICE not in results or BASELINE not in results:
        return None
    added, noise = attribution.added(DEVICE, BASELINE)
    threshold = attribution.threshold_s
    device_ms, baseline_ms = 1000 * attribution.corrected_s(DEVICE), 1000 * attribution.corrected_s(BASELINE)
    why = None
    missed = [r for r in (results[DEVICE], results[BASELINE]) if r.noise > report.precision_target]
    if threshold < added <= noise:
        why = (
            f"the baseline step ({baseline_ms:.0f} ms) is {1000 * added:+.0f} ±{1000 * noise:.0f} ms from the device step "
            f"({device_ms:.0f} ms), within the noise of that difference, so whether the input costs the step any time is not known"
        )
    elif added <= max(noise, threshold) and added + noise > threshold and missed:
        short = ", ".join(f"'{CachePoint(r.cache_point).label}' ±{r.noise:.1%}" for r in missed)
        why = (
            f"the baseline step ({baseline_ms:.0f} ms) is {1000 * added:+.0f} ±{1000 * noise:.0f} ms from the device step "
            f"({device_ms:.0f} ms): within its noise, but that noise reaches past the {1000 * threshold:.0f} ms threshold "
            f"because {short} missed the {report.precision_target:.0%} precision target, so whether the input costs the step "
            "time is not known"
        )
    elif added > max(noise, threshold) and not any(b.basis in (LADDER, SPLIT) for b in report.bottlenecks):
        gap = (
            f"the input costs {1000 * added:.0f} ±{1000 * noise:.0f} ms a step ({baseline_ms:.0f} against the device's {device_ms:.0f} ms)"
        )
        within = [c for c in report.components if threshold * 1000 < c.added_ms <= c.noise_ms and not attribution.vetoed(c)]
        if attribution.inversions():
            why = (
                f"{gap}, but the ladder is not monotone beyond its noise ({attribution.inversion_text()}), so no stage "
                "can be named from those points"
            )
        elif within or report.unresolved:
            listed = [f"{c.stage} {c.added_ms:+.0f} ±{c.noise_ms:.0f} ms" for c in within[:3]]
            listed += [f"{c.stage} {c.added_ms:+.0f} ms, which did not hold when remeasured" for c in report.unresolved[:2]]
            why = f"{gap}, but no stage's share of it is beyond its noise ({'; '.join(listed)})"
    if why is None:
        return None
    by_cost = [b for b in report.bottlenecks if b.basis == IN_WORKER]
    if by_cost:
        top = max(by_cost, key=lambda b: b.added_ms)
        why += (
            f"; timed inside the workers (a separate measurement, which says what the workers spend, not what the step "
            f"waits for), {top.stage} costs the most: {top.added_ms:.0f} ms a step"
        )
    busy = max((r.system_cpu_util - r.cpu_util for r in results.values() if r.system_cpu_util == r.system_cpu_util), default=0.0)
    where = f" (other processes used up to {busy:.0%} of the CPU during the ladder)" if busy >= SHARED_CPU else ""
    return f"{TOO_NOISY}: {why}; " + TO_DECIDE.format(busy=where, target=report.precision_target)
