"""Leave nothing the user owns changed: a diagnosis really trains, so their state is put back.

What :func:`preserve_user_state` restores when its block exits, however it exits:

* the model: every parameter and buffer (values, through ``load_state_dict``, so the tensors
  the optimizer holds stay the same objects), the non-persistent buffers too, which ``state_dict``
  leaves out (copied back into the very tensors, each put back on its module), every gradient (or its
  absence), and each submodule's train/eval mode;
* the optimizer: its whole ``state_dict`` (per-parameter state such as momentum and Adam's
  moments and step counts, and the param groups with their learning rates);
* LR schedulers passed in: each one's ``state_dict`` (its epoch count, last LR, and its
  own settings);
* a ``torch.amp.GradScaler`` passed in: its ``state_dict`` (scale, growth tracker and factors);
* random number generators: torch's CPU generator, every CUDA device's, NumPy's global one,
  Python's ``random``, and the generators of the loader, its sampler and its batch sampler's
  sampler. The CUDA ones are read only where CUDA is already initialized: reading them initializes
  CUDA (``torch.cuda.get_rng_state`` says so), which a process that never used its GPU must not be
  made to do. If CUDA is first initialized inside the block, each device's generator is put back
  at its seed's start (``manual_seed(initial_seed())``), where the user's first use would find it;
* the skip counts of fastpipe's ``ImageFolder(on_error="skip")`` (its ``skipped``, found on the
  loader's dataset and the datasets it wraps): the diagnosis decodes the same damaged files
  again, and :meth:`UserState.skipped_during` says how many it replaced, for the report.

Snapshots live in host memory: tensors are copied to the CPU (not cloned on the GPU, which
would take as much device memory again as the model and optimizer). Meta tensors hold no data
and are kept as they are. The dataset is not snapshotted: fastpipe never modifies it (it works
on shallow copies, see :mod:`fastpipe.stages`), and the loaders it builds get copies of the
sampler (:func:`fastpipe.loading._rebuild.rebuild_loader`).
"""

from __future__ import annotations

import contextlib
import copy
import random
from typing import Any, Iterable, Iterator

import numpy as np
import torch

from fastpipe._tree import iter_tensors


