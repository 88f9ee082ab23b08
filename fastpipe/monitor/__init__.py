"""Watching a real training run: how much of the loop waits for data, and what memory the pipeline holds.

Lives here: :func:`watch` (the monitor for any loop), the wait ledger and its bands, the DataLoader tap that
frameworks and ``fastpipe watch`` use to time loaders they do not iterate themselves, and cheap memory
figures. Same layer as ``loading``: it may import only the base modules; the integrations, the CLI and the
diagnosis build on it, never the reverse.
"""

from typing import Any, Callable, Iterable

from fastpipe.monitor._ledger import BANDS, WaitLedger, Window, band_for
from fastpipe.monitor._loopsampler import LoopCall, LoopSampler, no_loader_text
from fastpipe.monitor._memory import MemorySnapshot, memory_snapshot
from fastpipe.monitor._tap import close_tap, open_tap, open_taps, tap_dataloaders
from fastpipe.monitor._watch import HINT_SHARE, SHARE_METRIC, WAIT_METRIC, Watch, WatchIterator, diagnose_hint


def watch(
    loader: Iterable[Any],
    *,
    every: int | None = None,
    log: Any = None,
    echo: "bool | Callable[[str], None]" = True,
    name: str = "loader",
    device: Any = None,
    memory: bool = True,
) -> Watch:
    """Wrap ``loader`` so the loop around it reports how much of its time it waits for batches.

    ``for batch in fastpipe.watch(loader): ...`` in place of ``for batch in loader: ...``. Make it once, outside
    the epoch loop, to get one line per epoch and one :meth:`Watch.summary` for the run. Options are
    :class:`Watch`'s: ``every`` (a line every N steps too), ``log`` (a Logger, a SummaryWriter, ``wandb.log``),
    ``echo``, ``name`` and ``device`` (for the suggested diagnosis), ``memory`` (RSS, workers' USS, /dev/shm).
    """
    return Watch(loader, every=every, log=log, echo=echo, name=name, device=device, memory=memory)


__all__ = [
    "BANDS",
    "HINT_SHARE",
    "LoopCall",
    "LoopSampler",
    "MemorySnapshot",
    "SHARE_METRIC",
    "WAIT_METRIC",
    "WaitLedger",
    "Watch",
    "WatchIterator",
    "Window",
    "band_for",
    "close_tap",
    "diagnose_hint",
    "memory_snapshot",
    "no_loader_text",
    "open_tap",
    "open_taps",
    "tap_dataloaders",
    "watch",
]
