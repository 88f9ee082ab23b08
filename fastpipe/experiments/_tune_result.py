"""What ``tune`` found: each setting tried (:class:`Trial`), and the sweep with its recommendation (:class:`TuneResult`)
as a table and as JSON. Kept apart from the sweep so that the figures and their renderings can be read alone."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from fastpipe._render import render_table

SCHEMA = "fastpipe.tune/1"


@dataclass
class Trial:
    """One loader setting and what it did."""

    num_workers: int
    """The ``num_workers`` tried."""
    prefetch_factor: int
    """The ``prefetch_factor`` tried."""
    status: str
    """``"measured"``, ``"skipped"`` (not run, e.g. it would exhaust /dev/shm) or ``"failed"``."""
    steps_per_s: float | None = None
    """Steps per second measured (None: not measured)."""
    noise: float | None = None
    """Relative standard error of ``steps_per_s``, over whole rounds of workers."""
    fraction_of_bound: float | None = None
    """``steps_per_s`` as a share of the device bound."""
    cpu_util: float | None = None
    """The process tree's CPU use over the available cores, 0..1."""
    system_cpu_util: float | None = None
    """The whole machine's CPU use meanwhile: other users of a shared machine show here."""
    runs: int = 0
    """Measurement runs pooled into this result: a noisy first run is extended (see ``tune(extensions=...)``)."""
    rss_peak_bytes: int | None = None
    """Peak resident memory of the process tree during the run."""
    shm_peak_bytes: int | None = None
    """Peak rise of ``/dev/shm`` use during the run (other users of the machine show here too)."""
    shm_estimate_bytes: int = 0
    """The shared memory this setting is predicted to need (batch bytes x workers x prefetch, and one more)."""
    phase: str = "workers"
    """``"workers"`` or ``"prefetch"``: which sweep tried it."""
    message: str = ""
    """Why it was skipped or failed (a full ``/dev/shm``, the OOM killer...)."""

    @property
    def measured(self) -> bool:
        return self.status == "measured" and self.steps_per_s is not None

    @property
    def step_ms(self) -> float | None:
        """Time per step in ms: the unit settings are compared in."""
        return None if self.steps_per_s is None else 1000.0 / self.steps_per_s

    @property
    def cost(self) -> tuple[int, int]:
        """What a setting costs: workers first (cores, memory), then queued batches."""
        return self.num_workers, self.prefetch_factor


