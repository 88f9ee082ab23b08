"""How long script mode's ladder takes: the estimate its announcement prints, and its progress lines.

Script mode (:mod:`fastpipe.diagnosis._script`) measures each cache point as the factory does: until the point's
mean step time reaches its precision target (``--precision``, 3%) or its time budget is spent (``--budget``, 20 s
a point), never under its warm-up and fewest steps. How long that takes follows from the script's own step time,
which the real loop has just shown before the ladder takes over (``before``: its first batch's wait, the worker
start-up every cache point's loader pays again, and the steps after it; a script's first steps are often its slowest,
so the median of its whole steps after the first, when quicker, sets the pace):

* each point: its loader's start-up, the warm-up steps, then at least its fewest steps and at most its budget
  (rounded up to a whole round of workers, as the stopping rule checks at round ends). At the fewest, a point steps
  no faster than the script's own work a step (the loop's time less its waits for batches: the device point's pace);
  at the most, no slower than the loop's whole step (the baseline's pace);
* after the points: the in-worker timing (one more loader start and ``warmup + steps`` steps, when a stage is
  there to split) and the memory pass (at most the budget, at least :data:`~fastpipe.diagnosis.memory._section.MIN_PASS_S`);
* a pair of points that is borderline or inverted is measured again, each at half its budget: that is the one part
  the estimate cannot know in advance, so it is stated per pair.

So the announcement says how long at most (every point using its whole budget), how long with every point precise
after its fewest steps, and how long when the baseline runs at the device bound (the ladder then measures only those
two points); and :class:`LadderProgress` prints a line on stderr as each point starts,
with the point, a bar of the points done, the time so far and the time left (re-estimated from the points done).
The script's stdout stays the script's.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

from fastpipe.diagnosis.memory._section import MIN_PASS_S

PROBE_S = 0.5
"""The in-worker timing's own probe of what timing costs (:func:`~fastpipe.diagnosis.stagecost.timing_cost_us`): 0.06 to
0.3 s for 0 to 5 stages, measured on 2 loaded cores."""
BAR_WIDTH = 20


@dataclass(frozen=True)
class LadderEstimate:
    """The ladder's time, from the script's step time and start-up before it (all in seconds)."""

    points: int
    step_s: float
    """The script's real loop: seconds a step, its first batch's wait left out (the slowest points' pace)."""
    own_s: float
    """The script's real loop: seconds a step of its own work, its waits for batches left out (the device point's pace)."""
    startup_s: float
    """The script's real loop: its first batch's wait (worker start-up), which each point's new loader pays again."""
    budget_s: float
    warmup: int
    steps: int
    """The fewest measured steps a point, in whole rounds of workers."""
    round_size: int
    in_worker: bool
    """Whether the in-worker timing can follow (it needs workers and is not turned off)."""
    memory_pass: bool

    @classmethod
    def from_loop(
        cls,
        loader: Any,
        before: Any,
        *,
        budget_s: float,
        warmup: int,
        steps: int,
        stage_costs: bool,
        memory_pass: bool,
        recent_own_s: tuple[float, ...] = (),
    ) -> "LadderEstimate":
        """The estimate for ``loader``'s ladder, from ``before`` (the real loop's
        :class:`~fastpipe.monitor._ledger.Window` up to the handover) and ``recent_own_s``, the loop's own work on its
        last whole steps, its first left out (:attr:`~fastpipe.monitor._ledger.WaitLedger.recent_own_s`). A script's first
        step is often its slowest (lazy set-up, the first backward pass, autotuning), so the median of the steps after
        it sets the pace when it is quicker than the mean; the loop's waits after its first batch are added back for the
        slowest points' pace."""
        from fastpipe.diagnosis.ladder._points import loader_plan

        _, plan = loader_plan(loader)
        workers = int(getattr(loader, "num_workers", 0) or 0)
        size = max(1, workers)
        taken = int(getattr(before, "steps", 0) or 0)
        first = float(getattr(before, "first_wait_s", 0.0) or 0.0)
        elapsed = float(getattr(before, "elapsed_s", 0.0) or 0.0)
        waits = float(getattr(before, "wait_s", 0.0) or 0.0)
        step_s = max(0.0, elapsed - first) / taken if taken else 0.0
        own_s = min(step_s, max(0.0, elapsed - waits) / taken) if taken else 0.0
        pace = statistics.median(recent_own_s) if recent_own_s else None
        if pace is not None and 0.0 < pace < own_s:
            steady_wait = max(0.0, waits - first) / (taken - 1) if taken > 1 else 0.0
            own_s, step_s = pace, min(step_s, pace + steady_wait)
        return cls(
            points=len(plan.points),
            step_s=step_s,
            own_s=own_s,
            startup_s=first,
            budget_s=budget_s,
            warmup=warmup,
            steps=size * math.ceil(steps / size),
            round_size=size,
            in_worker=stage_costs and workers > 0,
            memory_pass=memory_pass,
        )

    # ----- one point -----------------------------------------------------------------------
    def point_fewest_s(self) -> float:
        """A point that reaches its precision target at its fewest steps."""
        return self.startup_s + (self.warmup + self.steps) * self.own_s

    def point_at_most_s(self, budget_s: float | None = None) -> float:
        """A point that uses its whole budget (then ends its round of workers)."""
        budget = self.budget_s if budget_s is None else budget_s
        return self.startup_s + self.warmup * self.step_s + max(budget, self.steps * self.step_s) + self.round_size * self.step_s

    def pair_at_most_s(self) -> float:
        """Remeasuring one borderline pair: both points again, each at half its budget (at least 1 s)."""
        return 2 * self.point_at_most_s(max(self.budget_s / 2, 1.0))

    # ----- after the points -----------------------------------------------------------------
    def tail_s(self) -> float:
        """The in-worker timing and the memory pass, at most."""
        tail = 0.0
        if self.in_worker:
            tail += self.startup_s + (self.warmup + self.steps) * self.step_s + PROBE_S
        if self.memory_pass:
            tail += self.startup_s + max(self.budget_s, MIN_PASS_S)
        return tail

    # ----- the whole ladder -------------------------------------------------------------------
    def shortest_s(self) -> float:
        """The baseline runs at the device bound: those two points alone are measured, each at its fewest steps."""
        return min(2, self.points) * self.point_fewest_s() + self.tail_s()

    def fewest_s(self) -> float:
        """Every point measured, each precise after its fewest steps."""
        return self.points * self.point_fewest_s() + self.tail_s()

    def at_most_s(self) -> float:
        """Every point measured, each using its whole budget (a remeasured pair adds :meth:`pair_at_most_s`)."""
        return self.points * self.point_at_most_s() + self.tail_s()

    def text(self, precision: float) -> str:
        """The announcement's sentence."""
        after = [what for what, on in (("the in-worker timing", self.in_worker), ("the memory pass", self.memory_pass)) if on]
        tail = f", then {' and '.join(after)}" if after else ""
        return (
            f"From the script's steps before it ({1000 * self.own_s:.1f} ms of its own work a step, {1000 * self.step_s:.1f} ms "
            f"with its waits for batches) and {self.startup_s:.1f} s to start its workers, the ladder takes at most about "
            f"{duration(self.at_most_s())}: its {self.points} points each until ±{precision:.0%} or its {self.budget_s:g} s "
            f"budget{tail}; about {duration(self.fewest_s())} if each point is precise after its {self.warmup} warm-up and "
            f"{self.steps} steps, about {duration(self.shortest_s())} if the baseline runs at the device bound (then only those "
            f"two are measured); a borderline pair measured again adds up to {duration(self.pair_at_most_s())}. The progress "
            "lines re-estimate from the points measured"
        )

    def summary(self) -> str:
        """The estimate again, for the report's note."""
        return (
            f"at most about {duration(self.at_most_s())}, about {duration(self.fewest_s())} with every point precise at its "
            f"fewest steps, about {duration(self.shortest_s())} with two points, plus up to {duration(self.pair_at_most_s())} "
            "for each pair measured again"
        )


def duration(seconds: float) -> str:
    """``45 s``, ``2 min 10 s``, ``1 h 05 min``: as a person reads an estimate."""
    s = max(0, round(seconds))
    if s < 90:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


class LadderProgress:
    """Progress lines on stderr (through ``echo``): the point being measured, a bar of the points done, the time so far
    and the time left. Lines, not a live bar: the script's own output goes to the same terminal between them."""

    def __init__(
        self, echo: Callable[[str], None], estimate: LadderEstimate, precision: float, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.echo, self.estimate, self.precision, self.clock = echo, estimate, precision, clock
        self.started = clock()
        self.first_done: list[float] = []
        """Seconds each point's first measurement took (the re-estimate's per-point time)."""
        self._current: tuple[str, float] | None = None

    def point(self, point: str, label: str, *, run: int, total: int, budget_s: float, measured: tuple[float, float] | None = None) -> None:
        """A line as ``point`` starts its ``run``-th measurement (1: the first; more: a borderline pair's remeasurement).

        ``measured``, the fastest and slowest step of the points so far, replaces the real loop's first steps (which
        hold the script's own warm-up) in what is left: each point takes at least its fewest steps and at most its
        budget, and the points so far took what they took (their mean, kept within those two)."""
        now = self.clock()
        self._end_current(now)
        self._current = (point, now) if run == 1 else None
        e = self.estimate
        if measured is not None:
            e = dataclasses.replace(e, own_s=measured[0], step_s=max(measured))
        done = len(self.first_done)
        so_far = now - self.started
        tail = e.tail_s()
        then = f", then at most about {duration(tail)} for the in-worker timing and the memory pass" if tail else ""
        if run > 1:
            line = f"measuring '{label}' a {ordinal(run)} time (a borderline pair, until ±{self.precision:.0%} or {budget_s:g} s); {duration(so_far)} in{then}"
        else:
            left = max(0, total - done)
            per = min(max(sum(self.first_done) / done, e.point_fewest_s()), e.point_at_most_s()) if done else e.point_fewest_s()
            line = (
                f"{bar(done, total)} point {done + 1} of {total}, '{label}' (until ±{self.precision:.0%} or {budget_s:g} s); "
                f"{duration(so_far)} in, about {duration(left * per + tail)} left (at most {duration(left * e.point_at_most_s() + tail)})"
            )
        self.echo(f"fastpipe diagnose: {line}")

    def points_done(self) -> None:
        """A line once every point is measured: what follows and how long it takes at most."""
        now = self.clock()
        self._end_current(now)
        tail = self.estimate.tail_s()
        after = "the in-worker timing (when a stage in the workers is there to split) and the memory pass"
        self.echo(
            f"fastpipe diagnose: {bar(1, 1)} the points took {duration(now - self.started)}"
            + (f"; then {after}: at most about {duration(tail)}" if tail else "")
        )

    def _end_current(self, now: float) -> None:
        if self._current is not None:
            self.first_done.append(now - self._current[1])
            self._current = None


def ordinal(n: int) -> str:
    """``2nd``, ``3rd``, ``4th``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def bar(done: int, total: int) -> str:
    """``[#####...............]``: the share of the points done."""
    filled = 0 if total <= 0 else round(BAR_WIDTH * min(done, total) / total)
    return "[" + "#" * filled + "." * (BAR_WIDTH - filled) + "]"
