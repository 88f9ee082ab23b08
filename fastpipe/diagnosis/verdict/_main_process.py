"""The training process named as a stage: the ladder's collate/IPC span, when the main process's own work explains it.

The ladder puts everything between the host point (batches cached, no loader) and the sample point (the user's
loader, samples cached) in one span it calls collate/IPC. Part of that span runs in the training process (the
sampler, collate without workers, pinning: :mod:`fastpipe.diagnosis.unseen._main_process`), timed there apart. When
the span is named and its largest main-process part takes at least :data:`MAIN_SHARE` of the span's added time, the
part is named instead of collate/IPC (stage ``"sampler"``, ``"collate"`` or ``"pinning"``, kind ``"main process"``), with the fix that fits it: a slow sampler is not a slow IPC, and shrinking the
batches (collate/IPC's advice) would not help it. The table's row keeps the ladder's name for the span.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from fastpipe.diagnosis.ladder._cachepoint import DEVICE
from fastpipe.diagnosis.ladder._plan import COLLATE
from fastpipe.diagnosis.unseen._loop_work import LoopWork
from fastpipe.diagnosis.unseen._main_process import LOOP_WORK, SAMPLER_FIX, MainProcess
from fastpipe.diagnosis.verdict._report import Bottleneck

if TYPE_CHECKING:
    from fastpipe.diagnosis.verdict._report import Report

LOOP_BASIS = "loop timing"
"""The basis of the loop-work stage's figure: timed in the script's loop, not a difference of two cache points."""

#: A main-process part is named from this share of the collate/IPC span's added time on.
MAIN_SHARE = 0.5
MAIN_PROCESS = "main process"
"""The kind of a stage named by this rule."""


def name_main_process(report: Report, main: MainProcess | None) -> str | None:
    """Name the main-process part that explains a named collate/IPC span (module docstring); the part's name, or None."""
    if main is None:
        return None
    main.device_step_ms = report.device_step_ms
    part = main.largest()
    if part is None or not part.ms_per_step:
        return None
    for index, b in enumerate(report.bottlenecks):
        if COLLATE not in b.stage.split(" + ") or part.ms_per_step < MAIN_SHARE * b.added_ms:
            continue
        measured = (
            f"Timed in the training process: the {part.name} takes {part.ms_per_step:.0f} ms per step ({part.detail}) of the "
            f"{b.added_ms:.0f} ms the ladder measures where the loader's own work starts (between "
            f"'{b.between[0]}' and '{b.between[1]}', its collate/IPC span). "
        )
        report.bottlenecks[index] = dataclasses.replace(
            b,
            stage=part.name,
            kind=MAIN_PROCESS,
            recommendation=measured + part.advice(main.workers),
            snippet=SAMPLER_FIX if part.name == "sampler" else None,
        )
        main.named = part.name
        return part.name
    return None


def add_loop_work(report: Report, work: LoopWork | None) -> bool:
    """Add script mode's timing of the loop's own work (:mod:`fastpipe.diagnosis.unseen._loop_work`) to the report's
    main-process section, and name it as a stage when it costs the step: above the threshold (a share of the device
    point's step, which holds it, as every point's does) and its noise. Whether it was named."""
    if work is None:
        return False
    if report.main_process is None:
        report.main_process = MainProcess(workers=report.num_workers, batch_size=report.batch_size)
    main = report.main_process
    main.device_step_ms = report.device_step_ms
    part = work.part()
    main.parts.append(part)
    step_ms = report.device_step_ms
    if not step_ms or work.ms_per_step < report.threshold * step_ms or work.ms_per_step <= work.noise_ms:
        return False
    report.bottlenecks.append(
        Bottleneck(
            stage=LOOP_WORK,
            kind=MAIN_PROCESS,
            added_ms=work.ms_per_step,
            noise_ms=work.noise_ms,
            share_of_baseline=work.ms_per_step / report.baseline_step_ms if report.baseline_step_ms else 0.0,
            between=(DEVICE, DEVICE),
            cpu_saturated=False,
            recommendation=f"Timed {part.detail}. " + part.advice(main.workers),
            basis=LOOP_BASIS,  # its CPU share is in the recommendation's timing
        )
    )
    report.bottlenecks.sort(key=lambda b: b.added_ms, reverse=True)
    main.loop_named = True
    return True
