"""Before and after: a ladder of pipeline variants, each measured against the device bound in one run.

For every variant the comparison gives its time per step (and steps/s, the fraction of the
device bound), the milliseconds per step it saved against the rung above, the throughput that
buys, and how much of the rung above's time over the device step it removed. A rung whose
saving is within noise is flagged: an "optimization" that buys nothing should say so.

Every variant is measured fairly: first a warm-up pass of each (file cache, worker start, JIT compilation),
discarded; then :data:`ROUNDS` rounds, each measuring every variant once, in an order that rotates from round
to round, so drift of a shared machine and the cost of going first fall on every variant alike. A variant's
rounds are pooled (:func:`fastpipe.diagnosis.ladder._noise.pool`): drift between rounds shows as noise. Other processes'
load is checked, and worded, as a diagnosis does (:func:`fastpipe.diagnosis.verdict._caveats.busy_machine_line`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from torch.utils.data import IterableDataset

from fastpipe._deprecated import moved_keywords
from fastpipe._render import COLORS, pyplot, render_table
from fastpipe.devices import Device, parse_device
from fastpipe.diagnosis._options import MeasureOptions, as_options
from fastpipe.diagnosis.ladder._cachepoint import BASELINE, DEVICE
from fastpipe.diagnosis.ladder._noise import difference_noise, pool
from fastpipe.diagnosis.ladder._points import measure_points
from fastpipe.diagnosis.ladder._results import ExperimentResult
from fastpipe.diagnosis.memory._shm_budget import size_text
from fastpipe.diagnosis.runtime._snapshot import UserState, preserve_user_state
from fastpipe.diagnosis.verdict._caveats import busy_machine_line
from fastpipe.errors import ConfigError
from fastpipe.workloads._workload import family_of, load_workload

SCHEMA = "fastpipe.compare/1"
ROUNDS = 3
"""Rounds of measurement per variant, interleaved across variants."""
WARMUP_BUDGET_S = 2.0
"""Seconds at most of each variant's discarded warm-up pass."""

#: The toy ladder, cumulative: each rung adds one optimization to the one before. The prefetcher
#: comes last: it hides the host-to-device copy, which only matters once the CPU keeps up; added
#: while the workers are still the bottleneck, it buys nothing measurable (README, "compare").
TOY_LADDER: list[tuple[str, str]] = [
    ("naive", "toy:naive"),
    ("+ fast transforms", "toy:fast-transforms"),
    ("+ uint8 on the host, colour on the device", "toy:uint8-host"),
    ("+ crop-first raw loading", "toy:crop-first"),
    ("+ prefetcher (= toy:optimized)", "toy:optimized"),
    ("+ recycled batch memory", "toy:recycled"),
]


@dataclass
class VariantResult:
    """One rung of a :class:`Comparison`: its step time, what it saved against the rung above, and whether that holds
    beyond noise."""

    name: str
    """The rung's label in the table (``toy:naive``, ``+ crop-first raw loading``...)."""
    spec: str
    """The SPEC (or factory) the rung was built from."""
    steps_per_s: float
    """Steps per second, pooled over the rung's rounds."""
    fraction_of_bound: float
    """``steps_per_s`` as a share of the device bound (1.0: the device never waits)."""
    ms_per_step: float
    """Mean time per step in milliseconds."""
    saved_ms: float | None
    """Milliseconds per step saved against the rung above (None for the first); negative when slower."""
    throughput_gain: float | None
    """Throughput against the rung above, minus one (0.25 = 25% more steps per second)."""
    gap_closed: float | None
    """Share of the rung above's time over the device step that this rung removed (None for the first)."""
    improved: bool | None
    """Whether the saving exceeds two standard errors (in time, from both rungs) and run-to-run drift."""
    noise: float
    """Relative standard error of this rung's mean step time: the precision reached."""
    spread: float
    """Relative standard deviation of the step times (how much single steps vary, not the mean's precision)."""
    cpu_util: float
    """The process tree's CPU use over the available cores, 0..1, while the rung ran."""
    memory: RungMemory | None = None
    """What the rung's loader held, from a short pass after the timing rounds (None: not measured)."""


