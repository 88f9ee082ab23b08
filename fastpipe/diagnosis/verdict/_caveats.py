"""The wording of a diagnosis report's caveats and notes: one rule per function, each returning a line or None.

Each rule reads a :class:`Facts` (the finished attribution and what the run knows about itself) and says one
thing, or nothing. :data:`CAVEATS` and :data:`NOTES` list them in the order they print; a new caveat is a new
function added there. Nothing here measures or decides a figure: the figures come from
:mod:`fastpipe.diagnosis.verdict._attribute`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from fastpipe.diagnosis.ladder._cachepoint import CachePoint
from fastpipe.diagnosis.ladder._plan import has_copy
from fastpipe.diagnosis.verdict._attribute import IN_WORKER, SPLIT, Attribution
from fastpipe.diagnosis.verdict._report import Bottleneck, Report

SATURATION_CAVEAT_START = "the CPU was saturated"
BUSY_MACHINE = 0.25
"""Share of all cores used by other processes above which a point counts as measured on a loaded machine."""
LADDER_AGREEMENT = 1.5
"""Ladder time and in-worker time of a stage further apart than this factor are flagged."""


@dataclass
class Facts:
    """What the rules read: the report so far, the attribution behind it, and the run's settings."""

    report: Report
    attribution: Attribution
    workers: int
    device_kind: str
    pool: int
    target: float
    budget_s: float
    costs: Any = None
    """The in-worker :class:`~fastpipe.diagnosis.stagecost.StageCosts`, when that pass ran."""
    no_costs_reason: str | None = None
    """Why the in-worker timing did not run, when it did not."""
    inverted: list[tuple[str, str]] = field(default_factory=list)
    """Pairs whose lower point ran faster than the upper one twice in a row."""
    rank_spread: tuple[int, str, float, int] | None = None
    """(ranks, point, widest spread, slowest rank) under DDP."""


Rule = Callable[[Facts], "str | None"]


def _label(point: str) -> str:
    return CachePoint(point).label


# ----- caveats --------------------------------------------------------------------------------
def saturation_unexplained(facts: Facts) -> str | None:
    """Named stages at a saturated CPU, when no in-worker timing can tell tipping from cost."""
    if facts.costs is not None:
        return None
    saturated = [b for b in facts.report.bottlenecks if b.cpu_saturated]
    if not saturated:
        return None
    results = facts.attribution.results
    listed = ", ".join(f"{b.stage} ({results[b.between[1]].cpu_util:.0%} of the cores)" for b in saturated)
    return (
        f"{SATURATION_CAVEAT_START} once these stages were added: {listed}: a stage may only be tipping an "
        "already-saturated CPU over, rather than being slow itself (the in-worker timing, which would settle it, did not run)"
    )


def saturation_explained(facts: Facts) -> str | None:
    """Each named stage at a saturated CPU, against the CPU budget per sample the workers have at the device bound."""
    if facts.costs is None or not any(b.cpu_saturated for b in facts.report.bottlenecks):
        return None
    from fastpipe.diagnosis.verdict._saturation import explain_saturation

    return " ".join(explain_saturation(facts.report, facts.costs)) or None


def pool_spread(facts: Facts) -> str | None:
    if facts.pool <= 1:
        return None
    spread = [r for r in facts.report.experiments if r.pool_spread is not None and r.pool_spread > 0.05]
    if not spread:
        return None
    listed = ", ".join(f"'{r.name}' {r.pool_spread:.1%}" for r in spread)
    return f"across the {facts.pool} cached batches, mean step time varies ({listed}): the step time depends on the data"


def no_workers(facts: Facts) -> str | None:
    if facts.workers != 0:
        return None
    return "num_workers=0: data loads in the training process, which is not the multi-worker case this method is built for"


def cpu_device(facts: Facts) -> str | None:
    if facts.device_kind != "cpu":
        return None
    return (
        "on --device cpu the model and the workers share the same cores, so the device bound is low and every "
        "pipeline stage also slows the step: the loop may never wait for a batch while the workers take the model's "
        "cores, so `fastpipe watch` (which times the waits) can report little input-bound time where the ladder reports "
        "the step's slowdown; once the step runs on an accelerator (or --device sim:STEP_MS) the two separate the step "
        "from the pipeline and agree"
    )


def busy_machine_line(others: list[tuple[str, float]], handled: str) -> str | None:
    """The interference check, one wording for ``diagnose`` and ``compare``: ``others`` are (what was measured, share of
    the CPU other processes used meanwhile); ``handled`` says what the command did about it."""
    busy = [(name, other) for name, other in others if other > BUSY_MACHINE]
    if not busy:
        return None
    name, other = max(busy, key=lambda item: item[1])
    return (
        f"other processes used up to {other:.0%} of the CPU during the run (at '{name}'): {handled}; rerun on a quieter machine to be sure"
    )


