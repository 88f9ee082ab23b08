"""A loader's own stage costs over the baseline point's timed steps (the ThreadLoader's threads), for the report.

Why: a DataLoader's stages are timed inside its workers (:mod:`fastpipe.diagnosis.stagecost`), in one more
pass. A loader without workers that keeps its own clocks (:class:`~fastpipe.loading.TimesOwnStages`: the
ThreadLoader's reading, decoding and loop threads) needs no extra pass: :class:`StageWindow` reads the clocks
when the baseline point's warm-up ends and after each of its timed steps, and the difference is what those
steps cost, the warm-up left out. Every run of the baseline (a remeasurement too) adds its window.

Each figure is the time of the thread the table names (for the decode, run by native threads, their time over
the threads it has: what it takes of that many cores): per image the stage handled, per timed step, and as a
share of the loop's wall time over those steps. Threads overlap (the reading thread reads the next batch while
the decoding threads decode earlier ones, and all work while the loop runs its step), so the shares do not add
up to 100%, and the report says so rather than scaling them to.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from fastpipe.loading._protocols import StageClocks, TimesOwnStages

SCHEMA = "fastpipe.loaderstages/1"
WAIT = "wait"
"""The loop's wait for a batch: the symptom the other stages explain, never the stage advice names."""


class StageWindow:
    """The clocks of one measured run of the baseline: read when its warm-up ends and after each timed step.

    Pass :meth:`on_step` as ``measure_until``'s ``on_step`` (called after every step, warm-up included), and call
    :meth:`begin` before the run when there is no warm-up. Reading the clocks copies a few counters: microseconds.
    """

    def __init__(self, loader: TimesOwnStages, warmup: int) -> None:
        self.loader: TimesOwnStages | None = loader
        self.loader_name, self.warmup = type(loader).__name__, warmup
        self.start: tuple[float, StageClocks] | None = None
        self.end: tuple[float, StageClocks] | None = None
        self.steps = 0

    def begin(self) -> None:
        """Start the window now (before a run without warm-up)."""
        if self.warmup == 0 and self.loader is not None:
            self.start = (time.perf_counter(), self.loader.stage_clocks())

    def on_step(self, i: int) -> None:
        """After step ``i`` (``0 .. warmup-1`` are the warm-up): the last warm-up step opens the window, each later one moves its end."""
        if self.loader is None:
            return
        if i == self.warmup - 1:
            self.start = (time.perf_counter(), self.loader.stage_clocks())
        elif i >= self.warmup and self.start is not None:
            self.end = (time.perf_counter(), self.loader.stage_clocks())
            self.steps = i - self.warmup + 1

    def finish(self) -> "StageWindow":
        """The run is over: let go of the loader (its batch buffers are freed with it), keep the figures."""
        self.loader = None
        return self

    def and_then(self, other: Callable[[int], None]) -> Callable[[int], None]:
        """An ``on_step`` that reads the clocks first, then calls ``other`` (the progress line)."""

        def both(i: int) -> None:
            self.on_step(i)
            other(i)

        return both

    @property
    def complete(self) -> bool:
        return self.start is not None and self.end is not None and self.steps > 0


@dataclass
class LoaderStageCost:
    """One stage of the loader over the timed steps: the wall time of the thread it runs on."""

    stage: str
    thread: str
    """Whose time it is (``reading thread``, ``decoding thread(s)``, ``loop thread``)."""
    what: str
    ms_per_image: float | None
    """Milliseconds per image the stage handled in the window (None when it handled none)."""
    ms_per_step: float
    """Milliseconds of its thread's wall time per timed step of the loop."""
    share_of_step: float
    """Its seconds over the loop's wall seconds in the window (threads overlap: the shares need not add up to 1)."""
    threads: float | None
    """Threads per call, on average (the native threads the batch op has in all for ``decode``; 1 for a Python thread)."""
    images: int
    calls: int
    at_once: float | None = None
    """Threads that worked at once on average while the stage ran (given by clocks with ``busy_seconds``), else None."""


