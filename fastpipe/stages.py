"""How a dataset's pipeline splits into named stages: the raw load, then each transform.

Stages are found in the dataset's ``transform`` attribute, which may be a torchvision v1 or
v2 Compose, an ``nn.Sequential``, a list, or any single callable; nested composites are
flattened. A joint ``transforms(image, target)`` is recognised but not split (its stages take
two arguments); the report says so. Wrapper datasets that hold the real one in ``.dataset`` (such as
``Subset``) are looked through. Each stage is named by its class, with ``#2``, ``#3``... for
repeats, which is how reports and cache points (``after:RandomMask``) refer to it.
"""
from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import IterableDataset
from torchvision.datasets.vision import StandardTransform

RAW_STAGE = "raw load"


@dataclass(frozen=True)
class Stage:
    name: str
    transform: Callable[[Any], Any]


def _composites() -> tuple[type, ...]:
    import torchvision.transforms as v1
    import torchvision.transforms.v2 as v2

    return (v1.Compose, v2.Compose)


def _flatten(transform: Any) -> list[Any]:
    """Leaves of a composite, in order. Only plain chains are opened: RandomApply, RandomChoice or
    RandomOrder also hold a list, but run it conditionally, so they stay one stage."""
    if transform is None:
        return []
    if isinstance(transform, _composites()):
        return [leaf for item in transform.transforms for leaf in _flatten(item)]
    if isinstance(transform, (torch.nn.Sequential, list, tuple)):
        return [leaf for item in transform for leaf in _flatten(item)]
    return [transform]


def split_transform(transform: Any) -> list[Stage]:
    """The stages of ``transform`` in order, named by class with ``#N`` for repeats."""
    seen: Counter[str] = Counter()
    stages = []
    for leaf in _flatten(transform):
        base = type(leaf).__name__ if not hasattr(leaf, "__name__") or isinstance(leaf, torch.nn.Module) else leaf.__name__
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


@dataclass
class TransformPipeline:
    """The located transform of a dataset: who owns it, under which attribute, and its stages."""

    path: tuple[str, ...]
    """Attributes to follow from the loader's dataset to the owner of the transform (e.g. ``("dataset",)``)."""
    attr: str
    """The attribute that holds it: ``"transform"``."""
    stages: list[Stage]
    timer: StageTimer | None = field(default=None, repr=False)
    """Called with (stage name, seconds) after each stage runs; set inside workers for stage costs."""

    def names(self) -> list[str]:
        return [stage.name for stage in self.stages]

    def run(self, x: Any, start: int = 0, stop: int | None = None) -> Any:
        """Apply stages ``start:stop`` to ``x``; errors name their stage, and each stage shows in profiler traces."""
        for stage in self.stages[start:stop]:
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
        for name in self.path:
            dataset = getattr(dataset, name)
        return dataset

    def with_transform(self, dataset: Any, transform: Callable[[Any], Any]) -> Any:
        """A shallow copy of ``dataset`` (and of each wrapper down to the owner) whose transform is ``transform``.

        The user's objects are never modified: only the copies' attributes are replaced.
        """
        return _replace_along(dataset, self.path, self.attr, transform)


def _replace_along(obj: Any, path: tuple[str, ...], attr: str, transform: Any) -> Any:
    import copy

    clone = copy.copy(obj)
    if path:
        setattr(clone, path[0], _replace_along(getattr(obj, path[0]), path[1:], attr, transform))
        return clone
    setattr(clone, attr, transform)
    joint = getattr(obj, "transforms", None)
    if attr == "transform" and isinstance(joint, StandardTransform):
        # VisionDatasets that call self.transforms(img, target) must see the new transform too
        clone.transforms = StandardTransform(transform, joint.target_transform)
    return clone


@contextlib.contextmanager
def _stage_context(name: str) -> Iterator[None]:
    with torch.profiler.record_function(f"fastpipe/{name}"):
        yield


def find_pipeline(dataset: Any) -> tuple[TransformPipeline | None, str | None]:
    """Locate the transform of ``dataset``; returns (pipeline, None) or (None, why not)."""
    if isinstance(dataset, IterableDataset):
        return None, "the dataset is an IterableDataset: samples cannot be re-read by index, so only device, host and baseline apply"
    owner, path = dataset, []
    for _ in range(16):  # wrappers nest shallowly; a cycle must not hang us
        transform = getattr(owner, "transform", None)
        if transform is not None:
            return TransformPipeline(tuple(path), "transform", split_transform(transform)), None
        joint = getattr(owner, "transforms", None)
        if joint is not None and not isinstance(joint, StandardTransform):
            return None, (
                f"{type(owner).__name__} uses joint `transforms(image, target)`, whose stages take two arguments; "
                "per-stage points need a `transform` of the image alone"
            )
        inner = getattr(owner, "dataset", None)
        if inner is None:
            break
        owner, path = inner, [*path, "dataset"]
    return None, (
        f"{type(dataset).__name__} has no `transform` or `transforms` attribute, so its transform stages "
        "cannot be told apart; give the dataset a `transform` (e.g. a Compose) to get per-stage points"
    )
