"""A batch as one flat byte buffer plus a skeleton: where each tensor lives, and the structure around it.

Workers write a batch into a reused buffer and send only this small description; the training
process rebuilds the batch as views into its own mapping of the same buffer. Both sides share
this module, so the layout written is the layout read.

The default collate path never materialises a stacked tensor of its own: it runs PyTorch's own
``collate`` (so tuples, lists, dicts, namedtuples and number or string leaves come out exactly as
``default_collate`` makes them) with the tensor and array leaves replaced by plans that
``torch.stack`` straight into the buffer. That stack into reused memory is the whole saving:
``default_collate`` in a worker stacks into a freshly allocated shared-memory segment, and
touching 48 MB of new pages costs far more than the copy itself.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.utils.data._utils.collate import collate, default_collate, default_collate_fn_map

#: Each tensor starts at a multiple of this many bytes (a cache line; vectorised copies like it).
ALIGN = 64


@dataclass(frozen=True)
class Marker:
    """Stands in the skeleton where leaf number ``index`` goes."""

    index: int


@dataclass(frozen=True)
class LeafSpec:
    """Where one tensor lives in the buffer: byte offset, dtype and (contiguous) shape."""

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


class _Stack:
    """A tensor leaf that is not built yet: ``samples`` to be stacked into the buffer."""

    def __init__(self, samples: Sequence[torch.Tensor]) -> None:
        self.samples = samples
        first = samples[0]
        self.dtype = first.dtype
        self.shape = (len(samples), *first.shape)

    def write(self, out: torch.Tensor) -> None:
        torch.stack(list(self.samples), 0, out=out)  # raises as default_collate does when sizes differ


def _plan_tensor(batch: Sequence[torch.Tensor], *, collate_fn_map: Any = None) -> _Stack:
    return _Stack(batch)


def _plan_ndarray(batch: Sequence[np.ndarray], *, collate_fn_map: Any = None) -> Any:
    if batch[0].dtype.kind in "SaUO":  # default_collate's own error for string and object arrays
        return default_collate_fn_map[np.ndarray](batch, collate_fn_map=collate_fn_map)
    return _Stack([torch.as_tensor(b) for b in batch])


#: default_collate's rules, with tensor and array leaves planned instead of stacked.
PLAN_FN_MAP: dict[Any, Callable[..., Any]] = {
    torch.Tensor: _plan_tensor,
    np.ndarray: _plan_ndarray,
    **{key: fn for key, fn in default_collate_fn_map.items() if key not in (torch.Tensor, np.ndarray)},
}


@dataclass
class Plan:
    """A batch ready to be written: its skeleton, the leaves' layout, and the total bytes needed."""

    skeleton: Any
    specs: list[LeafSpec]
    sources: list["_Stack | torch.Tensor"]
    nbytes: int

    def write(self, buffer: torch.Tensor) -> None:
        """Write every leaf into ``buffer`` (a flat uint8 tensor of at least ``nbytes``)."""
        for spec, source in zip(self.specs, self.sources):
            out = view_leaf(buffer, spec)
            if isinstance(source, _Stack):
                source.write(out)
            else:
                out.copy_(source)


def plan_batch(samples: list[Any], collate_fn: Callable[[list[Any]], Any] | None) -> Plan:
    """Plan the batch ``collate_fn(samples)`` would make; ``None`` means ``default_collate``.

    A custom ``collate_fn`` is run as it is and its output tensors are copied into the buffer
    (one copy into reused memory); only the default path stacks the samples straight in.
    """
    if collate_fn is None or collate_fn is default_collate:
        planned = collate(samples, collate_fn_map=PLAN_FN_MAP)
    else:
        planned = collate_fn(samples)
    specs: list[LeafSpec] = []
    sources: list[_Stack | torch.Tensor] = []
    offset = 0

    def leaf(source: "_Stack | torch.Tensor") -> Marker:
        nonlocal offset
        spec = LeafSpec(offset, source.dtype, tuple(source.shape))
        specs.append(spec)
        sources.append(source)
        offset += -(-spec.nbytes // ALIGN) * ALIGN
        return Marker(len(specs) - 1)

    skeleton = _rebuild(planned, lambda x: leaf(x) if isinstance(x, (_Stack, torch.Tensor)) else x)
    return Plan(skeleton, specs, sources, max(offset, ALIGN))


def view_leaf(buffer: torch.Tensor, spec: LeafSpec) -> torch.Tensor:
    """The tensor ``spec`` describes, as a view into ``buffer`` (no copy)."""
    raw = buffer.narrow(0, spec.offset, spec.nbytes)
    return raw.view(spec.dtype).view(spec.shape)


def open_batch(buffer: torch.Tensor, skeleton: Any, specs: list[LeafSpec]) -> tuple[Any, list[torch.Tensor]]:
    """The batch, its tensors views into ``buffer``; also returns those views."""
    views = [view_leaf(buffer, spec) for spec in specs]
    return _rebuild(skeleton, lambda x: views[x.index] if isinstance(x, Marker) else x), views


def _rebuild(obj: Any, leaf: Callable[[Any], Any]) -> Any:
    """``obj`` with every leaf ``x`` replaced by ``leaf(x)``, containers rebuilt as collate builds them."""
    if isinstance(obj, (torch.Tensor, _Stack, Marker)):
        return leaf(obj)
    if isinstance(obj, Mapping):
        items = {key: _rebuild(value, leaf) for key, value in obj.items()}
        if isinstance(obj, MutableMapping):
            clone = copy.copy(obj)
            clone.update(items)
            return clone
        return type(obj)(items)  # type: ignore[call-arg]
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_rebuild(item, leaf) for item in obj))
    if isinstance(obj, (list, tuple)):
        items_list = [_rebuild(item, leaf) for item in obj]
        try:
            return type(obj)(items_list)
        except TypeError:
            return items_list
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: _rebuild(getattr(obj, f.name), leaf) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changes)
    return leaf(obj)
