"""fastpipe in Lightning: the monitor as a ``Callback``, and the cache ladder on a ``LightningModule``.

``pip install 'fastpipe[lightning]'`` (the real ``lightning`` package, imported only when used)::

    trainer = lightning.Trainer(callbacks=[fastpipe.integrations.lightning.WatchCallback()])
    trainer.fit(module, datamodule)            # logs fastpipe/input_bound_share each epoch

    report = fastpipe.integrations.lightning.diagnose(module, datamodule, device="cuda")

The callback times the training DataLoader's ``next()`` inside ``Trainer.fit`` (the DataLoader tap of
:mod:`fastpipe.monitor`, active from ``on_fit_start`` to ``on_fit_end`` and catching only the loaders iterated
while the trainer is training, so validation loaders are left alone; validation time is not counted either). Lightning fetches one batch
ahead, so its iterator is exhausted before the last step: epochs end at ``on_train_epoch_end`` instead.

``diagnose`` builds the step Lightning would run, from the module itself: ``training_step(batch, batch_idx)``
under the precision's autocast, the loss (a tensor or ``{"loss": ...}``) backpropagated, the optimizer and the
per-step schedulers from ``configure_optimizers``; ``on_after_batch_transfer`` runs on the device as Lightning
runs it. ``self.log`` calls are dropped while it runs (no trainer is attached). Everything is restored after:
the parameters, buffers, modes (by :func:`fastpipe.diagnose`), the module's device, and its ``log``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from fastpipe._deprecated import moved_keywords
from fastpipe.devices import Device, parse_device
from fastpipe.diagnosis import Report
from fastpipe.diagnosis import diagnose as _diagnose
from fastpipe.diagnosis._options import DiagnoseOptions, TrainState, as_options
from fastpipe.errors import ConfigError
from fastpipe.integrations._common import autocast_for, on_device, require
from fastpipe.monitor import SHARE_METRIC, WAIT_METRIC, Watch, tap_dataloaders
from fastpipe.workloads import Workload

_CALLBACK: type | None = None


def _lightning() -> Any:
    return require("lightning.pytorch", "lightning", "lightning")


def __getattr__(name: str) -> Any:
    if name == "WatchCallback":  # built on first use, so importing this module does not import lightning
        return _callback_class()
    raise AttributeError(name)


def _callback_class() -> type:
    global _CALLBACK
    if _CALLBACK is None:
        _CALLBACK = _make_callback_class(_lightning().Callback)
    return _CALLBACK


def _make_callback_class(base: type) -> type:
    class WatchCallback(base):  # type: ignore[misc, valid-type]
        """Runs :func:`fastpipe.watch`'s monitor on the training DataLoader inside ``Trainer.fit``.

        Each epoch it prints the monitor's line and logs ``fastpipe/input_bound_share`` (and the wait per step)
        through the module's ``log``, so every logger the trainer has gets them. ``watch`` holds the
        :class:`~fastpipe.monitor.Watch` afterwards (``callback.watch.summary()``).

        Args:
            echo, memory, every: as for :func:`fastpipe.watch`.
        """

        def __init__(self, *, echo: Any = True, memory: bool = True, every: int | None = None) -> None:
            super().__init__()
            self.options = dict(echo=echo, memory=memory, every=every)
            self.watch: Watch | None = None
            self._tap: Any = None

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            suggest = (
                f'report = fastpipe.integrations.lightning.diagnose(module, datamodule, device="{_device_of(pl_module)}"); print(report)'
            )
            self.watch = Watch([], ends_epochs=False, suggest=suggest, **self.options)
            self._tap = tap_dataloaders(lambda loader: self.watch if trainer.training and not trainer.sanity_checking else None)
            self._tap.__enter__()

        def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
            if self.watch is not None:
                self.watch.pause()

        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            if self.watch is not None:
                self.watch.resume()

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if self.watch is None:
                return
            epoch = self.watch.end_epoch()
            if epoch is not None and epoch.steps:
                pl_module.log(SHARE_METRIC, epoch.share, on_epoch=True, prog_bar=False)
                pl_module.log(WAIT_METRIC, 1000 * epoch.wait_s / epoch.steps, on_epoch=True)

        def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
            self._close()

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            self._close()

        def _close(self) -> None:
            if self._tap is not None:
                tap, self._tap = self._tap, None
                tap.__exit__(None, None, None)

    return WatchCallback


def _device_of(module: torch.nn.Module) -> str:
    first = next(iter(module.parameters()), None)
    return "cpu" if first is None else str(first.device)


# ----- the cache ladder on a LightningModule --------------------------------------------------------
def train_loader_of(datamodule_or_loader: Any) -> Any:
    """The training DataLoader: the loader itself, or a datamodule's ``train_dataloader()`` after ``setup("fit")``."""
    if hasattr(datamodule_or_loader, "train_dataloader") and callable(datamodule_or_loader.train_dataloader):
        datamodule = datamodule_or_loader
        datamodule.prepare_data()
        datamodule.setup("fit")
        return datamodule.train_dataloader()
    return datamodule_or_loader


