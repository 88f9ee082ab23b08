"""Where a dataset keeps its stages: one adapter per shape, tried at each level of wrapping.

:func:`find_pipeline` walks from the loader's dataset towards the object that holds the
transform, and at each level tries, in order:

1. a declared :class:`fastpipe.stages.Stages` attribute (the way to describe a custom ``__getitem__``);
2. a Hugging Face ``datasets.Dataset`` given ``set_transform`` / ``with_transform`` (its one
   transform is a stage per leaf: a plain function is one stage, a ``fastpipe.stages.Stages`` of batch
   functions is split);
3. ``transform`` (torchvision's ``VisionDataset`` and most datasets), kept in step with its
   ``StandardTransform`` in ``transforms``;
4. ``transforms`` holding a ``StandardTransform`` alone; a joint ``transforms(image, target)``
   is recognised but not split (its stages take two arguments);
5. parts: ``.datasets`` (``ConcatDataset``): stages are found in each part and matched by name,
   and a cache point applies to each part;
6. wrappers: ``.dataset`` (``Subset``), ``.ds``, ``.base``, and failing those the one attribute
   that holds a Dataset.

A streaming dataset (an ``IterableDataset``) is searched the same way for a transform its ``__iter__`` calls
on each item (a ``transform`` attribute, or a :class:`fastpipe.stages.Stages` with ``source=``); a WebDataset
``DataPipeline`` is read through its public ``.pipeline`` (each sample filter a stage, see
:func:`_webdataset_pipeline`); a Hugging Face streaming dataset's ``.map()`` chain is private, so the why-not
says which declaration to add. :mod:`fastpipe.diagnosis.ladder._stream` replays their points.

At every level, a transform is opened into its stages: a Compose (v1 or v2), an ``nn.Sequential``, a list, and an
object that only passes its input through a chain it holds (a preset class such as torchvision's reference
``ClassificationPresetTrain``, whose ``__call__`` is ``return self.transforms(img)``: see
:mod:`fastpipe.diagnosis.discovery._holder`), so the ladder has a point per inner stage.

Only attributes the object really holds (its own ``__dict__`` or slots) are followed or
replaced: a ``transform`` exposed through a property is looked through to the dataset that
owns it, so a replacement never reaches the user's objects. A pipeline that cannot be split
gets a why-not text that says what was found and the exact declaration that makes it work.

Declaring a custom ``__getitem__`` (see :class:`fastpipe.stages.Stages`)::

    self.stages = fastpipe.stages.Stages(load=self.read, transforms=[RandomResizedCrop(224), ToTensor()])  # __init__
    return self.stages(index), self.labels[index]                                                     # __getitem__
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset
from torchvision.datasets.vision import StandardTransform

from fastpipe.diagnosis.discovery._holder import open_holder
from fastpipe.stages import Stage, Stages, TransformPipeline, split_transform, stage_name

WRAPPER_NAMES = ("dataset", "ds", "base")
PARTS_NAME = "datasets"
MAX_DEPTH = 16
_ABSENT = object()


def declaration_hint(owner: str) -> str:
    """The exact change that makes ``owner``'s stages visible: a fastpipe.stages.Stages it holds and calls."""
    return (
        f"hold the stages in a fastpipe.stages.Stages on {owner} and call it where {owner}.__getitem__ ran them:\n"
        f"    in {owner}.__init__:    self.stages = fastpipe.stages.Stages(load=<index -> raw value, optional>, transforms=[<each step>, ...])\n"
        f"    in {owner}.__getitem__: x = self.stages(index)   (with load=; without it: x = self.stages(raw_value))"
    )


@dataclass
class _Miss:
    """What the search found where it stopped: the object, the route to it, why it stops, how to fix it."""

    owner: Any
    route: tuple[str, ...]
    reason: str
    fix: str | None = None

    def text(self, top: Any) -> str:
        name = type(self.owner).__name__
        where = name if not self.route else f"{type(top).__name__} -> {' -> '.join(self.route)} ({name})"
        text = f"{where}: {self.reason}"
        return f"{text}; to split its stages, {self.fix}" if self.fix else text


