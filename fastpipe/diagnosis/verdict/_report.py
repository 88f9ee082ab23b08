"""The diagnosis report: a dataclass with console, JSON, Markdown and PNG renderings.

Costs are **time per step**: each point's step time is ``1 / steps_per_s``, and a stage costs
the milliseconds it adds to each step between its two neighbouring cache points. Times add up
(the device step plus every stage's added time is the baseline step); differences of steps/s
do not, and ranked stages wrongly.

The JSON schema is in :meth:`Report.to_dict`'s docstring (``schema`` is bumped on breaking changes).
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from fastpipe._render import COLORS, pyplot, render_table
from fastpipe.diagnosis.ladder._results import TOO_NOISY, ExperimentResult, Unavailable

if TYPE_CHECKING:
    from fastpipe.diagnosis.ladder._loader_stages import LoaderStageCosts
    from fastpipe.diagnosis.memory._section import MemorySection
    from fastpipe.diagnosis.unseen._main_process import MainProcess
    from fastpipe.diagnosis.unseen._startup import Startup
    from fastpipe.diagnosis.unseen._streams import StreamCheck

SCHEMA = "fastpipe.report/2"


@dataclass
class Bottleneck:
    """The time one stage (or a span of stages between two measured points) adds to each step.

    The report holds three lists of these: ``components`` (every span between neighbouring measured points, in ladder
    order, named or not), ``bottlenecks`` (the ones named as costs, largest first) and ``unresolved`` (a cost that did
    not hold when its two points were remeasured back to back). ``added_text`` and the report's lines print them.
    """

    stage: str
    """The stage's name as the ladder knows it (``"RandomResizedCrop"``, ``"raw load"``, ``"collate/IPC"``,
    ``"host-to-device copy"``), or several joined by ``" + "`` when no point between them could be measured."""
    kind: str
    """What the stage is: ``"transform"``, ``"raw load"``, ``"collate/IPC"``, ``"host-to-device copy"``, the script's
    hand-over, or ``"span"`` for a merge of several kinds."""
    added_ms: float
    """Milliseconds added to each step between its two neighbouring points, the cache's own copies discounted."""
    noise_ms: float
    """Two standard errors of that difference."""
    share_of_baseline: float
    """``added_ms`` as a share of the baseline step."""
    between: tuple[str, str]
    """The two cache points it lies between, the upper (more cached) first, e.g. ``("after:Normalize", "after:ToTensor")``."""
    cpu_saturated: bool
    """The lower point ran with the CPU saturated (at least 90% of the usable cores busy)."""
    recommendation: str = ""
    """The fix advised for this stage, in words (empty for a span that is not named)."""
    at_least: bool = False
    """The upper point ran at the device bound, so part of this stage may hide under the device step."""
    snippet: str | None = None
    """Runnable code for the recommended fix, when one fits the stage (printed under the report as "Fix for ...")."""
    in_worker_ms: float | None = None
    """The stage's in-worker cost x batch / workers, in ms per step, when stage costs were measured."""
    calls_per_sample: float | None = None
    """How many times the dataset runs this transform per sample (two views: 2), when more than once."""
    basis: str = "ladder"
    """Where ``added_ms`` comes from: ``"ladder"`` (its own ladder step), ``"saturated split"`` (its share, by
    in-worker cost, of a span's ladder total), ``"in-worker cost"`` (the ladder could not decide; see ``why``) or
    ``"loop timing"`` (script mode's loop work before the model, timed in the script's loop; ``between`` is the device
    point, whose step holds it)."""
    ladder_ms: float | None = None
    """Its own ladder step (``t_lower - t_upper``), whatever ``basis`` says."""
    span: tuple[str, str] | None = None
    """The two points of the span whose total was split, when ``basis`` is ``"saturated split"``."""
    cpu_ratio: float | None = None
    """In-worker CPU time over wall time (1: it computes; near 0: it waits)."""
    waits: bool | None = None
    """Whether most of its in-worker cost is waiting (I/O, sleeps, locks) rather than computing."""
    why: str | None = None
    """Why the ladder could not decide it, when it is named by its in-worker cost."""
    minor: bool = False
    """Named, but under a tenth of the input time: a small cost, listed apart from the culprits (see ``_attribute``)."""

    @property
    def added_text(self) -> str:
        """``added_ms`` as the report words it: ``"12 ms per step"``, or ``"at least 12 ms per step"``."""
        return f"{'at least ' if self.at_least else ''}{ms_text(self.added_ms)} ms per step"

    def to_dict(self) -> dict[str, Any]:
        """The ``StageTime`` of the JSON schema: every field, the point pairs as lists."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["between"] = list(self.between)
        data["span"] = None if self.span is None else list(self.span)
        return data


@dataclass
class Report:
    """What :func:`fastpipe.diagnose` found: each cache point's step time, the stages that cost time per step with a fix
    for each, the verdict, and what the ladder cannot see (memory, start-up, the main process's share, streams).

    Read it as the console does (``print(report)``), or as data: ``report.bottlenecks`` lists the named stages largest
    first, ``report.verdict`` says whether the loop waits for its input, and ``to_json()`` writes it all as JSON
    (its schema is in :meth:`to_dict`).
    Times are milliseconds per step; a field is None where its part was not measured.
    """

    workload: str
    """The workload's name (a SPEC such as ``toy:naive``, a factory's, or ``name=``)."""
    device: str
    """The device the steps ran on, as a spec: ``cuda:0``, ``cpu``, ``sim:290``."""
    num_workers: int
    """The loader's worker processes (0: it loads in the training process)."""
    batch_size: int | None
    """Samples per batch: the loader's, or the batches its custom sampler delivered (None when neither tells)."""
    steps: int
    """The fewest measured steps per point (after rounding up to whole rounds of workers)."""
    warmup: int
    """Untimed steps before each point's measurement."""
    pool: int
    """Samples (or batches) each cache point kept per worker and cycled through."""
    threshold: float
    """The smallest added time that counts, as a fraction of the device step."""
    strategy: str
    """``"linear"`` (every point measured) or ``"bisect"`` (the endpoints, then halves)."""
    precision_target: float = 0.03
    """The relative standard error each point's mean step time was measured to (unless its budget ran out first)."""
    budget_s: float = 0.0
    """Seconds of measuring allowed per point."""
    device_bound_steps_per_s: float | None = None
    """Steps per second with every batch already on the device: the most the pipeline can reach."""
    device_step_ms: float | None = None
    """The device step alone, in ms (``1000 / device_bound_steps_per_s``)."""
    baseline_step_ms: float | None = None
    """The user's pipeline as it is, in ms per step (the ``baseline`` point)."""
    gap_fraction: float | None = None
    """``1 - device step / baseline step``: the share of the baseline step that is input."""
    verdict: str = "incomplete"
    """``"not input-bound"``, ``"moderately input-bound"``, ``"highly input-bound"``, ``"incomplete"``, ``"too noisy to
    decide: <why>; to decide, <what to do>"``, or on ``--device cpu`` "the input pipeline competes with the step for the
    CPU: X% of the step"."""
    experiments: list[ExperimentResult] = field(default_factory=list)
    """Each measured cache point, most cached (``device``) first, down to ``baseline``."""
    unavailable: list[Unavailable] = field(default_factory=list)
    """The cache points that could not be built or measured, each with its reason."""
    bottlenecks: list[Bottleneck] = field(default_factory=list)
    """The stages named as costs, largest ``added_ms`` first (``minor`` ones are small costs, listed apart)."""
    unresolved: list[Bottleneck] = field(default_factory=list)
    """Costs that did not hold when their two points were remeasured back to back (not named)."""
    components: list[Bottleneck] = field(default_factory=list)
    """Every span between neighbouring measured points, named or not, in ladder order: they add up to the baseline."""
    caveats: list[str] = field(default_factory=list)
    """What may make a figure or a name wrong here (a busy machine, a saturated CPU, the noise...)."""
    notes: list[str] = field(default_factory=list)
    """What the reader should know besides: what was unwrapped or skipped, what the run could not do, settings found."""
    interrupted: bool = False
    """Ctrl-C (or a failed pass) cut the run short: the report is partial."""
    elapsed_s: float = 0.0
    """Wall time of the whole diagnosis, in seconds."""
    stage_costs: dict[str, Any] | None = None
    """Each stage timed inside the workers (``StageCosts.to_dict()``), when that pass ran."""
    ranked_by: str = "the ladder's time"
    """How the named stages are ordered (the in-worker timing joins in when it was measured)."""
    skipped_samples: int | None = None
    """Samples an ``ImageFolder(on_error="skip")`` replaced during the diagnosis (None: the dataset counts none)."""
    stage_cost_lines: list[str] = field(default_factory=list, repr=False)
    """The stage-cost table, rendered when the costs were measured (not part of the JSON)."""
    memory: MemorySection | None = field(default=None, repr=False)
    """What each cache point held, the loader's growth and shared-memory peak (see ``_memory_section``)."""
    loader_stage_costs: LoaderStageCosts | None = field(default=None, repr=False)
    """A loader without workers that times its own stages (the ThreadLoader): its clocks over the baseline's timed steps."""
    startup: Startup | None = field(default=None, repr=False)
    """The time to the first batch, split (worker start, the dataset's transfer, worker_init_fn, first fetch), and fixes."""
    main_process: MainProcess | None = field(default=None, repr=False)
    """The loader's work in the training process (sampler, collate without workers, pinning), timed there."""
    streams: StreamCheck | None = field(default=None, repr=False)
    """A stream's first items per worker and rank, compared: duplicates and uneven shares."""

    #: The sections of what the ladder cannot see, in the order the report shows them (each None when not measured).
    UNSEEN = ("startup", "main_process", "streams")
    #: The fields that are objects with their own ``to_dict`` (their own schema), each None when not measured.
    SECTIONS = ("memory", "loader_stage_costs", *UNSEEN)

    def _unseen(self) -> list[Any]:
        return [section for section in (getattr(self, name) for name in self.UNSEEN) if section is not None]

    def experiment(self, cache_point: str) -> ExperimentResult | None:
        """The measured point named ``cache_point`` (``"device"``, ``"after:ToTensor"``...), or None."""
        return next((e for e in self.experiments if e.cache_point == cache_point), None)

    # ----- JSON -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The report as plain data, in the schema below (``"schema": "fastpipe.report/2"``).

        Each point also carries its ``ms_per_step``, ``stderr_ms`` and the ``stage_added`` between it and the point
        above; the sections with their own schema (memory, the loader's clocks, start-up, main process, streams) are
        their own ``to_dict()``; the rendered stage-cost table is left out. The dict shares nothing with the report.
        ``schema`` is bumped on breaking changes::

            {
              "schema": "fastpipe.report/2",
              "workload": str, "device": str, "num_workers": int, "batch_size": int | null,
              "steps": int, "warmup": int, "pool": int, "threshold": float, "strategy": "linear" | "bisect",
              "precision_target": float, "budget_s": float,
              "device_bound_steps_per_s": float | null, "device_step_ms": float | null, "baseline_step_ms": float | null,
              "gap_fraction": float | null,            # 1 - device step / baseline step
              "verdict": "not input-bound" | "moderately input-bound" | "highly input-bound" | "incomplete"
                         | "too noisy to decide: <why>; to decide, <what to do>"   # noise, not the pipeline, decided
                         | "the input pipeline competes with the step for the CPU: X% of the step" (--device cpu),
              "experiments": [{
                  "name": str, "cache_point": "device" | "host" | "sample" | "after:<Stage>" | "raw" | "baseline",
                  "steps_per_s": float, "fraction_of_bound": float,
                  "ms_per_step": float, "stderr_ms": float,  # mean step time and its standard error
                  "spread": float,                     # relative std of step times
                  "noise": float,                      # relative standard error of the mean step time (the precision achieved)
                  "steps_measured": int,
                  "cpu_util": float,                   # process tree CPU / available cores, 0..1
                  "system_cpu_util": float, "pool_spread": float | null, "step_times": [float],
                  "copy_ms_per_sample": float,          # the cache's own copy, timed in the workers (0 when skipped)
                  "stage_added": str | null             # the stage that runs here but not at the point above (its time: components)
              }],
              "unavailable": [{"cache_point": str, "reason": str}],
              "bottlenecks": [StageTime], "unresolved": [StageTime],   # bottlenecks ranked by added_ms
              "components": [StageTime],               # every span between neighbouring points, named or not, in order
              "caveats": [str], "notes": [str], "interrupted": bool, "elapsed_s": float,
              "ranked_by": str,                        # what orders "bottlenecks"
              "skipped_samples": int | null,           # damaged samples ImageFolder(on_error="skip") replaced during the run
              "stage_costs": null | {...},             # fastpipe.diagnosis.stagecost.StageCosts.to_dict()
              "loader_stage_costs": null | {...},      # a loader that times its own stages (ThreadLoader), over the baseline's
                                                       # timed steps: fastpipe.diagnosis.ladder._loader_stages.LoaderStageCosts.to_dict()
              "memory": null | {...},                  # fastpipe.diagnosis.memory._section.MemorySection.to_dict()
              "startup": null | {...},                 # time to the first batch, split: fastpipe.diagnosis.unseen._startup
              "main_process": null | {...},            # the loader's work in the training process: ...unseen._main_process
              "streams": null | {...}                  # duplicate and uneven streams: ...unseen._streams.StreamCheck.to_dict()
            }

            StageTime = {"stage": str, "kind": str, "added_ms": float, "noise_ms": float,
                         "share_of_baseline": float, "at_least": bool,   # part may hide under the device step
                         "between": [str, str], "cpu_saturated": bool, "recommendation": str,
                         "snippet": str | null, "in_worker_ms": float | null, "calls_per_sample": float | null,
                         "basis": "ladder" | "saturated split" | "in-worker cost",   # where added_ms comes from
                         "ladder_ms": float | null, "span": [str, str] | null,      # its own ladder step; the split span
                         "cpu_ratio": float | null, "waits": bool | null,           # in-worker CPU / wall; mostly waiting
                         "why": str | null,                                         # why the ladder could not decide it
                         "minor": bool}                        # under a tenth of the input time: a small cost, not a culprit
        """
        added = self._added_by_point()
        data: dict[str, Any] = {"schema": SCHEMA}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "stage_cost_lines":
                continue  # text, rendered from stage_costs
            if f.name == "experiments":
                value = [_experiment_dict(e, added.get(e.cache_point)) for e in value]
            elif f.name == "unavailable":
                value = [asdict(u) for u in value]
            elif f.name in ("bottlenecks", "unresolved", "components"):
                value = [b.to_dict() for b in value]
            elif f.name in self.SECTIONS:
                value = None if value is None else value.to_dict()
            else:
                value = copy.deepcopy(value)  # lists of text, the stage costs' dict, numbers
            data[f.name] = value
        return data

    def to_json(self, indent: int | None = 2) -> str:
        """:meth:`to_dict` as JSON text (NaN written as null), what ``fastpipe diagnose --json`` writes."""
        return json.dumps(self.to_dict(), indent=indent, default=_json_default)

    # ----- text -------------------------------------------------------------------------
    def _added_by_point(self) -> dict[str, tuple[str, str]]:
        """Each point's row shows the stage its lower position adds (the stage between it and the row above) and its time;
        a share of a split span is marked ``*``."""
        return {c.between[1]: (c.stage, f"{c.added_ms:+.0f}{'*' if c.basis == 'saturated split' else ''}") for c in self.components}

    def _rows(self) -> list[tuple[str, ...]]:
        added = self._added_by_point()
        rows = []
        for e in self.experiments:
            stage, ms = added.get(e.cache_point, ("", ""))
            rows.append(
                (
                    e.name,
                    f"{e.ms_per_step:.0f}",
                    stage,
                    ms,
                    f"{e.steps_per_s:.3f}",
                    f"{e.fraction_of_bound:.1%}",
                    f"±{e.noise:.1%}",
                    f"{e.cpu_util:.0%}",
                )
            )
        return rows

    HEADERS = ("cache point", "ms/step", "stage added", "its ms", "steps/s", "of device bound", "precision", "CPU")
    ROWS_NOTE = (
        "Each row's 'stage added' is the stage that runs at this point but not at the row above; 'its ms' is the time it "
        "adds per step (* its share, by in-worker cost, of a span the ladder cannot split)."
    )

    def _stage_line(self, b: Bottleneck) -> str:
        share = f"{b.share_of_baseline:.0%} of the baseline step"
        calls = f", run {b.calls_per_sample:g}x per sample" if b.calls_per_sample and b.calls_per_sample > 1 else ""
        worker = f"; in the workers it costs {ms_text(b.in_worker_ms)} ms per step" if b.in_worker_ms is not None else ""
        ratio = f" (CPU {b.cpu_ratio:.0%} of its wall time: it {'waits' if b.waits else 'computes'})" if b.cpu_ratio is not None else ""
        hidden = " (its upper point ran at the device bound, so part of it may hide under the device step)" if b.at_least else ""
        label = b.stage if b.kind == b.stage else f"{b.stage} [{b.kind}]"
        if b.basis == "loop timing":
            figure = (
                f"costs {ms_text(b.added_ms)} ms per step (±{ms_text(b.noise_ms)}), timed in the script's loop: inside every point's "
                f"step, the device point's too, {share}"
            )
        elif b.basis == "in-worker cost":
            figure = f"costs {ms_text(b.added_ms)} ms per step by in-worker cost (not the ladder: {b.why})"
        elif b.basis == "saturated split":
            figure = (
                f"adds {b.added_text} (±{ms_text(b.noise_ms)}), its share by in-worker cost of the span from "
                f"'{_point_label(b.span[0]) if b.span else ''}' down, {share} (its own ladder step: {b.ladder_ms:+.0f} ms)"
            )
        else:
            figure = f"adds {b.added_text} (±{ms_text(b.noise_ms)}), {share}"
        return f"  - {label}: {figure}{calls}{worker}{ratio}{hidden}. {b.recommendation}".rstrip()

    def _summary_lines(self) -> list[str]:
        gap = (
            f" (the baseline step is {self.baseline_step_ms:.0f} ms against the device's {self.device_step_ms:.0f} ms: "
            f"{self.gap_fraction:.0%} of it is input)"
            if self.gap_fraction is not None and self.baseline_step_ms and self.device_step_ms and not self.verdict.startswith(TOO_NOISY)
            else ""
        )
        lines = [f"Verdict: {self.verdict}{gap}"]
        if self.interrupted:
            lines.append("Interrupted: this report is partial.")
        culprits = [b for b in self.bottlenecks if not b.minor]
        small = [b for b in self.bottlenecks if b.minor]
        if culprits:
            lines.append(
                # the ladder named nothing: these come from the in-worker timing or the loop's own timing (see the verdict)
                "Stages named apart from the ladder, largest first (the ladder itself could not decide; see the verdict):"
                if self.verdict.startswith(TOO_NOISY)
                else f"Stages that cost time per step, largest first (by {self.ranked_by}):"
            )
            lines += [self._stage_line(b) for b in culprits]
        if small:
            lines.append("Smaller costs, each under a tenth of the input time (real, beyond noise; fix the stages above first):")
            lines += [self._stage_line(b) for b in small]
        if not self.bottlenecks and self.baseline_step_ms is not None and not self.unresolved:  # a baseline to compare with
            lines.append(self._none_named())
        if self.unresolved:
            lines.append("Unresolved (a cost that did not hold when the two points were remeasured, interleaved):")
            lines += [self._stage_line(b) for b in self.unresolved]
        for u in self.unavailable:
            lines.append(f"Unavailable: {u.cache_point}: {u.reason}")
        for caveat in self.caveats:
            lines.append(f"Caveat: {caveat}")
        for note in self.notes:
            lines.append(f"Note: {note}")
        return lines

    def _none_named(self) -> str:
        """Why no stage is named: noise (the verdict says), stages whose ladder step cleared the threshold and the noise
        but whose in-worker cost did not (rule 3: they only tipped the pipeline over), or none that adds that much."""
        if self.verdict.startswith(TOO_NOISY):
            return "No stage is named: the noise is too large to tell which stage costs the time (see the verdict)."
        limit = self.threshold * (self.device_step_ms or 0.0)
        tipped = [
            c.stage
            for c in self.components
            if c.in_worker_ms is not None and c.in_worker_ms < limit and (c.ladder_ms or 0.0) > max(c.noise_ms, limit)
        ]
        if tipped:
            return (
                f"No stage is named: the ladder steps beyond the threshold and the noise ({', '.join(tipped)}) belong to stages "
                "that cost less than the threshold inside the workers, so they only tipped the pipeline over (see the notes)."
            )
        return "No stage adds more than the threshold and the noise to the step."

    STAGE_COSTS_TITLE = "Stage costs inside the workers (timed in one more pass, to check the ladder):"

    def title(self) -> str:
        """The report's first line: the workload, the device, the loader's workers and batch, the measuring settings."""
        return (
            f"fastpipe diagnosis: {self.workload} on {self.device} ({self.num_workers} workers, batch {self.batch_size}, "
            f"at least {self.steps} steps a point after {self.warmup} warm-up, precision target {self.precision_target:.0%})"
        )

    def to_markdown(self) -> str:
        """The report as Markdown (what ``--markdown`` writes): the title, the table of points, its summary lines, each
        fix's snippet, the stage costs and the sections; for a pull request, an issue or a notebook."""
        out = [f"### {self.title()}", "", "| " + " | ".join(self.HEADERS) + " |", "|---|" + "---:|" * (len(self.HEADERS) - 1)]
        out += [f"| {' | '.join(row)} |" for row in self._rows()]
        out += ["", self.ROWS_NOTE] + [f"{line}  " if not line.startswith("  -") else f"- {line[4:]}" for line in self._summary_lines()]
        snippets = [b for b in self.bottlenecks if b.snippet]
        for b in snippets:
            out += ["", f"Fix for {b.stage}:", "", "```python", b.snippet.rstrip(), "```"]
        if self.stage_cost_lines:
            out += ["", self.STAGE_COSTS_TITLE, "", "```", *self.stage_cost_lines, "```"]
        if self.loader_stage_costs is not None:
            out += ["", *self.loader_stage_costs.markdown_lines()]
        for section in self._unseen():
            out += section.markdown_lines()
        if self.memory is not None:
            out += self.memory.to_markdown(_point_label)
        return "\n".join(out) + "\n"

    def to_table(self) -> str:
        """The console rendering (rich), as plain text: the table of points, then the verdict, the named stages with
        their fixes, caveats, notes and the sections (what ``fastpipe diagnose`` prints)."""
        columns = [(h, "left" if h in ("cache point", "stage added") else "right") for h in self.HEADERS]
        lines = [self.ROWS_NOTE, *self._summary_lines()]
        for b in self.bottlenecks:
            if b.snippet:
                lines += ["", f"Fix for {b.stage}:", *("    " + line for line in b.snippet.rstrip().splitlines())]
        if self.stage_cost_lines:
            lines += ["", self.STAGE_COSTS_TITLE, *self.stage_cost_lines]
        if self.loader_stage_costs is not None:
            lines += ["", *self.loader_stage_costs.lines()]
        for section in self._unseen():
            lines += ["", *section.lines()]
        text = render_table(self.title(), columns, self._rows(), lines)
        return text if self.memory is None else text + "\n" + self.memory.to_text(_point_label)

    def __str__(self) -> str:
        """``print(report)`` prints :meth:`to_table`."""
        return self.to_table()

    # ----- picture ----------------------------------------------------------------------
    def waterfall(self) -> list[tuple[str, float, float, str]]:
        """The bars of :meth:`plot`: (stage label, start ms, width ms, colour), the device step first."""
        named = {b.between for b in self.bottlenecks}
        unresolved = {b.between for b in self.unresolved}
        bars: list[tuple[str, float, float, str]] = []
        if self.device_step_ms:
            bars.append(("device step (the bound)", 0.0, self.device_step_ms, COLORS["device"]))
            start = self.device_step_ms
            for c in self.components:
                width = c.added_ms  # a negative span (noise) steps back, so the bars still end at the baseline step
                colour = COLORS["cost"] if c.between in named else COLORS["unresolved"] if c.between in unresolved else COLORS["minor"]
                bars.append((f"{'≥ ' if c.at_least and c.between in named else ''}{c.stage}", start, width, colour))
                start += width
        return bars

    def plot(self, path: str) -> str:
        """A waterfall of the baseline step: the device step, then each stage's added time; returns ``path``.

        Bars are labelled by the stage, not the cache point. Colours: the device's time, a stage
        named as a cost, an unresolved one, and spans within noise or the threshold.
        """
        plt = pyplot()
        bars = self.waterfall()
        memory = self.memory.bars() if self.memory is not None else []
        height = 0.45 * max(1, len(bars)) + 1.8
        if memory:  # the memory panel below the waterfall: the shared-memory peak against its prediction, workers, RSS
            fig, (ax, mem_ax) = plt.subplots(
                2, 1, figsize=(9, height + 0.35 * len(memory) + 1.2), gridspec_kw={"height_ratios": [height, 0.35 * len(memory) + 0.6]}
            )
        else:
            fig, ax = plt.subplots(figsize=(9, height))
        labels = [b[0] for b in bars][::-1]
        ax.barh(labels, [b[2] for b in bars][::-1], left=[b[1] for b in bars][::-1], color=[b[3] for b in bars][::-1])
        for y, (label, start, width, _) in enumerate(bars[::-1]):
            text = f" {label.lstrip('≥ ')} {width:+.0f} ms" if y < len(bars) - 1 else f" {width:.0f} ms"
            ax.text(start + max(width, 0.0), y, text, va="center", fontsize=8)
        if self.baseline_step_ms:
            ax.axvline(
                self.baseline_step_ms, color="black", linestyle="--", linewidth=1, label=f"baseline step ({self.baseline_step_ms:.0f} ms)"
            )
        from matplotlib.patches import Patch

        handles = [
            Patch(color=COLORS["device"], label="device step"),
            Patch(color=COLORS["cost"], label="stage named as a cost"),
            Patch(color=COLORS["minor"], label="within noise or threshold"),
        ]
        if self.unresolved:
            handles.append(Patch(color=COLORS["unresolved"], label="did not hold when remeasured"))
        line_handles, _ = ax.get_legend_handles_labels()
        ax.legend(handles=handles + line_handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False, fontsize=8)
        ax.set_xlabel("milliseconds per step (each bar starts where the one above ends; together they make the baseline step)")
        ax.set_xlim(0, max([b[1] + max(b[2], 0.0) for b in bars] + [self.baseline_step_ms or 0]) * 1.15 or 1)
        ax.set_title(f"{self.workload} on {self.device}: {self.verdict}", fontsize=10, pad=36)
        if memory:
            _plot_memory(mem_ax, memory)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


def ms_text(ms: float) -> str:
    """Milliseconds as a named stage's line prints them: one decimal under 10 ms, so a stage named beyond a noise of a
    fraction of a millisecond never reads "0 ms (±0)"."""
    return f"{ms:.1f}" if abs(ms) < 10 else f"{ms:.0f}"


def _plot_memory(ax: Any, bars: list[tuple[str, float]]) -> None:
    """The memory panel: one bar per figure, in MB, the prediction in the device's colour, the measured in the cost's."""
    labels = [label for label, _ in bars][::-1]
    values = [mb for _, mb in bars][::-1]
    colors = [
        COLORS["device"] if "predicted" in label else COLORS["cost"] if label.startswith("shm") else COLORS["minor"] for label in labels
    ]
    low = min([v for v in values if v > 0] + [1.0]) / 2
    ax.barh(labels, [max(v - low, 0.0) for v in values], left=low, color=colors)  # each bar ends at its value
    for y, mb in enumerate(values):
        ax.text(max(mb, low), y, f" {mb:,.1f} MB", va="center", fontsize=8)
    ax.set_xscale("log")  # a worker's batches (kB to GB) and the training process's RSS (GB) on one axis
    ax.set_xlim(low, max(values + [1.0]) * 4)
    ax.set_xlabel("MB, log scale (loader pass: shared memory at the stalled peak, workers' unique memory, training RSS)")
    ax.tick_params(axis="y", labelsize=8)


def _point_label(point: str) -> str:
    from fastpipe.diagnosis.ladder._cachepoint import CachePoint

    return CachePoint(point).label


def _experiment_dict(result: ExperimentResult, added: tuple[str, str] | None) -> dict[str, Any]:
    """One point of ``experiments`` in the JSON: its fields, its mean step time and standard error in ms, and the stage
    that runs at this point but not at the one above (``added``: that stage and its time, from ``_added_by_point``)."""
    return {**asdict(result), "ms_per_step": result.ms_per_step, "stderr_ms": result.stderr_ms, "stage_added": added[0] if added else None}


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
