"""A Workload bundles what fastpipe runs: the user's DataLoader and training step.

Commands take a SPEC that names one:

* ``toy:VARIANT``: the article's workload (:mod:`fastpipe.workloads.toy`);
* ``jpeg:VARIANT``: the real-JPEG workload (:mod:`fastpipe.workloads.jpeg`);
* ``package.module:function``: the user's own. The module is imported as ``python -m`` and
  pytest would: the current directory comes first on ``sys.path``, so
  ``fastpipe diagnose train:make_workload`` finds ``train.py`` in the folder it is run from.

The user's function returns ``(loader, step)`` or a :class:`Workload`. It may take either or
both of these arguments, by name:

* ``device``: a :class:`torch.device` to put the model on (``model.to(device)``): ``cpu`` for
  ``--device cpu``, ``cuda:N`` for ``--device cuda[:N]``, and ``cpu`` for ``--device sim:...``,
  where the step stands in for the model and the model is never run.
* ``fastpipe_device``: fastpipe's own :class:`~fastpipe.devices.Device`, for a factory that wants
  to know more, e.g. ``fastpipe_device.runs_model`` is False on ``sim`` (skip building a large model).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import sys
import sysconfig
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch.utils.data import DataLoader

from fastpipe.devices import Device, default_device_spec, parse_device
from fastpipe.errors import ConfigError, FastpipeError
from fastpipe.loading._unwrap import chain, unwrap_loader

#: Built-in workload families: the SPEC prefix, and the module whose ``make_workload(variant, device, **options)`` builds one.
#: A family module may set ``DEFAULT_SIM_SPEC`` (e.g. ``"sim:222"``): the device its SPECs get when none is given and no GPU is present.
FAMILIES = {"toy": "fastpipe.workloads.toy", "jpeg": "fastpipe.workloads.jpeg"}
#: A family's variant when the SPEC names none (``toy`` means ``toy:naive``).
DEFAULT_VARIANTS = {"toy": "naive", "jpeg": "naive"}

FACTORY_CONTRACT = (
    "the function may take `device` (a torch.device for model.to(device); cpu on sim, where the model is not run) "
    "and/or `fastpipe_device` (fastpipe's Device), and must return (loader, step) or a fastpipe.Workload "
    "(on the command line also (LightningModule, datamodule or loader))"
)


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
    schedulers: list[Any] = field(default_factory=list)
    scaler: Any = None
    prefetch_depth: int = 0
    prefetcher: str = "fastpipe"
    name: str = "workload"
    notes: list[str] = field(default_factory=list)


def family_of(spec: str) -> str | None:
    """``"toy"`` for ``toy`` or ``toy:naive``, likewise for every built-in family; None for a user's ``module:function``."""
    prefix, sep, _ = spec.partition(":")
    return prefix if prefix in FAMILIES and (sep or spec == prefix) else None


def _family_module(family: str) -> Any:
    name = FAMILIES[family]
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and name.startswith(exc.name):
            raise ConfigError(
                f"the '{family}:' workloads need {name}, which this fastpipe does not include; "
                "update fastpipe, or use toy:naive or your own package.module:function"
            ) from exc
        raise


def default_device_for(specs: "str | Iterable[str]") -> str:
    """The device SPECs run on when the user names none: ``cuda`` when a GPU is present, else the simulated step
    their family asks for (its ``DEFAULT_SIM_SPEC``) when all SPECs agree on one, else :func:`default_device_spec`."""
    specs = [specs] if isinstance(specs, str) else list(specs)
    fallback = default_device_spec()
    if torch.cuda.is_available() or not specs:
        return fallback
    asked = set()
    for spec in specs:
        family = family_of(spec)
        asked.add(None if family is None else getattr(_family_module(family), "DEFAULT_SIM_SPEC", None))
    choice = asked.pop() if len(asked) == 1 else None
    return choice if choice is not None else fallback


