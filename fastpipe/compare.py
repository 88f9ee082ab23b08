"""Before and after: a ladder of pipeline variants, each measured against the device bound in one run.

For every variant the comparison gives steps/s, the fraction of the device bound, and how
much of the gap left by the previous rung it closed. A rung whose gain is within noise is
flagged: an "optimization" that buys nothing should say so.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from fastpipe.devices import Device, parse_device
from fastpipe.diagnose import measure_points
from fastpipe._render import pyplot, render_table
from fastpipe.errors import ConfigError
from fastpipe.workload import load_workload

SCHEMA = "fastpipe.compare/1"

#: The toy ladder, cumulative: each rung adds one optimization to the one before. The prefetcher
#: comes last: it hides the host-to-device copy, which only matters once the CPU keeps up; added
#: while the workers are still the bottleneck, it buys nothing measurable (README, "compare").
TOY_LADDER: list[tuple[str, str]] = [
    ("naive", "toy:naive"),
    ("+ fast transforms", "toy:fast-transforms"),
    ("+ uint8 on the host, colour on the device", "toy:uint8-host"),
    ("+ crop-first raw loading", "toy:crop-first"),
    ("+ prefetcher (= toy:optimized)", "toy:optimized"),
]


@dataclass
class VariantResult:
    name: str
    spec: str
    steps_per_s: float
    fraction_of_bound: float
    gap_closed: float | None
    """Share of the previous rung's remaining gap to the bound that this rung closed (None for the first)."""
    improved: bool | None
    """Whether the gain exceeds two standard errors and run-to-run drift (None for the first)."""
    noise: float
    spread: float
    cpu_util: float


@dataclass
class Comparison:
    device: str
    device_bound_steps_per_s: float
    steps: int
    warmup: int
    variants: list[VariantResult] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def _rows(self) -> list[tuple[str, ...]]:
        rows = [("device bound", f"{self.device_bound_steps_per_s:.3f}", "100.0%", "", "")]
        for v in self.variants:
            closed = "" if v.gap_closed is None else f"{v.gap_closed:.0%}"
            verdict = "" if v.improved is None else ("closed part of the gap" if v.improved else "NO GAIN beyond noise or drift")
            rows.append((v.name, f"{v.steps_per_s:.3f}", f"{v.fraction_of_bound:.1%}", closed, verdict))
        return rows

    HEADERS = ("variant", "steps/s", "of device bound", "gap closed", "verdict")

    def to_markdown(self) -> str:
        out = [f"### fastpipe compare on {self.device} ({self.steps} steps after {self.warmup} warm-up)", "",
               "| " + " | ".join(self.HEADERS) + " |", "|---|---:|---:|---:|---|"]
        out += ["| " + " | ".join(row) + " |" for row in self._rows()]
        out += [""] + [f"Flag: {flag}  " for flag in self.flags]
        return "\n".join(out) + "\n"

    def to_table(self) -> str:
        columns = [(header, "left" if header in ("variant", "verdict") else "right") for header in self.HEADERS]
        lines = [f"Flag: {flag}" for flag in self.flags]
        if not self.flags and len(self.variants) > 1:
            lines.append("Every rung closed part of the gap beyond noise.")
        return render_table(f"fastpipe compare on {self.device} ({self.steps} steps after {self.warmup} warm-up)", columns, self._rows(), lines)

    def __str__(self) -> str:
        return self.to_table()

    def plot(self, path: str) -> str:
        plt = pyplot()
        names = [v.name for v in self.variants]
        fractions = [100 * v.fraction_of_bound for v in self.variants]
        colors = ["#c0392b" if v.improved is False else "#2c7fb8" for v in self.variants]
        fig, ax = plt.subplots(figsize=(8, 0.5 * len(names) + 1.5))
        ax.barh(names[::-1], fractions[::-1], color=colors[::-1])
        ax.axvline(100, color="black", linestyle="--", linewidth=1, label=f"device bound ({self.device_bound_steps_per_s:.2f} steps/s)")
        for y, value in enumerate(fractions[::-1]):
            ax.text(value, y, f" {value:.0f}%", va="center", fontsize=8)
        ax.set_xlabel("% of the device bound (red: no gain beyond noise or drift)")
        ax.set_xlim(0, max(110, max(fractions, default=0) + 10))
        ax.set_title(f"fastpipe compare on {self.device}", fontsize=10, pad=24)
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


def resolve_variants(specs: list[str]) -> list[tuple[str, str]]:
    """``["toy"]`` means the toy ladder; anything else is a list of SPECs, each its own rung."""
    if specs == ["toy"]:
        return list(TOY_LADDER)
    if len(specs) < 1:
        raise ConfigError("compare needs SPECs to compare, e.g. `fastpipe compare toy` or `fastpipe compare mod:before mod:after`")
    return [(spec, spec) for spec in specs]


def compare(
    specs: list[str],
    device: "str | Device | None" = None,
    *,
    steps: int = 10,
    warmup: int = 3,
    progress: bool = False,
    toy_options: dict[str, Any] | None = None,
    drift: float = 0.05,
) -> Comparison:
    """Measure each variant's baseline, and the first variant's device bound, in one run.

    A rung counts as closing part of the gap when its gain over the previous rung exceeds two
    standard errors and also ``drift`` times the smaller of the previous rung's throughput and
    its gap to the bound: the standard error only sees the noise within a run, not the drift
    between runs on a shared machine, which grows with the rate measured and shrinks near the
    bound, where the device sets the pace.
    """
    device = parse_device(device)
    variants = resolve_variants(specs)
    results = []
    bound = math.nan
    for i, (name, spec) in enumerate(variants):
        options = dict(toy_options or {}) if spec.startswith("toy") else {}
        workload = load_workload(spec, device, **options)
        points = ["device", "baseline"] if i == 0 else ["baseline"]
        try:
            measured = measure_points(workload, device, points, steps=steps, warmup=warmup, progress=progress)
        finally:
            close = getattr(workload.loader, "close", None)  # e.g. a Ray cluster fastpipe started for this variant
            if close is not None:
                close()
        if i == 0:
            bound = measured["device"].steps_per_s
        results.append((name, spec, measured["baseline"]))
        del workload
    comparison = Comparison(device=device.spec, device_bound_steps_per_s=bound, steps=steps, warmup=warmup)
    previous = None
    for name, spec, result in results:
        fraction = result.steps_per_s / bound
        gap_closed = improved = None
        if previous is not None:
            previous_fraction = previous.steps_per_s / bound
            gap = 1 - previous_fraction
            gap_closed = (fraction - previous_fraction) / gap if gap > 0 else 0.0
            noise = 2 * math.hypot(result.steps_per_s * result.noise, previous.steps_per_s * previous.noise)
            gain = result.steps_per_s - previous.steps_per_s
            floor = drift * min(previous.steps_per_s, max(0.0, bound - previous.steps_per_s))
            improved = gain > max(noise, floor)
            if gain <= noise:
                comparison.flags.append(
                    f"'{name}' did not close the gap beyond noise: {gain:+.3f} steps/s against noise of ±{noise:.3f}"
                    + (" (the previous rung was already at the bound)" if gap <= 0.03 else "")
                )
            elif not improved:
                comparison.flags.append(f"'{name}' gained {gain:+.3f} steps/s, within run-to-run drift (±{floor:.3f})")
        comparison.variants.append(VariantResult(
            name=name, spec=spec, steps_per_s=result.steps_per_s, fraction_of_bound=fraction, gap_closed=gap_closed,
            improved=improved, noise=result.noise, spread=result.spread, cpu_util=result.cpu_util,
        ))
        previous = result
    return comparison
