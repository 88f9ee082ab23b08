"""The one noise estimator: the relative standard error of a mean step time, over whole rounds of workers.

With N workers, batches arrive in bursts (one step waits for a batch, the next N-1 find theirs
ready), so single step times swing widely while whole rounds stay steady. Every figure of
precision in fastpipe (diagnosis points, compare rungs, stage costs, the tuner) comes from here.
"""

from __future__ import annotations

import math
import statistics
from typing import Protocol, Sequence

MIN_ROUNDS = 3


def rel_stderr(step_times: Sequence[float], round_size: int = 1) -> float:
    """Relative standard error of the mean of ``step_times``, from whole rounds of ``round_size`` steps.

    With fewer than three whole rounds it falls back to the single steps' spread over sqrt(n).
    """
    size = max(1, round_size)
    rounds = [sum(step_times[i : i + size]) for i in range(0, len(step_times) - size + 1, size)]
    if len(rounds) >= MIN_ROUNDS:
        return statistics.stdev(rounds) / statistics.fmean(rounds) / math.sqrt(len(rounds))
    if len(step_times) < 2:
        return 0.0
    return statistics.stdev(step_times) / statistics.fmean(step_times) / math.sqrt(len(step_times))


SIGNIFICANCE = 2.0
"""How many standard errors a difference must exceed to count: the one significance rule of fastpipe."""


def difference_noise(a: float, a_rel_stderr: float, b: float, b_rel_stderr: float) -> float:
    """Two standard errors of ``a - b``, from each value and its relative standard error (same unit as a and b).

    The diagnosis (added time between points), ``compare`` (rung against rung), ``tune`` (setting against
    setting) and the stage-cost overhead check all decide "beyond noise" with this one rule.
    """
    return SIGNIFICANCE * math.hypot(a * a_rel_stderr, b * b_rel_stderr)


class _Run(Protocol):
    steps_per_s: float
    noise: float
    step_times: Sequence[float]


def pool(runs: Sequence[_Run], round_size: int = 1) -> tuple[float, float]:
    """(steps/s, relative standard error of the mean step time) of several runs of one setting, pooled.

    With every run's step times at hand, all steps are pooled and the noise taken over whole rounds of
    ``round_size`` steps (:func:`rel_stderr`); otherwise the runs' mean step times are averaged, weighted by
    their steps, and their standard errors combined.
    """
    times = [t for run in runs for t in (run.step_times or ())]
    if times and all(run.step_times for run in runs):
        return len(times) / sum(times), rel_stderr(times, round_size)
    weights = [max(1, len(run.step_times or ())) for run in runs]
    total = sum(weights)
    step = sum(w / run.steps_per_s for w, run in zip(weights, runs)) / total
    error = math.sqrt(sum((w * run.noise / run.steps_per_s) ** 2 for w, run in zip(weights, runs))) / total
    return 1.0 / step, error / step
