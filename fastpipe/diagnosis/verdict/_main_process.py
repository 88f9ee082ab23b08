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

from fastpipe.diagnosis.ladder._plan import COLLATE
from fastpipe.diagnosis.unseen._main_process import SAMPLER_FIX, MainProcess

if TYPE_CHECKING:
    from fastpipe.diagnosis.verdict._report import Report

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
