"""What a pipeline's stages are and how they run: the raw load, then each transform.

A :class:`TransformPipeline` is a located transform (found by :mod:`fastpipe.diagnosis.discovery._pipeline`): the
owner that holds it, the slot it sits in, and its stages in order. Its two jobs are to run a
slice of the stages (``run``), and to give back a copy of the user's dataset whose transform is
replaced (``with_transform``) without ever modifying the user's objects, so cache points and
timers can stand in for the transform inside the DataLoader workers.

Composites are flattened into stages: a torchvision v1 or v2 Compose, an ``nn.Sequential``, a
list. Conditional ones (RandomApply, RandomChoice, RandomOrder) stay one stage. Each stage is
named by its class (or a function's name), with ``#2``, ``#3``... for repeats, which is how
reports and cache points (``after:RandomMask``) refer to it.

:class:`Stages` is the public declaration for a dataset whose ``__getitem__`` runs its own code
(see its docstring and :mod:`fastpipe.diagnosis.discovery._pipeline`).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torchvision.datasets.vision import StandardTransform

RAW_STAGE = "raw load"


@dataclass(frozen=True)
class Stage:
    name: str
    transform: Callable[[Any], Any]


class Stages:
    """Declares the stages of a custom ``__getitem__`` so fastpipe can cache and time each one.

    Hold one in an attribute of the dataset and call it where ``__getitem__`` ran its steps::

        class Photos(torch.utils.data.Dataset):
            def __init__(self, files, labels):
                self.files, self.labels = files, labels
                self.stages = fastpipe.stages.Stages(load=self.read, transforms=[RandomResizedCrop(224), ToTensor()])

            def read(self, index):
                return Image.open(self.files[index]).convert("RGB")

            def __getitem__(self, index):
                return self.stages(index), self.labels[index]

    A streaming dataset (an ``IterableDataset``) declares where its items come from with ``source=``
    and iterates the declaration, so each item read is the raw load and each transform a stage::

        class Stream(torch.utils.data.IterableDataset):
            def __init__(self, reader):
                self.stages = fastpipe.stages.Stages(source=reader, transforms=[decode, crop, to_tensor])

            def __iter__(self):
                return iter(self.stages)  # or: for x in self.stages: yield x, ...

    There a cache point keeps the source's items (or a stage's outputs) and replays them in each
    worker, so the source is read only while the cache fills.

    Args:
        load: optional; ``load(item)`` reads the raw value (its time is the raw load). Without it,
            ``stages(x)`` applies the transforms to ``x`` directly, like a Compose.
        transforms: the transforms, in order (a list, a Compose, or one callable); each is a stage.
        source: optional; an iterable of raw items (re-iterable: each worker and epoch iterates it
            anew, so it must shard itself across workers as the dataset would). ``iter(stages)``
            yields ``stages(item)`` for each of its items.

    fastpipe replaces the attribute on a copy of the dataset (never on yours), so ``__getitem__``
    (or ``__iter__``) must look it up on ``self`` each time, as above.
    """

    def __init__(
        self,
        load: Callable[[Any], Any] | None = None,
        transforms: Sequence[Callable[[Any], Any]] | Callable[[Any], Any] = (),
        source: Iterable[Any] | None = None,
    ) -> None:
        if load is not None and not callable(load):
            raise TypeError(f"fastpipe.stages.Stages(load=...) must be callable, got {type(load).__name__}")
        if source is not None and not hasattr(source, "__iter__"):
            raise TypeError(f"fastpipe.stages.Stages(source=...) must be iterable, got {type(source).__name__}")
        if source is not None and iter(source) is source:  # the diagnosis reads it again and again: an iterator would
            # be used up, and the items it read would be lost to the user's own training
            raise TypeError(
                f"fastpipe.stages.Stages(source=...) must be re-iterable (a list, a Dataset, an object whose __iter__ starts "
                f"anew), not a one-shot iterator such as a generator ({type(source).__name__})"
            )
        items = list(transforms) if isinstance(transforms, (list, tuple)) else [transforms]
        bad = [type(t).__name__ for t in items if not callable(t)]
        if bad:
            raise TypeError(f"fastpipe.stages.Stages(transforms=...) takes callables; these are not: {bad}")
        self.load = load
        self.transforms = items
        self.source = source

    def __call__(self, item: Any) -> Any:
        x = self.load(item) if self.load is not None else item
        for transform in self.transforms:
            x = transform(x)
        return x

    def __iter__(self) -> Iterator[Any]:
        """Each item of ``source`` through the stages (a declaration without ``source`` is not iterable)."""
        if self.source is None:
            raise TypeError("this fastpipe.stages.Stages has no source= to iterate; call it on each item instead")
        for item in self.source:
            yield self(item)

    def __repr__(self) -> str:
        source = "" if self.source is None else f", source={type(self.source).__name__}"
        return f"Stages(load={getattr(self.load, '__name__', self.load)!r}, transforms={self.transforms!r}{source})"


def _composites() -> tuple[type, ...]:
    import torchvision.transforms as v1
    import torchvision.transforms.v2 as v2

    return (v1.Compose, v2.Compose, Stages)


Opener = Callable[[Any], "Sequence[Any] | None"]
"""Given a leaf, the stages it only passes its input through (a preset class holding a Compose), or None to keep it whole."""
MAX_NESTING = 16


def _flatten(transform: Any, opener: Opener | None = None, depth: int = 0) -> list[Any]:
    """Leaves of a composite, in order. Only plain chains are opened: RandomApply, RandomChoice or
    RandomOrder also hold a list, but run it conditionally, so they stay one stage. ``opener`` may open
    more (see :func:`fastpipe.diagnosis.discovery._pipeline.open_holder`)."""
    if transform is None:
        return []
    if depth > MAX_NESTING:
        return [transform]
    if isinstance(transform, Stages):
        return [leaf for item in transform.transforms for leaf in _flatten(item, opener, depth + 1)]
    if isinstance(transform, _composites()):
        return [leaf for item in transform.transforms for leaf in _flatten(item, opener, depth + 1)]
    if isinstance(transform, (torch.nn.Sequential, list, tuple)):
        return [leaf for item in transform for leaf in _flatten(item, opener, depth + 1)]
    inner = opener(transform) if opener is not None else None
    if inner is not None:
        return [leaf for item in inner for leaf in _flatten(item, opener, depth + 1)]
    return [transform]


def stage_name(leaf: Any) -> str:
    """A stage's base name: its class, or a plain function's (or partial's) own name."""
    if isinstance(leaf, functools.partial):
        return stage_name(leaf.func)
    if isinstance(leaf, torch.nn.Module) or not hasattr(leaf, "__name__"):
        return type(leaf).__name__
    return leaf.__name__


def split_transform(transform: Any, opener: Opener | None = None) -> list[Stage]:
    """The stages of ``transform`` in order, named by class with ``#N`` for repeats; ``opener`` may open more leaves."""
    seen: Counter[str] = Counter()
    stages = []
    for leaf in _flatten(transform, opener):
        base = stage_name(leaf)
        seen[base] += 1
        stages.append(Stage(base if seen[base] == 1 else f"{base}#{seen[base]}", leaf))
    return stages


class StageError(RuntimeError):
    """A stage raised inside a worker. One string argument, so DataLoader can re-raise it in the main process."""

    PREFIX = "[fastpipe stage: "

    @classmethod
    def wrap(cls, stage: str, exc: BaseException) -> "StageError":
        return cls(f"{cls.PREFIX}{stage}] {type(exc).__name__}: {exc}")

    @classmethod
    def stage_of(cls, message: str) -> str | None:
        """The stage named in a (possibly re-raised and reformatted) StageError message."""
        start = message.find(cls.PREFIX)
        if start < 0:
            return None
        start += len(cls.PREFIX)
        end = message.find("]", start)
        return message[start:end] if end > start else None


def read_sample(dataset: Any, index: Any) -> Any:
    """``dataset[index]``, with failures outside any transform stage labelled as the raw load."""
    try:
        return dataset[index]
    except StageError:
        raise
    except Exception as exc:
        raise StageError.wrap(RAW_STAGE, exc) from exc


StageTimer = Callable[[str, float], None]

_CURRENT_PART: contextvars.ContextVar[int] = contextvars.ContextVar("fastpipe_current_part")


def current_part() -> int:
    """Which part of a multi-part pipeline (a ConcatDataset's) is running its transform now; 0 outside one."""
    return _CURRENT_PART.get(0)


class InPart:
    """Stands in for one part's transform: runs ``transform`` with that part marked as the current one.

    A ConcatDataset's parts each hold their own transform objects (matched by stage name); the
    one replacement callable fastpipe installs in every part must know whose stages to run.
    """

    def __init__(self, transform: Callable[[Any], Any], part: int) -> None:
        self.transform, self.part = transform, part

    def __call__(self, x: Any) -> Any:
        token = _CURRENT_PART.set(self.part)
        try:
            return self.transform(x)
        finally:
            _CURRENT_PART.reset(token)


@dataclass
class TransformPipeline:
    """The located transform of a dataset: who owns it, in which slot, and its stages.

    A ConcatDataset whose parts share stage names is one pipeline with ``parts``: each part is a
    full pipeline of its own (its own path and stage objects), ``stages`` are the first part's
    (for names), and ``run`` uses the stages of the part that is running (see :class:`InPart`).
    """

    path: tuple[Any, ...]
    """Steps from the loader's dataset to the owner of the transform: attribute names, or indices into a list."""
    attr: str
    """The attribute that holds it (``"transform"``, ``"transforms"``, a Stages attribute, or ``"datasets"`` for parts)."""
    stages: list[Stage]
    timer: StageTimer | None = field(default=None, repr=False)
    """Called with (stage name, seconds) after each stage runs; set inside workers for stage costs."""
    kind: str = "attribute"
    """How the slot is replaced: ``attribute``, ``standard`` (a StandardTransform), ``stages``, ``hf`` or ``parts``;
    ``webdataset`` for a WebDataset chain, whose stages are its filters (iterator in, iterator out) and have no slot."""
    parts: tuple["TransformPipeline", ...] = ()
    source: str = ""
    """Where it was found, in words, for reports (e.g. ``ConcatDataset of 2 x ImageFolder``)."""
    offset: int = 0
    """For ``webdataset``: how many steps of the chain come before the first stage (the shard read)."""

    def names(self) -> list[str]:
        return [stage.name for stage in self.stages]

    def part(self, index: int) -> "TransformPipeline":
        """The pipeline of one part (itself when there are no parts), carrying this one's timer."""
        if not self.parts:
            return self
        part = self.parts[index]
        return part if part.timer is self.timer else _with_timer(part, self.timer)

    def run(self, x: Any, start: int = 0, stop: int | None = None) -> Any:
        """Apply stages ``start:stop`` to ``x``; errors name their stage, and each stage shows in profiler traces."""
        if self.parts:
            index = _CURRENT_PART.get(None)
            if index is None:
                raise RuntimeError("a pipeline with parts runs inside one part: install it with with_transform, or use part(i).run")
            stages = self.parts[index].stages
        else:
            stages = self.stages
        for stage in stages[start:stop]:
            with _stage_context(stage.name):
                began = time.perf_counter()
                try:
                    x = stage.transform(x)
                except StageError:
                    raise
                except Exception as exc:
                    raise StageError.wrap(stage.name, exc) from exc
                if self.timer is not None:
                    self.timer(stage.name, time.perf_counter() - began)
        return x

    def owner(self, dataset: Any) -> Any:
        """The object holding the transform (the ConcatDataset itself for a pipeline with parts)."""
        for step in self.path:
            dataset = dataset[step] if isinstance(step, int) else getattr(dataset, step)
        return dataset

    def with_transform(self, dataset: Any, transform: Callable[[Any], Any]) -> Any:
        """A shallow copy of ``dataset`` (and of each wrapper down to the owner) whose transform is ``transform``.

        The user's objects are never modified: only the copies' attributes are replaced. With
        parts, every part gets ``transform``, marked with its part (:class:`InPart`).
        """
        if self.kind == "webdataset":
            raise TypeError(
                "a WebDataset chain's stages are filters of the stream, not one transform slot; see fastpipe.diagnosis.ladder._stream"
            )
        if self.parts:
            for index, part in enumerate(self.parts):
                dataset = part.with_transform(dataset, InPart(transform, index))
            return dataset
        return _replace_along(dataset, self.path, functools.partial(_replace_slot, self, transform))


def _with_timer(pipeline: TransformPipeline, timer: StageTimer | None) -> TransformPipeline:
    import dataclasses

    return dataclasses.replace(pipeline, timer=timer)


def _replace_along(obj: Any, path: tuple[Any, ...], replace: Callable[[Any], Any]) -> Any:
    if not path:
        return replace(obj)
    step, rest = path[0], path[1:]
    if isinstance(step, int):
        items = list(obj)
        items[step] = _replace_along(obj[step], rest, replace)
        return tuple(items) if isinstance(obj, tuple) else items
    clone = copy.copy(obj)
    setattr(clone, step, _replace_along(getattr(obj, step), rest, replace))
    return clone


def _replace_slot(pipeline: TransformPipeline, transform: Callable[[Any], Any], owner: Any) -> Any:
    """A copy of ``owner`` with ``transform`` in the pipeline's slot."""
    if pipeline.kind == "hf":  # set_format assigns new attributes, so a shallow copy keeps the user's format as it is
        fmt, clone = owner.format, copy.copy(owner)
        clone.set_transform(
            transform, columns=getattr(owner, "_format_columns", fmt["columns"]), output_all_columns=fmt["output_all_columns"]
        )
        return clone
    clone = copy.copy(owner)
    joint = vars(owner).get("transforms") if hasattr(owner, "__dict__") else None
    if pipeline.kind == "stages":
        declared: Stages = getattr(owner, pipeline.attr)
        setattr(clone, pipeline.attr, Stages(load=declared.load, transforms=[transform], source=declared.source))
    elif pipeline.kind == "standard":
        clone.transforms = StandardTransform(transform, joint.target_transform)
    else:
        setattr(clone, pipeline.attr, transform)
        if pipeline.attr == "transform" and isinstance(joint, StandardTransform):
            # VisionDatasets that call self.transforms(img, target) must see the new transform too
            clone.transforms = StandardTransform(transform, joint.target_transform)
    return clone


@contextlib.contextmanager
def _stage_context(name: str) -> Iterator[None]:
    with torch.profiler.record_function(f"fastpipe/{name}"):
        yield