def stream_hint(owner: str) -> str:
    """The exact change that makes a streaming dataset's stages visible: a fastpipe.stages.Stages with a source, iterated."""
    return (
        f"hold the stages in a fastpipe.stages.Stages with the item source on {owner} and iterate it in {owner}.__iter__:\n"
        f"    in {owner}.__init__: self.stages = fastpipe.stages.Stages(source=<iterable of raw items>, transforms=[<each step>, ...])\n"
        f"    in {owner}.__iter__: return iter(self.stages)   (or: for x in self.stages: yield ...)"
    )


def find_pipeline(dataset: Any) -> tuple[TransformPipeline | None, str | None]:
    """Locate the stages of ``dataset``; returns (pipeline, None) or (None, why not and how to fix it)."""
    if isinstance(dataset, IterableDataset):
        return _stream_pipeline(dataset)
    found = _search(dataset, (), (), frozenset())
    if isinstance(found, TransformPipeline):
        return found, None
    return None, found.text(dataset)


def _stream_pipeline(dataset: IterableDataset) -> tuple[TransformPipeline | None, str | None]:
    """The stages of a streaming dataset: a WebDataset chain's filters, else a transform its ``__iter__`` calls on each
    item (a ``transform`` attribute, a fastpipe.stages.Stages with ``source=``), found as in a map-style dataset."""
    name = type(dataset).__name__
    chain = _webdataset_pipeline(dataset)
    if chain is not None:
        return chain, None
    hf = sys.modules.get("datasets")
    if hf is not None and isinstance(dataset, getattr(hf, "IterableDataset", ())):
        return None, (
            f"a Hugging Face streaming {name}: the functions given to its .map() are kept in private attributes, so "
            "fastpipe does not read them; to split its stages, stream the unmapped dataset through a declaration: "
            "wrap it in a torch IterableDataset holding `self.stages = fastpipe.stages.Stages(source=streamed, "
            "transforms=[step1, step2])` with `__iter__` returning `iter(self.stages)`"
        )
    found = _search(dataset, (), (), frozenset())
    if isinstance(found, TransformPipeline) and found.kind not in ("parts", "hf"):
        return found, None
    why = found.text(dataset) if isinstance(found, _Miss) else f"{name}: its stages are split among several streams"
    return None, f"an IterableDataset ({why.split('; to split its stages')[0]}); to split its stages, {stream_hint(name)}"


WEBDATASET_STAGES = (
    "map",
    "map_tuple",
    "map_dict",
    "to_tuple",
    "rename",
    "rename_keys",
    "decode",
    "select",
    "batched",
    "unbatched",
    "shuffle",
)
"""The filters of ``webdataset.filters`` that work on samples: the longest run of these that ends a chain is its stages."""


def _webdataset_pipeline(dataset: Any) -> TransformPipeline | None:
    """A WebDataset ``DataPipeline`` (``WebDataset`` included) read through its public structure: ``.pipeline`` is the
    list of steps, each filter a ``FilterFunction`` with ``.f``, ``.args``, ``.kw`` made from ``webdataset.filters.<name>``
    (whose ``.f`` is the function it curries). The steps before the last run of sample filters are the shard read."""
    wds = sys.modules.get("webdataset")
    if wds is None or not isinstance(dataset, wds.DataPipeline):
        return None
    kinds = {getattr(getattr(wds.filters, name, None), "f", None): name for name in WEBDATASET_STAGES}
    kinds.pop(None, None)
    steps = list(dataset.pipeline)
    offset = len(steps)
    while offset > 1 and kinds.get(getattr(steps[offset - 1], "f", None)) is not None:
        offset -= 1
    seen: Counter[str] = Counter()
    stages = []
    for step in steps[offset:]:
        base = _webdataset_stage_name(wds, kinds[step.f], step)
        seen[base] += 1
        stages.append(Stage(base if seen[base] == 1 else f"{base}#{seen[base]}", step))
    source = f"{type(dataset).__name__}: {offset} steps of shard read, then {len(stages)} sample filters"
    return TransformPipeline((), "pipeline", stages, kind="webdataset", source=source, offset=offset)


