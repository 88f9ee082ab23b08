"""The result of a stage-cost pass: :class:`StageCost` per stage and :class:`StageCosts` for the pipeline.

Part of :mod:`fastpipe.diagnosis.stagecost`. Kept apart from the measuring so that the numbers, their
derived cross-checks (coverage, overhead) and their renderings (dict/JSON, table, markdown,
plain-text summary) can be read, tested and embedded in other reports without running anything.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from fastpipe._render import render_table
from fastpipe.diagnosis.ladder._noise import difference_noise

SCHEMA = "fastpipe.stagecost/1"


# ----- results ------------------------------------------------------------------------------
@dataclass
class StageCost:
    """One stage's cost per sample, as the workers paid it."""

    name: str
    kind: str
    """``"raw load"``, ``"transform"``, ``"collate"`` or ``"overhead"`` (the worker's time that is no stage's own)."""
    ms_per_sample: float
    """Mean wall milliseconds per sample inside a worker (collate: the batch's collate time / its samples), less the
    time other threads of the worker held it up (:attr:`held_ms_per_sample`, charged to the overhead row)."""
    cpu_ms_per_sample: float
    """Mean CPU milliseconds per sample (differs from wall when a stage waits, e.g. on I/O or a busy CPU)."""
    share: float
    """Share of the workers' busy time (the sum of all stages' wall time), 0..1."""
    cpu_share: float
    """Share of the workers' CPU time spent in this stage, 0..1 (NaN when the stages used no CPU)."""
    samples_per_s_alone: float
    """What this stage alone would allow with this many workers: num_workers / seconds per sample."""
    runq_ms_per_sample: float = 0.0
    """Mean milliseconds per sample the worker was ready to run but waited for a core (0 where the OS does not say)."""
    held_ms_per_sample: float = 0.0
    """Milliseconds per sample the stage's thread was blocked while other threads of its worker ran or waited for a
    core (the GIL or a lock they held: the feeder thread pickling the previous batch). Not the stage's own: taken
    off its wall time and charged to the overhead row, whose figure here is the sum taken off the stages."""
    blocked_ms_per_sample: float = 0.0
    """The stage's own waits per sample: wall - CPU - run queue - held by other threads (I/O, a sleep, a lock or a
    remote call outside the process)."""
    blocked_noise_ms: float = 0.0
    """Two standard errors of :attr:`blocked_ms_per_sample` over the timed batches."""
    voluntary_switches: float = 0.0
    """The stage's thread's voluntary context switches per sample (it blocked: a sleep, I/O, a lock, the GIL)."""
    involuntary_switches: float = 0.0
    """Its involuntary context switches per sample (preempted: another thread or process took the core)."""


