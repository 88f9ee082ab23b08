"""What a worker receives at its start: the dataset's pickled size, and what in it is large, by attribute.

Under ``spawn`` and ``forkserver`` every worker gets the dataset through a pipe, pickled by the training process and
unpickled by the worker, once per worker and (without ``persistent_workers``) once per epoch; under ``fork`` it
inherits the parent's memory instead. Tensors do not go through the pipe: torch's multiprocessing pickler moves their
storage to shared memory and sends a handle, so they are counted here as a handle only (and left untouched: nothing is
moved to shared memory by this measurement). The attributes are walked as the copy-on-read report walks them
(:func:`fastpipe.diagnosis.memory._copy_on_read.find_containers`: wrappers first, the parts of a ``ConcatDataset``,
the attributes of the objects held), each pickled on its own.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from fastpipe.diagnosis.discovery._pipeline import PARTS_NAME, WRAPPER_NAMES
from fastpipe.diagnosis.memory._copy_on_read import _is_dataset_like, _own_items, _walkable

#: Attributes listed from this pickled size on.
LARGE_BYTES = 1_000_000
MAX_DEPTH = 4


def _handle() -> None:
    """What a tensor unpickles as here: its storage would travel through shared memory, not the pipe."""
    return None


def _tensor_handle(tensor: torch.Tensor) -> tuple[Any, tuple[()]]:
    return _handle, ()


#: The default reductions, with tensors as handles. A dispatch table is looked up in C, type by type, as
#: multiprocessing's own pickler does: per-object Python hooks (``persistent_id``) would time slower than the real pickling.
_TABLE = {**copyreg.dispatch_table, torch.Tensor: _tensor_handle, torch.nn.Parameter: _tensor_handle}


def _dump(value: Any, buffer: io.BytesIO) -> None:
    pickler = pickle.Pickler(buffer, protocol=pickle.DEFAULT_PROTOCOL)  # multiprocessing's protocol
    pickler.dispatch_table = _TABLE
    pickler.dump(value)


def pickled_size(value: Any) -> tuple[int | None, float, str | None]:
    """(bytes, seconds to pickle, why it cannot be pickled) of ``value`` as a worker would receive it."""
    buffer = io.BytesIO()
    start = time.perf_counter()
    try:
        _dump(value, buffer)
    except Exception as exc:  # a lambda, a lock, an open file: spawn and forkserver would fail on it too
        return None, time.perf_counter() - start, f"{type(exc).__name__}: {exc}"
    return buffer.tell(), time.perf_counter() - start, None


@dataclass
class LargeAttribute:
    path: str
    """Where it is, from the loader's dataset: ``Records.records``."""
    nbytes: int
    kind: str


@dataclass
class Transfer:
    """The dataset as a worker receives it under spawn or forkserver."""

    nbytes: int | None
    pickle_s: float
    unpickle_s: float
    error: str | None = None
    large: list[LargeAttribute] = field(default_factory=list)

    @property
    def large_bytes(self) -> int:
        return sum(a.nbytes for a in self.large)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def large_attributes(dataset: Any) -> list[LargeAttribute]:
    """Every attribute reachable from ``dataset`` (wrappers followed) whose pickled size is at least :data:`LARGE_BYTES`,
    largest first; an attribute holding a dataset or an object with attributes is walked into instead."""
    found: list[LargeAttribute] = []
    seen: set[int] = set()
    order = {attr: i for i, attr in enumerate((*WRAPPER_NAMES, PARTS_NAME))}

    def walk(obj: Any, route: str, depth: int) -> None:
        if id(obj) in seen or depth > MAX_DEPTH:
            return
        seen.add(id(obj))
        for attr, value in sorted(_own_items(obj), key=lambda item: order.get(item[0], len(order))):
            here = f"{route}.{attr}"
            if isinstance(value, (list, tuple)) and value and all(_is_dataset_like(p) for p in value):
                for index, part in enumerate(value):
                    walk(part, f"{here}[{index}]", depth + 1)
            elif _is_dataset_like(value) or (_walkable(value) and not isinstance(value, (list, tuple, dict))):
                walk(value, here, depth + 1)
            elif id(value) not in seen:
                seen.add(id(value))
                size, _, _ = pickled_size(value)
                if size is not None and size >= LARGE_BYTES:
                    found.append(LargeAttribute(here, size, _kind(value)))

    walk(dataset, type(dataset).__name__, 0)
    return sorted(found, key=lambda a: a.nbytes, reverse=True)


def _kind(value: Any) -> str:
    length = f" of {len(value):,}" if hasattr(value, "__len__") else ""
    inner = ""
    if isinstance(value, (list, tuple)) and value:
        inner = f" {type(value[0]).__name__}"
    return f"{type(value).__name__}{length}{inner}"


def measure_transfer(dataset: Any) -> Transfer:
    """Pickle and unpickle ``dataset`` once here, as each worker's start does under spawn or forkserver."""
    buffer = io.BytesIO()
    start = time.perf_counter()
    try:
        _dump(dataset, buffer)
    except Exception as exc:
        return Transfer(None, time.perf_counter() - start, 0.0, f"{type(exc).__name__}: {exc}")
    pickle_s = time.perf_counter() - start
    size = buffer.tell()
    buffer.seek(0)

    start = time.perf_counter()
    try:
        pickle.load(buffer)
    except Exception:  # a __setstate__ that needs its tensors: the workers' own stamps time the unpickling instead
        pass
    unpickle_s = time.perf_counter() - start
    large = large_attributes(dataset) if size >= LARGE_BYTES else []
    return Transfer(size, pickle_s, unpickle_s, None, large)
