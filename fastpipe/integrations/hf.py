"""fastpipe in the Hugging Face Trainer: the monitor as a ``TrainerCallback``, and the cache ladder on a Trainer.

``pip install 'fastpipe[hf]'`` (the real ``transformers`` package, imported only when used)::

    fastpipe.integrations.hf.watch(trainer)      # adds the callback; logs fastpipe/input_bound_share each epoch
    trainer.train()

    report = fastpipe.integrations.hf.diagnose(trainer, device="cuda")

The callback times the training DataLoader's ``next()`` (the DataLoader tap of :mod:`fastpipe.monitor`, from
``on_train_begin`` to ``on_train_end``, catching only the loader the Trainer trains on). The Trainer fetches
batches ahead (gradient accumulation, accelerate's look-ahead), so epochs end at ``on_epoch_end``; an
evaluation inside an epoch stops the clock from the moment its loader is iterated until ``on_evaluate``.
With the trainer given, each epoch's figures go through ``trainer.log`` to every reporter it has (TensorBoard,
W&B...) and into ``trainer.state.log_history``.

The tap is closed on every way out of ``train()``, not only at ``on_train_end`` (which the Trainer skips when
training raises or is interrupted): the callback wraps the trainer's ``train`` in a ``try/finally`` (an
instance attribute; ``del trainer.train`` removes it), when it knows the trainer before training starts (from
``watch(trainer)``, ``WatchCallback(trainer=...)``, or ``on_init_end`` for a callback passed to
``Trainer(callbacks=[...])``). A callback added later still closes its tap at the first ``iter()`` of any
DataLoader once the Trainer's training call is no longer running.

``diagnose`` runs :func:`fastpipe.diagnose` on ``trainer.get_train_dataloader()`` with the Trainer's own step:
``trainer.training_step`` (its loss, its mixed precision, its backward), gradient clipping at
``args.max_grad_norm``, ``optimizer.step()``, ``lr_scheduler.step()``, ``zero_grad``. The optimizer and
scheduler are the trainer's, created as ``train()`` would create them when it has none yet, and put back as
they were afterwards (None again, or the state they had); the model's weights and modes are restored.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from types import FrameType
from typing import Any, Callable

import torch

from fastpipe._deprecated import moved_keywords
from fastpipe.devices import Device, parse_device
from fastpipe.diagnosis import Report
from fastpipe.diagnosis import diagnose as _diagnose
from fastpipe.diagnosis._options import DiagnoseOptions, TrainState, as_options
from fastpipe.errors import ConfigError
from fastpipe.integrations._common import require
from fastpipe.monitor import SHARE_METRIC, WAIT_METRIC, Watch, close_tap, open_tap

_CALLBACK: type | None = None


def _transformers() -> Any:
    return require("transformers", "hf", "transformers")


def __getattr__(name: str) -> Any:
    if name == "WatchCallback":  # built on first use, so importing this module does not import transformers
        return _callback_class()
    raise AttributeError(name)


def watch(trainer: Any, **options: Any) -> Any:
    """Add a :class:`WatchCallback` that logs through ``trainer.log``; returns the callback (its ``.watch`` after)."""
    callback = _callback_class()(trainer=trainer, **options)  # wraps trainer.train: the tap closes on every way out
    trainer.add_callback(callback)
    return callback


def _callback_class() -> type:
    global _CALLBACK
    if _CALLBACK is None:
        _CALLBACK = _make_callback_class(_transformers().TrainerCallback)
    return _CALLBACK


def _trainer_on_stack(depth: int = 2) -> tuple[Any, FrameType | None]:
    """The Trainer whose method is running below this call, and the frame of its ``train`` (None if not in it)."""
    trainer_class = _transformers().Trainer
    frame: FrameType | None = sys._getframe(depth)
    trainer, train_frame = None, None
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, trainer_class):
            trainer = owner
            if frame.f_code.co_name == "train":
                train_frame = frame
        frame = frame.f_back
    return trainer, train_frame


def _running(frame: FrameType) -> bool:
    """Whether ``frame`` is on the calling stack (the training call it belongs to has not returned)."""
    current: FrameType | None = sys._getframe(1)
    while current is not None:
        if current is frame:
            return True
        current = current.f_back
    return False


def _guard_train(trainer: Any, callback: Any) -> None:
    """Wrap ``trainer.train`` so that the callback's tap is closed however training ends (once per callback)."""
    inner = trainer.train
    if callback in getattr(inner, "_fastpipe_callbacks", ()):
        return

    @functools.wraps(inner)
    def train(*args: Any, **kwargs: Any) -> Any:
        try:
            return inner(*args, **kwargs)
        finally:
            callback.close_tap()

    train._fastpipe_callbacks = (*getattr(inner, "_fastpipe_callbacks", ()), callback)  # type: ignore[attr-defined]
    trainer.train = train


