"""``fastpipe.watch(loader)``: is my accelerator waiting for data? Answered during the real run, in any loop.

The watch wraps the iterable the loop already uses (a DataLoader, ``fastpipe.loading.recycled``, a ``DevicePrefetcher``,
any iterable of batches) and times each ``next()`` with the host clock (:mod:`fastpipe.monitor._ledger` says
why that is the input-bound share, and why nothing is synchronized). The loop itself is unchanged::

    for batch in fastpipe.watch(loader):    # instead of: for batch in loader:
        step(batch)

At the end of each epoch (or every ``every`` steps) it prints one line, sends the figures to ``log``, and, when
the loop waits 5% of its time or more, prints the exact ``fastpipe.diagnose`` call that finds which stage of the
pipeline is slow. Per step it costs two clock reads and a few additions (``benchmarks/bench_watch.py``).
"""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import Any, Callable, Iterable, Iterator

from fastpipe.errors import ConfigError
from fastpipe.monitor._ledger import WaitLedger, Window, band_for
from fastpipe.monitor._memory import MemorySnapshot, memory_snapshot
from fastpipe.monitor._sinks import make_sink

HINT_SHARE = 0.05
"""From this share on, the summary names the diagnosis to run next."""
PREFIX = "fastpipe.watch"
#: The metric names every sink and framework callback logs under (one spelling for all of them).
SHARE_METRIC = "fastpipe/input_bound_share"
WAIT_METRIC = "fastpipe/wait_ms_per_step"
MAX_LINES = 1000
"""Summary lines kept in ``Watch.lines`` (the latest), so ``every=1`` on a long run holds bounded memory."""


