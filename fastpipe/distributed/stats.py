"""Ray Data's own per-operator statistics (``Dataset.stats()``), kept per epoch and put into fastpipe's report.

When the data stages run in Ray tasks, fastpipe's CPU monitor sees only the driver's process
tree: on a multi-node cluster most of the work is elsewhere. Ray measures every task, so each
epoch's ``Dataset.stats()`` text is kept on the loader and parsed into per-operator task, wall
and CPU times. The text format is Ray's and not a stable API: parsing is best-effort, and the raw
text is always kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_OPERATOR = re.compile(
    r"^Operator \d+ (?P<name>.+?): (?P<tasks>\d+) tasks executed, (?P<blocks>\d+) blocks produced in (?P<wall>[\d.]+)(?P<unit>us|ms|s)\b"
)
_TOTAL = re.compile(r"^\* Remote (?P<kind>wall|cpu) time: .*?(?P<value>[\d.]+)(?P<unit>us|ms|s) total")
_NODES = re.compile(r"^\* Tasks per node: .*?; (?P<nodes>\d+) nodes? used")
_SCALE = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


@dataclass
class OperatorStats:
    """One Ray Data operator over one epoch (or the part of it that ran)."""

    name: str
    tasks: int
    blocks: int
    wall_s: float
    """Wall time from the operator's first task to its last."""
    task_wall_s: float | None = None
    """Wall time summed over its tasks."""
    task_cpu_s: float | None = None
    """CPU time summed over its tasks: the CPU the data servers spent."""
    nodes: int | None = None


@dataclass
class RayStats:
    """``Dataset.stats()`` of one epoch, raw and parsed.

    Attributes:
        label: which loader ran it: ``"loader"``, or the cache point (``"baseline"``, ``"sample"``) during a diagnosis.
        batches: batches the trainer took from this epoch (an epoch may be cut short).
    """

    label: str
    text: str
    batches: int
    operators: list[OperatorStats] = field(default_factory=list)

    def summary(self) -> str:
        """One line per task-running operator, for a report's notes."""
        parts = []
        for op in self.operators:
            if op.task_cpu_s is None or op.name.startswith(("Input", "FromItems")):
                continue
            nodes = f" on {op.nodes} node(s)" if op.nodes is not None else ""
            wall = f" in {op.task_wall_s:.2f} s of task time" if op.task_wall_s is not None else ""
            parts.append(f"{op.name}: {op.tasks} tasks{nodes}, {op.task_cpu_s:.2f} s of CPU{wall}")
        body = "; ".join(parts) if parts else "no operator statistics could be read (see loader.last_stats.text)"
        return f"Ray Data ({self.label}, {self.batches} batches): {body}"


def _seconds(value: str, unit: str) -> float:
    return float(value) * _SCALE[unit]


def parse_stats(text: str) -> list[OperatorStats]:
    """Per-operator figures from ``Dataset.stats()`` text; operators whose header does not parse are skipped."""
    operators: list[OperatorStats] = []
    current: OperatorStats | None = None
    for raw in text.splitlines():
        line = raw.strip()
        header = _OPERATOR.match(line)
        if header:
            current = OperatorStats(header["name"], int(header["tasks"]), int(header["blocks"]), _seconds(header["wall"], header["unit"]))
            operators.append(current)
            continue
        if current is None:
            continue
        total = _TOTAL.match(line)
        if total:
            seconds = _seconds(total["value"], total["unit"])
            if total["kind"] == "wall":
                current.task_wall_s = seconds
            else:
                current.task_cpu_s = seconds
            continue
        nodes = _NODES.match(line)
        if nodes:
            current.nodes = int(nodes["nodes"])
    return operators


def collect_stats(dataset: Any, label: str, batches: int) -> RayStats | None:
    """``dataset.stats()`` as :class:`RayStats`, or None if Ray cannot give it (e.g. the cluster is gone)."""
    try:
        text = dataset.stats()
    except Exception:  # stats are a report nicety; never let them mask the real outcome
        return None
    if not text:
        return None
    return RayStats(label=label, text=text, batches=batches, operators=parse_stats(text))


def ray_stats_notes(loader: Any) -> list[str]:
    """Report notes from a Ray loader's epochs: the latest epoch of each label (loader, baseline, sample...).

    Takes any loader; returns ``[]`` for one that is not Ray-backed, so a report can call it unconditionally.
    """
    history: list[RayStats] = list(getattr(loader, "stats_history", None) or [])
    latest: dict[str, RayStats] = {}
    for stats in history:
        latest[stats.label] = stats
    return [stats.summary() for stats in latest.values()]
