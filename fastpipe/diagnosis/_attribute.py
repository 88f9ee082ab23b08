"""Time attribution: what each stage adds to the step, from the step times of neighbouring points.

A point's step time is ``1 / steps/s``. Between an upper point (more cached) and the lower one
below it, the stage in between adds ``t_lower - t_upper`` to every step. Times add up: the device
step plus every stage's added time is the baseline step. A stage is *named* when its added time
beats both the noise (two standard errors of the difference) and a threshold in time (a fraction
of the device step).

Two corrections keep the figures about the pipeline, not the measurement:

* the cache's own per-sample copy (timed inside the workers, :mod:`fastpipe.diagnosis._cache`) is taken out
  of each point's step: ``batch x copy / workers`` when the workers set the pace, never below the
  device step;
* where the upper point already runs at the device bound, part of the stage can hide under the
  device step: its added time is a lower bound ("at least").
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from fastpipe.diagnosis._cachepoint import DEVICE, HOST, CachePoint
from fastpipe.diagnosis._noise import difference_noise
from fastpipe.diagnosis._plan import Plan, kind_of
from fastpipe.diagnosis._report import Bottleneck, ExperimentResult

VERDICT_BANDS = ((0.05, "not input-bound"), (0.20, "moderately input-bound"), (math.inf, "highly input-bound"))
SATURATED_CPU = 0.9
"""CPU utilisation (0..1 of usable cores) at which a point counts as saturated."""


def verdict_for(gap: float) -> str:
    return next(label for limit, label in VERDICT_BANDS if gap < limit)


def step_s(result: ExperimentResult) -> float:
    return 1.0 / result.steps_per_s


def stderr_s(result: ExperimentResult) -> float:
    return step_s(result) * result.noise


def difference_noise_s(a: ExperimentResult, b: ExperimentResult) -> float:
    """Two standard errors of the difference of two mean step times, in seconds (:func:`~fastpipe.diagnosis._noise.difference_noise`)."""
    return difference_noise(step_s(a), a.noise, step_s(b), b.noise)


@dataclass
class Attribution:
    """Inputs that turn measured points into per-stage times."""

    plan: Plan
    results: dict[str, ExperimentResult]
    threshold: float
    """Smallest added time that counts, as a fraction of the device step."""
    batch_size: int | None
    workers: int

    @property
    def device_s(self) -> float:
        return step_s(self.results[DEVICE])

    def measured(self) -> list[str]:
        return [p for p in self.plan.points if p in self.results]

    def corrected_s(self, point: str) -> float:
        """The point's step time with the cache's own per-sample copy taken out, floored at the device step."""
        result = self.results[point]
        copy_s = result.copy_ms_per_sample / 1000.0
        if not self.batch_size or copy_s <= 0:
            return step_s(result)
        return max(self.device_s, step_s(result) - self.batch_size * copy_s / max(1, self.workers))

    def added(self, upper: str, lower: str) -> tuple[float, float]:
        """(seconds added per step, two standard errors of it) between two measured points."""
        u, l = self.results[upper], self.results[lower]
        return self.corrected_s(lower) - self.corrected_s(upper), difference_noise_s(u, l)

    def significant(self, upper: str, lower: str) -> bool:
        added, noise = self.added(upper, lower)
        return added > max(noise, self.threshold * self.device_s)

    def borderline(self, upper: str, lower: str) -> bool:
        """Named, but by less than twice the threshold or the noise: worth remeasuring before blaming it."""
        added, noise = self.added(upper, lower)
        return self.significant(upper, lower) and added < 2 * max(noise, self.threshold * self.device_s)

    def inverted(self, upper: str, lower: str) -> bool:
        """The point that caches less ran faster beyond noise and threshold: impossible for the pipeline."""
        added, noise = self.added(upper, lower)
        return -added > max(noise, self.threshold * self.device_s)

    def at_bound(self, point: str) -> bool:
        """The point runs as fast as the loop can without workers (the host point, or the device's when it was
        not measured), within noise and threshold: its own pipeline work hides under the step."""
        if CachePoint(point).outside_workers:
            return True
        reference = self.results.get(HOST) or self.results[DEVICE]
        excess = self.corrected_s(point) - step_s(reference)
        return excess <= max(difference_noise_s(self.results[point], reference), self.threshold * self.device_s)

    def components(self, baseline_s: float | None) -> list[Bottleneck]:
        """One entry per pair of neighbouring measured points, in order from the device down."""
        out = []
        measured = self.measured()
        for upper, lower in zip(measured, measured[1:]):
            between = self.plan.between(upper, lower)
            added, noise = self.added(upper, lower)
            stage = " + ".join(reversed(between)) if len(between) > 1 else between[0]
            out.append(Bottleneck(
                stage=stage, kind=kind_of(between), added_ms=added * 1000, noise_ms=noise * 1000,
                share_of_baseline=added / baseline_s if baseline_s else math.nan, between=(upper, lower),
                cpu_saturated=self.results[lower].cpu_util >= SATURATED_CPU, at_least=self.at_bound(upper),
            ))
        return out