class Watch:
    """An iterable of the same batches as ``loader`` that records how long the loop waits for each.

    Args:
        loader: any iterable of batches; its attributes (``dataset``, ``batch_size``...) and ``len`` are forwarded.
        every: also summarize every this many steps (default: once per epoch only).
        log: where the figures go too: a ``logging.Logger``, a TensorBoard ``SummaryWriter`` (or its
            ``add_scalar``), or a callable taking a dict of metrics such as ``wandb.log``.
        echo: print the summary lines (to stdout, or call this function with each line).
        name: what to call the loader in the suggested ``fastpipe.diagnose`` call.
        device: the device to suggest to the diagnosis (default: the prefetcher's, else cuda when present, else cpu).
        memory: add the training process's RSS, the workers' USS and free ``/dev/shm`` to each summary.
        ends_epochs: an exhausted iterator ends the epoch (True); False when the loop's owner calls
            :meth:`end_epoch` (frameworks that exhaust their iterator one batch before their last step).
        hint: print the suggested diagnosis the first time a line reaches 5% (``fastpipe watch`` prints its own).
        suggest: the call to suggest instead of ``fastpipe.diagnose(loader, step, ...)`` (an integration's own).
    """

    def __init__(
        self,
        loader: Iterable[Any],
        *,
        every: int | None = None,
        log: Any = None,
        echo: "bool | Callable[[str], None]" = True,
        name: str = "loader",
        device: Any = None,
        memory: bool = True,
        ends_epochs: bool = True,
        hint: bool = True,
        suggest: str | None = None,
    ) -> None:
        if every is not None and (not isinstance(every, int) or every < 1):
            raise ConfigError(f"every must be a positive number of steps or None. Got {every!r}.")
        if not hasattr(loader, "__iter__"):
            raise ConfigError(f"watch needs an iterable of batches (a DataLoader, DevicePrefetcher...), not {type(loader).__name__}")
        self.loader, self.every, self.name, self.device, self.memory = loader, every, name, device, memory
        self.ends_epochs, self.hint, self.suggest = ends_epochs, hint, suggest
        self.ledger = WaitLedger()
        self.lines: deque[str] = deque(maxlen=MAX_LINES)
        self._sink = make_sink(log)
        self._echo: Callable[[str], None] | None = (
            (lambda line: print(line, file=sys.stdout, flush=True)) if echo is True else (echo or None)
        )
        self._hinted = False
        self._last_memory: MemorySnapshot | None = None
        self.starts: deque[tuple[float, float]] = deque(maxlen=MAX_LINES)
        """Each epoch's start, split: (``iter(loader)`` seconds, the first ``next()``'s seconds). ``iter`` starts the
        workers (and, under spawn or forkserver, sends each the dataset); the first ``next()`` waits for their
        ``worker_init_fn`` and first fetch. Without persistent workers every epoch pays both again."""

    # ----- the loop's side --------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        return self.iterate(lambda: iter(self.loader))

    def iterate(self, make: Callable[[], Iterator[Any]]) -> "WatchIterator":
        """Start an epoch on the iterator ``make()`` returns; its making (worker start-up) is counted as waiting."""
        start = time.perf_counter()
        source = make()
        self.ledger.start_epoch(start)
        return WatchIterator(self, source, time.perf_counter() - start)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __bool__(self) -> bool:  # a watch is never falsy, even over an empty or unsized loader
        return True

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("loader", "ledger"):
            raise AttributeError(name)
        return getattr(self.loader, name)

    # ----- summaries --------------------------------------------------------------------------
    def end_epoch(self) -> Window | None:
        """Close the open epoch now and print its line (frameworks call this from their epoch-end hook)."""
        now = time.perf_counter()
        epoch = self.ledger.end_epoch(now)
        if epoch is not None and epoch.steps:
            self.ledger.take_since(now)  # the next "every N" window starts here
            self._emit(f"epoch {len(self.ledger.epochs)}", epoch, self.ledger.total.steps)
        return epoch

    def close(self) -> Window | None:
        """The loop is over: close an epoch whose end was never seen (see ``WaitLedger.close_unfinished``)."""
        epoch = self.ledger.close_unfinished()
        if epoch is not None:
            self.ledger.take_since(time.perf_counter())
            self._emit(f"epoch {len(self.ledger.epochs)}", epoch, self.ledger.total.steps)
        return epoch

    def pause(self) -> None:
        """Stop the clock of the open epoch until :meth:`resume` (e.g. while a framework validates mid-epoch)."""
        self.ledger.pause(time.perf_counter())

    def resume(self) -> None:
        self.ledger.resume(time.perf_counter())

    def _every_n(self, now: float) -> None:
        window, p50, p90 = self.ledger.take_since(now)
        last = self.ledger.current(now).steps
        self._emit(f"steps {last - window.steps + 1}-{last}", window, last, p50=p50, p90=p90)

    def metrics(self, window: Window) -> dict[str, float]:
        """The figures sent to ``log`` for a window, under ``fastpipe/`` names."""
        out = {
            SHARE_METRIC: window.share,
            WAIT_METRIC: 1000 * window.wait_s / max(1, window.steps),
            "fastpipe/ms_per_step": 1000 * window.elapsed_s / max(1, window.steps),
        }
        if self._last_memory is not None:
            m = self._last_memory
            if m.rss_bytes is not None:
                out["fastpipe/rss_mb"] = m.rss_bytes / 2**20
            if m.workers_uss_bytes:
                out["fastpipe/workers_uss_mb"] = m.workers_uss_total / 2**20
            if m.shm_free_bytes is not None:
                out["fastpipe/shm_free_mb"] = m.shm_free_bytes / 2**20
        return out

    def _emit(self, label: str, window: Window, step: int, p50: float | None = None, p90: float | None = None) -> None:
        if self.memory:
            self._last_memory = memory_snapshot()
        line = self.line(label, window, p50=p50, p90=p90)
        self.lines.append(line)
        if self._echo:
            self._echo(line)
        if self._sink:
            self._sink(self.metrics(window), step, line)
        if self.hint and window.share >= HINT_SHARE and not self._hinted:
            self._hinted = True
            if self._echo:
                self._echo(self.next_step())

    def line(self, label: str, window: Window, *, p50: float | None = None, p90: float | None = None) -> str:
        """One summary line: share and band, wait and time per step, first batch, memory."""
        n = max(1, window.steps)
        text = (
            f"{PREFIX}: {label}: {window.steps} steps, waiting for batches {window.share:.1%} of the time "
            f"({band_for(window.share)}); wait {1000 * window.wait_s / n:.1f} ms/step"
        )
        if p50 is not None and p90 is not None:
            text += f" (median {1000 * p50:.1f}, P90 {1000 * p90:.1f})"
        else:
            start = (
                f": workers started in {1000 * self.starts[-1][0]:.0f} ms, then {1000 * self.starts[-1][1]:.0f} ms" if self.starts else ""
            )
            text += f" (first batch {1000 * window.first_wait_s:.0f} ms{start}, worst {1000 * window.max_wait_s:.0f} ms)"
        text += f", {1000 * window.elapsed_s / n:.1f} ms/step in all"
        if self._last_memory is not None and self.memory:
            text += f"; {self._last_memory.line()}"
        return text

    def summary(self) -> dict[str, Any]:
        """Everything measured so far as plain data (the open epoch counted up to now)."""
        now = time.perf_counter()
        total = self.ledger.current(now)
        out: dict[str, Any] = {
            "steps": total.steps,
            "epochs": len(self.ledger.epochs),
            "wait_s": total.wait_s,
            "elapsed_s": total.elapsed_s,
            "input_bound_share": total.share,
            "band": band_for(total.share),
            "wait_ms_per_step": 1000 * total.wait_s / max(1, total.steps),
            "ms_per_step": 1000 * total.elapsed_s / max(1, total.steps),
            "first_batch_s": total.first_wait_s,
            "per_epoch": [
                {
                    "steps": e.steps,
                    "input_bound_share": e.share,
                    "wait_s": e.wait_s,
                    "elapsed_s": e.elapsed_s,
                    "first_batch_s": e.first_wait_s,
                }
                for e in self.ledger.epochs
            ],
            "next_step": self.next_step() if total.share >= HINT_SHARE else None,
            "starts": [{"iter_s": made, "first_next_s": first} for made, first in self.starts],
        }
        if self.memory:
            out["memory"] = memory_snapshot().as_dict()
        return out

    def next_step(self) -> str:
        """The exact diagnosis call for this loader, as a line to paste."""
        if self.suggest is not None:
            return f"{PREFIX}: next step: find the slow stage with the cache ladder:\n    {self.suggest}"
        return diagnose_hint(self.loader, self.name, self.device)


