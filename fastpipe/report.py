"""The diagnosis report: a dataclass with console, JSON, Markdown and PNG renderings.

JSON schema (``Report.to_dict()``; ``schema`` is bumped on breaking changes)::

    {
      "schema": "fastpipe.report/1",
      "workload": str, "device": str, "num_workers": int, "batch_size": int | null,
      "steps": int, "warmup": int, "pool": int, "threshold": float, "strategy": "linear" | "bisect",
      "device_bound_steps_per_s": float | null,
      "gap_fraction": float | null,            # 1 - baseline / device bound
      "verdict": "not input-bound" | "moderately input-bound" | "highly input-bound" | "incomplete",
      "experiments": [{
          "name": str, "cache_point": "device" | "host" | "sample" | "after:<Stage>" | "raw" | "baseline",
          "steps_per_s": float, "fraction_of_bound": float,
          "spread": float,                     # relative std of step times
          "noise": float,                      # relative standard error of steps_per_s
          "cpu_util": float,                   # process tree CPU / available cores, 0..1
          "system_cpu_util": float, "pool_spread": float | null, "step_times": [float]
      }],
      "unavailable": [{"cache_point": str, "reason": str}],
      "bottlenecks": [{"stage": str, "kind": "raw load" | "transform" | "collate/IPC" | "host-to-device copy",
                       "drop_fraction": float,  # steps/s lost, as a fraction of the device bound
                       "between": [str, str], "cpu_saturated": bool, "recommendation": str}],
      "caveats": [str], "notes": [str], "interrupted": bool, "elapsed_s": float,
      "stage_costs": null | {...}              # fastpipe.stagecost.StageCosts.to_dict(), measured when
                                               # a bottleneck appeared at a saturated CPU
    }
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from fastpipe._render import pyplot, render_table

SCHEMA = "fastpipe.report/1"


@dataclass
class ExperimentResult:
    name: str
    cache_point: str
    steps_per_s: float
    fraction_of_bound: float
    spread: float
    noise: float
    cpu_util: float
    system_cpu_util: float
    pool_spread: float | None = None
    step_times: list[float] = field(default_factory=list)


@dataclass
class Bottleneck:
    stage: str
    kind: str
    drop_fraction: float
    between: tuple[str, str]
    cpu_saturated: bool
    recommendation: str


@dataclass
class Unavailable:
    cache_point: str
    reason: str


@dataclass
class Report:
    workload: str
    device: str
    num_workers: int
    batch_size: int | None
    steps: int
    warmup: int
    pool: int
    threshold: float
    strategy: str
    device_bound_steps_per_s: float | None = None
    gap_fraction: float | None = None
    verdict: str = "incomplete"
    experiments: list[ExperimentResult] = field(default_factory=list)
    unavailable: list[Unavailable] = field(default_factory=list)
    bottlenecks: list[Bottleneck] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False
    elapsed_s: float = 0.0
    stage_costs: dict[str, Any] | None = None
    stage_cost_lines: list[str] = field(default_factory=list, repr=False)
    """The stage-cost table, rendered when the costs were measured (not part of the JSON)."""

    def experiment(self, cache_point: str) -> ExperimentResult | None:
        return next((e for e in self.experiments if e.cache_point == cache_point), None)

    # ----- JSON -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("stage_cost_lines")
        data = {"schema": SCHEMA, **data}
        for bottleneck in data["bottlenecks"]:
            bottleneck["between"] = list(bottleneck["between"])
        return data

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    # ----- text -------------------------------------------------------------------------
    def _rows(self) -> list[tuple[str, str, str, str, str]]:
        rows = []
        for e in self.experiments:
            rows.append((e.name, f"{e.steps_per_s:.3f}", f"{e.fraction_of_bound:.1%}", f"±{e.spread:.0%}", f"{e.cpu_util:.0%}"))
        return rows

    def _summary_lines(self) -> list[str]:
        lines = [f"Verdict: {self.verdict}" + (f" (gap to the device bound: {self.gap_fraction:.0%})" if self.gap_fraction is not None else "")]
        if self.interrupted:
            lines.append("Interrupted: this report is partial.")
        if self.bottlenecks:
            lines.append("Bottlenecks, largest first:")
            for b in self.bottlenecks:
                lines.append(f"  - {b.stage} ({b.kind}): costs {b.drop_fraction:.0%} of the device bound. {b.recommendation}")
        elif self.experiments:
            lines.append("No stage costs more than the threshold and the noise.")
        for u in self.unavailable:
            lines.append(f"Unavailable: {u.cache_point}: {u.reason}")
        for caveat in self.caveats:
            lines.append(f"Caveat: {caveat}")
        for note in self.notes:
            lines.append(f"Note: {note}")
        return lines

    STAGE_COSTS_TITLE = "Stage costs inside the workers (measured to settle the saturation caveat):"

    def title(self) -> str:
        return f"fastpipe diagnosis: {self.workload} on {self.device} ({self.num_workers} workers, batch {self.batch_size}, {self.steps} steps after {self.warmup} warm-up)"

    def to_markdown(self) -> str:
        out = [f"### {self.title()}", "", "| cache point | steps/s | of device bound | step spread | CPU |", "|---|---:|---:|---:|---:|"]
        out += [f"| {' | '.join(row)} |" for row in self._rows()]
        out += [""] + [f"{line}  " if not line.startswith("  -") else f"- {line[4:]}" for line in self._summary_lines()]
        if self.stage_cost_lines:
            out += ["", self.STAGE_COSTS_TITLE, "", "```", *self.stage_cost_lines, "```"]
        return "\n".join(out) + "\n"

    def to_table(self) -> str:
        """The console rendering (rich), as plain text."""
        columns = [("cache point", "left"), ("steps/s", "right"), ("of bound", "right"), ("spread", "right"), ("CPU", "right")]
        lines = self._summary_lines()
        if self.stage_cost_lines:
            lines += ["", self.STAGE_COSTS_TITLE, *self.stage_cost_lines]
        return render_table(self.title(), columns, self._rows(), lines)

    def __str__(self) -> str:
        return self.to_table()

    # ----- picture ----------------------------------------------------------------------
    def plot(self, path: str) -> str:
        """A horizontal bar chart of steps/s per cache point, bottleneck drops in red; returns ``path``."""
        plt = pyplot()
        names = [e.name for e in self.experiments][::-1]
        values = [e.steps_per_s for e in self.experiments][::-1]
        culprits = {b.between[1] for b in self.bottlenecks}
        colors = ["#c0392b" if e.cache_point in culprits else "#2c7fb8" for e in self.experiments][::-1]
        fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 1.5))
        ax.barh(names, values, color=colors)
        if self.device_bound_steps_per_s:
            ax.axvline(self.device_bound_steps_per_s, color="black", linestyle="--", linewidth=1, label="device bound")
            ax.legend(loc="lower right")
        for y, value in enumerate(values):
            ax.text(value, y, f" {value:.2f}", va="center", fontsize=8)
        ax.set_xlabel("steps/s (red: a bottleneck stage was added at this point)")
        ax.set_title(f"{self.workload} on {self.device}: {self.verdict}", fontsize=10)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path