@dataclass
class StageCosts:
    """Stage costs of one pipeline, with the throughput of the timed pass and its cross-checks."""

    workload: str
    device: str
    num_workers: int
    batch_size: int | None
    cores: int
    steps: int
    warmup: int
    stages: list[StageCost]
    """In pipeline order: raw load, the transforms, collate."""
    samples: int
    """Samples whose timings were averaged (those delivered after warm-up)."""
    steps_per_s: float
    noise: float
    """Relative standard error of ``steps_per_s``, over whole rounds of workers (see :func:`round_noise`)."""
    cpu_util: float
    system_cpu_util: float
    os_worker_cpu_ms_per_sample: float | None = None
    """The workers' CPU time per sample as the OS counted it (None with num_workers=0)."""
    untimed_steps_per_s: float | None = None
    untimed_noise: float | None = None
    untimed_passes: list[float] = field(default_factory=list)
    """Steps/s of each untimed pass (before, after): far apart means the machine's load drifted."""
    untimed_os_worker_cpu_ms_per_sample: float | None = None
    timing_us_per_sample: float | None = None
    """CPU microseconds per sample the timing itself adds, from :func:`timing_cost_us`."""
    """The workers' CPU per sample in the untimed passes, as the OS counted it."""
    tolerance: float = 0.05
    notes: list[str] = field(default_factory=list)

    # ----- derived -----------------------------------------------------------------------
    @property
    def total_ms_per_sample(self) -> float:
        """The workers' busy time per sample: every stage's wall time, summed."""
        return sum(s.ms_per_sample for s in self.stages)

    @property
    def total_cpu_ms_per_sample(self) -> float:
        return sum(s.cpu_ms_per_sample for s in self.stages)

    @property
    def parallelism(self) -> int:
        """Processes doing the loading: the workers, or the main process when there are none."""
        return max(1, self.num_workers)

    @property
    def pipeline_samples_per_s(self) -> float:
        """What all stages together allow with this many workers."""
        total = self.total_ms_per_sample
        return math.inf if total <= 0 else self.parallelism * 1000.0 / total

    @property
    def measured_worker_ms_per_sample(self) -> float | None:
        """num_workers x wall time per delivered sample, from the measured throughput (an independent reference).

        It equals the workers' busy time per sample when they never idle, i.e. when the
        pipeline is input-bound; when it keeps up with the device, workers idle and this is larger.
        """
        if self.num_workers == 0 or not self.batch_size or not self.steps_per_s > 0:
            return None
        return self.num_workers * 1000.0 / (self.steps_per_s * self.batch_size)

    @property
    def coverage(self) -> float | None:
        """Sum of the stages / measured per-sample worker time: ~1 when input-bound, lower when workers idle."""
        measured = self.measured_worker_ms_per_sample
        return None if not measured else self.total_ms_per_sample / measured

    @property
    def cpu_coverage(self) -> float | None:
        """Sum of the stages' CPU / the workers' CPU as the OS counted it: ~1 when the stages explain the CPU."""
        os_cpu = self.os_worker_cpu_ms_per_sample
        return None if not os_cpu else self.total_cpu_ms_per_sample / os_cpu

    @property
    def overhead(self) -> float | None:
        """Relative throughput lost to timing: 1 - timed / untimed steps/s (None unless checked)."""
        if self.untimed_steps_per_s is None or not self.untimed_steps_per_s > 0:
            return None
        return 1.0 - self.steps_per_s / self.untimed_steps_per_s

    @property
    def cpu_overhead(self) -> float | None:
        """Relative worker CPU added by timing: timed / untimed OS-counted CPU per sample - 1 (None unless checked).

        Less sensitive than throughput to other load on a shared machine, which slows a pass
        without making its workers do more work.
        """
        timed, untimed = self.os_worker_cpu_ms_per_sample, self.untimed_os_worker_cpu_ms_per_sample
        return None if not timed or not untimed else timed / untimed - 1.0

    @property
    def overhead_noise(self) -> float | None:
        """The allowance for the overhead check, in steps/s: two standard errors of the difference, or ``tolerance``."""
        if self.untimed_steps_per_s is None:
            return None
        two_se = difference_noise(self.steps_per_s, self.noise, self.untimed_steps_per_s, self.untimed_noise or 0.0)
        return max(two_se, self.tolerance * self.untimed_steps_per_s)

    @property
    def overhead_within_noise(self) -> bool | None:
        """True when the timed pass ran as fast as the untimed one, within :attr:`overhead_noise`."""
        allowance = self.overhead_noise
        if allowance is None or self.untimed_steps_per_s is None:
            return None
        return self.untimed_steps_per_s - self.steps_per_s <= allowance

    def stage(self, name: str) -> StageCost:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"no stage {name!r}; the stages are {[s.name for s in self.stages]}")

    def ranked(self, by: str = "ms_per_sample") -> list[StageCost]:
        """Stages, costliest first (by ``ms_per_sample`` or ``cpu_ms_per_sample``)."""
        return sorted(self.stages, key=lambda s: getattr(s, by), reverse=True)

    # ----- renderings --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = {"schema": SCHEMA, **dataclasses.asdict(self)}
        data.update(
            total_ms_per_sample=self.total_ms_per_sample,
            total_cpu_ms_per_sample=self.total_cpu_ms_per_sample,
            pipeline_samples_per_s=_finite(self.pipeline_samples_per_s),
            measured_worker_ms_per_sample=self.measured_worker_ms_per_sample,
            coverage=self.coverage,
            cpu_coverage=self.cpu_coverage,
            overhead=self.overhead,
            overhead_within_noise=self.overhead_within_noise,
            cpu_overhead=self.cpu_overhead,
        )
        for stage in data["stages"]:
            stage["samples_per_s_alone"] = _finite(stage["samples_per_s_alone"])
            stage["cpu_share"] = None if math.isnan(stage["cpu_share"]) else stage["cpu_share"]
        return data

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    HEADERS = (
        "stage",
        "ms/sample",
        "of worker time",
        "CPU ms/sample",
        "run queue",
        "held by threads",
        "own waits",
        "of worker CPU",
        "samples/s alone",
    )

    def rows(self) -> list[tuple[str, ...]]:
        rows = [
            (
                s.name,
                f"{s.ms_per_sample:.2f}",
                f"{s.share:.1%}",
                f"{s.cpu_ms_per_sample:.2f}",
                f"{s.runq_ms_per_sample:.2f}",
                f"{s.held_ms_per_sample:.2f}",
                f"{s.blocked_ms_per_sample:.2f} ±{s.blocked_noise_ms:.2f}",
                "-" if math.isnan(s.cpu_share) else f"{s.cpu_share:.1%}",
                _rate(s.samples_per_s_alone),
            )
            for s in self.stages
        ]
        rows.append(
            (
                "all stages",
                f"{self.total_ms_per_sample:.2f}",
                "100.0%",
                f"{self.total_cpu_ms_per_sample:.2f}",
                f"{sum(s.runq_ms_per_sample for s in self.stages):.2f}",
                "",
                f"{sum(s.blocked_ms_per_sample for s in self.stages):.2f}",
                "100.0%",
                _rate(self.pipeline_samples_per_s),
            )
        )
        return rows

    def _who(self) -> str:
        return "1 process" if not self.num_workers else f"{self.num_workers} worker" + ("s" if self.num_workers > 1 else "")

    def title(self) -> str:
        who = self._who() if self.num_workers else "no workers: the training process loads"
        return f"fastpipe stage costs: {self.workload} on {self.device} ({who}, batch {self.batch_size}, {self.samples} samples timed)"

    def table_lines(self) -> list[str]:
        """The stage table as fixed-width plain text, for embedding in another report."""
        headers = (*self.HEADERS[:-1], f"samples/s alone ({self._who()})")
        rows = [headers, *self.rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(headers))]
        fmt = lambda row: "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))  # noqa: E731
        return [fmt(headers), "  ".join("-" * w for w in widths), *(fmt(row) for row in rows[1:])]

    def summary_lines(self) -> list[str]:
        """What the numbers mean: the largest stages, and the cross-checks."""
        lines = []
        top = self.ranked()[:2]
        if top and self.total_ms_per_sample > 0:
            lines.append("Largest: " + ", ".join(f"{s.name} ({s.ms_per_sample:.2f} ms/sample, {s.share:.0%})" for s in top))
        per_step = self.pipeline_samples_per_s / self.batch_size if self.batch_size else None
        lines.append(
            f"All stages take {self.total_ms_per_sample:.2f} ms per sample ({self.total_cpu_ms_per_sample:.2f} ms CPU): "
            f"{self._who()} can deliver {_rate(self.pipeline_samples_per_s)} samples/s"
            + (f" ({per_step:.2f} steps/s)" if per_step is not None and math.isfinite(per_step) else "")
        )
        measured = self.measured_worker_ms_per_sample
        if measured is not None and self.coverage is not None:
            lines.append(
                f"Check: the timed pass ran at {self.steps_per_s:.3f} steps/s, i.e. {measured:.2f} ms of worker time per sample; "
                f"the stages sum to {self.coverage:.0%} of it"
                + (
                    " (workers idled: the pipeline kept up with the device, or the main process limited it)"
                    if self.coverage < 0.8
                    else " (more than the wall time allows: the machine's load changed during the pass; rerun with more --steps)"
                    if self.coverage > 1.2
                    else ""
                )
            )
        if self.cpu_coverage is not None and self.os_worker_cpu_ms_per_sample:
            lines.append(
                f"Check: the OS counted {self.os_worker_cpu_ms_per_sample:.2f} ms of worker CPU per sample; the stages' CPU sums to {self.cpu_coverage:.0%} of it"
            )
        if self.overhead is not None:
            verdict = "within noise" if self.overhead_within_noise else "MORE than noise: treat these costs with care"
            lines.append(
                f"Timing overhead: {self.steps_per_s:.3f} steps/s timed vs {self.untimed_steps_per_s:.3f} untimed "
                f"({', '.join(f'{v:.3f} {when}' for v, when in zip(self.untimed_passes, ('before', 'after')))}): "
                f"{abs(self.overhead):.1%} {'slower' if self.overhead > 0 else 'faster'}, noise allowance "
                f"±{self.overhead_noise:.3f} steps/s: {verdict}"
            )
        if self.timing_us_per_sample is not None and self.total_ms_per_sample > 0:
            lines.append(
                f"Timing itself costs {self.timing_us_per_sample:.1f} µs of CPU per sample "
                f"({self.timing_us_per_sample / 10 / self.total_ms_per_sample:.2f}% of the stages' time), measured in-process"
            )
        if self.cpu_overhead is not None:
            lines.append(
                f"Timing overhead in worker CPU: {self.os_worker_cpu_ms_per_sample:.2f} ms per sample timed vs "
                f"{self.untimed_os_worker_cpu_ms_per_sample:.2f} untimed ({self.cpu_overhead:+.1%})"
            )
        overhead = next((s for s in self.stages if s.kind == "overhead"), None)
        if overhead is not None and overhead.ms_per_sample > 0:
            lines.append(
                f"worker overhead: {overhead.ms_per_sample:.2f} ms per sample that is no stage's own, charged to none: the "
                f"timing harness between stages ({overhead.ms_per_sample - overhead.held_ms_per_sample:.2f} ms, "
                f"{overhead.cpu_ms_per_sample:.2f} of it CPU) and the time other threads of the worker held a stage "
                f"({overhead.held_ms_per_sample:.2f} ms: the feeder thread pickling the previous batch with the GIL, "
                "a pin thread)"
            )
        lines += [f"Note: {note}" for note in self.notes]
        return lines

    def markdown_lines(self) -> list[str]:
        out = ["| " + " | ".join(self.HEADERS) + " |", "|---" + "|---:" * (len(self.HEADERS) - 1) + "|"]
        out += ["| " + " | ".join(row) + " |" for row in self.rows()]
        return out

    def to_markdown(self) -> str:
        return "\n".join([f"### {self.title()}", "", *self.markdown_lines(), "", *(f"{line}  " for line in self.summary_lines())]) + "\n"

    def to_table(self) -> str:
        """The console rendering (rich), as plain text."""
        columns = [
            (f"samples/s alone ({self.parallelism})" if i == len(self.HEADERS) - 1 else header, "left" if i == 0 else "right")
            for i, header in enumerate(self.HEADERS)
        ]
        return render_table(self.title(), columns, self.rows(), self.summary_lines())

    def __str__(self) -> str:
        return self.to_table()


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _rate(value: float) -> str:
    return "unbounded" if not math.isfinite(value) else f"{value:,.0f}"
