"""The one noise estimator: the relative standard error of a mean step time, over whole rounds of workers.

With N workers, batches arrive in bursts (one step waits for a batch, the next N-1 find theirs
ready), so single step times swing widely while whole rounds stay steady. Every figure of
precision in fastpipe (diagnosis points, compare rungs, stage costs, the tuner) comes from here.
"""
from __future__ import annotations

import math
import statistics
from typing import Sequence

MIN_ROUNDS = 3


def rel_stderr(step_times: Sequence[float], round_size: int = 1) -> float:
    """Relative standard error of the mean of ``step_times``, from whole rounds of ``round_size`` steps.

    With fewer than three whole rounds it falls back to the single steps' spread over sqrt(n).
    """
    size = max(1, round_size)
    rounds = [sum(step_times[i:i + size]) for i in range(0, len(step_times) - size + 1, size)]
    if len(rounds) >= MIN_ROUNDS:
        return statistics.stdev(rounds) / statistics.fmean(rounds) / math.sqrt(len(rounds))
    if len(step_times) < 2:
        return 0.0
    return statistics.stdev(step_times) / statistics.fmean(step_times) / math.sqrt(len(step_times))
