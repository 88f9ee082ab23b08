"""The saturation caveat, settled: is a bottleneck found at a saturated CPU slow, or did it only tip the CPU over?

Part of :mod:`fastpipe.diagnosis.stagecost`. A diagnosis by caching can only say that a stage costs
throughput while the CPU is saturated; :func:`explain_saturation` reads the measured stage
costs against the device bound to say which it is, and which stages consume the CPU.
"""

from __future__ import annotations

import math

from fastpipe.diagnosis.stagecost._result import StageCost, StageCosts
from fastpipe.diagnosis.stagecost._timing import COLLATE_STAGE
from fastpipe.diagnosis.verdict._attribute import SATURATED_CPU
from fastpipe.diagnosis.verdict._report import Report


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
    """For each stage named at a saturated CPU: slow by itself, borderline, or only tipping the CPU over.

    Judged on **CPU time**, which a saturated CPU does not inflate the way it inflates wall time.
    At the device bound the pipeline must deliver ``bound x batch`` samples/s; its workers (at most
    the cores) then have a CPU budget per sample of ``min(workers, cores) / that rate``. A stage is
    *slow by itself* only when its CPU time per sample alone exceeds the budget by more than the
    pass's measured noise (two standard errors, at least 5%); within that margin it is
    *borderline*, and both numbers are given. Otherwise it only tipped the CPU over, and the line
    says whether the pipeline as a whole exceeds the cores or only the workers.
    """
    bound, batch = report.device_bound_steps_per_s, report.batch_size or costs.batch_size
    if not bound or not batch:
        return []
    needed = bound * batch
    workers = costs.parallelism
    budget_ms = 1000.0 * min(workers, costs.cores) / needed
    margin = max(2 * costs.noise, 0.05) if not math.isnan(costs.noise) else 0.05
    ranked = [s for s in costs.ranked("cpu_ms_per_sample") if s.cpu_ms_per_sample > 0]
    consumers = ", ".join(f"{s.name} {s.cpu_ms_per_sample:.2f} ms ({s.cpu_share:.0%})" for s in ranked)
    consumers = (
        f"CPU per sample, largest first: {consumers}" if consumers else "the stages themselves used almost no CPU (they wait, e.g. on I/O)"
    )
    cores_needed = costs.total_cpu_ms_per_sample / 1000.0 * needed
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
        own_cpu = sum(s.cpu_ms_per_sample for s in own)
        budget = (
            f"the {budget_ms:.2f} ms of CPU per sample that {min(workers, costs.cores)} workers have at the device bound "
            f"({needed:,.0f} samples/s = {bound:.2f} steps/s x {batch})"
        )
        if own_cpu > budget_ms * (1 + margin):
            lines.append(
                head + f"slow by itself: its CPU time alone, {own_cpu:.2f} ms per sample, exceeds {budget} by more than "
                f"the noise (±{margin:.0%}); make this stage cheaper."
            )
        elif own_cpu > budget_ms * (1 - margin):
            lines.append(
                head + f"borderline: its CPU time alone, {own_cpu:.2f} ms per sample, is within the noise (±{margin:.0%}) of "
                f"{budget}; it can tip the pipeline over by itself or nearly."
            )
        elif (own_wall := sum(s.ms_per_sample for s in own)) > budget_ms * (1 + margin) and own_cpu < own_wall / 2:
            lines.append(
                head + f"slow by itself, but not on the CPU: {own_wall:.2f} ms of wall time per sample for {own_cpu:.2f} ms "
                f"of CPU, against {budget}; it waits (I/O, a lock, a remote call), so more workers or prefetching "
                "overlap the waits."
            )
        elif costs.total_cpu_ms_per_sample <= budget_ms:
            lines.append(
                head + f"the workers' stages together fit the budget ({costs.total_cpu_ms_per_sample:.2f} ms of CPU per sample "
                f"against {budget_ms:.2f}), so the CPU went elsewhere: the training process (pinning, copies, a step on "
                f"the CPU) or other processes (the machine was {point.system_cpu_util if point else math.nan:.0%} busy)."
            )
        else:
            scope = (
                f"all stages together need {cores_needed:.1f} cores at the device bound and this machine gives {costs.cores}, "
                "so the pipeline's CPU as a whole must shrink"
                if cores_needed > costs.cores
                else f"all stages together need {cores_needed:.1f} of the {costs.cores} cores at the device bound, more than "
                f"{workers} workers give, so more workers may carry it (try fastpipe tune)"
            )
            lines.append(head + f"not slow by itself ({own_cpu:.2f} ms of CPU per sample against {budget}), but {scope}.")
    if lines:
        lines[-1] += f" {consumers}."  # once, after the last explanation, not on every line
    return lines