@dataclass
class RungMemory:
    """A rung's memory, measured by :func:`~fastpipe.diagnosis.memory._loader.measure_loader_memory` after the timing
    rounds (never during them): the loop stalls until every batch in flight waits in shared memory; bytes."""

    shm_predicted: int
    shm_peak: int | None
    settled: bool
    """False when the time budget cut the stall short: ``shm_peak`` is then a lower bound."""
    worker_uss_peak: int | None
    """The largest worker's unique memory (its batches in shared memory left out)."""
    pinned_predicted: int
    pinned_peak: int | None
    """Measured where CUDA reports it; None on a machine without CUDA."""
    not_run: str | None = None

    @classmethod
    def of(cls, memory: Any) -> RungMemory:
        p = memory.prediction
        uss = max((w.uss_peak for w in memory.workers), default=None)
        return cls(p.shm_bytes, memory.shm_peak, memory.settled, uss, p.pinned_bytes, memory.pinned_peak)

    def cells(self) -> tuple[str, str, str]:
        """(shared memory measured / predicted, worker USS, pinned) as table cells."""
        if self.not_run is not None:
            return ("not measured", "", "")
        peak = "n/a" if self.shm_peak is None else ("≥" if not self.settled else "") + size_text(self.shm_peak)
        uss = "no workers" if self.worker_uss_peak is None else size_text(self.worker_uss_peak)
        pinned = f"{size_text(self.pinned_peak) if self.pinned_peak is not None else 'n/a'} / {size_text(self.pinned_predicted)}"
        return (f"{peak} / {size_text(self.shm_predicted)}", uss, pinned)


