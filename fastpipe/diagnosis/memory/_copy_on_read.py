"""Copy-on-read growth, named: which container of Python objects the workers copy as they read samples, and the fix.

A forked DataLoader worker shares its parent's memory page by page until it writes to a page. Reading a Python
object writes to it: its reference count goes up and down. So a worker reading samples out of a list of dicts
(or strings, or tuples; a dict; a NumPy object array; a pandas object column) copies every page it touches, and
over an epoch holds its own copy of the whole index: ``workers x index size`` of memory that grows until the job
is killed (pytorch/pytorch#13246). NumPy arrays of numbers or fixed-width bytes, one packed buffer, or Arrow
columns are single objects: reading a row touches no per-row reference count, and nothing is copied.

:func:`find_containers` walks the dataset the way discovery does (``.dataset``, ``.ds``, ``.base``, the parts in
``.datasets``, and the attributes of the objects it holds) and lists every container holding at least
:data:`MIN_OBJECTS` Python objects, with its attribute path, length, objects and bytes (estimated from a sample
of :data:`SAMPLED` elements). :func:`name_copy_on_read` turns them into a finding when the workers' memory was
measured to grow, sharing the measured growth among the containers by the objects one sample touches in each
(one element, with what it holds), and writes the fix as code.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from fastpipe.diagnosis.discovery._pipeline import PARTS_NAME, WRAPPER_NAMES
from fastpipe.diagnosis.memory._shm_budget import size_text

#: A container is listed from this many Python objects on.
MIN_OBJECTS = 10_000
#: Elements measured per container to estimate its objects and bytes.
SAMPLED = 64
MAX_DEPTH = 8
#: Small ints are shared by every process's interpreter and never copied for their reference count.
_SHARED_INTS = range(-5, 257)

PACK_HELPERS = '''def pack_strings(strings):
    """One uint8 buffer and int64 offsets: no Python object per string."""
    encoded = [s.encode() for s in strings]
    offsets = np.cumsum([0] + [len(b) for b in encoded], dtype=np.int64)
    return np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets

def unpack_string(buffer, offsets, i):
    return buffer[offsets[i]:offsets[i + 1]].tobytes().decode()'''


def _objects(value: Any, depth: int = 0) -> tuple[int, int]:
    """(Python objects whose reference counts a read touches, their bytes) in ``value`` and what it holds (plain data only)."""
    if isinstance(value, bool) or value is None or (isinstance(value, int) and value in _SHARED_INTS):
        return 0, 0
    count, size = 1, sys.getsizeof(value)
    if depth > 4:
        return count, size
    if isinstance(value, dict):
        items: Any = [x for kv in value.items() for x in kv]
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = value
    else:
        return count, size
    for item in list(items)[:SAMPLED]:
        c, s = _objects(item, depth + 1)
        count, size = count + c, size + s
    return count, size


def _type_name(value: Any) -> str:
    return type(value).__name__


@dataclass
class Container:
    """A container of many Python objects found in the dataset."""

    path: str
    """Where it is, from the loader's dataset: ``Subset.dataset -> Records.records``."""
    owner: str
    attribute: str
    kind: str
    length: int
    objects: int
    nbytes: int
    per_sample_objects: float
    """Objects one read touches: one element and what it holds."""
    element: str
    keys: list[str] = field(default_factory=list)
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _element_summary(elements: list[Any]) -> tuple[str, list[str], dict[str, str]]:
    """(element type, dict keys, key -> value type) from sampled elements."""
    kinds = sorted({_type_name(e) for e in elements})
    keys: list[str] = []
    types: dict[str, str] = {}
    for e in elements:
        if isinstance(e, dict):
            for k, v in e.items():
                if str(k) not in types:
                    keys.append(str(k))
                    types[str(k)] = _type_name(v)
    return "/".join(kinds), keys, types


def _column_code(name: str, kind: str, source: str) -> str:
    if kind in ("int", "float", "bool"):
        return f"self.{name} = np.asarray({source})                      # numbers: one array"
    if kind == "str":
        return f"self.{name}_bytes, self.{name}_offsets = pack_strings({source})   # strings: one buffer + offsets"
    if kind == "tuple":
        return f"self.{name} = np.asarray({source})                      # tuples of numbers: one 2-D array"
    return f"self.{name} = pyarrow.array({source})                   # nested values: one Arrow column"


