"""Cache points measured as windows of a running script's own loop (script mode's :class:`WindowRunner`).

What differs from a factory's :class:`~fastpipe.diagnosis.ladder._points.PointRunner`, and why:

* the step is the script's (:class:`~fastpipe.diagnosis._handoff.Handoff`), so fastpipe neither copies batches to the
  device nor runs a device transform: the script does both, as it always does. :class:`ScriptDevice` keeps the real
  device's clock (CUDA events on a GPU) and makes ``to_device`` a no-op; only the device point places its cached
  batches on the script's device, so the script's own ``.to(device)`` finds them there;
* a step the script spent partly elsewhere (validation, a new epoch) is dropped from the window
  (:func:`measure_window`); a window of nothing but such steps ends after :data:`SPOILED_BUDGETS` budgets with an
  error naming the point, rather than waiting forever;
* a progress line on stderr as each point starts (:class:`~fastpipe.diagnosis._script_budget.LadderProgress`): the
  script's output shares the terminal, so lines rather than the factory's live bar.

Everything else (warm-up, whole rounds of workers, the time budget per point, the precision target and the noise
rule of :mod:`fastpipe.diagnosis.ladder._noise`, pooling, memory) is the factory's. ``--budget-steps`` still caps the
steps the ladder takes in all (``Handoff(budget_steps)``); windows then share what is left of it, the in-worker
timing never cut short: the cap is lifted once the points are measured.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from fastpipe.devices import Device
from fastpipe.diagnosis._handoff import Handoff
from fastpipe.diagnosis._script_budget import LadderProgress
from fastpipe.diagnosis.ladder._cachepoint import DEVICE
from fastpipe.diagnosis.ladder._cpu import CpuMonitor
from fastpipe.diagnosis.ladder._loader_stages import StageWindow
from fastpipe.diagnosis.ladder._measure import Measurement
from fastpipe.diagnosis.ladder._noise import rel_stderr
from fastpipe.diagnosis.ladder._plan import point_label
from fastpipe.diagnosis.ladder._points import PointRunner, Repeat
from fastpipe.errors import PipelineError

SPOILED_BUDGETS = 3
"""A window whose every step spanned other work of the script gives up after this many of its time budgets."""


class ScriptDevice(Device):
    """The script's device as the ladder sees it: the real device's clock; copies left to the script."""

    def __init__(self, real: Device) -> None:
        self.real, self.kind, self.spec = real, real.kind, real.spec

    @property
    def torch_device(self) -> Any:
        return self.real.torch_device

    @property
    def step_uses_worker_cores(self) -> bool:
        """The real device's answer (the CPU verdict applies to a script whose step runs on the CPU)."""
        return bool(getattr(self.real, "step_uses_worker_cores", self.real.kind == "cpu"))

    def to_device(self, batch: Any, non_blocking: bool = False) -> Any:
        return batch  # the script's own loop moves its batches

    def place(self, batch: Any) -> Any:
        """``batch`` on the script's device (the device point's cached batches)."""
        return self.real.to_device(batch, non_blocking=False)

    def pin(self, batch: Any) -> Any:
        return self.real.pin(batch)

    def synchronize(self) -> None:
        self.real.synchronize()

    def timeline_mark(self) -> Any:
        return self.real.timeline_mark()

    def seconds_between(self, earlier: Any, later: Any) -> float:
        return self.real.seconds_between(earlier, later)