def user_frame(exc: BaseException) -> str:
    """Where in the user's code ``exc`` was raised, as ``file:line in function: source``: the deepest frame outside
    fastpipe, torch and the installed packages (else the deepest frame), so the one-line error still points at it."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    installed = {os.path.abspath(p) for p in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["stdlib"])}

    def theirs(frame: traceback.FrameSummary) -> bool:
        path = os.path.abspath(frame.filename)
        return not path.startswith(package + os.sep) and not any(path.startswith(root + os.sep) for root in installed)

    frame = next((f for f in reversed(frames) if theirs(f)), frames[-1])
    relative = os.path.relpath(frame.filename)
    where = frame.filename if relative.startswith("..") else relative
    return f"{where}:{frame.lineno} in {frame.name}" + (f": {frame.line.strip()}" if frame.line else "")


def _call_factory(factory: Callable[..., Any], device: Device) -> Any:
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        parameters = {}
    kwargs: dict[str, Any] = {}
    if "device" in parameters:
        kwargs["device"] = device.torch_device
    if "fastpipe_device" in parameters:
        kwargs["fastpipe_device"] = device
    return factory(**kwargs)


def as_workload(obj: Any, name: str) -> Workload:
    """Accept a Workload or a ``(loader, step)`` pair, and check both parts."""
    if isinstance(obj, Workload):
        workload = obj
    elif isinstance(obj, (tuple, list)) and len(obj) == 2 and all(hasattr(obj[0], a) for a in ("training_step", "configure_optimizers")):
        raise ConfigError(
            f"'{name}' returned a LightningModule and its data: `fastpipe diagnose` takes that pair; here, call "
            "fastpipe.integrations.lightning.diagnose(module, datamodule, device=...) or return (loader, step)"
        )
    elif isinstance(obj, (tuple, list)) and len(obj) == 2:
        workload = Workload(loader=obj[0], step=obj[1], name=name)
    else:
        raise ConfigError(f"'{name}' must return (loader, step) or a fastpipe.Workload, not {type(obj).__name__}")
    workload = unwrapped_workload(workload, name)
    if not callable(workload.step):
        raise ConfigError(f"'{name}' returned a step that is not callable; pass a function step(batch)")
    return workload


def unwrapped_workload(workload: Workload, name: str) -> Workload:
    """``workload`` with its loader unwrapped to the DataLoader inside (timm's PrefetchLoader, accelerate's adapters,
    fastpipe's prefetcher): the wrappers' device-side work runs first among its device transforms, a prefetching
    wrapper's depth becomes the workload's when it set none, and the report says what was unwrapped."""
    try:
        found = unwrap_loader(workload.loader)
    except ConfigError as exc:
        raise ConfigError(f"'{name}' returned a loader fastpipe cannot use: {exc}") from exc
    if not found.layers:
        return workload
    return dataclasses.replace(
        workload,
        loader=found.loader,
        device_transform=chain(found.device_transform, workload.device_transform),
        prefetch_depth=workload.prefetch_depth or (found.prefetch_depth or 0),
        notes=[*workload.notes, *found.layers],
    )


def _cwd_first_on_path() -> None:
    """Put the current directory first on ``sys.path``, as ``python -m`` and pytest do.

    The entry stays for the whole process: the user's module may import its neighbours later,
    and DataLoader workers started with ``spawn`` re-import it with the parent's ``sys.path``.
    """
    cwd = os.getcwd()
    if sys.path[:1] not in ([cwd], [""]):
        sys.path.insert(0, cwd)
        importlib.invalidate_caches()


def _import_user_module(spec: str, module_name: str) -> Any:
    _cwd_first_on_path()
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise ConfigError(
                f"bad SPEC '{spec}': no module '{module_name}' in the current directory ({os.getcwd()}) or on sys.path; "
                f"run fastpipe from the folder that holds {module_name.split('.')[0]}.py, or add that folder to PYTHONPATH"
            ) from exc
        raise ConfigError(f"bad SPEC '{spec}': importing '{module_name}' failed: {exc}; install what it imports") from exc
    except FastpipeError:
        raise
    except Exception as exc:
        raise ConfigError(f"bad SPEC '{spec}': importing '{module_name}' raised {type(exc).__name__}: {exc}, at {user_frame(exc)}") from exc


FactoryAdapter = Callable[[Any, Device, str], "Workload | None"]
"""Turns what a user's factory returned into a Workload, or None to leave it to :func:`as_workload`: how the CLI
accepts ``(LightningModule, datamodule)`` (the integration lives above this layer and is passed in)."""


def load_workload(spec: str, device: "str | Device | None" = None, *, adapt: FactoryAdapter | None = None, **options: Any) -> Workload:
    """Build the workload a SPEC names, for ``device``. ``options`` go to a family's builder (``toy:``, ``jpeg:``).

    ``device=None`` means :func:`default_device_for` the SPEC. ``adapt`` is offered a user factory's result first.
    """
    device = parse_device(default_device_for(spec) if device is None else device)
    family = family_of(spec)
    if family is not None:
        module = _family_module(family)
        variant = spec.partition(":")[2] or DEFAULT_VARIANTS.get(family, "")
        if not variant:
            raise ConfigError(f"bad SPEC '{spec}': name a variant, e.g. {family}:naive")
        return module.make_workload(variant, device, **options)
    if options:
        raise ConfigError(
            f"options {sorted(options)} only apply to the built-in workloads ({', '.join(FAMILIES)}); size your own workload in its factory"
        )
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"bad SPEC '{spec}': use toy:naive, toy:optimized, jpeg:VARIANT, or package.module:function")
    module = _import_user_module(spec, module_name)
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise ConfigError(f"bad SPEC '{spec}': module '{module_name}' has no function '{attr}'")
    try:
        result = _call_factory(factory, device)
        adapted = adapt(result, device, spec) if adapt is not None else None
    except FastpipeError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"the workload factory '{spec}' raised {type(exc).__name__}: {exc}, at {user_frame(exc)} ({FACTORY_CONTRACT})"
        ) from exc
    return adapted if adapted is not None else as_workload(result, spec)


def loader_batch_size(loader: Any) -> int | None:
    """Samples per batch: the loader's batch_size, or a custom batch sampler's (None when neither says)."""
    size = getattr(loader, "batch_size", None)
    if size is None:
        size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    return size if isinstance(size, int) and size > 0 else None