@dataclass
class LoaderStageCosts:
    """A self-timing loader's stage costs, summed over every timed window of the baseline point."""

    loader: str
    steps: int
    step_ms: float
    """The loop's mean wall time per timed step, on the host's clock (the window's own denominator)."""
    images: int
    """Images delivered to the loop in the window."""
    batches: int
    stages: list[LoaderStageCost] = field(default_factory=list)
    input_bound: bool | None = None
    """The diagnosis's verdict on the baseline (None: not given). Not input-bound, the loop's wait overlaps work the
    device already has queued: the table still shows where the threads' time goes, but none of it costs a step."""

    @classmethod
    def from_windows(cls, loader: str, windows: list[StageWindow]) -> "LoaderStageCosts | None":
        """The difference of the clocks over the complete ``windows``, pooled; None when no window is complete."""
        done = [w for w in windows if w.complete]
        if not done:
            return None
        totals: dict[str, dict[str, Any]] = {}
        wall = images = batches = steps = 0.0
        for w in done:
            (t0, first), (t1, last) = w.start, w.end  # type: ignore[misc]
            wall, steps = wall + t1 - t0, steps + w.steps
            images += last["images"] - first["images"]
            batches += last["batches"] - first["batches"]
            before = {c["stage"]: c for c in first["stages"]}
            for clock in last["stages"]:
                base = before.get(clock["stage"])
                total = totals.setdefault(
                    clock["stage"],
                    {"thread": clock["thread"], "what": clock["what"], "seconds": 0.0, "items": 0, "calls": 0, "threads": 0, "busy": None},
                )
                for key in ("seconds", "items", "calls", "threads"):
                    total[key] += clock[key] - (base[key] if base is not None else 0)  # type: ignore[literal-required]
                if "busy_seconds" in clock and (base is None or "busy_seconds" in base):
                    # only windows with the wall clock at both ends: their native threads' time over their busy time
                    earlier = base if base is not None else {"seconds": 0.0, "calls": 0, "threads": 0, "busy_seconds": 0.0}
                    calls = clock["calls"] - earlier["calls"]
                    if calls > 0:
                        per_call = (clock["threads"] - earlier["threads"]) / calls
                        total["native_seconds"] = total.get("native_seconds", 0.0) + (clock["seconds"] - earlier["seconds"]) * per_call
                        total["busy"] = (total["busy"] or 0.0) + clock["busy_seconds"] - earlier["busy_seconds"]
        stages = [
            LoaderStageCost(
                stage=name,
                thread=t["thread"],
                what=t["what"],
                ms_per_image=1e3 * t["seconds"] / t["items"] if t["items"] > 0 else None,
                ms_per_step=1e3 * t["seconds"] / steps,
                share_of_step=t["seconds"] / wall if wall > 0 else math.nan,
                threads=t["threads"] / t["calls"] if t["calls"] > 0 else None,
                images=int(t["items"]),
                calls=int(t["calls"]),
                at_once=_at_once(t),
            )
            for name, t in totals.items()
        ]
        return cls(loader, int(steps), 1e3 * wall / steps, int(images), int(batches), stages)

    def stage(self, name: str) -> LoaderStageCost:
        for s in self.stages:
            if s.stage == name:
                return s
        raise KeyError(f"no stage {name!r}; the stages are {[s.stage for s in self.stages]}")

    def dominant(self) -> LoaderStageCost | None:
        """The stage that takes most of its thread's time per step, the loop's wait left out (it is the symptom)."""
        working = [s for s in self.stages if s.stage != WAIT]
        return max(working, key=lambda s: s.ms_per_step) if working else None

    # ----- renderings --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = {"schema": SCHEMA, **asdict(self)}
        for stage in data["stages"]:
            stage["share_of_step"] = None if math.isnan(stage["share_of_step"]) else stage["share_of_step"]
        return data

    HEADERS = ("stage", "whose time", "ms/image", "ms/step", "of the step", "what it times")

    def title(self) -> str:
        return (
            f"Stage costs of the {self.loader} (its own clocks over the baseline point's {self.steps} timed steps, "
            f"{self.images} images; no workers to time):"
        )

    def rows(self) -> list[tuple[str, ...]]:
        rows = []
        for s in self.stages:
            thread = s.thread
            if s.stage == "decode" and s.threads is not None:
                thread += f" ({native(s.threads)})"
            per_image = "-" if s.ms_per_image is None else f"{s.ms_per_image:.3f}"
            share = "-" if math.isnan(s.share_of_step) else f"{s.share_of_step:.1%}"
            rows.append((s.stage, thread, per_image, f"{s.ms_per_step:.2f}", share, s.what))
        return rows

    def table_lines(self) -> list[str]:
        """The table as fixed-width plain text (the report embeds it as it embeds the in-worker stage costs)."""
        rows = [self.HEADERS, *self.rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(self.HEADERS))]
        left = (0, 1, 5)

        def fmt(row: tuple[str, ...]) -> str:
            return "  ".join(cell.ljust(w) if i in left else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))).rstrip()

        return [fmt(self.HEADERS), "  ".join("-" * w for w in widths), *(fmt(row) for row in rows[1:])]

    def summary_lines(self) -> list[str]:
        """What the figures are and are not: wall time of named threads that overlap, so no total."""
        decode = next((s for s in self.stages if s.stage == "decode"), None)
        decode_note = " (the decode's: see below)" if decode is not None and decode.threads is not None else ""
        lines = [
            f"Each figure is the wall time of the thread named{decode_note}, per image it handled and per timed step; 'of the step' is that "
            f"time over the loop's {self.step_ms:.1f} ms per step. The threads run at once (the reading thread reads the next "
            "batch while the decoding threads decode earlier ones, all while the loop runs its step), so the shares overlap and "
            "do not add up to 100%."
        ]
        if self.input_bound is False:
            lines.append(
                "The run is not input-bound: the loop's wait in next() overlaps the step the device is running, so none of "
                "these figures costs training time; they say where the loader's threads spend theirs."
            )
        if decode is not None and decode.threads is not None:
            line = (
                f"decode is the batch op's native threads' time over the {native(decode.threads)} that can decode its batches at "
                f"once (the time it takes of that many cores): their CPU time is up to {decode.threads:.3g}x that."
            )
            if decode.at_once is not None:
                line += f" While it ran, {decode.at_once:.2g} of them decoded at once on average."
            lines.append(line)
        return lines

    def lines(self) -> list[str]:
        """Title, table and what the figures mean: the report's section, as plain text."""
        return [self.title(), *self.table_lines(), *self.summary_lines()]

    def markdown_lines(self) -> list[str]:
        out = ["| " + " | ".join(self.HEADERS) + " |", "|---|---" + "|---:" * 3 + "|---|"]
        out += ["| " + " | ".join(row) + " |" for row in self.rows()]
        return [self.title(), "", *out, "", *(f"{line}  " for line in self.summary_lines())]


def _at_once(total: dict[str, Any]) -> float | None:
    """Native threads at work at once on average while the stage ran, at most the threads it has (None: not timed)."""
    busy, native_seconds = total.get("busy"), total.get("native_seconds")
    if not busy or native_seconds is None or total["calls"] <= 0:
        return None
    return min(native_seconds / busy, total["threads"] / total["calls"])


def native(threads: float) -> str:
    """``"2 native threads"``, ``"1 native thread"``, ``"1.5 native threads"`` (a mean over batches)."""
    return f"{threads:.3g} native thread{'' if threads == 1 else 's'}"
