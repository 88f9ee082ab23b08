"""The saturation caveat, settled: is a bottleneck found at a saturated CPU slow, or did it only tip the CPU over?

Part of :mod:`fastpipe.stagecost`. A diagnosis by caching can only say that a stage costs
throughput while the CPU is saturated; :func:`explain_saturation` reads the measured stage
costs against the device bound to say which it is, and which stages consume the CPU.
"""
from __future__ import annotations

import math

from fastpipe.report import Report
from fastpipe.stagecost.result import StageCost, StageCosts, _rate
from fastpipe.stagecost.timing import COLLATE_STAGE

#: CPU utilisation (0..1 of usable cores) at which a point counts as saturated; diagnose's own value.
SATURATED_CPU = 0.9


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