def busy_machine(facts: Facts) -> str | None:
    """The machine was shared, and by how much; with in-worker costs, how the stages were sized despite it (rule 2)."""
    handled = "pairs measured then were remeasured back to back"
    if facts.attribution.costs:
        handled += (
            "; the stages inside the workers are sized by their CPU time and their own waits, never by their wall time, "
            "which that load stretches (a stage whose CPU time itself grows beside a neighbour, through shared caches "
            "and memory bandwidth, pays that cost here too)"
        )
    return busy_machine_line([(r.name, r.system_cpu_util - r.cpu_util) for r in facts.report.experiments], handled)


def imprecise(facts: Facts) -> str | None:
    short = [r for r in facts.report.experiments if r.noise > facts.target]
    if not short:
        return None
    listed = ", ".join(f"{r.name} ±{r.noise:.1%}" for r in short)
    return (
        f"{len(short)} point(s) did not reach the {facts.target:.0%} precision target within the "
        f"{facts.budget_s:g} s budget ({listed}); raise --budget for a firmer answer"
    )


def inverted_pairs(facts: Facts) -> str | None:
    if not facts.inverted:
        return None
    pairs = "; ".join(f"'{_label(lower)}' ran faster than '{_label(upper)}', which caches more" for upper, lower in facts.inverted)
    return (
        f"{pairs}, twice in a row: that is interference or a cache point that changes the work, not the pipeline; "
        "the stages between them are named only by their in-worker cost"
    )


def not_monotone(facts: Facts) -> str | None:
    """Rule 8 of :mod:`~fastpipe.diagnosis.verdict._attribute`: where the ladder is out of order beyond its noise, say
    so, and that nothing is named from those points (the pairs already told twice in a row are :func:`inverted_pairs`')."""
    att = facts.attribution
    fresh = [pair for pair in att.inversions() if pair not in facts.inverted]
    if not fresh:
        return None
    points = ", ".join(f"'{_label(p)}'" for p in att.measured() if p in att.off_ladder())
    return (
        f"the ladder is not monotone beyond its noise: {att.inversion_text()}; one of each pair was measured while "
        f"something else changed (a neighbour's load, the step's own variation, or a cache point that changes the work), so no stage is named from a figure "
        f"that starts or ends at {points}"
    )


def ladder_disagreements(facts: Facts) -> str | None:
    """Named stages whose own ladder step and in-worker cost disagree, and why (the split and the veto settle most)."""
    lines = []
    for b in facts.report.bottlenecks:
        if not b.in_worker_ms or b.basis != "ladder":
            continue
        ratio = b.added_ms / b.in_worker_ms
        if 1 / LADDER_AGREEMENT <= ratio <= LADDER_AGREEMENT:
            continue
        why = (
            "its upper point ran at the device bound, so part of its cost hides under the device step"
            if b.at_least and ratio < 1
            else "the two measurements disagree beyond their noise"
        )
        lines.append(
            f"{b.stage}: the ladder puts {b.added_ms:.0f} ms per step on it, the in-worker timing {b.in_worker_ms:.0f} ms "
            f"(x{ratio:.2f}): {why}"
        )
    return "; ".join(lines) or None


CAVEATS: list[Rule] = [
    saturation_unexplained,
    saturation_explained,
    inverted_pairs,
    not_monotone,
    ladder_disagreements,
    pool_spread,
    no_workers,
    cpu_device,
    busy_machine,
    imprecise,
]


# ----- notes ----------------------------------------------------------------------------------
def split_spans(facts: Facts) -> str | None:
    """Where rule 2 split a span's ladder total by in-worker cost, say so once per span, with the figures."""
    spans: dict[tuple[str, str], list[Bottleneck]] = {}
    for c in facts.report.components:
        if c.basis == SPLIT and c.span is not None:
            spans.setdefault(c.span, []).append(c)
    lines = []
    for (top, bottom), members in spans.items():
        total = sum(c.added_ms for c in members)
        results = facts.attribution.results
        att = facts.attribution
        busy = max(max(results[c.between[1]].cpu_util, results[c.between[1]].system_cpu_util) for c in members)
        why = (
            f"the CPU was saturated ({busy:.0%} of the cores busy, these processes and others)"
            if any(att.saturated(c.between[1]) for c in members)
            else ""
        )
        hidden = "its top point ran at the device bound" if att.at_bound(top) else ""
        reason = " and ".join(r for r in (why, hidden) if r)
        shares = ", ".join(f"{c.stage} {c.added_ms:.0f}" for c in sorted(members, key=lambda c: c.added_ms, reverse=True))
        lines.append(
            f"from '{_label(top)}' ({results[top].ms_per_step:.0f} ms a step) to '{_label(bottom)}' "
            f"({results[bottom].ms_per_step:.0f} ms) {reason}, so one stage's ladder step is not its cost: the span's "
            f"{total:.0f} ms per step was split among its stages by in-worker cost per sample ({shares} ms)"
        )
    return "; ".join(lines) or None


