"""Measure before recommending: each candidate fix run as a rung of ``compare`` against the user's original.

:func:`fix` builds the candidates that apply to the workload's pipeline (:mod:`fastpipe.experiments._fix_candidates`),
the loader settings among them from a short ``tune`` sweep (:func:`tune_candidate`), checks that each gives the model
the same input (:mod:`fastpipe.experiments._fix_checks`), then measures the original and every candidate that passed
in one run on the same device, as ``fastpipe compare`` does: a discarded warm-up pass of each, then rounds in rotated
order, pooled (:func:`fastpipe.experiments._compare.measure_rungs`). A candidate is
faster when the time it saves per step exceeds two standard errors of the difference, ``drift`` of the original's
time over the device step (the rule of a rung of ``compare``, but always against the original) and :data:`THRESHOLD`
of the device step.

Before any of that, a candidate whose loader cannot keep everything the user's did (its ``collate_fn``, sampler,
``drop_last``, ``worker_init_fn``, ``generator``, ``persistent_workers``, ``pin_memory``) is "not tried", saying which
(:mod:`fastpipe.experiments._fix_keep`). After the single fixes, the ones that helped and change different parts of the
pipeline are joined into one candidate (:mod:`fastpipe.experiments._fix_combined`), checked the same way and measured
against the original and the best single fix in a second rotated run; the report recommends the best measured, single
or combined (:attr:`FixReport.best`).

:func:`measure_fixes` is that engine for any runner of points: a factory's (``fix``) or script mode's, whose
:class:`~fastpipe.diagnosis._windows.WindowRunner` times every rung through the script's own step
(:mod:`fastpipe.experiments._script_fix`, ``fastpipe fix -- python train.py``).

The report lists only what it measured: the fixes that helped, ranked by measured gain, each with the code to apply
and what its input check found; then the candidates tried and not helping; those whose input check failed (never
recommended, however fast); and advice not tried, with why. :func:`plan` says, without measuring, which fixes would be
tried and about how long that would take.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Sequence

from torch.utils.data import DataLoader

from fastpipe._deprecated import moved_keywords
from fastpipe._render import render_table
from fastpipe._system import usable_cores
from fastpipe.devices import Device, parse_device
from fastpipe.diagnosis._options import MeasureOptions, as_options
from fastpipe.diagnosis.ladder._cachepoint import BASELINE, DEVICE
from fastpipe.diagnosis.ladder._noise import difference_noise
from fastpipe.diagnosis.ladder._points import PointRunner
from fastpipe.diagnosis.runtime._snapshot import UserState, preserve_user_state
from fastpipe.errors import ConfigError
from fastpipe.experiments._compare import ROUNDS, WARMUP_BUDGET_S, measure_rungs
from fastpipe.experiments._compare import _pooled as pooled_result
from fastpipe.experiments._fix_candidates import (
    Candidate,
    build_candidates,
    discard_candidate_loader,
    level_unit,
    sweep_counts,
    tuned_settings,
    view_of,
)
from fastpipe.experiments._fix_checks import InputCheck, check_input
from fastpipe.experiments._fix_combined import combine_fixes
from fastpipe.experiments._fix_keep import custom_collate
from fastpipe.experiments._tune import tune
from fastpipe.loading._rebuild import discard_loader, rebuild_loader
from fastpipe.workloads._workload import Workload, load_workload

SCHEMA = "fastpipe.fix/1"
THRESHOLD = 0.05
"""The smallest saving that counts, as a fraction of the device step (``fastpipe diagnose``'s ``--threshold``): near the
bound, where drift times the time over it is nearly nothing, a saving of a fraction of a millisecond is not a fix."""

SWEEP_PREFETCH = (2, 4)
"""The prefetch factors the short ``tune`` sweep may try at the worker count it chose (``fastpipe tune``'s default)."""

RECOMMENDED, NOT_HELPING, INPUT_CHANGED, NOT_TRIED, FAILED = "recommended", "tried, not helping", "input changed", "not tried", "failed"


@dataclass
class FixResult:
    """One candidate's outcome; times are milliseconds per step, measured in the same run as the original's."""

    name: str
    """The fix, in words (``ThreadLoader over decode-the-crop``, ``uint8 over the copy``...)."""
    status: str
    """``"recommended"``, ``"tried, not helping"``, ``"input changed"``, ``"not tried"`` or ``"failed"``."""
    code: str
    """The change to make in the user's code to apply it."""
    addresses: list[str]
    """The stages it takes over or changes (the pipeline's names; ``raw load`` for reading the file)."""
    ms_per_step: float | None = None
    """Its mean step time, measured in the same run as the original's (None: not measured)."""
    original_ms: float | None = None
    """The original's mean step time in that run."""
    gain: float | None = None
    """Throughput against the original, minus one (0.77 = 77% more steps per second)."""
    noise_ms: float | None = None
    """The saving a fix must beat: two standard errors of the difference, or where larger the floor (run-to-run drift,
    or 5% of the device step)."""
    check: str | None = None
    """How its input was checked against the original's (labels, shapes and dtypes, pixels, crop boxes), and the outcome."""
    why: str | None = None
    """Why it was not tried or failed."""
    versus: str | None = None
    """For the combined fix: how it measured against the best single fix, in its own rotated run."""
    single: str | None = None
    """For the combined fix: the best single fix it was measured against in that run."""
    single_ms: float | None = None
    """For the combined fix: that single fix's milliseconds a step in that run (``ms_per_step`` is the set's)."""
    candidate: Candidate | None = field(default=None, repr=False, compare=False)
    """The live candidate (its loader, dataset, transform and the original's), for a patch writer; not serialized."""

    def line(self) -> str:
        if self.status == RECOMMENDED:
            return (
                f"fix: {self.name} — {self.original_ms:.0f} → {self.ms_per_step:.0f} ms a step ({self.gain:+.0%}, beyond noise), "
                f"input checked: {self.check}"
            )
        if self.status == NOT_HELPING and self.ms_per_step - self.original_ms > self.noise_ms:
            return (
                f"tried, not helping: {self.name} — {self.original_ms:.0f} → {self.ms_per_step:.0f} ms a step "
                f"({self.gain:+.0%}: slower beyond ±{self.noise_ms:.0f} ms of noise or drift)"
            )
        if self.status == NOT_HELPING and self.why:  # the combined set, faster than the original but not than its best part
            return (
                f"tried, not helping: {self.name} — {self.original_ms:.0f} → {self.ms_per_step:.0f} ms a step "
                f"({self.gain:+.0%}), {self.why}"
            )
        if self.status == NOT_HELPING:
            return (
                f"tried, not helping: {self.name} — {self.original_ms:.0f} → {self.ms_per_step:.0f} ms a step "
                f"({self.gain:+.0%}, within ±{self.noise_ms:.0f} ms of noise or drift)"
            )
        if self.status == INPUT_CHANGED:
            return f"not recommended, the input changed: {self.name} — {self.check}"
        if self.status == FAILED:
            return f"tried, failed: {self.name} — {self.why}"
        return f"not tried: {self.name}, because {self.why}"


@dataclass
class FixReport:
    """What :func:`fastpipe.fix` found: each fix that applies to the pipeline, its input checked against the original's,
    measured against the original in one run; ``recommended`` lists the ones that shortened the step beyond noise.

    ``print(report)`` prints the table; ``to_json()`` writes ``fastpipe.fix/1`` JSON."""

    workload: str
    """The workload's name."""
    device: str
    """The device the candidates ran on, as a spec."""
    device_step_ms: float | None
    """The device step alone, in ms (None: not measured)."""
    original_ms: float | None
    """The original pipeline's mean step time, measured with the candidates (None: not measured)."""
    original_noise: float | None
    """The relative standard error of ``original_ms``."""
    results: list[FixResult] = field(default_factory=list)
    """Each candidate's outcome: the recommended ones first, each group by gain, largest first."""
    flags: list[str] = field(default_factory=list)
    """What weakens the result: a named stage no measured fix addresses, a busy machine..."""
    named_stages: list[str] | None = None
    """The stages the diagnosis named, which the fixes should address (None: no diagnosis ran first)."""
    elapsed_s: float = 0.0
    """Wall time of the whole run, in seconds."""
    notes: list[str] = field(default_factory=list)
    """The workload's notes (e.g. which wrapper was unwrapped and what of it runs on the device)."""
    best: str | None = None
    """The fix the report recommends first: the combined set where it beat the best single fix beyond noise in their
    own rotated run, else the single fix with the largest measured gain (None: nothing helped)."""

    @property
    def recommended(self) -> list[FixResult]:
        return [r for r in self.results if r.status == RECOMMENDED]

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data: ``schema`` and every field, each candidate's own fields included (not its live objects)."""
        out = {"schema": SCHEMA, **asdict(replace(self, results=[]))}
        out["results"] = [{k: v for k, v in asdict(replace(r, candidate=None)).items() if k != "candidate"} for r in self.results]
        return out

    def to_json(self, indent: int | None = 2) -> str:
        """:meth:`to_dict` as JSON text (what ``fastpipe fix --json`` writes)."""
        return json.dumps(self.to_dict(), indent=indent)

    def _title(self) -> str:
        bound = "" if self.device_step_ms is None else f", device step {self.device_step_ms:.0f} ms"
        original = "" if self.original_ms is None else f"; original {self.original_ms:.0f} ms a step ±{self.original_noise:.1%}"
        return f"fastpipe fix {self.workload} on {self.device}{bound}{original} ({self.elapsed_s:.0f} s)"

    def lines(self) -> list[str]:
        out = []
        if self.original_ms is not None and not self.recommended:
            out.append("No fix shortened the step beyond noise: nothing is recommended.")
        elif self.original_ms is None:
            out.append("No candidate could be measured: nothing is recommended.")
        elif self.best is not None:
            out.append(f"Recommended: {self.best} (the best measured, single or combined).")
        for result in self.results:
            out.append(result.line())
            if result.versus:
                out.append(f"    {result.versus}")
            if result.status == RECOMMENDED and result.code:
                out.append(f"    apply: {result.code}")
        return out + [f"Flag: {flag}" for flag in self.flags] + [f"Note: {note}" for note in self.notes]

    def to_table(self) -> str:
        """The console rendering: one row per candidate, then each recommended fix's code, the flags and notes."""
        rows = [
            (
                r.name,
                r.status,
                "" if r.ms_per_step is None else f"{r.ms_per_step:.0f}",
                "" if r.gain is None else f"{r.gain:+.0%}",
                r.check or r.why or "",
            )
            for r in self.results
        ]
        columns = [("fix", "left"), ("status", "left"), ("ms/step", "right"), ("throughput", "right"), ("input check / why", "left")]
        return render_table(self._title(), columns, rows, self.lines())

    def to_markdown(self) -> str:
        """The title and one bullet per candidate (with the code of each recommended one) as Markdown."""
        out = [f"### {self._title()}", ""]
        out += [f"- {line}" if not line.startswith("    ") else f"  `{line.strip()[7:]}`" for line in self.lines()]
        return "\n".join(out) + "\n"

    def __str__(self) -> str:
        """``print(report)`` prints :meth:`to_table`."""
        return self.to_table()


@dataclass(frozen=True)
class FixPlan:
    """The fixes :func:`fix` would try, the advice it would not, and an estimate of the time it would take."""

    tried: list[str]
    not_tried: list[str]
    typical_s: float
    at_most_s: float

    def lines(self, spec: str = "SPEC") -> list[str]:
        if not self.tried:
            return [
                "fix: no candidate fix applies that fastpipe can measure" + (f" ({'; '.join(self.not_tried)})" if self.not_tried else "")
            ]
        head = (
            f"fix: `fastpipe diagnose {spec} --fix` (or `fastpipe fix {spec}`) would measure {len(self.tried)} candidate fixes "
            f"against the original, in about {self.typical_s:.0f} s (at most {self.at_most_s:.0f} s): {'; '.join(self.tried)}"
        )
        return [head] + [f"fix not tried: {line}" for line in self.not_tried]


def _estimate(rungs: int, step_ms: float | None, steps: int, warmup: int, budget: float, sweep: int = 0) -> tuple[float, float]:
    """(typical, at most) seconds of measuring ``rungs`` rungs plus the device bound: each rung's warm-up pass and
    :data:`ROUNDS` rounds, each round at least ``warmup + steps`` steps (worker start-up: about a second a round);
    and before them at most ``sweep`` measurements of the tune sweep, each one run of at most ``budget`` (typically
    three: the bound and two settings, the sweep stopping at the first count that reaches it or gains too little)."""
    at_most = rungs * (min(WARMUP_BUDGET_S, budget) + budget) + budget + sweep * budget
    if step_ms is None:
        return at_most / 2, at_most
    per_round = (warmup + steps) * step_ms / 1000 + 1.0
    typical = rungs * (min(WARMUP_BUDGET_S, budget) + ROUNDS * per_round) + per_round + min(sweep, 3) * per_round
    return min(typical, at_most), at_most


def _sweep_size(workload: Workload) -> int:
    """How many measurements the short tune sweep takes at most: the bound, each count, each prefetch factor (0: none)."""
    return 1 + len(sweep_counts(usable_cores())) + len(SWEEP_PREFETCH) if isinstance(workload.loader, DataLoader) else 0


def tune_candidate(workload: Workload, device: Device, options: MeasureOptions | None = None) -> Candidate | None:
    """The loader settings a short ``tune`` sweep recommends, as a candidate; None when the loader is not a DataLoader.

    The sweep is :func:`fastpipe.tune` itself, bounded: the worker counts of :func:`sweep_counts` (1, 2, 4, ... and
    the usable cores), :data:`SWEEP_PREFETCH`, no extension runs, ``budget`` seconds a setting and :data:`THRESHOLD`
    as its tolerance: the device bound and at most one measurement per count and factor (on 2 cores, 5 at most,
    typically 3). Its figures only choose the setting; the candidate is then measured against the original in the
    same run as every other candidate. A sweep that fails leaves a "not tried" candidate saying why; Ctrl-C stops fix.
    """
    if not isinstance(workload.loader, DataLoader):
        return None
    try:
        result = tune(
            workload,
            device=device,
            options=options,
            worker_counts=sweep_counts(usable_cores()),
            prefetch_factors=SWEEP_PREFETCH,
            tolerance=THRESHOLD,
            extensions=0,
        )
    except Exception as exc:  # noqa: BLE001 - the other candidates still run; this one says why it was not tried
        return Candidate(
            "loader settings from tune", ("workers",), "", not_tried=f"the short tune sweep failed: {type(exc).__name__}: {exc}"
        )
    if result.interrupted:
        raise KeyboardInterrupt
    return tuned_settings(workload, result)


def plan(workload: Workload, options: MeasureOptions | None = None, *, step_ms: float | None = None) -> FixPlan:
    """Which fixes :func:`fix` would try on ``workload`` and how long it would take, measured as ``options`` says
    (nothing is measured)."""
    options = MeasureOptions() if options is None else options
    candidates, _ = build_candidates(workload)
    tried = [c.name for c in candidates if c.workload is not None and c.not_tried is None]
    not_tried = [f"{c.name}, because {c.not_tried}" for c in candidates if c.not_tried is not None]
    sweep = _sweep_size(workload)
    if sweep:
        tried.append(f"the num_workers and prefetch_factor a short tune sweep picks (up to {sweep} measurements first)")
    typical, at_most = _estimate(len(tried) + 1, step_ms, options.steps, options.warmup, options.budget, sweep)
    _discard(candidates)
    return FixPlan(tried, not_tried, typical, at_most)


def _discard(candidates: Sequence[Candidate]) -> None:
    for candidate in candidates:
        discard_candidate_loader(candidate)


def check_candidate(original: Workload, candidate: Candidate, unit: Any) -> InputCheck:
    """The input check of one candidate against the original (see :mod:`fastpipe.experiments._fix_checks`).

    A collate_fn of the user's is left out of the comparison on both sides (``default_collate`` instead): the keep
    check (:mod:`fastpipe.experiments._fix_keep`) has made sure the candidate runs the very same function on samples of
    the same kind, and a random one (mixup, cutmix) draws in whichever process collates, which a fix may change (a
    worker instead of the loop's thread) without changing what the model is trained on."""
    assert candidate.workload is not None
    fixed = candidate.workload
    if custom_collate(original.loader) is not None:
        original, fixed = _default_collated(original), _default_collated(fixed)
    checked = check_input(
        original,
        fixed,
        level_unit=unit,
        compare_pixels=candidate.compare_pixels,
        boxes=candidate.boxes,
        direct=candidate.direct,
    )
    if fixed is not candidate.workload:
        checked = replace(checked, before_collate=True)
        discard_loader(fixed.loader)
        discard_loader(original.loader)
    return checked


def _default_collated(workload: Workload) -> Workload:
    """``workload`` with its loader rebuilt to collate with ``default_collate`` (a copy; the user's is left as it is)."""
    return replace(workload, loader=rebuild_loader(workload.loader, workload.loader.dataset, collate_fn=None))


@moved_keywords({"options": MeasureOptions}, positional=("device",))
def fix(
    source: "Workload | str",
    *,
    device: "str | Device | None" = None,
    options: MeasureOptions | None = None,
    drift: float = 0.05,
    named: Sequence[str] | None = None,
    progress: bool = False,
) -> FixReport:
    """Build, check and measure the candidate fixes of ``source`` (a Workload or a SPEC); see the module docstring.

    Args:
        device: as for :func:`fastpipe.compare`; every rung runs on it, in the same run.
        options: how each rung is measured, as in ``compare`` (:class:`~fastpipe.MeasureOptions`; None: its defaults).
        drift: a gain must also exceed this fraction of the original's time over the device step.
        named: the stages a diagnosis named; the report says which fixes address them (all applicable ones are tried).
        progress: show a progress line on the terminal.

    The old keywords (``steps=``, ``budget=``, ... and a positional device) still work for one release, with a
    :class:`DeprecationWarning` naming the new spelling.
    """
    return run_fix(source, device, as_options(MeasureOptions, options), drift=drift, named=named, progress=progress)


def run_fix(
    source: "Workload | str",
    device: "str | Device | None",
    options: MeasureOptions,
    *,
    drift: float = 0.05,
    named: Sequence[str] | None = None,
    progress: bool = False,
    candidates: Sequence[Candidate] | None = None,
) -> FixReport:
    """The engine behind :func:`fix`; ``candidates``: the candidates to try instead of :func:`build_candidates`'
    (tests plant a broken one this way); given, no tune sweep runs."""
    if not 0 <= drift < 1:
        raise ConfigError(f"drift is a fraction of the original's time over the device step, e.g. 0.05; got {drift}")
    device = parse_device(device)
    workload = load_workload(source, device) if isinstance(source, str) else source
    started = time.perf_counter()
    notes = list(workload.notes)
    if candidates is None:
        tuned = tune_candidate(workload, device, options)
        if tuned is not None:
            notes.append(f"the loader settings come from a short tune sweep, {time.perf_counter() - started:.0f} s before the compare run")
        candidates, _ = build_candidates(workload, tuned)
    report = measure_fixes(workload, device, options, candidates, drift=drift, named=named, progress=progress, notes=notes)
    report.elapsed_s = time.perf_counter() - started
    return report


RunnerFactory = Callable[..., PointRunner]
"""Builds the point runner each rung is measured with: :class:`PointRunner` (a factory's step) or script mode's
:class:`~fastpipe.diagnosis._windows.WindowRunner` (the script's own step, through its loop)."""


def measure_fixes(
    workload: Workload,
    device: Device,
    options: MeasureOptions,
    candidates: Sequence[Candidate],
    *,
    runner: RunnerFactory | None = None,
    drift: float = 0.05,
    named: Sequence[str] | None = None,
    progress: bool = False,
    notes: Sequence[str] = (),
    combine: bool = True,
) -> FixReport:
    """Check each candidate's input, measure those that pass against the original in one rotated run, then the best
    compatible set of the fixes that helped as one candidate (:mod:`fastpipe.experiments._fix_combined`) against the
    original and the best single fix, rotated too; see the module docstring.

    ``runner``: how each rung's points are measured (None: a factory's :class:`PointRunner`; script mode passes its
    :class:`~fastpipe.diagnosis._windows.WindowRunner`, so every rung is timed through the script's real step).
    The candidates' loaders are discarded at the end; the user's generators are put back.
    """
    started = time.perf_counter()
    view, _ = view_of(workload)  # for the grey level's size in the model's input
    unit = level_unit(workload, view.leaves if view is not None else [])
    report = FixReport(
        workload.name, device.spec, None, None, None, named_stages=list(named) if named is not None else None, notes=list(notes)
    )
    measured: list[Candidate] = []
    outcomes: dict[int, FixResult] = {}
    every = list(candidates)
    rngs = UserState()  # candidates are built and measured here: the user's generators are put back at the end
    try:
        for candidate in every:
            result = _outcome(candidate)
            outcomes[id(candidate)] = result
            if _checked(workload, candidate, unit, result):
                measured.append(candidate)
        if measured:
            bound, pooled = _rotated([workload, *(c.workload for c in measured)], device, options, runner, progress)
            _judge(report, bound, pooled, measured, outcomes, drift)
            if combine:
                _measure_combined(report, workload, device, options, runner, progress, unit, measured, outcomes, every, drift)
    finally:
        _discard(every)
        rngs.restore()
    order = {RECOMMENDED: 0, NOT_HELPING: 1, INPUT_CHANGED: 2, FAILED: 3, NOT_TRIED: 4}
    report.results = sorted(outcomes.values(), key=lambda r: (order[r.status], -(r.gain or 0.0)))
    if report.best is None and report.recommended:  # no combined run (combine=False): the largest measured gain
        report.best = report.recommended[0].name
    if named:
        addressed = {stage for r in report.recommended for stage in r.addresses}
        missed = [stage for stage in named if not any(stage == a or stage.startswith(a) or a in stage for a in addressed)]
        if missed and report.recommended:
            report.flags.append(f"no measured fix addresses {', '.join(missed)}, which the diagnosis named")
    report.elapsed_s = time.perf_counter() - started
    return report


def _outcome(candidate: Candidate) -> FixResult:
    result = FixResult(candidate.name, NOT_TRIED, candidate.code, list(candidate.addresses), why=candidate.not_tried)
    result.candidate = candidate
    return result


def _checked(workload: Workload, candidate: Candidate, unit: Any, result: FixResult) -> bool:
    """Run ``candidate``'s input check into ``result``; whether it may be measured."""
    if candidate.not_tried is not None or candidate.workload is None:
        result.why = result.why or "it could not be built"
        return False
    try:
        checked = check_candidate(workload, candidate, unit)
    except Exception as exc:  # noqa: BLE001 - a candidate that cannot run is reported, the others still run
        result.status, result.why = FAILED, f"its pipeline raised {type(exc).__name__}: {exc}"
        return False
    result.check = checked.line()
    if not checked.passed:
        result.status = INPUT_CHANGED
        return False
    return True


def _rotated(
    workloads: list[Workload], device: Device, options: MeasureOptions, runner: RunnerFactory | None, progress: bool
) -> tuple[float, list[Any]]:
    """The first workload's device bound and each workload's pooled time, in one run: ``compare``'s
    :func:`~fastpipe.experiments._compare.measure_rungs` (a warm-up pass of each, then rounds in rotated order), each
    rung's points measured by ``runner``."""
    if runner is None:
        return measure_rungs(workloads, device, options, progress=progress)

    def measure(i: int, point: str, budget_s: float) -> Any:
        w = workloads[i]
        points = runner(w, device, options=replace(options, budget=budget_s), pool=1, progress=False)
        with preserve_user_state(w.model, w.optimizer, w.loader, schedulers=w.schedulers, scaler=w.scaler):
            try:
                points.measure(point)
            finally:
                points.close()
        return points.results[point]

    for i in range(len(workloads)):  # warm-up: file cache, workers, compilation; discarded
        measure(i, BASELINE, min(WARMUP_BUDGET_S, options.budget))
    bound = measure(0, DEVICE, options.budget).steps_per_s
    runs: list[list[Any]] = [[] for _ in workloads]
    for r in range(ROUNDS):
        for k in range(len(workloads)):
            i = (r + k) % len(workloads)  # each round starts one variant later
            runs[i].append(measure(i, BASELINE, options.budget / ROUNDS))
    return bound, [pooled_result(variant_runs, workloads[i]) for i, variant_runs in enumerate(runs)]


def _measure_combined(
    report: FixReport,
    workload: Workload,
    device: Device,
    options: MeasureOptions,
    runner: RunnerFactory | None,
    progress: bool,
    unit: Any,
    measured: list[Candidate],
    outcomes: dict[int, FixResult],
    every: list[Candidate],
    drift: float,
) -> None:
    """The best compatible set of the single fixes that helped, built as one candidate, checked, and measured against
    the original and the best single fix in one rotated run (a second one: the set is known only once the singles
    are). The report then recommends the best measured, single or combined."""
    helped = [(c, outcomes[id(c)]) for c in measured if outcomes[id(c)].status == RECOMMENDED]
    if not helped:
        return
    combined, why = combine_fixes(workload, helped)
    best_single, best_result = max(helped, key=lambda pair: pair[1].gain or 0.0)
    report.best = best_result.name
    if combined is None:
        report.notes.append(f"no combined fix measured: {why}")
        return
    every.append(combined)
    result = _outcome(combined)
    outcomes[id(combined)] = result
    if not _checked(workload, combined, unit, result):
        return
    bound, pooled = _rotated([workload, best_single.workload, combined.workload], device, options, runner, progress)
    again: dict[int, FixResult] = {id(best_single): FixResult(best_single.name, NOT_TRIED, "", []), id(combined): result}
    second = FixReport(report.workload, report.device, None, None, None)
    _judge(second, bound, pooled, [best_single, combined], again, drift)
    single_again = again[id(best_single)]
    result.single, result.single_ms = best_single.name, single_again.ms_per_step
    result.versus = (
        f"in its own run against the original and {best_single.name}: {single_again.ms_per_step:.0f} ms a step for that fix, "
        f"{result.ms_per_step:.0f} for the set ({single_again.ms_per_step / result.ms_per_step - 1:+.0%} over the best single fix)"
    )
    beats = single_again.ms_per_step - result.ms_per_step > difference_noise(
        result.ms_per_step, pooled[2].noise, single_again.ms_per_step, pooled[1].noise
    )
    if result.status == RECOMMENDED and not beats:
        result.status = NOT_HELPING
        result.why = f"not beyond noise faster than {best_single.name} alone"
    report.best = combined.name if result.status == RECOMMENDED else best_result.name


def _judge(
    report: FixReport, bound: float, pooled: list[Any], measured: list[Candidate], outcomes: dict[int, FixResult], drift: float
) -> None:
    """Each measured candidate against the original (``pooled[0]``): saved time, gain, beyond noise or not."""
    original = pooled[0]
    original_ms = 1000.0 / original.steps_per_s
    device_ms = 1000.0 / bound
    report.device_step_ms, report.original_ms, report.original_noise = device_ms, original_ms, original.noise
    over_bound = max(0.0, original_ms - device_ms)
    if over_bound <= 0.05 * device_ms:
        report.flags.append(
            f"the original is already within 5% of the device step ({original_ms:.0f} against {device_ms:.0f} ms): "
            "the input pipeline is not what limits the step"
        )
    for candidate, result in zip(measured, pooled[1:]):
        ms = 1000.0 / result.steps_per_s
        noise = difference_noise(ms, result.noise, original_ms, original.noise)
        floor = max(drift * over_bound, THRESHOLD * device_ms)
        outcome = outcomes[id(candidate)]
        outcome.ms_per_step, outcome.original_ms = ms, original_ms
        outcome.gain, outcome.noise_ms = original_ms / ms - 1, max(noise, floor)
        outcome.status = RECOMMENDED if original_ms - ms > max(noise, floor) else NOT_HELPING
