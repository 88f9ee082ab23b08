"""Run the user's training step once, on one real batch, before a long measurement.

On a simulated device the step is never called (the sim's step stands in for it), so a step
that would crash on the first real batch (wrong batch structure, a dtype the model rejects,
a model left on the wrong device) passes a whole diagnosis silently. ``check_step`` draws
the first batch from the user's own loader, applies the workload's device transform, and
calls the step once where the model lives: on the CPU for ``sim`` (the factory's ``device``
is ``cpu`` there), on the GPU for ``cuda``. The model, optimizer and random generators are
restored afterwards (:func:`fastpipe.diagnosis._snapshot.preserve_user_state`), so the check trains nothing.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass

import torch

from fastpipe._tree import iter_tensors, map_tensors
from fastpipe.devices import Device, parse_device
from fastpipe.errors import PipelineError
from fastpipe.diagnosis._snapshot import preserve_user_state
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
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "/torch/" not in f.filename and "/fastpipe/" not in f.filename]
    return f" (at {frames[-1].filename}:{frames[-1].lineno}, in {frames[-1].name})" if frames else ""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def check_step(workload: Workload, device: "str | Device | None" = None) -> StepCheck:
    """Call ``workload.step`` once on the first batch of ``workload.loader``, on the device where the model is.

    Raises:
        PipelineError: the loader could not produce a batch, or the step raised; the message names the
            step's exception and the line it came from.
    """
    device = parse_device(device)
    target = _model_device(workload) or device.torch_device
    try:
        batch = next(iter(workload.loader))
    except StopIteration:
        raise PipelineError("step check: the loader yielded no batch to run the step on", stage="step") from None
    except Exception as exc:
        raise PipelineError(f"step check: the loader failed on its first batch: {_first_line(exc)}", stage=None) from exc
    batch = map_tensors(lambda t: t.to(target), batch)
    began = time.perf_counter()
    with preserve_user_state(workload.model, workload.optimizer, workload.loader, schedulers=workload.schedulers, scaler=workload.scaler):
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
                + ("is never run, so the diagnosis would not have shown this; fix the step, then rerun"
                   if not device.runs_model else "would fail the same way during the diagnosis; fix it, then rerun"),
                stage="step",
            ) from exc
    return StepCheck(device=str(target), seconds=time.perf_counter() - began)