def vetoed(facts: Facts) -> str | None:
    """Stages whose ladder step beat noise and threshold but whose in-worker cost is below the threshold."""
    att = facts.attribution
    cleared = [c for c in facts.report.components if att.vetoed(c) and (c.ladder_ms or 0) > max(c.noise_ms, att.threshold_s * 1000)]
    if not cleared:
        return None
    listed = ", ".join(f"{c.stage} (ladder {c.ladder_ms:.0f} ms, in the workers {c.in_worker_ms:.1f} ms per step)" for c in cleared)
    return (
        f"not named although their ladder step is above the threshold, because their in-worker cost is below it: {listed}; "
        "a stage that costs nothing in the workers only tipped the pipeline over"
    )


def by_in_worker_cost(facts: Facts) -> str | None:
    named = [b for b in facts.report.bottlenecks if b.basis == IN_WORKER]
    if not named:
        return None
    return "named by in-worker cost (labelled so), where the ladder could not decide: " + "; ".join(f"{b.stage}: {b.why}" for b in named)


def without_costs(facts: Facts) -> str | None:
    if facts.costs is not None or facts.no_costs_reason is None:
        return None
    return f"{facts.no_costs_reason}: each stage's time is its own ladder step alone (no split, no veto, no waiting check)"


def copies(facts: Facts) -> str | None:
    measured = [e for e in facts.report.experiments if e.copy_ms_per_sample >= 0.05]
    if not measured:
        return None
    listed = ", ".join(f"{e.name} {e.copy_ms_per_sample:.2f} ms" for e in measured)
    return (
        f"cached values are copied for every sample so in-place transforms cannot pile up; the copy was timed inside the "
        f"workers ({listed} per sample) and taken out of each point's step where the workers set the pace, divided by the "
        f"{facts.attribution.parallelism} workers the cores can run"
    )


def ddp_spread(facts: Facts) -> str | None:
    if facts.rank_spread is None:
        return None
    size, point, spread, slowest = facts.rank_spread
    return (
        f"DDP with {size} ranks: every point shows its slowest rank, and all ranks followed one plan; the ranks' step "
        f"times differed by up to {spread:.0%} (at '{_label(point)}', slowest rank {slowest})"
    )


def skipped_files(facts: Facts) -> str | None:
    skipped = facts.report.skipped_samples
    if not skipped:
        return None
    return (
        f"the dataset skipped {skipped} damaged sample{'s' if skipped != 1 else ''} during the diagnosis "
        "(on_error='skip': each replaced by the next file that decodes, and warned about with the file's name); "
        "the points that decode files paid for the failed attempts too, and your dataset's skip count was left as it was"
    )


def no_copy(facts: Facts) -> str | None:
    """The device decides what exists: on one with no copy (``cpu``) there is no host point and no copy stage."""
    if has_copy(facts.device_kind):
        return None
    return (
        f"on {facts.device_kind} the step reads its batches where the loader leaves them: there is no host-to-device copy, "
        "so the ladder has no host point and no copy stage"
    )


NOTES: list[Rule] = [no_copy, without_costs, split_spans, vetoed, by_in_worker_cost, copies, ddp_spread, skipped_files]


def apply(rules: list[Rule], facts: Facts) -> list[str]:
    """The lines the rules give, in order, leaving out the rules that said nothing."""
    return [line for line in (rule(facts) for rule in rules) if line]


def workers_needed(costs: dict[str, Any] | None, device_ms: float, batch: int | None) -> int | None:
    """The workers that deliver a batch every device step: ``batch x`` the sum of every stage's own time per sample
    ``/ device step`` (a worker spends that sum on each sample); None without costs, a batch size or a device step."""
    if not costs or not batch or device_ms <= 0:
        return None
    return math.ceil(batch * sum(c.own_ms for c in costs.values()) / device_ms)


WORKER_GAIN = 0.05
"""Projected throughput gain below which more workers are not advised for a stage that waits."""


def projected_workers(
    costs: dict[str, Any], device_ms: float, batch: int, workers: int, free_cores: float
) -> tuple[int, float, float, float]:
    """(workers that reach the pace, projected gain, samples/s now, samples/s then) for a pipeline that waits.

    A worker spends the stages' own time on each sample (CPU and own waits, never time a neighbour took), so ``w``
    workers deliver at most ``w / that`` samples per ms; the cores actually free (all usable cores less what other
    processes used) deliver at most ``free / CPU per sample``. More workers raise the first limit only: the pace they
    can reach is the lower of the device's and the free cores', and the gain is that over today's lower limit.
    """
    per_sample = sum(c.own_ms for c in costs.values())
    cpu = sum(c.cpu_ms for c in costs.values())
    cores_rate = free_cores / cpu if cpu > 0 else math.inf
    now = min(max(1, workers) / per_sample, cores_rate)
    then = min(batch / device_ms, cores_rate)
    needed = math.ceil(then * per_sample - 1e-9)
    return needed, then / now - 1.0, 1000 * now, 1000 * then


