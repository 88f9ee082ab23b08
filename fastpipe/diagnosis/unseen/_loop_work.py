"""The loop's own host work on each batch: from the batch's ``next()`` to the model's first forward (script mode).

A training loop works on every batch before its model runs: ``.to(device)``, mixup or cutmix on the batch, a
per-batch transform in Python. That runs in the training process, on the loop's thread, inside every step the ladder
times (the device point's included), so no pair of cache points shows it as a stage. In script mode
(:mod:`fastpipe.diagnosis._script`) the script's ``next()`` is fastpipe's and its models are found
(:mod:`fastpipe.diagnosis._trainstate`): :class:`LoopTimer` puts a forward pre-hook on each root model, and the time
from a batch's return to the first forward after it, on the thread that took the batch (wall, and that thread's CPU
time), is the loop's work on that batch. The hooks are removed when the ladder ends: the models'
``_forward_pre_hooks`` are as they were.

On a synchronous device (the CPU) the step waits for all of it. On CUDA the host's work overlaps what the device still
has queued from the steps before; a step's loop work is counted as its cost only when the device's stream was idle
when the batch arrived (``torch.cuda.Stream.query()``, as after a loop's ``loss.item()``), and as none otherwise.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fastpipe.diagnosis.unseen._main_process import LOOP_WORK, MainPart


@dataclass
class LoopWork:
    """The loop's work per batch over the ladder's steps (medians of the steps timed)."""

    steps: int
    ms_per_step: float
    """What it costs the step: its wall time, counted where the device waited for it (module docstring)."""
    wall_ms: float
    cpu_ms: float
    """The loop thread's CPU time in it: near its wall time when it computes, far below when it waits (a copy, I/O)."""
    noise_ms: float
    """Two standard errors of the per-step cost."""
    idle_steps: int | None = None
    """CUDA: the steps whose batch found the device idle (the others' work hid under the device's queue); None on a
    synchronous device."""

    def part(self) -> MainPart:
        computes = "it computes" if self.cpu_ms >= 0.5 * self.wall_ms else "it mostly waits (a synchronous copy, I/O, a lock)"
        idle = (
            ""
            if self.idle_steps is None
            else f"; the device was idle when {self.idle_steps} of the {self.steps} batches arrived (the rest hid under its queue)"
        )
        detail = (
            f"from next() to the model's first forward, over {self.steps} steps of the script: {self.wall_ms:.1f} ms wall, "
            f"{self.cpu_ms:.1f} ms of the loop thread's CPU ({computes}){idle}"
        )
        return MainPart(LOOP_WORK, self.ms_per_step, detail)


class LoopTimer:
    """Times the loop's work on each batch (module docstring): :meth:`arrived` at each batch the script's ``next()``
    returns, a forward pre-hook on each of ``modules``; :meth:`close` removes the hooks and sums up."""

    def __init__(self, modules: list[nn.Module], device: torch.device | None) -> None:
        self._stream = torch.cuda.current_stream(device) if device is not None and device.type == "cuda" else None
        self._pending: tuple[int, float, float, bool] | None = None
        self._samples: list[tuple[float, float, bool]] = []
        self._handles = [m.register_forward_pre_hook(self._forward) for m in modules]

    def arrived(self) -> None:
        """A batch was handed to the script's loop (on the loop's thread)."""
        idle = True if self._stream is None else bool(self._stream.query())
        self._pending = (threading.get_ident(), time.perf_counter(), time.thread_time(), idle)

    def elsewhere(self) -> None:
        """The loop began other work (another loader, a new epoch) before its model ran: this batch is not timed."""
        self._pending = None

    def _forward(self, module: nn.Module, args: Any) -> None:
        pending = self._pending
        if pending is None or pending[0] != threading.get_ident():
            return
        self._pending = None
        _, wall, cpu, idle = pending
        self._samples.append((time.perf_counter() - wall, time.thread_time() - cpu, idle))

    def close(self) -> LoopWork | None:
        """Remove the hooks; the loop's work per batch (None when no step was timed)."""
        for handle in self._handles:
            handle.remove()
        self._handles, self._pending = [], None
        if not self._samples:
            return None
        costs = [1000 * wall if idle else 0.0 for wall, _, idle in self._samples]
        noise = 2 * statistics.stdev(costs) / len(costs) ** 0.5 if len(costs) > 1 else float("inf")
        return LoopWork(
            steps=len(costs),
            ms_per_step=statistics.median(costs),
            wall_ms=1000 * statistics.median(w for w, _, _ in self._samples),
            cpu_ms=1000 * statistics.median(c for _, c, _ in self._samples),
            noise_ms=noise,
            idle_steps=None if self._stream is None else sum(idle for _, _, idle in self._samples),
        )
