"""What the user's loading already does, so that advice never tells them to do it (issue 38, item 3).

A report that tells a loader which already prefetches to "use fastpipe.DevicePrefetcher", one that already ships uint8
to "send uint8", or a CPU run to "pin memory" for a copy that does not exist, gives advice that costs the user time
and trust. :class:`LoaderFacts` holds what the device and the loader say, read once when the report is written:

* ``copies``: the device has a host-to-device copy (not ``cpu``: :func:`fastpipe.diagnosis.ladder._plan.has_copy`);
* ``pinned``: the DataLoader pins its batches (``pin_memory=True``);
* ``prefetcher``: what already copies batches ahead of the step: the wrapper fastpipe unwrapped in factory mode
  (its prefetch depth), or, in script mode, where the script iterates a wrapper around the DataLoader it watches
  (timm's ``PrefetchLoader``, fastpipe's ``DevicePrefetcher``), that wrapper, found among the objects that hold
  the loader and recognised by :func:`fastpipe.loading._unwrap.unwrap_loader`.

Whether the batches are already uint8 is read from the pipeline found (:func:`fastpipe.diagnosis.verdict._advice.ships_uint8`).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any

from fastpipe.diagnosis.ladder._plan import has_copy

MAX_DICTS = 8
"""Dictionaries holding the loader that :func:`prefetching_wrapper` looks behind (an instance's ``__dict__``)."""


@dataclass(frozen=True)
class LoaderFacts:
    """What the device and the loader already do (see the module docstring)."""

    copies: bool = True
    pinned: bool = False
    prefetcher: str | None = None
    """What already copies batches ahead of the step (a name for the report), or None."""


def prefetching_wrapper(loader: Any) -> str | None:
    """The class name of a prefetching wrapper that holds ``loader`` (timm's PrefetchLoader, fastpipe's DevicePrefetcher),
    found among the objects that refer to it; None when there is none.

    Script mode watches the DataLoader the script's wrapper iterates, so the wrapper itself never reaches the ladder;
    it is still alive (the script holds it), and :func:`~fastpipe.loading._unwrap.unwrap_loader` knows its kind.
    """
    from fastpipe.loading._unwrap import unwrap_loader

    holders: list[Any] = []
    dicts = 0
    for referrer in gc.get_referrers(loader):
        if isinstance(referrer, dict):  # an instance's __dict__: the instance is what refers to that dict
            dicts += 1
            if dicts <= MAX_DICTS:  # each look is a pass over the heap: a few, not every namespace holding the loader
                holders += [obj for obj in gc.get_referrers(referrer) if getattr(obj, "__dict__", None) is referrer]
        else:
            holders.append(referrer)
    for holder in holders:
        if isinstance(holder, (list, tuple, set, dict)) or type(holder).__name__ in ("frame", "function", "generator", "cell"):
            continue
        try:
            found = unwrap_loader(holder)
        except Exception:  # a ConfigError: not a wrapper fastpipe knows; any other: its attributes refuse to be read
            continue
        if found.loader is loader and found.prefetch_depth:
            return type(holder).__name__
    return None


def loader_facts(workload: Any, device_kind: str, *, find_wrapper: bool = True) -> LoaderFacts:
    """The facts for a diagnosed workload on a device of ``device_kind`` (``Device.kind``); ``find_wrapper``: look for
    a prefetching wrapper around the loader (:func:`prefetching_wrapper`, a pass over the heap: only when a copy is advised)."""
    loader = workload.loader
    prefetcher = None
    if getattr(workload, "prefetch_depth", 0):
        prefetcher = f"the loader's prefetcher (depth {workload.prefetch_depth})"
    elif has_copy(device_kind) and find_wrapper:
        name = prefetching_wrapper(loader)
        prefetcher = None if name is None else f"the script's {name}"
    return LoaderFacts(copies=has_copy(device_kind), pinned=bool(getattr(loader, "pin_memory", False)), prefetcher=prefetcher)
