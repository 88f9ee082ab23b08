"""What one cache point measured, and why a point could not be measured: the ladder's results, read by the verdict."""

from __future__ import annotations

from dataclasses import dataclass, field

TOO_NOISY = "too noisy to decide"


@dataclass
class ExperimentResult:
    name: str
    cache_point: str
    steps_per_s: float
    fraction_of_bound: float
    spread: float
    noise: float
    """Relative standard error of the mean step time: the precision this point achieved."""
    cpu_util: float
    system_cpu_util: float
    pool_spread: float | None = None
    step_times: list[float] = field(default_factory=list)
    steps_measured: int = 0
    copy_ms_per_sample: float = 0.0
    round_size: int = 1

    @property
    def ms_per_step(self) -> float:
        return 1000.0 / self.steps_per_s

    @property
    def stderr_ms(self) -> float:
        return self.ms_per_step * self.noise


@dataclass
class Unavailable:
    cache_point: str
    reason: str
