"""The knobs of a measurement, validated once, in one place, for the diagnosis, ``compare``, ``tune``, ``fix`` and the CLI.

One frozen object is built (by the user, or by the CLI's ``measure_options_from``/``diagnose_options_from``) and the
same object is passed down through every entry point to the runners (:class:`~fastpipe.diagnosis.ladder._points.PointRunner`,
``measure_points``, ``measure_rungs``), so a knob is named, defaulted and checked here and nowhere else. A bad value
raises :class:`~fastpipe.errors.ConfigError` naming the knob (and its flag) at construction, before anything runs.
Change one knob of an existing object with :func:`dataclasses.replace` (validated again).

:class:`TrainState` groups what a diagnosis trains and puts back (model, optimizer, schedulers, scaler): what
``diagnose(loader, step)`` needs to restore, where a :class:`~fastpipe.Workload` carries its own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence, TypeVar

from fastpipe.errors import ConfigError

STRATEGIES = ("linear", "bisect")


@dataclass(frozen=True)
class MeasureOptions:
    """How long and how precisely each point (or setting, or rung) is measured; what ``compare``, ``tune`` and ``fix``
    take, and the measured part of :class:`DiagnoseOptions`."""

    steps: int = 10
    """The fewest measured steps per point; rounded up to whole rounds of workers (``--steps``)."""
    warmup: int = 3
    """Untimed steps before each measurement (``--warmup``)."""
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


@dataclass(frozen=True)
class DiagnoseOptions(MeasureOptions):
    """Everything :func:`fastpipe.diagnose` decides by, beyond the workload and the device. The defaults are the
    command line's: ``fastpipe diagnose`` with no flags and ``fastpipe.diagnose(loader, step)`` do the same work."""

    pool: int | None = None
    """Samples (or batches) each cache point cycles through; None: 1, or more when the first samples differ in size (``--pool``)."""
    threshold: float = 0.05
    """The smallest added time that counts, as a fraction of the device step (``--threshold``)."""
    strategy: str = "linear"
    """``linear`` measures every point; ``bisect`` the endpoints, then halves (``--strategy``)."""
    progress: bool = True
    """Show a progress line on the terminal (``--no-progress`` turns it off)."""
    stage_costs: bool = True
    """Time each stage inside the workers when a worker-side stage is named (``--no-stage-costs`` turns it off)."""
    loader_memory: bool = True
    """After the ladder, read the user's loader in one more short pass (at most ``budget`` seconds) for each worker's
    memory growth, copy-on-read growth named, and the shared-memory peak against its prediction
    (:mod:`fastpipe.diagnosis.memory._section`; ``--no-memory`` turns it off). Each point's memory at its end is read
    either way."""
    startup: bool = True
    """After the ladder, start the loader twice more and split the wait for its first batch (worker start, the dataset's
    transfer, ``worker_init_fn``, first fetch), with each fix's projected saving (:mod:`fastpipe.diagnosis.unseen._startup`;
    ``--no-startup`` turns it off)."""
    name: str | None = None
    """The report's label for the workload (None: the Workload's own name, or ``workload`` for a DataLoader)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pool is not None and self.pool < 1:
            raise ConfigError(f"pool must be at least 1 (--pool); got {self.pool}")
        if not 0 <= self.threshold < 1:
            raise ConfigError(f"threshold is a fraction of the device step, e.g. 0.05 (--threshold); got {self.threshold}")
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"strategy must be one of {', '.join(STRATEGIES)} (--strategy); got {self.strategy!r}")


@dataclass(frozen=True)
class TrainState:
    """What a diagnosis trains on and puts back afterwards: parameters, buffers, gradients and train/eval mode of the
    model, the optimizer's state, each LR scheduler's and the GradScaler's (the diagnosis really trains).

    Given to ``diagnose(loader, step, train_state=TrainState(model=model, optimizer=optimizer))``; a
    :class:`~fastpipe.Workload` carries these as its own fields instead.
    """

    model: Any = None
    optimizer: Any = None
    schedulers: Sequence[Any] = ()
    """The LR schedulers (one, or a list)."""
    scaler: Any = None

    def __post_init__(self) -> None:
        schedulers = self.schedulers
        listed = tuple(schedulers) if isinstance(schedulers, (list, tuple)) else () if schedulers is None else (schedulers,)
        object.__setattr__(self, "schedulers", listed)


Options = TypeVar("Options", bound=MeasureOptions)


def as_options(kind: type[Options], options: MeasureOptions | None) -> Options:
    """``options`` as a ``kind``: None gives the defaults; a plain :class:`MeasureOptions` handed to the diagnosis gets
    the diagnosis's defaults for the rest; anything else is a :class:`ConfigError` saying what to pass."""
    if options is None:
        return kind()
    if isinstance(options, kind):
        return options
    if isinstance(options, MeasureOptions):
        return kind(**{f.name: getattr(options, f.name) for f in dataclasses.fields(MeasureOptions)})
    raise ConfigError(f"options must be a fastpipe.{kind.__name__} (or None for the defaults), not {type(options).__name__}")