def _fix(owner: str, attribute: str, kind: str, element: str, keys: list[str], types: dict[str, str]) -> str:
    lines = [
        f"# in {owner}.__init__, replace self.{attribute} ({kind}) by arrays that hold no Python object per row:",
        "import numpy as np",
    ]
    if kind.startswith("pandas"):
        column = kind.split("'")[1] if "'" in kind else attribute
        return "\n".join(
            [
                lines[0],
                f'self.{attribute}["{column}"] = self.{attribute}["{column}"].astype("string[pyarrow]")   # Arrow-backed: one buffer',
                f"# or: self.{column}_bytes, self.{column}_offsets = pack_strings(self.{attribute}['{column}'].tolist())",
            ]
        )
    src = f"self.{attribute}"
    if kind.startswith("dict"):
        lines += [
            f"keys = sorted({src})",
            "self.keys_bytes, self.keys_offsets = pack_strings([str(k) for k in keys])  # or np.asarray(keys) for numbers",
            _column_code("values", element, f"[{src}[k] for k in keys]"),
            "# lookups: i = np.searchsorted(np.asarray(keys), key) with numeric keys, or keep a position per row instead of a key",
        ]
    elif element == "dict" and keys:
        for key in keys:
            lines.append(_column_code(key, types.get(key, "object"), f"[r[{key!r}] for r in {src}]"))
        lines += [
            f"# (or all columns at once, as Arrow: self.table = pyarrow.Table.from_pylist({src}); "
            "row = self.table.slice(i, 1).to_pylist()[0])",
            f"del {src}",
            "# in __getitem__: read self.<column>[i] (strings: unpack_string(self.<name>_bytes, self.<name>_offsets, i))",
        ]
    else:
        lines += [
            _column_code(attribute, element, src),
            f"# in __getitem__: self.{attribute}[i]" + ("  (strings: unpack_string(...))" if element == "str" else ""),
        ]
    if any("pack_strings" in line for line in lines[2:]):
        lines[2:2] = [PACK_HELPERS, ""]
    return "\n".join(lines)


def _assess(value: Any, path: str, owner: str, attribute: str) -> list[Container]:
    """The containers of many objects ``value`` is (a list, dict, object array) or holds (pandas object columns)."""
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(value, pandas.DataFrame):
        found = []
        for column in value.columns:
            if value[column].dtype == object:
                found += _assess_sequence(
                    value[column].to_numpy(), f"{path}[{column!r}]", owner, attribute, f"pandas object column '{column}'"
                )
        return found
    if pandas is not None and isinstance(value, pandas.Series) and value.dtype == object:
        return _assess_sequence(value.to_numpy(), path, owner, attribute, "pandas object Series")
    if isinstance(value, np.ndarray):
        return _assess_sequence(value.ravel(), path, owner, attribute, "numpy object array") if value.dtype == object else []
    if isinstance(value, dict):
        return _assess_sequence(value, path, owner, attribute, "dict")
    if isinstance(value, (list, tuple)):
        return _assess_sequence(value, path, owner, attribute, type(value).__name__)
    return []


