"""Leave nothing the user owns changed: a diagnosis really trains, so their state is put back.

Snapshots the model (parameters, buffers, gradients, train/eval modes), the optimizer state,
and every random number generator a training loop advances (torch, CUDA, numpy, Python's,
and the loader's and sampler's own generators), and restores them bit for bit.
"""
from __future__ import annotations

import contextlib
import copy
import random
from typing import Any, Iterator

import numpy as np
import torch


def _generators_of(loader: Any) -> list[torch.Generator]:
    found: list[torch.Generator] = []
    for owner in (loader, getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator) and all(generator is not g for g in found):
            found.append(generator)
    return found


@contextlib.contextmanager
def preserve_user_state(
    model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None, loader: Any = None
) -> Iterator[None]:
    """Restore model, optimizer, RNGs and the loader's generators when the block exits, however it exits."""
    model_state = None
    if model is not None:
        model_state = (
            {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()},
            [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()],
            [m.training for m in model.modules()],
        )
    optimizer_state = copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None
    generators = _generators_of(loader)
    generator_states = [g.get_state() for g in generators]
    rng = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        if model is not None and model_state is not None:
            values, grads, modes = model_state
            model.load_state_dict(values)
            for param, grad in zip(model.parameters(), grads):
                param.grad = grad
            for module, mode in zip(model.modules(), modes):
                module.training = mode
        if optimizer is not None and optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)  # replaces the whole state, momentum buffers included
        for generator, state in zip(generators, generator_states):
            generator.set_state(state)
        torch.set_rng_state(rng[0])
        np.random.set_state(rng[1])
        random.setstate(rng[2])
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