def _make_callback_class(base: type) -> type:
    class WatchCallback(base):  # type: ignore[misc, valid-type]
        """Runs :func:`fastpipe.watch`'s monitor on the Trainer's training DataLoader.

        Args:
            trainer: log each epoch's figures through ``trainer.log`` (to every reporter); without it they go
                to ``state.log_history`` only. ``fastpipe.integrations.hf.watch(trainer)`` passes it.
            echo, memory, every: as for :func:`fastpipe.watch`.
        """

        def __init__(self, trainer: Any = None, *, echo: Any = True, memory: bool = True, every: int | None = None) -> None:
            self.trainer = trainer
            self.options = dict(echo=echo, memory=memory, every=every)
            self.watch: Watch | None = None
            self._tap: Any = None
            if trainer is not None:
                _guard_train(trainer, self)

        def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            trainer, _ = _trainer_on_stack()  # called from Trainer.__init__: guard its train() before it runs
            if trainer is not None:
                _guard_train(trainer, self)

        def on_train_begin(self, args: Any, state: Any, control: Any, train_dataloader: Any = None, **kwargs: Any) -> None:
            if train_dataloader is None:
                return
            self.close_tap()  # one tap per training run, whatever the last one left
            suggest = f'report = fastpipe.integrations.hf.diagnose(trainer, device="{args.device}"); print(report)'
            self.watch = watch_ = Watch([], ends_epochs=False, suggest=suggest, **self.options)
            _, training = _trainer_on_stack()

            # accelerate's DataLoaderShard wraps the DataLoader that is really iterated (its base_dataloader)
            trained = {id(train_dataloader), id(getattr(train_dataloader, "base_dataloader", train_dataloader))}

            def select(loader: Any) -> Watch | None:
                if training is not None and not _running(training):  # train() left without on_train_end, unguarded
                    self.close_tap()
                    return None
                if id(loader) in trained:
                    return watch_
                watch_.pause()  # another loader iterated while training: an evaluation, until on_evaluate
                return None

            self._tap = open_tap(select)

        def close_tap(self) -> None:
            """Put ``DataLoader.__iter__`` back (this callback's part of it); again is a no-op."""
            if self._tap is not None:
                tap, self._tap = self._tap, None
                close_tap(tap)

        def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.watch is not None:
                self.watch.resume()

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.watch is None:
                return
            epoch = self.watch.end_epoch()
            if epoch is None or not epoch.steps:
                return
            logs = {SHARE_METRIC: epoch.share, WAIT_METRIC: 1000 * epoch.wait_s / epoch.steps}
            if self.trainer is not None:
                self.trainer.log(logs)
            else:
                state.log_history.append({**logs, "step": state.global_step})

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.close_tap()

    return WatchCallback


# ----- the cache ladder on a Trainer ----------------------------------------------------------------
def trainer_step(trainer: Any) -> Callable[[Any], None]:
    """One optimizer step as ``Trainer.train`` runs it (no gradient accumulation), on a batch already on the device."""
    model, args = trainer.model, trainer.args

    def step(batch: Any) -> None:
        model.train()
        trainer.training_step(model, batch)
        if args.max_grad_norm and args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        trainer.optimizer.step()
        if trainer.lr_scheduler is not None and not isinstance(trainer.lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            trainer.lr_scheduler.step()
        model.zero_grad()

    return step


@moved_keywords({"options": DiagnoseOptions}, positional=("device",))
def diagnose(trainer: Any, *, device: "str | Device | None" = None, options: DiagnoseOptions | None = None) -> Report:
    """The cache ladder on a ``transformers.Trainer``'s training loader, step, optimizer and scheduler.

    Args:
        trainer: the Trainer (its model, optimizer and scheduler are put back afterwards).
        device: as for :func:`fastpipe.diagnose`; default the trainer's ``args.device``. A device that runs the
            model must be the trainer's own (its step moves inputs there).
        options: as for :func:`fastpipe.diagnose` (a :class:`~fastpipe.DiagnoseOptions`).
    """
    options = as_options(DiagnoseOptions, options)
    transformers = _transformers()
    if not isinstance(trainer, transformers.Trainer):
        raise ConfigError(f"diagnose needs a transformers.Trainer, not {type(trainer).__name__}")
    dev = parse_device(str(trainer.args.device) if device is None else device)
    if dev.runs_model and dev.torch_device.type != torch.device(trainer.args.device).type:
        raise ConfigError(
            f"the trainer runs on {trainer.args.device} and its step moves inputs there; pass "
            f"device={str(trainer.args.device)!r} (or a sim: device), or build the trainer for {dev.spec}"
        )
    loader = trainer.get_train_dataloader()
    # accelerate's wrapper adds device placement and RNG synchronisation across processes; the ladder copies to the
    # device itself, so it runs on the DataLoader inside (one process: the same batches)
    loader = getattr(loader, "base_dataloader", loader)
    created = trainer.optimizer is None, trainer.lr_scheduler is None
    if any(created):
        steps = trainer.args.max_steps if trainer.args.max_steps > 0 else max(1, len(loader)) * int(max(1, trainer.args.num_train_epochs))
        trainer.create_optimizer_and_scheduler(num_training_steps=steps)
    had_accumulation = hasattr(trainer, "current_gradient_accumulation_steps")
    if not had_accumulation:  # set by train() for each optimizer step; training_step divides the loss by it
        trainer.current_gradient_accumulation_steps = 1
    try:
        if options.name is None:
            options = dataclasses.replace(options, name=f"{type(trainer.model).__name__} (Hugging Face Trainer)")
        schedulers = [trainer.lr_scheduler] if trainer.lr_scheduler is not None else []
        state = TrainState(model=trainer.model, optimizer=trainer.optimizer, schedulers=schedulers)
        return _diagnose(loader, trainer_step(trainer), device=dev, options=options, train_state=state)
    finally:
        if created[0]:
            trainer.optimizer = None
        if created[1]:
            trainer.lr_scheduler = None
        if not had_accumulation:
            del trainer.current_gradient_accumulation_steps
