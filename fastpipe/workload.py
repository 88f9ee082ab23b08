"""A Workload bundles what fastpipe runs: the user's DataLoader and training step.

Commands take a SPEC that names one: ``toy:VARIANT`` for the article's workload, or
``package.module:function`` for a user's own, where the function returns ``(loader, step)``
or a :class:`Workload`. The function may take a ``device`` argument, which fastpipe passes
as a :class:`~fastpipe.devices.Device`, so the factory can put its model there.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader

from fastpipe.devices import Device, parse_device
from fastpipe.errors import ConfigError, FastpipeError


@dataclass
class Workload:
    """What a training loop is made of, as far as the input pipeline is concerned.

    Attributes:
        loader: the user's DataLoader, never modified.
        step: ``step(batch)``, one training step on a batch already on the device.
        device_transform: optional work run on the device after the copy (e.g. uint8 -> float).
        model, optimizer: given so their state can be snapshotted and restored around a diagnosis.
        prefetch_depth: batches fastpipe's DevicePrefetcher copies ahead; 0 copies inline, as the
            article's loop does.
        prefetcher: which prefetcher to use when ``prefetch_depth`` > 0: ``"fastpipe"`` or ``"tnt"``
            (torchtnt's CudaDataPrefetcher, CUDA only).
        name: a label for reports.
        notes: facts a report should repeat (e.g. "the sim device does not run the model").
    """

    loader: DataLoader
    step: Callable[[Any], Any]
    device_transform: Callable[[Any], Any] | None = None
    model: torch.nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
    prefetch_depth: int = 0
    prefetcher: str = "fastpipe"
    name: str = "workload"
    notes: list[str] = field(default_factory=list)


def _call_factory(factory: Callable[..., Any], device: Device) -> Any:
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        parameters = {}
    if "device" in parameters:
        return factory(device=device)
    return factory()


def as_workload(obj: Any, name: str) -> Workload:
    """Accept a Workload or a ``(loader, step)`` pair, and check both parts."""
    if isinstance(obj, Workload):
        workload = obj
    elif isinstance(obj, (tuple, list)) and len(obj) == 2:
        workload = Workload(loader=obj[0], step=obj[1], name=name)
    else:
        raise ConfigError(f"'{name}' must return (loader, step) or a fastpipe.Workload, not {type(obj).__name__}")
    if not isinstance(workload.loader, DataLoader) and not hasattr(workload.loader, "with_dataset"):
        raise ConfigError(f"'{name}' returned a {type(workload.loader).__name__} where a torch.utils.data.DataLoader was expected")
    if not callable(workload.step):
        raise ConfigError(f"'{name}' returned a step that is not callable; pass a function step(batch)")
    return workload


def load_workload(spec: str, device: "str | Device | None" = None, **toy_options: Any) -> Workload:
    """Build the workload a SPEC names, for ``device``. ``toy_options`` go to the toy builder."""
    device = parse_device(device)
    if spec.startswith("toy:") or spec == "toy":
        from fastpipe.toy import make_workload

        variant = spec.partition(":")[2] or "naive"
        return make_workload(variant, device, **toy_options)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"bad SPEC '{spec}': use toy:naive, toy:optimized, or package.module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"bad SPEC '{spec}': cannot import module '{module_name}' ({exc}); is it on PYTHONPATH?") from exc
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise ConfigError(f"bad SPEC '{spec}': module '{module_name}' has no function '{attr}'")
    try:
        result = _call_factory(factory, device)
    except FastpipeError:
        raise
    except Exception as exc:
        raise ConfigError(f"the workload factory '{spec}' raised {type(exc).__name__}: {exc}") from exc
    return as_workload(result, spec)