def optimizers_of(module: Any) -> tuple[torch.optim.Optimizer, list[Any]]:
    """The optimizer and the schedulers stepped every step, from any form ``configure_optimizers`` may return."""
    config = module.configure_optimizers()
    optimizers, schedulers = [], []
    items = config if isinstance(config, (list, tuple)) else [config]
    if len(items) == 2 and all(isinstance(part, (list, tuple)) for part in items):  # ([optimizers], [schedulers])
        optimizers, raw_schedulers = list(items[0]), list(items[1])
    else:
        raw_schedulers = []
        for item in items:
            if isinstance(item, dict):
                optimizers.append(item["optimizer"])
                if "lr_scheduler" in item:
                    raw_schedulers.append(item["lr_scheduler"])
            else:
                optimizers.append(item)
    for scheduler in raw_schedulers:
        if isinstance(scheduler, dict):
            if scheduler.get("interval", "epoch") == "step":
                schedulers.append(scheduler["scheduler"])
        # a scheduler stepped per epoch does not step within the few hundred steps a diagnosis runs
    if len(optimizers) != 1 or not getattr(module, "automatic_optimization", True):
        raise ConfigError(
            f"diagnose supports one optimizer with automatic optimization; configure_optimizers gave "
            f"{len(optimizers)} (for manual optimization, call fastpipe.diagnose(loader, step) with your own step)"
        )
    return optimizers[0], schedulers


def lightning_step(
    module: Any, optimizer: torch.optim.Optimizer, schedulers: list[Any], precision: str, device: torch.device
) -> Callable[[Any], None]:
    """One automatic-optimization step as Lightning runs it, on a batch already on the device."""
    autocast_for(precision, device.type)  # an unsupported precision fails here, before any worker starts
    autocast = lambda: autocast_for(precision, device.type)  # noqa: E731 -- a fresh context per step
    scaler = torch.amp.GradScaler(device.type) if str(precision) in ("16-mixed", "16") and device.type == "cuda" else None
    counter = {"batch_idx": 0}

    def step(batch: Any) -> None:
        batch = module.on_after_batch_transfer(batch, 0)
        with autocast():
            out = module.training_step(batch, counter["batch_idx"])
        counter["batch_idx"] += 1
        loss = out["loss"] if isinstance(out, dict) else out
        if loss is None:  # Lightning skips the optimizer step
            return
        optimizer.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        for scheduler in schedulers:
            scheduler.step()

    return step


