"""What the ladder cannot see, added to a finished report (:mod:`fastpipe.diagnosis.unseen`): the training process's
own work for the loader (and, when it explains the ladder's collate/IPC span, named in its place), a stream's
duplicates and uneven shares, and, on request, the start-up split. Each is a short pass of its own after the ladder,
outside every timed step; a pass that fails leaves its section out with a note, never the report."""

from __future__ import annotations

from typing import Any

from fastpipe.diagnosis.unseen._main_process import measure_main_process
from fastpipe.diagnosis.unseen._startup import measure_startup
from fastpipe.diagnosis.unseen._streams import check_stream
from fastpipe.diagnosis.verdict._main_process import name_main_process
from fastpipe.diagnosis.verdict._report import Report


def add_unseen(report: Report, loader: Any, *, startup: bool, timeout: float) -> None:
    """Measure and add the sections (module docstring) to ``report``; Ctrl-C marks the report interrupted."""
    passes = [("main process", _main_process), ("stream check", _streams)] + ([("start-up", _startup)] if startup else [])
    for what, run in passes:
        try:
            run(report, loader, timeout)
        except KeyboardInterrupt:
            report.interrupted = True
            return
        except Exception as exc:  # the user's code failing in a pass of its own: the ladder's figures stand
            report.notes.append(f"the {what} pass could not run ({type(exc).__name__}: {exc})")


def _main_process(report: Report, loader: Any, timeout: float) -> None:
    report.main_process = measure_main_process(loader)
    name_main_process(report, report.main_process)


def _streams(report: Report, loader: Any, timeout: float) -> None:
    report.streams = check_stream(loader, timeout=timeout)


def _startup(report: Report, loader: Any, timeout: float) -> None:
    report.startup = measure_startup(loader, timeout=timeout)
