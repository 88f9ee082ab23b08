"""Start-up, measured and explained: the time to the first batch, split along its critical path, and what each fix saves.

One pass starts the user's loader (rebuilt with every setting kept) around a stamped copy of the dataset and takes its
first batches; each worker writes down, on the system-wide monotonic clock, when the dataset reached it (under
``spawn`` and ``forkserver``: the unpickling of the dataset, stamped before and after by markers pickled around it),
when its ``worker_init_fn`` ran, and when it fetched and collated its first batch. Worker 0 delivers the first batch,
so the wait splits along its timeline, from ``iter(loader)`` to the batch in the loop (the parts add up to the wait):

* **worker start**: the process started and its imports (a fresh interpreter imports torch under spawn);
* **dataset transfer**: the dataset pickled by the training process, through the pipe, unpickled (0 under fork);
* **worker_init_fn**;
* **waiting for the other workers**: ``iter()`` starts the workers one after another in the training process
  (each one's transfer included) and hands out the first indices only then;
* **first fetch**: the first batch loaded and collated; **to the loop**: its way through shared memory.

The wait is ``max(worker 0 ready, every worker started) + first fetch + to the loop``, and each fix changes one term,
which gives its projected saving (:meth:`Startup.fixes`): a lighter dataset object (the large attributes of
:mod:`._transfer` left out of what is pickled), ``worker_init_fn`` made cheap, ``fork`` where the platform has it,
fewer workers. Each start is a whole short epoch (the first batches of the loader's own order), read to its end as a
run's epochs are. What ``persistent_workers`` saves is measured, not projected from the split: a later epoch without
them waits for the old workers' shutdown (in the epoch's last ``next()``) and a fresh start's first batch, a later epoch
with them for the kept workers' reset and their first batch. A fresh worker's first fetch is no warm fetch (a store
opened lazily in each worker, the first decode's set-up, the first batch's shared-memory channel): persistent workers
save that too, and the split's first fetch cannot tell how much of it is warm-up.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from torch.utils.data import DataLoader, IterableDataset

import fastpipe.diagnosis.unseen._startup_stamps as _startup_stamps
from fastpipe.diagnosis.unseen._transfer import Transfer, measure_transfer
from fastpipe.loading._rebuild import rebuild_loader

#: Batches after the first in each epoch of the pass, per worker: an epoch of the pass is ``workers * (1 + AFTER_FIRST)``
#: batches, read to its end.
AFTER_FIRST = 1
TRANSFER = "dataset transfer to worker 0 (pickled, piped, unpickled)"
#: Pairs of later epochs (with and without persistent workers) at most, and how close two pairs' savings must be to stop.
PAIRS = 3
AGREE = 0.25
#: A fix is listed when it saves at least this share of the wait (and 10 ms).
WORTH = 0.05


@dataclass
class Fix:
    name: str
    saves_s: float
    """Projected seconds saved, per start (each epoch's without persistent workers) unless ``per_epoch`` says otherwise."""
    how: str
    per_epoch: bool = False
    """The saving comes at every epoch after the first (persistent workers)."""


@dataclass
class Startup:
    """The time to the first batch, split (module docstring), the restart each epoch pays, and the fixes."""

    start_method: str
    workers: int
    persistent: bool
    first_batch_s: float
    parts: list[tuple[str, float]] = field(default_factory=list)
    """Worker 0's timeline from ``iter(loader)`` to the first batch in the loop: (part, seconds), adding up to the wait."""
    all_started_s: float = 0.0
    """``iter(loader)``: every worker started by the training process, one after another."""
    worker0_ready_s: float = 0.0
    """Worker 0 ready to fetch: started, the dataset received, ``worker_init_fn`` run."""
    first_fetch_s: float = 0.0
    to_loop_s: float = 0.0
    transfer_s: list[float] = field(default_factory=list)
    """Each worker's dataset transfer (its unpickling, stamped inside it); empty under fork."""
    init_s: list[float] = field(default_factory=list)
    """Each worker's ``worker_init_fn``."""
    restart_s: float | None = None
    """What a later epoch waits without persistent workers: the old workers' shutdown (the last ``next()`` of an epoch)
    and a fresh start's first batch."""
    kept_s: float | None = None
    """What a later epoch waits with persistent workers, measured: the last ``next()`` of an epoch and the first batch
    of the next, from the kept workers (reset, then a fetch in a worker that has fetched before)."""
    transfer: Transfer | None = None
    fork_start_s: float | None = None
    """One ``fork`` of this process, timed (the platform allows fork and the loader does not use it)."""
    fixes: list[Fix] = field(default_factory=list)
    seconds: float = 0.0
    """What this pass cost."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """The report's start-up section."""
        how = f"{self.workers} workers, {self.start_method}, persistent_workers={self.persistent}"
        out = [f"Start-up ({how}): the first batch took {self.first_batch_s:.2f} s after iter(loader):"]
        for name, seconds in self.parts:
            out.append(f"  - {name}: {seconds:.2f} s ({seconds / self.first_batch_s:.0%})" if self.first_batch_s > 0 else f"  - {name}")
        t = self.transfer
        if t is not None and t.nbytes is not None:
            where = "each worker receives it at every start" if self.start_method != "fork" else "fork shares it, nothing is sent"
            out.append(
                f"  the dataset pickles to {_mb(t.nbytes)} ({where}; pickled here in {t.pickle_s:.2f} s, unpickled in {t.unpickle_s:.2f} s)"
            )
            out += [f"    {a.path}: {_mb(a.nbytes)} ({a.kind})" for a in t.large[:5]]
        elif t is not None and t.error:
            out.append(f"  the dataset does not pickle ({t.error}): spawn and forkserver need it to")
        if self.restart_s is not None:
            out.append(
                f"  every later epoch waits {self.restart_s:.2f} s again (persistent_workers=False: the workers are shut down at "
                "each epoch's end and started anew)"
            )
        if self.restart_s is not None and self.kept_s is not None:
            out.append(
                f"  with persistent_workers=True a later epoch waits {self.kept_s:.2f} s (measured: the workers kept, their first "
                "fetch warm)"
            )
        if self.fixes:
            out.append("  fixes, largest saving first (projected from the parts above; persistent_workers' measured as above):")
            out += [f"    - {f.name}: saves {f.saves_s:.2f} s{' per epoch' if f.per_epoch else ''}. {f.how}" for f in self.fixes]
        later = ", then later epochs with and without persistent workers, in pairs" if self.restart_s is not None else ""
        out.append(f"  (this pass cost {self.seconds:.1f} s: a start of the loader{later}; each epoch a few batches)")
        return out

    def markdown_lines(self) -> list[str]:
        lines = self.lines()
        nested = [f"{'  ' if line.startswith('    ') else ''}- {line.strip().removeprefix('- ')}" for line in lines[1:]]
        return ["", f"#### {lines[0].rstrip(':')}", "", *nested]

    def project(self, *, ready_s: float | None = None, started_s: float | None = None) -> float:
        """The wait with worker 0 ready after ``ready_s`` and every worker started after ``started_s`` (module docstring)."""
        ready = self.worker0_ready_s if ready_s is None else ready_s
        started = self.all_started_s if started_s is None else started_s
        return max(ready, started) + self.first_fetch_s + self.to_loop_s


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def _start_method(loader: DataLoader) -> str:
    context = loader.multiprocessing_context
    if context is None:
        return multiprocessing.get_start_method()
    return context if isinstance(context, str) else context.get_start_method()


def _time_fork() -> float | None:
    """One fork of this process (start and exit of a child that does nothing), or None where fork is not allowed."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return None
    context = multiprocessing.get_context("fork")
    start = time.monotonic()
    child = context.Process(target=os.getpid)
    child.start()
    child.join()
    return time.monotonic() - start


STANDALONE = "_fastpipe_startup_stamps"
"""The stamps' module as the workers import it under spawn and forkserver: a copy outside the fastpipe package."""


@contextlib.contextmanager
def _stamps_module(method: str, folder: str) -> Iterator[Any]:
    """The module whose classes stamp a worker's start. Under fork, the package's own (nothing is imported). Under spawn
    and forkserver a worker imports the module of every class it unpickles, and importing the package's would import
    all of fastpipe first (as long again as torch on a busy machine): a figure of the measurement, not of the pipeline.
    So the workers get a copy of the module (stdlib and torch.utils.data only) under a top-level name, in a folder put on
    ``sys.path``, which multiprocessing hands to every worker it starts."""
    if method == "fork":
        yield _startup_stamps
        return
    Path(folder, f"{STANDALONE}.py").write_text(Path(_startup_stamps.__file__).read_text())
    sys.path.insert(0, folder)
    try:
        importlib.invalidate_caches()
        yield importlib.import_module(STANDALONE)
    finally:
        sys.path.remove(folder)
        sys.modules.pop(STANDALONE, None)


def _short_epochs(loader: DataLoader, dataset: Any, **overrides: Any) -> DataLoader:
    """``loader`` rebuilt around ``dataset`` (every setting kept but ``overrides``), its epochs the first
    ``workers * (1 + AFTER_FIRST)`` batches of its own order, drawn from a copy of its sampler (the user's is not moved).
    A stream stops itself (:func:`._startup_stamps.stamped`'s ``limit``)."""
    run = rebuild_loader(loader, dataset, **overrides)
    if isinstance(dataset, IterableDataset):
        return run
    batches = run.num_workers * (1 + AFTER_FIRST)
    if run.batch_size is not None:
        return rebuild_loader(run, dataset, sampler=[i for batch in itertools.islice(run.batch_sampler, batches) for i in batch])
    if run.batch_sampler is not None:
        return rebuild_loader(run, dataset, batch_sampler=list(itertools.islice(run.batch_sampler, batches)))
    return rebuild_loader(run, dataset, sampler=list(itertools.islice(run.sampler, batches)))


def _epoch(loader: DataLoader, folder: Path | None) -> tuple[float, float, float, dict[int, dict[str, Any]]]:
    """(iter seconds, first batch seconds, end seconds, worker stamps) of one epoch of ``loader``, read to its end. The
    end is the last ``next()``: it shuts the workers down unless they persist. Stamps are written into ``folder`` by
    workers that start in this epoch (kept workers write none); None: not written."""
    if folder is not None:
        folder.mkdir()
    loader.dataset.__dict__["_folder"] = None if folder is None else str(folder)
    start = time.monotonic()
    iterator = iter(loader)
    started = time.monotonic()
    next(iterator)
    first = last = time.monotonic()
    for _ in iterator:
        last = time.monotonic()
    end_s = time.monotonic() - last
    stamps = {int(p.stem): json.loads(p.read_text()) for p in folder.glob("*.json")} if folder is not None else {}
    for stamp in stamps.values():
        stamp["t0"] = start
    return started - start, first - start, end_s, stamps


def _later_epochs(kept: DataLoader, fresh: DataLoader) -> tuple[float, float]:
    """(without, with persistent workers): the median wait of a later epoch, each the last ``next()`` of an epoch and the
    first batch of the next, measured in pairs (kept, fresh), :data:`PAIRS` at most; two pairs whose differences agree
    within :data:`AGREE` suffice. One pair alone is the difference of two single first batches: on a busy machine their
    fetches alone differ by more than a light start costs. One pair suffices where the kept workers' wait is under
    :data:`AGREE` of the restart: the start dominates, and the fetches' noise cannot move the saving by that much (a
    start of seconds is not repeated to learn it more precisely)."""
    restarts: list[float] = []
    kepts: list[float] = []
    for _ in range(PAIRS):
        _, first_s, end_s, _ = _epoch(kept, None)
        kepts.append(end_s + first_s)
        _, first_s, end_s, _ = _epoch(fresh, None)
        restarts.append(end_s + first_s)
        if len(restarts) == 1 and kepts[0] < AGREE * restarts[0]:
            break
        if len(restarts) == 2:
            a, b = (r - k for r, k in zip(restarts, kepts))
            if abs(a - b) <= max(0.010, AGREE * abs(a + b) / 2):
                break
    return statistics.median(restarts), statistics.median(kepts)


def _close(loader: DataLoader) -> None:
    """Shut down the workers a persistent loader keeps, as its garbage collection would."""
    shutdown = getattr(getattr(loader, "_iterator", None), "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def measure_startup(loader: Any, *, timeout: float = 300.0) -> Startup | None:
    """Start ``loader`` (rebuilt, every setting kept) and split the wait for its first batch (module docstring); without
    persistent workers, measure a later epoch's wait with and without them.

    None for a loader that is no DataLoader or has no workers (its first batch is then its first fetch, in the steady
    state the ladder measures).
    """
    if not isinstance(loader, DataLoader) or loader.num_workers == 0:
        return None
    began = time.monotonic()
    method = _start_method(loader)
    limit = (1 + AFTER_FIRST) * (loader.batch_size or 1)
    with tempfile.TemporaryDirectory(prefix="fastpipe-startup-") as tmp, _stamps_module(method, tmp) as stamps_module:
        wrapper, init_fn, collate_fn = stamps_module.stamped(loader.dataset, loader.worker_init_fn, loader.collate_fn, limit=limit)
        stamped = dict(timeout=timeout, worker_init_fn=init_fn, collate_fn=collate_fn)
        kept = _short_epochs(loader, wrapper, persistent_workers=True, **stamped)  # its first start is any loader's
        iter_s, first_s, _, stamps = _epoch(kept, Path(tmp) / "1")
        restart_s = kept_s = None
        if not loader.persistent_workers:
            restart_s, kept_s = _later_epochs(kept, rebuild_loader(kept, wrapper, persistent_workers=False))  # the same batches
        _close(kept)
        del kept, wrapper
    transfer = measure_transfer(loader.dataset) if method in ("spawn", "forkserver") else None
    startup = _split(method, loader, iter_s, first_s, stamps, 0.0 if transfer is None else transfer.pickle_s)
    startup.restart_s, startup.kept_s = restart_s, kept_s
    startup.transfer = transfer
    if method != "fork":
        startup.fork_start_s = _time_fork()
    startup.fixes = fixes(startup, getattr(loader.dataset, "__class__", type(None)).__name__)
    startup.seconds = time.monotonic() - began
    return startup


def _split(method: str, loader: DataLoader, iter_s: float, first_s: float, stamps: dict[int, dict[str, Any]], pickle_s: float) -> Startup:
    """The parts of the wait along worker 0's timeline. A worker's transfer is the training process pickling the dataset
    (``pickle_s``, timed apart: multiprocessing pickles the whole process object before it starts the worker) and the
    worker reading and unpickling it (its stamps)."""
    out = Startup(method, loader.num_workers, bool(loader.persistent_workers), first_s, all_started_s=iter_s)
    w0 = stamps.get(0)
    out.transfer_s = [pickle_s + s["unpickled"][1] - s["unpickled"][0] for s in stamps.values() if s.get("unpickled")]
    out.init_s = [s["init"][1] - s["init"][0] for s in stamps.values() if s.get("init")]
    if w0 is None or not w0.get("fetch") or not w0.get("init"):
        out.parts = [("the first batch (the workers' stamps were not written: the split is unknown)", first_s)]
        return out
    t0 = w0["t0"]
    transfer = pickle_s + w0["unpickled"][1] - w0["unpickled"][0] if w0.get("unpickled") else 0.0
    init_start, init_end = w0["init"]
    fetch_start, fetch_end = w0["fetch"]
    out.worker0_ready_s = init_end - t0
    out.first_fetch_s = fetch_end - fetch_start
    out.to_loop_s = max(0.0, first_s - (fetch_end - t0))
    out.parts = [
        (f"worker start (process and imports, {method})", max(0.0, init_start - t0 - transfer)),
        (TRANSFER if w0.get("unpickled") else "dataset transfer to worker 0 (none: fork shares the parent's memory)", transfer),
        ("worker_init_fn", init_end - init_start),
        ("waiting for the other workers to start (one after another, in the training process)", max(0.0, fetch_start - init_end)),
        ("first fetch (load and collate the first batch)", out.first_fetch_s),
        ("to the loop (through shared memory)", out.to_loop_s),
    ]
    return out


def fixes(s: Startup, dataset_name: str) -> list[Fix]:
    """Each fix's projected saving, from the split (module docstring); those worth it, largest first."""
    now = s.project()
    found: list[Fix] = []
    if s.restart_s is not None and s.kept_s is not None:
        found.append(
            Fix(
                "persistent_workers=True",
                s.restart_s - s.kept_s,
                "DataLoader(..., persistent_workers=True): the workers, and the dataset they hold, are kept from one epoch to the next.",
                per_epoch=True,
            )
        )
    if s.init_s:
        init0 = dict(s.parts).get("worker_init_fn", 0.0)
        found.append(
            Fix(
                "a cheaper worker_init_fn",
                now - s.project(ready_s=s.worker0_ready_s - init0),
                f"worker_init_fn takes up to {max(s.init_s):.2f} s in each worker: do the expensive part once, in the training process before the DataLoader is built (fork shares it), or lazily on first use.",
            )
        )
    t = s.transfer
    if t is not None and t.nbytes and t.large:
        share = min(1.0, t.large_bytes / t.nbytes)
        transfer0 = s.transfer_s[0] if s.transfer_s else 0.0
        saved = now - s.project(ready_s=s.worker0_ready_s - share * transfer0, started_s=s.all_started_s - share * sum(s.transfer_s))
        names = ", ".join(a.path.split(".", 1)[-1] for a in t.large[:3])
        found.append(
            Fix(
                f"a lighter {dataset_name}",
                saved,
                f"{names} ({_mb(t.large_bytes)} of its {_mb(t.nbytes)}) travel to every worker at every start: keep them in a file each worker opens (a NumPy memmap, an Arrow or HDF5 file) or in a torch tensor (shared memory, not pickled).",
            )
        )
    if s.fork_start_s is not None:
        ready = s.fork_start_s + (s.init_s[0] if s.init_s else 0.0)
        found.append(
            Fix(
                "fork instead of " + s.start_method,
                now - s.project(ready_s=ready, started_s=s.workers * s.fork_start_s),
                "multiprocessing_context='fork' (Linux): workers start as copies of the training process, nothing imported or sent; unsafe once CUDA is initialised or threads run in the training process before the loader starts its workers.",
            )
        )
    if s.workers > 1:
        fewer = max(1, s.workers // 2)
        found.append(
            Fix(
                f"{fewer} worker{'s' if fewer > 1 else ''} instead of {s.workers}",
                now - s.project(started_s=s.all_started_s * fewer / s.workers),
                "fewer workers start sooner (projected from the serial starts alone: on busy cores fewer workers also fetch their first batches sooner); only where the steady state still keeps up with the step (fastpipe tune finds the fewest that do).",
            )
        )
    worth = max(0.010, WORTH * s.first_batch_s)
    return sorted([f for f in found if f.saves_s >= worth], key=lambda f: f.saves_s, reverse=True)
