"""What one cache point measured, and why a point could not be measured: the ladder's results, read by the verdict."""

from __future__ import annotations

from dataclasses import dataclass, field

TOO_NOISY = "too noisy to decide"


@dataclass
class ExperimentResult:
    """What one cache point measured: its step time, how precise it is, and the CPU meanwhile (one of
    :attr:`Report.experiments <fastpipe.Report.experiments>`)."""

    name: str
    """The point's label in the table (``device (bound)``, ``after Decode``...)."""
    cache_point: str
    """The point itself: ``device``, ``host``, ``sample``, ``after:<Stage>``, ``raw`` or ``baseline``."""
    steps_per_s: float
    """Steps per second measured at this point (``ms_per_step`` is its inverse, in ms)."""
    fraction_of_bound: float
    """``steps_per_s`` as a share of the device point's (1.0: the device never waits)."""
    spread: float
    """Relative standard deviation of the single step times (how much steps vary, not the mean's precision)."""
    noise: float
    """Relative standard error of the mean step time: the precision this point achieved."""
    cpu_util: float
    """The process tree's CPU use over the usable cores while the point ran, 0..1."""
    system_cpu_util: float
    """The whole machine's CPU use meanwhile, 0..1: other processes show as the excess over ``cpu_util``."""
    pool_spread: float | None = None
    """At the device and host points, when they cycle through several cached batches: the relative spread of the mean
    step time across those batches, how much the step depends on the data (None otherwise)."""
    step_times: list[float] = field(default_factory=list)
    """Each measured step's time, in seconds."""
    steps_measured: int = 0
    """How many steps were timed."""
    copy_ms_per_sample: float = 0.0
    """The cache's own copy of a sample, timed in the workers, in ms (0 when skipped); discounted from the stages."""
    round_size: int = 1
    """Steps per round of workers: batches from N workers arrive in bursts, so the noise is taken over whole rounds."""

    @property
    def ms_per_step(self) -> float:
        """The mean step time in milliseconds."""
        return 1000.0 / self.steps_per_s

    @property
    def stderr_ms(self) -> float:
        """The standard error of ``ms_per_step``, in milliseconds."""
        return self.ms_per_step * self.noise


@dataclass
class Unavailable:
    """A cache point the plan dropped, and why (one of :attr:`Report.unavailable <fastpipe.Report.unavailable>`)."""

    cache_point: str
    """The point that was not measured."""
    reason: str
    """Why: it could not be built for this pipeline, or it failed (the stages around it are then measured as one span)."""
