"""The arithmetic of "is my loop waiting for data": host time blocked in ``next()`` over the loop's wall time.

Why this measure: a training loop alternates between asking its loader for the next batch and running a step.
Time the host spends blocked in ``next()`` is time the step could not start; its share of the loop's wall time
is the input-bound share (TensorFlow's input-pipeline analyzer reports the same quantity as "percent of step
time waiting for input"). An epoch's clock starts when its iterator is made, so worker start-up and the first
batch count, as they do for the accelerator, and stops when the iterator is exhausted (or when the owner of the
loop says the epoch ended: a framework may exhaust its iterator one batch before its last step). An epoch
whose end is never seen is closed at its last batch plus one typical step.

Only host clocks are read (``time.perf_counter``): nothing here synchronizes a device. On CUDA the share is
exactly the accelerator's idle share when the step ends with a synchronization (``loss.item()``, a metric read),
which most loops do; a loop that never synchronizes lets kernels queued earlier run while the host waits, so the
share is then an upper bound on the accelerator's idle time.
"""

from __future__ import annotations

import math
import time
from array import array
from collections import deque
from dataclasses import dataclass
from typing import Callable

RECENT_OWN = 8
"""Whole steps :attr:`WaitLedger.recent_own_s` keeps."""
#: (lowest share, name), highest first: the bands every fastpipe report uses.
BANDS: tuple[tuple[float, str], ...] = ((0.20, "highly input-bound"), (0.05, "moderately input-bound"), (0.0, "not input-bound"))


def band_for(share: float) -> str:
    """The band of an input-bound share: under 5% not, 5-20% moderately, 20% and over highly input-bound."""
    for lowest, name in BANDS:
        if share >= lowest:
            return name
    return BANDS[-1][1]


@dataclass
class Window:
    """Steps, blocked time and wall time over some stretch of the loop (an epoch, the last N steps, everything)."""

    steps: int = 0
    wait_s: float = 0.0
    elapsed_s: float = 0.0
    first_wait_s: float = 0.0
    max_wait_s: float = 0.0

    @property
    def share(self) -> float:
        """Blocked time over wall time, 0 for an empty window."""
        return min(1.0, self.wait_s / self.elapsed_s) if self.elapsed_s > 0 else 0.0


def percentile(values: "array[float]", q: float) -> float:
    """The ``q``-quantile (0..1) of ``values`` by the nearest rank; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class WaitLedger:
    """Per-step waits of one loop, grouped in epochs; a few float additions per step, no allocation but one append.

    Args:
        clock: seconds, monotonic; injectable so tests can drive the arithmetic without sleeping.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.epochs: list[Window] = []
        self.total = Window()
        self._open: Window | None = None
        self._epoch_start = 0.0
        self._last_batch = 0.0
        self._owns: deque[float] = deque(maxlen=RECENT_OWN)
        self._since = Window()
        self._since_start = 0.0
        self._recent = array("d")
        self._paused_at: float | None = None

    @property
    def in_epoch(self) -> bool:
        return self._open is not None

    @property
    def recent_own_s(self) -> tuple[float, ...]:
        """The loop's own work on each of its last few whole steps in this epoch (:data:`RECENT_OWN`), the epoch's first
        step left out: from one batch to the next, less the wait for the next. Script mode's estimate reads them: a
        script's first step is often its slowest (lazy set-up, the first backward pass, autotuning)."""
        return tuple(self._owns)

    def start_epoch(self, now: float) -> None:
        """A new iterator: an epoch left open (a loop that broke out early) is closed at its last batch.

        An open epoch without a batch is dropped: a framework that makes an iterator and then a fresh one
        (Lightning does, to restore state) starts the epoch at the second.
        """
        self.close_unfinished()
        self._paused_at = None
        self._open, self._epoch_start, self._last_batch = Window(), now, now
        self._owns.clear()
        if not self._since.steps and not self._since.elapsed_s:
            self._since_start = now

    def batch(self, wait_s: float, now: float) -> None:
        """One batch handed to the loop at ``now`` after blocking ``wait_s`` seconds."""
        epoch = self._open
        if epoch is None:  # a batch outside any epoch (an iterator made before the ledger): start one now
            self.start_epoch(now - wait_s)
            epoch = self._open
            assert epoch is not None
        if not epoch.steps:
            epoch.first_wait_s = wait_s
        epoch.steps += 1
        epoch.wait_s += wait_s
        epoch.max_wait_s = max(epoch.max_wait_s, wait_s)
        self._since.steps += 1
        self._since.wait_s += wait_s
        self._recent.append(wait_s)
        if epoch.steps >= 3:  # the step between this batch and the one before, not the epoch's first
            self._owns.append(max(0.0, now - self._last_batch - wait_s))
        self._last_batch = now

    def close_unfinished(self) -> Window | None:
        """Close an epoch whose end was never seen (the loop broke out, or stopped at ``len(loader)`` without
        asking for more), at its last batch plus one typical step: the mean time its other steps took
        besides waiting. An epoch without a batch is dropped."""
        epoch = self._open
        if epoch is None or not epoch.steps:
            self._open = None
            return None
        busy = max(0.0, self._last_batch - self._epoch_start - epoch.wait_s)
        typical = busy / (epoch.steps - 1) if epoch.steps > 1 else 0.0
        return self.end_epoch(self._last_batch + typical)

    def pause(self, now: float) -> None:
        """Stop the epoch's clock (a validation run inside the epoch is not the training loop's time)."""
        if self._open is not None and self._paused_at is None:
            self._paused_at = now

    def resume(self, now: float) -> None:
        """Restart the clock stopped by :meth:`pause`; the paused span counts nowhere."""
        if self._paused_at is None:
            return
        span, self._paused_at = now - self._paused_at, None
        self._epoch_start += span
        self._since_start += span
        self._last_batch += span

    def end_epoch(self, now: float) -> Window | None:
        """Close the open epoch at ``now``; returns it (None when no epoch was open)."""
        epoch, self._open = self._open, None
        if epoch is None:
            return None
        if self._paused_at is not None:
            now, self._paused_at = self._paused_at, None
        epoch.elapsed_s = max(0.0, now - self._epoch_start)
        self.epochs.append(epoch)
        _add(self.total, epoch)
        return epoch

    def current(self, now: float) -> Window:
        """Everything so far, the open epoch counted up to ``now``."""
        out = Window()
        _add(out, self.total)
        if self._open is not None:
            live = Window(**vars(self._open))
            live.elapsed_s = max(0.0, now - self._epoch_start)
            _add(out, live)
        return out

    def take_since(self, now: float) -> tuple[Window, float, float]:
        """The steps since the last call (for "every N steps" lines), with their median and P90 wait in seconds."""
        window, self._since = self._since, Window()
        window.elapsed_s = max(0.0, now - self._since_start)
        p50, p90 = percentile(self._recent, 0.5), percentile(self._recent, 0.9)
        self._recent = array("d")
        self._since_start = now
        return window, p50, p90


def _add(into: Window, other: Window) -> None:
    if not into.steps:
        into.first_wait_s = other.first_wait_s
    into.steps += other.steps
    into.wait_s += other.wait_s
    into.elapsed_s += other.elapsed_s
    into.max_wait_s = max(into.max_wait_s, other.max_wait_s)
