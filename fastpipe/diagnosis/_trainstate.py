"""What a running script trains, found without its help, so script mode can put it back after the ladder.

An unmodified script hands fastpipe nothing but its DataLoader. When the ladder starts, the script's model,
optimizer, LR schedulers and GradScaler already exist in its frames; the garbage collector's list of live objects
holds every one of them, so they are read from there (once, at the handover): every ``nn.Module`` that is no other
module's child and holds parameters or buffers (the model, an EMA copy; a wrapper such as DDP or ``torch.compile``'s
counts once, with the model inside), every optimizer (a wrapper that only forwards to another, as accelerate's
``AcceleratedOptimizer`` does, counts as the one inside), every LR scheduler and every GradScaler. Their states are
snapshotted and restored by :mod:`fastpipe.diagnosis.runtime._snapshot`, as for a factory.

What cannot be found this way is the script's own bookkeeping (its step counter, a framework's ``global_step``):
those count the ladder's steps; the report says so.
"""

from __future__ import annotations

import gc
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


class Roots(nn.Module):
    """The script's root modules as one module, for the snapshot (the modules themselves are not changed)."""

    def __init__(self, modules: list[nn.Module]) -> None:
        super().__init__()
        self.roots = nn.ModuleList(modules)


@dataclass
class TrainingState:
    """The script's training objects found at the handover."""

    modules: list[nn.Module] = field(default_factory=list)
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    scalers: list[Any] = field(default_factory=list)

    @property
    def model(self) -> nn.Module | None:
        """One module for the snapshot: the root itself when there is one, else all of them together."""
        if not self.modules:
            return None
        return self.modules[0] if len(self.modules) == 1 else Roots(self.modules)

    def device(self) -> torch.device | None:
        """Where the largest root module's parameters live: the script's training device (None: no module found)."""
        best, size = None, -1
        for module in self.modules:
            tensors = list(module.parameters()) or list(module.buffers())
            count = sum(t.numel() for t in tensors)
            if tensors and count > size:
                best, size = tensors[0].device, count
        return best

    def describe(self) -> str:
        """What will be restored, in words, for the announcement."""
        parts = []
        if self.modules:
            names = ", ".join(type(m).__name__ for m in self.modules[:3]) + (", ..." if len(self.modules) > 3 else "")
            parts.append(f"{len(self.modules)} model(s) ({names})")
        for items, what in ((self.optimizers, "optimizer"), (self.schedulers, "LR scheduler"), (self.scalers, "GradScaler")):
            if items:
                parts.append(f"{len(items)} {what}(s)")
        return ", ".join(parts) if parts else "no model or optimizer (none was found among the live objects)"


def _is_scheduler(kind: type) -> bool:
    base = getattr(torch.optim.lr_scheduler, "LRScheduler", None) or torch.optim.lr_scheduler._LRScheduler
    return issubclass(kind, (base, torch.optim.lr_scheduler.ReduceLROnPlateau))


def _is_scaler(kind: type) -> bool:
    kinds = tuple(k for k in (getattr(torch.amp, "GradScaler", None), getattr(torch.cuda.amp, "GradScaler", None)) if k is not None)
    return issubclass(kind, kinds)


def _sort(objects: list[Any], modules: list[nn.Module], state: TrainingState) -> None:
    for obj in objects:
        kind = type(obj)  # not isinstance: a weakref proxy to a module passes isinstance, and is no module of its own
        if issubclass(kind, nn.Module):
            if kind is not Roots:
                modules.append(obj)
        elif issubclass(kind, torch.optim.Optimizer):
            state.optimizers.append(obj)
        elif _is_scheduler(kind):
            state.schedulers.append(obj)
        elif _is_scaler(kind):
            state.scalers.append(obj)


def find_training_state() -> TrainingState:
    """The script's modules, optimizers, schedulers and scalers among the live objects (see the module docstring)."""
    modules: list[nn.Module] = []
    state = TrainingState()
    with warnings.catch_warnings():  # isinstance on some live objects (deprecated torch aliases) warns
        warnings.simplefilter("ignore")
        objects = gc.get_objects()
        _sort(objects, modules, state)
        del objects
    children = {id(child) for module in modules for child in module.children()}
    state.modules = [
        m for m in modules if id(m) not in children and (next(m.parameters(), None) is not None or next(m.buffers(), None) is not None)
    ]
    # a wrapper that forwards to another optimizer (accelerate's) is restored through the one inside
    state.optimizers = [o for o in state.optimizers if not isinstance(getattr(o, "optimizer", None), torch.optim.Optimizer)]
    return state