def _webdataset_stage_name(wds: Any, kind: str, step: Any) -> str:
    """``decode`` for a ``.decode()``, a ``.map(f)`` by its function's name, ``map_tuple(f, g)`` by its functions,
    others (``batched``, ``to_tuple``, ``shuffle``...) by the filter's name."""
    functions = [f for f in step.args if callable(f) and f is not getattr(wds.utils, "identity", None)]
    if kind == "map" and functions:
        if isinstance(functions[0], wds.autodecode.Decoder):
            return "decode"
        return stage_name(functions[0])
    if kind in ("map_tuple", "map_dict"):
        named = [stage_name(f) for f in functions] + [f"{k}={stage_name(v)}" for k, v in step.kw.items() if callable(v) and k != "handler"]
        return f"{kind}({', '.join(named)})"
    return kind


def _own(obj: Any, name: str) -> Any:
    """``obj.name`` if the object itself holds it (instance dict or slot), else _ABSENT; properties do not count."""
    values = getattr(obj, "__dict__", None)
    if isinstance(values, dict) and name in values:
        return values[name]
    slot = getattr(type(obj), name, None)
    if type(slot).__name__ == "member_descriptor":
        return getattr(obj, name, _ABSENT)
    return _ABSENT


def _own_items(obj: Any) -> list[tuple[str, Any]]:
    values = getattr(obj, "__dict__", None)
    return list(values.items()) if isinstance(values, dict) else []


def _hf_dataset_type() -> type | None:
    module = sys.modules.get("datasets")  # a Hugging Face dataset means the package is already imported
    return getattr(module, "Dataset", None) if module is not None else None


def _is_dataset(value: Any) -> bool:
    hf = _hf_dataset_type()
    return isinstance(value, Dataset) or (hf is not None and isinstance(value, hf))


def _is_dataset_like(value: Any) -> bool:
    """Loose test for the usual wrapper names: anything indexable that is not plain data."""
    if value is None or value is _ABSENT or isinstance(value, (list, tuple, dict, str, bytes, torch.Tensor, np.ndarray)):
        return False
    return _is_dataset(value) or hasattr(type(value), "__getitem__")


def _has_property(obj: Any, name: str) -> bool:
    return isinstance(getattr(type(obj), name, None), property)


def _search(obj: Any, path: tuple[Any, ...], route: tuple[str, ...], ancestors: frozenset[int]) -> TransformPipeline | _Miss:
    if id(obj) in ancestors or len(path) > MAX_DEPTH:
        return _Miss(obj, route, "its wrappers nest too deeply, or in a cycle")
    ancestors = ancestors | {id(obj)}
    name = type(obj).__name__
    source = " -> ".join((*route, name))

    declared = [(attr, value) for attr, value in _own_items(obj) if isinstance(value, Stages)]
    if len(declared) > 1:
        return _Miss(obj, route, f"it holds several fastpipe.stages.Stages ({', '.join(a for a, _ in declared)}); keep one per dataset")
    if declared:
        attr, value = declared[0]
        return TransformPipeline(
            path, attr, split_transform(value, open_holder), kind="stages", source=f"{source}.{attr} (fastpipe.stages.Stages)"
        )

    hf = _hf_dataset_type()
    if hf is not None and isinstance(obj, hf):
        return _hf_pipeline(obj, path, route, source)

    transform = _own(obj, "transform")
    if transform is not _ABSENT and transform is not None:
        return TransformPipeline(path, "transform", split_transform(transform, open_holder), source=f"{source}.transform")

    joint = _own(obj, "transforms")
    if isinstance(joint, StandardTransform):
        if joint.transform is not None:
            return TransformPipeline(
                path,
                "transforms",
                split_transform(joint.transform, open_holder),
                kind="standard",
                source=f"{source}.transforms (StandardTransform)",
            )
    elif joint is _ABSENT and not _has_property(obj, "transforms"):
        joint = getattr(type(obj), "transforms", None)  # a joint transform defined on the class is reported, never replaced
    if not isinstance(joint, StandardTransform) and joint is not _ABSENT and joint is not None and callable(joint):
        return _Miss(
            obj,
            route,
            f"{name} uses joint `transforms(image, target)`, whose stages take two arguments; "
            "per-stage points need a `transform` of the image alone",
            f"pass the image part as `transform=` (and the target's as `target_transform=`), or {declaration_hint(name)}",
        )

    parts = _own(obj, PARTS_NAME)
    if isinstance(parts, (list, tuple)) and parts and all(_is_dataset_like(p) for p in parts):
        return _parts_pipeline(obj, parts, path, route, ancestors, source)

    candidates = [(attr, value) for attr in WRAPPER_NAMES if _is_dataset_like(value := _own(obj, attr))]
    held = [(attr, value) for attr, value in _own_items(obj) if attr not in WRAPPER_NAMES and _is_dataset(value)]
    if not candidates and len(held) == 1:
        candidates = held
    misses = []
    for attr, inner in candidates:  # the first that splits wins; else the first one's why-not
        found = _search(inner, (*path, attr), (*route, f"{name}.{attr}"), ancestors)
        if isinstance(found, TransformPipeline):
            return found
        misses.append(found)
    if misses:
        return misses[0]
    if len(held) > 1:
        attrs = ", ".join(f".{a}" for a, _ in held)
        return _Miss(
            obj,
            route,
            f"it holds several datasets ({attrs}), so fastpipe cannot tell which one __getitem__ reads",
            f"keep the one it reads in `.dataset` (fastpipe looks there first), or {declaration_hint(name)}",
        )

    if _has_property(obj, "transform"):
        return _Miss(
            obj,
            route,
            "it exposes `transform` through a property, which fastpipe cannot replace on a copy, "
            "and holds no inner dataset it can see (in .dataset, .ds, .base, .datasets or one attribute holding a Dataset)",
            f"keep the inner dataset in an attribute such as `self.dataset = inner`, or {declaration_hint(name)}",
        )
    if transform is None:
        return _Miss(
            obj,
            route,
            "its `transform` is None, so each sample is the raw load alone, with no stages to split",
            f"if {name}.__getitem__ transforms samples in its own code, {declaration_hint(name)}",
        )
    return _Miss(
        obj,
        route,
        "no stages found: fastpipe looks for `transform`, a torchvision `transforms` (StandardTransform), "
        "a Hugging Face set_transform, a fastpipe.stages.Stages attribute, and inner datasets in .dataset, .ds, .base, .datasets "
        "or the one attribute holding a Dataset",
        declaration_hint(name),
    )