@dataclass
class TuneResult:
    """The sweep, the recommendation and why."""

    workload: str
    """The workload's name."""
    device: str
    """The device the settings ran on, as a spec."""
    batch_size: int | None
    """The loader's batch size."""
    cores: int
    """The usable CPU cores, which bound the worker counts tried."""
    current: tuple[int, int | None]
    """The loader's own (num_workers, prefetch_factor)."""
    bound_steps_per_s: float
    """Steps per second with every batch already on the device (NaN: interrupted before it was measured)."""
    bound_noise: float
    """The relative standard error of ``bound_steps_per_s``."""
    batch_bytes: int
    """One batch's size in bytes, for the shared-memory estimates."""
    shm_budget_bytes: int | None
    """The shared memory free (or the budget given); a setting predicted to need more is not run."""
    tolerance: float
    """Differences in time per step below this fraction of the device step count as noise."""
    trials: list[Trial] = field(default_factory=list)
    """Every setting, in the order tried."""
    recommended: Trial | None = None
    """The cheapest setting (fewest workers, then fewest queued batches) that reaches the device bound within noise;
    failing that, the cheapest within noise of the fastest (None: nothing was measured)."""
    reaches_bound: bool = False
    """Whether the recommended setting runs at the device bound."""
    summary: str = ""
    """The recommendation and why, in words."""
    stops: list[str] = field(default_factory=list)
    """Why each sweep stopped where it did."""
    warnings: list[str] = field(default_factory=list)
    """Settings skipped or failed for memory, and other warnings of the sweep."""
    interrupted: bool = False
    """Ctrl-C stopped the sweep: ``trials`` holds the settings measured before it."""

    @property
    def bound_step_ms(self) -> float:
        return 1000.0 / self.bound_steps_per_s

    def to_dict(self) -> dict[str, Any]:
        """The sweep as plain data (``fastpipe.tune/1``): every field, each trial's ``step_ms``, the recommendation's figures."""
        data = {"schema": SCHEMA, **dataclasses.asdict(self)}
        data["current"] = {"num_workers": self.current[0], "prefetch_factor": self.current[1]}
        data["recommended"] = (
            None
            if self.recommended is None
            else {
                "num_workers": self.recommended.num_workers,
                "prefetch_factor": self.recommended.prefetch_factor,
                "steps_per_s": self.recommended.steps_per_s,
                "step_ms": self.recommended.step_ms,
                "fraction_of_bound": self.recommended.fraction_of_bound,
            }
        )
        data["bound_step_ms"] = self.bound_step_ms
        for trial, row in zip(self.trials, data["trials"]):
            row["step_ms"] = trial.step_ms
        return data

    def to_json(self, indent: int | None = 2) -> str:
        """:meth:`to_dict` as JSON text (what ``fastpipe tune --json`` writes)."""
        return json.dumps(self.to_dict(), indent=indent)

    HEADERS = (
        "workers",
        "prefetch",
        "ms/step",
        "steps/s",
        "of bound",
        "noise",
        "runs",
        "CPU",
        "RSS (tree)",
        "/dev/shm peak",
        "shm estimate",
        "",
    )

    def rows(self) -> list[tuple[str, ...]]:
        bound_ms = "-" if not self.bound_steps_per_s > 0 else f"{self.bound_step_ms:.1f}"
        bound_rate = "-" if math.isnan(self.bound_steps_per_s) else f"{self.bound_steps_per_s:.3f}"
        rows = [("device bound", "", bound_ms, bound_rate, "100.0%", f"±{self.bound_noise:.1%}", "1", "", "", "", "", "")]
        for t in self.trials:
            mark = "<- recommended" if t is self.recommended else ("" if t.status == "measured" else t.status.upper())
            rows.append(
                (
                    str(t.num_workers),
                    str(t.prefetch_factor),
                    "-" if t.step_ms is None else f"{t.step_ms:.1f}",
                    "-" if t.steps_per_s is None else f"{t.steps_per_s:.3f}",
                    "-" if t.fraction_of_bound is None else f"{t.fraction_of_bound:.1%}",
                    "-" if t.noise is None else f"±{t.noise:.1%}",
                    str(t.runs),
                    "-" if t.cpu_util is None else f"{t.cpu_util:.0%}",
                    size_text(t.rss_peak_bytes),
                    size_text(t.shm_peak_bytes),
                    size_text(t.shm_estimate_bytes),
                    mark,
                )
            )
        return rows

    def title(self) -> str:
        workers, prefetch = self.current
        return (
            f"fastpipe tune: {self.workload} on {self.device} (batch {self.batch_size}, {size_text(self.batch_bytes)} a batch, "
            f"{self.cores} usable cores; the loader has {workers_text(workers)}, prefetch_factor {prefetch})"
        )

    def summary_lines(self) -> list[str]:
        lines = []
        if self.interrupted:
            lines.append(
                f"Interrupted (Ctrl-C) after {len(self.trials)} setting(s): the sweep is incomplete; "
                "the table holds what was measured before it."
            )
        lines += [self.summary] if self.summary else []
        lines += [f"Stopped: {stop}" for stop in self.stops]
        lines += [f"Warning: {warning}" for warning in self.warnings]
        return lines

    def to_table(self) -> str:
        """The console rendering: one row per setting tried, then the summary, stops and warnings."""
        columns = [(header, "left" if i in (0, len(self.HEADERS) - 1) else "right") for i, header in enumerate(self.HEADERS)]
        return render_table(self.title(), columns, self.rows(), self.summary_lines(), width=140)

    def __str__(self) -> str:
        """``print(result)`` prints :meth:`to_table`."""
        return self.to_table()


def workers_text(n: int) -> str:
    return f"{n} worker" + ("" if n == 1 else "s")


def size_text(nbytes: int | None) -> str:
    if nbytes is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"