@moved_keywords({"options": DiagnoseOptions}, positional=("device",))
def diagnose(
    module: Any,
    datamodule_or_loader: Any,
    *,
    device: "str | Device | None" = None,
    options: DiagnoseOptions | None = None,
    precision: str | None = None,
) -> Report:
    """The cache ladder on a LightningModule's own training step, optimizer, schedulers and precision.

    Args:
        module: the ``LightningModule`` (its parameters and modes are restored afterwards).
        datamodule_or_loader: a ``LightningDataModule`` (its ``train_dataloader()``) or the DataLoader.
        device: as for :func:`fastpipe.diagnose`; the module is moved there for the run and moved back.
        precision: Lightning's precision string; default the attached trainer's, else ``"32-true"``.
        options: as for :func:`fastpipe.diagnose` (a :class:`~fastpipe.DiagnoseOptions`; its ``precision`` is the
            measurement's, this function's ``precision`` Lightning's).
    """
    options = as_options(DiagnoseOptions, options)
    loader, dev, precision, torch_device = _prepare(module, datamodule_or_loader, device, precision)
    with on_device(module, torch_device), _LoggingDropped(module):
        optimizer, schedulers = optimizers_of(module)
        step = lightning_step(module, optimizer, schedulers, precision, torch_device)
        if options.name is None:
            options = dataclasses.replace(options, name=f"{type(module).__name__} (Lightning, {precision})")
        state = TrainState(model=module, optimizer=optimizer, schedulers=schedulers)
        return _diagnose(loader, step, device=dev, options=options, train_state=state)


def _prepare(
    module: Any, datamodule_or_loader: Any, device: "str | Device | None", precision: str | None
) -> tuple[Any, Device, str, torch.device]:
    """(training loader, fastpipe device, precision, the torch device the module runs on) for :func:`diagnose`."""
    lightning = _lightning()
    if not isinstance(module, lightning.LightningModule):
        raise ConfigError(f"diagnose needs a lightning.LightningModule, not {type(module).__name__}")
    loader = train_loader_of(datamodule_or_loader)
    dev = parse_device(device)
    if precision is None:
        try:
            precision = str(module.trainer.precision)
        except RuntimeError:  # not attached to a trainer
            precision = "32-true"
    return loader, dev, precision, dev.torch_device if dev.runs_model else torch.device("cpu")


def is_module_pair(result: Any) -> bool:
    """Whether a workload factory returned ``(LightningModule, datamodule or DataLoader)`` (lightning already imported)."""
    import sys

    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        return False
    bases = [getattr(sys.modules.get(name), "LightningModule", None) for name in ("lightning.pytorch", "pytorch_lightning")]
    return any(base is not None and isinstance(result[0], base) for base in bases)


def workload(
    module: Any, datamodule_or_loader: Any, device: "str | Device | None" = None, *, precision: str | None = None, name: str | None = None
) -> Workload:
    """A :class:`fastpipe.Workload` of a LightningModule's own step, as :func:`diagnose` builds it, for a process that
    only diagnoses (the CLI's ``fastpipe diagnose module:factory`` with a factory returning ``(module, datamodule)``).

    Unlike :func:`diagnose` it leaves the module on ``device`` with ``self.log`` dropped: there is no block to undo
    them after (the diagnosis itself still restores the parameters, optimizer and schedulers).
    """
    loader, dev, precision, torch_device = _prepare(module, datamodule_or_loader, device, precision)
    module.to(torch_device)
    _LoggingDropped(module).__enter__()
    optimizer, schedulers = optimizers_of(module)
    step = lightning_step(module, optimizer, schedulers, precision, torch_device)
    label = name or f"{type(module).__name__} (Lightning, {precision})"
    return Workload(loader=loader, step=step, model=module, optimizer=optimizer, schedulers=schedulers, name=label)


class _LoggingDropped:
    """``self.log`` / ``self.log_dict`` as no-ops on this instance for the block (no trainer to log to)."""

    NAMES = ("log", "log_dict")

    def __init__(self, module: Any) -> None:
        self.module = module
        self.saved: dict[str, Any] = {}

    def __enter__(self) -> None:
        self.saved = {name: vars(self.module)[name] for name in self.NAMES if name in vars(self.module)}
        for name in self.NAMES:
            vars(self.module)[name] = lambda *args, **kwargs: None

    def __exit__(self, *exc: Any) -> None:
        for name in self.NAMES:
            vars(self.module).pop(name, None)
        vars(self.module).update(self.saved)