def _hf_pipeline(obj: Any, path: tuple[Any, ...], route: tuple[str, ...], source: str) -> TransformPipeline | _Miss:
    fmt = obj.format
    transform = (fmt.get("format_kwargs") or {}).get("transform") if fmt.get("type") == "custom" else None
    if transform is None:
        return _Miss(
            obj,
            route,
            f"a Hugging Face dataset formatted as {fmt.get('type')!r} with no set_transform / with_transform, "
            "so its transforms (if any) run outside it",
            "give it its transform: `dataset = dataset.with_transform(preprocess)` with `def preprocess(batch): ...` "
            "returning the batch dict; to split preprocess into stages, pass "
            "`fastpipe.stages.Stages(transforms=[step1, step2])` of batch functions instead",
        )
    return TransformPipeline(path, "transform", split_transform(transform, open_holder), kind="hf", source=f"{source}.with_transform")


def _parts_pipeline(
    obj: Any, parts: Any, path: tuple[Any, ...], route: tuple[str, ...], ancestors: frozenset[int], source: str
) -> TransformPipeline | _Miss:
    name = type(obj).__name__
    leaves: list[TransformPipeline] = []
    for index, part in enumerate(parts):
        found = _search(part, (*path, PARTS_NAME, index), (*route, f"{name}.datasets[{index}]"), ancestors)
        if isinstance(found, _Miss):
            found.reason = f"part {index} of {len(parts)}: {found.reason}"
            return found
        leaves += list(found.parts) if found.parts else [found]  # nested parts are flattened: one level of dispatch
    names = [leaf.names() for leaf in leaves]
    if any(n != names[0] for n in names):
        listed = "; ".join(f"part {i}: {n}" for i, n in enumerate(names))
        return _Miss(
            obj,
            route,
            f"its parts' stages differ ({listed}), and a cache point must mean the same stage in every part",
            "give every part the same stages in the same order (e.g. the same Compose layout with its own settings)",
        )
    kinds = sorted({type(p).__name__ for p in parts})
    return TransformPipeline(
        path,
        PARTS_NAME,
        list(leaves[0].stages),
        kind="parts",
        parts=tuple(leaves),
        source=f"{source} of {len(parts)} parts ({', '.join(kinds)}), stages matched by name",
    )
