"""The diagnosis report's memory section: what each cache point held, the loader's growth and shared-memory peak.

Measuring memory must not perturb the timing, so nothing here runs inside a timed step:

* **At every cache point, once, between measurement windows.** When a point's timed steps end and before its loader
  is closed, :func:`point_memory` reads each of the point's workers' USS and PSS (``/proc/PID/smaps``, a few
  milliseconds a worker), the shared memory the loader's processes hold, the training process's RSS and the pinned
  bytes. This is what the point held at its end, not a peak: an input-bound point's loop takes batches as soon as
  they come, so fewer of them wait in shared memory than at the peak.
* **The loader pass**, on by default (``DiagnoseOptions(loader_memory=False)`` or ``fastpipe diagnose --no-memory``
  turns it off): after the ladder and the stage costs, one short pass of
  :func:`~fastpipe.diagnosis.memory._loader.measure_loader_memory` over a rebuilt copy of the user's loader,
  bounded by the per-point budget (at least :data:`MIN_PASS_S`): the peak shared memory (the loop stalls until every batch in flight waits) against
  the prediction, and each worker's USS growth per 1,000 samples; copy-on-read growth is then named
  (:mod:`~fastpipe.diagnosis.memory._copy_on_read`). A separate pass, because growth needs samples counted per worker
  (a wrapper around the dataset) and the peak needs a stalled loop: neither belongs in a timed run.
* **The budget check**, before any worker starts (:func:`~fastpipe.diagnosis.memory._loader.loader_budget_warning`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil
from torch.utils.data import IterableDataset

from fastpipe._render import render_table
from fastpipe.diagnosis.memory._copy_on_read import name_copy_on_read
from fastpipe.diagnosis.memory._loader import (
    LoaderMemory,
    loader_budget_warning,
    measure_loader_memory,
    private_memory,
)
from fastpipe.diagnosis.memory._probes import pinned_host_bytes, shm_segments
from fastpipe.diagnosis.memory._shm_budget import loader_settings, size_text
from fastpipe.diagnosis.runtime import _ddp as ddp
from fastpipe.diagnosis.runtime._timeout import within as _within
from fastpipe.loading._protocols import stages_outside_workers

#: The loader pass's least time: its stall needs the loader's batches in flight to fill and then 2 s of quiet.
MIN_PASS_S = 10.0
#: The longest the budget check may take to read its sample before the check is skipped.
CHECK_TIMEOUT_S = 30.0
#: The loader pass reads up to this many samples within its time: a fast loader gives growth more samples to resolve.
PASS_SAMPLES = 20_000


@dataclass
class PointMemory:
    """What one cache point's processes held when its timed steps ended (the largest over its runs); bytes."""

    cache_point: str
    uss: list[int] = field(default_factory=list)
    """Each worker's unique memory (its batches in shared memory left out: they are ``shm_held``)."""
    pss: list[int] = field(default_factory=list)
    shm_held: int | None = None
    """The shared-memory segments the training process and the workers held: batches in flight."""
    rss: int = 0
    """The training process's resident set."""
    pinned: int | None = None
    """Pinned host memory (CUDA's host allocator); None without CUDA."""

    def merged(self, other: PointMemory) -> PointMemory:
        """The larger of two runs' figures, each figure on its own (a point remeasured keeps its largest)."""

        def most(a: list[int], b: list[int]) -> list[int]:
            return [max(x, y) for x, y in zip(a, b)] + (a[len(b) :] if len(a) > len(b) else b[len(a) :])

        def top(a: int | None, b: int | None) -> int | None:
            return b if a is None else a if b is None else max(a, b)

        return PointMemory(
            self.cache_point, most(self.uss, other.uss), most(self.pss, other.pss), top(self.shm_held, other.shm_held),
            max(self.rss, other.rss), top(self.pinned, other.pinned),
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def child_pids() -> set[int]:
    """The pids of this process's children now (taken before a point's loader starts, to tell its workers apart)."""
    try:
        return {c.pid for c in psutil.Process().children()}
    except psutil.Error:
        return set()


def point_memory(point: str, known: set[int]) -> PointMemory | None:
    """Read what ``point``'s processes hold now: the workers are this process's children not in ``known``.

    None when psutil cannot read this process (the figures are extra: they never fail a measurement).
    """
    try:
        me = psutil.Process()
        workers = sorted(child_pids() - known)
        rss = int(me.memory_info().rss)
    except psutil.Error:
        return None
    sizes = [s for s in (private_memory(pid) for pid in workers) if s is not None]
    return PointMemory(
        cache_point=point,
        uss=[uss for uss, _ in sizes],
        pss=[pss for _, pss in sizes],
        shm_held=sum(shm_segments([me.pid, *workers]).values()),
        rss=rss,
        pinned=pinned_host_bytes(),
    )


@dataclass
class MemorySection:
    """The report's memory section (see the module docstring for what is measured when)."""

    points: list[PointMemory] = field(default_factory=list)
    loader: LoaderMemory | None = None
    """The loader pass, when it ran."""
    copy_on_read: Any = None
    """A :class:`~fastpipe.diagnosis.memory._copy_on_read.CopyOnReadFinding` when the workers grew and a container was found."""
    budget_warning: str | None = None
    """The shared-memory budget check's warning, given before any worker started; None when the loader fits."""
    not_run: str | None = None
    """Why the loader pass did not run."""
    interrupted: bool = False
    """Ctrl-C stopped the loader pass."""

    def caveat(self) -> str:
        """The report's caveat when the budget check warned (its fixes are in the memory section)."""
        first = (self.budget_warning or "").splitlines()[0] if self.budget_warning else ""
        return f"{first} The fixes are listed in the memory section."

    def to_dict(self) -> dict[str, Any]:
        return {
            "points": [p.to_dict() for p in self.points],
            "loader": None if self.loader is None else self.loader.to_dict(),
            "copy_on_read": None if self.copy_on_read is None else self.copy_on_read.to_dict(),
            "budget_warning": self.budget_warning,
            "loader_pass_not_run": self.not_run,
            "interrupted": self.interrupted,
        }

    HEADERS = ("cache point", "workers' USS", "workers' PSS", "shm held", "training RSS", "pinned")
    POINTS_NOTE = (
        "Each point's memory was read once, when its timed steps ended (not during them): what it held then, not its peak. "
        "USS: each worker's own memory, its batches in shared memory left out (they are 'shm held', with the training "
        "process's)."
    )

    def _rows(self, label: Any) -> list[tuple[str, ...]]:
        def workers(values: list[int]) -> str:
            return " / ".join(size_text(v) for v in values) if values else "no workers"

        return [
            (label(p.cache_point), workers(p.uss), workers(p.pss), size_text(p.shm_held), size_text(p.rss),
             "n/a (no CUDA)" if p.pinned is None else size_text(p.pinned))
            for p in self.points
        ]  # fmt: skip

    def lines(self) -> list[str]:
        """What the loader pass found, the copy-on-read finding and the budget warning, as lines."""
        out = []
        if self.budget_warning:
            out.append("Warned before any worker started: " + self.budget_warning)
        if self.loader is None:
            out.append(f"Loader pass (growth per 1,000 samples, shared-memory peak): not run ({self.not_run or 'not asked for'}).")
        if self.copy_on_read is not None:
            out += self.copy_on_read.lines()
        return out

    def to_text(self, label: Any) -> str:
        """The points' table, then the loader pass's table (per worker), then the findings; ``label`` names a point."""
        text = render_table("Memory at each cache point", [(h, "left" if h == "cache point" else "right") for h in self.HEADERS],
                            self._rows(label), [self.POINTS_NOTE])  # fmt: skip
        if self.loader is not None:
            text += self.loader.to_table()
        rest = self.lines()
        return text + ("\n".join(rest) + "\n" if rest else "")

    def to_markdown(self, label: Any) -> list[str]:
        out = ["", "#### Memory", "", "| " + " | ".join(self.HEADERS) + " |", "|---|" + "---:|" * (len(self.HEADERS) - 1)]
        out += [f"| {' | '.join(row)} |" for row in self._rows(label)]
        out += ["", self.POINTS_NOTE]
        if self.loader is not None:
            loader = self.loader
            out += ["", f"Loader pass ({loader.samples} samples, {loader.seconds:.1f} s):", "",
                    "| worker | samples read | USS start | USS peak | USS growth / 1k samples | PSS peak |", "|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
            for w in loader.workers:
                growth = "n/a" if w.growth_per_1000 is None else f"{size_text(w.growth_per_1000)} ± {size_text(w.growth_stderr)}"
                out.append(
                    f"| {w.worker} | {w.samples} | {size_text(w.uss_start)} | {size_text(w.uss_peak)} | {growth} | {size_text(w.pss_peak)} |"
                )
            out += [""] + [f"{line}  " for line in loader.lines()]
        out += [""] + [f"{line}  " for line in self.lines()]
        return out

    def bars(self) -> list[tuple[str, float]]:
        """(label, MB) for the picture: the shared-memory peak against its prediction, each worker's USS peak, the RSS."""
        loader = self.loader
        if loader is None:
            return []
        out = [("shm predicted peak", loader.prediction.shm_bytes / 1e6)]
        if loader.shm_peak is not None:
            out.append((f"shm measured peak{'' if loader.settled else ' (at least)'}", loader.shm_peak / 1e6))
        out += [(f"worker {w.worker} USS peak", w.uss_peak / 1e6) for w in loader.workers]
        out.append(("training process RSS peak", loader.main_rss_peak / 1e6))
        if loader.pinned_peak is not None:
            out.append(("pinned host memory", loader.pinned_peak / 1e6))
        return out


def start_memory_section(workload: Any, on_warning: Callable[[str], None] | None, timeout: float | None = None) -> MemorySection:
    """The section, with the shared-memory budget checked before any worker starts; the warning goes to ``on_warning``
    (default :func:`warnings.warn`) at once.

    The check reads one sample in this process, in a daemon thread given at most ``timeout`` seconds (capped at
    :data:`CHECK_TIMEOUT_S`), as the plan's probe does: a dataset that fails or hangs here is left to the
    measurement, which reports it with its stage, and the check is skipped.
    """
    warning = None
    limit = CHECK_TIMEOUT_S if timeout is None else min(timeout, CHECK_TIMEOUT_S)
    try:
        warning = _within(limit, lambda: loader_budget_warning(workload.loader), "the shared-memory check's sample")
    except Exception:  # noqa: BLE001 - the user's own code: the ladder runs it again and reports it with its stage
        warning = None
    if warning:
        if on_warning is None:
            warnings.warn(warning, RuntimeWarning, stacklevel=3)
        else:
            on_warning(warning)
    return MemorySection(budget_warning=warning)


def _why_no_pass(workload: Any) -> str | None:
    loader = workload.loader
    if stages_outside_workers(loader):
        return "the stages run outside DataLoader workers"
    if isinstance(loader.dataset, IterableDataset):
        return "it counts the samples each worker reads by index, and an IterableDataset has none"
    workers, _, slots = loader_settings(loader)
    if workers == 0 and slots is None:
        return "the loader has no workers: no batch goes through shared memory and there is no worker to grow"
    if ddp.world() is not None:
        return "under DDP, where every rank would have to run it alike"
    return None


def finish_memory_section(
    section: MemorySection,
    points: dict[str, PointMemory],
    order: list[str],
    workload: Any,
    device: Any,
    *,
    loader_pass: bool,
    budget_s: float,
) -> MemorySection:
    """The section with each measured point's figures (in the report's order) and, when asked, the loader pass's."""
    section.points = [points[p] for p in order if p in points]
    why_not = None if loader_pass else "turned off by DiagnoseOptions(loader_memory=False) or --no-memory"
    why_not = why_not or _why_no_pass(workload)
    if why_not is not None:
        section.not_run = why_not
        return section
    try:
        section.loader = measure_loader_memory(
            workload.loader, check=False, device=device, samples=PASS_SAMPLES, budget_s=max(budget_s, MIN_PASS_S)
        )
    except KeyboardInterrupt:
        section.interrupted, section.not_run = True, "interrupted"
        return section
    except Exception as exc:  # noqa: BLE001 - the user's pipeline failing now: the ladder's figures still stand
        section.not_run = f"it failed: {type(exc).__name__}: {exc}"
        return section
    loader = section.loader
    section.copy_on_read = name_copy_on_read(workload.loader.dataset, loader.growth_per_1000, loader.grows)
    return section
