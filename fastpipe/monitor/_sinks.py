"""Where a monitor's figures go besides the terminal: a logger, a TensorBoard writer, or any callable.

Declared by the type of what the user passes, never by trying calls: a ``logging.Logger`` gets the summary
line; a TensorBoard ``SummaryWriter`` (or its bound ``add_scalar``) gets one scalar per metric at the step
count; any other callable gets the metrics as one dict (``wandb.log`` takes exactly that).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from fastpipe.errors import ConfigError

Sink = Callable[[dict[str, float], int, str], None]
"""``sink(metrics, step, line)``: what the monitor calls at each summary."""


def make_sink(log: Any) -> Sink | None:
    """Turn the ``log=`` argument into a sink (None for none); a non-callable is a ConfigError saying what fits."""
    if log is None:
        return None
    if isinstance(log, logging.Logger):
        return lambda metrics, step, line: log.info(line)
    add_scalar = getattr(log, "add_scalar", None)
    if callable(add_scalar):  # torch.utils.tensorboard.SummaryWriter, tensorboardX
        return lambda metrics, step, line: _scalars(add_scalar, metrics, step)
    if callable(log) and getattr(log, "__name__", "") == "add_scalar":
        return lambda metrics, step, line: _scalars(log, metrics, step)
    if callable(log):
        return lambda metrics, step, line: log(dict(metrics))
    raise ConfigError(
        f"log must be a logging.Logger, a SummaryWriter (or its add_scalar) or a callable taking a dict "
        f"such as wandb.log; got {type(log).__name__}"
    )


def _scalars(add_scalar: Callable[..., Any], metrics: dict[str, float], step: int) -> None:
    for name, value in metrics.items():
        add_scalar(name, value, step)