def waiting_text(
    b: Bottleneck,
    costs: dict[str, Any] | None,
    device_ms: float,
    batch: int | None,
    cores: int,
    *,
    workers: int | None = None,
    free_cores: float | None = None,
) -> str | None:
    """Rule 5's wording: whether the stage waits or computes, and for one that waits, the workers that would hide it.

    ``costs`` are every stage's :class:`~fastpipe.diagnosis.verdict._attribute.WorkerCost` (collate and the worker
    overhead included): a worker spends their sum on each sample. More workers are advised only with the gain they
    are projected to bring (:func:`projected_workers`) from the blocked time and the ``free_cores`` (``cores`` less
    what other processes used), and only when that gain is at least :data:`WORKER_GAIN`.
    """
    if b.cpu_ratio is None or b.waits is None:
        return None
    if not b.waits:
        busy = " (the rest is waiting for a core on a busy machine, as the other stages did)" if b.cpu_ratio < 0.8 else ""
        return f"{b.stage} computes: its CPU time is {b.cpu_ratio:.0%} of its wall time in the workers{busy}, so make it cheaper."
    text = (
        f"{b.stage} waits: its CPU time is only {b.cpu_ratio:.0%} of its wall time in the workers and the rest is its own "
        "waiting (I/O, a sleep, a lock or a remote call; not a wait for a core or for another thread of the worker), so "
        "making its code faster will not help"
    )
    if not costs or not batch or device_ms <= 0:
        return text + "; overlap the waits instead: more DataLoader workers, a deeper prefetch_factor, faster or local storage."
    free = float(cores) if free_cores is None else max(0.0, min(float(cores), free_cores))
    shared = f" ({cores - free:.1f} of the {cores} cores were used by other processes)" if free < cores - 0.05 else ""
    per_sample, waiting = sum(c.own_ms for c in costs.values()), sum(c.wait_ms for c in costs.values())
    needed, gain, now, then = projected_workers(costs, device_ms, batch, workers or 0, free)
    measured = f"At the measured {per_sample:.1f} ms per sample in a worker ({waiting:.1f} of it waiting)"
    device_rate = 1000.0 * batch / device_ms
    if workers is not None and needed <= max(1, workers) and then >= device_rate * (1 - 1e-9):
        # by the in-worker costs the workers there are already keep up with the device: more would not help
        return (
            f"{text}. {measured}, about {needed} workers would keep up with the {device_ms:.0f} ms device step ({batch} "
            f"samples a step), and the {workers} workers now already do by this projection, so more workers are projected "
            f"to gain {max(0.0, gain):.0%}; what this stage adds to the step is not its waiting alone."
        )
    if workers is not None and (needed <= max(1, workers) or gain < WORKER_GAIN):
        return (
            f"{text}. {measured}, more workers are projected to gain {max(0.0, gain):.0%}: the {free:.1f} free cores{shared} "
            f"already limit the pipeline to {then:,.0f} samples/s at its {sum(c.cpu_ms for c in costs.values()):.1f} ms of "
            "CPU per sample, so make the stages' CPU cheaper first."
        )
    text += "; overlap the waits instead: more DataLoader workers, a deeper prefetch_factor, faster or local storage. "
    cores_needed = batch * sum(c.cpu_ms for c in costs.values()) / device_ms
    pace = device_rate
    if cores_needed > free:  # the free cores cap what more workers reach, short of the device's pace
        text += (
            f"{measured}, about {needed} workers would reach the {then:,.0f} samples/s that the {free:.1f} free cores here"
            f"{shared} allow, short of the {pace:,.0f} the {device_ms:.0f} ms device step takes ({cores_needed:.1f} cores' worth "
            "of CPU): the cores, not the waits, would then set the pace"
        )
    else:
        text += (
            f"{measured}, about {needed} workers would keep up with the {device_ms:.0f} ms device step ({batch} samples a step), "
            f"and their CPU fits the {free:.1f} free cores here{shared} ({cores_needed:.1f} needed)"
        )
    if workers is not None:
        text += f"; a projected gain of up to {gain:.0%} ({now:,.0f} to {then:,.0f} samples/s) over the {workers} workers now"
    return text + (
        ". Caution: each worker holds its own copy of the dataset and prefetch_factor batches in memory; "
        "`fastpipe tune` finds the fewest workers that keep up and watches shared memory."
    )