@dataclass
class Comparison:
    """What :func:`fastpipe.compare` found: pipeline variants (rungs) measured side by side in interleaved rounds, each
    against the one above it and the device bound.

    ``print(comparison)`` prints the table; ``to_json()`` writes ``fastpipe.compare/1`` JSON; ``plot(path)`` draws it."""

    device: str
    """The device the rungs ran on, as a spec (``cuda:0``, ``sim:290``)."""
    device_bound_steps_per_s: float
    """Steps per second with every batch already on the device: the bound each rung is held against."""
    steps: int
    """The fewest measured steps per rung and round."""
    warmup: int
    """Untimed steps before each rung's measurement."""
    variants: list[VariantResult] = field(default_factory=list)
    """The rungs in the order given, each against the one above."""
    flags: list[str] = field(default_factory=list)
    """What weakens a verdict: a saving within noise or drift, a busy machine, a rung short of the precision target."""
    precision_target: float = 0.03
    """The relative standard error each rung was measured to, unless its budget ran out first."""

    @property
    def device_step_ms(self) -> float:
        return 1000.0 / self.device_bound_steps_per_s

    def to_dict(self) -> dict[str, Any]:
        """The comparison as plain data: ``schema`` and every field, each rung's own fields included."""
        return {"schema": SCHEMA, **asdict(self)}

    def to_json(self, indent: int | None = 2) -> str:
        """:meth:`to_dict` as JSON text (what ``fastpipe compare --json`` writes)."""
        return json.dumps(self.to_dict(), indent=indent)

    def _rows(self) -> list[tuple[str, ...]]:
        rows = [("device bound", f"{self.device_step_ms:.0f}", f"{self.device_bound_steps_per_s:.3f}", "100.0%", "", "", "", "")]
        for v in self.variants:
            saved = "" if v.saved_ms is None else f"{v.saved_ms:+.0f}"
            gain = "" if v.throughput_gain is None else f"{v.throughput_gain:+.0%}"
            closed = "" if v.gap_closed is None else f"{v.gap_closed:.0%}"
            verdict = "" if v.improved is None else ("faster beyond noise" if v.improved else "NO GAIN beyond noise or drift")
            rows.append(
                (
                    v.name,
                    f"{v.ms_per_step:.0f} ±{v.noise:.1%}",
                    f"{v.steps_per_s:.3f}",
                    f"{v.fraction_of_bound:.1%}",
                    saved,
                    gain,
                    closed,
                    verdict,
                )
            )
        return rows

    HEADERS = ("variant", "ms/step", "steps/s", "of bound", "saved ms", "throughput", "gap closed", "verdict")
    MEMORY_HEADERS = ("variant", "shm peak / predicted", "worker USS peak", "pinned / predicted")
    MEMORY_NOTE = (
        "Memory per rung, from a short pass after the timing rounds: the loop stalls until every batch in flight waits in "
        "/dev/shm (≥: the time budget cut the stall short), each worker's unique memory at its largest, pinned host memory "
        "(measured where CUDA reports it; 'n/a' without CUDA) against the prediction."
    )

    def _memory_rows(self) -> list[tuple[str, ...]]:
        return [(v.name, *v.memory.cells()) for v in self.variants if v.memory is not None]

    def _title(self) -> str:
        return (
            f"fastpipe compare on {self.device} (at least {self.steps} steps a rung after {self.warmup} warm-up, "
            f"precision target {self.precision_target:.0%}); each rung is compared with the row above it"
        )

    def to_markdown(self) -> str:
        """The table and its flags as Markdown, for a pull request or an issue."""
        out = [f"### {self._title()}", "", "| " + " | ".join(self.HEADERS) + " |", "|---|" + "---:|" * (len(self.HEADERS) - 2) + "---|"]
        out += ["| " + " | ".join(row) + " |" for row in self._rows()]
        out += [""] + [f"Flag: {flag}  " for flag in self.flags]
        memory = self._memory_rows()
        if memory:
            out += ["", "| " + " | ".join(self.MEMORY_HEADERS) + " |", "|---|---:|---:|---:|"]
            out += ["| " + " | ".join(row) + " |" for row in memory] + ["", self.MEMORY_NOTE]
        return "\n".join(out) + "\n"

    def to_table(self) -> str:
        """The console rendering: the table of rungs, then the flags (what ``fastpipe compare`` prints)."""
        columns = [(header, "left" if header in ("variant", "verdict") else "right") for header in self.HEADERS]
        lines = [f"Flag: {flag}" for flag in self.flags]
        if not self.flags and len(self.variants) > 1:
            lines.append("Every rung made the step shorter beyond noise.")
        lines.append(
            "Each rung is compared with the row above: 'saved ms' per step, the 'throughput' that buys, and 'gap closed', "
            "the share of the row above's time over the device step that the rung removed."
        )
        text = render_table(self._title(), columns, self._rows(), lines)
        memory = self._memory_rows()
        if memory:
            columns = [(header, "left" if header == "variant" else "right") for header in self.MEMORY_HEADERS]
            text += "\n" + render_table("Memory per rung", columns, memory, [self.MEMORY_NOTE])
        return text

    def __str__(self) -> str:
        """``print(comparison)`` prints :meth:`to_table`."""
        return self.to_table()

    def colors(self) -> list[str]:
        """Each rung's bar colour, in the colour language of every fastpipe picture."""
        return [COLORS["minor"] if v.improved is False else COLORS["gain"] if v.improved else COLORS["reference"] for v in self.variants]

    def plot(self, path: str) -> str:
        """Each rung's step time, the device step marked; colours as in every fastpipe picture."""
        plt = pyplot()
        names = [v.name for v in self.variants]
        times = [v.ms_per_step for v in self.variants]
        colors = self.colors()
        fig, ax = plt.subplots(figsize=(8, 0.5 * len(names) + 1.8))
        ax.barh(names[::-1], times[::-1], color=colors[::-1])
        ax.axvline(
            self.device_step_ms,
            color=COLORS["device"],
            linestyle="--",
            linewidth=1.5,
            label=f"device step ({self.device_step_ms:.0f} ms, the bound)",
        )
        for y, v in enumerate(self.variants[::-1]):
            ax.text(v.ms_per_step, y, f" {v.ms_per_step:.0f} ms ({v.fraction_of_bound:.0%} of the bound)", va="center", fontsize=8)
        from matplotlib.patches import Patch

        handles = [
            Patch(color=COLORS["reference"], label="first rung"),
            Patch(color=COLORS["gain"], label="faster beyond noise"),
            Patch(color=COLORS["minor"], label="no gain beyond noise"),
        ]
        line_handles, _ = ax.get_legend_handles_labels()
        ax.set_xlabel("milliseconds per step (shorter is better)")
        ax.set_xlim(0, max(times + [self.device_step_ms]) * 1.45)
        ax.set_title(f"fastpipe compare on {self.device}", fontsize=10, pad=30)
        ax.legend(handles=handles + line_handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False, fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


def _pooled(runs: list[ExperimentResult], workload: Any) -> ExperimentResult:
    """One result from a variant's rounds: step times pooled, CPU use weighted by steps."""
    round_size = max(1, getattr(workload.loader, "num_workers", 1) or 1)
    steps_per_s, noise = pool(runs, round_size)
    weights = [max(1, len(r.step_times)) for r in runs]
    total = sum(weights)
    first = runs[0]
    return ExperimentResult(
        name=first.name,
        cache_point=first.cache_point,
        steps_per_s=steps_per_s,
        fraction_of_bound=math.nan,
        spread=max(r.spread for r in runs),
        noise=noise,
        cpu_util=sum(w * r.cpu_util for w, r in zip(weights, runs)) / total,
        system_cpu_util=sum(w * r.system_cpu_util for w, r in zip(weights, runs)) / total,
        step_times=[t for r in runs for t in r.step_times],
        steps_measured=sum(len(r.step_times) for r in runs),
    )


def rung_memory(workload: Any, device: Device, budget_s: float) -> RungMemory | None:
    """One rung's memory, read after its timing rounds so it cannot slow them; None for a loader it cannot read
    (no workers, an IterableDataset, stages outside the workers), a reason when its pipeline failed."""
    from fastpipe.diagnosis.memory._loader import measure_loader_memory
    from fastpipe.diagnosis.memory._section import MIN_PASS_S
    from fastpipe.diagnosis.memory._shm_budget import loader_settings
    from fastpipe.loading._protocols import stages_outside_workers

    loader = workload.loader
    workers, _, slots = loader_settings(loader)
    if (workers == 0 and slots is None) or stages_outside_workers(loader) or isinstance(loader.dataset, IterableDataset):
        return None
    with preserve_user_state(workload.model, workload.optimizer, loader, schedulers=workload.schedulers, scaler=workload.scaler):
        try:
            measured = measure_loader_memory(loader, check=False, device=device, samples=1, budget_s=max(budget_s, MIN_PASS_S))
        except Exception as exc:  # noqa: BLE001 - the rung's timing stands; its memory row says why it is missing
            return RungMemory(0, None, False, None, 0, None, not_run=f"{type(exc).__name__}: {exc}")
    return RungMemory.of(measured)


def measure_rungs(
    workloads: list[Any], device: Device, options: MeasureOptions | None = None, *, progress: bool = False
) -> tuple[float, list[ExperimentResult]]:
    """The first workload's device bound (steps/s) and each workload's pooled baseline, measured in one run as the
    module docstring says: a discarded warm-up pass of each, then :data:`ROUNDS` rounds in rotated order, each
    measurement as ``options`` says (its budget shared by the rounds)."""
    options = MeasureOptions() if options is None else options

    def measure(i: int, points: list[str], budget_s: float) -> dict[str, ExperimentResult]:
        return measure_points(workloads[i], device, points, options=replace(options, budget=budget_s), progress=progress)

    for i in range(len(workloads)):  # warm-up: file cache, workers, compilation; discarded
        measure(i, [BASELINE], min(WARMUP_BUDGET_S, options.budget))
    bound = measure(0, [DEVICE], options.budget)[DEVICE].steps_per_s
    runs: list[list[ExperimentResult]] = [[] for _ in workloads]
    for r in range(ROUNDS):
        for k in range(len(workloads)):
            i = (r + k) % len(workloads)  # each round starts one variant later
            runs[i].append(measure(i, [BASELINE], options.budget / ROUNDS)[BASELINE])
    return bound, [_pooled(variant_runs, workloads[i]) for i, variant_runs in enumerate(runs)]


def resolve_variants(specs: list[str]) -> list[tuple[str, str]]:
    """``["toy"]`` means the toy ladder; anything else is a list of SPECs, each its own rung."""
    if specs == ["toy"]:
        return list(TOY_LADDER)
    if specs == ["jpeg"]:
        from fastpipe.workloads.jpeg import LADDER

        return list(LADDER)
    if len(specs) < 1:
        raise ConfigError("compare needs SPECs to compare, e.g. `fastpipe compare toy` or `fastpipe compare mod:before mod:after`")
    return [(spec, spec) for spec in specs]


@moved_keywords({"options": MeasureOptions}, positional=("device",))
def compare(
    specs: list[str],
    *,
    device: "str | Device | None" = None,
    options: MeasureOptions | None = None,
    toy_options: dict[str, Any] | None = None,
    drift: float = 0.05,
    memory: bool = True,
    progress: bool = False,
) -> Comparison:
    """Measure each variant's baseline, and the first variant's device bound, in one run, interleaved in rounds.

    Rungs are compared in time per step: a rung is faster when the time it saves per step over the
    rung above exceeds two standard errors of the difference and also ``drift`` times the rung
    above's time over the device step (the standard error only sees the noise within a run, not
    the drift between runs on a shared machine). Each rung is measured until its step time reaches
    ``options.precision`` (relative standard error) or ``options.budget`` seconds are spent, over :data:`ROUNDS`
    interleaved rounds after a discarded warm-up pass of each variant (see the module docstring).

    Args:
        specs: the variants' SPECs, each a rung, or ``["toy"]``/``["jpeg"]`` for a built-in ladder.
        device: as for :func:`fastpipe.diagnose`.
        options: how each rung is measured (:class:`~fastpipe.MeasureOptions`; None: its defaults).
        toy_options: the built-in workloads' size options (``num_workers``, ``batch_size``, ...).
        drift: a gain must also exceed this fraction of the rung above's time over the device step.
        memory: each rung's loader is then read once more, within ``options.budget`` seconds, at least 10
            (:func:`rung_memory`): its shared-memory peak against the prediction, its workers' unique memory and
            its pinned bytes (``fastpipe compare --no-memory`` turns it off).
        progress: show a progress line on the terminal.

    The old keywords (``steps=``, ``budget=``, ... and a positional device) still work for one release, with a
    :class:`DeprecationWarning` naming the new spelling.
    """
    options = as_options(MeasureOptions, options)
    budget, precision = options.budget, options.precision
    device = parse_device(device)
    variants = resolve_variants(specs)
    workloads = []
    rngs = UserState()  # the user's factories run here (a model's initialisation draws): their generators are put back
    try:
        for name, spec in variants:
            sizes = dict(toy_options or {}) if family_of(spec) is not None else {}
            workloads.append(load_workload(spec, device, **sizes))
        bound, pooled = measure_rungs(workloads, device, options, progress=progress)
        memories = [rung_memory(workload, device, budget) if memory else None for workload in workloads]
    finally:
        for workload in workloads:
            close = getattr(workload.loader, "close", None)  # e.g. a Ray cluster fastpipe started for this variant
            if close is not None:
                close()
        rngs.restore()
    results = [(name, spec, pooled[i]) for i, (name, spec) in enumerate(variants)]
    comparison = Comparison(
        device=device.spec, device_bound_steps_per_s=bound, steps=options.steps, warmup=options.warmup, precision_target=precision
    )
    device_ms = 1000.0 / bound
    previous = None
    for name, spec, result in results:
        ms = 1000.0 / result.steps_per_s
        saved = gain = gap_closed = improved = None
        if previous is not None:
            previous_ms = 1000.0 / previous.steps_per_s
            saved = previous_ms - ms
            gain = previous_ms / ms - 1
            over_bound = max(0.0, previous_ms - device_ms)
            # against a rung already within 5% of the device step, a share of what is left means nothing
            gap_closed = saved / over_bound if over_bound > 0.05 * device_ms else None
            noise = difference_noise(ms, result.noise, previous_ms, previous.noise)
            floor = drift * over_bound
            improved = saved > max(noise, floor)
            if saved <= noise:
                comparison.flags.append(
                    f"'{name}' did not shorten the step beyond noise: {saved:+.0f} ms per step against noise of ±{noise:.0f} ms"
                    + (" (the rung above was already at the bound)" if over_bound <= 0.03 * device_ms else "")
                )
            elif not improved:
                comparison.flags.append(f"'{name}' saved {saved:+.0f} ms per step, within run-to-run drift (±{floor:.0f} ms)")
        comparison.variants.append(
            VariantResult(
                name=name,
                spec=spec,
                steps_per_s=result.steps_per_s,
                fraction_of_bound=result.steps_per_s / bound,
                ms_per_step=ms,
                saved_ms=saved,
                throughput_gain=gain,
                gap_closed=gap_closed,
                improved=improved,
                noise=result.noise,
                spread=result.spread,
                cpu_util=result.cpu_util,
                memory=memories[len(comparison.variants)],
            )
        )
        previous = result
    busy = busy_machine_line(
        [(v.name, r.system_cpu_util - r.cpu_util) for v, (_, _, r) in zip(comparison.variants, results)],
        "rungs measured then were interleaved with the others in rounds",
    )
    if busy:
        comparison.flags.append(busy)
    imprecise = [v.name for v in comparison.variants if v.noise > precision]
    if imprecise:
        comparison.flags.append(
            f"{', '.join(imprecise)} did not reach the {precision:.0%} precision target within the {budget:g} s "
            "budget: raise --budget for firmer verdicts"
        )
    return comparison