def measure_window(
    next_batch: Callable[[], Any],
    run_step: Callable[[Any], Any],
    *,
    warmup: int,
    min_steps: int,
    max_steps: int | None,
    budget_s: float,
    target: float,
    device: Device,
    round_size: int,
    spoiled: Callable[[], bool],
    on_step: Callable[[int], None] | None = None,
    earlier: list[float] | None = None,
) -> Measurement:
    """:func:`~fastpipe.diagnosis.ladder._measure.measure_until` over the script's loop, without the steps ``spoiled()``
    flags (taken partly elsewhere): until the kept steps' mean is within ``target`` or ``budget_s`` has passed (at least
    ``min_steps`` kept), and never more than ``max_steps`` steps in all (warm-up and dropped ones included; None: no
    cap). With no step kept after :data:`SPOILED_BUDGETS` budgets it raises :class:`PipelineError`.

    ``earlier``: the point's step times from its earlier windows. The report pools every run of a point, drift between
    them included, so a point measured again also goes on until the pooled figure is within ``target`` (or the budget
    is spent): otherwise a remeasured point can end short of its target though each of its windows reached it."""
    size = max(1, round_size)
    taken = 0
    for i in range(warmup):
        run_step(next_batch())
        taken += 1
        if on_step is not None:
            on_step(i)
    kept: list[bool] = []
    host_times: list[float] = []
    with CpuMonitor() as monitor:
        marks = [device.timeline_mark()]  # after the monitor's start, which the first step would otherwise hold
        started = last = time.perf_counter()
        while True:
            run_step(next_batch())
            taken += 1
            marks.append(device.timeline_mark())
            now = time.perf_counter()
            keep = not spoiled()
            kept.append(keep)
            if keep:
                host_times.append(now - last)
            last = now
            if on_step is not None:
                on_step(warmup + len(kept) - 1)
            count = len(host_times)
            if max_steps is not None and taken >= max_steps and count:
                break
            if not count and now - started >= SPOILED_BUDGETS * budget_s:
                raise PipelineError(
                    f"every one of the {taken - warmup} steps in {now - started:.0f} s of this point's window spanned other "
                    "work of the script (another DataLoader, a new epoch), so none of them times a training step",
                    stage=None,
                )
            if count >= min_steps and count % size == 0:
                precise = Measurement(host_times, 0.0, 0.0, round_size=size).rel_stderr <= target and count // size >= 3
                if precise and earlier:
                    precise = rel_stderr(earlier + host_times, size) <= target
                if precise or now - started >= budget_s:
                    break
        device.synchronize()
    step_times = [device.seconds_between(a, b) for a, b, keep in zip(marks, marks[1:], kept) if keep]
    return Measurement(step_times=step_times, cpu_util=monitor.cpu_util, system_cpu_util=monitor.system_cpu_util, round_size=size)


class WindowRunner(PointRunner):
    """A :class:`PointRunner` whose step is the script's loop (the workload's step is a :class:`Handoff`'s)."""

    def __init__(self, workload: Any, device: Device, *, handoff: Handoff, lines: LadderProgress | None = None, **options: Any) -> None:
        super().__init__(workload, device, **options)
        self.handoff = handoff
        self.lines = lines
        self._point: str | None = None

    def measure(self, point: str, *, budget_s: float | None = None) -> Any:
        """The factory's measurement of ``point``, after its progress line."""
        if self.lines is not None:
            budget = self.budget_s if budget_s is None else budget_s
            paces = [1 / r.steps_per_s for r in self.results.values() if r.steps_per_s > 0]
            run = len(self.runs.get(point, [])) + 1
            measured = (min(paces), max(paces)) if paces else None
            self.lines.point(point, point_label(point), run=run, total=len(self.plan.points), budget_s=budget, measured=measured)
        self._point = point
        return super().measure(point, budget_s=budget_s)

    def close(self) -> None:
        """The points are measured: lift any step cap (the in-worker timing that may follow is not cut short), say
        what follows, then the factory's close."""
        self.handoff.budget_steps = None
        if self.lines is not None and self.results and self.handoff.gone_why is None and not self.handoff.spent:
            self.lines.points_done()
        super().close()

    def window_cap(self) -> int | None:
        """Steps one window may take: None without a step cap (each point's time budget bounds it); with one, an even
        share of what is left over the points not yet measured and two remeasurements, never under the warm-up and the
        fewest steps (the in-worker timing needs none of it: :meth:`close` lifts the cap before it)."""
        cap = self.handoff.budget_steps
        if cap is None:
            return None
        left = cap - self.handoff.steps
        todo = len([p for p in self.plan.points if p not in self.results]) + 2
        return max(self.warmup + self.steps, left // todo)

    def _batch_source(self, point: str) -> tuple[Callable[[], Any], Callable[[], None], Any]:
        if point != DEVICE:
            return super()._batch_source(point)
        assert isinstance(self.device, ScriptDevice)
        cached = [self.device.place(b) for b in self._host_batches()]
        self.device.synchronize()
        cycle = iter(Repeat(cached, False))
        return (lambda: next(cycle)), (lambda: None), None

    def _measure_steps(self, next_batch: Callable[[], Any], budget_s: float, window: StageWindow | None, agree: Any) -> Measurement:
        """One window of the script's loop (``agree``, for DDP, is not used: one process), capped at
        :meth:`window_cap` steps, with the steps the handoff spoiled (an epoch's end, another loader) left out."""
        return measure_window(
            next_batch,
            self._run_step,
            warmup=self.warmup,
            min_steps=self.steps,
            max_steps=self.window_cap(),
            budget_s=budget_s,
            target=self.target,
            device=self.device,
            round_size=self.round,
            spoiled=lambda: self.handoff.last_spoiled,
            earlier=[t for run in self.runs.get(self._point or "", []) for t in run.step_times],
            on_step=None if window is None else window.and_then(lambda i: None),
        )
