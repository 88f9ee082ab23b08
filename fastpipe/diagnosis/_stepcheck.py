"""Run the user's training step once, on one real batch, before a long measurement.

On a simulated device the step is never called (the sim's step stands in for it), so a step
that would crash on the first real batch (wrong batch structure, a dtype the model rejects,
a model left on the wrong device) passes a whole diagnosis silently. ``check_step`` draws
a first batch as the user's loader would (a rebuilt copy of it, every setting kept, see
:func:`fastpipe.loading._rebuild.rebuild_loader`), applies the workload's device transform, and
calls the step once where the model lives: on the CPU for ``sim`` (the factory's ``device``
is ``cpu`` there), on the GPU for ``cuda``.

It leaves the user's state as it found it: the loader itself is never iterated (its sampler,
batch sampler and generator are copied into the rebuilt one, so their positions, epochs and
seeds stay put, and a persistent loader starts no workers), and everything the draw or the step
moves is restored afterwards (:func:`fastpipe.diagnosis.runtime._snapshot.preserve_user_state`: the model,
optimizer, schedulers, and the torch, CUDA, NumPy and ``random`` generators), so the check trains nothing.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch

from fastpipe._tree import iter_tensors, map_tensors
from fastpipe.devices import Device, parse_device
from fastpipe.diagnosis.runtime._snapshot import preserve_user_state
from fastpipe.errors import PipelineError
from fastpipe.loading._pinning import forget_dead_iterator, shutdown_iterator
from fastpipe.loading._rebuild import discard_loader, rebuild_loader
from fastpipe.workloads._workload import Workload


@dataclass(frozen=True)
class StepCheck:
    """The step ran once: where, and how long it took (one cold step: not a measurement)."""

    device: str
    seconds: float

    def line(self) -> str:
        return f"step check: your step ran once on a real batch on {self.device} in {self.seconds:.2f} s (model state restored)"


def _model_device(workload: Workload) -> torch.device | None:
    """Where the model's parameters are, when they are all in one place."""
    if workload.model is None:
        return None
    places = {p.device for p in workload.model.parameters()}
    return places.pop() if len(places) == 1 else None


def _where(exc: BaseException) -> str:
    """The innermost frame of the traceback outside torch and fastpipe: the user's line that raised."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/torch/" not in f.filename and "/fastpipe/" not in f.filename]
    return f" (at {frames[-1].filename}:{frames[-1].lineno}, in {frames[-1].name})" if frames else ""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _first_batch(loader: Any) -> tuple[Any, Any]:
    """(the first batch, the copy of ``loader`` it came from): the user's loader is never iterated; the copy's workers
    are stopped once the batch is in (a recycled copy's buffers go with ``discard_loader``, after the step)."""
    copy = rebuild_loader(loader, loader.dataset)
    iterator = iter(copy)
    try:
        return next(iterator), copy
    except StopIteration:
        discard_loader(copy)
        raise PipelineError("step check: the loader yielded no batch to run the step on", stage="step") from None
    except Exception as exc:
        discard_loader(copy)
        raise PipelineError(f"step check: the loader failed on its first batch: {_first_line(exc)}", stage=None) from exc
    finally:
        shutdown_iterator(iterator)
        forget_dead_iterator(copy)


def check_step(workload: Workload, device: "str | Device | None" = None) -> StepCheck:
    """Call ``workload.step`` once on a first batch drawn as ``workload.loader`` draws it, on the device where the model is.

    The user's loader, its sampler and generators, the model, optimizer and every global random
    generator are as they were when it returns (see the module docstring).

    Raises:
        PipelineError: the loader could not produce a batch, or the step raised; the message names the
            step's exception and the line it came from.
    """
    device = parse_device(device)
    target = _model_device(workload) or device.torch_device
    with preserve_user_state(workload.model, workload.optimizer, workload.loader, schedulers=workload.schedulers, scaler=workload.scaler):
        batch, copy = _first_batch(workload.loader)
        try:
            batch = map_tensors(lambda t: t.to(target), batch)
            began = time.perf_counter()
            return _run_once(workload, batch, device, target, began)
        finally:
            discard_loader(copy)


def _run_once(workload: Workload, batch: Any, device: Device, target: torch.device, began: float) -> StepCheck:
    """The step on ``batch``; a failure named with the user's own line."""
    try:
        if workload.device_transform is not None:
            batch = workload.device_transform(batch)
        workload.step(batch)
        if target.type == "cuda":
            torch.cuda.synchronize(target)
    except Exception as exc:
        shapes = ", ".join(f"{tuple(t.shape)} {t.dtype}" for t in iter_tensors(batch))
        raise PipelineError(
            f"step check: your step raised {_first_line(exc)}{_where(exc)}, run once on the first real batch "
            f"on {target} (batch tensors: {shapes or 'none'}). On {device.spec} the step "
            + (
                "is never run, so the diagnosis would not have shown this; fix the step, then rerun"
                if not device.runs_model
                else "would fail the same way during the diagnosis; fix it, then rerun"
            ),
            stage="step",
        ) from exc
    return StepCheck(device=str(target), seconds=time.perf_counter() - began)