def _assess_sequence(value: Any, path: str, owner: str, attribute: str, kind: str) -> list[Container]:
    length = len(value)
    if length < 2:
        return []
    step = max(1, length // SAMPLED)
    if isinstance(value, dict):
        keys_sampled = list(value)[::step][:SAMPLED]
        elements = [value[k] for k in keys_sampled]
        per = [_objects(k)[0] + _objects(v)[0] for k, v in zip(keys_sampled, elements)]
        sizes = [_objects(k)[1] + _objects(v)[1] for k, v in zip(keys_sampled, elements)]
    else:
        elements = [value[i] for i in range(0, length, step)][:SAMPLED]
        counted = [_objects(e) for e in elements]
        per, sizes = [c for c, _ in counted], [s for _, s in counted]
    if any(_is_dataset_like(e) for e in elements):
        return []
    per_element = sum(per) / len(per)
    objects = int(per_element * length)
    if objects < MIN_OBJECTS:
        return []
    element, keys, types = _element_summary(elements)
    kind_text = f"{kind} of {element}" + (f" {{{', '.join(keys)}}}" if keys else "")
    nbytes = int(sum(sizes) / len(sizes) * length) + sys.getsizeof(value) * (not isinstance(value, np.ndarray))
    return [
        Container(
            path=path,
            owner=owner,
            attribute=attribute,
            kind=kind_text,
            length=length,
            objects=objects,
            nbytes=nbytes,
            per_sample_objects=per_element,
            element=element,
            keys=keys,
            fix=_fix(owner, attribute, kind, element, keys, types),
        )
    ]


def _is_dataset_like(value: Any) -> bool:
    from torch.utils.data import Dataset

    return isinstance(value, Dataset)


def _own_items(obj: Any) -> list[tuple[str, Any]]:
    items = list(getattr(obj, "__dict__", {}).items()) if isinstance(getattr(obj, "__dict__", None), dict) else []
    for slot in getattr(type(obj), "__slots__", ()):
        if isinstance(slot, str) and hasattr(obj, slot) and slot not in dict(items):
            items.append((slot, getattr(obj, slot)))
    return items


def _walkable(value: Any) -> bool:
    import types

    import torch

    if isinstance(value, (type, types.ModuleType, types.FunctionType, types.MethodType, torch.Tensor, np.ndarray, str, bytes)):
        return False
    return isinstance(getattr(value, "__dict__", None), dict) or bool(getattr(type(value), "__slots__", ()))


def find_containers(dataset: Any) -> list[Container]:
    """Every container of at least :data:`MIN_OBJECTS` Python objects reachable from ``dataset``, largest first."""
    found: list[Container] = []
    seen: set[int] = set()

    def walk(obj: Any, route: tuple[str, ...], depth: int) -> None:
        if id(obj) in seen or depth > MAX_DEPTH:
            return
        seen.add(id(obj))
        name = type(obj).__name__
        here = " -> ".join((*route, name))
        items = _own_items(obj)
        order = {attr: i for i, attr in enumerate((*WRAPPER_NAMES, PARTS_NAME))}
        for attr, value in sorted(items, key=lambda item: order.get(item[0], len(order))):
            if id(value) in seen:
                continue
            if attr == PARTS_NAME and isinstance(value, (list, tuple)) and value and all(_is_dataset_like(p) for p in value):
                seen.add(id(value))
                for index, part in enumerate(value):
                    walk(part, (*route, f"{name}.{attr}[{index}]"), depth + 1)
                continue
            containers = _assess(value, f"{here}.{attr}", name, attr)
            if containers:
                seen.add(id(value))
                found.extend(containers)
            elif _walkable(value):
                walk(value, (*route, f"{name}.{attr}"), depth + 1)

    walk(dataset, (), 0)
    return sorted(found, key=lambda c: c.objects, reverse=True)


@dataclass
class CopyOnReadFinding:
    """Workers' memory grew with the samples they read; the containers to blame, each with its share and its fix."""

    growth_per_1000: float
    """Measured: bytes of USS per 1,000 samples per worker."""
    containers: list[Container]
    removed_per_1000: list[float]
    """For each container, the growth per 1,000 samples it would remove (its share of the objects a sample touches)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "growth_per_1000_samples": self.growth_per_1000,
            "containers": [{**c.to_dict(), "removes_per_1000_samples": r} for c, r in zip(self.containers, self.removed_per_1000)],
        }

    def lines(self) -> list[str]:
        if not self.containers:
            return [
                f"workers' unique memory grows by {size_text(self.growth_per_1000)} per 1,000 samples, but no container of "
                f"{MIN_OBJECTS:,}+ Python objects was found in the dataset: look for one held outside it (e.g. in a global), "
                "or read more samples (fastpipe memory SPEC --samples N) to see whether it levels off, as an allocator's "
                "warm-up does; rerun with MALLOC_MMAP_THRESHOLD_=131072 in the environment: growth that goes away was "
                "glibc's heap settling (benchmarks/memory_toy_warmup.py shows it on toy:naive)"
            ]
        out = [
            f"copy-on-read: workers' unique memory grows by {size_text(self.growth_per_1000)} per 1,000 samples each, "
            "copying Python objects the dataset holds:"
        ]
        for c, removed in zip(self.containers, self.removed_per_1000):
            out.append(
                f"  {c.path}: {c.kind}, {c.length:,} entries, about {c.objects:,} objects, {size_text(c.nbytes)}; "
                f"{c.per_sample_objects:.1f} objects touched per sample. Packing it removes about {size_text(removed)} "
                f"per 1,000 samples per worker (up to {size_text(c.nbytes)} per worker over an epoch)"
            )
        out += ["fix:", *("  " + line for c in self.containers[:1] for line in c.fix.splitlines())]
        return out


def name_copy_on_read(dataset: Any, growth_per_1000: float | None, grows: bool) -> CopyOnReadFinding | None:
    """The finding when the workers' memory grows (``grows``, as measured), None when it does not."""
    if not grows or growth_per_1000 is None:
        return None
    containers = find_containers(dataset)
    touched = sum(c.per_sample_objects for c in containers)
    removed = [growth_per_1000 * c.per_sample_objects / touched for c in containers] if touched else []
    return CopyOnReadFinding(growth_per_1000=growth_per_1000, containers=containers, removed_per_1000=removed)
