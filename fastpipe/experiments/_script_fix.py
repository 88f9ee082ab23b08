"""Script mode's fix engine: ``fastpipe fix -- python train.py ARGS`` (and ``fastpipe diagnose -- ... --fix``).

Once script mode has found the training loader (:mod:`fastpipe.diagnosis._script`, as for the cache ladder), the
candidate fixes are built from the script's own live loader, dataset and transform
(:func:`~fastpipe.experiments._fix_candidates.build_candidates` on the Workload script mode already made), each is
checked for the same model input and for keeping everything the loader did (:mod:`fastpipe.experiments._fix_keep`),
and those that pass are measured against the original inside the script's loop, in one run, rotated
(:func:`fastpipe.experiments._fix.measure_fixes` with the :class:`~fastpipe.diagnosis._windows.WindowRunner`): every
rung's step is the script's real step (model, loss, optimizer), handed each batch through the
:class:`~fastpipe.diagnosis._handoff.Handoff`, as the ladder's points are.

What differs from ``fastpipe fix SPEC``, and why:

* no ``tune`` sweep: it rebuilds the workload from a factory for each setting, and a script has none. The worker
  counts a sweep would try (1, 2, 4, ... and the usable cores) are candidates instead, each measured against the
  original in the same rotated run;
* a fix that moves Normalize after the copy (uint8 over the copy) has its Normalize run on the batch before the
  script's own ``.to(device)``, since fastpipe does not own the script's copy: on the CPU that is where it would run;
  on a GPU it understates the fix's gain (the report says so).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from fastpipe._system import usable_cores
from fastpipe.devices import Device
from fastpipe.diagnosis._options import MeasureOptions
from fastpipe.diagnosis._script import FixHooks
from fastpipe.experiments._compare import ROUNDS
from fastpipe.experiments._fix import FixReport, RunnerFactory, measure_fixes
from fastpipe.experiments._fix_candidates import build_candidates, sweep_counts, worker_count_candidates
from fastpipe.workloads._workload import Workload

CPU_STEP_FLAG = (
    "the script's own step ran on the CPU and shares the cores with the loader: a fix that frees cores (fewer "
    "processes, less work per sample) can gain more or less here than beside an accelerator's step; run the same "
    "command where the script trains on its GPU for that answer"
)
GPU_NORMALIZE_CAVEAT = (
    "a fix that sends uint8 over the copy had its Normalize run on the host batch before the script's own copy "
    "(fastpipe does not own the script's .to(device)): on a GPU, where the fix runs it after the copy, its gain is "
    "understated"
)


def script_fixes(
    workload: Workload,
    device: Device,
    options: MeasureOptions,
    *,
    runner: RunnerFactory,
    script: str,
    named: Sequence[str] | None = None,
) -> FixReport:
    """Build the candidates from ``workload`` (the script's live loader), check them, and measure them with ``runner``
    (the script's loop) against the original; the report's notes say how."""
    candidates, _ = build_candidates(workload)
    loader = workload.loader
    counts = sweep_counts(usable_cores())
    candidates += worker_count_candidates(workload, counts)
    notes = [
        f"script mode: every rung ran inside {script}'s own loop, its real step timed between the loop's next() calls; "
        "the original and each fix were measured in one run, a warm-up pass of each then rounds in rotated order",
        f"the worker counts {', '.join(map(str, counts))} were measured as candidates (num_workers={getattr(loader, 'num_workers', 0)} "
        "now): a script has no factory for a tune sweep to rebuild",
    ]
    report = measure_fixes(workload, device, options, candidates, runner=runner, named=named, notes=notes)
    if device.kind == "cpu":
        report.flags.append(CPU_STEP_FLAG)
    if device.kind == "cuda" and any(r.name.startswith("uint8 over the copy") and r.ms_per_step is not None for r in report.results):
        report.flags.append(GPU_NORMALIZE_CAVEAT)
    return report


def announcement(script: str, label: str, loader: Any, why: str, options: MeasureOptions) -> str:
    """What ``fastpipe fix -- python SCRIPT`` says as it takes over the script's loop."""
    return (
        f"fastpipe fix: the candidate fixes are measured in {script}'s loop from its next batch of {label} "
        f"(batch_size={getattr(loader, 'batch_size', None)}, num_workers={getattr(loader, 'num_workers', 0)}; {why}). The script "
        f"trains on the fixes' batches: each fix and the original get a warm-up pass, then {ROUNDS} rounds in rotated order, "
        f"each up to {options.budget:g} s (--budget); afterwards its state is put back and it is stopped (a dry run)"
    )


def progress_runner(make: Callable[..., Any], echo: Callable[[str], None] | None) -> RunnerFactory:
    """``make`` (the script's WindowRunner factory) saying on stderr which rung it measures, when ``echo`` is given."""

    def runner(workload: Workload, device: Device, **kwargs: Any) -> Any:
        if echo is not None:
            echo(f"fastpipe fix: measuring {workload.name} ({getattr(kwargs.get('options'), 'budget', 0):.0f} s at most)")
        return make(workload, device, **kwargs)

    return runner


HOOKS = FixHooks(announcement=announcement, progress_runner=progress_runner, script_fixes=script_fixes)
"""What :class:`~fastpipe.diagnosis._script.ScriptLadder` is handed to measure fixes in a script's loop."""
