"""The knobs of a measurement, validated once, in one place, for the diagnosis, ``compare``, ``tune`` and the CLI.

A bad value raises :class:`~fastpipe.errors.ConfigError` naming the knob (and its flag), before anything runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from fastpipe.errors import ConfigError

STRATEGIES = ("linear", "bisect")


@dataclass(frozen=True)
class MeasureOptions:
    """How long and how precisely each point (or setting) is measured."""

    steps: int = 10
    """The fewest measured steps per point; rounded up to whole rounds of workers."""
    warmup: int = 3
    """Untimed steps before each measurement."""
    budget: float = 20.0
    """Seconds of measuring per point before it stops short of the precision target (``--budget``)."""
    precision: float = 0.03
    """Target relative standard error of each point's mean step time (``--precision``)."""
    worker_timeout: float = 300.0
    """Seconds a worker may take for a batch, used only when the loader sets no timeout of its own."""

    def __post_init__(self) -> None:
        if self.steps < 1 or self.warmup < 0:
            raise ConfigError(f"need steps >= 1 and warmup >= 0 (--steps, --warmup); got steps={self.steps}, warmup={self.warmup}")
        if not self.budget > 0:
            raise ConfigError(f"budget is seconds of measuring per point and must be > 0 (--budget); got {self.budget}")
        if not 0 < self.precision < 1:
            raise ConfigError(f"precision is a relative standard error such as 0.03, between 0 and 1 (--precision); got {self.precision}")
        if not self.worker_timeout > 0:
            raise ConfigError(f"worker_timeout must be > 0 seconds; got {self.worker_timeout}")

    def measure_kwargs(self) -> dict[str, Any]:
        """The keyword arguments :func:`~fastpipe.diagnosis.ladder._points.measure_points` takes."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(MeasureOptions)}


@dataclass(frozen=True)
class DiagnoseOptions(MeasureOptions):
    """Everything :func:`fastpipe.diagnose` decides by, beyond the workload and the device."""

    pool: int | None = None
    """Samples (or batches) each cache point cycles through; None: 1, or more when the first samples differ in size."""
    threshold: float = 0.05
    """The smallest added time that counts, as a fraction of the device step (``--threshold``)."""
    strategy: str = "linear"
    """``linear`` measures every point; ``bisect`` the endpoints, then halves (``--strategy``)."""
    progress: bool = True
    """Show a progress line on the terminal."""
    stage_costs: bool = True
    """Time each stage inside the workers when a worker-side stage is named (``--no-stage-costs`` turns it off)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pool is not None and self.pool < 1:
            raise ConfigError(f"pool must be at least 1 (--pool); got {self.pool}")
        if not 0 <= self.threshold < 1:
            raise ConfigError(f"threshold is a fraction of the device step, e.g. 0.05 (--threshold); got {self.threshold}")
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"strategy must be one of {', '.join(STRATEGIES)} (--strategy); got {self.strategy!r}")
