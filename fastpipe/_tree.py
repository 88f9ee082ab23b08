"""Finding tensors inside arbitrary batch structures.

Batches are whatever a collate_fn returns: tensors nested in tuples, lists, dicts,
namedtuples and dataclasses. Copying, pinning, timing and prefetching all need to reach
every tensor while rebuilding the same structure around it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

import torch


def map_tensors(fn: Callable[[torch.Tensor], Any], obj: Any) -> Any:
    """Return ``obj`` with every tensor ``t`` inside it replaced by ``fn(t)``; other leaves are kept."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(map_tensors(fn, item) for item in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(fn, item) for item in obj)
    if isinstance(obj, dict):
        return type(obj)((key, map_tensors(fn, value)) for key, value in obj.items())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: map_tensors(fn, getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changes)
    return obj


def iter_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Yield every tensor inside ``obj``, depth first."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from iter_tensors(item)
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from iter_tensors(value)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from iter_tensors(getattr(obj, f.name))


def tree_nbytes(obj: Any) -> int:
    """Total bytes held by the tensors in ``obj``: the host-to-device payload of a batch."""
    return sum(t.numel() * t.element_size() for t in iter_tensors(obj))
