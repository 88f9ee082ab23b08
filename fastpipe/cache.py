"""Cache points: dataset wrappers that replay one stage's output inside the DataLoader workers.

A :class:`CachePointDataset` wraps the user's dataset (never modifying it) and, in each worker
process, captures ``pool`` real samples at one point of the pipeline, then serves every later
index from that capture, rerunning only the stages after the point:

* ``sample``: the finished sample is served as-is; collate, IPC, pinning and the copy still run;
* ``after:<Stage>``: that stage's output is cached, and the later stages rerun;
* ``raw``: the transform's input is cached, and every transform reruns;
* ``baseline``: nothing is cached; stages run through :class:`~fastpipe.stages.TransformPipeline`
  so a failure names its stage.

Cached values are copied before they are handed to the stages, so in-place transforms such
as RandomMask cannot pile up over steps. (PIL images are not copied: torchvision's transforms
treat them as immutable, and copying a large one would add a cost the real pipeline lacks.)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from fastpipe.stages import RAW_STAGE, StageError, TransformPipeline, read_sample

_MISSING = object()


def fresh_copy(value: Any) -> Any:
    """A copy of ``value`` that transforms cannot mutate the cache through."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(fresh_copy(item) for item in value)
    if isinstance(value, dict):
        return type(value)((key, fresh_copy(item)) for key, item in value.items())
    return value


def _locate(sample: Any, target: Any) -> tuple[Any, ...] | None:
    """The index path at which ``target`` (by identity) sits inside ``sample``."""
    if sample is target:
        return ()
    if isinstance(sample, (list, tuple)):
        items = enumerate(sample)
    elif isinstance(sample, dict):
        items = sample.items()
    else:
        return None
    for key, item in items:
        found = _locate(item, target)
        if found is not None:
            return (key, *found)
    return None


def _substitute(sample: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    key, rest = path[0], path[1:]
    if isinstance(sample, dict):
        return type(sample)((k, _substitute(v, rest, value) if k == key else v) for k, v in sample.items())
    items = [_substitute(v, rest, value) if i == key else v for i, v in enumerate(sample)]
    return type(sample)(*items) if hasattr(sample, "_fields") else type(sample)(items)


class UnavailablePoint(Exception):
    """A cache point cannot be built for this dataset; the message says why."""


class _Recorder:
    """Stands in for the dataset's transform during capture: runs the real stages and keeps a copy at the point."""

    def __init__(self, pipeline: TransformPipeline, cut: int) -> None:
        self.pipeline, self.cut = pipeline, cut
        self.cached: Any = _MISSING
        self.output: Any = _MISSING

    def __call__(self, x: Any) -> Any:
        x = self.pipeline.run(x, 0, self.cut)
        self.cached = fresh_copy(x)
        self.output = self.pipeline.run(x, self.cut)
        return self.output


@dataclass
class _Entry:
    template: Any
    path: tuple[Any, ...] | None
    cached: Any


class CachePointDataset(Dataset):
    """The user's dataset with data cached at one point; see the module docstring.

    Args:
        dataset: the loader's dataset (left untouched).
        pipeline: its located transform, or None when it has none (then only ``sample`` and ``baseline`` apply).
        point: ``"sample"``, ``"raw"``, ``"after:<Stage>"`` or ``"baseline"``.
        pool: how many different captures each worker keeps and cycles through.
    """

    def __init__(self, dataset: Any, pipeline: TransformPipeline | None, point: str, pool: int = 1) -> None:
        if pool < 1:
            raise ValueError(f"pool must be at least 1, got {pool}")
        self.dataset, self.pipeline, self.point, self.pool = dataset, pipeline, point, pool
        self.cut = self._cut_index(point)
        self._entries: dict[int, _Entry] = {}
        self._calls = 0
        self._staged: Any = None

    def _cut_index(self, point: str) -> int | None:
        if point in ("sample", "baseline"):
            return None
        if self.pipeline is None:
            raise UnavailablePoint("the dataset has no transform to split")
        if point == "raw":
            return 0
        if point.startswith("after:"):
            names = self.pipeline.names()
            stage = point[len("after:"):]
            if stage not in names:
                raise UnavailablePoint(f"no stage named {stage!r}; the stages are {names}")
            return names.index(stage) + 1
        raise ValueError(f"unknown cache point {point!r}")

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        if self.point == "baseline":
            if self.pipeline is None:
                return read_sample(self.dataset, index)
            if self._staged is None:  # once, so state the dataset caches on itself (open files) persists
                self._staged = self.pipeline.with_transform(self.dataset, self.pipeline.run)
            return read_sample(self._staged, index)
        slot = self._calls % self.pool
        self._calls += 1
        entry = self._entries.get(slot)
        if entry is None:
            entry = self._entries[slot] = self._capture(index)
        if self.cut is None:
            return entry.template
        output = self.pipeline.run(fresh_copy(entry.cached), self.cut)
        return _substitute(entry.template, entry.path, output)

    def _capture(self, index: int) -> _Entry:
        if self.cut is None:
            return _Entry(template=read_sample(self.dataset, index), path=None, cached=None)
        recorder = _Recorder(self.pipeline, self.cut)
        sample = read_sample(self.pipeline.with_transform(self.dataset, recorder), index)
        path = _locate(sample, recorder.output) if recorder.output is not _MISSING else None
        if path is None:
            raise StageError.wrap(
                RAW_STAGE,
                UnavailablePoint(
                    f"cannot cache at {self.point}: {type(self.dataset).__name__}.__getitem__ does not return its "
                    "transform's output as-is, so a cached value cannot be put back in its place"
                ),
            )
        return _Entry(template=sample, path=path, cached=recorder.cached)


def rebuild_loader(loader: DataLoader, dataset: Any, *, timeout: float | None = None) -> DataLoader:
    """A new DataLoader over ``dataset`` with every setting of ``loader`` kept.

    The sampler (hence shuffling and its generator), or a custom batch sampler, is reused as is.
    ``timeout`` replaces the loader's only when the loader has none, as a guard against hangs.
    """
    if not isinstance(loader, DataLoader) and hasattr(loader, "with_dataset"):
        return loader.with_dataset(dataset)  # e.g. a RayLoader rebuilds itself around the wrapped dataset
    workers = loader.num_workers
    kwargs: dict[str, Any] = dict(
        num_workers=workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        timeout=loader.timeout if loader.timeout or timeout is None or workers == 0 else timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        persistent_workers=loader.persistent_workers,
        pin_memory_device=loader.pin_memory_device,
    )
    if workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    if isinstance(dataset, IterableDataset):  # no sampler: the dataset orders itself
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_size is not None:  # the DataLoader built its own BatchSampler from these
        kwargs.update(batch_size=loader.batch_size, sampler=loader.sampler, drop_last=loader.drop_last)
    elif loader.batch_sampler is not None:
        kwargs["batch_sampler"] = loader.batch_sampler
    else:
        kwargs.update(batch_size=None, sampler=loader.sampler)
    return DataLoader(dataset, **kwargs)


def stage_of_error(exc: BaseException) -> str | None:
    """The pipeline stage a worker error came from, if fastpipe labelled it."""
    return StageError.stage_of(str(exc))