def _generators_of(loader: Any) -> list[torch.Generator]:
    found: list[torch.Generator] = []
    for owner in (loader, getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator) and all(generator is not g for g in found):
            found.append(generator)
    return found


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` in host memory (meta tensors, which hold no data, are returned as they are)."""
    if tensor.is_meta:
        return tensor
    return tensor.detach().to("cpu", copy=True)


def host_copy(state: Any) -> Any:
    """A deep copy of ``state`` (a state_dict) whose tensors are copies in host memory."""
    memo = {id(t): to_host(t) for t in iter_tensors(state)}
    return copy.deepcopy(state, memo)


def _skip_counters(loader: Any) -> list[Any]:
    """The ``skipped`` counters (fastpipe's SkipCount) of the loader's dataset and of the datasets it wraps."""
    from fastpipe.datasets.folder import SkipCount

    found: list[Any] = []
    todo, seen = [getattr(loader, "dataset", None)], set()
    while todo:
        dataset = todo.pop()
        if dataset is None or id(dataset) in seen:
            continue
        seen.add(id(dataset))
        counter = vars(dataset).get("skipped") if hasattr(dataset, "__dict__") else None
        if isinstance(counter, SkipCount) and all(counter is not c for c in found):
            found.append(counter)
        inner = getattr(dataset, "datasets", None)
        todo += [getattr(dataset, "dataset", None), *(inner if isinstance(inner, (list, tuple)) else ())]
    return found


def _non_persistent_buffers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.Tensor]]:
    """(module, name, tensor) of each buffer ``state_dict`` leaves out (``register_buffer(..., persistent=False)``)."""
    found = []
    for module in model.modules():
        for name in module._non_persistent_buffers_set:
            tensor = module._buffers.get(name)
            if tensor is not None:
                found.append((module, name, tensor))
    return found


class _ModelState:
    def __init__(self, model: torch.nn.Module) -> None:
        self.values = {name: to_host(value) for name, value in model.state_dict(keep_vars=True).items()}
        self.extra_buffers = [(module, name, tensor, to_host(tensor)) for module, name, tensor in _non_persistent_buffers(model)]
        self.grads = [None if p.grad is None else to_host(p.grad) for p in model.parameters()]
        self.modes = [m.training for m in model.modules()]

    def restore(self, model: torch.nn.Module) -> None:
        model.load_state_dict(self.values)  # copies into the existing tensors, on their own devices
        with torch.no_grad():
            for module, name, tensor, saved in self.extra_buffers:
                if not tensor.is_meta:
                    tensor.copy_(saved)
                module._buffers[name] = tensor  # the user's tensor, even if the step assigned another
        for param, grad in zip(model.parameters(), self.grads):
            param.grad = None if grad is None else grad.to(param.device)
        for module, mode in zip(model.modules(), self.modes):
            module.training = mode


class UserState:
    """A snapshot of everything listed in the module docstring, in host memory; :meth:`restore` puts it back."""

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        loader: Any = None,
        *,
        schedulers: Iterable[Any] | Any = (),
        scaler: Any = None,
    ) -> None:
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.schedulers = [schedulers] if hasattr(schedulers, "state_dict") else list(schedulers or ())
        self.model_state = _ModelState(model) if model is not None else None
        self.optimizer_state = host_copy(optimizer.state_dict()) if optimizer is not None else None
        self.scheduler_states = [host_copy(s.state_dict()) for s in self.schedulers]
        self.scaler_state = host_copy(scaler.state_dict()) if scaler is not None else None
        self.generators = _generators_of(loader)
        self.generator_states = [g.get_state() for g in self.generators]
        self.rng = (torch.get_rng_state(), np.random.get_state(), random.getstate())
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self.skip_counts = [(counter, counter.count) for counter in _skip_counters(loader)]

    def skipped_during(self) -> int | None:
        """Samples replaced under ``on_error="skip"`` since the snapshot (None when the dataset counts no skips)."""
        if not self.skip_counts:
            return None
        return sum(counter.count - before for counter, before in self.skip_counts)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the snapshot holds (for checking where its memory lives)."""
        held: list[torch.Tensor] = []
        if self.model_state is not None:
            held += list(self.model_state.values.values()) + [g for g in self.model_state.grads if g is not None]
        for state in (self.optimizer_state, *self.scheduler_states, self.scaler_state):
            held += list(iter_tensors(state))
        return held

    def restore(self) -> None:
        if self.model is not None and self.model_state is not None:
            self.model_state.restore(self.model)
        if self.optimizer is not None and self.optimizer_state is not None:
            self.optimizer.load_state_dict(self.optimizer_state)  # the whole state, moved back to the params' devices
        for scheduler, state in zip(self.schedulers, self.scheduler_states):
            scheduler.load_state_dict(state)
        if self.scaler is not None and self.scaler_state is not None:
            self.scaler.load_state_dict(self.scaler_state)
        for generator, state in zip(self.generators, self.generator_states):
            generator.set_state(state)
        torch.set_rng_state(self.rng[0])
        np.random.set_state(self.rng[1])
        random.setstate(self.rng[2])
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        elif torch.cuda.is_initialized():  # first initialized inside the block: back to each seed's start
            for generator in torch.cuda.default_generators:
                generator.manual_seed(generator.initial_seed())
        for counter, count in self.skip_counts:
            counter.set(count)


@contextlib.contextmanager
def preserve_user_state(
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    loader: Any = None,
    *,
    schedulers: Iterable[Any] | Any = (),
    scaler: Any = None,
) -> Iterator[UserState]:
    """Restore model, optimizer, schedulers, GradScaler, RNGs and the loader's generators when the block exits.

    Args:
        model, optimizer, loader: the user's; any may be None.
        schedulers: one LR scheduler or several (anything with ``state_dict`` / ``load_state_dict``).
        scaler: a ``torch.amp.GradScaler`` (or anything with ``state_dict`` / ``load_state_dict``).
    """
    state = UserState(model, optimizer, loader, schedulers=schedulers, scaler=scaler)
    try:
        yield state
    finally:
        state.restore()