class WatchIterator(Iterator[Any]):
    """The timed iterator: one epoch of ``Watch``; other attributes go to the loader's own iterator."""

    def __init__(self, owner: Watch, source: Iterator[Any], made_s: float) -> None:
        self._owner, self._source = owner, source
        self._ledger, self._every = owner.ledger, owner.every
        self._pending = made_s  # making the iterator (worker start-up) is charged to the first batch
        self._n = 0

    def __iter__(self) -> "WatchIterator":
        return self

    def __next__(self) -> Any:
        t0 = time.perf_counter()
        try:
            batch = next(self._source)
        except StopIteration:
            if self._owner.ends_epochs and self._ledger.in_epoch:
                self._owner.end_epoch()
            raise
        t1 = time.perf_counter()
        self._ledger.batch(t1 - t0 + self._pending, t1)
        if self._n == 0:
            self._owner.starts.append((self._pending, t1 - t0))
        self._pending = 0.0
        self._n += 1
        if self._every and self._n % self._every == 0:
            self._owner._every_n(t1)
        return batch

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_source", "_owner"):
            raise AttributeError(name)
        return getattr(self._source, name)


def diagnose_hint(loader: Any, name: str = "loader", device: Any = None) -> str:
    """``fastpipe.diagnose(...)`` for what was watched: the DataLoader behind a prefetcher, with its depth and device."""
    inner, extra = loader, []
    if hasattr(loader, "depth") and hasattr(loader, "loader") and hasattr(loader, "device"):  # a DevicePrefetcher
        inner = loader.loader
        device = device if device is not None else loader.device
        extra.append(f"prefetch_depth={loader.depth}")
        if getattr(loader, "transform", None) is not None:
            extra.append("device_transform=<the prefetcher's transform>")
        name = f"{name}.loader"
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    spec = getattr(device, "spec", None) or str(device)
    what = _describe(inner)
    args = ", ".join([name, "step", f'device="{spec}"', *extra])
    return (
        f"{PREFIX}: next step: find the slow stage with the cache ladder:\n"
        f"    report = fastpipe.diagnose({args}); print(report)\n"
        f"  where {name} is {what} and step(batch) runs one training step on a batch already on the device "
        f"(pass train_state=fastpipe.diagnosis.TrainState(model=, optimizer=) to have them restored); from a shell: fastpipe diagnose your_module:make_workload "
        f"--device {spec}, make_workload returning (loader, step)"
    )


def _describe(loader: Any) -> str:
    source = getattr(loader, "source", loader)  # fastpipe.loading.recycled keeps the user's DataLoader as .source
    settings = [f"{key}={getattr(source, key)}" for key in ("batch_size", "num_workers", "pin_memory") if hasattr(source, key)]
    kind = type(loader).__name__
    return (
        f"the {kind}({', '.join(settings)}) you watched"
        if settings
        else f"the {kind} you watched (diagnose needs the DataLoader behind it)"
    )
