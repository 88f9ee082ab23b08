"""What every prefetcher accepts (depth, device transform), checked in one place.

Shared by fastpipe's :class:`~fastpipe.loading._prefetch.DevicePrefetcher` and the torchtnt adapter
(:mod:`fastpipe.loading._tnt`), so that neither imports the other: ``prefetch`` builds a torchtnt
prefetcher on request, and ``tnt`` needs only these checks.
"""

from __future__ import annotations

from typing import Any, Callable, Union

import torch

from fastpipe.devices import Device
from fastpipe.errors import ConfigError

Transform = Callable[[Any], Any]
DeviceLike = Union[str, Device, torch.device]
#: Values accepted by ``make_prefetcher(kind=...)`` and ``Workload.prefetcher``.
PREFETCHERS = ("fastpipe", "tnt")


def check_prefetch_args(depth: int, transform: Transform | None) -> None:
    """Reject a depth or transform that would fail later, less clearly, inside the epoch."""
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ConfigError(f"prefetch depth must be a whole number >= 1 (batches copied ahead), got {depth!r}; 2 is a good default")
    if transform is not None and not callable(transform):
        raise ConfigError(f"transform must be a function batch -> batch run on the device, got {type(transform).__name__}")
