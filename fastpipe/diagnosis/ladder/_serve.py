"""Which cache-point dataset serves a point, and the one-sample probe that says whether a point works: the map
dataset's (:mod:`~fastpipe.diagnosis.ladder._cache`) or the stream's (:mod:`~fastpipe.diagnosis.ladder._stream`), chosen
here so that neither of those modules imports the other."""

from __future__ import annotations

from typing import Any

from torch.utils.data import IterableDataset

from fastpipe.diagnosis.ladder._cache import CachePointDataset, PointProbe, UnavailablePoint, _entry_from
from fastpipe.diagnosis.ladder._stream import CachePointIterable, probe_stream_point
from fastpipe.diagnosis.runtime._timeout import within
from fastpipe.stages import TransformPipeline


def cache_point_dataset(dataset: Any, pipeline: TransformPipeline | None, point: str, pool: int = 1) -> "CachePointDataset":
    """The cache point's dataset for ``dataset``: :class:`CachePointDataset`, or for a streaming dataset (an
    ``IterableDataset``) :class:`~fastpipe.diagnosis.ladder._stream.CachePointIterable`, which captures in each worker and replays."""
    if isinstance(dataset, IterableDataset):
        return CachePointIterable(dataset, pipeline, point, pool)
    return CachePointDataset(dataset, pipeline, point, pool)


def probe_point(
    dataset: Any, pipeline: TransformPipeline | None, point: str, index: int = 0, *, timeout: float | None = None
) -> PointProbe:
    """Capture one sample at ``point`` in this process, as a worker would, and say whether the point works.

    Cheap (one sample through the pipeline), so a plan can drop a point before starting workers.
    Errors of the user's own code (a stage or the raw load raising) propagate as StageError.
    With ``timeout``, the sample is read in a daemon thread and TimeoutError is raised if it takes
    longer (a pipeline that hangs must not hang the main process; the thread is left behind).
    """
    if isinstance(dataset, IterableDataset):
        return probe_stream_point(dataset, pipeline, point, timeout=timeout)
    try:
        cached = CachePointDataset(dataset, pipeline, point)
    except UnavailablePoint as exc:
        return PointProbe(point, exc.reason, None, False)
    if cached.cut is None:
        return PointProbe(point, None, None, False)
    capture = within(timeout, lambda: cached._capture(index), f"reading sample {index} in the main process")
    if capture.reason is not None:
        return PointProbe(point, capture.reason, len(capture.calls), False)
    entry = _entry_from(capture, cached.skip_copies)
    return PointProbe(point, None, len(capture.calls), any(view.shared is None for view in entry.views))


def check_point(
    dataset: Any, pipeline: TransformPipeline | None, point: str, index: int = 0, *, timeout: float | None = None
) -> str | None:
    """Why ``point`` cannot be built for ``dataset`` (from one capture in this process), or None when it can."""
    return probe_point(dataset, pipeline, point, index, timeout=timeout).reason
