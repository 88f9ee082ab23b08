"""What the framework integrations share: importing a framework with a clear error, and steps that really train."""

from __future__ import annotations

import contextlib
import importlib
from types import ModuleType
from typing import Any, Iterator

import torch

from fastpipe.errors import ConfigError, OptionalDependencyError


def require(module: str, extra: str, package: str) -> ModuleType:
    """Import ``module`` or say how to install it (``pip install 'fastpipe[extra]'``)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise OptionalDependencyError(
            f"this needs the {package} package: pip install 'fastpipe[{extra}]' (or pip install {package})"
        ) from exc


def autocast_for(precision: str, device_type: str) -> "contextlib.AbstractContextManager[Any]":
    """The autocast a framework's precision setting means: fp16 or bf16 for the mixed ones, nothing otherwise."""
    text = str(precision)
    if text in ("16-mixed", "16", "fp16"):
        return torch.autocast(device_type, dtype=torch.float16)
    if text in ("bf16-mixed", "bf16"):
        return torch.autocast(device_type, dtype=torch.bfloat16)
    if text in ("32-true", "32", "64-true", "64", "no", "None"):
        return contextlib.nullcontext()
    raise ConfigError(
        f"precision {precision!r} is not one the diagnosis can reproduce; use '32-true', '16-mixed' or "
        "'bf16-mixed' (a module already cast to a true half precision runs as it is with '32-true')"
    )


@contextlib.contextmanager
def on_device(module: torch.nn.Module, device: torch.device) -> Iterator[None]:
    """Move ``module`` to ``device`` for the block and back to where its first parameter was (parameters keep identity)."""
    first = next(iter(module.parameters()), None)
    home = first.device if first is not None else torch.device("cpu")
    module.to(device)
    try:
        yield
    finally:
        module.to(home)
